// state_pass_wgmma_kernel<FuseOut, Stored>: the bf16 state pass (state_pass_bf16_kernel.cuh, the
// same inputs, outputs and rounding; Dk = 128, 32 value columns per block) with its products as
// warpgroup products (wgmma.cuh) on operands in shared memory instead of mma.sync on ldmatrix
// fragments: the pass is bound by its instruction count (Nsight Compute, H100, ef0210b: ~790 warp
// instructions per warp and chunk, IPC 1.5), and one m64n16k16 stands for the 8 ldmatrix + 16
// mma a warp issues for the same piece. Opt-in (DecodeOverrides::chunked_state_pass = 3): correct
// and slower on an H100 (a560176: 1 x 16384 forward 2.16 ms against the bf16 pass's 1.86; ncu
// 1.20 ms against 0.86, ~1230 warp instructions per warp and chunk against ~1100: its copies'
// index arithmetic and runtime descriptors, docs/cuda-chunked.md §Where the time goes).
//
// Per chunk c, for the state slice S [Dk, 32] (fp32, in registers: thread t of warpgroup wg holds
// the m64n32 accumulator fragment of state rows 64 wg .. 64 wg + 63, i.e. warp w the rows
// 16 w .. 16 w + 15 as in the bf16 pass):
//   publish  S -> bf16 hi + lo tiles [Dk][32] (S's chunk-state row from the registers);
//   Vnew   = U - W S_hi - W S_lo           warpgroup wg: columns 16 wg .. + 15, 16 x m64n16k16;
//   (FuseOut) q S = q S_hi (OutLo: + q S_lo, given fp32 `saved`), the same columns, 8 (16) more;
//            Vnew -> U's place (bf16; FuseOut: a bf16 tile for P Vnew instead), and
//            diag(fk) Vnew -> bf16 hi + lo tiles [C][32];
//   S      <- diag(gn) S + k^T (diag(fk) Vnew)_hi + k^T (..)_lo   warpgroup wg: rows 64 wg ..,
//            8 x m64n32k16 with the k rows [C][Dk] read M-major (k^T, transposed in the
//            instruction);
//   (FuseOut) o = diag(fq) (q S) + P Vnew    4 x m64n16k16, P [C][C] (zero above the diagonal);
//            Stored: o = Qs S + P Vnew on the stored Qs rows (prep's, with the gates and masks in
//            them), in the input dtype, as chunk_output_kernel's stored-Qs path.
// Tiles (wgmma_layout.h; the operand descriptions in state_pass_wgmma_layout.h): W, k rows (Stored:
// the Kd rows), q rows, P, staged by 16-byte cp.async a chunk ahead (two stages); S hi / lo and the
// Vnew tiles written by the threads. Every shared write that a product reads is followed, in the
// writing thread, by fence.proxy.async and then a barrier. The accumulation order inside a product
// is the hardware's, so the results are not bit-identical to the mma.sync pass (same roundings of
// the operands; fp32 sums).
// Shared memory (bytes): stages 2 x (W 16 K, k 16 K, U 5 K, fk 256 [, q 16 K, P 8 K, fq 256]),
// S hi / lo 16 K, Vnew hi / lo 8 K [, Vnew 4 K]: 99 KB, FuseOut 151 KB.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/chunked/chunked_common.cuh"
#include "cuda/chunked/state_pass_wgmma_layout.h"
#include "cuda/common/wgmma.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kStateWgmmaThreads = 256;  // two warpgroups

// Byte offsets of the kernel's shared-memory regions (tiles first: 128-byte aligned); NS stages.
template <bool FuseOut, int NS = 2>
struct StateWgmmaSmem {
  static constexpr int Dk = wgmma_pass::kDk, BV = wgmma_pass::kBV, ldU = BV + 8;
  static constexpr std::size_t rows_tile = std::size_t(kC) * Dk * 2;  // W, k, q
  static constexpr std::size_t p_tile = std::size_t(kC) * kC * 2;
  static constexpr std::size_t s_tile = std::size_t(Dk) * BV * 2;
  static constexpr std::size_t v_tile = std::size_t(kC) * BV * 2;
  static constexpr std::size_t W = 0;
  static constexpr std::size_t K = W + NS * rows_tile;
  static constexpr std::size_t Q = K + NS * rows_tile;
  static constexpr std::size_t P = Q + (FuseOut ? NS * rows_tile : 0);
  static constexpr std::size_t Shi = P + (FuseOut ? NS * p_tile : 0);
  static constexpr std::size_t Slo = Shi + s_tile;
  static constexpr std::size_t Vhi = Slo + s_tile;
  static constexpr std::size_t Vlo = Vhi + v_tile;
  static constexpr std::size_t Vn = Vlo + v_tile;                        // FuseOut: Vnew (bf16)
  static constexpr std::size_t U = Vn + (FuseOut ? v_tile : 0);          // [NS][C][ldU] bf16
  static constexpr std::size_t fk = U + NS * std::size_t(kC) * ldU * 2;  // [NS][C] fp32
  static constexpr std::size_t fq = fk + NS * kC * 4;                    // FuseOut: [NS][C]
  static constexpr std::size_t bytes = fq + (FuseOut ? NS * kC * 4 : 0);
};

// The stored path's output of one warp's 16 x 16 tile (the fragment of store_output_tile<2>):
// o = (Qs S)[r, j] + (P Vnew)[r, j] in the input dtype, rows r0 + lg and r0 + lg + 8 (< len), as
// chunk_output_kernel's stored-Qs path writes it.
__device__ __forceinline__ void store_stored_output_tile(const ChunkArgs& a, const SeqInfo& seq,
                                                         std::int64_t t0, int h, int col, int r0,
                                                         int len, const float (&qs)[2][4],
                                                         const float (&pv)[2][4]) {
  const int lane = threadIdx.x & 31, lg = lane >> 2, lc = lane & 3;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = r0 + lg + 8 * (e >> 1);
      if (r < len)
        store_from_float(
            a.o, seq.b * a.o_sb + (t0 + r) * a.o_st + h * a.o_sh + col + 8 * j + 2 * lc + (e & 1),
            a.in_dtype, qs[j][e] + pv[j][e]);
    }
}

// OutLo (FuseOut, given fp32 `saved`; the launch says): q S with S's lo part too, as the output
// kernel's fp32-state path; S's hi part alone otherwise (its bf16-state path).
// NS = 2: chunk c + 1's copies are issued as chunk c starts (one block per SM: 151 KB with the
// output inside). NS = 1: one stage, chunk c + 1's copies issued after chunk c's last product, so
// that two blocks fit an SM (89 KB with the output inside, at most 128 registers) and each hides
// the other's copy latency: for launches of more blocks than SMs.
template <bool FuseOut, bool Stored = false, bool OutLo = false, int NS = 2>
__global__ void __launch_bounds__(kStateWgmmaThreads, NS == 1 ? 2 : 1)
    state_pass_wgmma_kernel(ChunkArgs a) {
  static_assert(NS == 1 || NS == 2, "one or two stages");
  static_assert(FuseOut || !OutLo, "OutLo is the fused output's");
  static_assert(wgmma_pass::kRows == kC, "the layout's chunk length is kC");
  using L = StateWgmmaSmem<FuseOut, NS>;
  constexpr int Dk = L::Dk, BV = L::BV, ldU = L::ldU, H = wgmma_pass::kHalf;
  using wgmma_layout::tile_offset;
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  unsigned char* sShi = smem + L::Shi;
  unsigned char* sSlo = smem + L::Slo;
  unsigned char* sVhi = smem + L::Vhi;
  unsigned char* sVlo = smem + L::Vlo;
  unsigned char* sVn = smem + L::Vn;
  auto sW = [&](int b) { return smem + L::W + b * L::rows_tile; };
  auto sK = [&](int b) { return smem + L::K + b * L::rows_tile; };
  auto sQ = [&](int b) { return smem + L::Q + b * L::rows_tile; };
  auto sP = [&](int b) { return smem + L::P + b * L::p_tile; };
  auto sU = [&](int b) { return reinterpret_cast<__nv_bfloat16*>(smem + L::U) + b * kC * ldU; };
  auto sfk = [&](int b) { return reinterpret_cast<float*>(smem + L::fk) + b * kC; };
  auto sfq = [&](int b) { return reinterpret_cast<float*>(smem + L::fq) + b * kC; };

  const detail::RegionDescriptors desc(smem);  // tiles by byte offset in smem
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = detail::warpgroup_index(), wl = warp & 3;  // warpgroup, warp within it
  const int lg = lane >> 2, lc = lane & 3;
  const int h = blockIdx.y, hk = h / a.group;
  const int col0 = blockIdx.z * BV;
  const std::int64_t n = blockIdx.x;
  const int Dv = a.Dv;
  const SeqInfo seq = seq_info(a, n);
  const std::int64_t chunks = seq.chunks;
  int* progress = state_pass_progress(a, n, h, BV);
  const __nv_bfloat16* gW = static_cast<const __nv_bfloat16*>(a.W);
  __nv_bfloat16* gU = static_cast<__nv_bfloat16*>(a.U);
  auto item = [&](std::int64_t c) { return (seq.slot0 + c) * a.Hv + h; };
  auto issue = [&](std::int64_t c) {
    const int b = static_cast<int>(c % NS);
    copy_tile<Dk>(sW(b), gW + item(c) * kC * Dk, Dk);
    copy_block<kC, BV, kStateWgmmaThreads>(sU(b), ldU, gU + item(c) * kC * Dv + col0, Dv);
    const std::int64_t rem = seq.len - c * kC;
    const int len = rem < kC ? static_cast<int>(rem) : kC;
    if constexpr (Stored) {
      copy_tile<Dk>(sK(b), static_cast<const __nv_bfloat16*>(a.Kd) + item(c) * kC * Dk, Dk);
    } else {
      copy_block<1, kC, kStateWgmmaThreads>(sfk(b), kC, a.fk + item(c) * kC, kC);
      copy_token_tile<Dk>(sK(b), a.k, a.k_sb, a.k_st, a.k_sh, seq.b, seq.bos + c * kC, hk, len);
    }
    if constexpr (FuseOut) {
      if constexpr (Stored)  // the stored Qs rows (prep's diag(..) q), no row factor
        copy_tile<Dk>(sQ(b), static_cast<const __nv_bfloat16*>(a.Qs) + item(c) * kC * Dk, Dk);
      else
        copy_token_tile<Dk>(sQ(b), a.q, a.q_sb, a.q_st, a.q_sh, seq.b, seq.bos + c * kC, hk, len);
      copy_tile<kC>(sP(b), static_cast<const __nv_bfloat16*>(a.P) + item(c) * kC * kC, kC);
      if constexpr (!Stored)
        copy_block<1, kC, kStateWgmmaThreads>(sfq(b), kC, a.fq + item(c) * kC, kC);
    }
  };
  // S[j][e]: state row 16 warp + lg + 8 (e >> 1), column 8 j + 2 lc + (e & 1) of the slice (the
  // m64n32 fragment of warpgroup wg's rows 64 wg ..).
  const int i0 = 16 * warp;
  float S[4][4];
  load_state_slice(a.h0, n * a.h0_s0 + h * a.h0_s1, a.h0_s2, a.v_first, col0, i0, S);
  // The chunk's decay of this thread's state rows i0 + lg and i0 + lg + 8.
  auto decay = [&](std::int64_t c, int hf) {
    return a.per_key ? a.gn[item(c) * Dk + i0 + lg + 8 * hf] : a.gn[item(c)];
  };
  float gn_next[2] = {0.f, 0.f};
  if (chunks > 0) {
    issue(0);
    gn_next[0] = decay(0, 0), gn_next[1] = decay(0, 1);
  }
  detail::cp_async_commit();

  for (std::int64_t c = 0; c < chunks; ++c) {
    const int b = static_cast<int>(c % NS);
    const std::int64_t slot = seq.slot0 + c;
    const float gn[2] = {gn_next[0], gn_next[1]};
    // Publish S (hi + lo tiles) for W S; the fp32 chunk-state row straight from the registers.
    static_assert(BV == 32, "publish_state_tiles' 32 columns");
    publish_state_tiles(S, i0, sShi, sSlo,
                        a.saved ? a.saved + slot * a.saved_s0 + h * a.saved_s1 + col0 : nullptr,
                        Dv);
    cp_async_wait<0>();  // chunk c's tiles, U, fk (this thread's copies)
    detail::fence_proxy_async();
    __syncthreads();
    // Chunk c - 1's Vnew and state row were written by every thread before the barrier.
    if (progress && c > 0 && tid == 0) store_release(progress, static_cast<int>(c));
    // NS = 2: the other stage (chunk c - 1's) is free: every product that read it has completed.
    if (NS == 2 && c + 1 < chunks) {
      issue(c + 1);
      gn_next[0] = decay(c + 1, 0), gn_next[1] = decay(c + 1, 1);
    }
    if (NS == 2) detail::cp_async_commit();
    if (a.states16) {  // the bf16 chunk-state row: S's hi part is bf16_rn(S)
      __nv_bfloat16* rec = a.states16 + slot * a.saved_s0 + h * a.saved_s1 + col0;
      for (int u = tid; u < Dk * (BV / 8); u += kStateWgmmaThreads) {
        const wgmma_layout::Unit p = wgmma_layout::tile_unit(u, BV);
        *reinterpret_cast<uint4*>(rec + std::int64_t(p.row) * Dv + p.col) =
            *reinterpret_cast<const uint4*>(sShi + 16 * u);
      }
    }
    // The tiles of this chunk's stage (bytes from smem; desc: wgmma_desc16).
    const std::uint32_t tW = L::W + b * L::rows_tile, tK = L::K + b * L::rows_tile,
                        tQ = L::Q + b * L::rows_tile, tP = L::P + b * L::p_tile;
    // Vnew = U - W S on columns 16 wg .. 16 wg + 15 (FuseOut: and q S on the same columns).
    float ws[2][4] = {}, qs[2][4] = {};
    detail::wgmma_fence_operand(ws);
    if constexpr (FuseOut) detail::wgmma_fence_operand(qs);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Dk / 16; ++ks)
      detail::wgmma_m64n16k16<false, true>(ws, desc(tW, wgmma_pass::ws_a(ks)),
                                           desc(L::Shi, wgmma_pass::ws_b(wg, ks)), ks > 0);
#pragma unroll
    for (int ks = 0; ks < Dk / 16; ++ks)
      detail::wgmma_m64n16k16<false, true>(ws, desc(tW, wgmma_pass::ws_a(ks)),
                                           desc(L::Slo, wgmma_pass::ws_b(wg, ks)));
    if constexpr (FuseOut) {
#pragma unroll
      for (int ks = 0; ks < Dk / 16; ++ks)
        detail::wgmma_m64n16k16<false, true>(qs, desc(tQ, wgmma_pass::ws_a(ks)),
                                             desc(L::Shi, wgmma_pass::ws_b(wg, ks)), ks > 0);
      if constexpr (OutLo) {
#pragma unroll
        for (int ks = 0; ks < Dk / 16; ++ks)
          detail::wgmma_m64n16k16<false, true>(qs, desc(tQ, wgmma_pass::ws_a(ks)),
                                               desc(L::Slo, wgmma_pass::ws_b(wg, ks)));
      }
    }
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_operand(ws);
    if constexpr (FuseOut) detail::wgmma_fence_operand(qs);
    {
      const __nv_bfloat16* cU = sU(b);
      const float* cfk = sfk(b);
      __nv_bfloat16* Ug = gU + item(c) * kC * Dv + col0;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * wl + lg + 8 * hf, col = H * wg + 8 * j + 2 * lc;
          const float2 u =
              __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(cU + r * ldU + col));
          const float v0 = u.x - ws[j][2 * hf], v1 = u.y - ws[j][2 * hf + 1];
          if constexpr (FuseOut)  // the bf16 Vnew the output kernel would read from U's place
            store_pair(reinterpret_cast<__nv_bfloat16*>(sVn + tile_offset(r, col, BV)), v0, v1);
          else
            store_pair(Ug + std::int64_t(r) * Dv + col, v0, v1);
          const float f = Stored ? 1.f : cfk[r];
          std::uint32_t vh, vl;
          detail::split_bf16(f * v0, f * v1, vh, vl);
          *reinterpret_cast<std::uint32_t*>(sVhi + tile_offset(r, col, BV)) = vh;
          *reinterpret_cast<std::uint32_t*>(sVlo + tile_offset(r, col, BV)) = vl;
        }
    }
    detail::fence_proxy_async();
    __syncthreads();
    // S <- diag(gn) S + k^T (diag(fk) Vnew) on warpgroup wg's rows (FuseOut: and P Vnew).
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[j][e] *= gn[e >> 1];
    float pv[2][4] = {};
    detail::wgmma_fence_operand(S);
    if constexpr (FuseOut) detail::wgmma_fence_operand(pv);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64n32k16<true, true>(S, desc(tK, wgmma_pass::kv_a(wg, ks)),
                                          desc(L::Vhi, wgmma_pass::kv_b(ks)));
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64n32k16<true, true>(S, desc(tK, wgmma_pass::kv_a(wg, ks)),
                                          desc(L::Vlo, wgmma_pass::kv_b(ks)));
    if constexpr (FuseOut) {
#pragma unroll
      for (int ks = 0; ks < kC / 16; ++ks)
        detail::wgmma_m64n16k16<false, true>(pv, desc(tP, wgmma_pass::pv_a(ks)),
                                             desc(L::Vn, wgmma_pass::pv_b(wg, ks)), ks > 0);
    }
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_operand(S);
    // FuseOut: o = diag(fq) (q S) + P Vnew on rows 16 wl .. (< the chunk's length), columns
    // col0 + 16 wg ...
    if constexpr (FuseOut) {
      detail::wgmma_fence_operand(pv);
      if constexpr (Stored)
        store_stored_output_tile(a, seq, seq.bos + c * kC, h, col0 + H * wg, 16 * wl,
                                 chunk_rows(seq, c), qs, pv);
      else
        store_output_tile<2>(a, seq, seq.bos + c * kC, h, col0 + H * wg, 16 * wl,
                             chunk_rows(seq, c), sfq(b), qs, pv);
    }
    if constexpr (NS == 1) {  // every thread is past its reads of the one stage
      __syncthreads();
      if (c + 1 < chunks) {
        issue(c + 1);
        gn_next[0] = decay(c + 1, 0), gn_next[1] = decay(c + 1, 1);
      }
      detail::cp_async_commit();
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  if (progress && tid == 0 && chunks > 0) store_release(progress, static_cast<int>(chunks));
  store_state_slice(a.hout, n * a.hout_s0 + h * a.hout_s1, a.hout_s2, a.v_first, col0, i0, S);
}

}  // namespace gdr::cuda::chunked
