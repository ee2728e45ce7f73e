// state_pass_ws_kernel: the single-product bf16 state pass with the output inside
// (state_pass_bf16_kernel<BV = 32, FuseOut, Single>'s inputs, outputs and roundings) as three
// specialised parts of one block, so that the sequential chain of a chunk holds only what the
// next chunk's state needs. DecodeOverrides::chunked_state_pass = 6: opt-in, correct and slower
// than the mma.sync pass on an H100 (a5e57c5: 1 x 16384 forward 2.02 ms against 1.50, 8 x 4096
// 3.83 against 3.00; Nsight Compute: 992 us against 634, the L2 at 92 % against 66 %, and 69 % of
// the executed instructions in the mbarrier wait loops: the one producer warp does not keep the
// stages full; docs/cuda-chunked.md §The state passes are L2-bound).
//
// Why: the mma.sync pass runs the whole chunk (copies, W S, q S, P Vnew, the output stores, the
// update) on every warp between two block barriers; its ~750 SASS instructions per warp and chunk
// at two warps per scheduler, not its ~0.8 M multiply-adds, set ~3.3 us per chunk (docs/
// cuda-chunked.md §Where the time goes). Here, per chunk c of the sequence, for the state slice
// S [Dk = 128][32] (fp32) of the block's 32 value columns:
//   state warpgroup (warps 0-3; S in registers as two m64n32 accumulators, state rows 64 r ..,
//   r = 0, 1):
//     S_b = bf16(S) -> tile sb[c % 2] (and the chunk-state record: fp32 `saved` or bf16
//           `states16`), then signal sb_full;
//     X   = W S_b                      8 x m64n32k16 (A = W [C][Dk] K-major, B = S_b N-major);
//     Vn  = U - X -> bf16 tile vn[c % 2] (for the output), diag(fk) Vn -> bf16 tile vk; vn_full;
//     S  <- gn S + k^T vk               2 x 4 x m64n32k16 (A = the k rows read M-major);
//   output warpgroup (warps 4-7), one chunk behind at most:
//     O   = diag(fq) (Q S_b)           8 x m64n32k16 (A = the q rows K-major), then sb_empty;
//     O  += P Vn                        4 x m64n32k16 (A = P [C][C] K-major), then vn_empty;
//     o   <- O rows < the chunk's length (bf16);
//   producer warp (warp 8): the chunk's W, k, q rows, P, U, fk, fq by 16-byte cp.async into stage
//     c % 2 once both warpgroups released it (stage_empty), completion announced on stage_full by
//     cp.async.mbarrier.arrive (no thread waits for its own copies).
// Barriers (mbarrier pairs per buffer, phase c / 2 of buffer c % 2): stage_full (32 producer
// arrivals), stage_empty (256: both warpgroups), sb_full / vn_full (128: the state warpgroup),
// sb_empty / vn_empty (128: the output warpgroup); the state warpgroup's own tiles (S_b before
// its W S_b, vk before its update) by a named barrier of its 128 threads. Every shared write that
// a product reads is followed, in the writing thread, by fence.proxy.async before its barrier.
// Roundings: as the single-product pass (S_b and diag(fk) Vn bf16 operands of the state's
// products, Vn bf16 in P Vn, fp32 accumulation, an fp32 S); o = fq (Q S_b) + P Vn accumulates
// P Vn onto the scaled Q S_b (the mma.sync pass adds the two with one fma): not bit-identical.
// Shared memory (bytes): two stages of {W, k, q [C][Dk] 16 K each, P 8 K, U [C][40] 5 K, fk, fq},
// S_b 2 x 8 K, Vn 2 x 4 K, vk 4 K, 12 mbarriers: 151 KB, one block per SM.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/chunked/chunked_common.cuh"
#include "cuda/chunked/state_pass_wgmma_layout.h"
#include "cuda/common/tensor_copy.cuh"  // mbar_arrive
#include "cuda/common/wgmma.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kStateWsThreads = 288;  // two warpgroups and the producer warp

// Byte offsets of the kernel's shared-memory regions (tiles 128-byte aligned).
struct StateWsSmem {
  static constexpr int Dk = wgmma_pass::kDk, BV = wgmma_pass::kBV, ldU = BV + 8;
  static constexpr std::uint32_t rows_tile = kC * Dk * 2;  // W, k, q
  static constexpr std::uint32_t W = 0, K = rows_tile, Q = 2 * rows_tile, P = 3 * rows_tile;
  static constexpr std::uint32_t U = P + kC * kC * 2;  // [C][ldU] bf16, row-major
  static constexpr std::uint32_t FK = U + kC * ldU * 2, FQ = FK + 4 * kC;
  static constexpr std::uint32_t stage = FQ + 4 * kC;
  static constexpr std::uint32_t s_tile = Dk * BV * 2, v_tile = kC * BV * 2;
  static constexpr std::uint32_t SB = 2 * stage;        // [2] S_b [Dk][BV]
  static constexpr std::uint32_t VN = SB + 2 * s_tile;  // [2] Vn [C][BV]
  static constexpr std::uint32_t VK = VN + 2 * v_tile;  // diag(fk) Vn [C][BV]
  static constexpr std::uint32_t BARS = VK + v_tile;    // 12 mbarriers
  static constexpr std::size_t bytes = BARS + 12 * 8;
  static_assert(stage % 128 == 0 && BARS % 8 == 0, "aligned tiles and barriers");
};

namespace ws_detail {
// The mbarriers: index 2 kind + buffer.
enum Bar : int {
  kStageFull = 0,
  kStageEmpty = 2,
  kSbFull = 4,
  kSbEmpty = 6,
  kVnFull = 8,
  kVnEmpty = 10
};
// Arrival, once all of this thread's earlier cp.async copies have landed (the barrier's expected
// count includes it: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(std::uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(detail::smem_addr(bar))
               : "memory");
}
// The state warpgroup's fragments S[r][j][e] (state row 64 r + 16 wl + lg + 8 (e >> 1), column
// 8 j + 2 lc + (e & 1)) into a chunk-state record row-major [Dk][ld] at rec (fp32 or bf16).
template <class St>
__device__ __forceinline__ void store_state_record(St* rec, std::int64_t ld, int wl,
                                                   const float (&S)[2][4][4]) {
  const int lane = threadIdx.x & 31, lg = lane >> 2, lc = lane & 3;
  const bool pairs = pair_aligned(rec);  // ld and the columns are even
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        store_pair_any(rec + std::int64_t(64 * r + 16 * wl + lg + 8 * hf) * ld + 8 * j + 2 * lc,
                       S[r][j][2 * hf], S[r][j][2 * hf + 1], pairs);
}
}  // namespace ws_detail

__global__ void __launch_bounds__(kStateWsThreads, 1) state_pass_ws_kernel(ChunkArgs a) {
  using L = StateWsSmem;
  using namespace ws_detail;
  constexpr int Dk = L::Dk, BV = L::BV, ldU = L::ldU;
  using wgmma_layout::tile_offset;
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(smem + L::BARS);
  auto f32 = [smem](std::uint32_t byte) { return reinterpret_cast<float*>(smem + byte); };
  auto bf16_at = [smem](std::uint32_t byte) {
    return reinterpret_cast<__nv_bfloat162*>(smem + byte);
  };
  const detail::RegionDescriptors desc(smem);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int lg = lane >> 2, lc = lane & 3, wl = warp & 3;
  const int h = blockIdx.y, hk = h / a.group;
  const int col0 = blockIdx.z * BV;
  const std::int64_t n = blockIdx.x;
  const int Dv = a.Dv;
  const SeqInfo seq = seq_info(a, n);
  const std::int64_t chunks = seq.chunks;
  auto item = [&](std::int64_t c) { return (seq.slot0 + c) * a.Hv + h; };

  if (tid == 0) {
    detail::mbar_init(bars + kStageFull, 32);
    detail::mbar_init(bars + kStageFull + 1, 32);
#pragma unroll
    for (int m = kStageEmpty; m < kStageEmpty + 2; ++m) detail::mbar_init(bars + m, 256);
#pragma unroll
    for (int m = kSbFull; m < kSbFull + 8; ++m) detail::mbar_init(bars + m, 128);
    detail::mbar_init_fence();
  }
  __syncthreads();  // the last block-wide barrier: the parts below wait on mbarriers only

  if (warp == 8) {  // ---- producer ----
    for (std::int64_t c = 0; c < chunks; ++c) {
      const int s = static_cast<int>(c & 1);
      const unsigned ph = static_cast<unsigned>((c >> 1) & 1);
      if (c >= 2) detail::mbar_wait(bars + kStageEmpty + s, ph ^ 1u);  // chunk c - 2 released
      unsigned char* st = smem + s * L::stage;
      const std::int64_t it = item(c), t0 = seq.bos + c * kC;
      const int len = chunk_rows(seq, c);
      copy_tile<Dk, 32>(st + L::W, static_cast<const __nv_bfloat16*>(a.W) + it * kC * Dk, Dk, lane);
      copy_tile<kC, 32>(st + L::P, static_cast<const __nv_bfloat16*>(a.P) + it * kC * kC, kC, lane);
      copy_token_tile<Dk, 32>(st + L::K, a.k, a.k_sb, a.k_st, a.k_sh, seq.b, t0, hk, len, lane);
      copy_token_tile<Dk, 32>(st + L::Q, a.q, a.q_sb, a.q_st, a.q_sh, seq.b, t0, hk, len, lane);
      // U rows (32 columns: 4 units a row), row-major with stride ldU.
      const __nv_bfloat16* u0 = static_cast<const __nv_bfloat16*>(a.U) + it * kC * Dv + col0;
      __nv_bfloat16* su = reinterpret_cast<__nv_bfloat16*>(st + L::U);
#pragma unroll
      for (int i = 0; i < kC * 4 / 32; ++i) {
        const int row = lane / 4 + 8 * i, unit = lane % 4;
        detail::cp_async16(su + row * ldU + 8 * unit, u0 + std::int64_t(row) * Dv + 8 * unit);
      }
      if (lane < 16)
        detail::cp_async16(st + L::FK + 16 * lane, a.fk + it * kC + 4 * lane);
      else
        detail::cp_async16(st + L::FQ + 16 * (lane - 16), a.fq + it * kC + 4 * (lane - 16));
      cp_async_mbar_arrive(bars + kStageFull + s);
    }
    detail::cp_async_wait_all();  // no copy outlives its thread
    return;
  }

  const int wg = detail::warpgroup_index();
  // acc = R S_b over all 32 columns (8 x m64n32k16, waited for): R the [C][Dk] rows tile at byte
  // rows (W or q, K-major), S_b the tile at byte sb (N-major).
  auto rows_times_state = [&](float(&acc)[4][4], std::uint32_t rows, std::uint32_t sb) {
    detail::wgmma_fence_operand(acc);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Dk / 16; ++ks)
      detail::wgmma_m64n32k16<false, true>(acc, desc(rows, wgmma_pass::ws_a(ks)),
                                           desc(sb, wgmma_pass::kv_b(ks)), ks > 0);
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_operand(acc);
  };
  if (wg == 0) {  // ---- state ----
    // S[r][j][e]: state row 64 r + 16 wl + lg + 8 (e >> 1), column 8 j + 2 lc + (e & 1).
    float S[2][4][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      load_state_slice(a.h0, n * a.h0_s0 + h * a.h0_s1, a.h0_s2, a.v_first, col0, 64 * r + 16 * wl,
                       S[r]);
    float gn_next = chunks > 0 ? a.gn[item(0)] : 0.f;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const int s = static_cast<int>(c & 1);
      const unsigned ph = static_cast<unsigned>((c >> 1) & 1);
      const float gn = gn_next;
      if (c + 1 < chunks) gn_next = a.gn[item(c + 1)];
      const std::uint32_t tS = L::SB + s * L::s_tile, tV = L::VN + s * L::v_tile;
      const std::uint32_t st = s * L::stage;
      // Publish S_b (and the chunk-state record) once the output part read chunk c - 2's.
      if (c >= 2) detail::mbar_wait(bars + kSbEmpty + s, ph ^ 1u);
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            *bf16_at(tS + tile_offset(64 * r + 16 * wl + lg + 8 * hf, 8 * j + 2 * lc, BV)) =
                __floats2bfloat162_rn(S[r][j][2 * hf], S[r][j][2 * hf + 1]);
      if (a.saved || a.states16) {  // the chunk-state record (training): fp32, else bf16 = S_b
        const std::int64_t rec = (seq.slot0 + c) * a.saved_s0 + h * a.saved_s1 + col0;
        if (a.saved)
          store_state_record(a.saved + rec, Dv, wl, S);
        else
          store_state_record(a.states16 + rec, Dv, wl, S);
      }
      detail::fence_proxy_async();
      detail::mbar_arrive(bars + kSbFull + s);
      detail::named_barrier_sync(1, 128);            // S_b whole for this warpgroup's W S_b
      detail::mbar_wait(bars + kStageFull + s, ph);  // chunk c's rows landed
      detail::fence_proxy_async();  // the producer's cp.async writes, before the async proxy
      // X = W S_b, all 32 columns.
      float X[4][4];
      rows_times_state(X, st + L::W, tS);
      // Vn = U - X -> vn[s] (once the output part read chunk c - 2's), diag(fk) Vn -> vk.
      if (c >= 2) detail::mbar_wait(bars + kVnEmpty + s, ph ^ 1u);
      {
        const __nv_bfloat16* su = reinterpret_cast<const __nv_bfloat16*>(smem + st + L::U);
        const float* fk = f32(st + L::FK);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int r = 16 * wl + lg + 8 * hf, col = 8 * j + 2 * lc;
            const float2 u =
                __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(su + r * ldU + col));
            const float v0 = u.x - X[j][2 * hf], v1 = u.y - X[j][2 * hf + 1];
            *bf16_at(tV + tile_offset(r, col, BV)) = __floats2bfloat162_rn(v0, v1);
            *bf16_at(L::VK + tile_offset(r, col, BV)) =
                __floats2bfloat162_rn(fk[r] * v0, fk[r] * v1);
          }
      }
      detail::fence_proxy_async();
      detail::mbar_arrive(bars + kVnFull + s);
      detail::named_barrier_sync(1, 128);  // vk whole for the update
                                           // S <- gn S + k^T vk on both row halves.
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[r][j][e] *= gn;
      detail::wgmma_fence_operand(S[0]);
      detail::wgmma_fence_operand(S[1]);
      detail::wgmma_fence();
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int ks = 0; ks < kC / 16; ++ks)
          detail::wgmma_m64n32k16<true, true>(S[r], desc(st + L::K, wgmma_pass::kv_a(r, ks)),
                                              desc(L::VK, wgmma_pass::kv_b(ks)));
      detail::wgmma_commit();
      detail::wgmma_wait<0>();
      detail::wgmma_fence_operand(S[0]);
      detail::wgmma_fence_operand(S[1]);
      detail::mbar_arrive(bars + kStageEmpty + s);  // this part is done with W, k, U, fk of chunk c
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
      store_state_slice(a.hout, n * a.hout_s0 + h * a.hout_s1, a.hout_s2, a.v_first, col0,
                        64 * r + 16 * wl, S[r]);
    return;
  }

  // ---- output ----
  __nv_bfloat16* o16 = static_cast<__nv_bfloat16*>(a.o);
  for (std::int64_t c = 0; c < chunks; ++c) {
    const int s = static_cast<int>(c & 1);
    const unsigned ph = static_cast<unsigned>((c >> 1) & 1);
    const std::uint32_t tS = L::SB + s * L::s_tile, tV = L::VN + s * L::v_tile;
    const std::uint32_t st = s * L::stage;
    detail::mbar_wait(bars + kSbFull + s, ph);
    detail::mbar_wait(bars + kStageFull + s, ph);
    detail::fence_proxy_async();
    float O[4][4];
    rows_times_state(O, st + L::Q, tS);
    detail::mbar_arrive(bars + kSbEmpty + s);
    {
      const float* fq = f32(st + L::FQ);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) O[j][e] *= fq[16 * wl + lg + 8 * (e >> 1)];
    }
    detail::mbar_wait(bars + kVnFull + s, ph);
    detail::wgmma_fence_operand(O);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64n32k16<false, true>(O, desc(st + L::P, wgmma_pass::pv_a(ks)),
                                           desc(tV, wgmma_pass::kv_b(ks)));
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_operand(O);
    detail::mbar_arrive(bars + kVnEmpty + s);
    detail::mbar_arrive(bars + kStageEmpty + s);  // this part is done with q, P, fq of chunk c
    const int len = chunk_rows(seq, c);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = 16 * wl + lg + 8 * hf;
      if (r >= len) continue;
      __nv_bfloat16* orow =
          o16 + seq.b * a.o_sb + (seq.bos + c * kC + r) * a.o_st + h * a.o_sh + col0;
      const bool pairs = pair_aligned(orow);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        store_pair_any(orow + 8 * j + 2 * lc, O[j][2 * hf], O[j][2 * hf + 1], pairs);
    }
  }
}

}  // namespace gdr::cuda::chunked
