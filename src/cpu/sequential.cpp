#include "cpu/paths.h"
#include "gdr/error.h"
namespace gdr::cpu {
void sequential_forward(const Problem&, const ForwardParams&, const ExecConfig&) { throw RuntimeFailure("sequential_forward: not implemented yet"); }
void sequential_backward(const Problem&, const BackwardParams&, const ExecConfig&) { throw RuntimeFailure("sequential_backward: not implemented yet"); }
}
