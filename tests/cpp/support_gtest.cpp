// The GoogleTest half of the test support (support_gtest.h).
#include "support_gtest.h"

#include <gtest/gtest.h>

namespace gdr::test {

void expect_forward_close(const ForwardResult& got, const ForwardResult& ref, double tol,
                          const std::string& label) {
  for (const Field& f : fields(got, ref))
    EXPECT_LT(rel_error(*f.got, *f.ref), tol) << f.name << " vs reference: " << label;
}

void expect_forward_close(const ForwardResult& got, const ForwardResult& ref, double tol_o,
                          double tol_state, const std::string& label) {
  EXPECT_LT(rel_error(got.o, ref.o), tol_o) << "o vs reference: " << label;
  EXPECT_LT(rel_error(got.final_state, ref.final_state), tol_state)
      << "final_state vs reference: " << label;
}

void expect_backward_close(const BackwardResult& got, const BackwardResult& ref, double tol,
                           const std::string& label) {
  for (const Field& f : fields(got, ref))
    EXPECT_LT(rel_error(*f.got, *f.ref), tol) << f.name << " vs reference: " << label;
}

void expect_path_close(TestData& d, Path path, const ExecConfig& config, const ForwardResult& ref,
                       const BackwardResult& gref, const std::string& label,
                       const TensorView& saved) {
  expect_forward_close(run_forward(d, path, config, saved), ref, forward_tolerance(d.c), label);
  expect_backward_close(run_backward(d, path, config, saved), gref, backward_tolerance(d.c), label);
}

}  // namespace gdr::test
