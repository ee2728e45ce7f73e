// wgmma_probe_gemm (wgmma_probe.h): one block of one warpgroup stages A and B as the tiles of
// wgmma_layout.h (element by element, generic stores; A as [64][K] K-major or [K][64] M-major, B
// as [N][K] K-major or [K][N] N-major), makes them visible to the async proxy, runs K / 16
// products into fp32 accumulators through the operand descriptions the kernels use, and writes D
// from the fragment layout that wgmma.cuh states.
#include <cuda_runtime.h>

#include "cuda/common/wgmma.cuh"
#include "cuda/common/wgmma_probe.h"

namespace gdr::cuda::detail {
namespace {

using wgmma_layout::kmajor_operand;
using wgmma_layout::mnmajor_operand;
using wgmma_layout::tile_offset;

template <int N, bool TransA, bool TransB>
__global__ void __launch_bounds__(128)
    wgmma_probe_kernel(const std::uint16_t* A, const std::uint16_t* B, float* D, int K) {
  extern __shared__ float4 smem4[];
  unsigned char* sA = reinterpret_cast<unsigned char*>(smem4);
  unsigned char* sB = sA + 64 * K * 2;
  const int tid = threadIdx.x;
  for (int e = tid; e < 64 * K; e += 128) {  // A[m][k]
    const int m = e / K, k = e % K;
    *reinterpret_cast<std::uint16_t*>(
        sA + (TransA ? tile_offset(k, m, 64) : tile_offset(m, k, K))) = A[e];
  }
  for (int e = tid; e < N * K; e += 128) {  // B[k][n] (TransB) or B[n][k]
    const int r = e / (TransB ? N : K), c = e % (TransB ? N : K);
    *reinterpret_cast<std::uint16_t*>(sB + tile_offset(r, c, TransB ? N : K)) = B[e];
  }
  fence_proxy_async();
  __syncthreads();

  bool desc_mismatch = false;
  float d[N / 8][4];
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[j][e] = -1.f;  // overwritten: the first product does not add
  wgmma_fence();
  for (int k0 = 0; k0 < K; k0 += 16) {
    const std::uint64_t da =
        wgmma_desc(sA, TransA ? mnmajor_operand(64, k0, 0) : kmajor_operand(K, 0, k0));
    const std::uint64_t db =
        wgmma_desc(sB, TransB ? mnmajor_operand(N, k0, 0) : kmajor_operand(K, 0, k0));
    // The kernels' other form (wgmma_desc16: the region's base / 16 plus constant offsets) must
    // give the same bits; a difference poisons D.
    const std::uint32_t base16 = smem_addr(sA) >> 4;
    if (wgmma_desc16(base16, 0, TransA ? mnmajor_operand(64, k0, 0) : kmajor_operand(K, 0, k0)) !=
            da ||
        wgmma_desc16(base16, 64 * K * 2,
                     TransB ? mnmajor_operand(N, k0, 0) : kmajor_operand(K, 0, k0)) != db)
      desc_mismatch = true;
    if constexpr (N == 16)
      wgmma_m64n16k16<TransA, TransB>(d, da, db, k0 > 0);
    else if constexpr (N == 32)
      wgmma_m64n32k16<TransA, TransB>(d, da, db, k0 > 0);
    else if constexpr (N == 64)
      wgmma_m64n64k16<TransA, TransB>(d, da, db, k0 > 0);
    else
      wgmma_m64n128k16<TransA, TransB>(d, da, db, k0 > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);

  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + g + 8 * (e / 2), col = 8 * j + 2 * c + (e % 2);
      D[row * N + col] = desc_mismatch ? __int_as_float(0x7fc00000) : d[j][e];
    }
}

template <int N, bool TransA, bool TransB>
int launch(const std::uint16_t* A, const std::uint16_t* B, float* D, int K) {
  const auto kernel = wgmma_probe_kernel<N, TransA, TransB>;
  const int smem = (64 + N) * K * 2;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<1, 128, smem>>>(A, B, D, K);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

template <int N>
int launch_n(const std::uint16_t* A, const std::uint16_t* B, float* D, int K, bool a_m_major,
             bool b_n_major) {
  if (a_m_major)
    return b_n_major ? launch<N, true, true>(A, B, D, K) : launch<N, true, false>(A, B, D, K);
  return b_n_major ? launch<N, false, true>(A, B, D, K) : launch<N, false, false>(A, B, D, K);
}

}  // namespace

int wgmma_probe_gemm(const std::uint16_t* A, const std::uint16_t* B, float* D, int N, int K,
                     bool a_m_major, bool b_n_major) {
  if (K <= 0 || K % 16 != 0 || K > 256) return cudaErrorInvalidValue;
  if (N == 16) return launch_n<16>(A, B, D, K, a_m_major, b_n_major);
  if (N == 32) return launch_n<32>(A, B, D, K, a_m_major, b_n_major);
  if (N == 64) return launch_n<64>(A, B, D, K, a_m_major, b_n_major);
  if (N == 128) return launch_n<128>(A, B, D, K, a_m_major, b_n_major);
  return cudaErrorInvalidValue;
}

}  // namespace gdr::cuda::detail
