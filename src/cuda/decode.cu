#include "cuda/paths.h"
#include "gdr/error.h"
namespace gdr::cuda {
void decode(const Problem&, const DecodeParams&, const ExecConfig&) { throw RuntimeFailure("cuda decode: not implemented yet"); }
void recurrent_forward(const Problem&, const ForwardParams&, const ExecConfig&) { throw RuntimeFailure("cuda recurrent_forward: not implemented yet"); }
}
