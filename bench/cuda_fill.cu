// Device-side random fills for the CUDA benchmarks (inputs of hundreds of MB are drawn on the
// GPU: a counter-based hash per element, so a set is reproducible from its seed).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_fill.h"

namespace gdr::bench {
namespace {

__device__ __forceinline__ float hash_uniform(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + i;  // splitmix64
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
}

__device__ __forceinline__ void put(void* p, std::int64_t i, int dtype, float x) {
  if (dtype == 2)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  else if (dtype == 1)
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  else
    static_cast<float*>(p)[i] = x;
}

__global__ void fill_kernel(void* p, int dtype, std::int64_t n, std::uint64_t seed, float lo,
                            float hi) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    put(p, i, dtype, lo + (hi - lo) * hash_uniform(seed, i));
}

// Rows of `dim` values drawn in [-1, 1) and scaled to unit L2 norm (one warp per row).
__global__ void unit_rows_kernel(void* p, int dtype, std::int64_t rows, int dim,
                                 std::uint64_t seed) {
  const std::int64_t row = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float ss = 0.f;
  for (int i = lane; i < dim; i += 32) {
    const float x = 2.f * hash_uniform(seed, row * dim + i) - 1.f;
    ss += x * x;
  }
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float r = rsqrtf(ss + 1e-12f);
  for (int i = lane; i < dim; i += 32)
    put(p, row * dim + i, dtype, (2.f * hash_uniform(seed, row * dim + i) - 1.f) * r);
}

}  // namespace

cudaError_t fill_uniform(void* p, int dtype, std::int64_t n, std::uint64_t seed, float lo, float hi,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const std::int64_t blocks = (n + 255) / 256 < 65536 ? (n + 255) / 256 : 65536;
  fill_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, dtype, n, seed, lo, hi);
  return cudaGetLastError();
}

cudaError_t fill_unit_rows(void* p, int dtype, std::int64_t rows, int dim, std::uint64_t seed,
                           cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const std::int64_t blocks = (rows * 32 + 255) / 256;
  unit_rows_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, dtype, rows, dim, seed);
  return cudaGetLastError();
}

}  // namespace gdr::bench
