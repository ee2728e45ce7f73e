// The float64 sequential reference (docs/operator.md §2): the oracle every path answers to.
//
// Per sequence and value head hv (key head hk = hv / (Hv / Hk)), S [Dk, Dv] k-first:
//   S'  = a_t S_{t-1},  a_t = exp(g_t) (scalar) or diag(exp(g_t)) (per-key, row i by exp(g_t[i]))
//   p_t = S'^T k_t,  u_t = beta_t (v_t - p_t),  S_t = S' + k_t u_t^T,  o_t = scale S_t^T q_t
//
// Backward: reverse mode of the same loop, dS carried from dfinal_state (or 0):
//   dS_t  = dS + scale q_t dO_t^T            dq_t  = scale S_t dO_t
//   du    = dS_t^T k_t                        dk_t  = dS_t u_t + S' dp
//   dbeta = <du, v_t - p_t>                   dv_t  = beta_t du,  dp = -beta_t du
//   dS'   = dS_t + k_t dp^T                   dS_{t-1} = a_t dS'
//   dg_t  = <S', dS'> (scalar) or sum_j S'[i, j] dS'[i, j] (per-key channel i)
// States are kept every kSegment tokens and recomputed within a segment (O(L / kSegment +
// kSegment) states per head). Key-side gradients are summed over the value heads of a key head.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/canonical.h"
#include "cpu/paths.h"

namespace gdr::cpu {
namespace {

using i64 = std::int64_t;
using Vec = std::vector<double>;

constexpr i64 kSegment = 64;

// Buffers of one (sequence, value head): inputs in canonical form.
struct Head {
  i64 L = 0, Dk = 0, Dv = 0;
  bool per_key = false;
  Vec q, k, v, g, beta;  // [L, Dk], [L, Dk], [L, Dv], [L] or [L, Dk], [L]

  void load(const Problem& prob, const Inputs& in, const Options& opts, const SequenceSpan& seq,
            i64 hv) {
    L = seq.len;
    Dk = prob.Dk;
    Dv = prob.Dv;
    per_key = prob.gate == GateKind::per_key;
    q.assign(L * Dk, 0.0);
    k.assign(L * Dk, 0.0);
    v.assign(L * Dv, 0.0);
    g.assign(L * (per_key ? Dk : 1), 0.0);
    beta.assign(L, 0.0);
    load_keys<double>(prob, in, opts, seq, prob.key_head(hv), q.data(), k.data());
    load_values<double>(prob, in, seq, hv, v.data());
    load_gates<double>(prob, in, opts, seq, hv, g.data(), beta.data());
  }

  // S <- a_t S (the decay of token t).
  void decay(i64 t, double* S) const {
    for (i64 i = 0; i < Dk; ++i) {
      const double a = std::exp(per_key ? g[t * Dk + i] : g[t]);
      for (i64 j = 0; j < Dv; ++j) S[i * Dv + j] *= a;
    }
  }

  // One token: S (= S_{t-1} on entry) becomes S_t; p and u are written when given.
  void step(i64 t, double* S, double* p, double* u) const {
    decay(t, S);
    const double* kt = &k[t * Dk];
    for (i64 j = 0; j < Dv; ++j) {
      double s = 0;
      for (i64 i = 0; i < Dk; ++i) s += S[i * Dv + j] * kt[i];
      p[j] = s;
      u[j] = beta[t] * (v[t * Dv + j] - s);
    }
    for (i64 i = 0; i < Dk; ++i)
      for (i64 j = 0; j < Dv; ++j) S[i * Dv + j] += kt[i] * u[j];
  }

  // o_t = scale S_t^T q_t.
  void output(i64 t, const double* S, double scale, double* o) const {
    const double* qt = &q[t * Dk];
    for (i64 j = 0; j < Dv; ++j) {
      double s = 0;
      for (i64 i = 0; i < Dk; ++i) s += S[i * Dv + j] * qt[i];
      o[j] = scale * s;
    }
  }
};

}  // namespace

void reference_forward(const Problem& prob, const ForwardParams& p) {
  const i64 N = prob.N, Hv = prob.Hv, Dk = prob.Dk, Dv = prob.Dv;
  const double scale = prob.scale;
#pragma omp parallel for schedule(dynamic)
  for (i64 job = 0; job < N * Hv; ++job) {
    const i64 n = job / Hv, hv = job % Hv;
    const SequenceSpan seq = sequence_span(prob, p.in, n);
    Head h;
    h.load(prob, p.in, p.opts, seq, hv);
    Vec S(Dk * Dv), o(seq.len * Dv), pv(Dv), u(Dv);
    load_state<double>(prob, p.in.h0, p.opts, n, hv, S.data());
    for (i64 t = 0; t < seq.len; ++t) {
      h.step(t, S.data(), pv.data(), u.data());
      h.output(t, S.data(), scale, &o[t * Dv]);
    }
    store_output<double>(prob, p.in, seq, hv, o.data(), p.o);
    if (p.final_state.defined()) store_state<double>(prob, p.opts, n, hv, S.data(), p.final_state);
  }
}

void reference_backward(const Problem& prob, const BackwardParams& p) {
  const i64 N = prob.N, Hk = prob.Hk, Hv = prob.Hv, Dk = prob.Dk, Dv = prob.Dv;
  const i64 group = prob.group();
  const double scale = prob.scale;
  const i64 gw = prob.gate == GateKind::per_key ? Dk : 1;  // gate width
  const bool want_params = p.opts.gate_in_kernel && (p.dA_log.defined() || p.ddt_bias.defined());
  // Per (sequence, value head) contributions to dA_log and ddt_bias, summed at the end.
  Vec dA_parts(want_params ? N * Hv : 0), ddt_parts(want_params ? N * Hv * gw : 0);

#pragma omp parallel for schedule(dynamic)
  for (i64 job = 0; job < N * Hk; ++job) {
    const i64 n = job / Hk, hk = job % Hk;
    const SequenceSpan seq = sequence_span(prob, p.in, n);
    const i64 L = seq.len;
    Vec dq(L * Dk, 0.0), dk(L * Dk, 0.0);  // summed over the group's value heads
    for (i64 hv = hk * group; hv < (hk + 1) * group; ++hv) {
      Head h;
      h.load(prob, p.in, p.opts, seq, hv);
      Vec dO(L * Dv), dv(L * Dv, 0.0), dg(L * gw, 0.0), dbeta(L, 0.0);
      load_dout<double>(prob, p.in, seq, hv, p.dout, dO.data());

      // Forward pass keeping S_{t-1} at every segment start t = 0, kSegment, 2 kSegment, ...
      const i64 segments = (L + kSegment - 1) / kSegment;
      std::vector<Vec> checkpoint(static_cast<std::size_t>(segments));
      Vec S(Dk * Dv), pv(Dv), u(Dv);
      load_state<double>(prob, p.in.h0, p.opts, n, hv, S.data());
      for (i64 t = 0; t < L; ++t) {
        if (t % kSegment == 0) checkpoint[t / kSegment] = S;
        h.step(t, S.data(), pv.data(), u.data());
      }

      // Reverse pass.
      Vec dS(Dk * Dv, 0.0);
      if (p.dfinal_state.defined())
        load_state<double>(prob, p.dfinal_state, p.opts, n, hv, dS.data());
      // states[r] = S_{t0 + r - 1} (the state entering token t0 + r) within the segment.
      std::vector<Vec> states(static_cast<std::size_t>(std::min(L, kSegment) + 1));
      Vec Sp(Dk * Dv), du(Dv), dp(Dv), P(Dv), U(Dv);
      for (i64 seg = segments - 1; seg >= 0; --seg) {
        const i64 t0 = seg * kSegment, t1 = std::min(L, t0 + kSegment);
        states[0] = checkpoint[seg];
        for (i64 t = t0; t < t1; ++t) {
          states[t - t0 + 1] = states[t - t0];
          h.step(t, states[t - t0 + 1].data(), pv.data(), u.data());
        }
        for (i64 t = t1 - 1; t >= t0; --t) {
          const Vec& Sprev = states[t - t0];
          const Vec& St = states[t - t0 + 1];
          // Recompute S', p_t, u_t.
          Sp = Sprev;
          h.decay(t, Sp.data());
          const double* kt = &h.k[t * Dk];
          const double* qt = &h.q[t * Dk];
          const double* dOt = &dO[t * Dv];
          for (i64 j = 0; j < Dv; ++j) {
            double s = 0;
            for (i64 i = 0; i < Dk; ++i) s += Sp[i * Dv + j] * kt[i];
            P[j] = s;
            U[j] = h.beta[t] * (h.v[t * Dv + j] - s);
          }
          // o_t = scale S_t^T q_t:  dq_t += scale S_t dO_t,  dS_t += scale q_t dO_t^T.
          for (i64 i = 0; i < Dk; ++i) {
            double s = 0;
            for (i64 j = 0; j < Dv; ++j) {
              s += St[i * Dv + j] * dOt[j];
              dS[i * Dv + j] += scale * qt[i] * dOt[j];
            }
            dq[t * Dk + i] += scale * s;
          }
          // S_t = S' + k_t u_t^T:  dk_t += dS_t u_t,  du = dS_t^T k_t.
          for (i64 j = 0; j < Dv; ++j) {
            double s = 0;
            for (i64 i = 0; i < Dk; ++i) s += dS[i * Dv + j] * kt[i];
            du[j] = s;
          }
          double db = 0;
          for (i64 j = 0; j < Dv; ++j) {
            db += du[j] * (h.v[t * Dv + j] - P[j]);
            dv[t * Dv + j] = h.beta[t] * du[j];
            dp[j] = -h.beta[t] * du[j];
          }
          dbeta[t] = db;
          for (i64 i = 0; i < Dk; ++i) {
            double s1 = 0, s2 = 0;
            for (i64 j = 0; j < Dv; ++j) {
              s1 += dS[i * Dv + j] * U[j];
              s2 += Sp[i * Dv + j] * dp[j];
            }
            dk[t * Dk + i] += s1 + s2;
          }
          // p_t = S'^T k_t:  dS' = dS_t + k_t dp^T.  S' = a_t S_{t-1}: dg, dS_{t-1} = a_t dS'.
          for (i64 i = 0; i < Dk; ++i) {
            const double a = std::exp(h.per_key ? h.g[t * Dk + i] : h.g[t]);
            double s = 0;
            for (i64 j = 0; j < Dv; ++j) {
              const double d = dS[i * Dv + j] + kt[i] * dp[j];
              s += Sp[i * Dv + j] * d;
              dS[i * Dv + j] = a * d;
            }
            if (h.per_key)
              dg[t * Dk + i] = s;
            else
              dg[t] += s;
          }
        }
      }
      store_value_grads<double>(prob, p.in, seq, hv, dv.data(), p.dv);
      store_gate_grads<double>(prob, p.in, p.opts, seq, hv, dg.data(), dbeta.data(), p.dg, p.dbeta,
                               want_params ? &dA_parts[n * Hv + hv] : nullptr,
                               want_params ? &ddt_parts[(n * Hv + hv) * gw] : nullptr);
      if (p.dh0.defined()) store_state<double>(prob, p.opts, n, hv, dS.data(), p.dh0);
    }
    store_key_grads<double>(prob, p.in, p.opts, seq, hk, dq.data(), dk.data(), p.dq, p.dk);
  }

  if (want_params) {
    Vec dA(Hv, 0.0), ddt(Hv * gw, 0.0);
    for (i64 n = 0; n < N; ++n)
      for (i64 hv = 0; hv < Hv; ++hv) {
        dA[hv] += dA_parts[n * Hv + hv];
        for (i64 i = 0; i < gw; ++i) ddt[hv * gw + i] += ddt_parts[(n * Hv + hv) * gw + i];
      }
    store_gate_param_grads(prob, dA.data(), ddt.data(), p.dA_log, p.ddt_bias);
  }
}

}  // namespace gdr::cpu
