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
//   mma.sync m16n8k8 products in 3xTF32 (chunked_common.cuh mma_tile<1, true>: ~2^-21 relative
//   per product against fp32 FFMA's 2^-24), X_ij through the warp's own columns of sA's block
//   (j, i) and a warp barrier: one block barrier per distance instead of two, and 6 d + 6 products
//   per warp where by columns a thread runs 16 d + 16 dependent FMA steps.
#pragma once

#include "cuda/chunked/chunked_common.cuh"

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
      const float* Aij = sA + 16 * i * ldA + 16 * j;
      const float* Tjj = sT + 16 * j * ldA + 16 * j + n0;
      float x[1][4] = {};
      mma_tile<1, true>(
          x, 16 * d, [&](int r, int k) { return Aij[r * ldA + k]; },
          [&](int k, int n) { return Tjj[k * ldA + n]; });
      // Into this warp's 8 columns of sA's block (j, i) (above the diagonal: A never reads it).
      float* X = sA + 16 * j * ldA + 16 * i + n0;
#pragma unroll
      for (int e = 0; e < 4; ++e) X[(g + 8 * (e >> 1)) * ldA + 2 * c + (e & 1)] = x[0][e];
      __syncwarp();
      // T_ij = -T_ii X_ij: K = 16 (T_ii is zero above its diagonal).
      const float* Tii = sT + 16 * i * ldA + 16 * i;
      float t[1][4] = {};
      mma_tile<1, true>(
          t, 16, [&](int r, int k) { return Tii[r * ldA + k]; },
          [&](int k, int n) { return X[k * ldA + n]; });
      float* T = sT + 16 * i * ldA + 16 * j + n0;
#pragma unroll
      for (int e = 0; e < 4; ++e) T[(g + 8 * (e >> 1)) * ldA + 2 * c + (e & 1)] = -t[0][e];
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
