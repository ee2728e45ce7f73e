// parse_decode_overrides (gdr/decode_overrides.h): the fields by name, the kernel by number, empty
// items skipped, and errors that name the variable, the item and what is allowed.
#include <gtest/gtest.h>

#include <string>

#include "gdr/decode_overrides.h"
#include "gdr/error.h"

namespace gdr::test {
namespace {

TEST(DecodeOverridesSpec, FieldsByName) {
  const DecodeOverrides o =
      parse_decode_overrides("chunked_state_pass=3,chunked_prep=3,,kernel=4,chunked_segments=-1");
  EXPECT_EQ(o.chunked_state_pass, 3);
  EXPECT_EQ(o.chunked_prep, 3);
  EXPECT_EQ(o.kernel, DecodeKernel::chunk);
  EXPECT_EQ(o.chunked_segments, -1);
  EXPECT_EQ(o.chunked_tinv, 0);  // the rest: the rules
  EXPECT_EQ(o.warps, 0);
  EXPECT_EQ(o.prep_phase_cycles, nullptr);
  const DecodeOverrides none = parse_decode_overrides("");
  EXPECT_EQ(none.chunked_state_pass, 0);
  EXPECT_EQ(none.kernel, DecodeKernel::automatic);
}

TEST(DecodeOverridesSpec, ErrorsNameTheItem) {
  auto message = [](const std::string& spec) {
    try {
      parse_decode_overrides(spec);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("chunked_state_pas=3").find("GDR_OVERRIDES: no field 'chunked_state_pas'"),
            std::string::npos);
  EXPECT_NE(message("chunked_state_pas=3").find("chunked_state_pass"), std::string::npos);
  EXPECT_NE(message("chunked_prep").find("'chunked_prep' is not field=value"), std::string::npos);
  EXPECT_NE(message("chunked_prep=3x").find("'chunked_prep=3x'"), std::string::npos);
  EXPECT_NE(message("kernel=9").find("kernel must be 0 to 6"), std::string::npos);
  EXPECT_NE(message("prep_phase_cycles=1").find("no field"), std::string::npos);
}

}  // namespace
}  // namespace gdr::test
