#include "support.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace gdr::test {

std::string_view to_string(Decay d) {
  switch (d) {
    case Decay::mild: return "mild";
    case Decay::strong: return "strong";
    case Decay::extreme: return "extreme";
  }
  return "unknown decay";
}

std::uint64_t fresh_seed() {
  std::random_device rd;
  std::uint64_t s = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return s == 0 ? 1 : s;
}

std::string describe(const Case& c, std::uint64_t seed) {
  std::ostringstream s;
  s << "B=" << c.B << " T=" << c.T;
  if (!c.seqlens.empty()) {
    s << " seqlens=[";
    for (std::size_t i = 0; i < c.seqlens.size(); ++i) s << (i ? "," : "") << c.seqlens[i];
    s << "]" << (c.cu_seqlens_i64 ? "i64" : "i32");
  }
  s << " Hk=" << c.Hk << " Hv=" << c.Hv << " Dk=" << c.Dk << " Dv=" << c.Dv << " "
    << gdr::to_string(c.gate) << " " << to_string(c.decay) << " " << gdr::to_string(c.dtype);
  if (c.gates_in_dtype) s << " gates_in_dtype";
  if (c.mask) s << " mask";
  if (c.h0) s << " h0";
  if (c.final_state) s << " final_state";
  if (c.layout == StateLayout::v_first) s << " v_first";
  if (c.gate_in_kernel) s << " gate_in_kernel";
  if (c.beta_sigmoid) s << " beta_sigmoid";
  if (c.qk_l2norm) s << " qk_l2norm";
  if (c.scale != 0.0f) s << " scale=" << c.scale;
  if (c.strided) s << " strided";
  if (c.bf16_state) s << " bf16_state";
  s << " seed=" << (seed ? seed : c.seed);
  return s.str();
}

// ---- HostTensor ----

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape, std::int64_t pad_last)
    : dtype_(dtype), shape_(std::move(shape)), pad_(pad_last) {
  if (shape_.empty() || shape_.size() > static_cast<std::size_t>(kMaxRank))
    throw std::invalid_argument("HostTensor: rank must be 1..4");
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < shape_.size(); ++i) rows *= shape_[i];
  const std::int64_t elems = rows * (shape_.back() + pad_);
  const std::int64_t bytes = elems * dtype_size(dtype_);
  storage_.assign(static_cast<std::size_t>((bytes + 7) / 8 + 1), 0);
}

std::int64_t HostTensor::numel() const {
  if (!defined()) return 0;
  std::int64_t n = 1;
  for (std::int64_t s : shape_) n *= s;
  return n;
}

TensorView HostTensor::view() const {
  TensorView t;
  if (!defined()) return t;
  t.data = data();
  t.dtype = dtype_;
  t.device = DeviceType::cpu;
  t.rank = static_cast<int>(shape_.size());
  std::int64_t step = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.shape[d] = shape_[d];
    t.stride[d] = step;
    step *= (d == t.rank - 1) ? shape_[d] + pad_ : shape_[d];
  }
  return t;
}

std::int64_t HostTensor::offset(std::int64_t i) const {
  if (pad_ == 0) return i;
  const std::int64_t last = shape_.back();
  return (i / last) * (last + pad_) + i % last;
}

namespace {

double read_elem(const void* base, DType dtype, std::int64_t off) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(base)[off];
    case DType::f64: return static_cast<const double*>(base)[off];
    case DType::f16: return static_cast<double>(static_cast<const Eigen::half*>(base)[off]);
    case DType::bf16: return static_cast<double>(static_cast<const Eigen::bfloat16*>(base)[off]);
    case DType::i32: return static_cast<const std::int32_t*>(base)[off];
    case DType::i64: return static_cast<double>(static_cast<const std::int64_t*>(base)[off]);
    case DType::boolean: return static_cast<const bool*>(base)[off] ? 1.0 : 0.0;
  }
  return 0.0;
}

void write_elem(void* base, DType dtype, std::int64_t off, double v) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[off] = static_cast<float>(v); return;
    case DType::f64: static_cast<double*>(base)[off] = v; return;
    case DType::f16:
      static_cast<Eigen::half*>(base)[off] = Eigen::half(static_cast<float>(v));
      return;
    case DType::bf16:
      static_cast<Eigen::bfloat16*>(base)[off] = Eigen::bfloat16(static_cast<float>(v));
      return;
    case DType::i32: static_cast<std::int32_t*>(base)[off] = static_cast<std::int32_t>(v); return;
    case DType::i64: static_cast<std::int64_t*>(base)[off] = static_cast<std::int64_t>(v); return;
    case DType::boolean: static_cast<bool*>(base)[off] = v != 0.0; return;
  }
}

bool is_float_dtype(DType d) {
  return d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16;
}

}  // namespace

double HostTensor::get(std::int64_t i) const {
  return read_elem(data(), dtype_, offset(i));
}
void HostTensor::set(std::int64_t i, double value) {
  write_elem(data(), dtype_, offset(i), value);
}

std::vector<double> HostTensor::to_double() const {
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) out[i] = get(i);
  return out;
}

void HostTensor::from_double(const std::vector<double>& values) {
  if (static_cast<std::int64_t>(values.size()) != numel())
    throw std::invalid_argument("HostTensor::from_double: size mismatch");
  for (std::int64_t i = 0; i < numel(); ++i) set(i, values[i]);
}

void HostTensor::fill(double value) {
  for (std::int64_t i = 0; i < numel(); ++i) set(i, value);
}

void HostTensor::poison() {
  if (!defined() || !is_float_dtype(dtype_)) return;
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < shape_.size(); ++i) rows *= shape_[i];
  const std::int64_t elems = rows * (shape_.back() + pad_);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::int64_t e = 0; e < elems; ++e) write_elem(data(), dtype_, e, nan);
}

// ---- TestData ----

Options TestData::options() const {
  Options opts;
  opts.scale = c.scale;
  opts.state_layout = c.layout;
  opts.gate_in_kernel = c.gate_in_kernel;
  opts.beta_sigmoid = c.beta_sigmoid;
  opts.qk_l2norm = c.qk_l2norm;
  return opts;
}

Inputs TestData::inputs() const {
  Inputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  in.g = g.view();
  in.beta = beta.view();
  in.A_log = A_log.view();
  in.dt_bias = dt_bias.view();
  in.h0 = h0.view();
  in.mask = mask.view();
  in.cu_seqlens = cu_seqlens.view();
  return in;
}

ForwardParams TestData::forward_params() const {
  ForwardParams p;
  p.in = inputs();
  p.o = o.view();
  p.final_state = final_state.view();
  p.opts = options();
  return p;
}

BackwardParams TestData::backward_params() const {
  BackwardParams p;
  p.in = inputs();
  p.dout = dout.view();
  p.dfinal_state = dfinal_state.view();
  p.dq = dq.view();
  p.dk = dk.view();
  p.dv = dv.view();
  p.dg = dg.view();
  p.dbeta = dbeta.view();
  p.dA_log = dA_log.view();
  p.ddt_bias = ddt_bias.view();
  p.dh0 = dh0.view();
  p.opts = options();
  return p;
}

namespace {

std::vector<std::int64_t> state_shape(const TestData& d) {
  const Case& c = d.c;
  if (c.layout == StateLayout::k_first) return {d.N, c.Hv, c.Dk, c.Dv};
  return {d.N, c.Hv, c.Dv, c.Dk};
}

// Normal entries, then each row of `inner` elements scaled to unit L2 norm when `normalise`.
void fill_normal(HostTensor& t, std::mt19937_64& rng, double sd, bool normalise,
                 std::int64_t inner) {
  std::normal_distribution<double> n(0.0, sd);
  std::vector<double> x(static_cast<std::size_t>(t.numel()));
  for (double& e : x) e = n(rng);
  if (normalise && inner > 0) {
    for (std::size_t r = 0; r < x.size(); r += static_cast<std::size_t>(inner)) {
      double s = 0;
      for (std::int64_t i = 0; i < inner; ++i) s += x[r + i] * x[r + i];
      const double inv = 1.0 / std::sqrt(s + 1e-30);
      for (std::int64_t i = 0; i < inner; ++i) x[r + i] *= inv;
    }
  }
  t.from_double(x);
}

}  // namespace

TestData make_problem(const Case& c_in) {
  TestData d;
  d.c = c_in;
  Case& c = d.c;
  d.seed = c.seed ? c.seed : fresh_seed();
  std::mt19937_64 rng(d.seed);
  std::uniform_real_distribution<double> U(0.0, 1.0);

  std::vector<double> cu;
  if (!c.seqlens.empty()) {
    if (c.B != 1) throw std::invalid_argument("make_problem: varlen needs B == 1");
    cu.push_back(0);
    for (std::int64_t L : c.seqlens) cu.push_back(cu.back() + static_cast<double>(L));
    c.T = static_cast<std::int64_t>(cu.back());
    d.N = static_cast<std::int64_t>(c.seqlens.size());
  } else {
    d.N = c.B;
  }
  const std::int64_t pad = c.strided ? 3 : 0;
  const DType gate_dtype = (c.gates_in_dtype || c.dtype == DType::f64) ? c.dtype : DType::f32;
  const DType state_dtype = c.dtype == DType::f64 ? DType::f64 : DType::f32;

  d.q = HostTensor(c.dtype, {c.B, c.T, c.Hk, c.Dk}, pad);
  d.k = HostTensor(c.dtype, {c.B, c.T, c.Hk, c.Dk}, pad);
  d.v = HostTensor(c.dtype, {c.B, c.T, c.Hv, c.Dv}, pad);
  fill_normal(d.q, rng, 1.0, !c.qk_l2norm, c.Dk);
  fill_normal(d.k, rng, 1.0, !c.qk_l2norm, c.Dk);
  fill_normal(d.v, rng, 1.0, false, 0);

  // Decay magnitudes of the regime: g = -scale * U(0,1), extreme adds -30 at ~30% of places.
  const double gscale = c.decay == Decay::mild ? 0.2 : 4.0;
  auto draw_g = [&]() {
    if (c.decay == Decay::extreme && U(rng) < 0.3) return -30.0;
    return -gscale * U(rng);
  };
  if (c.gate == GateKind::scalar)
    d.g = HostTensor(gate_dtype, {c.B, c.T, c.Hv}, pad);
  else
    d.g = HostTensor(gate_dtype, {c.B, c.T, c.Hv, c.Dk}, pad);
  if (c.gate_in_kernel) {
    // g = -exp(A_log) softplus(a + dt_bias); a ~ N(0,1), dt_bias ~ U(-1,1), exp(A_log) sets
    // the regime's magnitude (softplus of N(0,1) is ~0.7 on average).
    std::normal_distribution<double> n(0.0, 1.0);
    for (std::int64_t i = 0; i < d.g.numel(); ++i) d.g.set(i, n(rng));
    d.A_log = HostTensor(state_dtype, {c.Hv});
    const double amax = c.decay == Decay::mild ? 0.2 : c.decay == Decay::strong ? 4.0 : 30.0;
    for (std::int64_t i = 0; i < c.Hv; ++i) d.A_log.set(i, std::log(amax * (0.1 + 0.9 * U(rng))));
    if (c.gate == GateKind::scalar)
      d.dt_bias = HostTensor(state_dtype, {c.Hv});
    else
      d.dt_bias = HostTensor(state_dtype, {c.Hv, c.Dk});
    for (std::int64_t i = 0; i < d.dt_bias.numel(); ++i) d.dt_bias.set(i, 2.0 * U(rng) - 1.0);
  } else {
    for (std::int64_t i = 0; i < d.g.numel(); ++i) d.g.set(i, draw_g());
  }

  d.beta = HostTensor(gate_dtype, {c.B, c.T, c.Hv}, pad);
  if (c.beta_sigmoid) {
    std::normal_distribution<double> n(0.0, 2.0);
    for (std::int64_t i = 0; i < d.beta.numel(); ++i) d.beta.set(i, n(rng));
  } else {
    for (std::int64_t i = 0; i < d.beta.numel(); ++i) d.beta.set(i, 0.02 + 0.96 * U(rng));
  }

  if (c.h0) {
    d.h0 = HostTensor(state_dtype, state_shape(d), pad);
    fill_normal(d.h0, rng, 1.0, false, 0);
  }
  if (c.mask) {
    d.mask = HostTensor(DType::boolean, {c.B, c.T});
    for (std::int64_t i = 0; i < d.mask.numel(); ++i) d.mask.set(i, U(rng) < 0.75 ? 1.0 : 0.0);
  }
  if (!cu.empty()) {
    d.cu_seqlens = HostTensor(c.cu_seqlens_i64 ? DType::i64 : DType::i32,
                              {static_cast<std::int64_t>(cu.size())});
    d.cu_seqlens.from_double(cu);
  }

  d.o = HostTensor(c.dtype, {c.B, c.T, c.Hv, c.Dv}, pad);
  if (c.final_state) d.final_state = HostTensor(state_dtype, state_shape(d), pad);

  d.dq = HostTensor(c.dtype, {c.B, c.T, c.Hk, c.Dk}, pad);
  d.dk = HostTensor(c.dtype, {c.B, c.T, c.Hk, c.Dk}, pad);
  d.dv = HostTensor(c.dtype, {c.B, c.T, c.Hv, c.Dv}, pad);
  d.dg = HostTensor(gate_dtype, d.g.shape(), pad);
  d.dbeta = HostTensor(gate_dtype, d.beta.shape(), pad);
  if (c.gate_in_kernel) {
    d.dA_log = HostTensor(state_dtype, d.A_log.shape());
    d.ddt_bias = HostTensor(state_dtype, d.dt_bias.shape());
  }
  if (c.h0) d.dh0 = HostTensor(state_dtype, state_shape(d), pad);

  randomize_grad_seeds(d, rng());
  return d;
}

void randomize_grad_seeds(TestData& d, std::uint64_t seed) {
  std::mt19937_64 rng(seed ? seed : fresh_seed());
  const Case& c = d.c;
  const std::int64_t pad = c.strided ? 3 : 0;
  const DType state_dtype = c.dtype == DType::f64 ? DType::f64 : DType::f32;
  d.dout = HostTensor(c.dtype, {c.B, c.T, c.Hv, c.Dv}, pad);
  fill_normal(d.dout, rng, 1.0, false, 0);
  if (c.final_state) {
    d.dfinal_state = HostTensor(state_dtype, state_shape(d), pad);
    fill_normal(d.dfinal_state, rng, 1.0, false, 0);
  } else {
    d.dfinal_state = HostTensor();
  }
}

ForwardResult run_forward(TestData& d, Path path, ExecConfig config, const TensorView& saved) {
  d.o.poison();
  d.final_state.poison();
  config.path = path;
  ForwardParams p = d.forward_params();
  p.saved = saved;
  gdr::forward(p, config);
  ForwardResult r;
  r.o = d.o.to_double();
  r.final_state = d.final_state.to_double();
  return r;
}

BackwardResult run_backward(TestData& d, Path path, ExecConfig config, const TensorView& saved) {
  for (HostTensor* t : {&d.dq, &d.dk, &d.dv, &d.dg, &d.dbeta, &d.dA_log, &d.ddt_bias, &d.dh0})
    t->poison();
  config.path = path;
  BackwardParams p = d.backward_params();
  p.saved = saved;
  gdr::backward(p, config);
  BackwardResult r;
  r.dq = d.dq.to_double();
  r.dk = d.dk.to_double();
  r.dv = d.dv.to_double();
  r.dg = d.dg.to_double();
  r.dbeta = d.dbeta.to_double();
  r.dA_log = d.dA_log.to_double();
  r.ddt_bias = d.ddt_bias.to_double();
  r.dh0 = d.dh0.to_double();
  return r;
}

HostTensor make_saved(const TestData& d, int chunk_size, gdr::SavedContent content) {
  const SavedShape shape = saved_shape(validate_forward(d.forward_params()), chunk_size, content);
  HostTensor saved(shape.dtype, {shape.chunk_rows, shape.Hv, shape.record});
  saved.poison();
  return saved;
}

double loss(const TestData& d, const ForwardResult& r) {
  double s = 0;
  const std::vector<double> dout = d.dout.to_double();
  for (std::size_t i = 0; i < dout.size() && i < r.o.size(); ++i) s += dout[i] * r.o[i];
  if (d.dfinal_state.defined()) {
    const std::vector<double> dfs = d.dfinal_state.to_double();
    for (std::size_t i = 0; i < dfs.size() && i < r.final_state.size(); ++i)
      s += dfs[i] * r.final_state[i];
  }
  return s;
}

double rel_error(const std::vector<double>& a, const std::vector<double>& ref) {
  const double inf = std::numeric_limits<double>::infinity();
  if (a.size() != ref.size()) return inf;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], r = ref[i];
    if (std::isnan(r)) {
      if (!std::isnan(x)) return inf;
      continue;
    }
    if (std::isinf(r)) {
      if (x != r) return inf;
      continue;
    }
    if (!std::isfinite(x)) return inf;
    num += (x - r) * (x - r);
    den += r * r;
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

double rel_error(const std::vector<float>& a, const std::vector<float>& ref) {
  return rel_error(std::vector<double>(a.begin(), a.end()),
                   std::vector<double>(ref.begin(), ref.end()));
}

namespace {
bool low_precision(const Case& c) {
  return c.dtype == DType::f16 || c.dtype == DType::bf16;
}
}  // namespace

double forward_tolerance(const Case& c) {
  return low_precision(c) ? 5e-3 : 1e-5;
}
// A bf16 pool is compared with the reference's final state rounded to bf16 (rounded_to_bf16):
// the kernels compute in fp32 and round once, so only elements whose fp32 value and the
// reference straddle a rounding boundary differ, by one bf16 step (2^-8 relative at most).
// Against the unrounded reference the RMS error is the rounding itself, ~1.5-1.7e-3, which a
// tolerance cannot tell from a wrong rounding mode (truncation: ~3e-3) with a wide margin.
double state_tolerance(const Case& c) {
  return forward_tolerance(c) + (c.bf16_state ? 5e-4 : 0.0);
}

std::vector<double> rounded_to_bf16(const std::vector<double>& values) {
  HostTensor t(DType::bf16, {static_cast<std::int64_t>(values.size())});
  t.from_double(values);
  return t.to_double();
}
double backward_tolerance(const Case& c) {
  return low_precision(c) ? 1e-2 : 1e-4;
}

std::vector<Field> fields(const ForwardResult& got, const ForwardResult& ref) {
  return {{"o", &got.o, &ref.o}, {"final_state", &got.final_state, &ref.final_state}};
}

std::vector<Field> fields(const BackwardResult& got, const BackwardResult& ref) {
  return {{"dq", &got.dq, &ref.dq},
          {"dk", &got.dk, &ref.dk},
          {"dv", &got.dv, &ref.dv},
          {"dg", &got.dg, &ref.dg},
          {"dbeta", &got.dbeta, &ref.dbeta},
          {"dA_log", &got.dA_log, &ref.dA_log},
          {"ddt_bias", &got.ddt_bias, &ref.ddt_bias},
          {"dh0", &got.dh0, &ref.dh0}};
}

// ---- float64 oracle ----

namespace {

// A float64 copy of a float tensor (other dtypes copied as they are), without padding.
HostTensor to_f64(const HostTensor& t) {
  if (!t.defined()) return HostTensor();
  const bool fl = is_float_dtype(t.dtype());
  HostTensor out(fl ? DType::f64 : t.dtype(), t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) out.set(i, t.get(i));
  return out;
}

}  // namespace

TestData as_float64(const TestData& d) {
  TestData e;
  e.c = d.c;
  e.c.dtype = DType::f64;
  e.c.strided = false;
  e.seed = d.seed;
  e.N = d.N;
  for (auto [from, to] : {std::pair{&d.q, &e.q},
                          {&d.k, &e.k},
                          {&d.v, &e.v},
                          {&d.g, &e.g},
                          {&d.beta, &e.beta},
                          {&d.A_log, &e.A_log},
                          {&d.dt_bias, &e.dt_bias},
                          {&d.h0, &e.h0},
                          {&d.mask, &e.mask},
                          {&d.cu_seqlens, &e.cu_seqlens},
                          {&d.o, &e.o},
                          {&d.final_state, &e.final_state},
                          {&d.dout, &e.dout},
                          {&d.dfinal_state, &e.dfinal_state},
                          {&d.dq, &e.dq},
                          {&d.dk, &e.dk},
                          {&d.dv, &e.dv},
                          {&d.dg, &e.dg},
                          {&d.dbeta, &e.dbeta},
                          {&d.dA_log, &e.dA_log},
                          {&d.ddt_bias, &e.ddt_bias},
                          {&d.dh0, &e.dh0}})
    *to = to_f64(*from);
  return e;
}

ForwardResult reference_forward(const TestData& d) {
  TestData e = as_float64(d);
  return run_forward(e, Path::reference);
}

BackwardResult reference_backward(const TestData& d) {
  TestData e = as_float64(d);
  return run_backward(e, Path::reference);
}

// ---- sub-problems ----

namespace {

// Copies `len` tokens starting at token t0 of batch row b of src ([B, T, ...]) into dst
// ([1, len, ...]).
void copy_tokens(const HostTensor& src, std::int64_t b, std::int64_t t0, std::int64_t len,
                 HostTensor& dst) {
  if (!src.defined() || !dst.defined()) return;
  const std::int64_t T = src.shape()[1];
  const std::int64_t inner = src.numel() / std::max<std::int64_t>(1, src.shape()[0] * T);
  for (std::int64_t t = 0; t < len; ++t)
    for (std::int64_t i = 0; i < inner; ++i)
      dst.set(t * inner + i, src.get((b * T + t0 + t) * inner + i));
}

// Copies row n of src ([N, ...]) into row 0 of dst ([1, ...]).
void copy_row(const HostTensor& src, std::int64_t n, HostTensor& dst) {
  if (!src.defined() || !dst.defined()) return;
  const std::int64_t inner = dst.numel();
  for (std::int64_t i = 0; i < inner; ++i) dst.set(i, src.get(n * inner + i));
}

void copy_all(const HostTensor& src, HostTensor& dst) {
  if (!src.defined() || !dst.defined()) return;
  for (std::int64_t i = 0; i < src.numel(); ++i) dst.set(i, src.get(i));
}

TestData sub_problem(const TestData& d, std::int64_t b, std::int64_t t0, std::int64_t len,
                     std::int64_t state_row) {
  Case c = d.c;
  c.B = 1;
  c.T = len;
  c.seqlens.clear();
  c.seed = d.seed;
  TestData s = make_problem(c);
  s.seed = d.seed;
  for (auto [from, to] : {std::pair{&d.q, &s.q},
                          {&d.k, &s.k},
                          {&d.v, &s.v},
                          {&d.g, &s.g},
                          {&d.beta, &s.beta},
                          {&d.mask, &s.mask},
                          {&d.dout, &s.dout}})
    copy_tokens(*from, b, t0, len, *to);
  copy_all(d.A_log, s.A_log);
  copy_all(d.dt_bias, s.dt_bias);
  copy_row(d.h0, state_row, s.h0);
  copy_row(d.dfinal_state, state_row, s.dfinal_state);
  return s;
}

}  // namespace

TestData extract_sequence(const TestData& d, std::int64_t n) {
  if (d.cu_seqlens.defined()) {
    const auto t0 = static_cast<std::int64_t>(d.cu_seqlens.get(n));
    const auto t1 = static_cast<std::int64_t>(d.cu_seqlens.get(n + 1));
    return sub_problem(d, 0, t0, t1 - t0, n);
  }
  return sub_problem(d, n, 0, d.c.T, n);
}

TestData slice_tokens(const TestData& d, std::int64_t t0, std::int64_t t1) {
  if (d.c.B != 1 || d.cu_seqlens.defined())
    throw std::invalid_argument("slice_tokens: needs B == 1 and no varlen");
  return sub_problem(d, 0, t0, t1 - t0, 0);
}

// ---- decode ----

DecodeParams DecodeData::params() const {
  DecodeParams p;
  p.q = base.q.view();
  p.k = base.k.view();
  p.v = base.v.view();
  p.g = base.g.view();
  p.beta = base.beta.view();
  p.A_log = base.A_log.view();
  p.dt_bias = base.dt_bias.view();
  p.mask = base.mask.view();
  p.state = state.view();
  p.state_indices = state_indices.view();
  p.o = base.o.view();
  p.opts = base.options();
  return p;
}

DecodeData make_decode_problem(const Case& c_in, std::int64_t P, bool with_indices) {
  Case c = c_in;
  if (!c.seqlens.empty()) throw std::invalid_argument("make_decode_problem: no varlen in decode");
  c.h0 = false;
  c.final_state = false;
  DecodeData d;
  d.base = make_problem(c);
  d.P = P > 0 ? P : c.B;
  std::mt19937_64 rng(d.base.seed ^ 0x9e3779b97f4a7c15ULL);
  const DType state_dtype =
      c.dtype == DType::f64 ? DType::f64 : (c.bf16_state ? DType::bf16 : DType::f32);
  if (c.layout == StateLayout::k_first)
    d.state = HostTensor(state_dtype, {d.P, c.Hv, c.Dk, c.Dv});
  else
    d.state = HostTensor(state_dtype, {d.P, c.Hv, c.Dv, c.Dk});
  fill_normal(d.state, rng, 1.0, false, 0);
  if (with_indices) {
    if (d.P < c.B) throw std::invalid_argument("make_decode_problem: indices need P >= B");
    std::vector<std::int64_t> rows(static_cast<std::size_t>(d.P));
    for (std::int64_t i = 0; i < d.P; ++i) rows[i] = i;
    std::shuffle(rows.begin(), rows.end(), rng);
    d.state_indices = HostTensor(c.cu_seqlens_i64 ? DType::i64 : DType::i32, {c.B});
    for (std::int64_t b = 0; b < c.B; ++b)
      d.state_indices.set(b, (c.B >= 3 && b == 1) ? -1.0 : static_cast<double>(rows[b]));
  }
  return d;
}

ForwardResult decode_reference(const DecodeData& d) {
  const Case& c = d.base.c;
  // Gather the pool rows into h0 [B, ...], run the float64 reference, scatter back.
  TestData t = d.base;  // copies every buffer (HostTensor owns its storage)
  std::vector<std::int64_t> row(static_cast<std::size_t>(c.B));
  for (std::int64_t b = 0; b < c.B; ++b)
    row[b] = d.state_indices.defined() ? static_cast<std::int64_t>(d.state_indices.get(b)) : b;
  std::vector<std::int64_t> sshape = d.state.shape();
  const std::int64_t per_row = c.Hv * c.Dk * c.Dv;
  sshape[0] = c.B;
  // A bf16 pool's values are exact in f32, the reference's state dtype.
  const DType ref_dtype = d.state.dtype() == DType::bf16 ? DType::f32 : d.state.dtype();
  t.h0 = HostTensor(ref_dtype, sshape);
  t.final_state = HostTensor(ref_dtype, sshape);
  t.c.h0 = true;
  t.c.final_state = true;
  t.h0.fill(0.0);
  for (std::int64_t b = 0; b < c.B; ++b)
    if (row[b] >= 0)
      for (std::int64_t i = 0; i < per_row; ++i)
        t.h0.set(b * per_row + i, d.state.get(row[b] * per_row + i));
  const ForwardResult step = reference_forward(t);
  ForwardResult r;
  r.o = step.o;
  r.final_state = d.state.to_double();
  const std::int64_t o_row = c.T * c.Hv * c.Dv;
  for (std::int64_t b = 0; b < c.B; ++b) {
    if (row[b] < 0) {
      for (std::int64_t i = 0; i < o_row; ++i) r.o[b * o_row + i] = 0.0;
      continue;
    }
    for (std::int64_t i = 0; i < per_row; ++i)
      r.final_state[row[b] * per_row + i] = step.final_state[b * per_row + i];
  }
  // A bf16 pool holds the stepped rows rounded to nearest even (the rows no sequence uses are
  // the pool's own values, exact).
  if (d.state.dtype() == DType::bf16) r.final_state = rounded_to_bf16(r.final_state);
  return r;
}

ForwardResult run_decode(DecodeData& d, Path path, ExecConfig config) {
  d.base.o.poison();
  config.path = path;
  gdr::decode(d.params(), config);
  ForwardResult r;
  r.o = d.base.o.to_double();
  r.final_state = d.state.to_double();
  return r;
}

}  // namespace gdr::test
