// The value check of g (docs/operator.md §6): g is the natural log of the decay, so an element
// > 0 (a forgotten log-sigmoid, say) is refused; -inf and NaN are not refused: like any
// non-finite input they pass through to the outputs they touch. Validation runs it on host tensors;
// the dispatcher runs the CUDA twin (src/cuda/common/check_values.cu) when ExecConfig::check_values
// asks for it.
#pragma once

#include <cstdint>

#include "gdr/tensor.h"

namespace gdr {

// The first element of g in its logical row-major order that is > 0: its index (-1 when none)
// and its value.
struct PositiveGate {
  std::int64_t index = -1;
  double value = 0.0;
};

// For g in host memory (float32, float16, bfloat16 or float64; any strides).
PositiveGate first_positive_host(const TensorView& g);

// Throws InvalidArgument "<op>: g[b, t, h] is 0.5; g must be <= 0 ..." for `found`.
[[noreturn]] void refuse_positive_gate(const char* op, const TensorView& g,
                                       const PositiveGate& found);

}  // namespace gdr
