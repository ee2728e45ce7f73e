// Per-chunk algebra of the chunkwise form shared by its forward and backward; the math is in
// chunkwise_common.h.
#include "cpu/chunkwise_common.h"

#include <omp.h>

#include <cstdint>

#include "cpu/product_profile.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace gdr::cpu::chunkwise {

void advise_huge_pages(void* data, i64 bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t kHuge = std::uintptr_t(2) << 20;
  if (data == nullptr || bytes < 2 * static_cast<i64>(kHuge)) return;
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const std::uintptr_t last = (begin + static_cast<std::uintptr_t>(bytes)) & ~(kHuge - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

Plan make_plan(const Problem& prob, const Inputs& in, const ExecConfig& config) {
  Plan plan;
  const i64 group = prob.group();
  const i64 pairs = prob.N * prob.Hk;
  const int max_threads = config.num_threads > 0 ? config.num_threads : omp_get_max_threads();
  // Smallest divisor of the group that gives every thread an item.
  while (pairs * plan.splits < max_threads && plan.splits < group) {
    i64 s = plan.splits + 1;
    while (group % s != 0) ++s;
    plan.splits = s;
  }
  const i64 per = group / plan.splits;
  const i64 C = config.chunk_size;
  std::vector<SequenceSpan> spans(static_cast<std::size_t>(prob.N));
  std::vector<i64> chunk_row0(static_cast<std::size_t>(prob.N + 1), 0);
  for (i64 n = 0; n < prob.N; ++n) {
    spans[n] = sequence_span(prob, in, n);
    chunk_row0[n + 1] = chunk_row0[n] + (spans[n].len + C - 1) / C;
  }
  for (i64 n = 0; n < prob.N; ++n)
    for (i64 hk = 0; hk < prob.Hk; ++hk)
      for (i64 s = 0; s < plan.splits; ++s) {
        WorkItem it;
        it.n = n;
        it.hk = hk;
        it.split = s;
        it.hv0 = hk * group + s * per;
        it.hv1 = it.hv0 + per;
        it.seq = spans[n];
        it.chunk_row0 = chunk_row0[n];
        plan.items.push_back(it);
      }
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.seq.len > b.seq.len; });
  plan.chunk_rows = chunk_row0[prob.N];
  plan.threads = static_cast<int>(
      std::max<i64>(1, std::min<i64>(max_threads, static_cast<i64>(plan.items.size()))));
  return plan;
}

template <class Real>
Workspace<Real>::Workspace(int chunk, i64 key_dim, i64 value_dim, bool per_key, i64 heads,
                           bool backward)
    : C(chunk),
      Dk(static_cast<int>(key_dim)),
      Dv(static_cast<int>(value_dim)),
      Wg(per_key ? static_cast<int>(key_dim) : 1) {
  q.resize(C, Dk);
  k.resize(C, Dk);
  v.resize(C, Dv);
  o.resize(C, Dv);
  g.resize(C, Wg);
  beta.resize(C);
  G.resize(C, Wg);
  e.resize(C, Wg);
  d.resize(C, Wg);
  gn.resize(Wg);
  if (per_key) {
    const int blocks = (C + kPkBlock - 1) / kPkBlock;
    rf.resize(C, Dk);
    cf.resize(std::max(1, kPkBlock * blocks * (blocks - 1) / 2), Dk);
    ediag.resize(C * (kPkBlock + 1) / 2, Dk);
    ediag_k.resize(kPkBlock, Dk);
    xq.resize(C, Dk);
    xk.resize(C, Dk);
    yc.resize(C, Dk);
  } else {
    // Only lower triangles (diagonal included) of these are ever written: their upper
    // triangles stay the zeros set here.
    qk.setZero(C, C);
    kk.setZero(C, C);
    gam.setZero(C, C);
  }
  P.resize(C, C);
  KKg.resize(C, C);
  A.resize(C, C);
  Tinv.setZero(C, C);  // unit lower triangular: the upper triangle stays 0 (kept in `solved`)
  vb.resize(C, Dv);
  qw.resize(2 * C, Dk);
  kd.resize(C, Dk);
  z.resize(C, Dv);
  vnew.resize(C, Dv);
  qws.resize(2 * C, Dv);
  S.resize(static_cast<std::size_t>(heads * key_dim * value_dim));
  if (backward) {
    dout.resize(C, Dv);
    dv.resize(C, Dv);
    dbeta.resize(C);
    r2.resize(2 * C, Dv);
    x.resize(2 * C, Dk);
    dvb.resize(C, Dv);
    y.resize(C, Dk);
    // dP lower (diagonal included), dA strictly lower: the rest stays the zeros set here.
    dA.setZero(C, C);
    dP.setZero(C, C);
    dxq.resize(C, Dk);
    dxk.resize(C, Dk);
    dyk.resize(C, Dk);
    dG.resize(C, Wg);
    dgd.resize(C, Wg);
    if (per_key) pk_acc.resize(2, Dk);
    dq_acc.resize(C, Dk);
    dk_acc.resize(C, Dk);
    dS.resize(S.size());
    gate_part.resize(static_cast<std::size_t>(1 + Wg));
    gate_n.resize(1, Wg);
    t1.resize(C);
    t2.resize(C);
    cs.resize(C);
  }
}

namespace {

// out[i] = Real(a[i] - b[i]), i < len: exponent differences formed in double, rounded once
// (a plain loop the compiler vectorises; exp then runs on Real packets).
template <class Real>
inline void diff_row(const double* __restrict a, const double* __restrict b, int len,
                     Real* __restrict out) {
  for (int i = 0; i < len; ++i) out[i] = static_cast<Real>(a[i] - b[i]);
}

}  // namespace

template <class Real>
void keep_solved(const Workspace<Real>& w, int n, Real* solved) {
  const i64 C = w.C, Dv = w.Dv;
  // Each block: its first n rows, then zeros to the end of the block's [C, ...] slot.
  auto keep = [n](Real* block, i64 slot, const auto& rows) {
    const i64 used = i64(n) * rows.cols();
    MapMat<Real>(block, n, rows.cols()) = rows;
    std::fill(block + used, block + slot, Real(0));
  };
  keep(solved, C * C, w.Tinv.topLeftCorner(n, n));
  keep(solved + C * C, C * Dv, w.vnew.topRows(n));
}

template <class Real, bool PerKey>
void prepare_gates(Workspace<Real>& w, int n) {
  const int Wg = w.Wg;
  // A log decay of -inf (exact decay to 0) would make G_r - G_j = -inf - (-inf) = NaN for rows
  // after it. Below -kLogDecayFloor every factor exp(...) that contains the step is exactly 0 in
  // float and double, as exp(-inf) is, while the double cumulative sum keeps the other
  // differences exact (|G| <= 1000 + the chunk's finite gates). NaN passes through (the
  // comparison is false), so it still reaches the outputs (docs/operator.md §6).
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < Wg; ++i) {
      Real& g = w.g(r, i);
      if (g < Real(-kLogDecayFloor)) g = Real(-kLogDecayFloor);
    }
  // G = cumsum(g) in double: differences G_r - G_j stay exact to fp32 however long the decay.
  w.G.row(0) = w.g.row(0).template cast<double>();
  for (int r = 1; r < n; ++r) w.G.row(r) = w.G.row(r - 1) + w.g.row(r).template cast<double>();
  const double* G = w.G.data();  // row r at G + r * Wg
  for (int r = 0; r < n; ++r) {
    Real* e = w.e.data() + r * Wg;
    for (int i = 0; i < Wg; ++i) e[i] = static_cast<Real>(G[r * Wg + i]);
    diff_row(G + (n - 1) * Wg, G + r * Wg, Wg, w.d.data() + r * Wg);  // G_n - G_r
  }
  w.e.topRows(n) = w.e.topRows(n).array().exp();
  w.d.topRows(n) = w.d.topRows(n).array().exp();
  w.gn = w.e.row(n - 1).transpose();
  if constexpr (!PerKey) {
    // Gam[r, j] = exp(G_r - G_j), r >= j; 0 above the diagonal (the workspace's zeros).
    for (int r = 0; r < n; ++r) {
      Real* row = w.gam.data() + static_cast<std::ptrdiff_t>(r) * w.gam.cols();
      for (int j = 0; j <= r; ++j) row[j] = static_cast<Real>(G[r] - G[j]);
      w.gam.row(r).head(r + 1) = w.gam.row(r).head(r + 1).array().exp();
    }
  } else {
    // rf[r] = exp(G_r - G_r0) for r in the block [r0, r1); cf (block-major) holds
    // exp(G_r0 - G_j) for j < r0, block after block.
    const int Dk = w.Dk;
    int cf_row = 0;
    for (int r0 = 0; r0 < n; r0 += kPkBlock) {
      const int r1 = std::min(n, r0 + kPkBlock);
      for (int r = r0; r < r1; ++r) diff_row(G + r * Dk, G + r0 * Dk, Dk, w.rf.data() + r * Dk);
      auto rf = w.rf.middleRows(r0, r1 - r0);
      rf = rf.array().exp();
      if (r0 > 0) {
        for (int j = 0; j < r0; ++j)
          diff_row(G + r0 * Dk, G + j * Dk, Dk, w.cf.data() + (cf_row + j) * Dk);
        auto cf = w.cf.middleRows(cf_row, r0);
        cf = cf.array().exp();
        cf_row += r0;
      }
    }
  }
}

template <class Real, bool PerKey>
void gated_products(Workspace<Real>& w, int n, bool with_q) {
  auto P = w.P.topLeftCorner(n, n);
  auto KKg = w.KKg.topLeftCorner(n, n);
  if constexpr (!PerKey) {
    auto gam = w.gam.topLeftCorner(n, n);
    if (with_q) P = gam.cwiseProduct(w.qk.topLeftCorner(n, n));
    KKg = gam.cwiseProduct(w.kk.topLeftCorner(n, n));
  } else {
    auto Q = w.q.topRows(n);
    auto K = w.k.topRows(n);
    if (with_q) P.setZero();
    KKg.setZero();
    if (with_q) w.xq.topRows(n) = Q.cwiseProduct(w.rf.topRows(n));
    w.xk.topRows(n) = K.cwiseProduct(w.rf.topRows(n));
    int cf_row = 0, ediag_row = 0;
    for (int r0 = 0; r0 < n; r0 += kPkBlock) {
      const int m = std::min(n, r0 + kPkBlock) - r0;
      if (r0 > 0) {
        // Columns j < r0 through the reference row r0: (X .* rf)(K .* cf)^T.
        auto yc = w.yc.topRows(r0);
        yc = K.topRows(r0).cwiseProduct(w.cf.middleRows(cf_row, r0));
        cf_row += r0;
        GDR_PRODUCT(
            pk_offdiag, (with_q ? 2 : 1) * m, r0, w.Dk,
            if (with_q) P.block(r0, 0, m, r0).noalias() = w.xq.middleRows(r0, m) * yc.transpose();
            KKg.block(r0, 0, m, r0).noalias() = w.xk.middleRows(r0, m) * yc.transpose());
      }
      // Diagonal block, elementwise ratios exp(G_r - G_j), r0 <= j <= r (kept in w.ediag for
      // pairwise_backward).
      for (int r = r0; r < r0 + m; ++r) {
        const int len = r - r0 + 1;
        auto E = w.ediag.middleRows(ediag_row, len);
        for (int j = 0; j < len; ++j)
          diff_row(w.G.data() + r * w.Dk, w.G.data() + (r0 + j) * w.Dk, w.Dk,
                   w.ediag.data() + (ediag_row + j) * w.Dk);
        ediag_row += len;
        E = E.array().exp();
        auto EK = w.ediag_k.topRows(len);
        EK = E.cwiseProduct(K.middleRows(r0, len));
        GDR_PRODUCT(pk_diag_rows, with_q ? 2 : 1, len, w.Dk,
                    if (with_q) P.row(r).segment(r0, len).noalias() = Q.row(r) * EK.transpose();
                    KKg.row(r).segment(r0, len).noalias() = K.row(r) * EK.transpose());
      }
    }
  }
}

template <class Real, bool PerKey>
void solve_chunk(Workspace<Real>& w, int n, bool with_q) {
  auto beta = w.beta.head(n);
  auto A = w.A.topLeftCorner(n, n);
  A.noalias() = beta.asDiagonal() * w.KKg.topLeftCorner(n, n);
  // Tinv = (I + A)^{-1}, A strictly lower, by forward substitution row by row:
  //   Tinv[r, :r] = -A[r, :r] Tinv[:r, :r],  Tinv[r, r] = 1  (0 above: the workspace's zeros).
  auto Ti = w.Tinv.topLeftCorner(n, n);
  GDR_PRODUCT_REGION(
      tinv_rows, 2.0 * (n - 1) * n * (2 * n - 1) / 6.0,  // sum_{r < n} 2 r^2
      for (int r = 0; r < n; ++r) {
        if (r > 0)
          Ti.row(r).head(r).noalias() = Real(-1) * A.row(r).head(r) * Ti.topLeftCorner(r, r);
        Ti(r, r) = Real(1);
      });
  decayed_rows<Real, PerKey>(w, n, with_q);
  w.vb.topRows(n).noalias() = beta.asDiagonal() * w.v.topRows(n);
}

template <class Real, bool PerKey>
void decayed_rows(Workspace<Real>& w, int n, bool with_q) {
  auto K = w.k.topRows(n);
  auto beta = w.beta.head(n);
  auto kb = w.qw.middleRows(n, n);
  if constexpr (!PerKey) {
    if (with_q) w.qw.topRows(n).noalias() = w.e.col(0).head(n).asDiagonal() * w.q.topRows(n);
    kb.noalias() = (beta.cwiseProduct(w.e.col(0).head(n))).asDiagonal() * K;
    w.kd.topRows(n).noalias() = w.d.col(0).head(n).asDiagonal() * K;
  } else {
    if (with_q) w.qw.topRows(n) = w.q.topRows(n).cwiseProduct(w.e.topRows(n));
    kb.noalias() = beta.asDiagonal() * K.cwiseProduct(w.e.topRows(n));
    w.kd.topRows(n) = K.cwiseProduct(w.d.topRows(n));
  }
}

template <class Real>
void solve_vnew(Workspace<Real>& w, int n) {
  GDR_PRODUCT_REGION(
      tinv_vnew, profile::tri_flops(n, w.Dv, false),
      w.vnew.topRows(n).noalias() =
          w.Tinv.topLeftCorner(n, n).template triangularView<Eigen::UnitLower>() * w.z.topRows(n));
}

template <class Real>
void vnew_from_state(Workspace<Real>& w, int n, const MapMat<Real>& S) {
  auto z = w.z.topRows(n);
  z = w.vb.topRows(n);
  GDR_PRODUCT(kb_S, n, w.Dv, w.Dk, z.noalias() -= w.qw.middleRows(n, n) * S);
  solve_vnew(w, n);
}

template <class Real, bool PerKey>
void pairwise_backward(Workspace<Real>& w, int n) {
  auto Q = w.q.topRows(n);
  auto K = w.k.topRows(n);
  auto dMq = w.dP.topLeftCorner(n, n);
  auto dMk = w.dA.topLeftCorner(n, n);
  auto dxq = w.dxq.topRows(n);
  auto dxk = w.dxk.topRows(n);
  auto dyk = w.dyk.topRows(n);
  auto dgd = w.dgd.topRows(n);
  if constexpr (!PerKey) {
    // Gate terms: t = dMq .* P + dMk .* KKg (Gam and X Y^T already in P, KKg), r > j only.
    // Rows from the bottom: cs[j] = sum_{r' >= r} t[r', j], then dg_r += sum_{j < r} cs[j].
    auto P = w.P.topLeftCorner(n, n);
    auto KKg = w.KKg.topLeftCorner(n, n);
    auto cs = w.cs.head(n);
    cs.setZero();
    for (int r = n - 1; r >= 1; --r) {
      cs.head(r) += (dMq.row(r).head(r).cwiseProduct(P.row(r).head(r)) +
                     dMk.row(r).head(r).cwiseProduct(KKg.row(r).head(r)))
                        .transpose();
      dgd(r, 0) += cs.head(r).sum();
    }
    // N = dM .* Gam:  dX = N Y,  dY = N^T X.
    auto gam = w.gam.topLeftCorner(n, n);
    dMq = dMq.cwiseProduct(gam);
    dMk = dMk.cwiseProduct(gam);
    // dMq lower (diagonal included), dMk strictly lower. Both of K K^T's terms reach dK (as
    // dxk + dyk), so they are one dense product with the symmetric Nk = dMk + dMk^T (in w.A,
    // free once Tinv is formed): one [n, n] x [n, Dk] product where two triangular ones cost
    // about as much each (Eigen forms a 64-row triangle as a dense block).
    auto Nk = w.A.topLeftCorner(n, n);
    Nk = dMk + dMk.transpose();
    GDR_PRODUCT_REGION(pair_bwd, 2 * profile::tri_flops(n, w.Dk, true) + 2.0 * n * n * w.Dk,
                       dxq.noalias() = dMq.template triangularView<Eigen::Lower>() * K;
                       dyk.noalias() = dMq.transpose().template triangularView<Eigen::Upper>() * Q;
                       dxk.noalias() = Nk * K);
  } else {
    // Per channel i, t_i[r, j] = (dMq[r, j] Q[r, i] + dMk[r, j] K[r, i]) K[j, i] exp(G_r[i] -
    // G_j[i]). Off-diagonal blocks (r in [r0, r1), j < r0, ratio rf_r .* cf_j): a pair reaches
    // dg_t for j < t <= r, so the block adds
    //   t <= r0:      sum_{j < t} colb_j,          colb_j = K_j .* cf_j .* (dM^T (X .* rf))_j
    //   r0 < t < r1:  sum_{r >= t} rowb_r,         rowb_r = (X .* rf)_r .* (dM (K .* cf))_r
    // Diagonal blocks: per row r a running sum over j of t[r, j], added to dg_{j+1} (j < r).
    auto acc = w.pk_acc.row(0);
    auto z = w.pk_acc.row(1);
    dxq.setZero();
    dxk.setZero();
    dyk.setZero();
    int cf_row = 0;
    for (int r0 = 0; r0 < n; r0 += kPkBlock) {
      const int m = std::min(n, r0 + kPkBlock) - r0;
      if (r0 == 0) continue;
      auto cf = w.cf.middleRows(cf_row, r0);
      cf_row += r0;
      auto yc = w.yc.topRows(r0);
      yc = K.topRows(r0).cwiseProduct(cf);
      GDR_PRODUCT(pk_offdiag, 2 * m, w.Dk, r0,
                  dxq.middleRows(r0, m).noalias() = dMq.block(r0, 0, m, r0) * yc;
                  dxk.middleRows(r0, m).noalias() = dMk.block(r0, 0, m, r0) * yc);
      acc.setZero();
      for (int r = r0 + m - 1; r > r0; --r) {
        acc += w.xq.row(r).cwiseProduct(dxq.row(r)) + w.xk.row(r).cwiseProduct(dxk.row(r));
        dgd.row(r) += acc;
      }
      // dY[j] += cf_j .* (sum_r dM[r, j] X_r .* rf_r), r in the block.
      GDR_PRODUCT(pk_offdiag, 2 * r0, w.Dk, m,
                  yc.noalias() = dMq.block(r0, 0, m, r0).transpose() * w.xq.middleRows(r0, m);
                  yc.noalias() += dMk.block(r0, 0, m, r0).transpose() * w.xk.middleRows(r0, m));
      yc = yc.cwiseProduct(cf);
      dyk.topRows(r0) += yc;
      acc.setZero();
      for (int j = 0; j < r0; ++j) {
        acc += K.row(j).cwiseProduct(yc.row(j));
        dgd.row(j + 1) += acc;
      }
    }
    dxq = dxq.cwiseProduct(w.rf.topRows(n));
    dxk = dxk.cwiseProduct(w.rf.topRows(n));
    int ediag_row = 0;
    for (int r0 = 0; r0 < n; r0 += kPkBlock) {
      const int m = std::min(n, r0 + kPkBlock) - r0;
      for (int r = r0; r < r0 + m; ++r) {
        const int len = r - r0 + 1;
        auto E = w.ediag.middleRows(ediag_row, len);  // exp(G_r - G_j), from gated_products
        ediag_row += len;
        // dX_r += sum_j dM[r, j] E_j .* K_j;  dY_j += E_j .* (dMq[r, j] Q_r + dMk[r, j] K_r).
        auto EK = w.ediag_k.topRows(len);
        EK = E.cwiseProduct(K.middleRows(r0, len));
        GDR_PRODUCT(pk_diag_rows, 2, w.Dk, len,
                    dxq.row(r).noalias() += dMq.row(r).segment(r0, len) * EK;
                    dxk.row(r).noalias() += dMk.row(r).segment(r0, len) * EK);
        acc.setZero();
        for (int j = 0; j < len; ++j) {
          z = E.row(j).cwiseProduct(dMq(r, r0 + j) * Q.row(r) + dMk(r, r0 + j) * K.row(r));
          dyk.row(r0 + j) += z;
          if (j + 1 < len) {  // t[r, j] = z .* K_j reaches dg_t for j < t <= r
            acc += z.cwiseProduct(K.row(r0 + j));
            dgd.row(r0 + j + 1) += acc;
          }
        }
      }
    }
  }
}

template <class Real, bool PerKey>
void decay_state(const Workspace<Real>& w, MapMat<Real>& S) {
  if constexpr (!PerKey) {
    S *= w.gn(0);
  } else {
    S = w.gn.asDiagonal() * S;
  }
}

template struct Workspace<float>;
template struct Workspace<double>;
template void keep_solved<float>(const Workspace<float>&, int, float*);
template void keep_solved<double>(const Workspace<double>&, int, double*);
template void solve_vnew<float>(Workspace<float>&, int);
template void solve_vnew<double>(Workspace<double>&, int);
template void vnew_from_state<float>(Workspace<float>&, int, const MapMat<float>&);
template void vnew_from_state<double>(Workspace<double>&, int, const MapMat<double>&);

#define GDR_CHUNKWISE_INSTANTIATE(Real, PerKey)                            \
  template void prepare_gates<Real, PerKey>(Workspace<Real>&, int);        \
  template void gated_products<Real, PerKey>(Workspace<Real>&, int, bool); \
  template void solve_chunk<Real, PerKey>(Workspace<Real>&, int, bool);    \
  template void decayed_rows<Real, PerKey>(Workspace<Real>&, int, bool);   \
  template void pairwise_backward<Real, PerKey>(Workspace<Real>&, int);    \
  template void decay_state<Real, PerKey>(const Workspace<Real>&, MapMat<Real>&);
GDR_CHUNKWISE_INSTANTIATE(float, false)
GDR_CHUNKWISE_INSTANTIATE(float, true)
GDR_CHUNKWISE_INSTANTIATE(double, false)
GDR_CHUNKWISE_INSTANTIATE(double, true)
#undef GDR_CHUNKWISE_INSTANTIATE

}  // namespace gdr::cpu::chunkwise
