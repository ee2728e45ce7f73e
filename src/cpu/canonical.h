// Canonical per-sequence, per-head buffers shared by every CPU path.
//
// Each CPU path (float64 reference, fp32 sequential loop, chunkwise) works on one sequence
// (SequenceSpan: batch row b, tokens [t0, t0 + L)) and one head at a time, on row-major
// contiguous buffers in its working precision Real (double or float). These functions move
// data between the user's strided tensors (any dtype) and those buffers, and apply the fused
// element-wise options on the way in (and their chain rule on the way out), so the paths
// themselves only see the plain recurrence of docs/operator.md §2:
//
//   q_hat, k_hat [L, Dk]  (L2-normalised when opts.qk_l2norm; per key head)
//   v            [L, Dv]  (per value head)
//   g_log        [L] or [L, Dk]  log decay (with gate_in_kernel
//                g = -exp(A_log) softplus(a + dt_bias)); 0 at masked positions
//   beta         [L]      sigmoid(b) when opts.beta_sigmoid; 0 at masked positions
//   S            [Dk, Dv] k-first state, whatever opts.state_layout says
//
// A masked position is exactly the identity step (g = 0, beta = 0) and its output is 0
// (store_output writes 0 there); gradients at masked positions are 0. q_hat, k_hat, v and dO
// also load as 0 there, so a NaN at a masked position cannot reach the state.
#pragma once

#include <cstdint>

#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr::cpu {

// ---- forward: tensors -> buffers ----

// q_hat, k_hat: [L, Dk] for key head hk. Either pointer may be null (not loaded).
template <class Real>
void load_keys(const Problem& prob, const Inputs& in, const Options& opts, const SequenceSpan& seq,
               std::int64_t hk, Real* q_hat, Real* k_hat);

// v: [L, Dv] for value head hv.
template <class Real>
void load_values(const Problem& prob, const Inputs& in, const SequenceSpan& seq, std::int64_t hv,
                 Real* v);

// g_log: [L] (scalar gate) or [L, Dk] (per-key gate); beta: [L]. Value head hv. Masked
// positions get g_log = 0 and beta = 0.
template <class Real>
void load_gates(const Problem& prob, const Inputs& in, const Options& opts, const SequenceSpan& seq,
                std::int64_t hv, Real* g_log, Real* beta);

// True where position t of the sequence is live (mask absent or true). valid: [L].
void load_valid(const Problem& prob, const Inputs& in, const SequenceSpan& seq, bool* valid);

// S: [Dk, Dv] from row n, head hv of `state` (h0 or the like, in opts.state_layout), or zeros
// when `state` is not defined.
template <class Real>
void load_state(const Problem& prob, const TensorView& state, const Options& opts, std::int64_t n,
                std::int64_t hv, Real* S);

// ---- forward: buffers -> tensors ----

// o: [L, Dv] for value head hv, written to `out` ([B, T, Hv, Dv], its dtype). Positions that
// are masked are written as 0 whatever o holds.
template <class Real>
void store_output(const Problem& prob, const Inputs& in, const SequenceSpan& seq, std::int64_t hv,
                  const Real* o, const TensorView& out);

// S: [Dk, Dv] k-first, written to row n, head hv of `state` in opts.state_layout.
template <class Real>
void store_state(const Problem& prob, const Options& opts, std::int64_t n, std::int64_t hv,
                 const Real* S, const TensorView& state);

// ---- backward: buffers -> tensors (chain rule of the fused options) ----

// dO: [L, Dv] loaded from dout for value head hv (0 at masked positions).
template <class Real>
void load_dout(const Problem& prob, const Inputs& in, const SequenceSpan& seq, std::int64_t hv,
               const TensorView& dout, Real* dO);

// Given dL/dq_hat and dL/dk_hat [L, Dk] for key head hk (already summed over the value heads
// that share it), applies the L2-norm backward when opts.qk_l2norm (re-reading q, k) and
// writes dq, dk (each optional: skipped when its TensorView is not defined). Masked -> 0.
template <class Real>
void store_key_grads(const Problem& prob, const Inputs& in, const Options& opts,
                     const SequenceSpan& seq, std::int64_t hk, const Real* dq_hat,
                     const Real* dk_hat, const TensorView& dq, const TensorView& dk);

// dv: [L, Dv] for value head hv. Masked -> 0.
template <class Real>
void store_value_grads(const Problem& prob, const Inputs& in, const SequenceSpan& seq,
                       std::int64_t hv, const Real* dv_buf, const TensorView& dv);

// Given dL/dg_log ([L] or [L, Dk]) and dL/dbeta ([L]) for value head hv, applies the gate
// and sigmoid chain rules and writes dg, dbeta (optional each). Masked -> 0.
// Under gate_in_kernel also returns this sequence's contributions to dA_log[hv] (one value)
// and dt_bias[hv] (1 or Dk values) in dA_log_part / ddt_bias_part (overwritten, not added to;
// the caller sums over sequences; both may be null when not wanted). dg_log / dbeta_eff may be
// null (that gradient is skipped).
template <class Real>
void store_gate_grads(const Problem& prob, const Inputs& in, const Options& opts,
                      const SequenceSpan& seq, std::int64_t hv, const Real* dg_log,
                      const Real* dbeta_eff, const TensorView& dg, const TensorView& dbeta,
                      double* dA_log_part, double* ddt_bias_part);

// Writes the per-head sums of dA_log ([Hv]) and ddt_bias ([Hv] or [Hv, Dk]) given as double.
void store_gate_param_grads(const Problem& prob, const double* dA_log_sum,
                            const double* ddt_bias_sum, const TensorView& dA_log,
                            const TensorView& ddt_bias);

}  // namespace gdr::cpu
