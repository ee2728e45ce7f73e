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

#include "support_gtest.h"

namespace {

using gdr::DType;
using gdr::GateKind;
using gdr::Path;
using gdr::StateLayout;
using namespace gdr::test;

struct DecodeCase {
  std::string name;
  Case c;                          // B, T (1..16), heads, dims, options
  std::vector<std::int64_t> rows;  // state_indices (empty: none, row b) ; -1 = skip
  std::int64_t P = 0;              // pool rows
  bool indices_i64 = false;
};

void check_decode(const DecodeCase& dc) {
  Case c = dc.c;
  c.cu_seqlens_i64 = dc.indices_i64;  // make_decode_problem's dtype for the indices
  DecodeData d = make_decode_problem(c, dc.P, !dc.rows.empty());
  for (std::size_t b = 0; b < dc.rows.size(); ++b)
    d.state_indices.set(static_cast<std::int64_t>(b), static_cast<double>(dc.rows[b]));
  const std::string label = dc.name + " " + describe(d.base.c, d.base.seed);
  const std::int64_t B = c.B, row_size = c.Hv * c.Dk * c.Dv, o_row = c.T * c.Hv * c.Dv;
  const std::int64_t row_bytes = row_size * dtype_size(d.state.dtype());
  std::vector<std::int64_t> rows(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b)
    rows[b] = dc.rows.empty() ? b : dc.rows[static_cast<std::size_t>(b)];
  const auto* pool = static_cast<const unsigned char*>(d.state.data());
  const std::vector<unsigned char> pool_before(pool, pool + d.P * row_bytes);

  // The reference: o (0 for skipped sequences) and the pool with the used rows stepped.
  const ForwardResult ref = decode_reference(d);
  const ForwardResult got = run_decode(d);
  expect_forward_close(got, ref, forward_tolerance(c), state_tolerance(c), label);
  for (std::int64_t b = 0; b < B; ++b) {
    if (rows[b] >= 0) continue;
    for (std::int64_t x = 0; x < o_row; ++x)
      ASSERT_EQ(got.o[b * o_row + x], 0.0) << "skipped o " << label;
  }
  // Rows nobody uses: bit for bit.
  for (std::int64_t r = 0; r < d.P; ++r) {
    bool used = false;
    for (std::int64_t s = 0; s < B; ++s) used = used || rows[s] == r;
    if (used) continue;
    EXPECT_EQ(std::memcmp(pool + r * row_bytes, pool_before.data() + r * row_bytes, row_bytes), 0)
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
