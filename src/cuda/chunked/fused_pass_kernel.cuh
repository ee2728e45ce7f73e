// fused_pass_kernel: the chunked forward's state pass with Vnew formed on chip from the raw v rows
// and every product a warpgroup product over all 128 value columns of a head (docs/cuda-chunked.md
// §A fused forward on warpgroup products; this is its first form: two warpgroups, no warp
// specialisation, no segments). The row-factor path (scalar gate, bf16 inputs without a mask,
// Dk = Dv = 128, 16-byte aligned rows), the output inside; DecodeOverrides::chunked_state_pass =
// 5, opt-in until it has run on a GPU. A block takes BV of the 128 value columns (BV = 128, 64 or
// 32: grid (N, Hv, 128 / BV); the columns of the state are independent, so that fewer columns per
// block fill more SMs where sequences x heads are few, at the price of the k, q, T~, P tiles read
// once per block).
//
// Inputs per chunk c of value head h (item p): the raw q, k rows of the key head and the block's
// columns of the v rows (bf16, staged as tiles), and from the bf16 prep's fused mode T~ = Tinv
// diag(beta) (bf16 [C][C]) and ek = e^G / |k| (fp32 [C]), with prep's P (bf16 [C][C]), fq, fk (fp32
// [C]) and gn. Per chunk, for the block's columns of the state S [Dk][BV] (fp32, in registers:
// warpgroup w holds state rows 64 w .. 64 w + 63 as one m64nBV accumulator, warp i of the block the
// rows 16 i .. 16 i + 15):
//   publish  S -> bf16 tile S_b [Dk][BV] (and the chunk-state record where asked: `saved` fp32,
//            `states16` bf16 = S_b);
//   X  = K S_b, QS = Q S_b           warpgroup w: the block's columns BV / 2 w .. BV / 2 (w + 1) -
//   1,
//                                    8 x m64n(BV / 2)k16 each (A = the k / q rows K-major, B = S_b
//                                    N-major);
//   Y  = bf16(V - diag(ek) X)       -> tile [C][BV] (the warpgroup's columns);
//   Vn = T~ Y                        4 x m64n(BV / 2)k16 (A = T~ K-major, B = Y N-major);
//   bf16(Vn) -> tile, bf16(diag(fk) Vn) -> tile; QS rows *= fq;
//   S  <- gn S + K^T bf16(diag(fk) Vn)   warpgroup w: its state rows, all BV columns, 4 x m64nBVk16
//                                    (A = the k rows read M-major, K^T in the instruction);
//   o  = diag(fq) QS + P bf16(Vn)    4 x m64n(BV / 2)k16 into QS, rows < the chunk's length to o.
// So Vnew = Tinv diag(beta) (V - diag(e^G / |k|) K S) = U - W S without W or U in memory.
// Roundings (bench/cuda_chunked_error_model.py --fused): S_b in X and QS, Y, T~, Vn in P Vn and
// diag(fk) Vn in the update are bf16; accumulation fp32; S fp32.
// Shared memory: Stages stages of {k, q rows 16 KB each, v rows BV / 8 KB, T~, P 8 KB each, ek,
// fk, fq}, S_b BV / 4 KB, Y, Vn, diag(fk) Vn BV / 8 KB each. Two stages (the next chunk's copies in
// flight during this one's products): 209.5 KB at BV = 128, 153.5 KB at 64, 125.5 KB at 32; one
// block per SM. One stage (BV = 64 or 32; the copies of chunk c + 1 issued once chunk c's products
// are done, DecodeOverrides::chunked_state_buffers = 1; opt-in, unmeasured): 96.75 KB at 64, 72.75
// KB at 32, two blocks per SM, whose chains interleave.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/chunked/chunked_common.cuh"
#include "cuda/chunked/fused_pass_layout.h"
#include "cuda/common/wgmma.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kFusedThreads = 256;       // two warpgroups
inline constexpr int kFusedD = fused_pass::kD;  // Dk = Dv

// Byte offsets of the kernel's shared-memory regions at BV value columns per block (tiles 128-byte
// aligned).
template <int BV, int Stages = 2>
struct FusedPassSmem {
  static constexpr std::uint32_t rows = kC * kFusedD * 2;  // a [C][128] bf16 tile
  static constexpr std::uint32_t cols = kC * BV * 2;       // a [C][BV] bf16 tile
  static constexpr std::uint32_t cc = kC * kC * 2;         // a [C][C] bf16 tile
  static constexpr std::uint32_t K = 0, Q = rows, V = 2 * rows, T = V + cols, P = T + cc;
  static constexpr std::uint32_t EK = P + cc, FK = EK + 4 * kC, FQ = FK + 4 * kC;
  static constexpr std::uint32_t stage = FQ + 4 * kC;  // per stage
  static constexpr std::uint32_t S = Stages * stage;   // S_b [Dk][BV]
  static constexpr std::uint32_t Y = S + kFusedD * BV * 2;
  static constexpr std::uint32_t Vn = Y + cols;
  static constexpr std::uint32_t Vk = Vn + cols;
  static constexpr std::uint32_t bytes = Vk + cols;
  static_assert(stage % 128 == 0, "stages keep the tiles 128-byte aligned");
};

template <int BV, int Stages = 2>
__global__ void __launch_bounds__(kFusedThreads, Stages == 1 ? 2 : 1)
    fused_pass_kernel(ChunkArgs a) {
  static_assert(BV == 128 || BV == 64 || BV == 32, "value columns per block: 128, 64 or 32");
  static_assert(Stages == 2 || (Stages == 1 && BV <= 64), "one stage: 64 or 32 columns");
  using L = FusedPassSmem<BV, Stages>;
  constexpr int D = kFusedD;
  constexpr int H = BV / 2;  // a warpgroup's columns in the C-row products
  constexpr int JH = H / 8, JS = BV / 8;
  using wgmma_layout::tile_offset;
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  const detail::RegionDescriptors desc(smem);  // tiles by byte offset in smem
  auto f32 = [smem](std::uint32_t byte) { return reinterpret_cast<float*>(smem + byte); };
  auto bf16_at = [smem](std::uint32_t byte) {
    return reinterpret_cast<__nv_bfloat162*>(smem + byte);
  };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = detail::warpgroup_index(), wl = warp & 3;
  const int lg = lane >> 2, lc = lane & 3;
  const int h = blockIdx.y, hk = h / a.group;
  const std::int64_t n = blockIdx.x;
  const int c0 = BV * static_cast<int>(blockIdx.z);  // the block's first value column
  const SeqInfo seq = seq_info(a, n);
  const std::int64_t chunks = seq.chunks;
  auto item = [&](std::int64_t c) { return (seq.slot0 + c) * a.Hv + h; };
  const __nv_bfloat16* gT = static_cast<const __nv_bfloat16*>(a.W);  // T~ in W's scratch
  const __nv_bfloat16* gP = static_cast<const __nv_bfloat16*>(a.P);
  auto issue = [&](std::int64_t c) {
    const std::uint32_t st = static_cast<std::uint32_t>(c % Stages) * L::stage;
    const std::int64_t t0 = seq.bos + c * kC;
    const int len = chunk_rows(seq, c);
    copy_token_tile<D, kFusedThreads>(smem + st + L::K, a.k, a.k_sb, a.k_st, a.k_sh, seq.b, t0, hk,
                                      len);
    copy_token_tile<D, kFusedThreads>(smem + st + L::Q, a.q, a.q_sb, a.q_st, a.q_sh, seq.b, t0, hk,
                                      len);
    copy_token_tile<BV, kFusedThreads>(smem + st + L::V,
                                       static_cast<const __nv_bfloat16*>(a.v) + c0, a.v_sb, a.v_st,
                                       a.v_sh, seq.b, t0, h, len);
    copy_tile<kC, kFusedThreads>(smem + st + L::T, gT + item(c) * kC * kC, kC);
    copy_tile<kC, kFusedThreads>(smem + st + L::P, gP + item(c) * kC * kC, kC);
    copy_block<1, kC, kFusedThreads>(f32(st + L::EK), kC, a.ek + item(c) * kC, kC);
    copy_block<1, kC, kFusedThreads>(f32(st + L::FK), kC, a.fk + item(c) * kC, kC);
    copy_block<1, kC, kFusedThreads>(f32(st + L::FQ), kC, a.fq + item(c) * kC, kC);
  };

  // S[j][e]: state row 16 warp + lg + 8 (e >> 1), column c0 + 8 j + 2 lc + (e & 1).
  const int i0 = 16 * warp;
  float S[JS][4];
  load_state_slice(a.h0, n * a.h0_s0 + h * a.h0_s1, a.h0_s2, a.v_first, c0, i0, S);
  float gn_next = 0.f;
  if (chunks > 0) {
    issue(0);
    gn_next = a.gn[item(0)];
  }
  detail::cp_async_commit();

  const int cw = H * wg;  // this warpgroup's columns (of the block's) in the C-row products
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::uint32_t st = static_cast<std::uint32_t>(c % Stages) * L::stage;
    const std::int64_t slot = seq.slot0 + c;
    const float gn = gn_next;
    // Publish S as bf16 (and the chunk-state record; its columns are even, so one alignment test
    // of its base serves every pair).
    const std::int64_t rec = slot * a.saved_s0 + h * a.saved_s1;
    float* saved = a.saved ? a.saved + rec : nullptr;
    __nv_bfloat16* states16 = a.states16 ? a.states16 + rec : nullptr;
    const bool rec_pairs = saved ? pair_aligned(saved) : states16 && pair_aligned(states16);
#pragma unroll
    for (int j = 0; j < JS; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = i0 + lg + 8 * hf, col = 8 * j + 2 * lc;
        const float s0 = S[j][2 * hf], s1 = S[j][2 * hf + 1];
        *bf16_at(L::S + tile_offset(i, col, BV)) = __floats2bfloat162_rn(s0, s1);
        const std::int64_t at = std::int64_t(i) * D + c0 + col;
        if (saved)
          store_pair_any(saved + at, s0, s1, rec_pairs);
        else if (states16)  // S_b's values
          store_pair_any(states16 + at, s0, s1, rec_pairs);
      }
    cp_async_wait<0>();  // chunk c's tiles (this thread's copies)
    detail::fence_proxy_async();
    __syncthreads();  // #1: S_b published, chunk c's tiles landed, chunk c - 1's stage free
    if constexpr (Stages == 2) {
      if (c + 1 < chunks) {
        issue(c + 1);
        gn_next = a.gn[item(c + 1)];
      }
      detail::cp_async_commit();
    }

    // X = K S_b, QS = Q S_b on the warpgroup's columns, two groups: Y needs X only, so that Q S_b
    // (off the critical path) runs while Y is formed.
    float X[JH][4] = {}, QS[JH][4] = {};
    detail::wgmma_fence_operand(X);
    detail::wgmma_fence_operand(QS);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      detail::wgmma_m64k16<H, false, true>(X, desc(st + L::K, fused_pass::rows_a(ks)),
                                           desc(L::S, fused_pass::cols_b(BV, wg, ks)), ks > 0);
    detail::wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      detail::wgmma_m64k16<H, false, true>(QS, desc(st + L::Q, fused_pass::rows_a(ks)),
                                           desc(L::S, fused_pass::cols_b(BV, wg, ks)), ks > 0);
    detail::wgmma_commit();
    detail::wgmma_wait<1>();  // X
    detail::wgmma_fence_operand(X);
    // Y = bf16(V - diag(ek) X) on the same columns (fragment rows r, columns cw + 8 j + 2 lc).
    {
      const float* ek = f32(st + L::EK);
#pragma unroll
      for (int j = 0; j < JH; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * wl + lg + 8 * hf, col = cw + 8 * j + 2 * lc;
          const float2 v = __bfloat1622float2(*bf16_at(st + L::V + tile_offset(r, col, BV)));
          *bf16_at(L::Y + tile_offset(r, col, BV)) =
              __floats2bfloat162_rn(v.x - ek[r] * X[j][2 * hf], v.y - ek[r] * X[j][2 * hf + 1]);
        }
    }
    detail::fence_proxy_async();
    // Only this warpgroup reads its columns of Y: a barrier of its 128 threads (ids 1, 2).
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
    // Vn = T~ Y on the warpgroup's columns.
    float Vn[JH][4] = {};
    detail::wgmma_fence_operand(Vn);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64k16<H, false, true>(Vn, desc(st + L::T, fused_pass::cc_a(ks)),
                                           desc(L::Y, fused_pass::cols_b(BV, wg, ks)), ks > 0);
    detail::wgmma_commit();
    detail::wgmma_wait<0>();  // QS and Vn
    detail::wgmma_fence_operand(QS);
    detail::wgmma_fence_operand(Vn);
    // bf16(Vn) for P Vn, bf16(diag(fk) Vn) for the update; QS rows scaled by fq.
    {
      const float* fk = f32(st + L::FK);
      const float* fq = f32(st + L::FQ);
#pragma unroll
      for (int j = 0; j < JH; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * wl + lg + 8 * hf, col = cw + 8 * j + 2 * lc;
          const float v0 = Vn[j][2 * hf], v1 = Vn[j][2 * hf + 1];
          *bf16_at(L::Vn + tile_offset(r, col, BV)) = __floats2bfloat162_rn(v0, v1);
          *bf16_at(L::Vk + tile_offset(r, col, BV)) = __floats2bfloat162_rn(fk[r] * v0, fk[r] * v1);
          QS[j][2 * hf] *= fq[r];
          QS[j][2 * hf + 1] *= fq[r];
        }
    }
    detail::fence_proxy_async();
    __syncthreads();  // #2: diag(fk) Vn whole (the update reads every column)
    // S <- gn S + K^T bf16(diag(fk) Vn) on this warpgroup's rows; o += P bf16(Vn).
#pragma unroll
    for (int j = 0; j < JS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[j][e] *= gn;
    detail::wgmma_fence_operand(S);
    detail::wgmma_fence_operand(QS);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64k16<BV, true, true>(S, desc(st + L::K, fused_pass::update_a(wg, ks)),
                                           desc(L::Vk, fused_pass::update_b(BV, ks)));
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64k16<H, false, true>(QS, desc(st + L::P, fused_pass::cc_a(ks)),
                                           desc(L::Vn, fused_pass::cols_b(BV, wg, ks)));
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_operand(S);
    detail::wgmma_fence_operand(QS);
    // o: rows < the chunk's length, this warpgroup's columns, bf16 pairs.
    {
      const int len = chunk_rows(seq, c);
      __nv_bfloat16* o16 = static_cast<__nv_bfloat16*>(a.o);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * wl + lg + 8 * hf;
        if (r >= len) continue;
        __nv_bfloat16* orow = o16 + seq.b * a.o_sb + (seq.bos + c * kC + r) * a.o_st + h * a.o_sh;
        const bool pairs = pair_aligned(orow);
#pragma unroll
        for (int j = 0; j < JH; ++j)
          store_pair_any(orow + c0 + cw + 8 * j + 2 * lc, QS[j][2 * hf], QS[j][2 * hf + 1], pairs);
      }
    }
    if (Stages == 1 && c + 1 < chunks) {
      __syncthreads();  // #3: both warpgroups' products of chunk c have read the stage
      issue(c + 1);
      gn_next = a.gn[item(c + 1)];
      detail::cp_async_commit();
    }
  }
  cp_async_wait<0>();
  store_state_slice(a.hout, n * a.hout_s0 + h * a.hout_s1, a.hout_s2, a.v_first, c0, i0, S);
}

}  // namespace gdr::cuda::chunked
