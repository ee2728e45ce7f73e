// The float64 reference (Path::reference) against central finite differences of itself and
// against the properties of the recurrence (docs/operator.md §1-2, 4, 6).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gdr/gdr.h"
#include "support_gtest.h"

namespace gdr::test {
namespace {

// ---- finite differences ----

double forward_loss(TestData& d) {
  return loss(d, run_forward(d, Path::reference));
}

// Central differences of the loss w.r.t. up to `max_elems` entries of x (all when fewer),
// compared with the analytic gradient by relative Frobenius error over those entries.
// `nonpositive` (x is g, which gdr refuses above 0): an entry within one step of 0 takes the
// second-order backward difference (3 f(x) - 4 f(x - h) + f(x - 2h)) / 2h instead, so that no
// evaluation leaves the domain.
double fd_error(TestData& d, HostTensor& x, const std::vector<double>& grad, std::mt19937_64& rng,
                bool nonpositive = false, std::int64_t max_elems = 160) {
  const std::int64_t n = x.numel();
  std::vector<std::int64_t> idx;
  if (n <= max_elems) {
    for (std::int64_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    std::uniform_int_distribution<std::int64_t> pick(0, n - 1);
    for (std::int64_t i = 0; i < max_elems; ++i) idx.push_back(pick(rng));
  }
  std::vector<double> fd, an;
  for (std::int64_t i : idx) {
    const double x0 = x.get(i);
    const double h = 1e-5 * std::max(1.0, std::abs(x0));
    if (nonpositive && x0 + h > 0) {
      const double l0 = forward_loss(d);
      x.set(i, x0 - h);
      const double l1 = forward_loss(d);
      x.set(i, x0 - 2 * h);
      const double l2 = forward_loss(d);
      x.set(i, x0);
      fd.push_back((3 * l0 - 4 * l1 + l2) / (2 * h));
      an.push_back(grad[static_cast<std::size_t>(i)]);
      continue;
    }
    x.set(i, x0 + h);
    const double lp = forward_loss(d);
    x.set(i, x0 - h);
    const double lm = forward_loss(d);
    x.set(i, x0);
    fd.push_back((lp - lm) / (2 * h));
    an.push_back(grad[static_cast<std::size_t>(i)]);
  }
  return rel_error(an, fd);
}

void check_gradients(const Case& c) {
  TestData d = make_problem(c);
  const std::string label = describe(d.c, d.seed);
  const BackwardResult g = run_backward(d, Path::reference);
  std::mt19937_64 rng(d.seed);
  const double tol = 1e-6;
  EXPECT_LT(fd_error(d, d.q, g.dq, rng), tol) << "dq " << label;
  EXPECT_LT(fd_error(d, d.k, g.dk, rng), tol) << "dk " << label;
  EXPECT_LT(fd_error(d, d.v, g.dv, rng), tol) << "dv " << label;
  EXPECT_LT(fd_error(d, d.g, g.dg, rng, !c.gate_in_kernel), tol) << "dg " << label;
  EXPECT_LT(fd_error(d, d.beta, g.dbeta, rng), tol) << "dbeta " << label;
  if (c.h0) {
    EXPECT_LT(fd_error(d, d.h0, g.dh0, rng), tol) << "dh0 " << label;
  }
  if (c.gate_in_kernel) {
    EXPECT_LT(fd_error(d, d.A_log, g.dA_log, rng), tol) << "dA_log " << label;
    EXPECT_LT(fd_error(d, d.dt_bias, g.ddt_bias, rng), tol) << "ddt_bias " << label;
  }
  // Gradients are finite and non-trivial (a zero gradient would pass FD only if FD is 0 too).
  double norm = 0;
  for (double x : g.dq) norm += x * x;
  EXPECT_GT(norm, 0.0) << label;
}

Case small(GateKind gate) {
  Case c;
  c.B = 2;
  c.T = 7;
  c.Hk = 1;
  c.Hv = 2;
  c.Dk = 4;
  c.Dv = 5;
  c.gate = gate;
  c.dtype = DType::f64;
  return c;
}

TEST(ReferenceGrad, ScalarGate) {
  check_gradients(small(GateKind::scalar));
}

TEST(ReferenceGrad, ScalarGateStrongDecay) {
  Case c = small(GateKind::scalar);
  c.decay = Decay::strong;
  check_gradients(c);
}

TEST(ReferenceGrad, PerKeyGate) {
  check_gradients(small(GateKind::per_key));
}

TEST(ReferenceGrad, NoInitialStateNoFinalState) {
  Case c = small(GateKind::scalar);
  c.h0 = false;
  c.final_state = false;
  check_gradients(c);
}

TEST(ReferenceGrad, FusedOptionsScalarGate) {
  Case c = small(GateKind::scalar);
  c.gate_in_kernel = true;
  c.beta_sigmoid = true;
  c.qk_l2norm = true;
  check_gradients(c);
}

TEST(ReferenceGrad, FusedOptionsPerKeyVFirstMask) {
  Case c = small(GateKind::per_key);
  c.gate_in_kernel = true;
  c.beta_sigmoid = true;
  c.qk_l2norm = true;
  c.layout = StateLayout::v_first;
  c.mask = true;
  c.decay = Decay::strong;
  check_gradients(c);
}

TEST(ReferenceGrad, VarlenWithEmptySequenceAndMask) {
  Case c = small(GateKind::scalar);
  c.B = 1;
  c.seqlens = {3, 0, 5};
  c.mask = true;
  c.Hk = 2;
  c.Hv = 4;
  check_gradients(c);
}

TEST(ReferenceGrad, StridedExplicitScale) {
  Case c = small(GateKind::per_key);
  c.strided = true;
  c.scale = 0.7f;
  check_gradients(c);
}

TEST(ReferenceGrad, LongerThanOneSegment) {
  // 150 tokens: the backward recomputes across three 64-token segments.
  Case c;
  c.B = 1;
  c.T = 150;
  c.Hk = 1;
  c.Hv = 1;
  c.Dk = 3;
  c.Dv = 3;
  c.dtype = DType::f64;
  c.gate = GateKind::per_key;
  check_gradients(c);
}

// ---- properties of the recurrence ----

TEST(Reference, BetaZeroOnlyDecaysState) {
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c = small(gate);
    TestData d = make_problem(c);
    d.beta.fill(0.0);
    const ForwardResult r = run_forward(d, Path::reference);
    // S_T[n, h, i, j] = exp(sum_t g_t[n, h, (i)]) h0[n, h, i, j]
    std::vector<double> expect(r.final_state.size());
    for (std::int64_t n = 0; n < c.B; ++n)
      for (std::int64_t h = 0; h < c.Hv; ++h)
        for (std::int64_t i = 0; i < c.Dk; ++i) {
          double G = 0;
          for (std::int64_t t = 0; t < c.T; ++t)
            G += gate == GateKind::scalar ? d.g.get((n * c.T + t) * c.Hv + h)
                                          : d.g.get(((n * c.T + t) * c.Hv + h) * c.Dk + i);
          for (std::int64_t j = 0; j < c.Dv; ++j) {
            const std::int64_t e = ((n * c.Hv + h) * c.Dk + i) * c.Dv + j;
            expect[e] = std::exp(G) * d.h0.get(e);
          }
        }
    EXPECT_LT(rel_error(r.final_state, expect), 1e-13) << describe(d.c, d.seed);
  }
}

TEST(Reference, UnitBetaOrthonormalKeysWriteValues) {
  // g = 0, beta = 1, keys e_1..e_Dk (orthonormal): after the Dk tokens, S^T k_j = v_j.
  Case c;
  c.B = 1;
  c.T = 6;
  c.Hk = 1;
  c.Hv = 1;
  c.Dk = 6;
  c.Dv = 5;
  c.dtype = DType::f64;
  TestData d = make_problem(c);
  d.g.fill(0.0);
  d.beta.fill(1.0);
  // A rotated orthonormal basis: Householder reflection of the identity.
  std::vector<double> w(c.Dk);
  double ww = 0;
  for (std::int64_t i = 0; i < c.Dk; ++i) ww += (w[i] = d.q.get(i)) * w[i];
  for (std::int64_t t = 0; t < c.T; ++t)
    for (std::int64_t i = 0; i < c.Dk; ++i)
      d.k.set(t * c.Dk + i, (t == i ? 1.0 : 0.0) - 2.0 * w[t] * w[i] / ww);
  const ForwardResult r = run_forward(d, Path::reference);
  std::vector<double> got, want;
  for (std::int64_t t = 0; t < c.T; ++t)
    for (std::int64_t j = 0; j < c.Dv; ++j) {
      double s = 0;
      for (std::int64_t i = 0; i < c.Dk; ++i)
        s += r.final_state[i * c.Dv + j] * d.k.get(t * c.Dk + i);
      got.push_back(s);
      want.push_back(d.v.get(t * c.Dv + j));
    }
  EXPECT_LT(rel_error(got, want), 1e-13) << describe(d.c, d.seed);
}

TEST(Reference, TwoCallsWithCarriedStateEqualOneCall) {
  Case c = small(GateKind::per_key);
  c.B = 1;
  c.T = 20;
  c.mask = true;
  TestData d = make_problem(c);
  const ForwardResult whole = run_forward(d, Path::reference);
  TestData a = slice_tokens(d, 0, 9);
  TestData b = slice_tokens(d, 9, 20);
  const ForwardResult ra = run_forward(a, Path::reference);
  b.h0.from_double(ra.final_state);
  const ForwardResult rb = run_forward(b, Path::reference);
  std::vector<double> o = ra.o;
  o.insert(o.end(), rb.o.begin(), rb.o.end());
  EXPECT_LT(rel_error(o, whole.o), 1e-14) << describe(d.c, d.seed);
  EXPECT_LT(rel_error(rb.final_state, whole.final_state), 1e-14) << describe(d.c, d.seed);
}

TEST(Reference, VarlenEqualsSeparateCalls) {
  Case c = small(GateKind::scalar);
  c.B = 1;
  c.seqlens = {4, 0, 7, 1};
  c.mask = true;
  c.gate_in_kernel = true;
  TestData d = make_problem(c);
  const std::string label = describe(d.c, d.seed);
  const ForwardResult whole = run_forward(d, Path::reference);
  const BackwardResult gwhole = run_backward(d, Path::reference);
  const std::int64_t row = c.Hv * c.Dk * c.Dv;
  std::int64_t t0 = 0;
  std::vector<double> dA(c.Hv, 0.0);
  for (std::int64_t n = 0; n < static_cast<std::int64_t>(c.seqlens.size()); ++n) {
    TestData s = extract_sequence(d, n);
    const ForwardResult r = run_forward(s, Path::reference);
    const BackwardResult g = run_backward(s, Path::reference);
    const std::int64_t L = c.seqlens[n];
    const std::int64_t orow = c.Hv * c.Dv, krow = c.Hk * c.Dk;
    EXPECT_EQ(std::vector<double>(whole.o.begin() + t0 * orow, whole.o.begin() + (t0 + L) * orow),
              r.o)
        << "sequence " << n << " " << label;
    EXPECT_EQ(std::vector<double>(whole.final_state.begin() + n * row,
                                  whole.final_state.begin() + (n + 1) * row),
              r.final_state)
        << "sequence " << n << " " << label;
    EXPECT_EQ(
        std::vector<double>(gwhole.dq.begin() + t0 * krow, gwhole.dq.begin() + (t0 + L) * krow),
        g.dq)
        << "sequence " << n << " " << label;
    EXPECT_EQ(std::vector<double>(gwhole.dh0.begin() + n * row, gwhole.dh0.begin() + (n + 1) * row),
              g.dh0)
        << "sequence " << n << " " << label;
    if (L == 0) {  // a zero-length sequence passes its state through
      EXPECT_EQ(r.final_state, s.h0.to_double()) << label;
      EXPECT_EQ(g.dh0, s.dfinal_state.to_double()) << label;
    }
    for (std::int64_t h = 0; h < c.Hv; ++h) dA[h] += g.dA_log[h];
    t0 += L;
  }
  EXPECT_LT(rel_error(gwhole.dA_log, dA), 1e-13) << label;
}

TEST(Reference, BatchEqualsSeparateCalls) {
  Case c = small(GateKind::per_key);
  c.B = 3;
  TestData d = make_problem(c);
  const ForwardResult whole = run_forward(d, Path::reference);
  const std::int64_t orow = c.T * c.Hv * c.Dv;
  for (std::int64_t n = 0; n < c.B; ++n) {
    TestData s = extract_sequence(d, n);
    const ForwardResult r = run_forward(s, Path::reference);
    EXPECT_EQ(std::vector<double>(whole.o.begin() + n * orow, whole.o.begin() + (n + 1) * orow),
              r.o);
  }
}

TEST(Reference, GqaEqualsRepeatedKeyHeads) {
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c = small(gate);
    c.Hk = 2;
    c.Hv = 6;  // group 3
    c.qk_l2norm = true;
    TestData d = make_problem(c);
    Case cr = c;
    cr.Hk = c.Hv;
    TestData r = make_problem(cr);
    const std::int64_t G = c.Hv / c.Hk, rows = c.B * c.T;
    for (std::int64_t p = 0; p < rows; ++p)
      for (std::int64_t h = 0; h < c.Hv; ++h)
        for (std::int64_t i = 0; i < c.Dk; ++i) {
          r.q.set((p * c.Hv + h) * c.Dk + i, d.q.get((p * c.Hk + h / G) * c.Dk + i));
          r.k.set((p * c.Hv + h) * c.Dk + i, d.k.get((p * c.Hk + h / G) * c.Dk + i));
        }
    for (auto [from, to] : {std::pair{&d.v, &r.v},
                            {&d.g, &r.g},
                            {&d.beta, &r.beta},
                            {&d.h0, &r.h0},
                            {&d.dout, &r.dout},
                            {&d.dfinal_state, &r.dfinal_state}})
      to->from_double(from->to_double());
    const std::string label = describe(d.c, d.seed);
    const ForwardResult a = run_forward(d, Path::reference), b = run_forward(r, Path::reference);
    EXPECT_LT(rel_error(a.o, b.o), 1e-14) << label;
    EXPECT_LT(rel_error(a.final_state, b.final_state), 1e-14) << label;
    const BackwardResult ga = run_backward(d, Path::reference);
    const BackwardResult gb = run_backward(r, Path::reference);
    std::vector<double> dq(ga.dq.size(), 0.0), dk(ga.dk.size(), 0.0);
    for (std::int64_t p = 0; p < rows; ++p)
      for (std::int64_t h = 0; h < c.Hv; ++h)
        for (std::int64_t i = 0; i < c.Dk; ++i) {
          dq[(p * c.Hk + h / G) * c.Dk + i] += gb.dq[(p * c.Hv + h) * c.Dk + i];
          dk[(p * c.Hk + h / G) * c.Dk + i] += gb.dk[(p * c.Hv + h) * c.Dk + i];
        }
    EXPECT_LT(rel_error(ga.dq, dq), 1e-13) << label;
    EXPECT_LT(rel_error(ga.dk, dk), 1e-13) << label;
    EXPECT_LT(rel_error(ga.dv, gb.dv), 1e-13) << label;
    EXPECT_LT(rel_error(ga.dg, gb.dg), 1e-13) << label;
    EXPECT_LT(rel_error(ga.dh0, gb.dh0), 1e-13) << label;
  }
}

// [N, H, A, B] -> [N, H, B, A]
std::vector<double> transpose_state(const std::vector<double>& s, std::int64_t NH, std::int64_t A,
                                    std::int64_t B) {
  std::vector<double> t(s.size());
  for (std::int64_t m = 0; m < NH; ++m)
    for (std::int64_t i = 0; i < A; ++i)
      for (std::int64_t j = 0; j < B; ++j) t[(m * B + j) * A + i] = s[(m * A + i) * B + j];
  return t;
}

TEST(Reference, VFirstEqualsTransposedKFirst) {
  Case c = small(GateKind::per_key);
  TestData d = make_problem(c);
  Case cv = c;
  cv.layout = StateLayout::v_first;
  TestData e = make_problem(cv);
  const std::int64_t NH = c.B * c.Hv;
  for (auto [from, to] : {std::pair{&d.q, &e.q},
                          {&d.k, &e.k},
                          {&d.v, &e.v},
                          {&d.g, &e.g},
                          {&d.beta, &e.beta},
                          {&d.dout, &e.dout}})
    to->from_double(from->to_double());
  e.h0.from_double(transpose_state(d.h0.to_double(), NH, c.Dk, c.Dv));
  e.dfinal_state.from_double(transpose_state(d.dfinal_state.to_double(), NH, c.Dk, c.Dv));
  const std::string label = describe(d.c, d.seed);
  const ForwardResult a = run_forward(d, Path::reference), b = run_forward(e, Path::reference);
  EXPECT_EQ(a.o, b.o) << label;
  EXPECT_EQ(transpose_state(a.final_state, NH, c.Dk, c.Dv), b.final_state) << label;
  const BackwardResult ga = run_backward(d, Path::reference);
  const BackwardResult gb = run_backward(e, Path::reference);
  EXPECT_EQ(ga.dq, gb.dq) << label;
  EXPECT_EQ(ga.dg, gb.dg) << label;
  EXPECT_EQ(transpose_state(ga.dh0, NH, c.Dk, c.Dv), gb.dh0) << label;
}

TEST(Reference, MaskedPositionsLeaveStateAndWriteZeros) {
  Case c = small(GateKind::scalar);
  c.B = 1;
  c.T = 16;
  c.mask = true;
  TestData d = make_problem(c);
  d.mask.set(2, 0.0);  // at least one masked position
  // NaN at masked positions must not leak.
  std::vector<std::int64_t> live;
  for (std::int64_t t = 0; t < c.T; ++t) {
    if (d.mask.get(t) != 0.0) {
      live.push_back(t);
      continue;
    }
    for (std::int64_t i = 0; i < c.Hk * c.Dk; ++i) d.k.set(t * c.Hk * c.Dk + i, NAN);
    for (std::int64_t i = 0; i < c.Hv * c.Dv; ++i) d.v.set(t * c.Hv * c.Dv + i, NAN);
    for (std::int64_t i = 0; i < c.Hv; ++i) d.g.set(t * c.Hv + i, NAN);
  }
  const ForwardResult r = run_forward(d, Path::reference);
  // Same result as the sequence of live tokens only.
  Case cl = c;
  cl.T = static_cast<std::int64_t>(live.size());
  cl.mask = false;
  TestData l = make_problem(cl);
  for (std::size_t s = 0; s < live.size(); ++s) {
    TestData one = slice_tokens(d, live[s], live[s] + 1);
    for (auto [from, to] : {std::pair{&one.q, &l.q}, {&one.k, &l.k}, {&one.v, &l.v}})
      for (std::int64_t i = 0; i < from->numel(); ++i)
        to->set(static_cast<std::int64_t>(s) * from->numel() + i, from->get(i));
    for (auto [from, to] : {std::pair{&one.g, &l.g}, {&one.beta, &l.beta}})
      for (std::int64_t i = 0; i < from->numel(); ++i)
        to->set(static_cast<std::int64_t>(s) * from->numel() + i, from->get(i));
  }
  l.h0.from_double(d.h0.to_double());
  const ForwardResult rl = run_forward(l, Path::reference);
  EXPECT_LT(rel_error(r.final_state, rl.final_state), 1e-14) << describe(d.c, d.seed);
  const std::int64_t orow = c.Hv * c.Dv;
  std::size_t s = 0;
  for (std::int64_t t = 0; t < c.T; ++t) {
    const bool on = d.mask.get(t) != 0.0;
    for (std::int64_t j = 0; j < orow; ++j) {
      if (on) {
        EXPECT_EQ(r.o[t * orow + j], rl.o[s * orow + j]) << "t=" << t;
      } else {
        EXPECT_EQ(r.o[t * orow + j], 0.0) << "t=" << t;
      }
    }
    if (on) ++s;
  }
  // Gradients at masked positions are 0, and finite elsewhere.
  const BackwardResult g = run_backward(d, Path::reference);
  for (std::int64_t t = 0; t < c.T; ++t) {
    const bool on = d.mask.get(t) != 0.0;
    for (std::int64_t i = 0; i < c.Hk * c.Dk; ++i) {
      const double x = g.dk[t * c.Hk * c.Dk + i];
      if (on) {
        EXPECT_TRUE(std::isfinite(x));
      } else {
        EXPECT_EQ(x, 0.0);
      }
    }
    for (std::int64_t h = 0; h < c.Hv; ++h) {
      if (!on) {
        EXPECT_EQ(g.dg[t * c.Hv + h], 0.0);
      }
    }
  }
}

TEST(Reference, EmptyInputsReturnUnchangedState) {
  for (bool varlen : {false, true}) {
    Case c = small(GateKind::per_key);
    if (varlen) {
      c.B = 1;
      c.seqlens = {0, 0};
    } else {
      c.T = 0;
    }
    c.gate_in_kernel = true;
    TestData d = make_problem(c);
    const ForwardResult r = run_forward(d, Path::reference);
    EXPECT_TRUE(r.o.empty());
    EXPECT_EQ(r.final_state, d.h0.to_double());
    const BackwardResult g = run_backward(d, Path::reference);
    EXPECT_TRUE(g.dq.empty());
    EXPECT_EQ(g.dh0, d.dfinal_state.to_double());
    for (double x : g.dA_log) EXPECT_EQ(x, 0.0);
  }
  // N = 0: cu_seqlens = [0], T = 0, no sequences at all.
  Case c = small(GateKind::scalar);
  c.B = 1;
  c.T = 0;
  c.h0 = false;
  TestData d = make_problem(c);
  d.cu_seqlens = HostTensor(DType::i32, {1});
  d.cu_seqlens.fill(0);
  d.final_state = HostTensor(DType::f64, {0, c.Hv, c.Dk, c.Dv});
  d.dfinal_state = HostTensor(DType::f64, {0, c.Hv, c.Dk, c.Dv});
  const ForwardResult r = run_forward(d, Path::reference);
  EXPECT_TRUE(r.o.empty());
  EXPECT_TRUE(r.final_state.empty());
  EXPECT_NO_THROW(run_backward(d, Path::reference));
}

TEST(Reference, NanInputPropagatesWithoutCrash) {
  Case c = small(GateKind::scalar);
  c.B = 1;
  c.Hk = 1;
  c.Hv = 1;
  TestData d = make_problem(c);
  d.k.set(3 * c.Dk, std::numeric_limits<double>::quiet_NaN());  // token 3, one channel
  const ForwardResult r = run_forward(d, Path::reference);
  for (std::int64_t j = 0; j < c.Dv; ++j) {
    EXPECT_FALSE(std::isnan(r.o[2 * c.Dv + j]));  // before the NaN: clean
    EXPECT_TRUE(std::isnan(r.o[3 * c.Dv + j]));   // from it on: NaN
  }
  bool any_nan = false;
  for (double x : r.final_state) any_nan |= std::isnan(x);
  EXPECT_TRUE(any_nan);
  BackwardResult g;
  EXPECT_NO_THROW(g = run_backward(d, Path::reference));
  any_nan = false;
  for (double x : g.dq) any_nan |= std::isnan(x);
  EXPECT_TRUE(any_nan);
}

TEST(Reference, HalfPrecisionInputsAccepted) {
  for (DType dt : {DType::f16, DType::bf16}) {
    for (bool gates_in_dtype : {false, true}) {
      Case c = small(GateKind::scalar);
      c.dtype = dt;
      c.gates_in_dtype = gates_in_dtype;
      c.gate_in_kernel = gates_in_dtype;
      TestData d = make_problem(c);
      // The same (rounded) values in float64.
      Case c64 = c;
      c64.dtype = DType::f64;
      TestData e = make_problem(c64);
      for (auto [from, to] : {std::pair{&d.q, &e.q},
                              {&d.k, &e.k},
                              {&d.v, &e.v},
                              {&d.g, &e.g},
                              {&d.beta, &e.beta},
                              {&d.h0, &e.h0},
                              {&d.A_log, &e.A_log},
                              {&d.dt_bias, &e.dt_bias},
                              {&d.dout, &e.dout},
                              {&d.dfinal_state, &e.dfinal_state}})
        if (from->defined()) to->from_double(from->to_double());
      const std::string label = describe(d.c, d.seed);
      const ForwardResult a = run_forward(d, Path::reference), b = run_forward(e, Path::reference);
      EXPECT_LT(rel_error(a.o, b.o), 1e-2) << label;                      // o rounded to dt
      EXPECT_LT(rel_error(a.final_state, b.final_state), 1e-6) << label;  // f32 state
      const BackwardResult ga = run_backward(d, Path::reference);
      const BackwardResult gb = run_backward(e, Path::reference);
      EXPECT_LT(rel_error(ga.dq, gb.dq), 2e-2) << label;
      EXPECT_LT(rel_error(ga.dg, gb.dg), 2e-2) << label;
      EXPECT_LT(rel_error(ga.dh0, gb.dh0), 1e-6) << label;
    }
  }
}

// The canonical buffers in float (the fp32 paths' working precision) match double.
TEST(Reference, Float32InputsMatchFloat64) {
  Case c = small(GateKind::per_key);
  c.dtype = DType::f32;
  c.qk_l2norm = true;
  c.beta_sigmoid = true;
  TestData d = make_problem(c);
  Case c64 = c;
  c64.dtype = DType::f64;
  TestData e = make_problem(c64);
  for (auto [from, to] : {std::pair{&d.q, &e.q},
                          {&d.k, &e.k},
                          {&d.v, &e.v},
                          {&d.g, &e.g},
                          {&d.beta, &e.beta},
                          {&d.h0, &e.h0},
                          {&d.dout, &e.dout},
                          {&d.dfinal_state, &e.dfinal_state}})
    to->from_double(from->to_double());
  const ForwardResult a = run_forward(d, Path::reference), b = run_forward(e, Path::reference);
  EXPECT_LT(rel_error(a.o, b.o), 1e-6);
  EXPECT_LT(rel_error(a.final_state, b.final_state), 1e-6);
}

}  // namespace
}  // namespace gdr::test
