// The seed layer of `gdr demo` (demo_layer.h): host buffers and their random contents.
#include "demo_layer.h"

#include <cmath>
#include <cstring>
#include <random>

namespace gdr::tools::demo {
namespace {

std::uint16_t to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<std::uint16_t>(u >> 16);
}

float from_bf16(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "f64") return DType::f64;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  throw InvalidArgument("gdr demo: --dtype is " + s + "; supported: f32, f64, bf16, f16");
}

Buffer::Buffer(DType dtype, std::vector<std::int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  n_ = 1;
  for (std::int64_t s : shape_) n_ *= s;
  bytes_.assign(static_cast<std::size_t>(n_ * dtype_size(dtype_)), 0);
}

void Buffer::set(std::int64_t i, double x) {
  switch (dtype_) {
    case DType::f32: reinterpret_cast<float*>(bytes_.data())[i] = float(x); break;
    case DType::f64: reinterpret_cast<double*>(bytes_.data())[i] = x; break;
    case DType::bf16: reinterpret_cast<std::uint16_t*>(bytes_.data())[i] = to_bf16(float(x)); break;
    case DType::f16: reinterpret_cast<_Float16*>(bytes_.data())[i] = static_cast<_Float16>(x); break;
    default: break;
  }
}

float Buffer::get(std::int64_t i) const {
  switch (dtype_) {
    case DType::f32: return reinterpret_cast<const float*>(bytes_.data())[i];
    case DType::f64: return float(reinterpret_cast<const double*>(bytes_.data())[i]);
    case DType::bf16: return from_bf16(reinterpret_cast<const std::uint16_t*>(bytes_.data())[i]);
    case DType::f16: return float(reinterpret_cast<const _Float16*>(bytes_.data())[i]);
    default: return 0.0f;
  }
}

std::vector<float> Buffer::to_floats() const {
  std::vector<float> x(static_cast<std::size_t>(n_));
  for (std::int64_t i = 0; i < n_; ++i) x[static_cast<std::size_t>(i)] = get(i);
  return x;
}

TensorView Buffer::view() {
  TensorView t;
  t.data = bytes_.data();
  t.dtype = dtype_;
  t.rank = static_cast<int>(shape_.size());
  std::int64_t step = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.shape[d] = shape_[d];
    t.stride[d] = step;
    step *= shape_[d];
  }
  return t;
}

Layer make_layer(const LayerShape& s, DType dt, std::uint64_t seed) {
  const std::int64_t B = s.B, T = s.T, Hk = s.Hk, Hv = s.Hv, Dk = s.Dk, Dv = s.Dv;
  Layer l{Buffer(dt, {B, T, Hk, Dk}),           Buffer(dt, {B, T, Hk, Dk}),
          Buffer(dt, {B, T, Hv, Dv}),           Buffer(DType::f32, {B, T, Hv}),
          Buffer(DType::f32, {B, T, Hv}),       Buffer(dt, {B, T, Hv, Dv}),
          Buffer(dt, {B, T, Hv, Dv}),           Buffer(dt, {B, T, Hk, Dk}),
          Buffer(dt, {B, T, Hk, Dk}),           Buffer(dt, {B, T, Hv, Dv}),
          Buffer(DType::f32, {B, T, Hv}),       Buffer(DType::f32, {B, T, Hv})};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;
  std::vector<double> row(static_cast<std::size_t>(Dk));
  for (std::int64_t r = 0; r < B * T * Hk; ++r) {  // keys L2-normalised per row
    double n2 = 0;
    for (std::int64_t i = 0; i < Dk; ++i) n2 += (row[i] = normal(rng)) * row[i];
    for (std::int64_t i = 0; i < Dk; ++i) l.k.set(r * Dk + i, row[i] / std::sqrt(n2));
    for (std::int64_t i = 0; i < Dk; ++i) l.q.set(r * Dk + i, normal(rng));
  }
  for (std::int64_t i = 0; i < l.v.size(); ++i) l.v.set(i, normal(rng));
  for (std::int64_t i = 0; i < l.g.size(); ++i) l.g.set(i, -0.2 * uniform(rng));  // mild decay
  for (std::int64_t i = 0; i < l.beta.size(); ++i) l.beta.set(i, uniform(rng));
  for (std::int64_t i = 0; i < l.dout.size(); ++i) l.dout.set(i, normal(rng));
  return l;
}

ForwardParams forward_params(Layer& l) {
  ForwardParams fp;
  fp.in.q = l.q.view();
  fp.in.k = l.k.view();
  fp.in.v = l.v.view();
  fp.in.g = l.g.view();
  fp.in.beta = l.beta.view();
  fp.o = l.o.view();
  return fp;
}

BackwardParams backward_params(Layer& l) {
  BackwardParams bp;
  bp.in = forward_params(l).in;
  bp.dout = l.dout.view();
  bp.dq = l.dq.view();
  bp.dk = l.dk.view();
  bp.dv = l.dv.view();
  bp.dg = l.dg.view();
  bp.dbeta = l.dbeta.view();
  return bp;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size() || ref.empty()) return NAN;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace gdr::tools::demo
