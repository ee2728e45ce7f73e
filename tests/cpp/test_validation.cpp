// Every validation rule (docs/operator.md §6): feed the bad input, check the message names the
// operation, the tensor, the value and what is allowed.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gdr/gdr.h"
#include "support_gtest.h"

namespace gdr::test {
namespace {

void expect_invalid(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return;
  }
  std::string want;
  for (const std::string& p : parts) want += " [" + p + "]";
  ADD_FAILURE() << "no error; expected one mentioning" << want;
}

class Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    c.B = 2;
    c.T = 5;
    c.Hk = 2;
    c.Hv = 4;
    c.Dk = 8;
    c.Dv = 6;
    d = make_problem(c);
    fp = d.forward_params();
    bp = d.backward_params();
  }
  void fwd(const std::vector<std::string>& parts) {
    expect_invalid([&] { validate_forward(fp); }, parts);
  }
  void bwd(const std::vector<std::string>& parts) {
    expect_invalid([&] { validate_backward(bp); }, parts);
  }
  Case c;
  TestData d;
  ForwardParams fp;
  BackwardParams bp;
};

TEST_F(Validation, ValidCallsPass) {
  Problem p = validate_forward(fp);
  EXPECT_EQ(p.B, 2);
  EXPECT_EQ(p.T, 5);
  EXPECT_EQ(p.N, 2);
  EXPECT_EQ(p.Hk, 2);
  EXPECT_EQ(p.Hv, 4);
  EXPECT_EQ(p.Dk, 8);
  EXPECT_EQ(p.Dv, 6);
  EXPECT_EQ(p.gate, GateKind::scalar);
  EXPECT_TRUE(p.has_h0);
  EXPECT_TRUE(p.has_final_state);
  EXPECT_FALSE(p.varlen);
  EXPECT_FLOAT_EQ(p.scale, static_cast<float>(1.0 / std::sqrt(8.0)));
  EXPECT_NO_THROW(validate_backward(bp));
  fp.opts.scale = 0.25f;
  EXPECT_FLOAT_EQ(validate_forward(fp).scale, 0.25f);
}

TEST_F(Validation, OperationNameLeadsTheMessage) {
  fp.in.v.shape[2] = 31;
  expect_invalid([&] { gdr::forward(fp); },
                 {"gdr.forward: v has 31 heads; Hv must be a multiple of Hk=2"});
  expect_invalid([&] { validate_forward(fp, "gdr.chunk_forward"); },
                 {"gdr.chunk_forward: v has 31 heads"});
  bp.in.v.shape[2] = 31;
  expect_invalid([&] { gdr::backward(bp); }, {"gdr.backward: v has 31 heads"});
}

TEST_F(Validation, RequiredTensors) {
  for (auto [t, name] : {std::pair{&fp.in.q, "q"},
                         {&fp.in.k, "k"},
                         {&fp.in.v, "v"},
                         {&fp.in.g, "g"},
                         {&fp.in.beta, "beta"},
                         {&fp.o, "o"}}) {
    const TensorView keep = *t;
    *t = TensorView{};
    fwd({"gdr.forward: ", std::string(name) + " is not given"});
    *t = keep;
  }
  bp.dout = TensorView{};
  bwd({"gdr.backward: dout is not given"});
}

TEST_F(Validation, RankOfQ) {
  fp.in.q.rank = 3;
  fwd({"q has rank 3", "[B, T, Hk, Dk]"});
}

TEST_F(Validation, RankOutOfRange) {
  fp.in.k.rank = 5;
  fwd({"k has rank 5", "expected [B, T, Hk, Dk]"});
  bp.dq.rank = 5;
  bwd({"dq has rank 5; must be 1..4"});
}

TEST_F(Validation, DtypeOfQ) {
  fp.in.q.dtype = DType::i32;
  fwd({"q has dtype int32", "float32, float16, bfloat16 or float64"});
}

TEST_F(Validation, ShapeOfK) {
  fp.in.k.shape[3] = 16;
  fwd({"k has shape [2, 5, 2, 16]", "[B, T, Hk, Dk] = [2, 5, 2, 8]", "Dk is 8, got 16"});
}

TEST_F(Validation, KAndVHaveQsDtype) {
  fp.in.k.dtype = DType::f16;
  fwd({"k has dtype float16; expected float32"});
  fp.in.k.dtype = DType::f32;
  fp.in.v.dtype = DType::bf16;
  fwd({"v has dtype bfloat16; expected float32"});
}

TEST_F(Validation, HvMultipleOfHk) {
  fp.in.v.shape[2] = 3;
  fwd({"v has 3 heads; Hv must be a multiple of Hk=2"});
}

TEST_F(Validation, VBatchAndTokens) {
  fp.in.v.shape[0] = 3;
  fwd({"v has shape [3, 5, 4, 6]", "B is 2, got 3"});
  fp.in.v.shape[0] = 2;
  fp.in.v.shape[1] = 4;
  fwd({"v has shape [2, 4, 4, 6]", "T is 5, got 4"});
}

TEST_F(Validation, ZeroHeadsOrDims) {
  fp.in.q.shape[3] = 0;
  fwd({"q has head dim 0; Dk must be >= 1"});
  fp.in.q.shape[3] = 8;
  fp.in.q.shape[2] = 0;
  fwd({"q has 0 heads; Hk must be >= 1"});
}

TEST_F(Validation, ZeroValueHeadsOrDims) {
  fp.in.v.shape[2] = 0;
  fwd({"v has 0 heads; Hv must be >= 1"});
  fp.in.v.shape[2] = 4;
  fp.in.v.shape[3] = 0;
  fwd({"v has head dim 0; Dv must be >= 1"});
}

TEST_F(Validation, NegativeDeviceIndex) {
  for (TensorView* t :
       {&fp.in.q, &fp.in.k, &fp.in.v, &fp.in.g, &fp.in.beta, &fp.in.h0, &fp.o, &fp.final_state})
    t->device = DeviceType::cuda;
  fp.in.q.device_index = -1;
  fwd({"q is on cuda:-1; device index must be >= 0"});
}

TEST_F(Validation, StateLayoutValue) {
  fp.opts.state_layout = static_cast<StateLayout>(7);
  fwd({"state_layout is 7; expected k_first or v_first"});
}

TEST_F(Validation, Float64InputsAcceptFloat32Gates) {
  Case f = c;
  f.dtype = DType::f64;
  TestData e = make_problem(f);  // g, beta f64
  ForwardParams p = e.forward_params();
  EXPECT_NO_THROW(validate_forward(p));
  HostTensor g32(DType::f32, e.g.shape()), b32(DType::f32, e.beta.shape());
  p.in.g = g32.view();
  p.in.beta = b32.view();
  EXPECT_NO_THROW(validate_forward(p));
  p.in.g.dtype = DType::bf16;
  expect_invalid([&] { validate_forward(p); },
                 {"g has dtype bfloat16; expected float32 or float64"});
}

TEST_F(Validation, GateRankAndShape) {
  fp.in.g.rank = 2;
  fwd({"g has rank 2", "[B, T, Hv] (scalar gate) or [B, T, Hv, Dk] (per-key gate)"});
  fp.in.g.rank = 3;
  fp.in.g.shape[2] = 2;
  fwd({"g has shape [2, 5, 2]", "Hv is 4, got 2"});
}

TEST_F(Validation, PerKeyGateShape) {
  Case pk = c;
  pk.gate = GateKind::per_key;
  TestData e = make_problem(pk);
  ForwardParams p = e.forward_params();
  EXPECT_EQ(validate_forward(p).gate, GateKind::per_key);
  p.in.g.shape[3] = 7;
  expect_invalid([&] { validate_forward(p); }, {"g has shape [2, 5, 4, 7]", "Dk is 8, got 7"});
}

TEST_F(Validation, GateAndBetaDtypes) {
  fp.in.g.dtype = DType::f16;
  fwd({"g has dtype float16; expected float32"});
  fp.in.g.dtype = DType::f32;
  fp.in.beta.dtype = DType::f64;
  fwd({"beta has dtype float64; expected float32"});
  // The input dtype is accepted for g and beta.
  Case h = c;
  h.dtype = DType::bf16;
  h.gates_in_dtype = true;
  TestData e = make_problem(h);
  EXPECT_NO_THROW(validate_forward(e.forward_params()));
  ForwardParams p = e.forward_params();
  p.in.g.dtype = DType::f16;
  expect_invalid([&] { validate_forward(p); },
                 {"g has dtype float16; expected float32 or bfloat16"});
}

TEST_F(Validation, BetaShape) {
  fp.in.beta.shape[2] = 2;
  fwd({"beta has shape [2, 5, 2]", "[B, T, Hv]"});
}

TEST_F(Validation, InitialStateRowsAndLayout) {
  fp.in.h0.shape[0] = 3;
  fwd({"h0 has shape [3, 4, 8, 6]", "[N, Hv, Dk, Dv]", "N is 2, got 3"});
  fp.in.h0.shape[0] = 2;
  fp.opts.state_layout = StateLayout::v_first;  // h0 is k-first: [2, 4, 8, 6]
  fwd({"h0 has shape [2, 4, 8, 6]", "[N, Hv, Dv, Dk] = [2, 4, 6, 8]"});
}

TEST_F(Validation, StateDtypes) {
  fp.in.h0.dtype = DType::f16;
  fwd({"h0 has dtype float16; expected float32"});
  fp.in.h0.dtype = DType::f64;
  fwd({"h0 has dtype float64; expected float32"});
  fp.in.h0.dtype = DType::f32;
  fp.final_state.dtype = DType::bf16;
  fwd({"final_state has dtype bfloat16; expected float32"});
  // f64 states with f64 inputs.
  Case f = c;
  f.dtype = DType::f64;
  TestData e = make_problem(f);
  EXPECT_NO_THROW(validate_forward(e.forward_params()));
  ForwardParams p = e.forward_params();
  p.final_state.dtype = DType::f32;  // f32 also fine with f64 inputs
  EXPECT_NO_THROW(validate_forward(p));
}

TEST_F(Validation, FinalStateShape) {
  fp.final_state.shape[1] = 2;
  fwd({"final_state has shape [2, 2, 8, 6]", "Hv is 4, got 2"});
}

TEST_F(Validation, OutputShapeAndDtype) {
  fp.o.shape[3] = 5;
  fwd({"o has shape [2, 5, 4, 5]", "Dv is 6, got 5"});
  fp.o.shape[3] = 6;
  fp.o.dtype = DType::f16;
  fwd({"o has dtype float16; expected float32"});
}

TEST_F(Validation, Mask) {
  Case m = c;
  m.mask = true;
  TestData e = make_problem(m);
  ForwardParams p = e.forward_params();
  EXPECT_TRUE(validate_forward(p).has_mask);
  p.in.mask.shape[1] = 4;
  expect_invalid([&] { validate_forward(p); }, {"mask has shape [2, 4]", "[B, T] = [2, 5]"});
  p.in.mask.shape[1] = 5;
  p.in.mask.dtype = DType::i32;
  expect_invalid([&] { validate_forward(p); }, {"mask has dtype int32; expected bool"});
}

TEST_F(Validation, Devices) {
  fp.in.k.device = DeviceType::cuda;
  fwd({"k is on cuda:0; all tensors must be on one device (q is on cpu)"});
  fp.in.k.device = DeviceType::cpu;
  fp.final_state.device = DeviceType::cuda;
  fp.final_state.device_index = 1;
  fwd({"final_state is on cuda:1"});
  // Two CUDA devices.
  for (TensorView* t :
       {&fp.in.q, &fp.in.k, &fp.in.v, &fp.in.g, &fp.in.beta, &fp.in.h0, &fp.o, &fp.final_state})
    t->device = DeviceType::cuda;
  fp.final_state.device_index = 1;
  fwd({"final_state is on cuda:1; all tensors must be on one device (q is on cuda:0)"});
}

TEST_F(Validation, Float64OnlyOnCpu) {
  Case f = c;
  f.dtype = DType::f64;
  TestData e = make_problem(f);
  ForwardParams p = e.forward_params();
  p.in.q.device = DeviceType::cuda;
  expect_invalid([&] { validate_forward(p); },
                 {"q has dtype float64 on cuda:0; float64 is supported on the cpu only"});
}

TEST_F(Validation, Strides) {
  fp.in.v.stride[3] = 2;
  fwd({"v has stride 2 in its last dim; the last dim must be contiguous (stride 1)"});
  fp.in.v.stride[3] = 1;
  fp.in.q.stride[1] = -8;
  fwd({"q has stride -8 in dim 1; strides must be >= 0"});
  fp.in.q.stride[1] = 16;
  fp.in.q.shape[0] = -1;
  fwd({"q has size -1 in dim 0; sizes must be >= 0"});
}

TEST_F(Validation, NullData) {
  fp.in.beta.data = nullptr;
  fwd({"beta has no data (null pointer) for 40 elements"});
}

TEST_F(Validation, ScaleAndEps) {
  fp.opts.scale = std::numeric_limits<float>::quiet_NaN();
  fwd({"scale is nan; must be finite"});
  fp.opts.scale = std::numeric_limits<float>::infinity();
  fwd({"scale is inf; must be finite"});
  fp.opts.scale = 0.0f;
  fp.opts.qk_l2norm = true;
  fp.opts.l2norm_eps = -1.0f;
  fwd({"l2norm_eps is -1", "must be finite and >= 0"});
}

TEST_F(Validation, GateInKernelParameters) {
  Case k = c;
  k.gate_in_kernel = true;
  TestData e = make_problem(k);
  ForwardParams p = e.forward_params();
  EXPECT_NO_THROW(validate_forward(p));
  const TensorView A = p.in.A_log, dt = p.in.dt_bias;
  p.in.A_log = TensorView{};
  expect_invalid([&] { validate_forward(p); },
                 {"A_log is not given; gate_in_kernel requires A_log [Hv]"});
  p.in.A_log = A;
  p.in.A_log.shape[0] = 3;
  expect_invalid([&] { validate_forward(p); }, {"A_log has shape [3]", "[Hv] = [4]"});
  p.in.A_log = A;
  p.in.A_log.dtype = DType::f16;
  expect_invalid([&] { validate_forward(p); }, {"A_log has dtype float16; expected float32"});
  p.in.A_log = A;
  p.in.dt_bias = TensorView{};
  expect_invalid([&] { validate_forward(p); }, {"dt_bias is not given", "dt_bias [Hv]"});
  p.in.dt_bias = dt;
  p.in.dt_bias.rank = 2;
  p.in.dt_bias.shape[1] = 8;
  expect_invalid([&] { validate_forward(p); },
                 {"dt_bias has shape [4, 8]; expected [Hv] for a scalar gate"});
  // Per-key gate: dt_bias [Hv, Dk].
  Case kp = k;
  kp.gate = GateKind::per_key;
  TestData f = make_problem(kp);
  ForwardParams q = f.forward_params();
  EXPECT_NO_THROW(validate_forward(q));
  q.in.dt_bias = A;  // [Hv]
  expect_invalid([&] { validate_forward(q); },
                 {"dt_bias has shape [4]; expected [Hv, Dk] for a per-key gate"});
  q.in.dt_bias = f.dt_bias.view();
  q.in.dt_bias.shape[1] = 7;
  expect_invalid([&] { validate_forward(q); }, {"dt_bias has shape [4, 7]", "Dk is 8, got 7"});
}

TEST_F(Validation, GateParametersWithoutGateInKernel) {
  Case k = c;
  k.gate_in_kernel = true;
  TestData e = make_problem(k);
  fp.in.A_log = e.A_log.view();
  fwd({"A_log is given but gate_in_kernel is off"});
  fp.in.A_log = TensorView{};
  fp.in.dt_bias = e.dt_bias.view();
  fwd({"dt_bias is given but gate_in_kernel is off"});
}

TEST_F(Validation, CuSeqlens) {
  Case v = c;
  v.B = 1;
  v.seqlens = {2, 0, 3};
  TestData e = make_problem(v);
  ForwardParams p = e.forward_params();
  Problem prob = validate_forward(p);
  EXPECT_TRUE(prob.varlen);
  EXPECT_EQ(prob.N, 3);
  EXPECT_EQ(sequence_span(prob, p.in, 1).len, 0);
  EXPECT_EQ(sequence_span(prob, p.in, 2).t0, 2);
  EXPECT_EQ(sequence_span(prob, p.in, 2).len, 3);

  auto bad = [&](std::vector<double> values, const std::vector<std::string>& parts) {
    HostTensor cu(DType::i64, {static_cast<std::int64_t>(values.size())});
    cu.from_double(values);
    ForwardParams q = p;
    q.in.cu_seqlens = cu.view();
    expect_invalid([&] { validate_forward(q); }, parts);
  };
  bad({1, 2, 2, 5}, {"cu_seqlens[0] is 1; must be 0"});
  bad({0, 3, 2, 5}, {"cu_seqlens[2] is 2 < cu_seqlens[1] = 3; must be non-decreasing"});
  bad({0, 2, 2, 4}, {"cu_seqlens[3] is 4; must equal T=5"});
  bad({0, 2, 5}, {"h0 has shape [3, 4, 8, 6]", "N is 2, got 3"});  // h0 rows == N

  ForwardParams q = p;
  q.in.cu_seqlens.shape[0] = 0;
  expect_invalid([&] { validate_forward(q); }, {"cu_seqlens has length 0; expected N + 1 >= 1"});
  q = p;
  q.in.cu_seqlens.rank = 2;
  q.in.cu_seqlens.shape[1] = 1;
  expect_invalid([&] { validate_forward(q); }, {"cu_seqlens has rank 2", "[N + 1]"});
  q = p;
  q.in.cu_seqlens.dtype = DType::f32;
  expect_invalid([&] { validate_forward(q); },
                 {"cu_seqlens has dtype float32; expected int32 or int64"});
  // B must be 1.
  fp.in.cu_seqlens = e.cu_seqlens.view();
  fwd({"q has batch 2 with cu_seqlens; varlen requires B == 1"});
}

TEST_F(Validation, CheckCuSeqlensValuesDirect) {
  const std::int32_t good[] = {0, 0, 4, 9};
  EXPECT_NO_THROW(check_cu_seqlens_values(good, DType::i32, 4, 9, "op"));
  const std::int32_t bad[] = {0, 5, 4, 9};
  expect_invalid([&] { check_cu_seqlens_values(bad, DType::i32, 4, 9, "gdr.x"); },
                 {"gdr.x: cu_seqlens[2] is 4 < cu_seqlens[1] = 5"});
  const std::int64_t end[] = {0, 3};
  expect_invalid([&] { check_cu_seqlens_values(end, DType::i64, 2, 9, "gdr.x"); },
                 {"gdr.x: cu_seqlens[1] is 3; must equal T=9"});
}

TEST_F(Validation, EmptyInputsAreValid) {
  Case e0 = c;
  e0.T = 0;
  TestData e = make_problem(e0);
  Problem p = validate_forward(e.forward_params());
  EXPECT_EQ(p.T, 0);
  EXPECT_NO_THROW(validate_backward(e.backward_params()));
  // N = 0: B = 1, cu_seqlens = [0], no h0.
  Case n0 = c;
  n0.B = 1;
  n0.T = 0;
  n0.h0 = false;
  n0.final_state = false;
  TestData f = make_problem(n0);
  f.cu_seqlens = HostTensor(DType::i32, {1});
  f.cu_seqlens.fill(0);
  EXPECT_EQ(validate_forward(f.forward_params()).N, 0);
}

TEST_F(Validation, BackwardGradientShapesAndDtypes) {
  bp.dq.shape[1] = 4;
  bwd({"gdr.backward: dq has shape [2, 4, 2, 8]; expected the shape of q [2, 5, 2, 8]"});
  bp.dq.shape[1] = 5;
  bp.dg.dtype = DType::f16;
  bwd({"dg has dtype float16; expected the dtype of g (float32)"});
  bp.dg.dtype = DType::f32;
  bp.dbeta.rank = 4;
  bwd({"dbeta has shape", "expected the shape of beta [2, 5, 4]"});
  bp.dbeta.rank = 3;
  bp.dv.device = DeviceType::cuda;
  bwd({"dv is on cuda:0; all tensors must be on one device"});
  bp.dv.device = DeviceType::cpu;
  bp.dout.dtype = DType::f64;
  bwd({"dout has dtype float64; expected float32"});
  bp.dout.dtype = DType::f32;
  bp.dfinal_state.shape[0] = 1;
  bwd({"dfinal_state has shape [1, 4, 8, 6]", "N is 2, got 1"});
  bp.dfinal_state.shape[0] = 2;
  bp.dh0.shape[2] = 6;
  bwd({"dh0 has shape [2, 4, 6, 6]; expected the shape of h0 [2, 4, 8, 6]"});
}

TEST_F(Validation, BackwardOptionalGradients) {
  // Any gradient may be left out.
  for (TensorView* t : {&bp.dq, &bp.dk, &bp.dv, &bp.dg, &bp.dbeta, &bp.dh0, &bp.dfinal_state})
    *t = TensorView{};
  EXPECT_NO_THROW(validate_backward(bp));
  // dh0 only with h0; dA_log / ddt_bias only with gate_in_kernel.
  bp = d.backward_params();
  bp.in.h0 = TensorView{};
  bwd({"dh0 is given but h0 is not"});
  Case k = c;
  k.gate_in_kernel = true;
  TestData e = make_problem(k);
  bp = d.backward_params();
  bp.dA_log = e.dA_log.view();
  bwd({"dA_log is given but gate_in_kernel is off"});
  bp.dA_log = TensorView{};
  bp.ddt_bias = e.ddt_bias.view();
  bwd({"ddt_bias is given but gate_in_kernel is off"});
  BackwardParams q = e.backward_params();
  EXPECT_NO_THROW(validate_backward(q));
  q.ddt_bias.shape[0] = 2;
  expect_invalid([&] { validate_backward(q); },
                 {"ddt_bias has shape [2]; expected the shape of dt_bias [4]"});
}

// The saved-for-backward tensor: [chunk_rows, Hv, record] f32 for f32 inputs, record Dk Dv
// (chunk states) or longer (chunk intermediates), checked against gdr::saved_shape for the
// call's chunk size before any memory is touched, in both directions.
TEST_F(Validation, SavedForBackward) {
  // B = 2, T = 5, Hv = 4, Dk = 8, Dv = 6, C = 64: rows 2 ceil(5 / 64) = 2, record 8 * 6 = 48
  // (chunk states) or 8 * 6 + 64^2 + 64 * 6 = 4528 (chunk intermediates).
  const SavedShape want = saved_shape(validate_forward(fp), 64, SavedContent::chunk_intermediates);
  EXPECT_EQ(want.chunk_rows, 2);
  EXPECT_EQ(want.Hv, 4);
  EXPECT_EQ(want.record, 4528);
  EXPECT_EQ(want.dtype, DType::f32);
  EXPECT_EQ(want.content, SavedContent::chunk_intermediates);
  EXPECT_EQ(want.bytes(), 2 * 4 * 4528 * 4);
  const SavedShape states = saved_shape(validate_forward(fp), 64);
  EXPECT_EQ(states.content, SavedContent::chunk_states);
  EXPECT_EQ(states.record, 48);
  EXPECT_EQ(states.chunk_rows, 2);
  EXPECT_EQ(saved_shape(validate_forward(fp), 16, SavedContent::chunk_intermediates).record,
            48 + 256 + 96);
  EXPECT_EQ(saved_shape(validate_forward(fp), 16, SavedContent::chunk_states).record, 48);
  HostTensor state_records(DType::f32, {2, 4, 48});
  fp.saved = state_records.view();
  EXPECT_EQ(gdr::resolve_forward_path(fp), Path::chunkwise);
  fp.saved = TensorView{};
  HostTensor saved(DType::f32, {2, 4, 4528});
  for (const std::string op : {"gdr.forward", "gdr.backward"}) {
    const bool forward = op == "gdr.forward";
    TensorView& view = forward ? fp.saved : bp.saved;
    const std::string role = forward ? "written" : "read";
    auto call = [&](const ExecConfig& cfg, const std::vector<std::string>& parts) {
      if (forward)
        expect_invalid([&] { gdr::forward(fp, cfg); }, parts);
      else
        expect_invalid([&] { gdr::backward(bp, cfg); }, parts);
    };
    view = saved.view();
    EXPECT_NO_THROW(forward ? gdr::resolve_forward_path(fp) : gdr::resolve_backward_path(bp));
    view.rank = 2;
    call({}, {op + ": saved has rank 2 (shape [2, 4]); expected [chunk_rows, Hv, record] = "
                   "[2, 4, 48 or 4528] (chunk_rows = B ceil(T / C), record = Dk Dv for chunk "
                   "states or Dk Dv + C^2 + C Dv for chunk intermediates, with C = "
                   "chunk_size = 64; gdr::saved_shape gives it)"});
    view = saved.view();
    view.shape[0] = 3;
    call({}, {op + ": saved has shape [3, 4, 4528]; expected [chunk_rows, Hv, record] = "
                   "[2, 4, 48 or 4528]"});
    view = saved.view();
    view.shape[2] = 49;
    call({}, {op + ": saved has shape [2, 4, 49]; expected [chunk_rows, Hv, record] = "
                   "[2, 4, 48 or 4528]"});
    view = saved.view();
    view.shape[1] = 2;
    call({}, {"saved has shape [2, 2, 4528]"});
    view = saved.view();
    ExecConfig c16;
    c16.chunk_size = 16;
    call(c16, {op + ": saved has shape [2, 4, 4528]; expected [chunk_rows, Hv, record] = "
                    "[2, 4, 48 or 400]",
               "C = chunk_size = 16"});
    view.dtype = DType::f16;
    call({}, {op + ": saved has dtype float16; expected float32"});
    view.dtype = DType::f64;
    call({}, {"saved has dtype float64; expected float32"});
    // bf16 chunk states: only CUDA tensors with 16-bit inputs (and chunk states, not
    // intermediates).
    view.dtype = DType::bf16;
    call({}, {op + ": saved has dtype bfloat16; bfloat16 chunk states are taken only for CUDA "
                   "tensors with float16 or bfloat16 inputs and chunk states (record Dk Dv); here "
                   "on the CPU, inputs float32, record 4528: expected float32"});
    view = saved.view();
    view.stride[2] = 2;
    call({}, {"saved has stride 2 in its last dim; the last dim must be contiguous"});
    view = saved.view();
    view.device = DeviceType::cuda;
    call({}, {op + ": saved is on cuda:0; all tensors must be on one device (q is on cpu)"});
    view = saved.view();
    view.data = nullptr;
    call({}, {"saved has no data (null pointer)"});
    view = saved.view();
    for (Path path : {Path::sequential, Path::reference}) {
      ExecConfig forced;
      forced.path = path;
      call(forced, {op + ": saved is given with path " + std::string(to_string(path)) +
                    "; saved is " + role + " by the chunkwise path only"});
    }
    view = TensorView{};
  }
  // Tensors on cuda: chunk intermediates refused whatever the build (the CUDA chunked forward
  // writes chunk states only).
  ForwardParams on_cuda = fp;
  on_cuda.saved = saved.view();
  for (TensorView* t :
       {&on_cuda.in.q, &on_cuda.in.k, &on_cuda.in.v, &on_cuda.in.g, &on_cuda.in.beta,
        &on_cuda.in.h0, &on_cuda.o, &on_cuda.final_state, &on_cuda.saved})
    t->device = DeviceType::cuda;
  expect_invalid([&] { gdr::forward(on_cuda); },
                 {"gdr.forward: saved holds chunk intermediates but the tensors are on cuda; the "
                  "CUDA chunked forward keeps chunk states only"});
  // float64 inputs keep float64 records.
  Case c64 = c;
  c64.dtype = DType::f64;
  TestData e = make_problem(c64);
  EXPECT_EQ(saved_shape(validate_forward(e.forward_params()), 64).dtype, DType::f64);
  // Varlen: floor((T + N (C - 1)) / C) rows, from the shapes alone.
  Case v = c;
  v.B = 1;
  v.seqlens = {3, 0, 70};
  TestData f = make_problem(v);
  EXPECT_EQ(saved_shape(validate_forward(f.forward_params()), 32).chunk_rows, (73 + 3 * 31) / 32);
  EXPECT_EQ(saved_shape(validate_forward(f.forward_params()), 32, SavedContent::chunk_intermediates)
                .chunk_rows,
            (73 + 3 * 31) / 32);
  ForwardParams vp = f.forward_params();
  HostTensor vs(DType::f32, {1, 4, 4528});
  vp.saved = vs.view();
  expect_invalid([&] { gdr::forward(vp); },
                 {"saved has shape [1, 4, 4528]; expected [chunk_rows, Hv, record] = [4, 4, "
                  "48 or 4528] (chunk_rows = floor((T + N (C - 1)) / C)"});  // (73 + 3 * 63) / 64
}

class DecodeValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    c.B = 3;
    c.T = 1;
    c.Hk = 2;
    c.Hv = 4;
    c.Dk = 8;
    c.Dv = 6;
    d = make_decode_problem(c, 5, true);
    p = d.params();
  }
  void dec(const std::vector<std::string>& parts) {
    expect_invalid([&] { validate_decode(p); }, parts);
  }
  Case c;
  DecodeData d;
  DecodeParams p;
};

TEST_F(DecodeValidation, ValidCallPasses) {
  Problem prob = validate_decode(p);
  EXPECT_EQ(prob.P, 5);
  EXPECT_EQ(prob.N, 3);
  EXPECT_EQ(prob.T, 1);
}

TEST_F(DecodeValidation, TokensAtMost16) {
  Case l = c;
  l.T = 17;
  DecodeData e = make_decode_problem(l, 5, true);
  DecodeParams q = e.params();
  expect_invalid([&] { validate_decode(q); },
                 {"gdr.decode: q has 17 tokens; decode takes T between 0 and 16",
                  "use gdr.forward for longer sequences"});
  l.T = 0;
  DecodeData z = make_decode_problem(l, 5, true);
  EXPECT_NO_THROW(validate_decode(z.params()));
}

TEST_F(DecodeValidation, StateShapeAndDtype) {
  p.state = TensorView{};
  dec({"gdr.decode: state is not given"});
  p = d.params();
  p.state.shape[2] = 6;
  dec({"state has shape [5, 4, 6, 6]", "[P, Hv, Dk, Dv] = [5, 4, 8, 6]"});
  p = d.params();
  p.opts.state_layout = StateLayout::v_first;
  dec({"state has shape [5, 4, 8, 6]", "[P, Hv, Dv, Dk] = [5, 4, 6, 8]"});
  p = d.params();
  p.state.dtype = DType::f16;  // (a bfloat16 pool is accepted)
  dec({"state has dtype float16; expected float32 or bfloat16"});
  p = d.params();
  p.state.rank = 3;
  dec({"state has rank 3"});
}

TEST_F(DecodeValidation, StateIndices) {
  d.state_indices.set(2, 5.0);
  dec({"gdr.decode: state_indices[2] is 5; must be < P=5"});
  d.state_indices.set(2, -7.0);  // negative: skipped, fine
  EXPECT_NO_THROW(validate_decode(p));
  p.state_indices.shape[0] = 2;
  dec({"state_indices has shape [2]", "[B] = [3]"});
  p = d.params();
  p.state_indices.dtype = DType::f32;
  dec({"state_indices has dtype float32; expected int32 or int64"});
}

TEST_F(DecodeValidation, PoolRowsWithoutIndices) {
  DecodeData e = make_decode_problem(c, 2, false);
  DecodeParams q = e.params();
  expect_invalid([&] { validate_decode(q); },
                 {"gdr.decode: state has 2 rows; without state_indices P must be >= B=3"});
  DecodeData f = make_decode_problem(c, 3, false);
  EXPECT_NO_THROW(validate_decode(f.params()));
}

TEST_F(DecodeValidation, SharedRulesApply) {
  p.v.shape[2] = 5;
  dec({"gdr.decode: v has 5 heads; Hv must be a multiple of Hk=2"});
  p = d.params();
  p.o.dtype = DType::f16;
  dec({"gdr.decode: o has dtype float16; expected float32"});
  p = d.params();
  p.state.device = DeviceType::cuda;
  dec({"gdr.decode: state is on cuda:0; all tensors must be on one device (q is on cpu)"});
}

TEST_F(DecodeValidation, PositiveGateIsRefused) {
  d.base.g.set(1 * 4 + 3, 2.5);  // g[1, 0, 3] of [B, T, Hv] = [3, 1, 4]
  dec({"gdr.decode: g[1, 0, 3] is 2.5; g must be <= 0"});
  ExecConfig config;
  config.op_name = "gdr.decode_step";
  expect_invalid([&] { gdr::decode(p, config); }, {"gdr.decode_step: g[1, 0, 3] is 2.5"});
}

// ---- the values of g (docs/operator.md §6) ----

// g is the natural log of the decay: an element > 0 (a forgotten log-sigmoid) is refused on the
// CPU, in every direction, naming the element, its value and what is allowed.
TEST_F(Validation, PositiveGateIsRefusedWithItsIndexAndValue) {
  d.g.set((1 * 5 + 3) * 4 + 2, 0.25);  // g[1, 3, 2] of [B, T, Hv] = [2, 5, 4]
  const std::vector<std::string> rule = {"g must be <= 0", "natural log of the decay",
                                         "-inf and NaN are not refused", "log-sigmoid"};
  std::vector<std::string> want = rule;
  want.push_back("gdr.forward: g[1, 3, 2] is 0.25;");
  fwd(want);
  expect_invalid([&] { gdr::forward(fp); }, want);
  bwd({"gdr.backward: g[1, 3, 2] is 0.25;"});
  expect_invalid([&] { gdr::backward(bp); }, {"gdr.backward: g[1, 3, 2] is 0.25;"});
  // The first offending element in row-major order is the one named.
  d.g.set((1 * 5 + 4) * 4 + 0, 7.0);
  d.g.set((0 * 5 + 2) * 4 + 1, 1.5);
  fwd({"gdr.forward: g[0, 2, 1] is 1.5;"});
  // +inf is > 0 too.
  d.g.set((0 * 5 + 2) * 4 + 1, std::numeric_limits<double>::infinity());
  fwd({"gdr.forward: g[0, 2, 1] is inf;"});
}

TEST(GateValues, PerKeyLowPrecisionAndStridedGatesAreChecked) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    Case c;
    c.B = 1;
    c.T = 3;
    c.Hk = 1;
    c.Hv = 2;
    c.Dk = 4;
    c.Dv = 4;
    c.gate = GateKind::per_key;
    c.dtype = dtype;
    c.gates_in_dtype = true;
    c.strided = true;
    TestData d = make_problem(c);
    d.g.set(((0 * 3 + 2) * 2 + 1) * 4 + 3, 0.5);  // g[0, 2, 1, 3]
    ForwardParams p = d.forward_params();
    expect_invalid([&] { gdr::forward(p); }, {"gdr.forward: g[0, 2, 1, 3] is 0.5;"});
  }
}

// 0 and -0 are allowed (no decay); -inf and NaN are not refused: they pass through to the
// outputs (docs/operator.md §6; -inf is exact decay to 0 on every CPU path).
TEST(GateValues, ZeroMinusInfinityAndNanAreNotRefused) {
  Case c;
  c.B = 1;
  c.T = 8;
  c.Hk = 1;
  c.Hv = 2;
  c.Dk = 8;
  c.Dv = 8;
  TestData d = make_problem(c);
  d.g.set(4 * 2 + 0, 0.0);
  d.g.set(5 * 2 + 0, -0.0);
  for (Path path : {Path::reference, Path::sequential, Path::chunkwise}) {
    const ForwardResult r = run_forward(d, path);
    for (double x : r.o) ASSERT_TRUE(std::isfinite(x)) << to_string(path);
  }
  d.g.set(3 * 2 + 1, -std::numeric_limits<double>::infinity());
  for (Path path : {Path::reference, Path::sequential, Path::chunkwise})
    EXPECT_NO_THROW(run_forward(d, path)) << to_string(path);
  // Exact decay to 0 on every path: the chunk form raises -inf to a floor whose exponentials are
  // exactly 0 (chunkwise_common.h kLogDecayFloor), so it matches the reference too.
  const ForwardResult ref = run_forward(d, Path::reference);
  for (double x : ref.o) ASSERT_TRUE(std::isfinite(x));
  for (Path path : {Path::sequential, Path::chunkwise}) {
    const ForwardResult r = run_forward(d, path);
    for (double x : r.o) ASSERT_TRUE(std::isfinite(x)) << to_string(path);
    EXPECT_LT(rel_error(r.o, ref.o), 1e-5) << to_string(path);
  }
  d.g.set(6 * 2 + 1, std::numeric_limits<double>::quiet_NaN());
  for (Path path : {Path::reference, Path::sequential, Path::chunkwise}) {
    ForwardResult r;
    ASSERT_NO_THROW(r = run_forward(d, path)) << to_string(path);
    bool nan = false;
    for (double x : r.o) nan = nan || std::isnan(x);
    EXPECT_TRUE(nan) << "NaN in g must reach o: " << to_string(path);
  }
}

// With gate_in_kernel g holds the raw `a` (any real value): not checked.
TEST(GateValues, RawGateInKernelIsNotChecked) {
  Case c;
  c.gate_in_kernel = true;
  TestData d = make_problem(c);
  d.g.set(0, 3.0);
  EXPECT_NO_THROW(validate_forward(d.forward_params()));
  EXPECT_NO_THROW(run_forward(d, Path::automatic));
}

// ---- one prefix per call ----

// ExecConfig::op_name starts every message of the call, whichever check fails (validation,
// dispatch, saved tensor); without it the direction's own name does.
TEST_F(Validation, OpNameStartsEveryMessage) {
  ExecConfig config;
  config.op_name = "gdr.chunk_gated_delta_rule";
  fp.in.v.shape[2] = 31;
  expect_invalid([&] { gdr::forward(fp, config); }, {"gdr.chunk_gated_delta_rule: v has 31 heads"});
  expect_invalid([&] { gdr::resolve_forward_path(fp, config); },
                 {"gdr.chunk_gated_delta_rule: v has 31 heads"});
  fp = d.forward_params();
  config.chunk_size = 48;
  expect_invalid([&] { gdr::forward(fp, config); },
                 {"gdr.chunk_gated_delta_rule: chunk_size is 48; supported: 16, 32, 64"});
  config.chunk_size = 64;
  config.path = Path::sequential;
  HostTensor saved = make_saved(d, 64, SavedContent::chunk_states);
  fp.saved = saved.view();
  expect_invalid([&] { gdr::forward(fp, config); },
                 {"gdr.chunk_gated_delta_rule: saved is given with path sequential"});
  bp.dout.shape[1] = 4;
  expect_invalid([&] { gdr::backward(bp, config); }, {"gdr.chunk_gated_delta_rule: dout"});
  expect_invalid([&] { gdr::backward(bp); }, {"gdr.backward: dout"});
}

TEST(SavedShape, RefusesUnsupportedChunkSizes) {
  Case c;
  TestData d = make_problem(c);
  const Problem prob = validate_forward(d.forward_params());
  expect_invalid([&] { saved_shape(prob, 48); },
                 {"gdr.saved_shape: chunk_size is 48; supported: 16, 32, 64"});
  expect_invalid([&] { saved_shape(prob, 0, SavedContent::chunk_states, "gdr.x"); },
                 {"gdr.x: chunk_size is 0"});
  EXPECT_EQ(saved_shape(prob, 16).record, c.Dk * c.Dv);
}

// The CUDA chunked backward exists in a build with the CUDA paths.
TEST(Backward, AvailableOnTheCpuAndOnCudaBuilds) {
  EXPECT_TRUE(backward_available(DeviceType::cpu));
  EXPECT_EQ(backward_available(DeviceType::cuda), cuda_available());
}

}  // namespace
}  // namespace gdr::test
