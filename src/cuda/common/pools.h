// Device memory that a launch needs for itself: the counter pairs of kernels with dynamic items.
#pragma once

#include <cuda_runtime.h>

namespace gdr::cuda {

// The counter pair (items taken, blocks done) of a launch with dynamic items on `stream`, zero at
// the launch's start and exclusive to it (its last block leaves it zero: recurrent.cuh,
// release_item_counter). A launch captured into a graph keeps a pair of a per-device arena for
// good (a graph's node never runs beside itself, and each run leaves the pair zero for the next;
// two instances of one graph running at once on two streams would share their pairs). The arena
// is made and zeroed (the host waits for it) by the first eager launch on the device that wants
// dynamic items. The others (eager launches, captures before the arena exists or once it is used
// up) take 8 bytes from gdr's own stream-ordered pool, zeroed by a memset on the stream before the
// kernel: *pooled is then true and the caller frees the pair on the stream after its kernel (and
// launches that kernel plainly, not as a dependent launch). Null: none to be had (static items).
unsigned* dynamic_counter_pair(int device, cudaStream_t stream, bool* pooled, const char* op);

}  // namespace gdr::cuda
