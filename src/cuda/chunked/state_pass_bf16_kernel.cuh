// state_pass_bf16_kernel<BV>: the sequential state pass of the row-factor path (bf16 scratch,
// scalar gate, bf16 inputs without a mask, Dk = 128, unsplit), with the state in registers.
// chunked_forward.cu takes it there unless DecodeOverrides::chunked_state_pass = 1; it writes
// what state_pass_kernel<BV, bf16> mode 0 writes (chunked_kernels.cuh): the chunk states, Vnew in
// U's place, the final state, the overlap's progress counters. Per chunk c of the sequence, for
// the state slice S [Dk, BV] (fp32) of value columns col0 .. col0 + BV - 1:
//   publish  S -> bf16 hi + lo in shared memory (|S - hi - lo| <= 2^-18 |S|), S -> chunk-state row;
//   Vnew   = U - W S             [C, BV]: W exact bf16, S as hi + lo (two m16n8k16 products);
//            -> U's place (bf16, for the output kernel), and diag(fk) Vnew -> bf16 hi + lo;
//   S      <- gn S + k^T (diag(fk) Vnew): k the raw bf16 rows (Kd = diag(fk) k, the row factors).
// Warp w owns the state rows 16 w .. 16 w + 15 as mma accumulators (S never leaves the registers
// but as its published hi / lo parts); in Vnew = U - W S warp w computes the 16 x 16 tile (w % 4,
// w / 4) (BV = 32; at BV = 16 warps 0-3). Operand fragments by ldmatrix (.trans where k runs along
// the stored rows: S, Vnew, and k^T). Two barriers per chunk; the next chunk's W, U, k rows and fk
// are copied (cp.async) into the other buffer while the current one computes. Precision as the
// general kernel's bf16 path: no rounding beyond the stored W, U and the raw k rows.
// Shared memory (bytes, BV = 32): W, k [2][C][Dk + 8] bf16 (69.6 KB), U [2][C][BV + 8] bf16,
// S hi / lo [Dk][BV + 8] bf16, Vnew hi / lo [C][BV + 8] bf16, fk [2][C] fp32: ~109 KB.
//
// FuseOut (DecodeOverrides::chunked_overlap = 3): the chunk's output is computed here too, and
// chunk_output_kernel is not run: O = diag(fq) (q S) + P Vnew [C, BV] with S the state entering
// the chunk, on the warp's Vnew tile (r0, j0). q S shares the S fragments of W S (S's hi part, the
// bf16 chunk state the output kernel reads, one product; given fp32 `saved` also the lo part, as
// the output kernel's fp32-state path), is formed in the Vnew phase; P Vnew (Vnew rounded to
// bf16, as stored in U's place for the output kernel) after the second barrier, over the causal
// k steps. Without `saved` the results are bit-identical to the output kernel's, and neither Vnew
// nor the chunk states leave the chip (no U write, no bf16 chunk-state rows). The q rows, P and
// fq join the next chunk's copies. Extra shared memory: q [2][C][Dk + 8], P [2][C][C + 8],
// Vnew [C][BV + 8] bf16, fq [2][C] fp32: ~59 KB (168 KB at BV = 32).
//
// Stored (the path without row factors: per-key gates, masks, f16 inputs; bf16 scratch): the
// prep kernel stored Kd = e^{G_n - G} .* K (bf16) and gn per key channel (per-key) or per chunk,
// so the update reads the Kd rows from scratch in the k rows' place with fk = 1, and scales state
// row i by gn[i] (the diag(gn) of the per-key gate). The output stays with chunk_output_kernel
// (its stored-Qs path), which reads the chunk states and Vnew as from the general pass.
//
// Single (DecodeOverrides::chunked_state_pass = 4 with the output inside; opt-in until measured):
// one product where the pass takes two, S and diag(fk) Vnew rounded to bf16 as the products'
// operands (as FLA's bf16 h and v_new; the carried state and its update stay fp32), also in q S:
// half the pass's mma and ldmatrix. Float64 model (bench/cuda_chunked_error_model.py --single):
// D = 128, g = -0.2 U(0,1): o 3.1e-3, final state 2.4e-3 (hi + lo: 3.1e-3 / 1.7e-3); beta = 1,
// g = -0.01 U(0,1): 4.0e-3 / 3.2e-3 (bar 5e-3).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/chunked/chunked_common.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kStateBf16Threads = 256;
inline constexpr int kStateBf16Dk = 128;

// NS: stages of the copies (W, U, k rows, fk of chunk c + NS - 1 issued while chunk c computes).
template <int BV, bool FuseOut = false, int NS = 2>
constexpr std::size_t state_bf16_smem_bytes() {
  constexpr std::size_t ldW = kStateBf16Dk + 8, ldB = BV + 8, ldP = kC + 8;
  constexpr std::size_t base =
      2 * (NS * 2 * kC * ldW + NS * kC * ldB + 2 * kStateBf16Dk * ldB + 2 * kC * ldB) + 4 * NS * kC;
  return FuseOut ? base + 2 * (NS * kC * ldW + NS * kC * ldP + kC * ldB) + 4 * NS * kC : base;
}

// Not capped below the registers ptxas picks (195 at BV = 32): capped at 168 so that an
// output-kernel block fits beside it (the overlap), the forward got slower, 1 x 16384 2.21 ->
// 2.59 ms, 8 x 4096 4.35 -> 4.87, 1 x 65536 9.40 -> 10.55 (H100, 2026-12-06, one machine): the
// co-resident output blocks slow the pass, which is the critical path at B = 1.
template <int BV, bool FuseOut, bool Stored = false, int NS = 2, bool Single = false>
__global__ void __launch_bounds__(kStateBf16Threads, 1) state_pass_bf16_kernel(ChunkArgs a) {
  static_assert(BV == 16 || BV == 32, "16 or 32 value columns per block");
  static_assert(!Single || (FuseOut && !Stored), "single products: the fused row-factor pass");
  static_assert(NS >= 2 && NS <= 4, "2 to 4 stages of copies");
  static_assert(!(FuseOut && Stored), "the stored path's output is chunk_output_kernel's");
  constexpr int Dk = kStateBf16Dk, NT = BV / 8, ldW = Dk + 8, ldB = BV + 8, ldP = kC + 8;
  extern __shared__ float4 smem4[];
  __nv_bfloat16* sW = reinterpret_cast<__nv_bfloat16*>(smem4);  // [NS][C][ldW]
  __nv_bfloat16* sK = sW + NS * kC * ldW;    // [NS][C][ldW] raw k rows (Stored: Kd rows)
  __nv_bfloat16* sU = sK + NS * kC * ldW;    // [NS][C][ldB]
  __nv_bfloat16* sShi = sU + NS * kC * ldB;  // [Dk][ldB]
  __nv_bfloat16* sSlo = sShi + Dk * ldB;
  __nv_bfloat16* sVhi = sSlo + Dk * ldB;  // [C][ldB]: diag(fk) Vnew
  __nv_bfloat16* sVlo = sVhi + kC * ldB;
  __nv_bfloat16* sQ = sVlo + kC * ldB;                      // FuseOut: [NS][C][ldW] raw q rows
  __nv_bfloat16* sP = sQ + (FuseOut ? NS * kC * ldW : 0);   // FuseOut: [NS][C][ldP]
  __nv_bfloat16* sVn = sP + (FuseOut ? NS * kC * ldP : 0);  // FuseOut: [C][ldB] Vnew (bf16)
  float* sfk = reinterpret_cast<float*>(sVn + (FuseOut ? kC * ldB : 0));  // [NS][C]
  float* sfq = sfk + NS * kC;                                             // FuseOut: [NS][C]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
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
  constexpr int NTh = kStateBf16Threads;
  auto issue = [&](std::int64_t c) {
    const int b = static_cast<int>(c % NS);
    copy_block<kC, Dk, NTh>(sW + b * kC * ldW, ldW, gW + item(c) * kC * Dk, Dk);
    copy_block<kC, BV, NTh>(sU + b * kC * ldB, ldB, gU + item(c) * kC * Dv + col0, Dv);
    const std::int64_t rem = seq.len - c * kC;
    const int len = rem < kC ? static_cast<int>(rem) : kC;
    if constexpr (Stored) {
      copy_block<kC, Dk, NTh>(sK + b * kC * ldW, ldW,
                              static_cast<const __nv_bfloat16*>(a.Kd) + item(c) * kC * Dk, Dk);
    } else {
      copy_block<1, kC, NTh>(sfk + b * kC, kC, a.fk + item(c) * kC, kC);
      copy_token_block<Dk, NTh>(sK + b * kC * ldW, ldW, a.k, a.k_sb, a.k_st, a.k_sh, seq.b,
                                seq.bos + c * kC, hk, len);
    }
    if constexpr (FuseOut) {
      copy_token_block<Dk, NTh>(sQ + b * kC * ldW, ldW, a.q, a.q_sb, a.q_st, a.q_sh, seq.b,
                                seq.bos + c * kC, hk, len);
      copy_block<kC, kC, NTh>(sP + b * kC * ldP, ldP,
                              static_cast<const __nv_bfloat16*>(a.P) + item(c) * kC * kC, kC);
      copy_block<1, kC, NTh>(sfq + b * kC, kC, a.fq + item(c) * kC, kC);
    }
  };
  // FuseOut: q S with S's lo part too where the chunk states are the fp32 record (training), as
  // the output kernel's fp32-state path; S's hi part alone otherwise (its bf16-state path).
  const bool out_lo = FuseOut && !Single && a.saved != nullptr;

  // S: this warp's rows i0 .. i0 + 15; S[nt][e] at row i0 + lg + 8 (e >> 1), column
  // 8 nt + 2 lc + (e & 1) of the slice.
  const int i0 = 16 * warp;
  float S[NT][4];
  load_state_slice(a.h0, n * a.h0_s0 + h * a.h0_s1, a.h0_s2, a.v_first, col0, i0, S);
  // The chunk's decay of this thread's state rows i0 + lg and i0 + lg + 8 (one per chunk, or
  // per key channel under the per-key gate).
  auto decay = [&](std::int64_t c, int hf) {
    return a.per_key ? a.gn[item(c) * Dk + i0 + lg + 8 * hf] : a.gn[item(c)];
  };
  // Chunks 0 .. NS - 2 in flight before the loop, one commit group each; the decays of the chunks
  // issued and not yet computed in gn_ring (oldest first).
  float gn_ring[NS - 1][2];
#pragma unroll
  for (int m = 0; m < NS - 1; ++m) {
    gn_ring[m][0] = gn_ring[m][1] = 0.f;
    if (m < chunks) {
      issue(m);
      gn_ring[m][0] = decay(m, 0), gn_ring[m][1] = decay(m, 1);
    }
    detail::cp_async_commit();
  }

  for (std::int64_t c = 0; c < chunks; ++c) {
    const int b = static_cast<int>(c % NS);
    const std::int64_t slot = seq.slot0 + c;
    const float gn[2] = {gn_ring[0][0], gn_ring[0][1]};
#pragma unroll
    for (int m = 0; m + 1 < NS - 1; ++m)
      gn_ring[m][0] = gn_ring[m + 1][0], gn_ring[m][1] = gn_ring[m + 1][1];
      // Publish S (hi + lo) for W S; the fp32 chunk-state row straight from the registers.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = i0 + lg + 8 * hf, j = 8 * nt + 2 * lc;
        std::uint32_t hi, lo;
        detail::split_bf16(S[nt][2 * hf], S[nt][2 * hf + 1], hi, lo);
        *reinterpret_cast<std::uint32_t*>(sShi + i * ldB + j) = hi;
        if constexpr (!Single) *reinterpret_cast<std::uint32_t*>(sSlo + i * ldB + j) = lo;
        if (a.saved) {
          float* rec =
              a.saved + slot * a.saved_s0 + h * a.saved_s1 + std::int64_t(i) * Dv + col0 + j;
          store_pair_any(rec, S[nt][2 * hf], S[nt][2 * hf + 1], pair_aligned(rec));
        }
      }
    cp_async_wait<NS - 2>();  // chunk c's W, U, k rows, fk (this thread's copies)
    __syncthreads();
    // Chunk c - 1's Vnew and state row were written by every thread before the barrier.
    if (progress && c > 0 && tid == 0) store_release(progress, static_cast<int>(c));
    // The buffer of chunk c - 1 is free (every thread is past its update): chunk c + NS - 1.
    if (c + NS - 1 < chunks) {
      issue(c + NS - 1);
      gn_ring[NS - 2][0] = decay(c + NS - 1, 0), gn_ring[NS - 2][1] = decay(c + NS - 1, 1);
    }
    detail::cp_async_commit();
    if (a.states16) {  // the bf16 chunk-state row: S's hi part is bf16_rn(S) (FuseOut: only
                       // into the caller's bf16 record; the host gives no own-scratch rows)
      __nv_bfloat16* rec = a.states16 + slot * a.saved_s0 + h * a.saved_s1 + col0;
      for (int e = tid; e < Dk * (BV / 8); e += kStateBf16Threads) {
        const int i = e / (BV / 8), v = e - i * (BV / 8);
        *reinterpret_cast<uint4*>(rec + std::int64_t(i) * Dv + 8 * v) =
            *reinterpret_cast<const uint4*>(sShi + i * ldB + 8 * v);
      }
    }
    // Vnew = U - W S: the 16 x 16 tile (r0, j0) per warp (FuseOut: and q S on the same tile).
    const bool has_tile = warp < 4 * (BV / 16);
    const int r0 = 16 * (warp & 3), j0 = 16 * (warp >> 2);
    float qs[2][4] = {};  // FuseOut: q S of the tile
    if (has_tile) {
      const __nv_bfloat16* cW = sW + b * kC * ldW + (r0 + (lane & 15)) * ldW + 8 * (lane >> 4);
      const __nv_bfloat16* cQ = sQ + b * kC * ldW + (r0 + (lane & 15)) * ldW + 8 * (lane >> 4);
      const int b_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * ldB + j0 + 8 * (lane >> 4);
      float hi[2][4] = {}, lo[2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < Dk; k0 += 16) {
        const uint4 w = detail::ldmatrix_x4(cW + k0);
        const uint4 bh = detail::ldmatrix_x4_trans(sShi + b_off + k0 * ldB);
        uint4 bl{};
        detail::mma_bf16(hi[0], w, bh.x, bh.y);
        detail::mma_bf16(hi[1], w, bh.z, bh.w);
        if constexpr (!Single) {
          bl = detail::ldmatrix_x4_trans(sSlo + b_off + k0 * ldB);
          detail::mma_bf16(lo[0], w, bl.x, bl.y);
          detail::mma_bf16(lo[1], w, bl.z, bl.w);
        }
        if constexpr (FuseOut) {
          const uint4 qa = detail::ldmatrix_x4(cQ + k0);
          detail::mma_bf16(qs[0], qa, bh.x, bh.y);
          detail::mma_bf16(qs[1], qa, bh.z, bh.w);
          if (out_lo) {
            detail::mma_bf16(qs[0], qa, bl.x, bl.y);
            detail::mma_bf16(qs[1], qa, bl.z, bl.w);
          }
        }
      }
      const __nv_bfloat16* cU = sU + b * kC * ldB;
      const float* cfk = sfk + b * kC;
      __nv_bfloat16* Ug = gU + item(c) * kC * Dv + col0;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = r0 + lg + 8 * hf, j = j0 + 8 * nt + 2 * lc;
          const float2 u =
              __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(cU + r * ldB + j));
          const float v0 = Single ? u.x - hi[nt][2 * hf] : u.x - (hi[nt][2 * hf] + lo[nt][2 * hf]);
          const float v1 =
              Single ? u.y - hi[nt][2 * hf + 1] : u.y - (hi[nt][2 * hf + 1] + lo[nt][2 * hf + 1]);
          if constexpr (FuseOut)  // the bf16 Vnew the output kernel would read from U's place
            store_pair(sVn + r * ldB + j, v0, v1);
          else
            store_pair(Ug + std::int64_t(r) * Dv + j, v0, v1);
          const float f = Stored ? 1.f : cfk[r];
          std::uint32_t vh, vl;
          detail::split_bf16(f * v0, f * v1, vh, vl);
          *reinterpret_cast<std::uint32_t*>(sVhi + r * ldB + j) = vh;
          if constexpr (!Single) *reinterpret_cast<std::uint32_t*>(sVlo + r * ldB + j) = vl;
        }
    }
    __syncthreads();
    // S <- diag(gn) S + k^T (diag(fk) Vnew) on this warp's rows.
    {
      float lo[NT][4] = {};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[nt][e] *= gn[e >> 1];
      const __nv_bfloat16* cK =
          sK + b * kC * ldW + ((lane & 7) + 8 * (lane >> 4)) * ldW + i0 + 8 * ((lane >> 3) & 1);
      const int b_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * ldB + 8 * (lane >> 4);
#pragma unroll
      for (int k0 = 0; k0 < kC; k0 += 16) {
        const uint4 kt = detail::ldmatrix_x4_trans(cK + k0 * ldW);
#pragma unroll
        for (int p = 0; p < NT / 2; ++p) {
          const uint4 bh = detail::ldmatrix_x4_trans(sVhi + b_off + k0 * ldB + 16 * p);
          detail::mma_bf16(S[2 * p], kt, bh.x, bh.y);
          detail::mma_bf16(S[2 * p + 1], kt, bh.z, bh.w);
          if constexpr (!Single) {
            const uint4 bl = detail::ldmatrix_x4_trans(sVlo + b_off + k0 * ldB + 16 * p);
            detail::mma_bf16(lo[2 * p], kt, bl.x, bl.y);
            detail::mma_bf16(lo[2 * p + 1], kt, bl.z, bl.w);
          }
        }
      }
      if constexpr (!Single) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[nt][e] += lo[nt][e];
      }
    }
    // FuseOut: O = diag(fq) (q S) + P Vnew on the warp's tile, rows < the chunk's length to o
    // (the output kernel's arithmetic: P Vnew over k blocks <= the row block, one fma per element).
    if constexpr (FuseOut) {
      if (has_tile) {
        const __nv_bfloat16* cP = sP + b * kC * ldP + (r0 + (lane & 15)) * ldP + 8 * (lane >> 4);
        const int b_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * ldB + j0 + 8 * (lane >> 4);
        float pv[2][4] = {};
        for (int k0 = 0; k0 <= r0; k0 += 16) {
          const uint4 pa = detail::ldmatrix_x4(cP + k0);
          const uint4 vb = detail::ldmatrix_x4_trans(sVn + b_off + k0 * ldB);
          detail::mma_bf16(pv[0], pa, vb.x, vb.y);
          detail::mma_bf16(pv[1], pa, vb.z, vb.w);
        }
        store_output_tile<2>(a, seq, seq.bos + c * kC, h, col0 + j0, r0, chunk_rows(seq, c),
                             sfq + b * kC, qs, pv);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  if (progress && tid == 0 && chunks > 0) store_release(progress, static_cast<int>(chunks));
  store_state_slice(a.hout, n * a.hout_s0 + h * a.hout_s1, a.hout_s2, a.v_first, col0, i0, S);
}

}  // namespace gdr::cuda::chunked
