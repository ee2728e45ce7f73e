// Per-head kernels of the per-token loop (docs/operator.md §2) in the working precision Real (float
// for f32/f16/bf16 inputs, double for f64), on the canonical buffers of src/cpu/canonical.h.
// Shared by the sequential path (src/cpu/sequential.cpp) and the CPU decode step (decode.cpp).
//
// Layout: the state S is [Dk, Dv] row-major (k-first); every operation walks it row by row,
// each row contiguous over Dv, so the inner loops vectorise.
//
// Forward. With a_t = exp(g_t) (one value, or one per key row for per-key gates), the loop keeps
// the *decayed* state S'_t = diag(a_t) S_{t-1} between tokens, so that a single pass over S per
// token does everything:
//   u_t = beta_t (v_t - S'_t^T k_t)                    (S'_t^T k_t carried from the last pass)
//   row i:  s = S'_t[i,:] + k_t[i] u_t                 (row i of S_t)
//           o_t += q_t[i] s                            (o_t = scale S_t^T q_t)
//           s *= a_{t+1}[i];  kS += k_{t+1}[i] s        (S'_{t+1} and S'_{t+1}^T k_{t+1})
//
// Backward (reverse of one token, given S'_t, u_t, vmk_t = v_t - S'_t^T k_t and dS = dL/dS_t):
//   pass 1, row i:  dS[i,:] += scale q_t[i] dO_t
//                   dq_t[i] += scale <S_t[i,:], dO_t>,  dk_t[i] += <dS[i,:], u_t>
//                   du += k_t[i] dS[i,:]
//   dv_t = beta_t du,  dbeta_t = <du, vmk_t>,  dkS = -beta_t du
//   pass 2, row i:  dS'[i,:] = dS[i,:] + k_t[i] dkS
//                   dk_t[i] += <S'_t[i,:], dkS>,  dg_t(i) += <S'_t[i,:], dS'[i,:]>
//                   dS[i,:] = a_t[i] dS'[i,:]          (now dL/dS_{t-1})
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace gdr::cpu::seq {

// One (sequence, value head) in canonical buffers.
template <class Real>
struct Head {
  std::int64_t L = 0, Dk = 0, Dv = 0;
  bool per_key = false;  // g: [L, Dk] when true, else [L]
  Real scale = 1;
  const Real* q = nullptr;     // [L, Dk] (null when no output is wanted)
  const Real* k = nullptr;     // [L, Dk]
  const Real* v = nullptr;     // [L, Dv]
  const Real* g = nullptr;     // [L] or [L, Dk], log decay
  const Real* beta = nullptr;  // [L]
};

// a[i] = exp(g_t) (scalar gate: the same value in every row), a: [Dk].
template <class Real>
inline void decay_of(const Head<Real>& h, std::int64_t t, Real* a) {
  if (h.per_key) {
    const Real* gt = h.g + t * h.Dk;
    for (std::int64_t i = 0; i < h.Dk; ++i) a[i] = std::exp(gt[i]);
  } else {
    const Real at = std::exp(h.g[t]);
    for (std::int64_t i = 0; i < h.Dk; ++i) a[i] = at;
  }
}

// S <- diag(a) S; kS = S^T k_t.
template <class Real>
inline void enter(const Head<Real>& h, std::int64_t t, const Real* a, Real* S, Real* kS) {
  const std::int64_t Dk = h.Dk, Dv = h.Dv;
  const Real* kt = h.k + t * Dk;
  for (std::int64_t j = 0; j < Dv; ++j) kS[j] = 0;
  for (std::int64_t i = 0; i < Dk; ++i) {
    Real* s = S + i * Dv;
    const Real ai = a[i], ki = kt[i];
#pragma omp simd
    for (std::int64_t j = 0; j < Dv; ++j) {
      s[j] *= ai;
      kS[j] += ki * s[j];
    }
  }
}

// kS = S^T k_t.
template <class Real>
inline void project(const Head<Real>& h, std::int64_t t, const Real* S, Real* kS) {
  const Real* kt = h.k + t * h.Dk;
  for (std::int64_t j = 0; j < h.Dv; ++j) kS[j] = 0;
  for (std::int64_t i = 0; i < h.Dk; ++i) {
    const Real* s = S + i * h.Dv;
    const Real ki = kt[i];
#pragma omp simd
    for (std::int64_t j = 0; j < h.Dv; ++j) kS[j] += ki * s[j];
  }
}

// u = beta_t (v_t - kS); vmk = v_t - kS when vmk is given.
template <class Real>
inline void update_vector(const Head<Real>& h, std::int64_t t, const Real* kS, Real* u, Real* vmk) {
  const Real* vt = h.v + t * h.Dv;
  const Real bt = h.beta[t];
  for (std::int64_t j = 0; j < h.Dv; ++j) {
    const Real d = vt[j] - kS[j];
    if (vmk) vmk[j] = d;
    u[j] = bt * d;
  }
}

// Columns [j0, j0 + W) of step(): the o_t and kS accumulators of the block stay in registers
// while the pass walks the Dk rows (one load and one store of S per element).
template <class Real, bool WithO, bool WithNext, int W>
inline void step_columns(std::int64_t Dk, std::int64_t Dv, std::int64_t j0, const Real* kt,
                         const Real* qt, const Real* kn, const Real* src, Real* dst, const Real* u,
                         Real* o_t, const Real* a_next, Real* kS) {
  Real ub[W], ob[W], kb[W];
  for (int j = 0; j < W; ++j) {
    ub[j] = u[j0 + j];
    ob[j] = 0;
    kb[j] = 0;
  }
  for (std::int64_t i = 0; i < Dk; ++i) {
    const Real* si = src + i * Dv + j0;
    Real* so = dst + i * Dv + j0;
    const Real ki = kt[i];
    const Real qi = WithO ? qt[i] : Real(0);
    const Real an = WithNext ? a_next[i] : Real(0);
    const Real kni = WithNext ? kn[i] : Real(0);
#pragma omp simd
    for (int j = 0; j < W; ++j) {
      Real s = si[j] + ki * ub[j];  // S_t[i, j]
      if constexpr (WithO) ob[j] += qi * s;
      if constexpr (WithNext) {
        s *= an;  // S'_{t+1}[i, j]
        kb[j] += kni * s;
      }
      so[j] = s;
    }
  }
  for (int j = 0; j < W; ++j) {
    if constexpr (WithO) o_t[j0 + j] = ob[j];
    if constexpr (WithNext) kS[j0 + j] = kb[j];
  }
}

// One fused pass for token t: dst = S_t (or S'_{t+1} with kS = S'_{t+1}^T k_{t+1} when
// WithNext) from src = S'_t; o_t = scale S_t^T q_t when WithO. src may equal dst.
// Column blocks of 32, then 8, then single columns.
template <class Real, bool WithO, bool WithNext>
inline void step(const Head<Real>& h, std::int64_t t, const Real* src, Real* dst, const Real* u,
                 Real* o_t, const Real* a_next, Real* kS) {
  const std::int64_t Dk = h.Dk, Dv = h.Dv;
  const Real* kt = h.k + t * Dk;
  const Real* qt = WithO ? h.q + t * Dk : nullptr;
  const Real* kn = WithNext ? h.k + (t + 1) * Dk : nullptr;
  std::int64_t j0 = 0;
  for (; j0 + 32 <= Dv; j0 += 32)
    step_columns<Real, WithO, WithNext, 32>(Dk, Dv, j0, kt, qt, kn, src, dst, u, o_t, a_next, kS);
  for (; j0 + 8 <= Dv; j0 += 8)
    step_columns<Real, WithO, WithNext, 8>(Dk, Dv, j0, kt, qt, kn, src, dst, u, o_t, a_next, kS);
  for (; j0 < Dv; ++j0)
    step_columns<Real, WithO, WithNext, 1>(Dk, Dv, j0, kt, qt, kn, src, dst, u, o_t, a_next, kS);
  if constexpr (WithO)
    for (std::int64_t j = 0; j < Dv; ++j) o_t[j] *= h.scale;
}

// Scratch of the forward loop: kS, u [Dv]; a [Dk].
template <class Real>
struct ForwardScratch {
  Real* kS;
  Real* u;
  Real* a;
};

// The whole forward of one head: S holds S_{-1} (h0 or zeros) on entry, S_{L-1} on exit;
// o: [L, Dv] (scaled), or null when no output is wanted.
template <class Real>
void forward_head(const Head<Real>& h, Real* S, Real* o, const ForwardScratch<Real>& w) {
  if (h.L == 0) return;
  decay_of(h, 0, w.a);
  enter(h, 0, w.a, S, w.kS);
  for (std::int64_t t = 0; t < h.L; ++t) {
    update_vector(h, t, w.kS, w.u, static_cast<Real*>(nullptr));
    Real* ot = o ? o + t * h.Dv : nullptr;
    const bool next = t + 1 < h.L;
    if (next) decay_of(h, t + 1, w.a);
    if (o && next)
      step<Real, true, true>(h, t, S, S, w.u, ot, w.a, w.kS);
    else if (o)
      step<Real, true, false>(h, t, S, S, w.u, ot, w.a, w.kS);
    else if (next)
      step<Real, false, true>(h, t, S, S, w.u, ot, w.a, w.kS);
    else
      step<Real, false, false>(h, t, S, S, w.u, ot, w.a, w.kS);
  }
}

// Reverse of token t (see the header comment). Sd = S'_t [Dk, Dv]; u, vmk [Dv]; dO_t [Dv];
// a_t [Dk]; dS [Dk, Dv] is dL/dS_t on entry and dL/dS_{t-1} on exit; du, dkS: [Dv] scratch.
// Adds into dq_t, dk_t [Dk] (value heads sharing a key head accumulate); sets dv_t [Dv],
// dg_t (one value, or [Dk] for per-key gates) and *dbeta_t.
template <class Real>
void step_back(const Head<Real>& h, std::int64_t t, const Real* Sd, const Real* u, const Real* vmk,
               const Real* dO_t, const Real* a_t, Real* dS, Real* du, Real* dkS, Real* dq_t,
               Real* dk_t, Real* dv_t, Real* dg_t, Real* dbeta_t) {
  const std::int64_t Dk = h.Dk, Dv = h.Dv;
  const Real* qt = h.q + t * Dk;
  const Real* kt = h.k + t * Dk;
  const Real scale = h.scale;
  for (std::int64_t j = 0; j < Dv; ++j) du[j] = 0;
  // Pass 1: the output and the rank-one update S_t = S'_t + k_t u_t^T.
  for (std::int64_t i = 0; i < Dk; ++i) {
    const Real* sd = Sd + i * Dv;
    Real* ds = dS + i * Dv;
    const Real ki = kt[i], qi = scale * qt[i];
    Real dqi = 0, dki = 0;
#pragma omp simd reduction(+ : dqi, dki)
    for (std::int64_t j = 0; j < Dv; ++j) {
      const Real st = sd[j] + ki * u[j];
      dqi += st * dO_t[j];
      const Real d = ds[j] + qi * dO_t[j];
      ds[j] = d;
      dki += d * u[j];
      du[j] += ki * d;
    }
    dq_t[i] += scale * dqi;
    dk_t[i] += dki;
  }
  // u_t = beta_t (v_t - S'_t^T k_t).
  const Real bt = h.beta[t];
  Real db = 0;
  for (std::int64_t j = 0; j < Dv; ++j) {
    db += du[j] * vmk[j];
    dv_t[j] = bt * du[j];
    dkS[j] = -bt * du[j];
  }
  *dbeta_t = db;
  // Pass 2: S'_t^T k_t and the decay S'_t = diag(a_t) S_{t-1}.
  Real dg_scalar = 0;
  for (std::int64_t i = 0; i < Dk; ++i) {
    const Real* sd = Sd + i * Dv;
    Real* ds = dS + i * Dv;
    const Real ki = kt[i], ai = a_t[i];
    Real dgi = 0, dki = 0;
#pragma omp simd reduction(+ : dgi, dki)
    for (std::int64_t j = 0; j < Dv; ++j) {
      const Real dsp = ds[j] + ki * dkS[j];
      dki += sd[j] * dkS[j];
      dgi += sd[j] * dsp;
      ds[j] = ai * dsp;
    }
    dk_t[i] += dki;
    if (h.per_key)
      dg_t[i] = dgi;
    else
      dg_scalar += dgi;
  }
  if (!h.per_key) dg_t[0] = dg_scalar;
}

// The whole backward of one head with O(L / C) memory: states S'_t are saved every C tokens
// by a forward pass, then each chunk, last to first, recomputes its C states from its saved one
// and runs step_back over its tokens in reverse, carrying dS.
// S0 = S_{-1} [Dk, Dv] (h0 or zeros); dS is dL/dS_{L-1} on entry (final-state gradient or 0)
// and dL/dS_{-1} (dh0) on exit; dO [L, Dv]. Adds into dq, dk [L, Dk]; sets dv [L, Dv],
// dg ([L] or [L, Dk]) and dbeta [L].
// Scratch of backward_head, kept by each thread across the heads it processes (it only grows):
// nc saved states, the recomputed states of one chunk, u and v - S'^T k per token of the chunk.
template <class Real>
struct BackwardScratch {
  std::vector<Real> ckpt, ring, uc, vmkc, kS, du, dkS, a;
  std::vector<const Real*> states;

  void prepare(std::int64_t L, std::int64_t C, std::int64_t Dk, std::int64_t Dv) {
    const std::int64_t nc = (L + C - 1) / C, Cr = std::min(C, L), DD = Dk * Dv;
    grow(ckpt, nc * DD);
    grow(ring, Cr * DD);
    grow(uc, Cr * Dv);
    grow(vmkc, Cr * Dv);
    grow(kS, Dv);
    grow(du, Dv);
    grow(dkS, Dv);
    grow(a, Dk);
    if (states.size() < static_cast<std::size_t>(Cr)) states.resize(static_cast<std::size_t>(Cr));
  }

 private:
  static void grow(std::vector<Real>& x, std::int64_t n) {
    if (x.size() < static_cast<std::size_t>(n)) x.resize(static_cast<std::size_t>(n));
  }
};

// The whole backward of one head with O(L / C) memory: states S'_t are saved every C tokens
// by a forward pass, then each chunk, last to first, recomputes its C states from its saved one
// and runs step_back over its tokens in reverse, carrying dS.
// S0 = S_{-1} [Dk, Dv] (h0 or zeros); dS is dL/dS_{L-1} on entry (final-state gradient or 0)
// and dL/dS_{-1} (dh0) on exit; dO [L, Dv]. Adds into dq, dk [L, Dk]; sets dv [L, Dv],
// dg ([L] or [L, Dk]) and dbeta [L].
template <class Real>
void backward_head(const Head<Real>& h, const Real* S0, const Real* dO, std::int64_t C, Real* dS,
                   Real* dq, Real* dk, Real* dv, Real* dg, Real* dbeta, BackwardScratch<Real>& w) {
  const std::int64_t L = h.L, Dk = h.Dk, Dv = h.Dv, DD = Dk * Dv;
  if (L == 0) return;
  const std::int64_t nc = (L + C - 1) / C;
  const std::int64_t gw = h.per_key ? Dk : 1;
  w.prepare(L, C, Dk, Dv);
  Real* ckpt = w.ckpt.data();  // S'_{cC}, c < nc
  Real* ring = w.ring.data();  // S'_t inside one chunk
  Real *uc = w.uc.data(), *vmkc = w.vmkc.data(), *kS = w.kS.data(), *du = w.du.data();
  Real *dkS = w.dkS.data(), *a = w.a.data();
  const Real** states = w.states.data();  // states[j] = S'_{c0 + j}

  // Forward to the last chunk's start, saving S'_{cC}; the running state lives in ring[0].
  Real* S = ring;
  std::memcpy(S, S0, sizeof(Real) * DD);
  decay_of(h, 0, a);
  enter(h, 0, a, S, kS);
  for (std::int64_t t = 0; t < (nc - 1) * C; ++t) {
    if (t % C == 0) std::memcpy(ckpt + (t / C) * DD, S, sizeof(Real) * DD);
    update_vector(h, t, kS, uc, static_cast<Real*>(nullptr));
    decay_of(h, t + 1, a);
    step<Real, false, true>(h, t, S, S, uc, nullptr, a, kS);
  }
  std::memcpy(ckpt + (nc - 1) * DD, S, sizeof(Real) * DD);

  // Chunks in reverse.
  for (std::int64_t c = nc - 1; c >= 0; --c) {
    const std::int64_t c0 = c * C, c1 = std::min(L, c0 + C);
    states[0] = ckpt + c * DD;
    project(h, c0, states[0], kS);
    for (std::int64_t t = c0; t < c1; ++t) {
      const std::int64_t j = t - c0;
      update_vector(h, t, kS, uc + j * Dv, vmkc + j * Dv);
      if (t + 1 < c1) {
        decay_of(h, t + 1, a);
        Real* dst = ring + (j + 1) * DD;
        step<Real, false, true>(h, t, states[j], dst, uc + j * Dv, nullptr, a, kS);
        states[j + 1] = dst;
      }
    }
    for (std::int64_t t = c1 - 1; t >= c0; --t) {
      const std::int64_t j = t - c0;
      decay_of(h, t, a);
      step_back(h, t, states[j], uc + j * Dv, vmkc + j * Dv, dO + t * Dv, a, dS, du, dkS,
                dq + t * Dk, dk + t * Dk, dv + t * Dv, dg + t * gw, dbeta + t);
    }
  }
}

}  // namespace gdr::cpu::seq
