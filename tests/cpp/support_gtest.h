// The GoogleTest half of the test support (testing/support.h, the gdr_testing library, has no
// GoogleTest dependency so that the gdr command line and the benchmarks share it).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "support.h"

namespace gdr::test {

// GoogleTest's name of a NamedCase parameter:
//   INSTANTIATE_TEST_SUITE_P(Cpu, Suite, ::testing::ValuesIn(cases()), case_name);
inline std::string case_name(const ::testing::TestParamInfo<NamedCase>& info) {
  return info.param.name;
}

// GoogleTest expectations on every field (each field named in the failure message).
void expect_forward_close(const ForwardResult& got, const ForwardResult& ref, double tol,
                          const std::string& label);
// o within tol_o, the final state within tol_state.
void expect_forward_close(const ForwardResult& got, const ForwardResult& ref, double tol_o,
                          double tol_state, const std::string& label);
void expect_backward_close(const BackwardResult& got, const BackwardResult& ref, double tol,
                           const std::string& label);

// `path`'s forward and then backward on d (outputs poisoned first; `saved` as for run_forward /
// run_backward) against `ref` / `gref`, within the docs/operator.md §7 bounds of d's dtype.
void expect_path_close(TestData& d, Path path, const ExecConfig& config, const ForwardResult& ref,
                       const BackwardResult& gref, const std::string& label,
                       const TensorView& saved = {});

// The message of the gdr::InvalidArgument that `f` throws; "" when it throws none (any other
// exception propagates).
inline std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace gdr::test
