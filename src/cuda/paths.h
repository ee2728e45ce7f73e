// The CUDA paths. Each takes a validated Problem and does no validation of its own.
#pragma once

#include <cstdint>

#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr::cuda {

// Decode / recurrent kernel: T tokens per sequence, state updated in place (decode) or read
// from h0 and written to final_state (forward through the same kernel, any T).
void decode(const Problem& prob, const DecodeParams& p, const ExecConfig& config);
void recurrent_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config);

// ExecConfig::check_values on cuda (src/cuda/common/check_values.cu): the index, in g's logical
// row-major order, of the first element of g (f32, f16 or bf16 on the device; any strides)
// that is > 0, and its value in *value; -1 when there is none (NaN and -inf are not > 0).
// Runs a reduction kernel on `stream` and synchronises `stream` to read its result. CUDA
// errors throw RuntimeFailure whose message starts with `op`.
std::int64_t first_positive(const TensorView& g, void* stream, double* value, const char* op);

}  // namespace gdr::cuda
