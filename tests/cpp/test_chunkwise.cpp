// The CPU chunkwise path (docs/operator.md §3-4) against the float64 reference, docs/operator.md §7
// bounds: o / final state < 1e-5, gradients < 1e-4 (fp32 and f64 inputs); 5e-3 / 1e-2 for
// bf16 / f16 inputs (the reference reads the same rounded inputs). Fresh random inputs every
// run (the seed is in each failure message); outputs poisoned with NaN before each call; o,
// the final state and every gradient (dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias) checked.
// Every case runs three times: the backward recomputing the chunk states itself, and the
// training step of the torch layer, a forward that fills the saved-for-backward tensor (poisoned
// with NaN first) and a backward that reads it, with the chunk states alone (docs/operator.md §3,
// the backward recomputes Tinv and Vnew from them) and with the chunk intermediates.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
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

void check_case(const Case& c, int chunk, int threads) {
  TestData d = make_problem(c);
  const std::string label = describe(d.c, d.seed) + " chunk=" + std::to_string(chunk) +
                            " threads=" + std::to_string(threads);
  ExecConfig cfg;
  cfg.chunk_size = chunk;
  cfg.num_threads = threads;
  const ForwardResult ref = run_forward(d, Path::reference);
  const BackwardResult gref = run_backward(d, Path::reference);
  expect_path_close(d, Path::chunkwise, cfg, ref, gref, label);
  // Forward saves, backward reuses.
  for (gdr::SavedContent content : kSavedContents) {
    HostTensor saved = make_saved(d, chunk, content);
    expect_path_close(d, Path::chunkwise, cfg, ref, gref, label + " " + saved_name(content),
                      saved.view());
  }
}

const char* gate_name(GateKind g) {
  return g == GateKind::scalar ? "scalar" : "perkey";
}

std::vector<NamedCase> cases() {
  std::vector<NamedCase> out;
  auto add = [&](std::string name, Case c, int chunk = 64, int threads = 0) {
    out.push_back({std::move(name), std::move(c), chunk, threads});
  };
  // T around the chunk boundary, both gates, Hv / Hk = 1 and 4, D = 64.
  for (std::int64_t T : {1, 63, 64, 65, 200}) {
    for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
      for (std::int64_t group : {1, 4}) {
        Case c;
        c.T = T;
        c.Hk = group == 1 ? 2 : 1;
        c.Hv = c.Hk * group;
        c.Dk = 64;
        c.Dv = 64;
        c.gate = gate;
        c.decay = T == 200 ? Decay::strong : Decay::mild;
        add(std::string("T") + std::to_string(T) + "_" + gate_name(gate) + "_group" +
                std::to_string(group),
            c);
      }
    }
  }
  // Long sequences at the hot head size.
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c;
    c.T = 1000;
    c.Hk = 1;
    c.Hv = 2;
    c.Dk = 128;
    c.Dv = 128;
    c.gate = gate;
    c.decay = Decay::strong;
    add(std::string("T1000_D128_") + gate_name(gate), c);
  }
  // Decay regimes and chunk sizes.
  for (Decay decay : {Decay::mild, Decay::strong, Decay::extreme}) {
    for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
      for (int chunk : {16, 32, 64}) {
        Case c;
        c.T = 150;
        c.Hk = 1;
        c.Hv = 2;
        c.Dk = 32;
        c.Dv = 32;
        c.gate = gate;
        c.decay = decay;
        add(std::string(to_string(decay)) + "_" + gate_name(gate) + "_chunk" +
                std::to_string(chunk),
            c, chunk);
      }
    }
  }
  // Head dims: 128 x 64 and non powers of two.
  {
    Case c;
    c.T = 90;
    c.Hk = 1;
    c.Hv = 1;
    c.Dk = 128;
    c.Dv = 64;
    add("Dk128_Dv64", c);
    c.Dk = 96;
    c.Dv = 48;
    c.B = 2;
    add("Dk96_Dv48_batch2", c, 32);
    c.gate = GateKind::per_key;
    add("Dk96_Dv48_perkey", c, 16);
    c.Dk = 48;
    c.Dv = 96;
    c.gate = GateKind::scalar;
    add("Dk48_Dv96", c);
  }
  // Masks (in-chunk identity steps).
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c;
    c.T = 130;
    c.B = 2;
    c.Hk = 2;
    c.Hv = 4;
    c.Dk = 32;
    c.Dv = 16;
    c.mask = true;
    c.gate = gate;
    add(std::string("mask_") + gate_name(gate), c, 32);
  }
  // Varlen with a zero-length sequence.
  {
    Case c;
    c.seqlens = {17, 0, 70, 1, 130};
    c.Hk = 1;
    c.Hv = 4;
    c.Dk = 32;
    c.Dv = 32;
    add("varlen_zero_length", c, 16);
    c.cu_seqlens_i64 = true;
    c.gate = GateKind::per_key;
    c.mask = true;
    add("varlen_i64_perkey_mask", c, 32);
    c.h0 = false;
    c.gate = GateKind::scalar;
    add("varlen_no_h0", c, 64);
  }
  // Initial and final state given or not.
  {
    Case c;
    c.T = 100;
    c.Dk = 32;
    c.Dv = 32;
    c.h0 = false;
    add("no_h0", c);
    c.final_state = false;
    add("no_h0_no_final_state", c, 16);
    c.h0 = true;
    c.gate = GateKind::per_key;
    add("h0_no_final_state_perkey", c, 32);
  }
  // v-first state layout.
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c;
    c.T = 80;
    c.Dk = 32;
    c.Dv = 48;
    c.layout = StateLayout::v_first;
    c.gate = gate;
    add(std::string("v_first_") + gate_name(gate), c, 32);
  }
  // Fused options.
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c;
    c.T = 100;
    c.B = 2;
    c.Hk = 1;
    c.Hv = 2;
    c.Dk = 32;
    c.Dv = 32;
    c.gate = gate;
    c.gate_in_kernel = true;
    c.beta_sigmoid = true;
    c.qk_l2norm = true;
    add(std::string("fused_all_") + gate_name(gate), c, 32);
  }
  {
    Case c;
    c.T = 70;
    c.Dk = 32;
    c.Dv = 32;
    c.qk_l2norm = true;
    c.scale = 0.3f;
    add("qk_l2norm_explicit_scale", c);
  }
  // GQA group split over items (more threads than key heads), gradient partial sums.
  {
    Case c;
    c.T = 140;
    c.Hk = 1;
    c.Hv = 4;
    c.Dk = 32;
    c.Dv = 32;
    add("group_split_threads4", c, 32, 4);
    c.gate = GateKind::per_key;
    c.gate_in_kernel = true;
    c.qk_l2norm = true;
    add("group_split_perkey_fused", c, 32, 3);
  }
  // Dtypes, strides, empty.
  {
    Case c;
    c.T = 100;
    c.Dk = 32;
    c.Dv = 32;
    c.dtype = DType::f64;
    c.gate = GateKind::per_key;
    add("f64_perkey", c, 16);
    c.gate = GateKind::scalar;
    add("f64_scalar", c, 32);
    c.dtype = DType::bf16;
    add("bf16", c);
    c.dtype = DType::f16;
    c.gates_in_dtype = true;
    c.gate = GateKind::per_key;
    add("f16_gates_in_dtype_perkey", c, 32);
  }
  {
    Case c;
    c.T = 75;
    c.strided = true;
    c.mask = true;
    add("strided_mask", c, 16);
  }
  {
    Case c;
    c.T = 0;
    add("empty_T0", c);
  }
  return out;
}

class ChunkwiseCase : public ::testing::TestWithParam<NamedCase> {};

TEST_P(ChunkwiseCase, MatchesReference) {
  check_case(GetParam().c, GetParam().chunk, GetParam().threads);
}

INSTANTIATE_TEST_SUITE_P(Cpu, ChunkwiseCase, ::testing::ValuesIn(cases()), case_name);

// beta = 0 makes every step a pure decay; beta = 1 the full delta-rule overwrite.
TEST(Chunkwise, BetaZeroAndOne) {
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    for (double b : {0.0, 1.0}) {
      Case c;
      c.T = 100;
      c.Dk = 32;
      c.Dv = 32;
      c.gate = gate;
      TestData d = make_problem(c);
      d.beta.fill(b);
      const std::string label = describe(d.c, d.seed) + " beta=" + std::to_string(b);
      ExecConfig cfg;
      cfg.chunk_size = 32;
      expect_path_close(d, Path::chunkwise, cfg, run_forward(d, Path::reference),
                        run_backward(d, Path::reference), label);
    }
  }
}

// A NaN in one value element (column j of head 0's state) reaches column j of head 0 from its
// token on, as in the reference; earlier chunks and the other head stay finite and correct.
// (Inside the chunk that holds the NaN, earlier tokens of column j may also turn NaN: the chunk
// products multiply the NaN by the zeros above the diagonal.)
TEST(Chunkwise, NaNInputPropagates) {
  Case c;
  c.T = 60;
  c.Hk = 1;
  c.Hv = 2;
  c.Dk = 16;
  c.Dv = 16;
  TestData d = make_problem(c);
  const std::int64_t t_nan = 37, col = 3;  // chunk [32, 48) with C = 16
  d.v.set((t_nan * c.Hv + 0) * c.Dv + col, std::numeric_limits<double>::quiet_NaN());
  ExecConfig cfg;
  cfg.chunk_size = 16;
  const ForwardResult ref = run_forward(d, Path::reference);
  const ForwardResult got = run_forward(d, Path::chunkwise, cfg);
  const std::string label = describe(d.c, d.seed);
  auto at = [&](std::int64_t t, std::int64_t h, std::int64_t j) {
    return (t * c.Hv + h) * c.Dv + j;
  };
  std::vector<double> got_clean, ref_clean;
  for (std::int64_t t = 0; t < c.T; ++t)
    for (std::int64_t h = 0; h < c.Hv; ++h)
      for (std::int64_t j = 0; j < c.Dv; ++j) {
        const double x = got.o[at(t, h, j)];
        if (h == 0 && j == col && t >= t_nan) {
          EXPECT_TRUE(std::isnan(x)) << label << " t=" << t;
        } else if (h == 1 || j != col || t < 32) {
          got_clean.push_back(x);
          ref_clean.push_back(ref.o[at(t, h, j)]);
        }
      }
  EXPECT_LT(rel_error(got_clean, ref_clean), 1e-5) << label;
  const BackwardResult g = run_backward(d, Path::chunkwise, cfg);
  bool any_nan = false;
  for (double x : g.dq) any_nan |= std::isnan(x);
  EXPECT_TRUE(any_nan) << label;
}

// Identical results for identical calls; the thread count only changes rounding (GQA split).
TEST(Chunkwise, DeterministicAndThreadCountOnlyChangesRounding) {
  Case c;
  c.B = 2;
  c.T = 90;
  c.Hk = 2;
  c.Hv = 4;
  c.Dk = 32;
  c.Dv = 32;
  c.gate = GateKind::per_key;
  TestData d = make_problem(c);
  ExecConfig one, two, many;
  one.num_threads = 1;
  two.num_threads = 2;
  many.num_threads = 8;
  const BackwardResult a = run_backward(d, Path::chunkwise, two);
  const BackwardResult b = run_backward(d, Path::chunkwise, two);
  EXPECT_EQ(a.dk, b.dk) << describe(d.c, d.seed);
  EXPECT_EQ(a.dg, b.dg) << describe(d.c, d.seed);
  for (const ExecConfig& cfg : {one, many}) {
    const BackwardResult x = run_backward(d, Path::chunkwise, cfg);
    for (const Field& f : fields(x, a))
      EXPECT_LT(rel_error(*f.got, *f.ref), 1e-6) << f.name << " " << describe(d.c, d.seed);
  }
}

// Extreme decay everywhere (g = -30 at every position, and g = -30 U(0,1)): the true dg is
// ~1e-13 per element, so any O(1) terms that cancel only in exact arithmetic (the diagonal of
// the pairwise gate terms, the d_r terms added at r and again at the chunk end) would dominate
// it after the reverse cumsum. Every gradient against the float64 oracle at the docs/operator.md §7
// bound.
TEST(Chunkwise, ExtremeDecayEverywhereGateGradient) {
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    for (bool uniform : {false, true}) {
      for (int chunk : {64, 16}) {
        Case c;
        c.T = 200;
        c.Hk = 1;
        c.Hv = 1;
        c.Dk = 64;
        c.Dv = 64;
        c.gate = gate;
        TestData d = make_problem(c);
        std::mt19937_64 rng(d.seed + 1);
        std::uniform_real_distribution<double> unit(0.0, 1.0);
        for (std::int64_t i = 0; i < d.g.numel(); ++i)
          d.g.set(i, uniform ? -30.0 * unit(rng) : -30.0);
        const std::string label = describe(d.c, d.seed) + " chunk=" + std::to_string(chunk) +
                                  (uniform ? " g=-30U(0,1)" : " g=-30");
        ExecConfig cfg;
        cfg.chunk_size = chunk;
        expect_path_close(d, Path::chunkwise, cfg, reference_forward(d), reference_backward(d),
                          label);
      }
    }
  }
}

}  // namespace

namespace {

using gdr::BackwardParams;
using gdr::ForwardParams;

// The saved-for-backward tensor (ForwardParams::saved / BackwardParams::saved) beyond the case
// list above.

// The backward reads the saved records rather than recomputing them: records poisoned between
// forward and backward reach every gradient that depends on them, and the forward's records
// give the reference's gradients.
TEST(ChunkwiseSaved, BackwardReadsTheRecords) {
  Case c;
  c.T = 100;
  c.Hk = 1;
  c.Hv = 2;
  c.Dk = 32;
  c.Dv = 32;
  TestData d = make_problem(c);
  ExecConfig cfg;
  cfg.chunk_size = 32;
  const BackwardResult gref = reference_backward(d);
  for (gdr::SavedContent content : kSavedContents) {
    const std::string label = describe(d.c, d.seed) + " " + saved_name(content);
    HostTensor saved = make_saved(d, cfg.chunk_size, content);
    run_forward(d, Path::chunkwise, cfg, saved.view());
    expect_backward_close(run_backward(d, Path::chunkwise, cfg, saved.view()), gref,
                          backward_tolerance(d.c), label);
    saved.poison();
    const BackwardResult bad = run_backward(d, Path::chunkwise, cfg, saved.view());
    for (const Field& f : fields(bad, gref)) {
      if (f.got->empty()) continue;
      // dV and dh0 do not depend on the states (dVnew and the dS recurrence read only dO, dS,
      // P, W and Tinv), so poisoned chunk states leave them finite.
      if (content == gdr::SavedContent::chunk_states &&
          (std::string(f.name) == "dv" || std::string(f.name) == "dh0"))
        continue;
      bool any_nan = false;
      for (double x : *f.got) any_nan |= std::isnan(x);
      EXPECT_TRUE(any_nan) << f.name << " " << label;
    }
  }
}

// Varlen: chunk_rows is an upper bound from shapes only; the forward writes every element (zeros
// past the last sequence's chunks and after the n rows of a short chunk) and the results match
// the reference. Forward and backward run with different thread counts, so their plans split
// the GQA group differently.
TEST(ChunkwiseSaved, VarlenRowsAndThreadCounts) {
  Case c;
  c.seqlens = {17, 0, 70, 1, 130};  // chunks of 16: 2 + 0 + 5 + 1 + 9 = 17 rows used
  c.Hk = 1;
  c.Hv = 4;
  c.Dk = 32;
  c.Dv = 16;
  c.mask = true;
  c.gate = GateKind::per_key;
  TestData d = make_problem(c);
  ExecConfig fwd_cfg, bwd_cfg;
  fwd_cfg.chunk_size = bwd_cfg.chunk_size = 16;
  fwd_cfg.num_threads = 1;
  bwd_cfg.num_threads = 4;
  const ForwardResult ref = reference_forward(d);
  const BackwardResult gref = reference_backward(d);
  for (gdr::SavedContent content : kSavedContents) {
    const std::string label = describe(d.c, d.seed) + " " + saved_name(content);
    HostTensor saved = make_saved(d, 16, content);
    ASSERT_EQ(saved.shape()[0], (218 + 5 * 15) / 16);  // floor((T + N (C - 1)) / C) = 18
    expect_forward_close(run_forward(d, Path::chunkwise, fwd_cfg, saved.view()), ref,
                         forward_tolerance(d.c), label);
    const std::int64_t per_row = saved.numel() / saved.shape()[0];
    std::int64_t unwritten = 0, nonzero_past_end = 0;
    for (std::int64_t i = 0; i < saved.numel(); ++i) {
      unwritten += std::isnan(saved.get(i));
      if (i >= 17 * per_row) nonzero_past_end += saved.get(i) != 0.0;
    }
    EXPECT_EQ(unwritten, 0) << label;
    EXPECT_EQ(nonzero_past_end, 0) << label;
    expect_backward_close(run_backward(d, Path::chunkwise, bwd_cfg, saved.view()), gref,
                          backward_tolerance(d.c), label);
  }
}

// With `saved`, automatic resolves to chunkwise in both directions (without it, a 16-token call
// takes the per-token loop forward).
TEST(ChunkwiseSaved, AutomaticResolvesToChunkwise) {
  Case c;
  c.T = 16;
  c.Dk = 16;
  c.Dv = 16;
  TestData d = make_problem(c);
  HostTensor saved = make_saved(d, 64, gdr::SavedContent::chunk_states);
  ForwardParams fp = d.forward_params();
  BackwardParams bp = d.backward_params();
  EXPECT_EQ(gdr::resolve_forward_path(fp), Path::sequential);
  fp.saved = bp.saved = saved.view();
  EXPECT_EQ(gdr::resolve_forward_path(fp), Path::chunkwise);
  EXPECT_EQ(gdr::resolve_backward_path(bp), Path::chunkwise);
  const std::string label = describe(d.c, d.seed);
  expect_path_close(d, Path::automatic, {}, reference_forward(d), reference_backward(d), label,
                    saved.view());
}

// A saved tensor with padded rows (strides [Hv (record + 5), record + 5, 1], NaN in the padding)
// works like a contiguous one.
TEST(ChunkwiseSaved, StridedTensor) {
  Case c;
  c.T = 70;
  c.Hk = 1;
  c.Hv = 2;
  c.Dk = 16;
  c.Dv = 16;
  c.gate = GateKind::per_key;
  TestData d = make_problem(c);
  const ForwardResult ref = reference_forward(d);
  const BackwardResult gref = reference_backward(d);
  for (gdr::SavedContent content : kSavedContents) {
    const gdr::SavedShape shape =
        gdr::saved_shape(gdr::validate_forward(d.forward_params()), 32, content);
    HostTensor saved(shape.dtype, {shape.chunk_rows, shape.Hv, shape.record}, 5);
    saved.poison();
    ExecConfig cfg;
    cfg.chunk_size = 32;
    const std::string label = describe(d.c, d.seed) + " " + saved_name(content);
    expect_path_close(d, Path::chunkwise, cfg, ref, gref, label, saved.view());
  }
}

// Extreme decay everywhere (see ExtremeDecayEverywhereGateGradient) through the saved records.
TEST(ChunkwiseSaved, ExtremeDecayEverywhere) {
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c;
    c.T = 200;
    c.Hk = 1;
    c.Hv = 1;
    c.Dk = 64;
    c.Dv = 64;
    c.gate = gate;
    TestData d = make_problem(c);
    d.g.fill(-30.0);
    const ForwardResult ref = reference_forward(d);
    const BackwardResult gref = reference_backward(d);
    for (gdr::SavedContent content : kSavedContents) {
      const std::string label = describe(d.c, d.seed) + " g=-30 " + saved_name(content);
      HostTensor saved = make_saved(d, 64, content);
      expect_path_close(d, Path::chunkwise, {}, ref, gref, label, saved.view());
    }
  }
}

}  // namespace
