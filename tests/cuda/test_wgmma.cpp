// The warpgroup-product layer (src/cuda/common/wgmma.cuh) on the device, before any kernel relies
// on it: D = A B for one 64-row tile through wgmma_probe_gemm (the no-swizzle layouts, the matrix
// descriptors, the k16 steps and the accumulator fragment layout), A staged K-major and M-major, B
// K-major and N-major, N = 16, 32, 64 and 128, K = 16 and 128, against a float64 product of the
// same bf16 values; the probe also checks that wgmma_desc16 (a shared base plus constant offsets)
// gives wgmma_desc's bits for every descriptor (NaN in D otherwise). fp32 accumulation of exact
// bf16 products: relative error ~1e-7 expected, 1e-5 allowed; a wrong layout or fragment gives
// O(1).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/wgmma_probe.h"
#include "gpu_support.h"
#include "support_gtest.h"

namespace gdr::test {
namespace {

TEST(CudaWgmma, Probe) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(20261207);
  std::normal_distribution<double> normal;
  for (int N : {16, 32, 64, 128})
    for (int K : {16, 128})
      for (int major = 0; major < 4; ++major) {
        const bool m_major = major & 1, n_major = major & 2;
        // A [64][K]; B [K][N] MN-major or [N][K] K-major; both rounded to bf16 as they are set.
        HostTensor a(DType::bf16, {64, K});
        HostTensor b(DType::bf16,
                     n_major ? std::vector<std::int64_t>{K, N} : std::vector<std::int64_t>{N, K});
        for (std::int64_t i = 0; i < a.numel(); ++i) a.set(i, normal(rng));
        for (std::int64_t i = 0; i < b.numel(); ++i) b.set(i, normal(rng));
        auto bkn = [&](int k, int n) { return b.get(n_major ? k * N + n : n * K + k); };
        std::vector<double> want(64 * N, 0.0);
        for (int r = 0; r < 64; ++r)
          for (int n = 0; n < N; ++n)
            for (int k = 0; k < K; ++k) want[r * N + n] += a.get(r * K + k) * bkn(k, n);
        HostTensor d(DType::f32, {64, N});
        d.poison();  // NaN where nothing is written
        DeviceMirror m;
        const TensorView da = m.to_device(a.view()), db = m.to_device(b.view());
        const TensorView dd = m.to_device(d.view());
        const int err = cuda::detail::wgmma_probe_gemm(
            static_cast<const std::uint16_t*>(da.data), static_cast<const std::uint16_t*>(db.data),
            static_cast<float*>(dd.data), N, K, m_major, n_major);
        const std::string label = "N " + std::to_string(N) + " K " + std::to_string(K) +
                                  (m_major ? " A M-major" : " A K-major") +
                                  (n_major ? " B N-major" : " B K-major");
        ASSERT_EQ(err, 0) << label << ": " << cudaGetErrorString(static_cast<cudaError_t>(err));
        DeviceMirror::to_host(dd, d.view());
        const std::vector<double> got = d.to_double();
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_TRUE(std::isfinite(got[i])) << label << ": D[" << i / N << "][" << i % N << "]";
        EXPECT_LT(rel_error(got, want), 1e-5) << label;
      }
}

}  // namespace
}  // namespace gdr::test
