// The operands of the warpgroup-product state pass (state_pass_wgmma_kernel.cuh) in its
// shared-memory tiles (wgmma_layout.h), as plain constexpr C++ so that a CPU test
// (tests/cpp/test_wgmma_layout.cpp) checks that each product reads the elements it means.
// Tiles (bf16, rows x cols, each stored by tile_offset): W, q, k [C][Dk] (chunk rows as stored),
// P [C][C], S hi / lo [Dk][BV], Vnew and diag(fk) Vnew hi / lo [C][BV]. Warpgroup wg (of two)
// computes Vnew = U - W S, q S and P Vnew on the value columns 16 wg .. 16 wg + 15 (m64n16k16),
// and the state update S += k^T V on the state rows 64 wg .. 64 wg + 63 (m64n32k16).
#pragma once

#include "cuda/common/wgmma_layout.h"

namespace gdr::cuda::chunked::wgmma_pass {

using wgmma_layout::kmajor_operand;
using wgmma_layout::mnmajor_operand;
using wgmma_layout::Operand;

inline constexpr int kRows = 64;  // C: the chunk length (chunked_common.cuh kC)
inline constexpr int kDk = 128;   // state rows
inline constexpr int kBV = 32;    // value columns per block
inline constexpr int kHalf = 16;  // value columns per warpgroup in the C-row products

// W S (and q S) at k step ks: A = W [C][Dk] K-major; B = S [Dk][BV] N-major, columns 16 wg ...
GDR_HOST_DEVICE constexpr Operand ws_a(int ks) {
  return kmajor_operand(kDk, 0, 16 * ks);
}
GDR_HOST_DEVICE constexpr Operand ws_b(int wg, int ks) {
  return mnmajor_operand(kBV, 16 * ks, kHalf * wg);
}
// k^T V at k step ks (16 tokens): A = k^T, state rows 64 wg .., from the k tile [C][Dk] read
// M-major (transposed in the instruction); B = V [C][BV] N-major, all BV columns.
GDR_HOST_DEVICE constexpr Operand kv_a(int wg, int ks) {
  return mnmajor_operand(kDk, 16 * ks, 64 * wg);
}
GDR_HOST_DEVICE constexpr Operand kv_b(int ks) {
  return mnmajor_operand(kBV, 16 * ks, 0);
}
// P Vnew at k step ks: A = P [C][C] K-major; B = Vnew [C][BV] N-major, columns 16 wg ...
GDR_HOST_DEVICE constexpr Operand pv_a(int ks) {
  return kmajor_operand(kRows, 0, 16 * ks);
}
GDR_HOST_DEVICE constexpr Operand pv_b(int wg, int ks) {
  return mnmajor_operand(kBV, 16 * ks, kHalf * wg);
}

// The backward's reverse pass (bwd_state_wgmma_kernel.cuh) reuses these with its own tiles (Kd dS
// as W S, Qs^T dO and W^T dVnew as k^T V, dO as P Vnew's B) and adds P^T dO at k step ks: A = P^T
// from the P tile [C][C] read M-major.
GDR_HOST_DEVICE constexpr Operand pt_a(int ks) {
  return mnmajor_operand(kRows, 16 * ks, 0);
}

}  // namespace gdr::cuda::chunked::wgmma_pass
