#include "cpu/paths.h"
#include "gdr/error.h"
namespace gdr::cpu {
void chunkwise_forward(const Problem&, const ForwardParams&, const ExecConfig&) { throw RuntimeFailure("chunkwise_forward: not implemented yet"); }
void chunkwise_backward(const Problem&, const BackwardParams&, const ExecConfig&) { throw RuntimeFailure("chunkwise_backward: not implemented yet"); }
}
