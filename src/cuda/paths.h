// The CUDA paths (`op`: the name every error message of the call starts with, resolved by the
// dispatcher): the one header the core dispatcher (src/core/dispatch.cpp) includes. Each takes
// a Problem validated by the core (core/validate.cpp, and core/cuda_support.h for what the CUDA
// kernels support) and does no validation of its own. Layout of src/cuda/: common/ (host and
// device helpers every path shares), decode/ (the recurrent / decode kernels, their plan and
// launcher; docs/cuda-decode.md), chunked/ (the chunked kernels).
#pragma once

#include <cstdint>

#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr::cuda {

// Decode / recurrent kernels (decode/launch.cu): T tokens per sequence, state updated in place
// (decode) or read from h0 and written to final_state (forward through the same kernels, any T).
void decode(const Problem& prob, const DecodeParams& p, const ExecConfig& config, const char* op);
void recurrent_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config,
                       const char* op);

// Chunked forward (docs/operator.md §3, C = 64; docs/cuda-chunked.md): any T, varlen without a
// host synchronisation, both gate kinds, writes ForwardParams::saved's chunk states when given.
void chunked_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config,
                     const char* op);

// Chunked backward (docs/operator.md §4, C = 64; src/cuda/chunked/chunked_backward.cu): every
// gradient, the same coverage as the chunked forward; reads BackwardParams::saved's chunk states
// when given, else recomputes them with the forward's kernels. No host synchronisation;
// deterministic (fixed-order sums, no atomics).
void chunked_backward(const Problem& prob, const BackwardParams& p, const ExecConfig& config,
                      const char* op);

// ExecConfig::check_values on cuda (src/cuda/common/check_values.cu): the index, in g's logical
// row-major order, of the first element of g (f32, f16 or bf16 on the device; any strides)
// that is > 0, and its value in *value; -1 when there is none (NaN and -inf are not > 0).
// Runs a reduction kernel on `stream` and synchronises `stream` to read its result. CUDA
// errors throw RuntimeFailure whose message starts with `op`.
std::int64_t first_positive(const TensorView& g, void* stream, double* value, const char* op);

// ExecConfig::check_values on cuda: copies cu_seqlens ([N + 1], i32 or i64, on the device) to
// the host on `stream`, synchronises `stream` and checks its values (check_cu_seqlens_values:
// 0 = c_0 <= ... <= c_N = T). Without the check the kernels clamp the values on the device.
void check_cu_seqlens(const TensorView& cu_seqlens, std::int64_t T, void* stream, const char* op);

}  // namespace gdr::cuda
