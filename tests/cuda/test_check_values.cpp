// ExecConfig::check_values on cuda (src/cuda/common/check_values.cu): asked for, g > 0 is
// refused with the first offending element's index and value (forward and decode, scalar and
// per-key gates, f32 and 16-bit gates, strided); -inf and NaN are not refused; with
// gate_in_kernel g is the raw `a` and is not checked; off by default. cu_seqlens values: refused
// when asked for; unchecked, an invalid tensor runs (clamped on the device) on both forward
// paths, and a valid one runs under CUDA-graph-friendly defaults.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "gpu_support.h"
#include "support_gtest.h"

namespace gdr::test {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

Case small_case(GateKind gate, DType dtype) {
  Case c;
  c.B = 2;
  c.T = 5;
  c.Hk = 1;
  c.Hv = 2;
  c.Dk = 64;
  c.Dv = 64;
  c.gate = gate;
  c.dtype = dtype;
  c.gates_in_dtype = dtype != DType::f32;
  c.strided = true;
  return c;
}

TEST(CudaCheckValues, ForwardRefusesPositiveGateWhenAsked) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      const Case c = small_case(gate, dtype);
      TestData d = make_problem(c);
      const bool pk = gate == GateKind::per_key;
      // g[1, 3, 1] (scalar) or g[1, 3, 1, 60] (per-key); a later one must not be named.
      d.g.set(pk ? ((1 * 5 + 3) * 2 + 1) * 64 + 60 : (1 * 5 + 3) * 2 + 1, 0.5);
      d.g.set(d.g.numel() - 1, 4.0);
      const std::string label = describe(d.c, d.seed);
      DeviceMirror m;
      ForwardParams p = mirror_forward_params(m, d.forward_params());
      ExecConfig cfg;
      cfg.check_values = true;
      const std::string msg = refusal([&] { forward(p, cfg); });
      const std::string want = pk ? "gdr.forward: g[1, 3, 1, 60] is 0.5; g must be <= 0"
                                  : "gdr.forward: g[1, 3, 1] is 0.5; g must be <= 0";
      EXPECT_TRUE(starts_with(msg, want)) << msg << "\n" << label;
      cfg.op_name = "gdr.chunk_gated_delta_rule";
      EXPECT_TRUE(starts_with(refusal([&] { forward(p, cfg); }), "gdr.chunk_gated_delta_rule: g["))
          << label;
      // Off by default: no check, the call runs.
      EXPECT_EQ(refusal([&] { forward(p); }), "") << label;
      cuda_check(cudaDeviceSynchronize(), "forward");
    }
  }
}

TEST(CudaCheckValues, DecodeRefusesPositiveGateWhenAsked) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  Case c = small_case(GateKind::scalar, DType::bf16);
  c.B = 3;
  c.T = 2;
  DecodeData d = make_decode_problem(c, 4, true);
  d.base.g.set((2 * 2 + 1) * 2 + 0, 2.0);  // g[2, 1, 0]
  DeviceMirror m;
  DecodeParams p = mirror_decode_params(m, d.params());
  ExecConfig cfg;
  cfg.check_values = true;
  const std::string msg = refusal([&] { decode(p, cfg); });
  EXPECT_TRUE(starts_with(msg, "gdr.decode: g[2, 1, 0] is 2; g must be <= 0")) << msg;
}

TEST(CudaCheckValues, MinusInfinityNanAndRawGatesAreNotRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const Case c = small_case(GateKind::scalar, DType::f32);
  TestData d = make_problem(c);
  d.g.set(3, -std::numeric_limits<double>::infinity());
  d.g.set(7, std::numeric_limits<double>::quiet_NaN());
  d.g.set(8, 0.0);
  ExecConfig cfg;
  cfg.check_values = true;
  {
    DeviceMirror m;
    ForwardParams p = mirror_forward_params(m, d.forward_params());
    EXPECT_EQ(refusal([&] { forward(p, cfg); }), "");
    cuda_check(cudaDeviceSynchronize(), "forward");
  }
  Case r = c;
  r.gate_in_kernel = true;  // g holds the raw a ~ N(0, 1): positive values are fine
  TestData e = make_problem(r);
  e.g.set(0, 3.0);
  DeviceMirror m;
  ForwardParams p = mirror_forward_params(m, e.forward_params());
  EXPECT_EQ(refusal([&] { forward(p, cfg); }), "");
  cuda_check(cudaDeviceSynchronize(), "forward");
}

TEST(CudaCheckValues, InvalidCuSeqlensRefusedWhenAskedClampedOtherwise) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  Case c = small_case(GateKind::scalar, DType::bf16);
  c.B = 1;
  c.seqlens = {70, 0, 1, 129};  // T = 200
  c.strided = false;
  // cu_seqlens as given, the message check_values gives, one element changed per row.
  struct Bad {
    std::int64_t index;
    double value;
    const char* message;
  };
  const Bad bad[] = {
      {2, 60.0, "gdr.forward: cu_seqlens[2] is 60 < cu_seqlens[1] = 70; must be non-decreasing"},
      {4, 300.0, "gdr.forward: cu_seqlens[4] is 300; must equal T=200"},
      {0, -5.0, "gdr.forward: cu_seqlens[0] is -5; must be 0"},
  };
  for (const Bad& b : bad) {
    for (const bool i64 : {false, true}) {
      c.cu_seqlens_i64 = i64;
      TestData d = make_problem(c);
      d.cu_seqlens.set(b.index, b.value);
      const std::string label = describe(d.c, d.seed) + " cu_seqlens[" + std::to_string(b.index) +
                                "] = " + std::to_string(b.value);
      DeviceMirror m;
      ForwardParams p = mirror_forward_params(m, d.forward_params());
      for (const Path path : {Path::sequential, Path::chunkwise}) {
        ExecConfig cfg;
        cfg.path = path;
        cfg.check_values = true;
        EXPECT_TRUE(starts_with(refusal([&] { forward(p, cfg); }), b.message))
            << label << " " << to_string(path);
        cfg.check_values = false;  // clamped on the device: runs, no fault
        EXPECT_EQ(refusal([&] { forward(p, cfg); }), "") << label << " " << to_string(path);
        cuda_check(cudaDeviceSynchronize(), "forward with an invalid cu_seqlens");
      }
    }
  }
}

}  // namespace
}  // namespace gdr::test
