// Validation of every entry point (docs/operator.md §6): rank and shape of every tensor, matching
// B/T/heads/dims, Hv % Hk, dtypes, one device, last-dim contiguity, cu_seqlens, h0 rows == N,
// mask shape, the fused options. Nothing here reads tensor memory except cu_seqlens,
// state_indices and g (g <= 0, core/values.h) when they live on the host.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/heuristics.h"
#include "core/values.h"
#include "gdr/error.h"
#include "gdr/problem.h"

namespace gdr {
namespace {

using i64 = std::int64_t;

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw InvalidArgument(std::string(op) + ": " + what);
}

std::string shape_str(const TensorView& t) {
  std::string s = "[";
  const int rank = t.rank < 0 ? 0 : (t.rank > kMaxRank ? kMaxRank : t.rank);
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

std::string device_str(DeviceType d, int index) {
  std::string s(to_string(d));
  if (d == DeviceType::cuda) {
    s += ':';
    s += std::to_string(index);
  }
  return s;
}

bool is_float(DType d) {
  return d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::f64;
}

// One expected dimension: its size and the symbol it stands for ("B", "T", "Hk", ...).
struct Dim {
  i64 size;
  const char* symbol;
};

// Checks validity of the memory description of `t` (rank, strides, data pointer) and that
// it lives on the call's device. The first tensor checked (q, or state for decode) fixes the
// device.
struct Checker {
  const char* op;
  DeviceType device = DeviceType::cpu;
  int device_index = 0;
  bool device_set = false;
  const char* device_from = "";

  void basic(const char* name, const TensorView& t) {
    if (t.rank < 1 || t.rank > kMaxRank)
      fail(op, std::string(name) + " has rank " + std::to_string(t.rank) + "; must be 1.." +
                   std::to_string(kMaxRank));
    for (int d = 0; d < t.rank; ++d) {
      if (t.shape[d] < 0)
        fail(op, std::string(name) + " has size " + std::to_string(t.shape[d]) + " in dim " +
                     std::to_string(d) + "; sizes must be >= 0");
      if (t.stride[d] < 0)
        fail(op, std::string(name) + " has stride " + std::to_string(t.stride[d]) + " in dim " +
                     std::to_string(d) + "; strides must be >= 0");
    }
    const i64 last = t.stride[t.rank - 1];
    if (last != 1 && t.shape[t.rank - 1] > 1)
      fail(op, std::string(name) + " has stride " + std::to_string(last) +
                   " in its last dim; the last dim must be contiguous (stride 1)");
    if (t.data == nullptr && t.numel() > 0)
      fail(op, std::string(name) + " has no data (null pointer) for " + std::to_string(t.numel()) +
                   " elements");
    if (t.device == DeviceType::cuda && t.device_index < 0)
      fail(op, std::string(name) + " is on cuda:" + std::to_string(t.device_index) +
                   "; device index must be >= 0");
    if (!device_set) {
      device = t.device;
      device_index = t.device == DeviceType::cuda ? t.device_index : 0;
      device_set = true;
      device_from = name;
    } else {
      const bool same =
          t.device == device && (device != DeviceType::cuda || t.device_index == device_index);
      if (!same)
        fail(op, std::string(name) + " is on " + device_str(t.device, t.device_index) +
                     "; all tensors must be on one device (" + device_from + " is on " +
                     device_str(device, device_index) + ")");
    }
  }

  // Rank, shape (named dims) and device.
  void shape(const char* name, const TensorView& t, std::initializer_list<Dim> dims) {
    std::string want = "[", want_sizes = "[";
    bool first = true;
    for (const Dim& d : dims) {
      if (!first) want += ", ", want_sizes += ", ";
      first = false;
      want += d.symbol;
      want_sizes += std::to_string(d.size);
    }
    want += "]", want_sizes += "]";
    if (t.rank != static_cast<int>(dims.size()))
      fail(op, std::string(name) + " has rank " + std::to_string(t.rank) + " (shape " +
                   shape_str(t) + "); expected " + want + " = " + want_sizes);
    basic(name, t);
    int i = 0;
    for (const Dim& d : dims) {
      if (t.shape[i] != d.size)
        fail(op, std::string(name) + " has shape " + shape_str(t) + "; expected " + want + " = " +
                     want_sizes + " (" + d.symbol + " is " + std::to_string(d.size) + ", got " +
                     std::to_string(t.shape[i]) + ")");
      ++i;
    }
  }
};

void check_dtype(Checker& c, const char* name, const TensorView& t, const std::vector<DType>& ok) {
  for (DType d : ok)
    if (t.dtype == d) return;
  std::string list;
  for (DType d : ok) {
    if (!list.empty()) list += " or ";
    list += to_string(d);
  }
  fail(c.op,
       std::string(name) + " has dtype " + std::string(to_string(t.dtype)) + "; expected " + list);
}

std::vector<DType> state_allowed(DType input) {
  if (input == DType::f64) return {DType::f32, DType::f64};
  return {DType::f32};
}

// A decode pool may also hold bfloat16 (half the bytes of the serving step; computed in fp32,
// rounded to nearest even on store).
std::vector<DType> pool_allowed(DType input) {
  if (input == DType::f64) return state_allowed(input);
  return {DType::f32, DType::bf16};
}

std::vector<DType> gate_allowed(DType input) {
  if (input == DType::f32) return {DType::f32};
  return {DType::f32, input};
}

// The q/k/v/g/beta/A_log/dt_bias/mask part shared by forward, backward and decode (h0 and
// cu_seqlens are not read here). Fills B, T, Hk, Hv, Dk, Dv, gate, dtype, device, scale,
// has_mask.
void check_core(Checker& c, Problem& prob, const Inputs& in, const Options& opts) {
  const char* op = c.op;
  const TensorView &q = in.q, &k = in.k, &v = in.v, &g = in.g, &beta = in.beta;
  const TensorView &A_log = in.A_log, &dt_bias = in.dt_bias, &mask = in.mask;
  if (!q.defined()) fail(op, "q is not given; it is required");
  if (q.rank != 4)
    fail(op, "q has rank " + std::to_string(q.rank) + " (shape " + shape_str(q) +
                 "); expected [B, T, Hk, Dk]");
  c.basic("q", q);
  if (!is_float(q.dtype))
    fail(op, "q has dtype " + std::string(to_string(q.dtype)) +
                 "; expected float32, float16, bfloat16 or float64");
  if (q.dtype == DType::f64 && q.device != DeviceType::cpu)
    fail(op, "q has dtype float64 on " + device_str(q.device, q.device_index) +
                 "; float64 is supported on the cpu only");
  prob.B = q.shape[0];
  prob.T = q.shape[1];
  prob.Hk = q.shape[2];
  prob.Dk = q.shape[3];
  prob.dtype = q.dtype;
  prob.device = c.device;
  prob.device_index = c.device_index;
  if (prob.Hk < 1) fail(op, "q has " + std::to_string(prob.Hk) + " heads; Hk must be >= 1");
  if (prob.Dk < 1) fail(op, "q has head dim " + std::to_string(prob.Dk) + "; Dk must be >= 1");

  if (!k.defined()) fail(op, "k is not given; it is required");
  c.shape("k", k, {{prob.B, "B"}, {prob.T, "T"}, {prob.Hk, "Hk"}, {prob.Dk, "Dk"}});
  check_dtype(c, "k", k, {q.dtype});

  if (!v.defined()) fail(op, "v is not given; it is required");
  if (v.rank != 4)
    fail(op, "v has rank " + std::to_string(v.rank) + " (shape " + shape_str(v) +
                 "); expected [B, T, Hv, Dv]");
  c.basic("v", v);
  prob.Hv = v.shape[2];
  prob.Dv = v.shape[3];
  if (prob.Hv < 1) fail(op, "v has " + std::to_string(prob.Hv) + " heads; Hv must be >= 1");
  if (prob.Hv % prob.Hk != 0)
    fail(op, "v has " + std::to_string(prob.Hv) +
                 " heads; Hv must be a multiple of Hk=" + std::to_string(prob.Hk));
  if (prob.Dv < 1) fail(op, "v has head dim " + std::to_string(prob.Dv) + "; Dv must be >= 1");
  c.shape("v", v, {{prob.B, "B"}, {prob.T, "T"}, {prob.Hv, "Hv"}, {prob.Dv, "Dv"}});
  check_dtype(c, "v", v, {q.dtype});

  const char* gname = opts.gate_in_kernel ? "g (raw a, gate_in_kernel)" : "g";
  if (!g.defined()) fail(op, "g is not given; it is required");
  if (g.rank == 3) {
    prob.gate = GateKind::scalar;
    c.shape(gname, g, {{prob.B, "B"}, {prob.T, "T"}, {prob.Hv, "Hv"}});
  } else if (g.rank == 4) {
    prob.gate = GateKind::per_key;
    c.shape(gname, g, {{prob.B, "B"}, {prob.T, "T"}, {prob.Hv, "Hv"}, {prob.Dk, "Dk"}});
  } else {
    fail(op, "g has rank " + std::to_string(g.rank) + " (shape " + shape_str(g) +
                 "); expected [B, T, Hv] (scalar gate) or [B, T, Hv, Dk] (per-key gate)");
  }
  check_dtype(c, "g", g, gate_allowed(q.dtype));
  if (!opts.gate_in_kernel && g.device == DeviceType::cpu) {
    const PositiveGate found = first_positive_host(g);
    if (found.index >= 0) refuse_positive_gate(op, g, found);
  }

  if (!beta.defined()) fail(op, "beta is not given; it is required");
  c.shape("beta", beta, {{prob.B, "B"}, {prob.T, "T"}, {prob.Hv, "Hv"}});
  check_dtype(c, "beta", beta, gate_allowed(q.dtype));

  if (opts.gate_in_kernel) {
    if (!A_log.defined()) fail(op, "A_log is not given; gate_in_kernel requires A_log [Hv]");
    c.shape("A_log", A_log, {{prob.Hv, "Hv"}});
    check_dtype(c, "A_log", A_log, state_allowed(q.dtype));
    if (!dt_bias.defined())
      fail(op, prob.gate == GateKind::scalar
                   ? "dt_bias is not given; gate_in_kernel requires dt_bias [Hv]"
                   : "dt_bias is not given; gate_in_kernel with a per-key gate requires dt_bias "
                     "[Hv, Dk]");
    if (prob.gate == GateKind::scalar) {
      if (dt_bias.rank != 1)
        fail(op, "dt_bias has shape " + shape_str(dt_bias) +
                     "; expected [Hv] for a scalar gate (g is [B, T, Hv])");
      c.shape("dt_bias", dt_bias, {{prob.Hv, "Hv"}});
    } else {
      if (dt_bias.rank != 2)
        fail(op, "dt_bias has shape " + shape_str(dt_bias) +
                     "; expected [Hv, Dk] for a per-key gate (g is [B, T, Hv, Dk])");
      c.shape("dt_bias", dt_bias, {{prob.Hv, "Hv"}, {prob.Dk, "Dk"}});
    }
    check_dtype(c, "dt_bias", dt_bias, state_allowed(q.dtype));
  } else {
    if (A_log.defined())
      fail(op, "A_log is given but gate_in_kernel is off; pass A_log only with gate_in_kernel");
    if (dt_bias.defined())
      fail(op, "dt_bias is given but gate_in_kernel is off; pass dt_bias only with gate_in_kernel");
  }

  if (mask.defined()) {
    c.shape("mask", mask, {{prob.B, "B"}, {prob.T, "T"}});
    check_dtype(c, "mask", mask, {DType::boolean});
    prob.has_mask = true;
  }

  if (!std::isfinite(opts.scale))
    fail(op, "scale is " + std::to_string(opts.scale) + "; must be finite (0 means 1/sqrt(Dk))");
  prob.scale = opts.scale != 0.0f
                   ? opts.scale
                   : static_cast<float>(1.0 / std::sqrt(static_cast<double>(prob.Dk)));
  if (opts.qk_l2norm && !(std::isfinite(opts.l2norm_eps) && opts.l2norm_eps >= 0.0f))
    fail(op, "l2norm_eps is " + std::to_string(opts.l2norm_eps) + "; must be finite and >= 0");
  if (opts.state_layout != StateLayout::k_first && opts.state_layout != StateLayout::v_first)
    fail(op, "state_layout is " + std::to_string(static_cast<int>(opts.state_layout)) +
                 "; expected k_first or v_first");
}

// cu_seqlens: rank 1, [N + 1], B == 1, values checked on the host. Fills N and varlen.
void check_varlen(Checker& c, Problem& prob, const TensorView& cu) {
  const char* op = c.op;
  if (!cu.defined()) {
    prob.N = prob.B;
    prob.varlen = false;
    return;
  }
  if (cu.rank != 1)
    fail(op, "cu_seqlens has rank " + std::to_string(cu.rank) + " (shape " + shape_str(cu) +
                 "); expected [N + 1]");
  c.basic("cu_seqlens", cu);
  check_dtype(c, "cu_seqlens", cu, {DType::i32, DType::i64});
  if (cu.shape[0] < 1)
    fail(op, "cu_seqlens has length 0; expected N + 1 >= 1 entries (0 = c_0 <= ... <= c_N = T)");
  if (prob.B != 1)
    fail(op, "q has batch " + std::to_string(prob.B) + " with cu_seqlens; varlen requires B == 1");
  prob.N = cu.shape[0] - 1;
  prob.varlen = true;
  if (cu.device == DeviceType::cpu)
    check_cu_seqlens_values(cu.data, cu.dtype, cu.shape[0], prob.T, op);
}

// A state-shaped tensor ([N, Hv, Dk, Dv] k-first or [N, Hv, Dv, Dk] v-first).
void check_state(Checker& c, const Problem& prob, const char* name, const TensorView& t, i64 rows,
                 const char* rows_symbol, const Options& opts, bool pool = false) {
  if (opts.state_layout == StateLayout::k_first)
    c.shape(name, t, {{rows, rows_symbol}, {prob.Hv, "Hv"}, {prob.Dk, "Dk"}, {prob.Dv, "Dv"}});
  else
    c.shape(name, t, {{rows, rows_symbol}, {prob.Hv, "Hv"}, {prob.Dv, "Dv"}, {prob.Dk, "Dk"}});
  check_dtype(c, name, t, pool ? pool_allowed(prob.dtype) : state_allowed(prob.dtype));
}

// The inputs shared by forward and backward.
Problem check_inputs(Checker& c, const Inputs& in, const Options& opts) {
  Problem prob;
  check_core(c, prob, in, opts);
  check_varlen(c, prob, in.cu_seqlens);
  if (in.h0.defined()) {
    check_state(c, prob, "h0", in.h0, prob.N, "N", opts);
    prob.has_h0 = true;
  }
  return prob;
}

// A gradient: optional; when given, its input's shape and dtype.
void check_like(Checker& c, const char* name, const TensorView& grad, const char* of,
                const TensorView& input) {
  if (!grad.defined()) return;
  c.basic(name, grad);
  if (grad.rank != input.rank) {
    fail(c.op, std::string(name) + " has shape " + shape_str(grad) + "; expected the shape of " +
                   of + " " + shape_str(input));
  }
  for (int i = 0; i < grad.rank; ++i)
    if (grad.shape[i] != input.shape[i])
      fail(c.op, std::string(name) + " has shape " + shape_str(grad) + "; expected the shape of " +
                     of + " " + shape_str(input));
  if (grad.dtype != input.dtype)
    fail(c.op, std::string(name) + " has dtype " + std::string(to_string(grad.dtype)) +
                   "; expected the dtype of " + of + " (" + std::string(to_string(input.dtype)) +
                   ")");
}

template <class Int>
void check_cu_values(const Int* c, i64 count, i64 T, const char* op) {
  if (c[0] != 0) fail(op, "cu_seqlens[0] is " + std::to_string(c[0]) + "; must be 0");
  for (i64 i = 1; i < count; ++i)
    if (c[i] < c[i - 1])
      fail(op, "cu_seqlens[" + std::to_string(i) + "] is " + std::to_string(c[i]) +
                   " < cu_seqlens[" + std::to_string(i - 1) + "] = " + std::to_string(c[i - 1]) +
                   "; must be non-decreasing");
  if (static_cast<i64>(c[count - 1]) != T)
    fail(op, "cu_seqlens[" + std::to_string(count - 1) + "] is " + std::to_string(c[count - 1]) +
                 "; must equal T=" + std::to_string(T));
}

template <class Int>
void check_index_values(const Int* idx, i64 B, i64 P, const char* op) {
  for (i64 b = 0; b < B; ++b)
    if (static_cast<i64>(idx[b]) >= P)
      fail(op, "state_indices[" + std::to_string(b) + "] is " + std::to_string(idx[b]) +
                   "; must be < P=" + std::to_string(P) + " (negative skips the row)");
}

}  // namespace

void check_cu_seqlens_values(const void* host_data, DType dtype, std::int64_t count, std::int64_t T,
                             const char* op) {
  if (count < 1)
    fail(op, "cu_seqlens has length " + std::to_string(count) + "; expected N + 1 >= 1 entries");
  if (dtype == DType::i32)
    check_cu_values(static_cast<const std::int32_t*>(host_data), count, T, op);
  else if (dtype == DType::i64)
    check_cu_values(static_cast<const std::int64_t*>(host_data), count, T, op);
  else
    fail(op, "cu_seqlens has dtype " + std::string(to_string(dtype)) + "; expected int32 or int64");
}

Problem validate_forward(const ForwardParams& p, const char* op) {
  Checker c{op};
  Problem prob = check_inputs(c, p.in, p.opts);
  if (!p.o.defined()) fail(op, "o is not given; it is required (the output)");
  c.shape("o", p.o, {{prob.B, "B"}, {prob.T, "T"}, {prob.Hv, "Hv"}, {prob.Dv, "Dv"}});
  check_dtype(c, "o", p.o, {prob.dtype});
  if (p.final_state.defined()) {
    check_state(c, prob, "final_state", p.final_state, prob.N, "N", p.opts);
    prob.has_final_state = true;
  }
  return prob;
}

Problem validate_backward(const BackwardParams& p, const char* op) {
  Checker c{op};
  Problem prob = check_inputs(c, p.in, p.opts);
  if (!p.dout.defined()) fail(op, "dout is not given; it is required (the gradient of o)");
  c.shape("dout", p.dout, {{prob.B, "B"}, {prob.T, "T"}, {prob.Hv, "Hv"}, {prob.Dv, "Dv"}});
  check_dtype(c, "dout", p.dout, {prob.dtype});
  if (p.dfinal_state.defined()) {
    check_state(c, prob, "dfinal_state", p.dfinal_state, prob.N, "N", p.opts);
    prob.has_final_state = true;
  }
  check_like(c, "dq", p.dq, "q", p.in.q);
  check_like(c, "dk", p.dk, "k", p.in.k);
  check_like(c, "dv", p.dv, "v", p.in.v);
  check_like(c, "dg", p.dg, "g", p.in.g);
  check_like(c, "dbeta", p.dbeta, "beta", p.in.beta);
  if (!p.opts.gate_in_kernel) {
    if (p.dA_log.defined())
      fail(op, "dA_log is given but gate_in_kernel is off; pass dA_log only with gate_in_kernel");
    if (p.ddt_bias.defined())
      fail(op,
           "ddt_bias is given but gate_in_kernel is off; pass ddt_bias only with gate_in_kernel");
  }
  check_like(c, "dA_log", p.dA_log, "A_log", p.in.A_log);
  check_like(c, "ddt_bias", p.ddt_bias, "dt_bias", p.in.dt_bias);
  if (p.dh0.defined() && !p.in.h0.defined())
    fail(op, "dh0 is given but h0 is not; pass dh0 only with h0");
  check_like(c, "dh0", p.dh0, "h0", p.in.h0);
  return prob;
}

Problem validate_decode(const DecodeParams& p, const char* op) {
  Checker c{op};
  Problem prob;
  check_core(c, prob, p.inputs(), p.opts);
  if (prob.T > 16)
    fail(op, "q has " + std::to_string(prob.T) +
                 " tokens; decode takes T between 0 and 16 (use gdr.forward for longer sequences)");
  prob.N = prob.B;
  if (!p.state.defined()) fail(op, "state is not given; it is required (read and written)");
  if (p.state.rank != 4)
    fail(op,
         "state has rank " + std::to_string(p.state.rank) + " (shape " + shape_str(p.state) +
             "); expected " +
             (p.opts.state_layout == StateLayout::k_first ? "[P, Hv, Dk, Dv]" : "[P, Hv, Dv, Dk]"));
  c.basic("state", p.state);
  prob.P = p.state.shape[0];
  check_state(c, prob, "state", p.state, prob.P, "P", p.opts, /*pool=*/true);
  prob.has_h0 = true;
  prob.has_final_state = true;
  if (p.state_indices.defined()) {
    c.shape("state_indices", p.state_indices, {{prob.B, "B"}});
    check_dtype(c, "state_indices", p.state_indices, {DType::i32, DType::i64});
    if (p.state_indices.device == DeviceType::cpu) {
      if (p.state_indices.dtype == DType::i32)
        check_index_values(static_cast<const std::int32_t*>(p.state_indices.data), prob.B, prob.P,
                           op);
      else
        check_index_values(static_cast<const std::int64_t*>(p.state_indices.data), prob.B, prob.P,
                           op);
    }
  } else if (prob.P < prob.B) {
    fail(op, "state has " + std::to_string(prob.P) +
                 " rows; without state_indices P must be >= B=" + std::to_string(prob.B));
  }
  if (!p.o.defined()) fail(op, "o is not given; it is required (the output)");
  c.shape("o", p.o, {{prob.B, "B"}, {prob.T, "T"}, {prob.Hv, "Hv"}, {prob.Dv, "Dv"}});
  check_dtype(c, "o", p.o, {prob.dtype});
  return prob;
}

SavedShape saved_shape(const Problem& prob, int chunk_size, SavedContent content, const char* op) {
  if (!heuristics::is_supported_chunk(chunk_size))
    fail(op, "chunk_size is " + std::to_string(chunk_size) + "; supported: 16, 32, 64");
  const i64 C = chunk_size;
  SavedShape s;
  // Non-varlen: B sequences of T tokens, ceil(T / C) chunks each. Varlen: ceil(L / C) <=
  // (L + C - 1) / C, so sum_n ceil(L_n / C) <= floor((T + N (C - 1)) / C) whatever the lengths.
  s.chunk_rows = prob.varlen ? (prob.T + prob.N * (C - 1)) / C : prob.B * ((prob.T + C - 1) / C);
  s.Hv = prob.Hv;
  // S [Dk, Dv] (chunk_states), then Tinv [C, C] | Vnew [C, Dv] (chunk_intermediates).
  s.record = prob.Dk * prob.Dv;
  if (content == SavedContent::chunk_intermediates) s.record += C * C + C * prob.Dv;
  s.dtype = prob.dtype == DType::f64 ? DType::f64 : DType::f32;
  s.content = content;
  return s;
}

void validate_saved(const Problem& prob, const TensorView& saved, int chunk_size, const char* op) {
  Checker c{op};
  c.device = prob.device;
  c.device_index = prob.device_index;
  c.device_set = true;
  c.device_from = "q";
  const SavedShape states = saved_shape(prob, chunk_size, SavedContent::chunk_states, op);
  const SavedShape full = saved_shape(prob, chunk_size, SavedContent::chunk_intermediates, op);
  const std::string expected =
      "expected [chunk_rows, Hv, record] = [" + std::to_string(states.chunk_rows) + ", " +
      std::to_string(states.Hv) + ", " + std::to_string(states.record) + " or " +
      std::to_string(full.record) +
      "] (chunk_rows = " + (prob.varlen ? "floor((T + N (C - 1)) / C)" : "B ceil(T / C)") +
      ", record = Dk Dv for chunk states or Dk Dv + C^2 + C Dv for chunk "
      "intermediates, with C = chunk_size = " +
      std::to_string(chunk_size) + "; gdr::saved_shape gives it)";
  if (saved.rank != 3)
    fail(op, "saved has rank " + std::to_string(saved.rank) + " (shape " + shape_str(saved) +
                 "); " + expected);
  c.basic("saved", saved);
  if (saved.shape[0] != states.chunk_rows || saved.shape[1] != states.Hv ||
      (saved.shape[2] != states.record && saved.shape[2] != full.record))
    fail(op, "saved has shape " + shape_str(saved) + "; " + expected);
  // bf16 chunk states: CUDA tensors with 16-bit inputs (half the bytes; the CUDA backward reads
  // them widened to fp32; docs/cuda-chunked.md §Backward memory), 16-byte aligned rows.
  const bool bf16_allowed = prob.device == DeviceType::cuda &&
                            (prob.dtype == DType::bf16 || prob.dtype == DType::f16) &&
                            saved.shape[2] == states.record;
  if (saved.dtype == DType::bf16 && bf16_allowed) {
    const auto addr = reinterpret_cast<std::uintptr_t>(saved.data);
    if (addr % 16 != 0 || saved.stride[0] % 8 != 0 || saved.stride[1] % 8 != 0)
      fail(op, "saved is bfloat16 with rows not 16-byte aligned (data % 16 = " +
                   std::to_string(addr % 16) + ", strides " + std::to_string(saved.stride[0]) +
                   ", " + std::to_string(saved.stride[1]) +
                   "); bfloat16 chunk states need 16-byte aligned rows (strides multiples of 8)");
    return;
  }
  if (saved.dtype == DType::bf16)
    fail(op, std::string("saved has dtype bfloat16; bfloat16 chunk states are taken only for CUDA "
                         "tensors with float16 or bfloat16 inputs and chunk states (record Dk Dv); "
                         "here ") +
                 (prob.device == DeviceType::cuda ? "" : "on the CPU, ") + "inputs " +
                 std::string(to_string(prob.dtype)) + ", record " + std::to_string(saved.shape[2]) +
                 ": expected " + std::string(to_string(states.dtype)));
  check_dtype(c, "saved", saved, {states.dtype});
}

SequenceSpan sequence_span(const Problem& prob, const Inputs& in, std::int64_t n) {
  SequenceSpan s;
  if (!prob.varlen) {
    s.b = n;
    s.t0 = 0;
    s.len = prob.T;
    return s;
  }
  const TensorView& cu = in.cu_seqlens;
  i64 lo, hi;
  if (cu.dtype == DType::i32) {
    const auto* c = static_cast<const std::int32_t*>(cu.data);
    lo = c[n];
    hi = c[n + 1];
  } else {
    const auto* c = static_cast<const std::int64_t*>(cu.data);
    lo = c[n];
    hi = c[n + 1];
  }
  s.b = 0;
  s.t0 = lo;
  s.len = hi - lo;
  return s;
}

}  // namespace gdr
