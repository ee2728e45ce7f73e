// The warpgroup-product layer (src/cuda/common/wgmma.cuh) on the device, before any kernel relies
// on it: D = A B for one 64-row tile through wgmma_probe_gemm (the no-swizzle layouts, the matrix
// descriptors, the k16 steps and the accumulator fragment layout), B staged K-major and MN-major,
// N = 32 and 64, K = 16 and 128, against a float64 product of the same bf16 values. fp32
// accumulation of exact bf16 products: relative error ~1e-7 expected, 1e-5 allowed; a wrong layout
// or fragment gives O(1).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/common/wgmma_probe.h"
#include "gpu_support.h"
#include "support_gtest.h"

namespace gdr::test {
namespace {

std::uint16_t to_bf16_bits(float x) {  // round to nearest even (finite inputs)
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
double from_bf16_bits(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

TEST(CudaWgmma, Probe) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(20261207);
  std::normal_distribution<float> normal;
  for (int N : {32, 64})
    for (int K : {16, 128})
      for (bool n_major : {false, true}) {
        std::vector<std::uint16_t> a(64 * K), b(N * K);
        for (auto& x : a) x = to_bf16_bits(normal(rng));
        for (auto& x : b) x = to_bf16_bits(normal(rng));
        // B's element (k, n): b[n K + k] K-major, b[k N + n] MN-major.
        auto bkn = [&](int k, int n) {
          return from_bf16_bits(n_major ? b[k * N + n] : b[n * K + k]);
        };
        std::vector<double> want(64 * N, 0.0);
        for (int r = 0; r < 64; ++r)
          for (int n = 0; n < N; ++n)
            for (int k = 0; k < K; ++k) want[r * N + n] += from_bf16_bits(a[r * K + k]) * bkn(k, n);
        std::uint16_t *da = nullptr, *db = nullptr;
        float* dd = nullptr;
        ASSERT_EQ(cudaMalloc(&da, a.size() * 2), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&db, b.size() * 2), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dd, want.size() * 4), cudaSuccess);
        cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
        cudaMemset(dd, 0xff, want.size() * 4);  // poisoned: NaN where nothing is written
        const int err = cuda::detail::wgmma_probe_gemm(da, db, dd, N, K, n_major);
        std::vector<float> got(want.size());
        cudaMemcpy(got.data(), dd, got.size() * 4, cudaMemcpyDeviceToHost);
        cudaFree(da);
        cudaFree(db);
        cudaFree(dd);
        const std::string label = "N " + std::to_string(N) + " K " + std::to_string(K) +
                                  (n_major ? " B MN-major" : " B K-major");
        ASSERT_EQ(err, 0) << label << ": " << cudaGetErrorString(static_cast<cudaError_t>(err));
        double num = 0, den = 0;
        for (std::size_t i = 0; i < want.size(); ++i) {
          ASSERT_TRUE(std::isfinite(got[i])) << label << ": D[" << i / N << "][" << i % N << "]";
          num += (got[i] - want[i]) * (got[i] - want[i]);
          den += want[i] * want[i];
        }
        EXPECT_LT(std::sqrt(num / den), 1e-5) << label;
      }
}

}  // namespace
}  // namespace gdr::test
