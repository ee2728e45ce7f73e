// The test-support library gdr_testing (testing/CMakeLists.txt), shared by the C++ tests, the
// gdr command line (`gdr verify`) and the benchmarks. No GoogleTest here: the expectations
// (expect_forward_close, ...) are in tests/cpp/support_gtest.h.
//
// Usage:
//   using namespace gdr::test;
//   Case c;                                  // describe the call
//   c.T = 65; c.Hk = 1; c.Hv = 4; c.gate = gdr::GateKind::per_key; c.mask = true;
//   TestData d = make_problem(c);            // random inputs + output buffers + grad seeds
//   const std::string label = describe(d.c, d.seed);
//   ForwardResult ref = reference_forward(d);  // float64 oracle (float64 copy of the inputs)
//   ForwardResult got = run_forward(d, gdr::Path::chunkwise);  // outputs poisoned first
//   expect_forward_close(got, ref, forward_tolerance(c), label);  // tests/cpp/support_gtest.h
//   BackwardResult gref = reference_backward(d);  // seeds d.dout, d.dfinal_state
//   BackwardResult ggot = run_backward(d, gdr::Path::chunkwise);
//   expect_backward_close(ggot, gref, backward_tolerance(c), label);
//
// Random inputs follow docs/operator.md §7: keys L2-normalised (raw when qk_l2norm), beta in (0, 1)
// (raw b ~ N(0, 2^2) under beta_sigmoid), g mild -0.2 U(0,1) / strong -4 U(0,1) / extreme (-30
// at ~30% of positions, strong elsewhere). Case::seed == 0 draws a fresh seed every run; the
// seed used is in TestData::seed and in describe(). Every result comes back as std::vector<double>
// in the tensor's logical row-major order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gdr/gdr.h"

namespace gdr::test {

enum class Decay { mild, strong, extreme };
std::string_view to_string(Decay d);

// One call to test. B and T describe the batch; under varlen (seqlens not empty) B must be 1
// and T is set to the sum of seqlens by make_problem.
struct Case {
  std::int64_t B = 1, T = 16;
  std::vector<std::int64_t> seqlens;  // varlen lengths (zeros allowed); empty = no varlen
  bool cu_seqlens_i64 = false;        // cu_seqlens dtype: int32 (default) or int64
  bool bf16_state = false;            // decode: the pool holds bfloat16 (make_decode_problem)
  std::int64_t Hk = 2, Hv = 2, Dk = 8, Dv = 8;
  GateKind gate = GateKind::scalar;
  bool mask = false;        // random mask (~25% false)
  bool h0 = true;           // initial state given
  bool final_state = true;  // final state requested (forward) / dfinal_state seed (backward)
  StateLayout layout = StateLayout::k_first;
  DType dtype = DType::f32;     // q, k, v, o, dout (and the gradients of q, k, v)
  bool gates_in_dtype = false;  // g and beta stored in `dtype` instead of f32
  Decay decay = Decay::mild;
  bool gate_in_kernel = false, beta_sigmoid = false, qk_l2norm = false;
  float scale = 0.0f;      // 0 = 1/sqrt(Dk)
  bool strided = false;    // inputs/outputs padded in their last dim (non-trivial strides)
  std::uint64_t seed = 0;  // 0 = fresh random seed
};

// A named case of a parameterised test (its name is the test's suffix; case_name in
// tests/cpp/support_gtest.h) with the chunk size and thread count to run it with.
struct NamedCase {
  std::string name;
  Case c;
  int chunk = 64;   // ExecConfig::chunk_size
  int threads = 0;  // ExecConfig::num_threads (0 = OpenMP default)
};

// "B=1 T=16 Hk=2 Hv=2 Dk=8 Dv=8 scalar mild f32 h0 fs seed=..." for test messages.
std::string describe(const Case& c, std::uint64_t seed = 0);

// An owning host tensor, row-major over its logical shape, optionally padded in the last dim
// (stride of the second-to-last dim = last size + pad). Undefined (view().rank == 0) when
// default-constructed.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<std::int64_t> shape, std::int64_t pad_last = 0);

  bool defined() const { return !shape_.empty(); }
  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const;
  TensorView view() const;  // rank 0 when undefined
  void* data() const { return const_cast<std::uint64_t*>(storage_.data()); }

  // Element i of the logical row-major order, converted to/from double (bool: 0/1).
  double get(std::int64_t i) const;
  void set(std::int64_t i, double value);
  std::vector<double> to_double() const;
  void from_double(const std::vector<double>& values);
  void fill(double value);
  void poison();  // NaN in every float element, padding included

 private:
  std::int64_t offset(std::int64_t i) const;  // element offset of logical index i
  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_;
  std::int64_t pad_ = 0;
  std::vector<std::uint64_t> storage_;  // 8-byte aligned raw storage
};

// Inputs, outputs and gradient seeds of one case, all in host memory.
struct TestData {
  Case c;                  // with T resolved under varlen
  std::uint64_t seed = 0;  // the seed actually used
  std::int64_t N = 0;      // sequences
  HostTensor q, k, v, g, beta, A_log, dt_bias, h0, mask, cu_seqlens;
  HostTensor o, final_state;                                // forward outputs
  HostTensor dout, dfinal_state;                            // backward seeds
  HostTensor dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0;  // backward outputs

  Inputs inputs() const;
  Options options() const;
  ForwardParams forward_params() const;
  BackwardParams backward_params() const;
};

// Random inputs and output buffers for `c` (fresh seed when c.seed == 0).
TestData make_problem(const Case& c);

// New random dout (and dfinal_state when c.final_state) from `seed` (0 = fresh).
void randomize_grad_seeds(TestData& d, std::uint64_t seed = 0);

struct ForwardResult {
  std::vector<double> o, final_state;  // final_state empty when not requested
};
struct BackwardResult {
  std::vector<double> dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0;  // empty when not given
};

// Poisons the outputs with NaN, runs gdr::forward / gdr::backward with config.path = path and
// returns the outputs as doubles. Exceptions from gdr propagate. `saved` (optional) is passed as
// ForwardParams::saved (written) / BackwardParams::saved (read).
ForwardResult run_forward(TestData& d, Path path, ExecConfig config = {},
                          const TensorView& saved = {});
BackwardResult run_backward(TestData& d, Path path, ExecConfig config = {},
                            const TensorView& saved = {});

// A saved-for-backward tensor for d's call with `chunk_size` and `content` (gdr::saved_shape),
// every element NaN, so that a record the forward does not write poisons the backward that
// reads it.
HostTensor make_saved(const TestData& d, int chunk_size, gdr::SavedContent content);

// Both contents of the saved tensor, and a name for each in failure messages.
inline constexpr gdr::SavedContent kSavedContents[] = {gdr::SavedContent::chunk_states,
                                                       gdr::SavedContent::chunk_intermediates};
inline const char* saved_name(gdr::SavedContent content) {
  return content == gdr::SavedContent::chunk_states ? "saved chunk states"
                                                    : "saved chunk intermediates";
}

// The float64 oracle: the reference path on a float64 copy of every float tensor (exact for
// f16/bf16/f32 inputs), so o and the gradients are not rounded to the input dtype. Prefer these
// to run_forward(d, Path::reference) when comparing a path in its working precision.
TestData as_float64(const TestData& d);
ForwardResult reference_forward(const TestData& d);
BackwardResult reference_backward(const TestData& d);

// The loss whose gradients run_backward computes: sum(dout .* o) + sum(dfinal_state .* S_N).
double loss(const TestData& d, const ForwardResult& r);

// Relative Frobenius error ||a - ref|| / ||ref|| over the positions that are finite in ref.
// NaN positions must match (NaN/inf in `a` where ref is finite, or the reverse, or different
// sizes give +inf). ||ref|| == 0: returns ||a|| (absolute). Both empty: 0.
double rel_error(const std::vector<double>& a, const std::vector<double>& ref);
double rel_error(const std::vector<float>& a, const std::vector<float>& ref);

// docs/operator.md §7 bounds for the precision of the case (fp32/f64 vs f16/bf16).
double forward_tolerance(const Case& c);
// The bound for a decode pool after the step: forward_tolerance, plus 5e-4 for a bfloat16 pool
// (c.bf16_state), which is compared with the reference's state rounded to bf16: the elements
// whose fp32 value lies across a rounding boundary from the reference's differ by one bf16 step.
double state_tolerance(const Case& c);
// `values` rounded to the nearest bfloat16 (ties to even), as a bf16 pool stores them.
std::vector<double> rounded_to_bf16(const std::vector<double>& values);
double backward_tolerance(const Case& c);

// Named (field, got, ref) pairs, for reporting (tools) or custom checks.
struct Field {
  const char* name;
  const std::vector<double>* got;
  const std::vector<double>* ref;
};
std::vector<Field> fields(const ForwardResult& got, const ForwardResult& ref);
std::vector<Field> fields(const BackwardResult& got, const BackwardResult& ref);

// Sequence n (batch row n, or sequence n under varlen) as a standalone B = 1 problem: its
// tokens of q, k, v, g, beta, mask and dout, row n of h0 and dfinal_state, A_log and dt_bias;
// fresh output buffers. The same values, so its results equal row/sequence n of the original.
TestData extract_sequence(const TestData& d, std::int64_t n);

// Tokens [t0, t1) of a B = 1, non-varlen problem (h0 and dfinal_state kept as they are).
TestData slice_tokens(const TestData& d, std::int64_t t0, std::int64_t t1);

// ---- decode ----

// Inputs of one decode step: base holds q, k, v, g, beta, A_log, dt_bias, mask and o of a
// make_problem(c) call (c.T <= 16, no varlen; base.h0 / final_state are not used); state is a
// random pool of P rows; state_indices (when asked for) maps batch row b to a distinct pool
// row, with b = 1 skipped (-1) when B >= 3. Modify them freely before running.
struct DecodeData {
  TestData base;
  std::int64_t P = 0;
  HostTensor state;          // [P, Hv, Dk, Dv] (k-first) or [P, Hv, Dv, Dk]
  HostTensor state_indices;  // optional [B], int32 (int64 when c.cu_seqlens_i64)
  DecodeParams params() const;
};
DecodeData make_decode_problem(const Case& c, std::int64_t P = 0 /* 0 = B */,
                               bool with_indices = false);

// The float64 reference of the step (reference_forward), on a copy of the pool: o (0 for skipped
// rows) and the whole pool after the step (rows not referenced are unchanged). Call before
// run_decode.
ForwardResult decode_reference(const DecodeData& d);

// Poisons o, runs gdr::decode (state updated in place), returns o and the whole pool after.
ForwardResult run_decode(DecodeData& d, Path path = Path::automatic, ExecConfig config = {});

// A fresh random seed (std::random_device).
std::uint64_t fresh_seed();

}  // namespace gdr::test
