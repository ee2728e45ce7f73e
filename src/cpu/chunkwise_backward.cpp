// Chunkwise backward (docs/operator.md §4). Per work item (sequence, key head, value heads):
//   1. state pass: the forward recurrence over the chunks, keeping the state entering every
//      chunk ([R, ceil(L / C), Dk, Dv] fp32) and the chunk's Tinv and Vnew = Tinv (beta .* V -
//      Kb S) ([R, ceil(L / C), C^2 + C Dv]): the only O(T) memory, 1.75 states per chunk at
//      C = 64, Dk = Dv = 128;
//   2. reverse pass carrying dS (dfinal_state or 0 at the end), per chunk and value head:
//        recompute the gates, P and KKg (elementwise from Q K^T, K K^T); Tinv, Vnew from the
//        state pass; Kb = beta e .* K
//        dVnew = scale P^T dO + (d .* K) dS,      Y = Vnew dS^T
//        dVb = Tinv^T dVnew                        (the gradient of z = beta .* V - Kb S)
//        r2 = [scale dO ; -dVb],  [X1 ; dKb] = r2 S^T,  dS <- gn .* dS + [e .* Q ; Kb]^T r2
//        dA = -dVb Vnew^T .* strict_lower,  dP = scale (dO Vnew^T) .* lower  (= r2 Vnew^T)
//          (Vnew = Tinv z, dTinv = dVnew z^T, dA = -Tinv^T dTinv Tinv^T = -dVb (Tinv z)^T)
//        dV = beta .* dVb,  dbeta = rowsum(dVb .* V + dKb .* e .* K + dA .* KKg)
//        dQ += e .* X1,     dK += beta e .* dKb + d .* Y
//        dG += e .* (X1 .* Q + beta .* dKb .* K),  dG_n += gn .* rowsum(S .* dS)
//        dg = reverse cumsum of dG within the chunk, plus terms added to dg_t directly:
//          sum_{r < t} d_r .* Y_r .* K_r  (docs/operator.md §4's -d_r x_r at r and +sum_r d_r x_r
//          at n, after the cumsum) and the pairwise terms of P (upstream dP) and KKg (upstream
//          diag(beta) dA) as sum_{r >= t} sum_{j < t} t[r, j] (chunkwise_common.h): no O(1) terms
//          that cancel only in exact arithmetic, so dg keeps its relative accuracy under extreme
//          decay
//      (row dots over Dk for scalar gates, elementwise products for per-key gates).
//   With BackwardParams::saved (filled by the chunkwise forward) step 1 is skipped and no
//   per-item buffers are allocated: every chunk's entering state S is read from there, and its
//   Tinv and Vnew too (chunk intermediates) or, with chunk states alone (docs/operator.md §3's
//   training forward), recomputed in the reverse pass from S: solve_chunk and Vnew = Tinv
//   (beta .* V - Kb S) (no state recurrence: the chunks are independent given their states).
//   dh0 is the dS that leaves the first chunk. dQ, dK are summed over the value heads sharing
//   the key head; when a group is split over several items their partial sums are added after.
#include <omp.h>

#include <exception>
#include <memory>

#include "cpu/canonical.h"
#include "cpu/chunkwise_common.h"
#include "cpu/paths.h"
#include "cpu/product_profile.h"
#include "gdr/error.h"

namespace gdr::cpu {
namespace {

using chunkwise::i64;
using chunkwise::MapMat;
using chunkwise::SavedRecords;
using chunkwise::WorkItem;
using chunkwise::Workspace;

// Where an item's outputs that need a reduction go.
template <class Real>
struct Sinks {
  Real* key_partial = nullptr;  // [L, 2, Dk] dq_hat, dk_hat of this item (split groups only)
  double* dA_log = nullptr;     // [Hv] this sequence's dA_log contributions (gate in kernel)
  double* ddt_bias = nullptr;   // [Hv, Wg]
};

template <class Real, bool PerKey>
void state_pass(const Problem& prob, const BackwardParams& p, int C, const WorkItem& it,
                Workspace<Real>& w) {
  const i64 Dk = prob.Dk, Dv = prob.Dv, L = it.seq.len, heads = it.hv1 - it.hv0;
  const i64 chunks = (L + C - 1) / C;
  for (i64 r = 0; r < heads; ++r)
    load_state<Real>(prob, p.in.h0, p.opts, it.n, it.hv0 + r, w.S.data() + r * Dk * Dv);
  for (i64 c = 0; c < chunks; ++c) {
    const i64 c0 = c * C;
    const int n = static_cast<int>(std::min<i64>(C, L - c0));
    const SequenceSpan span{it.seq.b, it.seq.t0 + c0, n};
    load_keys<Real>(prob, p.in, p.opts, span, it.hk, nullptr, w.k.data());
    if constexpr (!PerKey)
      GDR_PRODUCT_REGION(st_kk, profile::tri_flops(n, Dk, true),
                         w.kk.topLeftCorner(n, n).template triangularView<Eigen::Lower>() =
                             w.k.topRows(n) * w.k.topRows(n).transpose());
    for (i64 r = 0; r < heads; ++r) {
      const i64 hv = it.hv0 + r;
      MapMat<Real> S(w.S.data() + r * Dk * Dv, Dk, Dv);
      MapMat<Real>(w.states.data() + (r * chunks + c) * Dk * Dv, Dk, Dv) = S;
      load_values<Real>(prob, p.in, span, hv, w.v.data());
      load_gates<Real>(prob, p.in, p.opts, span, hv, w.g.data(), w.beta.data());
      chunkwise::prepare_gates<Real, PerKey>(w, n);
      chunkwise::gated_products<Real, PerKey>(w, n, false);
      chunkwise::solve_chunk<Real, PerKey>(w, n, false);
      chunkwise::vnew_from_state(w, n, S);
      auto vnew = w.vnew.topRows(n);
      // Keep Tinv and Vnew for the reverse pass.
      chunkwise::keep_solved(w, n, w.solved.data() + (r * chunks + c) * w.solved_stride());
      chunkwise::decay_state<Real, PerKey>(w, S);
      GDR_PRODUCT(st_S_update, Dk, Dv, n, S.noalias() += w.kd.topRows(n).transpose() * vnew);
    }
  }
}

// One chunk, one value head: dS (leaving the chunk) becomes dS entering it; adds to
// w.dq_acc / w.dk_acc; leaves dV in w.dv, dg_log in w.g, dbeta in w.dbeta. `solved`: the
// chunk's Tinv and Vnew (Workspace::solved_stride's layout) kept by the state pass or saved by
// the forward; nullptr: recomputed here from S, the state entering the chunk.
template <class Real, bool PerKey>
void chunk_backward(Workspace<Real>& w, int n, Real scale, const MapMat<Real>& S, MapMat<Real>& dS,
                    const Real* solved) {
  const i64 C = w.C;
  [[maybe_unused]] const int Dk = w.Dk, Dv = w.Dv;  // product shapes (GDR_PRODUCT)
  chunkwise::prepare_gates<Real, PerKey>(w, n);
  chunkwise::gated_products<Real, PerKey>(w, n, true);
  // Tinv (row stride tinv_ld) and Vnew; qw = [e .* Q ; Kb] for the [2n, Dk] products below.
  const Real *tinv, *vnew_rows;
  i64 tinv_ld;
  if (solved) {
    chunkwise::decayed_rows<Real, PerKey>(w, n, true);
    tinv = solved;
    tinv_ld = n;
    vnew_rows = solved + C * C;
  } else {
    chunkwise::solve_chunk<Real, PerKey>(w, n, true);  // Tinv, qw = [e .* Q ; Kb], vb, kd
    chunkwise::vnew_from_state(w, n, S);
    tinv = w.Tinv.data();
    tinv_ld = C;
    vnew_rows = w.vnew.data();
  }
  using CMap = Eigen::Map<const chunkwise::Mat<Real>, 0, Eigen::OuterStride<>>;
  const CMap Tinv(tinv, n, n, Eigen::OuterStride<>(tinv_ld));
  const CMap vnew(vnew_rows, n, Dv, Eigen::OuterStride<>(Dv));
  auto Q = w.q.topRows(n);
  auto K = w.k.topRows(n);
  auto V = w.v.topRows(n);
  auto beta = w.beta.head(n);
  auto P = w.P.topLeftCorner(n, n);

  // dVnew = scale P^T dO + (d .* K) dS (in w.dvb until it becomes dVb);  Y = Vnew dS^T.
  auto dvb = w.dvb.topRows(n);
  auto r2 = w.r2.topRows(2 * n);
  r2.topRows(n) = scale * w.dout.topRows(n);
  GDR_PRODUCT(bwd_kd_dS, n, Dv, Dk, dvb.noalias() = w.kd.topRows(n) * dS);
  GDR_PRODUCT_REGION(
      bwd_Pt_dO, profile::tri_flops(n, Dv, true),
      dvb.noalias() += P.transpose().template triangularView<Eigen::Upper>() * r2.topRows(n));
  auto y = w.y.topRows(n);
  GDR_PRODUCT(bwd_vnew_dSt, n, Dk, Dv, y.noalias() = vnew * dS.transpose());
  // exp(G_n) <S, dS> (per channel for per-key gates), before dS moves on.
  auto gate_n = w.gate_n.row(0);
  if constexpr (!PerKey) {
    gate_n(0) = w.gn(0) * S.cwiseProduct(dS).sum();
  } else {
    gate_n = (w.gn.array() * S.cwiseProduct(dS).rowwise().sum().array()).transpose();
  }
  // dVb = Tinv^T dVnew;  r2 = [scale dO ; -dVb].
  GDR_PRODUCT_REGION(bwd_Tinvt, profile::tri_flops(n, Dv, false),
                     r2.bottomRows(n).noalias() =
                         Tinv.transpose().template triangularView<Eigen::UnitUpper>() * dvb);
  dvb = r2.bottomRows(n);
  r2.bottomRows(n) = -dvb;
  // [X1 ; dKb] = r2 S^T  (dKb = -dVb S^T, the gradient of Kb through z = beta .* V - Kb S).
  auto x = w.x.topRows(2 * n);
  GDR_PRODUCT(bwd_r2_St, 2 * n, Dk, Dv, x.noalias() = r2 * S.transpose());
  chunkwise::decay_state<Real, PerKey>(w, dS);
  GDR_PRODUCT(bwd_dS_update, Dk, Dv, 2 * n, dS.noalias() += w.qw.topRows(2 * n).transpose() * r2);
  auto x1 = x.topRows(n);
  auto dkb = x.bottomRows(n);

  // [dP ; dA] = r2 Vnew^T on their lower triangles (above them the workspace's zeros); dA is
  // strictly lower.
  auto dA = w.dA.topLeftCorner(n, n);
  auto dP = w.dP.topLeftCorner(n, n);
  GDR_PRODUCT_REGION(
      bwd_dA_dP, 2 * profile::tri_flops(n, Dv, true),
      dA.template triangularView<Eigen::Lower>() = r2.bottomRows(n) * vnew.transpose();
      dP.template triangularView<Eigen::Lower>() = r2.topRows(n) * vnew.transpose());
  dA.diagonal().setZero();

  w.dv.topRows(n).noalias() = beta.asDiagonal() * dvb;
  auto dbeta = w.dbeta.head(n);
  dbeta = dvb.cwiseProduct(V).rowwise().sum() +
          dA.cwiseProduct(w.KKg.topLeftCorner(n, n)).rowwise().sum();
  auto dG = w.dG.topRows(n);
  auto dgd = w.dgd.topRows(n);
  auto dq = w.dq_acc.topRows(n);
  auto dk = w.dk_acc.topRows(n);
  if constexpr (!PerKey) {
    auto e = w.e.col(0).head(n);
    auto d = w.d.col(0).head(n);
    auto dkb_k = w.t1.head(n);
    auto y_k = w.t2.head(n);
    dkb_k = dkb.cwiseProduct(K).rowwise().sum();
    y_k = y.cwiseProduct(K).rowwise().sum();
    dbeta += e.cwiseProduct(dkb_k);
    dG.col(0) = e.cwiseProduct(x1.cwiseProduct(Q).rowwise().sum() + beta.cwiseProduct(dkb_k));
    dG(n - 1, 0) += gate_n(0);
    // dgd_t = sum_{r < t} d_r y_k_r.
    Real acc = 0;
    for (int t = 0; t < n; ++t) {
      dgd(t, 0) = acc;
      acc += d(t) * y_k(t);
    }
    dq.noalias() += e.asDiagonal() * x1;
    dk.noalias() += beta.cwiseProduct(e).asDiagonal() * dkb;
    dk.noalias() += d.asDiagonal() * y;
  } else {
    auto e = w.e.topRows(n);
    auto d = w.d.topRows(n);
    // Scratch (w.yc, w.dxk are free until pairwise_backward).
    auto edk = w.yc.topRows(n);  // e .* dKb
    auto dy = w.dxk.topRows(n);  // d .* Y
    edk = e.cwiseProduct(dkb);
    dy = d.cwiseProduct(y);
    dbeta += edk.cwiseProduct(K).rowwise().sum();
    dG = e.cwiseProduct(x1.cwiseProduct(Q)) + beta.asDiagonal() * edk.cwiseProduct(K);
    dG.row(n - 1) += gate_n;
    // dgd_t = sum_{r < t} d_r .* Y_r .* K_r.
    dgd.row(0).setZero();
    for (int t = 1; t < n; ++t)
      dgd.row(t) = dgd.row(t - 1) + dy.row(t - 1).cwiseProduct(K.row(t - 1));
    dq += e.cwiseProduct(x1);
    dk.noalias() += beta.asDiagonal() * edk;
    dk += dy;
  }
  // Pairwise terms: upstream dP for P, diag(beta) dA for KKg.
  dA = beta.asDiagonal() * dA;
  chunkwise::pairwise_backward<Real, PerKey>(w, n);
  dq += w.dxq.topRows(n);
  dk += w.dxk.topRows(n) + w.dyk.topRows(n);
  // dg = reverse cumsum of dG + dgd.
  auto dg = w.g.topRows(n);
  for (int i = 0; i < w.Wg; ++i) {
    double acc = 0.0;
    for (int r = n - 1; r >= 0; --r) {
      acc += static_cast<double>(dG(r, i));
      dg(r, i) = static_cast<Real>(acc + static_cast<double>(dgd(r, i)));
    }
  }
}

template <class Real, bool PerKey>
void backward_item(const Problem& prob, const BackwardParams& p, int C, const WorkItem& it,
                   Workspace<Real>& w, const Sinks<Real>& sinks, const SavedRecords<Real>& saved) {
  const i64 Dk = prob.Dk, Dv = prob.Dv, L = it.seq.len, heads = it.hv1 - it.hv0;
  const i64 chunks = (L + C - 1) / C;
  if (!saved.defined()) {
    const std::size_t need = static_cast<std::size_t>(heads * chunks * Dk * Dv);
    if (w.states.size() < need) w.states.resize(need);
    const std::size_t need_solved = static_cast<std::size_t>(heads * chunks * w.solved_stride());
    if (w.solved.size() < need_solved) w.solved.resize(need_solved);
    state_pass<Real, PerKey>(prob, p, C, it, w);
  }

  const Real scale = static_cast<Real>(prob.scale);
  for (i64 r = 0; r < heads; ++r)
    load_state<Real>(prob, p.dfinal_state, p.opts, it.n, it.hv0 + r, w.dS.data() + r * Dk * Dv);
  for (i64 c = chunks - 1; c >= 0; --c) {
    const i64 c0 = c * C;
    const int n = static_cast<int>(std::min<i64>(C, L - c0));
    const SequenceSpan span{it.seq.b, it.seq.t0 + c0, n};
    load_keys<Real>(prob, p.in, p.opts, span, it.hk, w.q.data(), w.k.data());
    if constexpr (!PerKey) {
      GDR_PRODUCT_REGION(bwd_qk_kk, 2 * profile::tri_flops(n, Dk, true),
                         w.qk.topLeftCorner(n, n).template triangularView<Eigen::Lower>() =
                             w.q.topRows(n) * w.k.topRows(n).transpose();
                         w.kk.topLeftCorner(n, n).template triangularView<Eigen::Lower>() =
                             w.k.topRows(n) * w.k.topRows(n).transpose());
    }
    w.dq_acc.topRows(n).setZero();
    w.dk_acc.topRows(n).setZero();
    for (i64 r = 0; r < heads; ++r) {
      const i64 hv = it.hv0 + r;
      // The state entering the chunk and its Tinv, Vnew: from `saved` or the state pass
      // (saved chunk states alone: the two matrices are recomputed in chunk_backward).
      Real* S_in = saved.defined() ? saved.state(it.chunk_row0 + c, hv)
                                   : w.states.data() + (r * chunks + c) * Dk * Dv;
      const Real* solved = !saved.defined() ? w.solved.data() + (r * chunks + c) * w.solved_stride()
                           : saved.has_solved ? saved.solved(it.chunk_row0 + c, hv)
                                              : nullptr;  // recomputed from S_in
      const MapMat<Real> S(S_in, Dk, Dv);
      MapMat<Real> dS(w.dS.data() + r * Dk * Dv, Dk, Dv);
      load_values<Real>(prob, p.in, span, hv, w.v.data());
      load_gates<Real>(prob, p.in, p.opts, span, hv, w.g.data(), w.beta.data());
      load_dout<Real>(prob, p.in, span, hv, p.dout, w.dout.data());
      chunk_backward<Real, PerKey>(w, n, scale, S, dS, solved);
      store_value_grads<Real>(prob, p.in, span, hv, w.dv.data(), p.dv);
      double* part_a = nullptr;
      double* part_dt = nullptr;
      if (sinks.dA_log) {
        std::fill(w.gate_part.begin(), w.gate_part.end(), 0.0);
        part_a = w.gate_part.data();
        part_dt = w.gate_part.data() + 1;
      }
      store_gate_grads<Real>(prob, p.in, p.opts, span, hv, w.g.data(), w.dbeta.data(), p.dg,
                             p.dbeta, part_a, part_dt);
      if (sinks.dA_log) {
        sinks.dA_log[hv] += w.gate_part[0];
        for (int i = 0; i < w.Wg; ++i) sinks.ddt_bias[hv * w.Wg + i] += w.gate_part[1 + i];
      }
    }
    if (sinks.key_partial) {
      MapMat<Real> part(sinks.key_partial + c0 * 2 * Dk, n, 2 * Dk);
      part.leftCols(Dk) = w.dq_acc.topRows(n);
      part.rightCols(Dk) = w.dk_acc.topRows(n);
    } else {
      store_key_grads<Real>(prob, p.in, p.opts, span, it.hk, w.dq_acc.data(), w.dk_acc.data(), p.dq,
                            p.dk);
    }
  }
  if (p.dh0.defined())
    for (i64 r = 0; r < heads; ++r)
      store_state<Real>(prob, p.opts, it.n, it.hv0 + r, w.dS.data() + r * Dk * Dv, p.dh0);
}

template <class Real, bool PerKey>
void backward_all(const Problem& prob, const BackwardParams& p, const ExecConfig& config) {
  const chunkwise::Plan plan = chunkwise::make_plan(prob, p.in, config);
  const i64 heads = prob.group() / plan.splits;
  const i64 count = static_cast<i64>(plan.items.size());
  const i64 Wg = PerKey ? prob.Dk : 1;
  const bool gate_params = p.opts.gate_in_kernel && (p.dA_log.defined() || p.ddt_bias.defined());
  // The forward's records (read only; SavedRecords hands out non-const pointers for both uses).
  const SavedRecords<Real> saved =
      p.saved.defined() ? SavedRecords<Real>(p.saved, prob.Dk, prob.Dv) : SavedRecords<Real>();
  // Per sequence: dA_log [Hv] and ddt_bias [Hv, Wg] contributions, summed in order below.
  std::vector<double> dA_parts, ddt_parts;
  if (gate_params) {
    dA_parts.assign(static_cast<std::size_t>(prob.N * prob.Hv), 0.0);
    ddt_parts.assign(static_cast<std::size_t>(prob.N * prob.Hv * Wg), 0.0);
  }
  // Split groups: [N, Hk, splits] partial (dq_hat, dk_hat) of [L, 2, Dk] each.
  std::vector<i64> key_offset;
  std::vector<Real> key_parts;
  if (plan.splits > 1) {
    key_offset.assign(static_cast<std::size_t>(prob.N * prob.Hk * plan.splits + 1), 0);
    for (const WorkItem& it : plan.items)
      key_offset[(it.n * prob.Hk + it.hk) * plan.splits + it.split + 1] = it.seq.len * 2 * prob.Dk;
    for (std::size_t i = 1; i < key_offset.size(); ++i) key_offset[i] += key_offset[i - 1];
    key_parts.resize(static_cast<std::size_t>(key_offset.back()));
  }
  std::exception_ptr error;
#pragma omp parallel num_threads(plan.threads)
  {
    std::unique_ptr<Workspace<Real>> w;
    try {
      w = std::make_unique<Workspace<Real>>(config.chunk_size, prob.Dk, prob.Dv, PerKey, heads,
                                            true);
    } catch (...) {
#pragma omp critical(gdr_chunkwise_error)
      if (!error) error = std::current_exception();
    }
#pragma omp for schedule(dynamic, 1)
    for (i64 i = 0; i < count; ++i) {
      if (!w) continue;
      const WorkItem& it = plan.items[i];
      Sinks<Real> sinks;
      if (gate_params) {
        sinks.dA_log = dA_parts.data() + it.n * prob.Hv;
        sinks.ddt_bias = ddt_parts.data() + it.n * prob.Hv * Wg;
      }
      if (plan.splits > 1)
        sinks.key_partial =
            key_parts.data() + key_offset[(it.n * prob.Hk + it.hk) * plan.splits + it.split];
      try {
        backward_item<Real, PerKey>(prob, p, config.chunk_size, it, *w, sinks, saved);
      } catch (...) {
#pragma omp critical(gdr_chunkwise_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);

  if (plan.splits > 1) {
    const i64 pairs = prob.N * prob.Hk;
    std::vector<std::vector<Real>> scratch(static_cast<std::size_t>(plan.threads));
#pragma omp parallel for schedule(dynamic, 1) num_threads(plan.threads)
    for (i64 pr = 0; pr < pairs; ++pr) {
      try {
        const i64 n = pr / prob.Hk, hk = pr % prob.Hk;
        const SequenceSpan seq = sequence_span(prob, p.in, n);
        const i64 L = seq.len, Dk = prob.Dk;
        if (L == 0) continue;
        Real* base = key_parts.data() + key_offset[pr * plan.splits];
        MapMat<Real> sum(base, L, 2 * Dk);
        for (i64 s = 1; s < plan.splits; ++s)
          sum += MapMat<Real>(key_parts.data() + key_offset[pr * plan.splits + s], L, 2 * Dk);
        std::vector<Real>& buf = scratch[static_cast<std::size_t>(omp_get_thread_num())];
        buf.resize(static_cast<std::size_t>(2 * L * Dk));
        MapMat<Real>(buf.data(), L, Dk) = sum.leftCols(Dk);
        MapMat<Real>(buf.data() + L * Dk, L, Dk) = sum.rightCols(Dk);
        store_key_grads<Real>(prob, p.in, p.opts, seq, hk, buf.data(), buf.data() + L * Dk, p.dq,
                              p.dk);
      } catch (...) {
#pragma omp critical(gdr_chunkwise_error)
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }

  if (gate_params) {
    std::vector<double> dA_sum(static_cast<std::size_t>(prob.Hv), 0.0);
    std::vector<double> ddt_sum(static_cast<std::size_t>(prob.Hv * Wg), 0.0);
    for (i64 n = 0; n < prob.N; ++n) {
      for (i64 h = 0; h < prob.Hv; ++h) dA_sum[h] += dA_parts[n * prob.Hv + h];
      for (i64 i = 0; i < prob.Hv * Wg; ++i) ddt_sum[i] += ddt_parts[n * prob.Hv * Wg + i];
    }
    store_gate_param_grads(prob, dA_sum.data(), ddt_sum.data(), p.dA_log, p.ddt_bias);
  }
}

template <class Real>
void backward_real(const Problem& prob, const BackwardParams& p, const ExecConfig& config) {
  if (prob.gate == GateKind::per_key)
    backward_all<Real, true>(prob, p, config);
  else
    backward_all<Real, false>(prob, p, config);
}

}  // namespace

void chunkwise_backward(const Problem& prob, const BackwardParams& p, const ExecConfig& config) {
  if (prob.dtype == DType::f64)
    backward_real<double>(prob, p, config);
  else
    backward_real<float>(prob, p, config);
}

}  // namespace gdr::cpu
