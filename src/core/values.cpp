#include "core/values.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "gdr/error.h"

namespace gdr {
namespace {

double half_to_double(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0)
    v = std::ldexp(man, -24);
  else if (exp == 31)
    v = man ? NAN : INFINITY;
  else
    v = std::ldexp(man + 1024, exp - 25);
  return (h >> 15) ? -v : v;
}

double bf16_to_double(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

double element(const TensorView& t, std::int64_t offset) {
  const char* base = static_cast<const char*>(t.data);
  switch (t.dtype) {
    case DType::f32: return reinterpret_cast<const float*>(base)[offset];
    case DType::f64: return reinterpret_cast<const double*>(base)[offset];
    case DType::f16: return half_to_double(reinterpret_cast<const std::uint16_t*>(base)[offset]);
    case DType::bf16: return bf16_to_double(reinterpret_cast<const std::uint16_t*>(base)[offset]);
    default: return 0.0;
  }
}

}  // namespace

PositiveGate first_positive_host(const TensorView& g) {
  PositiveGate found;
  const std::int64_t n = g.numel();
  if (!g.defined() || n == 0) return found;
  std::array<std::int64_t, kMaxRank> idx{};
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t offset = 0;
    for (int d = 0; d < g.rank; ++d) offset += idx[d] * g.stride[d];
    const double v = element(g, offset);
    if (v > 0.0) {  // false for NaN and -inf
      found.index = i;
      found.value = v;
      return found;
    }
    for (int d = g.rank - 1; d >= 0; --d) {
      if (++idx[d] < g.shape[d]) break;
      idx[d] = 0;
    }
  }
  return found;
}

void refuse_positive_gate(const char* op, const TensorView& g, const PositiveGate& found) {
  std::string where = "g[";
  std::int64_t rest = found.index;
  std::array<std::int64_t, kMaxRank> idx{};
  for (int d = g.rank - 1; d >= 0; --d) {
    const std::int64_t size = g.shape[d] > 0 ? g.shape[d] : 1;
    idx[d] = rest % size;
    rest /= size;
  }
  for (int d = 0; d < g.rank; ++d) where += (d ? ", " : "") + std::to_string(idx[d]);
  char value[32];
  std::snprintf(value, sizeof value, "%.6g", found.value);
  throw InvalidArgument(
      std::string(op) + ": " + where + "] is " + value +
      "; g must be <= 0: it is the natural log of the decay (-inf and NaN are not "
      "refused: they pass through to the outputs). Apply log-sigmoid (or "
      "-softplus) to a raw gate first, or pass the raw gate with A_log and "
      "dt_bias (gate_in_kernel)");
}

}  // namespace gdr
