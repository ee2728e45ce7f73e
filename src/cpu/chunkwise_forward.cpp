// Chunkwise forward (docs/operator.md §3), per chunk of n tokens and value head, state S [Dk, Dv]:
//   [e .* Q ; Kb] S  (one [2n, Dk] x [Dk, Dv] product),  Vnew = Tinv (beta .* V - Kb S),
//   O = scale (e .* Q S + P Vnew),  S <- gn .* S + (d .* K)^T Vnew.
// Only the running state is kept (one per value head of the item). When ForwardParams::saved is
// given, every chunk's entering state S (and, for chunk intermediates, its Tinv and Vnew) is
// also written there (one record per chunk and value head, chunkwise_common.h's SavedRecords)
// for the backward.
#include <omp.h>

#include <algorithm>
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

template <class Real, bool PerKey>
void forward_item(const Problem& prob, const ForwardParams& p, int C, const WorkItem& it,
                  Workspace<Real>& w, const SavedRecords<Real>& saved) {
  const i64 Dk = prob.Dk, Dv = prob.Dv, L = it.seq.len;
  const i64 heads = it.hv1 - it.hv0;
  const Real scale = static_cast<Real>(prob.scale);
  for (i64 r = 0; r < heads; ++r)
    load_state<Real>(prob, p.in.h0, p.opts, it.n, it.hv0 + r, w.S.data() + r * Dk * Dv);
  for (i64 c0 = 0; c0 < L; c0 += C) {
    const int n = static_cast<int>(std::min<i64>(C, L - c0));
    const SequenceSpan span{it.seq.b, it.seq.t0 + c0, n};
    load_keys<Real>(prob, p.in, p.opts, span, it.hk, w.q.data(), w.k.data());
    if constexpr (!PerKey) {
      // Lower triangles of Q K^T and K K^T (the upper parts stay 0).
      GDR_PRODUCT_REGION(fwd_qk_kk, 2 * profile::tri_flops(n, Dk, true),
                         w.qk.topLeftCorner(n, n).template triangularView<Eigen::Lower>() =
                             w.q.topRows(n) * w.k.topRows(n).transpose();
                         w.kk.topLeftCorner(n, n).template triangularView<Eigen::Lower>() =
                             w.k.topRows(n) * w.k.topRows(n).transpose());
    }
    for (i64 r = 0; r < heads; ++r) {
      const i64 hv = it.hv0 + r;
      const i64 row = it.chunk_row0 + c0 / C;
      MapMat<Real> S(w.S.data() + r * Dk * Dv, Dk, Dv);
      if (saved.defined()) MapMat<Real>(saved.state(row, hv), Dk, Dv) = S;
      load_values<Real>(prob, p.in, span, hv, w.v.data());
      load_gates<Real>(prob, p.in, p.opts, span, hv, w.g.data(), w.beta.data());
      chunkwise::prepare_gates<Real, PerKey>(w, n);
      chunkwise::gated_products<Real, PerKey>(w, n, true);
      chunkwise::solve_chunk<Real, PerKey>(w, n, true);
      auto qws = w.qws.topRows(2 * n);
      GDR_PRODUCT(fwd_qw_S, 2 * n, Dv, Dk, qws.noalias() = w.qw.topRows(2 * n) * S);
      w.z.topRows(n) = w.vb.topRows(n) - qws.bottomRows(n);
      chunkwise::solve_vnew(w, n);
      auto vnew = w.vnew.topRows(n);
      auto O = w.o.topRows(n);
      O = qws.topRows(n);
      GDR_PRODUCT_REGION(
          fwd_P_vnew, profile::tri_flops(n, Dv, true),
          O.noalias() += w.P.topLeftCorner(n, n).template triangularView<Eigen::Lower>() * vnew);
      O *= scale;
      store_output<Real>(prob, p.in, span, hv, w.o.data(), p.o);
      if (saved.has_solved) chunkwise::keep_solved(w, n, saved.solved(row, hv));
      chunkwise::decay_state<Real, PerKey>(w, S);
      GDR_PRODUCT(fwd_S_update, Dk, Dv, n, S.noalias() += w.kd.topRows(n).transpose() * vnew);
    }
  }
  if (p.final_state.defined())
    for (i64 r = 0; r < heads; ++r)
      store_state<Real>(prob, p.opts, it.n, it.hv0 + r, w.S.data() + r * Dk * Dv, p.final_state);
}

template <class Real, bool PerKey>
void forward_all(const Problem& prob, const ForwardParams& p, const ExecConfig& config) {
  const chunkwise::Plan plan = chunkwise::make_plan(prob, p.in, config);
  const i64 heads = prob.group() / plan.splits;
  const i64 count = static_cast<i64>(plan.items.size());
  const SavedRecords<Real> saved =
      p.saved.defined() ? SavedRecords<Real>(p.saved, prob.Dk, prob.Dv) : SavedRecords<Real>();
  const i64 rows = saved.defined() ? p.saved.shape[0] : 0;
  const i64 record = saved.defined() ? p.saved.shape[2] : 0;
  if (saved.defined() && saved.head_stride == record && saved.row_stride == prob.Hv * record)
    chunkwise::advise_huge_pages(saved.data, rows * prob.Hv * record * i64(sizeof(Real)));
  std::exception_ptr error;
#pragma omp parallel num_threads(plan.threads)
  {
    std::unique_ptr<Workspace<Real>> w;
    try {
      w = std::make_unique<Workspace<Real>>(config.chunk_size, prob.Dk, prob.Dv, PerKey, heads,
                                            false);
    } catch (...) {
#pragma omp critical(gdr_chunkwise_error)
      if (!error) error = std::current_exception();
    }
#pragma omp for schedule(dynamic, 1)
    for (i64 i = 0; i < count; ++i) {
      if (!w) continue;
      try {
        forward_item<Real, PerKey>(prob, p, config.chunk_size, plan.items[i], *w, saved);
      } catch (...) {
#pragma omp critical(gdr_chunkwise_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
  // Rows of `saved` past the last sequence's chunks (its varlen shape is an upper bound): zeros,
  // so that every element of `saved` is a function of the inputs.
  if (saved.defined())
    for (i64 row = plan.chunk_rows; row < rows; ++row)
      for (i64 hv = 0; hv < prob.Hv; ++hv)
        std::fill(saved.state(row, hv), saved.state(row, hv) + record, Real(0));
}

template <class Real>
void forward_real(const Problem& prob, const ForwardParams& p, const ExecConfig& config) {
  if (prob.gate == GateKind::per_key)
    forward_all<Real, true>(prob, p, config);
  else
    forward_all<Real, false>(prob, p, config);
}

}  // namespace

void chunkwise_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config) {
  if (prob.dtype == DType::f64)
    forward_real<double>(prob, p, config);
  else
    forward_real<float>(prob, p, config);
}

}  // namespace gdr::cpu
