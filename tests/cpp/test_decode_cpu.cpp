// The CPU decode step against the float64 reference forward: for each sequence b with pool row
// r = state_indices[b] >= 0, decode from state row r must equal the reference forward with
// h0 = that row (o) and leave the reference's final state in row r. Skipped sequences
// (negative index) get o = 0; every pool row that no sequence uses stays untouched bit for bit.
// A bf16 pool (c.bf16_state): the reference starts from the pool's (rounded) rows and the
// pool after the step must match the reference's final state rounded to bf16 (state_tolerance).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "support.h"

namespace {

using gdr::DType;
using gdr::GateKind;
using gdr::Path;
using gdr::StateLayout;
using namespace gdr::test;

struct DecodeCase {
  std::string name;
  Case c;                          // B, T (1..16), heads, dims, options; c.h0 must be true
  std::vector<std::int64_t> rows;  // state_indices (empty: none, row b) ; -1 = skip
  std::int64_t P = 0;              // pool rows
  bool indices_i64 = false;
};

void check_decode(const DecodeCase& dc) {
  TestData d = make_problem(dc.c);
  const Case& c = d.c;
  const std::string label = dc.name + " " + describe(c, d.seed);
  const std::int64_t B = c.B, Hv = c.Hv, row_size = Hv * c.Dk * c.Dv;
  const std::int64_t P = dc.P;
  const std::vector<std::int64_t> rows = [&] {
    if (!dc.rows.empty()) return dc.rows;
    std::vector<std::int64_t> r(B);
    for (std::int64_t b = 0; b < B; ++b) r[b] = b;
    return r;
  }();

  // The pool: random rows; row rows[b] holds sequence b's h0.
  std::vector<std::int64_t> pool_shape = d.h0.shape();
  pool_shape[0] = P;
  HostTensor pool(c.bf16_state ? DType::bf16 : DType::f32, pool_shape);
  const std::int64_t es = c.bf16_state ? 2 : 4;  // bytes per pool element
  {
    Case pc;
    pc.B = P;
    pc.T = 1;
    pc.Hk = c.Hk;
    pc.Hv = c.Hv;
    pc.Dk = c.Dk;
    pc.Dv = c.Dv;
    pc.layout = c.layout;
    pc.seed = d.seed + 1;
    TestData other = make_problem(pc);
    pool.from_double(other.h0.to_double());
  }
  for (std::int64_t b = 0; b < B; ++b) {
    if (rows[b] < 0) continue;
    for (std::int64_t x = 0; x < row_size; ++x)
      pool.set(rows[b] * row_size + x, d.h0.get(b * row_size + x));
  }
  if (c.bf16_state) {  // the reference starts from the rounded rows
    for (std::int64_t b = 0; b < B; ++b) {
      if (rows[b] < 0) continue;
      for (std::int64_t x = 0; x < row_size; ++x)
        d.h0.set(b * row_size + x, pool.get(rows[b] * row_size + x));
    }
  }
  const std::vector<double> pool_before = pool.to_double();
  std::vector<unsigned char> pool_bytes(static_cast<std::size_t>(P * row_size * es));
  std::memcpy(pool_bytes.data(), pool.data(), pool_bytes.size());

  HostTensor indices;
  if (!dc.rows.empty()) {
    indices = HostTensor(dc.indices_i64 ? DType::i64 : DType::i32, {B});
    for (std::int64_t b = 0; b < B; ++b) indices.set(b, static_cast<double>(rows[b]));
  }

  const ForwardResult ref = run_forward(d, Path::reference);

  gdr::DecodeParams p;
  p.q = d.q.view();
  p.k = d.k.view();
  p.v = d.v.view();
  p.g = d.g.view();
  p.beta = d.beta.view();
  p.A_log = d.A_log.view();
  p.dt_bias = d.dt_bias.view();
  p.mask = d.mask.view();
  p.state = pool.view();
  p.state_indices = indices.view();
  d.o.poison();
  p.o = d.o.view();
  p.opts = d.options();
  gdr::decode(p);

  // Expected o: the reference's, 0 for skipped sequences; expected pool: the reference's
  // final state in each used row, the old contents elsewhere.
  std::vector<double> o_exp = ref.o, pool_exp = pool_before;
  const std::int64_t o_row = c.T * Hv * c.Dv;
  for (std::int64_t b = 0; b < B; ++b) {
    if (rows[b] < 0) {
      for (std::int64_t x = 0; x < o_row; ++x) o_exp[b * o_row + x] = 0.0;
    } else {
      for (std::int64_t x = 0; x < row_size; ++x)
        pool_exp[rows[b] * row_size + x] = ref.final_state[b * row_size + x];
    }
  }
  if (c.bf16_state) pool_exp = rounded_to_bf16(pool_exp);  // (unused rows are exact already)
  const std::vector<double> o_got = d.o.to_double(), pool_got = pool.to_double();
  EXPECT_LT(rel_error(o_got, o_exp), forward_tolerance(c)) << "o " << label;
  EXPECT_LT(rel_error(pool_got, pool_exp), state_tolerance(c)) << "state " << label;
  for (std::int64_t b = 0; b < B; ++b) {
    if (rows[b] >= 0) continue;
    for (std::int64_t x = 0; x < o_row; ++x)
      ASSERT_EQ(o_got[b * o_row + x], 0.0) << "skipped o " << label;
  }
  // Rows nobody uses: bit for bit.
  for (std::int64_t r = 0; r < P; ++r) {
    bool used = false;
    for (std::int64_t s = 0; s < B; ++s) used = used || rows[s] == r;
    if (used) continue;
    EXPECT_EQ(std::memcmp(static_cast<const unsigned char*>(pool.data()) + r * row_size * es,
                          pool_bytes.data() + r * row_size * es, row_size * es),
              0)
        << "pool row " << r << " changed " << label;
  }
}

std::vector<DecodeCase> cases() {
  std::vector<DecodeCase> out;
  for (std::int64_t T : {1, 2, 8, 16}) {
    for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
      DecodeCase dc;
      dc.c.B = 3;
      dc.c.T = T;
      dc.c.Hk = 2;
      dc.c.Hv = 4;
      dc.c.Dk = 32;
      dc.c.Dv = 16;
      dc.c.gate = gate;
      dc.c.decay = Decay::strong;
      dc.rows = {4, -1, 1};
      dc.P = 6;
      char name[32];
      std::snprintf(name, sizeof name, "T%lld_%s", static_cast<long long>(T),
                    gate == GateKind::scalar ? "scalar" : "perkey");
      dc.name = name;
      out.push_back(dc);
    }
  }
  {
    DecodeCase dc;
    dc.name = "no_indices";
    dc.c.B = 2;
    dc.c.T = 1;
    dc.c.Dk = 64;
    dc.c.Dv = 64;
    dc.P = 3;  // row 2 unused
    out.push_back(dc);
  }
  {
    DecodeCase dc;
    dc.name = "mask_i64_vfirst";
    dc.c.B = 4;
    dc.c.T = 8;
    dc.c.mask = true;
    dc.c.layout = StateLayout::v_first;
    dc.rows = {0, 3, -5, 5};
    dc.indices_i64 = true;
    dc.P = 7;
    out.push_back(dc);
  }
  {
    DecodeCase dc;
    dc.name = "fused_options_perkey";
    dc.c.B = 2;
    dc.c.T = 4;
    dc.c.Hk = 1;
    dc.c.Hv = 2;
    dc.c.gate = GateKind::per_key;
    dc.c.gate_in_kernel = true;
    dc.c.beta_sigmoid = true;
    dc.c.qk_l2norm = true;
    dc.rows = {1, 0};
    dc.P = 2;
    out.push_back(dc);
  }
  {
    DecodeCase dc;
    dc.name = "bf16_extreme";
    dc.c.B = 2;
    dc.c.T = 2;
    dc.c.dtype = DType::bf16;
    dc.c.decay = Decay::extreme;
    dc.rows = {-1, 2};
    dc.P = 4;
    out.push_back(dc);
  }
  for (bool bf16_inputs : {false, true}) {  // a bf16 pool
    DecodeCase dc;
    dc.name = bf16_inputs ? "bf16_pool_bf16_T8_perkey_vfirst" : "bf16_pool_T1";
    dc.c.B = 3;
    dc.c.T = bf16_inputs ? 8 : 1;
    dc.c.bf16_state = true;
    dc.c.dtype = bf16_inputs ? DType::bf16 : DType::f32;
    dc.c.gate = bf16_inputs ? GateKind::per_key : GateKind::scalar;
    dc.c.layout = bf16_inputs ? StateLayout::v_first : StateLayout::k_first;
    dc.c.decay = Decay::strong;
    dc.rows = {2, -1, 0};
    dc.P = 4;
    out.push_back(dc);
  }
  {
    DecodeCase dc;
    dc.name = "f64_D128";
    dc.c.B = 1;
    dc.c.T = 3;
    dc.c.Hk = 1;
    dc.c.Hv = 1;
    dc.c.Dk = 128;
    dc.c.Dv = 128;
    dc.c.dtype = DType::f64;
    dc.P = 1;
    out.push_back(dc);
  }
  return out;
}

class DecodeCpuCase : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeCpuCase, MatchesReferenceForward) {
  check_decode(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cpu, DecodeCpuCase, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& param_info) {
                           return param_info.param.name;
                         });

}  // namespace
