#include "cpu/paths.h"
#include "gdr/error.h"
namespace gdr::cpu {
void reference_forward(const Problem&, const ForwardParams&) { throw RuntimeFailure("reference_forward: not implemented yet"); }
void reference_backward(const Problem&, const BackwardParams&) { throw RuntimeFailure("reference_backward: not implemented yet"); }
}
