// The operands of the fused pass (fused_pass_kernel.cuh) in its shared-memory tiles
// (wgmma_layout.h), as plain constexpr C++ so that a CPU test (tests/cpp/test_wgmma_layout.cpp)
// checks that each product reads the elements it means. A block takes BV of the D value columns
// (BV in {32, 64, 128}). Tiles (bf16, rows x cols): the k and q rows [C][D]; the block's columns of
// the v rows, Y, Vn and diag(fk) Vn [C][BV]; T~ and P [C][C]; S_b [D][BV] (D = Dk = Dv = 128).
// Warpgroup wg (of two) forms the C-row products (K S_b, Q S_b, T~ Y, P Vn) on the block's columns
// BV / 2 wg .. BV / 2 (wg + 1) - 1 and the update K^T (diag(fk) Vn) on the state rows
// 64 wg .. 64 wg + 63, all BV columns.
#pragma once

#include "cuda/common/wgmma_layout.h"

namespace gdr::cuda::chunked::fused_pass {

using wgmma_layout::kmajor_operand;
using wgmma_layout::mnmajor_operand;
using wgmma_layout::Operand;

inline constexpr int kRows = 64;  // C
inline constexpr int kD = 128;    // Dk = Dv

// A of K S_b and Q S_b at k step ks (16 state rows): the k / q rows [C][D] K-major.
GDR_HOST_DEVICE constexpr Operand rows_a(int ks) {
  return kmajor_operand(kD, 0, 16 * ks);
}
// A of T~ Y and P Vn at k step ks (16 tokens): T~ or P [C][C] K-major.
GDR_HOST_DEVICE constexpr Operand cc_a(int ks) {
  return kmajor_operand(kRows, 0, 16 * ks);
}
// B of the C-row products at k step ks: a [K][BV] tile (S_b, Y, Vn) N-major, the warpgroup's
// BV / 2 columns.
GDR_HOST_DEVICE constexpr Operand cols_b(int bv, int wg, int ks) {
  return mnmajor_operand(bv, 16 * ks, bv / 2 * wg);
}
// The update K^T (diag(fk) Vn) at k step ks (16 tokens): A = K^T, the warpgroup's 64 state rows,
// from the k rows [C][D] read M-major; B = diag(fk) Vn [C][BV] N-major, all BV columns.
GDR_HOST_DEVICE constexpr Operand update_a(int wg, int ks) {
  return mnmajor_operand(kD, 16 * ks, 64 * wg);
}
GDR_HOST_DEVICE constexpr Operand update_b(int bv, int ks) {
  return mnmajor_operand(bv, 16 * ks, 0);
}

}  // namespace gdr::cuda::chunked::fused_pass
