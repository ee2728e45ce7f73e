// The CUDA paths. Each takes a validated Problem and does no validation of its own.
#pragma once

#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr::cuda {

// Decode / recurrent kernel: T tokens per sequence, state updated in place (decode) or read
// from h0 and written to final_state (forward through the same kernel, any T).
void decode(const Problem& prob, const DecodeParams& p, const ExecConfig& config);
void recurrent_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config);

// Chunked forward (docs/operator.md §3, C = 64; docs/cuda-chunked.md): any T, varlen without a
// host synchronisation, both gate kinds, writes ForwardParams::saved's chunk states when given.
void chunked_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config);

}  // namespace gdr::cuda
