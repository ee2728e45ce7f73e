#include "gdr/problem.h"
#include "gdr/error.h"
namespace gdr {
Problem validate_forward(const ForwardParams&, const char* op) { throw InvalidArgument(std::string(op) + ": not implemented yet"); }
Problem validate_backward(const BackwardParams&, const char* op) { throw InvalidArgument(std::string(op) + ": not implemented yet"); }
Problem validate_decode(const DecodeParams&, const char* op) { throw InvalidArgument(std::string(op) + ": not implemented yet"); }
void check_cu_seqlens_values(const void*, DType, std::int64_t, std::int64_t, const char* op) { throw InvalidArgument(std::string(op) + ": not implemented yet"); }
SequenceSpan sequence_span(const Problem&, const Inputs&, std::int64_t) { throw InvalidArgument("not implemented yet"); }
}
