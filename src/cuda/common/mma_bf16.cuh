// bf16 operand helpers for mma.sync m16n8k16 (detail::mma_bf16 in mma_tf32.cuh): packing two
// bf16 values into one 32-bit register (the lower k in the low half) and the two-part split of
// fp32 values into bf16 hi + lo.
//
// Two-part split (2xBF16): hi = bf16_rn(x), lo = bf16_rn(x - hi). x - hi is exact in fp32 and
// |x - hi| <= 2^-9 |x|, so |x - (hi + lo)| <= 2^-9 |x - hi| <= 2^-18 |x| (normal range). A product
// A B with A exact in bf16 and B split this way (two mma.sync, A hi-part + A lo-part products
// accumulated in fp32) is then accurate to ~2^-17 relative per term: better than one tf32 product
// (operands rounded to 2^-11) at the same number of tensor-core instructions per k (two k16
// products vs two k8 products).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/mma_tf32.cuh"

namespace gdr::cuda::detail {

// x in the low half, y in the high half.
__device__ __forceinline__ std::uint32_t pack_bf16(__nv_bfloat16 x, __nv_bfloat16 y) {
  return static_cast<std::uint32_t>(__bfloat16_as_ushort(x)) |
         (static_cast<std::uint32_t>(__bfloat16_as_ushort(y)) << 16);
}

// (x, y) rounded to bf16 (nearest even), x in the low half.
__device__ __forceinline__ std::uint32_t pack_bf16(float x, float y) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const std::uint32_t*>(&p);
}

// (x, y) = hi + lo (+ at most 2^-18 relative each), both pairs bf16, x in the low halves.
__device__ __forceinline__ void split_bf16(float x, float y, std::uint32_t& hi, std::uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
  hi = *reinterpret_cast<const std::uint32_t*>(&h);
  lo = *reinterpret_cast<const std::uint32_t*>(&l);
}

// ldmatrix: four 8 x 8 matrices of 16-bit elements from shared memory, one row address per lane
// (lanes 8 m .. 8 m + 7 give the rows of matrix m; rows 16-byte aligned). Without .trans, lane
// 4 i + c receives row i, elements 2c and 2c + 1 of each matrix (an A fragment, or a B fragment
// from B^T stored row-major); with .trans, elements (2c, i) and (2c + 1, i) (a B fragment from B
// stored row-major, k along the rows). r.x .. r.w: matrices 0 .. 3.
__device__ __forceinline__ uint4 ldmatrix_x4(const void* row) {
  uint4 r;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "r"(smem_addr(row))
               : "memory");
  return r;
}
__device__ __forceinline__ uint4 ldmatrix_x4_trans(const void* row) {
  uint4 r;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "r"(smem_addr(row))
               : "memory");
  return r;
}

// acc[0..3] += A B over 32 columns: `a` an A fragment (16 x 16), b01 and b23 the B fragments of
// columns 0-15 and 16-31 as ldmatrix x4 returns them (x, y: the first 8 columns; z, w: the next 8).
__device__ __forceinline__ void mma_bf16_n32(float (&acc)[4][4], uint4 a, uint4 b01, uint4 b23) {
  mma_bf16(acc[0], a, b01.x, b01.y);
  mma_bf16(acc[1], a, b01.z, b01.w);
  mma_bf16(acc[2], a, b23.x, b23.y);
  mma_bf16(acc[3], a, b23.z, b23.w);
}

}  // namespace gdr::cuda::detail
