// One (sequence, value head) through the per-token loop, from the user's tensors: load q_hat,
// k_hat of the key head, v and the gates through the canonical helpers (fused options, mask),
// run seq::forward_head on the state S [Dk, Dv] (k-first, in place) and leave o [L, Dv] in `o`.
// Shared by the CPU sequential forward and the CPU decode step (head_view also by the
// sequential backward).
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/canonical.h"
#include "cpu/sequential_kernel.h"

namespace gdr::cpu {

// The per-token loop's view of one head's canonical buffers (sequential_kernel.h).
template <class Real>
seq::Head<Real> head_view(const Problem& prob, std::int64_t L, const Real* q, const Real* k,
                          const Real* v, const Real* g, const Real* beta) {
  return seq::Head<Real>{.L = L,
                         .Dk = prob.Dk,
                         .Dv = prob.Dv,
                         .per_key = prob.gate == GateKind::per_key,
                         .scale = static_cast<Real>(prob.scale),
                         .q = q,
                         .k = k,
                         .v = v,
                         .g = g,
                         .beta = beta};
}

template <class Real>
void forward_one_head(const Problem& prob, const Inputs& in, const Options& opts,
                      const SequenceSpan& seq, std::int64_t hv, Real* S, Real* o) {
  const std::int64_t L = seq.len, Dk = prob.Dk, Dv = prob.Dv;
  if (L == 0) return;
  const bool per_key = prob.gate == GateKind::per_key;
  const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  std::vector<Real> q(n(L * Dk)), k(n(L * Dk)), v(n(L * Dv)), g(n(L * (per_key ? Dk : 1)));
  std::vector<Real> beta(n(L)), kS(n(Dv)), u(n(Dv)), a(n(Dk));
  load_keys<Real>(prob, in, opts, seq, prob.key_head(hv), q.data(), k.data());
  load_values<Real>(prob, in, seq, hv, v.data());
  load_gates<Real>(prob, in, opts, seq, hv, g.data(), beta.data());
  const seq::Head<Real> h =
      head_view<Real>(prob, L, q.data(), k.data(), v.data(), g.data(), beta.data());
  seq::forward_head(h, S, o, seq::ForwardScratch<Real>{kS.data(), u.data(), a.data()});
}

}  // namespace gdr::cpu
