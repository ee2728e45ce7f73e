// The CUDA paths: the one header the core dispatcher (src/core/dispatch.cpp) includes. Each takes
// a Problem validated by the core (core/validate.cpp, and core/cuda_support.h for what the CUDA
// kernels support) and does no validation of its own. Layout of src/cuda/: common/ (host and
// device helpers every path shares), decode/ (the recurrent / decode kernels, their plan and
// launcher; docs/cuda-decode.md), chunked/ (the chunked kernels).
#pragma once

#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr::cuda {

// Decode / recurrent kernels (decode/launch.cu): T tokens per sequence, state updated in place
// (decode) or read from h0 and written to final_state (forward through the same kernels, any T).
void decode(const Problem& prob, const DecodeParams& p, const ExecConfig& config);
void recurrent_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config);

// Chunked forward (docs/operator.md §3, C = 64; docs/cuda-chunked.md): any T, varlen without a
// host synchronisation, both gate kinds, writes ForwardParams::saved's chunk states when given.
void chunked_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config);

}  // namespace gdr::cuda
