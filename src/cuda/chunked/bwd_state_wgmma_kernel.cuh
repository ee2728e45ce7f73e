// bwd_state_wgmma_kernel: the backward's reverse pass (bwd_state_bf16_kernel.cuh states the math
// and the roundings) with its products as warpgroup products (wgmma.cuh) on tiles in shared
// memory, for its Op16 case (the operands P, Kd, Qs, W already bf16 from the bf16 prep, given the
// forward's states) at 32 value columns per block. Opt-in (DecodeOverrides::chunked_backward_fused
// = 6): correct and slower on an H100 (a560176: backward 7.72 ms against rule 5's 6.76 at
// 1 x 16384). Per chunk c of the window (last first), for the slice dS
// [Dk, 32] (fp32, in registers: warpgroup wg holds the m64n32 accumulator fragment of rows
// 64 wg .. 64 wg + 63, warp w the rows 16 w .. 16 w + 15):
//   publish  dS -> bf16 hi + lo tiles [Dk][32], dS -> the dS record (fp32);
//   dVnew = P^T dO + Kd dS_hi + Kd dS_lo    warpgroup wg: columns 16 wg .. + 15, m64n16k16; P
//            [C][C] read M-major (P^T, transposed in the instruction; zero above the diagonal),
//            dO [C][32] N-major, Kd [C][Dk] K-major; -> dVn scratch (fp32) and bf16 hi + lo tiles;
//   dS    <- gn dS + Qs^T dO - (W^T dVnew_hi + W^T dVnew_lo)   warpgroup wg: rows 64 wg ..,
//            m64n32k16 with Qs, W [C][Dk] read M-major.
// The tiles of chunk c - 1 (P, Kd, Qs, W, the dO rows) are copied by cp.async into the other
// stage while chunk c computes; every shared write a product reads is followed, in the writing
// thread, by fence.proxy.async and a barrier. Two barriers per chunk, as the bf16 pass.
// Shared memory (bytes): NS stages x (P 8 K, Kd, Qs, W 16 K each, dO 4 K), dS hi / lo 16 K,
// dVnew hi / lo 8 K: 144 KB (NS = 2), 85 KB (NS = 1).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/chunked/backward_kernels.cuh"
#include "cuda/chunked/state_pass_wgmma_layout.h"
#include "cuda/common/wgmma.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kBwdStateWgmmaThreads = 256;  // two warpgroups

// Byte offsets of the kernel's shared-memory regions (tiles: 128-byte aligned); NS stages.
template <int NS = 2>
struct BwdStateWgmmaSmem {
  static constexpr int Dk = wgmma_pass::kDk, BV = wgmma_pass::kBV;
  static constexpr std::size_t p_tile = std::size_t(kC) * kC * 2;
  static constexpr std::size_t rows_tile = std::size_t(kC) * Dk * 2;  // Kd, Qs, W
  static constexpr std::size_t o_tile = std::size_t(kC) * BV * 2;     // dO, dVnew
  static constexpr std::size_t s_tile = std::size_t(Dk) * BV * 2;     // dS
  static constexpr std::size_t P = 0, Kd = P + p_tile, Qs = Kd + rows_tile, W = Qs + rows_tile,
                               dO = W + rows_tile;
  static constexpr std::size_t stage = dO + o_tile;
  static constexpr std::size_t Shi = NS * stage, Slo = Shi + s_tile, Vhi = Slo + s_tile,
                               Vlo = Vhi + o_tile;
  static constexpr std::size_t bytes = Vlo + o_tile;
};

// NS = 2: chunk c - 1's tiles are copied while chunk c computes (one block per SM). NS = 1: one
// stage, chunk c - 1's copies issued after chunk c's last product (85 KB: two blocks per SM, each
// hiding the other's copies), for launches of more blocks than SMs.
template <int NS = 2>
__global__ void __launch_bounds__(kBwdStateWgmmaThreads, NS == 1 ? 2 : 1)
    bwd_state_wgmma_kernel(BwdArgs b) {
  static_assert(NS == 1 || NS == 2, "one or two stages");
  using L = BwdStateWgmmaSmem<NS>;
  constexpr int Dk = L::Dk, BV = L::BV, H = wgmma_pass::kHalf;
  using wgmma_layout::tile_offset;
  const ChunkArgs& a = b.c;
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  auto tile = [&](int s, std::size_t region) { return smem + s * L::stage + region; };
  unsigned char* sShi = smem + L::Shi;
  unsigned char* sSlo = smem + L::Slo;
  unsigned char* sVhi = smem + L::Vhi;
  unsigned char* sVlo = smem + L::Vlo;

  const detail::RegionDescriptors desc(smem);  // tiles by byte offset in smem
  const int Dv = a.Dv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = detail::warpgroup_index(), wl = warp & 3;
  const int lg = lane >> 2, lc = lane & 3;
  const std::int64_t n = blockIdx.x;
  const int h = blockIdx.y;
  const int col0 = blockIdx.z * BV;
  const SeqInfo seq = seq_info(a, n);
  std::int64_t c_lo, c_hi;  // the sequence's chunks in this launch's window
  if (!window_chunks(a, seq, c_lo, c_hi)) return;
  const bool from_dht = c_hi == seq.chunks;
  const bool to_dh0 = c_lo == 0;
  auto item = [&](std::int64_t c) { return (seq.slot0 + c - a.slot_base) * a.Hv + h; };
  // Chunk c's tiles into stage c % NS (dO rows past the chunk zero).
  auto issue = [&](std::int64_t c) {
    const int s = static_cast<int>(c % NS);
    const std::int64_t p = item(c);
    copy_tile<kC>(tile(s, L::P), a.P16 + p * kC * kC, kC);
    copy_tile<Dk>(tile(s, L::Kd), a.Kd16 + p * kC * Dk, Dk);
    copy_tile<Dk>(tile(s, L::Qs), a.Qs16 + p * kC * Dk, Dk);
    copy_tile<Dk>(tile(s, L::W), a.W16 + p * kC * Dk, Dk);
    const std::int64_t rem = seq.len - c * kC;
    copy_token_tile<BV>(tile(s, L::dO), static_cast<const __nv_bfloat16*>(b.dout) + col0, b.do_sb,
                        b.do_st, b.do_sh, seq.b, seq.bos + c * kC, h,
                        rem < kC ? static_cast<int>(rem) : kC);
  };

  // dS[j][e]: row 16 warp + lg + 8 (e >> 1), column 8 j + 2 lc + (e & 1) of the slice.
  const int i0 = 16 * warp;
  // dS entering the window: dfinal_state (zeros without it) or the carry of a later window
  // ([N, Hv, Dk, Dv], k-first).
  const std::int64_t carry = (n * a.Hv + h) * Dk * Dv;
  float dS[4][4];
  if (from_dht)
    load_state_slice(b.dht, n * b.dht_s0 + h * b.dht_s1, b.dht_s2, a.v_first, col0, i0, dS);
  else
    load_state_slice(b.dS_carry, carry, Dv, false, col0, i0, dS);
  if (c_hi > c_lo) issue(c_hi - 1);
  detail::cp_async_commit();

  for (std::int64_t c = c_hi - 1; c >= c_lo; --c) {
    const int s = static_cast<int>(c % NS);
    const std::int64_t pidx = item(c);
    const float gn = a.gn[pidx];
    // Publish dS (hi + lo tiles) for Kd dS; the dS record straight from the registers.
    publish_state_tiles(dS, i0, sShi, sSlo, b.dS + pidx * Dk * Dv + col0, Dv);
    cp_async_wait<0>();  // chunk c's tiles (this thread's copies)
    detail::fence_proxy_async();
    __syncthreads();  // #1: dS published, chunk c's tiles landed; chunk c + 1's stage free
    if (NS == 2 && c > c_lo) issue(c - 1);
    if (NS == 2) detail::cp_async_commit();
    const std::uint32_t st = s * L::stage;  // this chunk's stage (bytes)
    // dVnew = P^T dO + Kd dS on columns 16 wg .. 16 wg + 15.
    float dv[2][4] = {};
    detail::wgmma_fence_operand(dv);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64n16k16<true, true>(dv, desc(st + L::P, wgmma_pass::pt_a(ks)),
                                          desc(st + L::dO, wgmma_pass::pv_b(wg, ks)), ks > 0);
#pragma unroll
    for (int ks = 0; ks < Dk / 16; ++ks)
      detail::wgmma_m64n16k16<false, true>(dv, desc(st + L::Kd, wgmma_pass::ws_a(ks)),
                                           desc(L::Shi, wgmma_pass::ws_b(wg, ks)));
#pragma unroll
    for (int ks = 0; ks < Dk / 16; ++ks)
      detail::wgmma_m64n16k16<false, true>(dv, desc(st + L::Kd, wgmma_pass::ws_a(ks)),
                                           desc(L::Slo, wgmma_pass::ws_b(wg, ks)));
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_operand(dv);
    {
      float* dVn = b.dVn + pidx * kC * Dv + col0;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 16 * wl + lg + 8 * hf, col = H * wg + 8 * j + 2 * lc;
          const float v0 = dv[j][2 * hf], v1 = dv[j][2 * hf + 1];
          *reinterpret_cast<float2*>(dVn + std::int64_t(r) * Dv + col) = make_float2(v0, v1);
          std::uint32_t vh, vl;
          detail::split_bf16(v0, v1, vh, vl);
          *reinterpret_cast<std::uint32_t*>(sVhi + tile_offset(r, col, BV)) = vh;
          *reinterpret_cast<std::uint32_t*>(sVlo + tile_offset(r, col, BV)) = vl;
        }
    }
    detail::fence_proxy_async();
    __syncthreads();  // #2: dVnew published
                      // dS <- gn dS + Qs^T dO - W^T dVnew on warpgroup wg's rows.
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dS[j][e] *= gn;
    float wv[4][4] = {};
    detail::wgmma_fence_operand(dS);
    detail::wgmma_fence_operand(wv);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64n32k16<true, true>(dS, desc(st + L::Qs, wgmma_pass::kv_a(wg, ks)),
                                          desc(st + L::dO, wgmma_pass::kv_b(ks)));
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64n32k16<true, true>(wv, desc(st + L::W, wgmma_pass::kv_a(wg, ks)),
                                          desc(L::Vhi, wgmma_pass::kv_b(ks)), ks > 0);
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64n32k16<true, true>(wv, desc(st + L::W, wgmma_pass::kv_a(wg, ks)),
                                          desc(L::Vlo, wgmma_pass::kv_b(ks)));
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_operand(dS);
    detail::wgmma_fence_operand(wv);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dS[j][e] -= wv[j][e];
    if constexpr (NS == 1) {  // every thread is past its reads of the one stage
      __syncthreads();
      if (c > c_lo) issue(c - 1);
      detail::cp_async_commit();
    }
  }
  cp_async_wait<0>();
  // dS leaving the window: into the carry (an earlier window continues from it) or dh0.
  if (to_dh0)
    store_state_slice(b.dh0, n * b.dh0_s0 + h * b.dh0_s1, b.dh0_s2, a.v_first, col0, i0, dS);
  else
    store_state_slice(b.dS_carry, carry, Dv, false, col0, i0, dS);
}

}  // namespace gdr::cuda::chunked
