#include "cpu/paths.h"
#include "gdr/error.h"
namespace gdr::cpu {
void decode(const Problem&, const DecodeParams&, const ExecConfig&) { throw RuntimeFailure("cpu decode: not implemented yet"); }
}
