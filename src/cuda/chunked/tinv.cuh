// Tinv = (I + A)^{-1} of a chunk's strictly lower [C, C] matrix A (C = 64), shared by the prep
// kernels (chunked_kernels.cuh, prep_bf16_kernel.cuh). fp32 FFMA, by 16 x 16 blocks (A strictly
// lower, so Tinv is unit lower triangular):
//   T_ii = (I + A_ii)^{-1}                         forward substitution, the 4 blocks at once;
//   T_ij = -T_ii X_ij,  X_ij = sum_{q in blocks j .. i-1} A[i rows, q] T[q, j cols]   (i > j),
//   by distance d = i - j = 1, 2, 3 (X_ij needs the blocks of column j above it). X_ij is kept in
//   sA's block (j, i), above the diagonal, which nothing reads (A is strictly lower).
#pragma once

#include "cuda/chunked/chunked_common.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kLdA = 68;  // row stride (floats) of A and Tinv in shared memory

// sA [C][kLdA] holds A (its upper blocks are overwritten); sT [C][kLdA] receives Tinv. Called by
// all 256 threads of the block; ends with a barrier.
__device__ __forceinline__ void unit_lower_inverse(float* sA, float* sT) {
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

}  // namespace gdr::cuda::chunked
