// Tinv = (I + A)^{-1} of a chunk's strictly lower [C, C] matrix A (C = 64), shared by the prep
// kernels (chunked_kernels.cuh, prep_bf16_kernel.cuh). fp32 FFMA, by 16 x 16 blocks (A strictly
// lower, so Tinv is unit lower triangular):
//   T_ii = (I + A_ii)^{-1}                         forward substitution, the 4 blocks at once;
//   T_ij = -T_ii X_ij,  X_ij = sum_{q in blocks j .. i-1} A[i rows, q] T[q, j cols]   (i > j),
//   by distance d = i - j = 1, 2, 3 (X_ij needs the blocks of column j above it). X_ij is kept in
//   sA's block (j, i), above the diagonal, which nothing reads (A is strictly lower).
// Two schedules of the same sums:
// - by lanes (DecodeOverrides::chunked_tinv = 1): the diagonal blocks by four lanes per column
//   with two shuffles and a warp barrier per row, the products a thread per entry (two shared
//   loads per FMA). About half of the bf16 prep kernel's time (H100 phase timing,
//   bench/results/2026-12-07-chunk-knobs-h100-ef0210b.json: 20.0 k of ~38 k cycles per block).
// - by columns (the rule, ChunkArgs::tinv_by_columns): the diagonal blocks by a thread per column
//   with the column in registers (no shuffles or barriers per row), the products by a thread per
//   row and 4 columns (16-byte loads, one shared load per 4 FMAs; the off-diagonal sums in the
//   same order as by lanes, the diagonal blocks' in another). H100 (a560176): the Tinv phase
//   9.3 k cycles per block, the forward 5-8 % faster on every benchmark row (1 x 16384 1.86 ->
//   1.72 ms, per-key 1 x 16384 4.88 -> 4.69 ms).
// - on the tensor cores (DecodeOverrides::chunked_tinv = 3): the diagonal blocks as by columns,
//   each off-diagonal block X_ij and T_ij = -T_ii X_ij by two warps (8 columns each) as
//   mma.sync m16n8k8 products in 3xTF32 (hi hi + hi lo + lo hi, each part in its own
//   accumulator; the parts of fp32 operands, so ~2^-21 relative per product against fp32 FFMA's
//   2^-24), X_ij through the warp's own columns of sA's block (j, i) and a warp barrier: one
//   block barrier per distance instead of two, and ~6 d + 6 products per warp where by columns a
//   thread runs 16 d + 16 dependent FMA steps.
#pragma once

#include "cuda/chunked/chunked_common.cuh"
#include "cuda/common/mma_tf32.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kLdA =
    68;  // row stride (floats) of A and Tinv in shared memory (16-byte rows)

__device__ __forceinline__ void unit_lower_inverse_by_lanes(float* sA, float* sT) {
  constexpr int ldA = kLdA;
  static_assert(kC == 64, "four 16 x 16 blocks");
  const int tid = threadIdx.x;
  for (int e = tid; e < kC * ldA; e += 256) {
    const int r = e / ldA, j = e - r * ldA;
    sT[e] = r == j ? 1.f : 0.f;
  }
  __syncthreads();
  {  // diagonal blocks: thread (block, column, part), 4 lanes of one warp per column
    const int R = 16 * (tid >> 6), col = (tid >> 2) & 15, part = tid & 3;
    for (int r = 1; r < 16; ++r) {
      float s = 0.f;
      for (int j = col + part; j < r; j += 4)
        s += sA[(R + r) * ldA + R + j] * sT[(R + j) * ldA + R + col];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (part == 0 && col < r) sT[(R + r) * ldA + R + col] = -s;
      __syncwarp();
    }
  }
  __syncthreads();
  for (int d = 1; d < 4; ++d) {
    const int pairs = 4 - d;  // blocks (j + d, j), j = 0 .. pairs - 1
    for (int e = tid; e < pairs * 256; e += 256) {
      const int j = e >> 8, r = (e >> 4) & 15, c = e & 15, i = j + d;
      float x = 0.f;
      for (int q = 16 * j; q < 16 * i; ++q)
        x += sA[(16 * i + r) * ldA + q] * sT[q * ldA + 16 * j + c];
      sA[(16 * j + r) * ldA + 16 * i + c] = x;
    }
    __syncthreads();
    for (int e = tid; e < pairs * 256; e += 256) {
      const int j = e >> 8, r = (e >> 4) & 15, c = e & 15, i = j + d;
      float t = 0.f;
      for (int m = 0; m <= r; ++m)
        t += sT[(16 * i + r) * ldA + 16 * i + m] * sA[(16 * j + m) * ldA + 16 * i + c];
      sT[(16 * i + r) * ldA + 16 * j + c] = -t;
    }
    __syncthreads();
  }
}

// The diagonal blocks T_ii = (I + A_ii)^{-1} by a thread per column (threads 0 .. 63), the column
// in registers; zeros above the diagonal blocks and in the padding. No barrier.
__device__ __forceinline__ void unit_lower_inverse_diagonal(const float* sA, float* sT) {
  constexpr int ldA = kLdA;
  const int tid = threadIdx.x;
  for (int e = tid; e < kC * ldA; e += 256) {
    const int r = e / ldA, j = e - r * ldA;
    if (j >= kC || (j >> 4) > (r >> 4)) sT[e] = 0.f;
  }
  if (tid < 64) {
    const int R = 16 * (tid >> 4), col = tid & 15;
    float t[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const float* arow = sA + (R + r) * ldA + R;
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < r; ++j) s = fmaf(arow[j], t[j], s);  // t[j] = 0 for j < col
      t[r] = r < col ? 0.f : (r == col ? 1.f : -s);
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) sT[(R + r) * ldA + R + col] = t[r];
  }
}

__device__ __forceinline__ void unit_lower_inverse_by_columns(float* sA, float* sT) {
  constexpr int ldA = kLdA;
  static_assert(kC == 64, "four 16 x 16 blocks");
  static_assert(kLdA % 4 == 0, "16-byte rows");
  const int tid = threadIdx.x;
  unit_lower_inverse_diagonal(sA, sT);
  __syncthreads();
  for (int d = 1; d < 4; ++d) {
    const int items = (4 - d) * 64;  // blocks (j + d, j), j = 0 .. 3 - d: 16 rows x 4 columns
    const int j = tid >> 6, r = (tid >> 2) & 15, c = 4 * (tid & 3), i = j + d;
    if (tid < items) {  // X_ij[r, c .. c + 3] into sA's block (j, i)
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int q = 16 * j; q < 16 * i; ++q) {
        const float a = sA[(16 * i + r) * ldA + q];
        const float4 tq = *reinterpret_cast<const float4*>(sT + q * ldA + 16 * j + c);
        x.x = fmaf(a, tq.x, x.x);
        x.y = fmaf(a, tq.y, x.y);
        x.z = fmaf(a, tq.z, x.z);
        x.w = fmaf(a, tq.w, x.w);
      }
      *reinterpret_cast<float4*>(sA + (16 * j + r) * ldA + 16 * i + c) = x;
    }
    __syncthreads();
    if (tid < items) {  // T_ij[r, c .. c + 3] = -(T_ii X_ij)[r, c .. c + 3]
      float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int m = 0; m <= r; ++m) {
        const float a = sT[(16 * i + r) * ldA + 16 * i + m];
        const float4 xm = *reinterpret_cast<const float4*>(sA + (16 * j + m) * ldA + 16 * i + c);
        t.x = fmaf(a, xm.x, t.x);
        t.y = fmaf(a, xm.y, t.y);
        t.z = fmaf(a, xm.z, t.z);
        t.w = fmaf(a, xm.w, t.w);
      }
      *reinterpret_cast<float4*>(sT + (16 * i + r) * ldA + 16 * j + c) =
          make_float4(-t.x, -t.y, -t.z, -t.w);
    }
    __syncthreads();
  }
}

// acc += M[r0 .., k0 ..] N[k0 .., n0 ..] over K = 8 ks columns of M / rows of N, m16n8k8 in
// 3xTF32 (three accumulators: hi hi, hi lo, lo hi); M and N fp32 in shared memory at row stride
// kLdA (g = lane / 4, c = lane % 4 as mma_tf32's fragments).
__device__ __forceinline__ void tf32x3_product(float (&acc)[3][4], const float* M, int r0,
                                               const float* N, int n0, int k0, int ks) {
  constexpr int ld = kLdA;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  for (int s = 0; s < ks; ++s) {
    const int k = k0 + 8 * s;
    const float4 a = make_float4(M[(r0 + g) * ld + k + c], M[(r0 + g + 8) * ld + k + c],
                                 M[(r0 + g) * ld + k + c + 4], M[(r0 + g + 8) * ld + k + c + 4]);
    const float b[2] = {N[(k + c) * ld + n0 + g], N[(k + c + 4) * ld + n0 + g]};
    const float4 ah = make_float4(detail::tf32_hi(a.x), detail::tf32_hi(a.y), detail::tf32_hi(a.z),
                                  detail::tf32_hi(a.w));
    const float4 al = make_float4(a.x - ah.x, a.y - ah.y, a.z - ah.z, a.w - ah.w);
    const float bh0 = detail::tf32_hi(b[0]), bh1 = detail::tf32_hi(b[1]);
    detail::mma_tf32(acc[0], ah, bh0, bh1);
    detail::mma_tf32(acc[1], ah, b[0] - bh0, b[1] - bh1);
    detail::mma_tf32(acc[2], al, bh0, bh1);
  }
}

__device__ __forceinline__ void unit_lower_inverse_tensor_cores(float* sA, float* sT) {
  constexpr int ldA = kLdA;
  static_assert(kC == 64, "four 16 x 16 blocks");
  unit_lower_inverse_diagonal(sA, sT);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int j = warp >> 1, n0 = 8 * (warp & 1);  // block column j, columns n0 .. n0 + 7 of it
  for (int d = 1; d < 4; ++d) {
    const int i = j + d;
    if (i < 4) {
      // X_ij = A[i rows, blocks j .. i - 1] T[blocks j .. i - 1, j cols]: K = 16 d.
      float x[3][4] = {};
      tf32x3_product(x, sA, 16 * i, sT, 16 * j + n0, 16 * j, 2 * d);
      // Into this warp's 8 columns of sA's block (j, i) (above the diagonal: A never reads it).
      float* X = sA + 16 * j * ldA + 16 * i + n0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 2 * h;
        X[(g + 8 * h) * ldA + 2 * c] = (x[0][e] + x[1][e]) + x[2][e];
        X[(g + 8 * h) * ldA + 2 * c + 1] = (x[0][e + 1] + x[1][e + 1]) + x[2][e + 1];
      }
      __syncwarp();
      // T_ij = -T_ii X_ij: K = 16 (T_ii is zero above its diagonal).
      float t[3][4] = {};
      tf32x3_product(t, sT + 16 * i, 16 * i, X - n0, n0, 0, 2);
      float* T = sT + 16 * i * ldA + 16 * j + n0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 2 * h;
        T[(g + 8 * h) * ldA + 2 * c] = -((t[0][e] + t[1][e]) + t[2][e]);
        T[(g + 8 * h) * ldA + 2 * c + 1] = -((t[0][e + 1] + t[1][e + 1]) + t[2][e + 1]);
      }
    }
    __syncthreads();
  }
}

// Tinv's schedules (ChunkArgs::tinv_schedule, DecodeOverrides::chunked_tinv).
inline constexpr int kTinvByLanes = 1, kTinvByColumns = 2, kTinvTensorCores = 3;

// sA [C][kLdA] holds A (its upper blocks are overwritten); sT [C][kLdA] receives Tinv (zeros above
// the diagonal blocks and in the padding columns). Called by all 256 threads of the block (the
// schedule uniform); ends with a barrier.
__device__ __forceinline__ void unit_lower_inverse(float* sA, float* sT, int schedule) {
  if (schedule == kTinvTensorCores)
    unit_lower_inverse_tensor_cores(sA, sT);
  else if (schedule == kTinvByLanes)
    unit_lower_inverse_by_lanes(sA, sT);
  else
    unit_lower_inverse_by_columns(sA, sT);
}

}  // namespace gdr::cuda::chunked
