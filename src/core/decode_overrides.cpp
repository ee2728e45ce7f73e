// parse_decode_overrides (gdr/decode_overrides.h): "field=value,field=value" -> DecodeOverrides,
// each field named as in the struct, each value a decimal integer.
#include "gdr/decode_overrides.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "gdr/error.h"

namespace gdr {
namespace {

struct Field {
  const char* name;
  int DecodeOverrides::*member;
};

// Every int field of DecodeOverrides (the kernel, an enum, is handled by name below).
constexpr Field kFields[] = {
    {"warps", &DecodeOverrides::warps},
    {"chunk_columns", &DecodeOverrides::chunk_columns},
    {"chunk_first_wait", &DecodeOverrides::chunk_first_wait},
    {"chunk_schedule", &DecodeOverrides::chunk_schedule},
    {"persistent_blocks", &DecodeOverrides::persistent_blocks},
    {"ring_math", &DecodeOverrides::ring_math},
    {"ring_schedule", &DecodeOverrides::ring_schedule},
    {"prefetch", &DecodeOverrides::prefetch},
    {"state_loads", &DecodeOverrides::state_loads},
    {"pdl", &DecodeOverrides::pdl},
    {"chunked_segments", &DecodeOverrides::chunked_segments},
    {"chunked_state_columns", &DecodeOverrides::chunked_state_columns},
    {"chunked_state_buffers", &DecodeOverrides::chunked_state_buffers},
    {"chunked_overlap", &DecodeOverrides::chunked_overlap},
    {"chunked_backward_window", &DecodeOverrides::chunked_backward_window},
    {"chunked_prep", &DecodeOverrides::chunked_prep},
    {"chunked_state_pass", &DecodeOverrides::chunked_state_pass},
    {"chunked_backward_fused", &DecodeOverrides::chunked_backward_fused},
    {"chunked_tinv", &DecodeOverrides::chunked_tinv},
    {"chunked_backward_prefetch", &DecodeOverrides::chunked_backward_prefetch},
    {"chunked_backward_rows", &DecodeOverrides::chunked_backward_rows},
    {"chunked_backward_qk", &DecodeOverrides::chunked_backward_qk},
    {"chunked_backward_dvn", &DecodeOverrides::chunked_backward_dvn},
};

std::string field_names() {
  std::string s = "kernel";
  for (const Field& f : kFields) s += std::string(", ") + f.name;
  return s;
}

}  // namespace

DecodeOverrides parse_decode_overrides(const std::string& spec, const char* what) {
  DecodeOverrides o;
  std::size_t pos = 0;
  while (pos < spec.size()) {
    std::size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    errno = 0;
    char* stop = nullptr;
    const long v = std::strtol(value.c_str(), &stop, 10);
    if (value.empty() || *stop != '\0' || errno == ERANGE || v < -(1L << 30) || v > (1L << 30))
      throw InvalidArgument(std::string(what) + ": '" + item +
                            "' is not field=value with an integer value");
    if (name == "kernel") {
      if (v < 0 || v > static_cast<long>(DecodeKernel::slice))
        throw InvalidArgument(std::string(what) + ": kernel=" + value + "; kernel must be 0 to " +
                              std::to_string(static_cast<int>(DecodeKernel::slice)));
      o.kernel = static_cast<DecodeKernel>(v);
      continue;
    }
    bool known = false;
    for (const Field& f : kFields)
      if (name == f.name) {
        o.*(f.member) = static_cast<int>(v);
        known = true;
      }
    if (!known)
      throw InvalidArgument(std::string(what) + ": no field '" + name + "'; the fields are " +
                            field_names());
  }
  return o;
}

}  // namespace gdr
