// The CPU fp32 sequential path (per-token loop, O(T / C) memory backward) against the float64
// reference, docs/operator.md §7 bounds: o / final state < 1e-5, gradients < 1e-4 (fp32 and f64
// inputs); 5e-3 / 1e-2 for bf16 inputs. Fresh random inputs every run (the seed is in each
// failure message); outputs poisoned with NaN before each call.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "support_gtest.h"

namespace {

using gdr::DType;
using gdr::ExecConfig;
using gdr::GateKind;
using gdr::Path;
using gdr::StateLayout;
using namespace gdr::test;

// Checks forward and backward of the sequential path against the reference for one case.
void check_case(const Case& c, int chunk) {
  TestData d = make_problem(c);
  const std::string label = describe(d.c, d.seed) + " chunk=" + std::to_string(chunk);
  ExecConfig cfg;
  cfg.chunk_size = chunk;
  expect_path_close(d, Path::sequential, cfg, run_forward(d, Path::reference),
                    run_backward(d, Path::reference), label);
}

std::vector<NamedCase> cases() {
  std::vector<NamedCase> out;
  auto add = [&](std::string name, Case c, int chunk = 64) {
    out.push_back({std::move(name), std::move(c), chunk, 0});
  };
  // T around the chunk (checkpoint) boundary, both gates, GQA 1 and 4.
  for (std::int64_t T : {1, 63, 64, 65, 200}) {
    for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
      for (std::int64_t group : {1, 4}) {
        Case c;
        c.T = T;
        c.Hk = group == 1 ? 2 : 1;
        c.Hv = c.Hk * group;
        c.Dk = 32;
        c.Dv = 24;
        c.gate = gate;
        c.decay = T == 200 ? Decay::strong : Decay::mild;
        char name[48];
        std::snprintf(name, sizeof name, "T%lld_%s_group%lld", static_cast<long long>(T),
                      gate == GateKind::scalar ? "scalar" : "perkey",
                      static_cast<long long>(group));
        add(name, c);
      }
    }
  }
  {
    Case c;
    c.T = 100;
    c.Hk = 1;
    c.Hv = 2;
    c.Dk = 64;
    c.Dv = 64;
    c.decay = Decay::extreme;
    add("extreme_decay_D64", c);
    c.gate = GateKind::per_key;
    add("extreme_decay_perkey_D64", c);
  }
  {
    Case c;
    c.T = 40;
    c.Hk = 1;
    c.Hv = 1;
    c.Dk = 128;
    c.Dv = 128;
    add("D128", c);
  }
  {
    Case c;
    c.T = 77;
    c.Dk = 48;
    c.Dv = 40;  // not powers of two
    c.B = 2;
    add("odd_dims_batch2", c, 16);
    add("odd_dims_batch2_chunk32", c, 32);
  }
  {
    Case c;
    c.T = 90;
    c.Hk = 2;
    c.Hv = 4;
    c.mask = true;
    c.gate = GateKind::per_key;
    add("mask_perkey", c, 16);
    c.gate = GateKind::scalar;
    c.B = 3;
    add("mask_scalar_batch3", c, 32);
  }
  {
    Case c;
    c.B = 1;
    c.seqlens = {17, 0, 70, 1, 40};
    c.Hk = 1;
    c.Hv = 4;
    add("varlen_zero_length", c, 16);
    c.cu_seqlens_i64 = true;
    c.gate = GateKind::per_key;
    c.mask = true;
    add("varlen_i64_perkey_mask", c, 32);
  }
  {
    Case c;
    c.T = 70;
    c.h0 = false;
    add("no_h0", c);
    c.final_state = false;
    add("no_h0_no_final_state", c, 16);
    c.h0 = true;
    add("h0_no_final_state", c, 32);
  }
  {
    Case c;
    c.T = 66;
    c.layout = StateLayout::v_first;
    c.Dk = 16;
    c.Dv = 24;
    add("v_first", c, 16);
    c.gate = GateKind::per_key;
    add("v_first_perkey", c, 32);
  }
  {
    Case c;
    c.T = 70;
    c.Hk = 1;
    c.Hv = 2;
    c.gate_in_kernel = true;
    c.beta_sigmoid = true;
    c.qk_l2norm = true;
    add("fused_all_scalar", c, 16);
    c.gate = GateKind::per_key;
    c.B = 2;
    add("fused_all_perkey", c, 32);
    Case s = c;
    s.gate_in_kernel = false;
    s.beta_sigmoid = false;
    s.scale = 0.3f;
    add("qk_l2norm_scale", s);
  }
  {
    Case c;
    c.T = 65;
    c.dtype = DType::f64;
    c.gate = GateKind::per_key;
    add("f64", c, 16);
    c.dtype = DType::bf16;
    c.gate = GateKind::scalar;
    add("bf16", c);
    c.dtype = DType::f16;
    c.gates_in_dtype = true;
    add("f16_gates_in_dtype", c, 32);
  }
  {
    Case c;
    c.T = 50;
    c.strided = true;
    c.mask = true;
    add("strided", c, 16);
  }
  {
    Case c;
    c.T = 0;
    add("empty_T0", c);
  }
  return out;
}

class SequentialCase : public ::testing::TestWithParam<NamedCase> {};

TEST_P(SequentialCase, MatchesReference) {
  check_case(GetParam().c, GetParam().chunk);
}

INSTANTIATE_TEST_SUITE_P(Cpu, SequentialCase, ::testing::ValuesIn(cases()), case_name);

// Results do not depend on the thread count: each (sequence, head) is computed by one thread.
TEST(Sequential, ThreadCountGivesIdenticalResults) {
  Case c;
  c.B = 2;
  c.T = 45;
  c.Hk = 2;
  c.Hv = 4;
  TestData d = make_problem(c);
  ExecConfig one, two;
  one.num_threads = 1;
  two.num_threads = 2;
  const ForwardResult a = run_forward(d, Path::sequential, one);
  const ForwardResult b = run_forward(d, Path::sequential, two);
  EXPECT_EQ(a.o, b.o) << describe(d.c, d.seed);
  EXPECT_EQ(a.final_state, b.final_state) << describe(d.c, d.seed);
  const BackwardResult ga = run_backward(d, Path::sequential, one);
  const BackwardResult gb = run_backward(d, Path::sequential, two);
  EXPECT_EQ(ga.dk, gb.dk) << describe(d.c, d.seed);
  EXPECT_EQ(ga.dg, gb.dg) << describe(d.c, d.seed);
}

// The backward does not depend on the checkpoint interval beyond rounding.
TEST(Sequential, ChunkSizeOnlyChangesRounding) {
  Case c;
  c.T = 130;
  c.gate = GateKind::per_key;
  TestData d = make_problem(c);
  ExecConfig c16, c64;
  c16.chunk_size = 16;
  c64.chunk_size = 64;
  const BackwardResult a = run_backward(d, Path::sequential, c16);
  const BackwardResult b = run_backward(d, Path::sequential, c64);
  for (const Field& f : fields(a, b))
    EXPECT_LT(rel_error(*f.got, *f.ref), 1e-6) << f.name << " " << describe(d.c, d.seed);
}

// A NaN in one value element (column j of the state) reaches column j of every later output of
// its head, as in the reference, and nothing crashes.
TEST(Sequential, NaNInputPropagatesLikeTheReference) {
  Case c;
  c.T = 20;
  c.Hk = 1;
  c.Hv = 2;
  TestData d = make_problem(c);
  d.v.set(5 * c.Hv * c.Dv + 3, std::numeric_limits<double>::quiet_NaN());  // t = 5, head 0
  const ForwardResult ref = run_forward(d, Path::reference);
  const ForwardResult got = run_forward(d, Path::sequential);
  EXPECT_TRUE(std::isnan(got.o[(10 * c.Hv + 0) * c.Dv + 3]));   // later token, head 0
  EXPECT_FALSE(std::isnan(got.o[(10 * c.Hv + 1) * c.Dv + 3]));  // head 1 untouched
  EXPECT_FALSE(std::isnan(got.o[(4 * c.Hv + 0) * c.Dv + 3]));   // earlier token untouched
  expect_forward_close(got, ref, forward_tolerance(d.c), describe(d.c, d.seed));
}

// beta = 0 makes every step a pure decay; beta = 1 the full delta-rule overwrite.
TEST(Sequential, BetaZeroAndOne) {
  for (double b : {0.0, 1.0}) {
    Case c;
    c.T = 70;
    c.gate = GateKind::per_key;
    TestData d = make_problem(c);
    d.beta.fill(b);
    const std::string label = describe(d.c, d.seed) + " beta=" + std::to_string(b);
    expect_path_close(d, Path::sequential, {}, run_forward(d, Path::reference),
                      run_backward(d, Path::reference), label);
  }
}

}  // namespace
