// Moves data between the user's strided tensors (any dtype) and the canonical per-sequence,
// per-head row-major buffers of canonical.h, applying the fused element-wise options:
//   L2 norm:       x_hat = x / r,  r = sqrt(sum_i x_i^2 + eps)
//                  dx = (dx_hat - x_hat <x_hat, dx_hat>) / r
//   gate in kernel: g = -exp(A_log) softplus(a + dt_bias), softplus(x) = x for x > 20,
//                  else log1p(exp(x));  dg/da = dg/d(dt_bias) = -exp(A_log) softplus'(x),
//                  softplus'(x) = 1 for x > 20, else sigmoid(x);  dg/dA_log = g
//   beta sigmoid:  beta = sigmoid(b),  dbeta/db = beta (1 - beta)
// Element-wise option math runs in double whatever Real is. Masked positions load as zeros
// (q_hat, k_hat, v, g_log, beta, dO), store as zeros, and add nothing to dA_log / ddt_bias.
// Rows with unit stride in fp32 / f64 are copied by plain contiguous loops (vectorised), and
// the double scratch rows live in per-thread buffers that grow once (no allocation per call).
#include "cpu/canonical.h"

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <vector>

namespace gdr::cpu {
namespace {

using i64 = std::int64_t;

// Reads n elements at offsets off + i * step of `t` (its dtype) into dst as Real.
template <class Real, class Elem>
void read_run(const void* base, i64 off, i64 n, i64 step, Real* dst) {
  const Elem* p = static_cast<const Elem*>(base) + off;
  for (i64 i = 0; i < n; ++i) dst[i] = static_cast<Real>(static_cast<float>(p[i * step]));
}

// dst[i] = Real(src[i * step]), i < n; step 1 as its own contiguous loop.
template <class Real, class Elem>
inline void copy_run(const Elem* __restrict src, i64 n, i64 step, Real* __restrict dst) {
  if (step == 1) {
    for (i64 i = 0; i < n; ++i) dst[i] = static_cast<Real>(src[i]);
  } else {
    for (i64 i = 0; i < n; ++i) dst[i] = static_cast<Real>(src[i * step]);
  }
}

// dst[i * step] = Elem(src[i]), i < n; step 1 as its own contiguous loop.
template <class Elem, class Real>
inline void store_run(const Real* __restrict src, i64 n, i64 step, Elem* __restrict dst) {
  if (step == 1) {
    for (i64 i = 0; i < n; ++i) dst[i] = static_cast<Elem>(src[i]);
  } else {
    for (i64 i = 0; i < n; ++i) dst[i * step] = static_cast<Elem>(src[i]);
  }
}

// Per-thread scratch of at least n doubles (slot 0..4; a caller and its callees use different
// slots), kept between calls.
double* scratch(int slot, i64 n) {
  thread_local std::vector<double> buf[5];
  std::vector<double>& b = buf[slot];
  if (static_cast<i64>(b.size()) < n) b.resize(static_cast<std::size_t>(n));
  return b.data();
}

template <class Real>
void read_row(const TensorView& t, i64 off, i64 n, i64 step, Real* dst) {
  switch (t.dtype) {
    case DType::f32: copy_run(static_cast<const float*>(t.data) + off, n, step, dst); return;
    case DType::f64: copy_run(static_cast<const double*>(t.data) + off, n, step, dst); return;
    case DType::f16: read_run<Real, Eigen::half>(t.data, off, n, step, dst); return;
    case DType::bf16: read_run<Real, Eigen::bfloat16>(t.data, off, n, step, dst); return;
    default: break;
  }
  for (i64 i = 0; i < n; ++i) dst[i] = Real(0);  // unreachable after validation
}

template <class Real>
void write_row(const TensorView& t, i64 off, i64 n, i64 step, const Real* src) {
  switch (t.dtype) {
    case DType::f32: store_run(src, n, step, static_cast<float*>(t.data) + off); return;
    case DType::f64: store_run(src, n, step, static_cast<double*>(t.data) + off); return;
    case DType::f16: {
      Eigen::half* p = static_cast<Eigen::half*>(t.data) + off;
      for (i64 i = 0; i < n; ++i) p[i * step] = Eigen::half(static_cast<float>(src[i]));
      return;
    }
    case DType::bf16: {
      Eigen::bfloat16* p = static_cast<Eigen::bfloat16*>(t.data) + off;
      for (i64 i = 0; i < n; ++i) p[i * step] = Eigen::bfloat16(static_cast<float>(src[i]));
      return;
    }
    default: return;
  }
}

double read_one(const TensorView& t, i64 off) {
  double x;
  read_row<double>(t, off, 1, 1, &x);
  return x;
}

void write_zero_row(const TensorView& t, i64 off, i64 n, i64 step) {
  double* z = scratch(4, n);
  for (i64 i = 0; i < n; ++i) z[i] = 0.0;
  write_row<double>(t, off, n, step, z);
}

// Offset of element [b, t, h, 0] of a [B, T, H, D] tensor (or [b, t, h] of a rank-3 one).
i64 off_bth(const TensorView& t, i64 b, i64 pos, i64 h) {
  return b * t.stride[0] + pos * t.stride[1] + h * t.stride[2];
}

// Position t of the sequence is live.
bool live(const Inputs& in, const SequenceSpan& seq, i64 t) {
  if (!in.mask.defined()) return true;
  const bool* m = static_cast<const bool*>(in.mask.data);
  return m[seq.b * in.mask.stride[0] + (seq.t0 + t) * in.mask.stride[1]];
}

double softplus(double x) {
  return x > 20.0 ? x : std::log1p(std::exp(x));
}
double softplus_grad(double x) {
  return x > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-x));
}
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// Loads x [L, D] for head h of a [B, T, H, D] tensor, L2-normalised when `norm`; masked -> 0.
template <class Real>
void load_heads(const Inputs& in, const TensorView& x, const SequenceSpan& seq, i64 h, i64 D,
                bool norm, double eps, Real* dst) {
  double* row = norm ? scratch(0, D) : nullptr;
  for (i64 t = 0; t < seq.len; ++t) {
    Real* out = dst + t * D;
    if (!live(in, seq, t)) {
      for (i64 i = 0; i < D; ++i) out[i] = Real(0);
      continue;
    }
    const i64 off = off_bth(x, seq.b, seq.t0 + t, h);
    if (!norm) {
      read_row<Real>(x, off, D, x.stride[3], out);
      continue;
    }
    read_row<double>(x, off, D, x.stride[3], row);
    double ss = 0;
    for (i64 i = 0; i < D; ++i) ss += row[i] * row[i];
    const double inv = 1.0 / std::sqrt(ss + eps);
    for (i64 i = 0; i < D; ++i) out[i] = static_cast<Real>(row[i] * inv);
  }
}

// dx for head h from dx_hat [L, D] (L2-norm backward when `norm`); masked -> 0.
template <class Real>
void store_head_grads(const Inputs& in, const TensorView& x, const SequenceSpan& seq, i64 h, i64 D,
                      bool norm, double eps, const Real* dx_hat, const TensorView& dx) {
  double* row = norm ? scratch(0, D) : nullptr;
  double* grad = norm ? scratch(1, D) : nullptr;
  for (i64 t = 0; t < seq.len; ++t) {
    const i64 off = off_bth(dx, seq.b, seq.t0 + t, h);
    if (!live(in, seq, t)) {
      write_zero_row(dx, off, D, dx.stride[3]);
      continue;
    }
    const Real* gh = dx_hat + t * D;
    if (!norm) {
      write_row<Real>(dx, off, D, dx.stride[3], gh);
      continue;
    }
    read_row<double>(x, off_bth(x, seq.b, seq.t0 + t, h), D, x.stride[3], row);
    double ss = 0;
    for (i64 i = 0; i < D; ++i) ss += row[i] * row[i];
    const double r = std::sqrt(ss + eps);
    double dot = 0;  // <x_hat, dx_hat>
    for (i64 i = 0; i < D; ++i) dot += (row[i] / r) * static_cast<double>(gh[i]);
    for (i64 i = 0; i < D; ++i) grad[i] = (static_cast<double>(gh[i]) - (row[i] / r) * dot) / r;
    write_row<double>(dx, off, D, dx.stride[3], grad);
  }
}

// Offset of [n, hv, 0, 0] in a state tensor and the strides of S's (Dk, Dv) indices there.
struct StateIndex {
  i64 base, sk, sv;
};
StateIndex state_index(const TensorView& s, const Options& opts, i64 n, i64 hv) {
  StateIndex ix;
  ix.base = n * s.stride[0] + hv * s.stride[1];
  if (opts.state_layout == StateLayout::k_first) {
    ix.sk = s.stride[2];
    ix.sv = s.stride[3];
  } else {
    ix.sk = s.stride[3];
    ix.sv = s.stride[2];
  }
  return ix;
}

}  // namespace

template <class Real>
void load_keys(const Problem& prob, const Inputs& in, const Options& opts, const SequenceSpan& seq,
               std::int64_t hk, Real* q_hat, Real* k_hat) {
  const double eps = opts.l2norm_eps;
  if (q_hat) load_heads(in, in.q, seq, hk, prob.Dk, opts.qk_l2norm, eps, q_hat);
  if (k_hat) load_heads(in, in.k, seq, hk, prob.Dk, opts.qk_l2norm, eps, k_hat);
}

template <class Real>
void load_values(const Problem& prob, const Inputs& in, const SequenceSpan& seq, std::int64_t hv,
                 Real* v) {
  load_heads(in, in.v, seq, hv, prob.Dv, false, 0.0, v);
}

template <class Real>
void load_gates(const Problem& prob, const Inputs& in, const Options& opts, const SequenceSpan& seq,
                std::int64_t hv, Real* g_log, Real* beta) {
  const i64 width = prob.gate == GateKind::per_key ? prob.Dk : 1;
  double* bias = scratch(0, width);
  double* raw = scratch(1, width);
  for (i64 i = 0; i < width; ++i) bias[i] = 0.0;
  double neg_A = 0.0;  // -exp(A_log[hv])
  if (opts.gate_in_kernel && g_log) {
    neg_A = -std::exp(read_one(in.A_log, hv * in.A_log.stride[0]));
    if (width == 1)
      bias[0] = read_one(in.dt_bias, hv * in.dt_bias.stride[0]);
    else
      read_row<double>(in.dt_bias, hv * in.dt_bias.stride[0], width, in.dt_bias.stride[1], bias);
  }
  for (i64 t = 0; t < seq.len; ++t) {
    const bool ok = live(in, seq, t);
    if (g_log) {
      Real* gt = g_log + t * width;
      if (!ok) {
        for (i64 i = 0; i < width; ++i) gt[i] = Real(0);
      } else {
        const i64 off = off_bth(in.g, seq.b, seq.t0 + t, hv);
        if (width == 1)
          raw[0] = read_one(in.g, off);
        else
          read_row<double>(in.g, off, width, in.g.stride[3], raw);
        for (i64 i = 0; i < width; ++i)
          gt[i] =
              static_cast<Real>(opts.gate_in_kernel ? neg_A * softplus(raw[i] + bias[i]) : raw[i]);
      }
    }
    if (beta) {
      if (!ok) {
        beta[t] = Real(0);
      } else {
        const double b = read_one(in.beta, off_bth(in.beta, seq.b, seq.t0 + t, hv));
        beta[t] = static_cast<Real>(opts.beta_sigmoid ? sigmoid(b) : b);
      }
    }
  }
}

void load_valid(const Problem& prob, const Inputs& in, const SequenceSpan& seq, bool* valid) {
  for (i64 t = 0; t < seq.len; ++t) valid[t] = live(in, seq, t);
}

template <class Real>
void load_state(const Problem& prob, const TensorView& state, const Options& opts, std::int64_t n,
                std::int64_t hv, Real* S) {
  const i64 Dk = prob.Dk, Dv = prob.Dv;
  if (!state.defined()) {
    for (i64 i = 0; i < Dk * Dv; ++i) S[i] = Real(0);
    return;
  }
  const StateIndex ix = state_index(state, opts, n, hv);
  for (i64 i = 0; i < Dk; ++i) read_row<Real>(state, ix.base + i * ix.sk, Dv, ix.sv, S + i * Dv);
}

template <class Real>
void store_output(const Problem& prob, const Inputs& in, const SequenceSpan& seq, std::int64_t hv,
                  const Real* o, const TensorView& out) {
  const i64 Dv = prob.Dv;
  for (i64 t = 0; t < seq.len; ++t) {
    const i64 off = off_bth(out, seq.b, seq.t0 + t, hv);
    if (live(in, seq, t))
      write_row<Real>(out, off, Dv, out.stride[3], o + t * Dv);
    else
      write_zero_row(out, off, Dv, out.stride[3]);
  }
}

template <class Real>
void store_state(const Problem& prob, const Options& opts, std::int64_t n, std::int64_t hv,
                 const Real* S, const TensorView& state) {
  if (!state.defined()) return;
  const i64 Dk = prob.Dk, Dv = prob.Dv;
  const StateIndex ix = state_index(state, opts, n, hv);
  for (i64 i = 0; i < Dk; ++i) write_row<Real>(state, ix.base + i * ix.sk, Dv, ix.sv, S + i * Dv);
}

template <class Real>
void load_dout(const Problem& prob, const Inputs& in, const SequenceSpan& seq, std::int64_t hv,
               const TensorView& dout, Real* dO) {
  const i64 Dv = prob.Dv;
  for (i64 t = 0; t < seq.len; ++t) {
    Real* out = dO + t * Dv;
    if (!live(in, seq, t)) {
      for (i64 i = 0; i < Dv; ++i) out[i] = Real(0);
      continue;
    }
    read_row<Real>(dout, off_bth(dout, seq.b, seq.t0 + t, hv), Dv, dout.stride[3], out);
  }
}

template <class Real>
void store_key_grads(const Problem& prob, const Inputs& in, const Options& opts,
                     const SequenceSpan& seq, std::int64_t hk, const Real* dq_hat,
                     const Real* dk_hat, const TensorView& dq, const TensorView& dk) {
  const double eps = opts.l2norm_eps;
  if (dq.defined() && dq_hat)
    store_head_grads(in, in.q, seq, hk, prob.Dk, opts.qk_l2norm, eps, dq_hat, dq);
  if (dk.defined() && dk_hat)
    store_head_grads(in, in.k, seq, hk, prob.Dk, opts.qk_l2norm, eps, dk_hat, dk);
}

template <class Real>
void store_value_grads(const Problem& prob, const Inputs& in, const SequenceSpan& seq,
                       std::int64_t hv, const Real* dv_buf, const TensorView& dv) {
  if (!dv.defined()) return;
  store_head_grads(in, in.v, seq, hv, prob.Dv, false, 0.0, dv_buf, dv);
}

template <class Real>
void store_gate_grads(const Problem& prob, const Inputs& in, const Options& opts,
                      const SequenceSpan& seq, std::int64_t hv, const Real* dg_log,
                      const Real* dbeta_eff, const TensorView& dg, const TensorView& dbeta,
                      double* dA_log_part, double* ddt_bias_part) {
  const i64 width = prob.gate == GateKind::per_key ? prob.Dk : 1;
  double* bias = scratch(0, width);
  double* raw = scratch(1, width);
  double* out = scratch(2, width);
  double* ddt = scratch(3, width);
  for (i64 i = 0; i < width; ++i) bias[i] = ddt[i] = 0.0;
  double neg_A = 0.0;
  if (opts.gate_in_kernel) {
    neg_A = -std::exp(read_one(in.A_log, hv * in.A_log.stride[0]));
    if (width == 1)
      bias[0] = read_one(in.dt_bias, hv * in.dt_bias.stride[0]);
    else
      read_row<double>(in.dt_bias, hv * in.dt_bias.stride[0], width, in.dt_bias.stride[1], bias);
  }
  double dA = 0.0;
  const bool want_params = opts.gate_in_kernel && (dA_log_part || ddt_bias_part);
  for (i64 t = 0; t < seq.len; ++t) {
    const bool ok = live(in, seq, t);
    if (dg_log && (dg.defined() || want_params)) {
      const i64 off = off_bth(in.g, seq.b, seq.t0 + t, hv);
      const Real* gt = dg_log + t * width;
      if (!ok) {
        for (i64 i = 0; i < width; ++i) out[i] = 0.0;
      } else if (!opts.gate_in_kernel) {
        for (i64 i = 0; i < width; ++i) out[i] = static_cast<double>(gt[i]);
      } else {
        if (width == 1)
          raw[0] = read_one(in.g, off);
        else
          read_row<double>(in.g, off, width, in.g.stride[3], raw);
        for (i64 i = 0; i < width; ++i) {
          const double x = raw[i] + bias[i];
          const double up = static_cast<double>(gt[i]);
          out[i] = up * neg_A * softplus_grad(x);  // dL/da = dL/d(dt_bias)
          dA += up * neg_A * softplus(x);          // dL/dA_log = dL/dg * g
          ddt[i] += out[i];
        }
      }
      if (dg.defined()) {
        const i64 doff = off_bth(dg, seq.b, seq.t0 + t, hv);
        if (width == 1)
          write_row<double>(dg, doff, 1, 1, out);
        else
          write_row<double>(dg, doff, width, dg.stride[3], out);
      }
    }
    if (dbeta_eff && dbeta.defined()) {
      double db = 0.0;
      if (ok) {
        db = static_cast<double>(dbeta_eff[t]);
        if (opts.beta_sigmoid) {
          const double s = sigmoid(read_one(in.beta, off_bth(in.beta, seq.b, seq.t0 + t, hv)));
          db *= s * (1.0 - s);
        }
      }
      write_row<double>(dbeta, off_bth(dbeta, seq.b, seq.t0 + t, hv), 1, 1, &db);
    }
  }
  if (dA_log_part) *dA_log_part = opts.gate_in_kernel ? dA : 0.0;
  if (ddt_bias_part)
    for (i64 i = 0; i < width; ++i) ddt_bias_part[i] = opts.gate_in_kernel ? ddt[i] : 0.0;
}

void store_gate_param_grads(const Problem& prob, const double* dA_log_sum,
                            const double* ddt_bias_sum, const TensorView& dA_log,
                            const TensorView& ddt_bias) {
  if (dA_log.defined() && dA_log_sum)
    write_row<double>(dA_log, 0, prob.Hv, dA_log.stride[0], dA_log_sum);
  if (ddt_bias.defined() && ddt_bias_sum) {
    if (ddt_bias.rank == 1) {
      write_row<double>(ddt_bias, 0, prob.Hv, ddt_bias.stride[0], ddt_bias_sum);
    } else {
      for (i64 h = 0; h < prob.Hv; ++h)
        write_row<double>(ddt_bias, h * ddt_bias.stride[0], prob.Dk, ddt_bias.stride[1],
                          ddt_bias_sum + h * prob.Dk);
    }
  }
}

#define GDR_CANONICAL_INSTANTIATE(Real)                                                            \
  template void load_keys<Real>(const Problem&, const Inputs&, const Options&,                     \
                                const SequenceSpan&, std::int64_t, Real*, Real*);                  \
  template void load_values<Real>(const Problem&, const Inputs&, const SequenceSpan&,              \
                                  std::int64_t, Real*);                                            \
  template void load_gates<Real>(const Problem&, const Inputs&, const Options&,                    \
                                 const SequenceSpan&, std::int64_t, Real*, Real*);                 \
  template void load_state<Real>(const Problem&, const TensorView&, const Options&, std::int64_t,  \
                                 std::int64_t, Real*);                                             \
  template void store_output<Real>(const Problem&, const Inputs&, const SequenceSpan&,             \
                                   std::int64_t, const Real*, const TensorView&);                  \
  template void store_state<Real>(const Problem&, const Options&, std::int64_t, std::int64_t,      \
                                  const Real*, const TensorView&);                                 \
  template void load_dout<Real>(const Problem&, const Inputs&, const SequenceSpan&, std::int64_t,  \
                                const TensorView&, Real*);                                         \
  template void store_key_grads<Real>(const Problem&, const Inputs&, const Options&,               \
                                      const SequenceSpan&, std::int64_t, const Real*, const Real*, \
                                      const TensorView&, const TensorView&);                       \
  template void store_value_grads<Real>(const Problem&, const Inputs&, const SequenceSpan&,        \
                                        std::int64_t, const Real*, const TensorView&);             \
  template void store_gate_grads<Real>(                                                            \
      const Problem&, const Inputs&, const Options&, const SequenceSpan&, std::int64_t,            \
      const Real*, const Real*, const TensorView&, const TensorView&, double*, double*);

GDR_CANONICAL_INSTANTIATE(float)
GDR_CANONICAL_INSTANTIATE(double)
#undef GDR_CANONICAL_INSTANTIATE

}  // namespace gdr::cpu
