// The one error type of gdr. Every message starts with the operation's name, then names the
// tensor, the value and what is allowed, e.g.
//   gdr.forward: v has 31 heads; Hv must be a multiple of Hk=4
#pragma once

#include <stdexcept>
#include <string>

namespace gdr {

// Thrown for bad arguments (shape, dtype, device, layout, unsupported combination). The Python
// layer maps it to ValueError.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Thrown for failures while running (CUDA errors, allocation failures). Python: RuntimeError.
class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace gdr
