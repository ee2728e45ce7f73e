// Tinv = (I + A)^{-1} of a chunk's strictly lower [C, C] matrix A (C = 64), shared by the prep
// kernels (chunked_kernels.cuh, prep_bf16_kernel.cuh). fp32 FFMA, by 16 x 16 blocks (A strictly
// lower, so Tinv is unit lower triangular):
//   T_ii = (I + A_ii)^{-1}                         forward substitution, a thread per column of
//                                                  each diagonal block, the column in registers;
//   T_ij = -T_ii X_ij,  X_ij = sum_{q in blocks j .. i-1} A[i rows, q] T[q, j cols]   (i > j),
//   by distance d = i - j = 1, 2, 3 (X_ij needs the blocks of column j above it), a thread per
//   row and 4 columns (one 16-byte load of T or X per 4 FMAs). X_ij is kept in sA's block (j, i),
//   above the diagonal, which nothing reads (A is strictly lower).
// (Before 2026-12-07 the diagonal blocks took four lanes per column with two shuffles and a warp
// barrier per row, and the products a thread per entry with two shared loads per FMA: about half
// of the bf16 prep kernel's time, H100 phase timing in bench/results/2026-12-07-chunk-knobs-h100
// -ef0210b.json.)
#pragma once

#include "cuda/chunked/chunked_common.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kLdA =
    68;  // row stride (floats) of A and Tinv in shared memory (16-byte rows)

// sA [C][kLdA] holds A (its upper blocks are overwritten); sT [C][kLdA] receives Tinv (with zeros
// above the diagonal blocks and in the padding columns). Called by all 256 threads of the block;
// ends with a barrier.
__device__ __forceinline__ void unit_lower_inverse(float* sA, float* sT) {
  constexpr int ldA = kLdA;
  static_assert(kC == 64, "four 16 x 16 blocks");
  static_assert(kLdA % 4 == 0, "16-byte rows");
  const int tid = threadIdx.x;
  // Zeros above the diagonal blocks and in the padding; the other entries are written below.
  for (int e = tid; e < kC * ldA; e += 256) {
    const int r = e / ldA, j = e - r * ldA;
    if (j >= kC || (j >> 4) > (r >> 4)) sT[e] = 0.f;
  }
  if (tid < 64) {  // diagonal block R / 16, column col: T[R + r][R + col] for r = 0 .. 15
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

}  // namespace gdr::cuda::chunked
