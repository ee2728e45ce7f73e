// wgmma_probe_gemm (wgmma_probe.h): one block of one warpgroup stages A and B into the
// no-swizzle layouts of wgmma.cuh (16-byte units, generic stores), makes them visible to the async
// proxy, runs K / 16 products into fp32 accumulators and writes D from the fragment layout that
// wgmma.cuh states.
#include <cuda_runtime.h>

#include "cuda/common/wgmma.cuh"
#include "cuda/common/wgmma_probe.h"

namespace gdr::cuda::detail {
namespace {

template <int N, bool NMajor>
__global__ void __launch_bounds__(128)
    wgmma_probe_kernel(const std::uint16_t* A, const std::uint16_t* B, float* D, int K) {
  extern __shared__ float4 smem4[];
  unsigned char* sA = reinterpret_cast<unsigned char*>(smem4);
  unsigned char* sB = sA + 64 * K * 2;
  const int tid = threadIdx.x;
  // A: 16-byte units (row r, k group kg) of the row-major source.
  for (int u = tid; u < 64 * (K / 8); u += 128) {
    const int r = u / (K / 8), kg = u % (K / 8);
    *reinterpret_cast<uint4*>(sA + kmajor_offset(r, 8 * kg, K)) =
        *reinterpret_cast<const uint4*>(A + r * K + 8 * kg);
  }
  if constexpr (NMajor) {  // B [K][N]: units (k, n group)
    for (int u = tid; u < K * (N / 8); u += 128) {
      const int k = u / (N / 8), ng = u % (N / 8);
      *reinterpret_cast<uint4*>(sB + nmajor_offset(k, 8 * ng, N)) =
          *reinterpret_cast<const uint4*>(B + k * N + 8 * ng);
    }
  } else {  // B [N][K]: units (n, k group)
    for (int u = tid; u < N * (K / 8); u += 128) {
      const int n = u / (K / 8), kg = u % (K / 8);
      *reinterpret_cast<uint4*>(sB + kmajor_offset(n, 8 * kg, K)) =
          *reinterpret_cast<const uint4*>(B + n * K + 8 * kg);
    }
  }
  fence_proxy_async_smem();
  __syncthreads();

  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const std::uint32_t a_lbo = 128, a_sbo = (K / 8) * 128;
  const std::uint32_t b_lbo = NMajor ? (N / 8) * 128 : 128, b_sbo = NMajor ? 128 : (K / 8) * 128;
  wgmma_fence();
  for (int k0 = 0; k0 < K; k0 += 16) {
    const std::uint64_t da = wgmma_desc(sA + (k0 / 8) * a_lbo, a_lbo, a_sbo);
    const std::uint64_t db = wgmma_desc(sB + (k0 / 8) * b_lbo, b_lbo, b_sbo);
    if constexpr (N == 32)
      wgmma_m64n32k16<NMajor>(d, da, db, true);
    else
      wgmma_m64n64k16<NMajor>(d, da, db, true);
  }
  wgmma_commit();
  wgmma_wait<0>();

  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int j = i / 4, e = i % 4;
    const int row = 16 * warp + g + 8 * (e / 2), col = 8 * j + 2 * c + (e % 2);
    D[row * N + col] = d[i];
  }
}

template <int N, bool NMajor>
int launch(const std::uint16_t* A, const std::uint16_t* B, float* D, int K) {
  const auto kernel = wgmma_probe_kernel<N, NMajor>;
  const int smem = (64 + N) * K * 2;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<1, 128, smem>>>(A, B, D, K);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

}  // namespace

int wgmma_probe_gemm(const std::uint16_t* A, const std::uint16_t* B, float* D, int N, int K,
                     bool b_n_major) {
  if (K <= 0 || K % 16 != 0 || K > 256) return cudaErrorInvalidValue;
  if (N == 32) return b_n_major ? launch<32, true>(A, B, D, K) : launch<32, false>(A, B, D, K);
  if (N == 64) return b_n_major ? launch<64, true>(A, B, D, K) : launch<64, false>(A, B, D, K);
  return cudaErrorInvalidValue;
}

}  // namespace gdr::cuda::detail
