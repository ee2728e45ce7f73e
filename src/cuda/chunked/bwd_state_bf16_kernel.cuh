// bwd_state_bf16_kernel<BV>: the backward's sequential reverse pass (bwd_state_kernel in
// backward_kernels.cuh states the math) with the dS slice in registers and every product on bf16
// tensor-core operands, for the fused backward's case (scalar gate, bf16, no mask, Dk = 128;
// chunked_backward.cu takes it with bwd_chunk_bf16_kernel). Per chunk c of the sequence (last
// first), for the slice dS [Dk, BV] (fp32) of value columns col0 .. col0 + BV - 1:
//   publish  dS -> bf16 hi + lo in shared memory (|dS - hi - lo| <= 2^-18 |dS|), dS -> dS record;
//   dVnew = P^T dO + Kd dS       [C, BV]: P, Kd rounded to bf16, dO exact, dS as hi + lo
//            -> dVn scratch (fp32), and -> bf16 hi + lo in shared memory;
//   dS    <- gn dS + Qs^T dO - W^T dVnew: Qs, W rounded to bf16, dVnew as hi + lo.
// 16 warps: warp w owns rows 16 (w % 8) .. + 15 and half the columns (w / 8) of dS as mma
// accumulators; in dVnew warp w < 4 BV / 16 computes the 16 x 16 tile (w % 4, w / 4).
// The operands P, Kd, Qs, W (fp32 scratch of the backward's prep) arrive by cp.async in an fp32
// staging area one chunk ahead and are rounded to bf16 into their buffers by the thread that
// copied them (no barrier between its copy and its conversion): chunk c's Qs, W are converted
// after chunk c's first barrier (chunk c + 1's dS update, their last reader, is done), then chunk
// c - 1's are copied; chunk c - 1's P, Kd are converted after chunk c's second barrier (chunk c's
// dVnew, their last reader, is done), then chunk c - 2's are copied. dO rows arrive by cp.async
// with Qs, W. Two barriers per chunk.
// Op16: the operands arrive already rounded to bf16 (the bf16 prep's P16, Kd16, Qs16, W16,
// chunked_common.cuh: rounded to nearest from the same fp32 values, so bit-identical results):
// bf16 staging, copied into the padded buffers by the thread that copied them (same points, same
// barriers); half the bytes read per chunk (each head's operands are read by its Dv / BV blocks).
// Shared memory (bytes, BV = 32): staging P [C][C], Kd, Qs, W [C][Dk] (fp32 112 KB, Op16 56 KB);
// bf16 P [C][72], Kd, Qs, W [C][136] (60 KB); dS hi / lo [Dk][BV + 8], dVnew hi / lo [C][BV + 8],
// dO [2][C][BV + 8] bf16: ~214 KB (Op16 ~158 KB), one block per SM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/chunked/backward_kernels.cuh"
#include "cuda/chunked/bwd_chunk_bf16_kernel.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kBwdStateBf16Threads = 512;

template <int BV, bool Op16 = false>
struct BwdStateBf16Smem {
  static constexpr int Dk = kBwdFusedD, ldX = Dk + 8, ldP = kC + 8, ldB = BV + 8;
  static constexpr std::size_t stage = (Op16 ? 2 : 4) * (kC * kC + 3 * kC * Dk);
  static constexpr std::size_t bytes =
      stage + 2 * (kC * ldP + 3 * kC * ldX + 2 * Dk * ldB + 2 * kC * ldB + 2 * kC * ldB);
};

// A staged group of the reverse pass: two operand arrays end to end in the staging area, `na`
// 16-byte units of `a` first, then `b`'s, Units in all (compile-time, so that each unrolled
// unit's side is known); T float (4 elements a unit) or bf16 (8).
// Unit e of the group is thread e % threads's copy, so that the thread that copies a unit also
// converts it (stage_convert) with no barrier between.
template <int Units, int na, class T>
__device__ __forceinline__ void stage_copy(T* stage, const T* a, const T* b) {
  constexpr int E = 16 / sizeof(T), UnitsPerThread = Units / kBwdStateBf16Threads;
  static_assert(Units % kBwdStateBf16Threads == 0);
#pragma unroll
  for (int u = 0; u < UnitsPerThread; ++u) {
    const int e = threadIdx.x + u * kBwdStateBf16Threads;
    detail::cp_async16(stage + E * e, e < na ? a + E * e : b + E * (e - na));
  }
}
// The group's units into their bf16 buffers: a's rows of `ra` units at row stride lda, b's of `rb`
// units at ldb (elements); fp32 rounded to nearest, bf16 copied.
template <int Units, int na, int ra, int rb, class T>
__device__ __forceinline__ void stage_convert(const T* stage, __nv_bfloat16* da, int lda,
                                              __nv_bfloat16* db, int ldb) {
  constexpr int E = 16 / sizeof(T), UnitsPerThread = Units / kBwdStateBf16Threads;
#pragma unroll
  for (int u = 0; u < UnitsPerThread; ++u) {
    const int e = threadIdx.x + u * kBwdStateBf16Threads;
    const int o = e < na ? e : e - na;
    __nv_bfloat16* dst =
        e < na ? da + (o / ra) * lda + E * (o % ra) : db + (o / rb) * ldb + E * (o % rb);
    if constexpr (sizeof(T) == 4) {
      const float4 x = *reinterpret_cast<const float4*>(stage + E * e);
      *reinterpret_cast<uint2*>(dst) =
          make_uint2(detail::pack_bf16(x.x, x.y), detail::pack_bf16(x.z, x.w));
    } else {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(stage + E * e);
    }
  }
}

template <int BV, bool Op16>
__global__ void __launch_bounds__(kBwdStateBf16Threads, 1) bwd_state_bf16_kernel(BwdArgs b) {
  static_assert(BV == 16 || BV == 32, "16 or 32 value columns per block");
  using L = BwdStateBf16Smem<BV, Op16>;
  // NT: the n8 tiles of a warp's dS columns (half the slice).
  constexpr int Dk = L::Dk, ldX = L::ldX, ldP = L::ldP, ldB = L::ldB, NT = BV / 16;
  const ChunkArgs& a = b.c;
  extern __shared__ float4 smem4[];
  // The operands as they lie in the scratch (fp32, or bf16 with Op16), E to a 16-byte unit; their
  // staging: P [C * C], then Kd, Qs, W [C * Dk].
  using Op = std::conditional_t<Op16, __nv_bfloat16, float>;
  constexpr int E = 16 / sizeof(Op);
  Op* stP = reinterpret_cast<Op*>(smem4);
  Op* stQs = stP + kC * kC + kC * Dk;
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem4) + L::stage / 2;  // [C][ldP]
  __nv_bfloat16* sKd = sP + kC * ldP;                                          // [C][ldX] each
  __nv_bfloat16* sQs = sKd + kC * ldX;
  __nv_bfloat16* sW = sQs + kC * ldX;
  __nv_bfloat16* sShi = sW + kC * ldX;  // [Dk][ldB]
  __nv_bfloat16* sSlo = sShi + Dk * ldB;
  __nv_bfloat16* sVhi = sSlo + Dk * ldB;  // [C][ldB]: dVnew
  __nv_bfloat16* sVlo = sVhi + kC * ldB;
  __nv_bfloat16* sdO = sVlo + kC * ldB;  // [2][C][ldB]

  const int Dv = a.Dv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
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

  const Op *gP, *gKd, *gQs, *gW;
  if constexpr (Op16)
    gP = a.P16, gKd = a.Kd16, gQs = a.Qs16, gW = a.W16;
  else
    gP = f32(a.P), gKd = f32(a.Kd), gQs = f32(a.Qs), gW = f32(a.W);
  // The two staged groups: P then Kd (the dVnew operands), Qs then W (the dS update's).
  constexpr int unitsPKd = (kC * kC + kC * Dk) / E, unitsQsW = 2 * kC * Dk / E;
  auto copy_pkd = [&](std::int64_t c) {
    const std::int64_t p = item(c);
    stage_copy<unitsPKd, kC * kC / E>(stP, gP + p * kC * kC, gKd + p * kC * Dk);
  };
  auto convert_pkd = [&] {
    stage_convert<unitsPKd, kC * kC / E, kC / E, Dk / E>(stP, sP, ldP, sKd, ldX);
  };
  auto copy_qsw = [&](std::int64_t c) {
    const std::int64_t p = item(c);
    stage_copy<unitsQsW, kC * Dk / E>(stQs, gQs + p * kC * Dk, gW + p * kC * Dk);
  };
  auto convert_qsw = [&] {
    stage_convert<unitsQsW, kC * Dk / E, Dk / E, Dk / E>(stQs, sQs, ldX, sW, ldX);
  };
  // dO rows of chunk c, columns col0 .. col0 + BV - 1 (rows past the chunk zero).
  auto issue_dout = [&](std::int64_t c) {
    const int buf = static_cast<int>(c & 1);
    const std::int64_t rem = seq.len - c * kC;
    const int len = rem < kC ? static_cast<int>(rem) : kC;
    const __nv_bfloat16* base =
        static_cast<const __nv_bfloat16*>(b.dout) + seq.b * b.do_sb + h * b.do_sh + col0;
    for (int e = tid; e < kC * (BV / 8); e += kBwdStateBf16Threads) {
      const int r = e / (BV / 8), i = e - r * (BV / 8);
      const bool valid = r < len;
      cp_async16_zfill(sdO + buf * kC * ldB + r * ldB + 8 * i,
                       valid ? base + (seq.bos + c * kC + r) * b.do_st + 8 * i : base, valid);
    }
  };

  // dS: this warp's rows i0 .. i0 + 15 and columns c0w .. c0w + BV / 2 - 1 of the slice; dS[nt][e]
  // at row i0 + lg + 8 (e >> 1), column c0w + 8 nt + 2 lc + (e & 1).
  const int i0 = 16 * (warp & 7), c0w = (warp >> 3) * (BV / 2);
  // dS entering the window: dfinal_state (zeros without it) or the carry of a later window
  // ([N, Hv, Dk, Dv], k-first).
  const std::int64_t carry = (n * a.Hv + h) * Dk * Dv;
  float dS[NT][4];
  if (from_dht)
    load_state_slice(b.dht, n * b.dht_s0 + h * b.dht_s1, b.dht_s2, a.v_first, col0 + c0w, i0, dS);
  else
    load_state_slice(b.dS_carry, carry, Dv, false, col0 + c0w, i0, dS);
  // Prologue: chunk c_hi - 1's operands and dO (its P, Kd converted here), chunk c_hi - 2's P, Kd
  // in flight. cp.async groups: each chunk commits {Qs, W, dO of c - 1} after its first barrier
  // and {P, Kd of c - 2} after its second.
  if (c_hi > c_lo) {
    copy_qsw(c_hi - 1);
    copy_pkd(c_hi - 1);
    issue_dout(c_hi - 1);
  }
  detail::cp_async_commit();
  cp_async_wait<0>();
  if (c_hi > c_lo) convert_pkd();
  if (c_hi - 2 >= c_lo) copy_pkd(c_hi - 2);
  detail::cp_async_commit();

  for (std::int64_t c = c_hi - 1; c >= c_lo; --c) {
    const int buf = static_cast<int>(c & 1);
    const std::int64_t pidx = item(c);
    const float gn = a.gn[pidx];
    // Publish dS (hi + lo) for Kd dS; the dS record straight from the registers.
    {
      float* rec = b.dS + pidx * Dk * Dv + col0;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = i0 + lg + 8 * hf, j = c0w + 8 * nt + 2 * lc;
          std::uint32_t hi, lo;
          detail::split_bf16(dS[nt][2 * hf], dS[nt][2 * hf + 1], hi, lo);
          *reinterpret_cast<std::uint32_t*>(sShi + i * ldB + j) = hi;
          *reinterpret_cast<std::uint32_t*>(sSlo + i * ldB + j) = lo;
          *reinterpret_cast<float2*>(rec + std::int64_t(i) * Dv + j) =
              make_float2(dS[nt][2 * hf], dS[nt][2 * hf + 1]);
        }
    }
    cp_async_wait<1>();  // chunk c's Qs, W, dO (this thread's copies; c - 1's P, Kd may pend)
    __syncthreads();     // #1: dS published, chunk c's P, Kd converted, its dO in buffer `buf`
    convert_qsw();       // read after barrier #2
    if (c > c_lo) {
      copy_qsw(c - 1);
      issue_dout(c - 1);
    }
    detail::cp_async_commit();
    const __nv_bfloat16* cdO = sdO + buf * kC * ldB;
    // dVnew = P^T dO + Kd dS: the 16 x 16 tile (r0, j0) per warp.
    if (warp < 4 * (BV / 16)) {
      const int r0 = 16 * (warp & 3), j0 = 16 * (warp >> 2);
      float hi[2][4] = {}, lo[2][4] = {};
      const __nv_bfloat16* cP = sP;
      for (int k0 = r0; k0 < kC; k0 += 16)  // P^T upper triangular: k blocks >= the row block
        mma_n16(hi, frag_a_trans(cP, ldP, r0, k0), frag_b_cols(cdO, ldB, j0, k0));
      const __nv_bfloat16* cKd = sKd;
#pragma unroll
      for (int k0 = 0; k0 < Dk; k0 += 16) {
        const uint4 ak = frag_a(cKd, ldX, r0, k0);
        mma_n16(hi, ak, frag_b_cols(sShi, ldB, j0, k0));
        mma_n16(lo, ak, frag_b_cols(sSlo, ldB, j0, k0));
      }
      float* dVn = b.dVn + pidx * kC * Dv + col0;
      __nv_bfloat16* dVn16 = reinterpret_cast<__nv_bfloat16*>(b.dVn) + pidx * kC * Dv + col0;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = r0 + lg + 8 * hf, j = j0 + 8 * nt + 2 * lc;
          const float v0 = hi[nt][2 * hf] + lo[nt][2 * hf];
          const float v1 = hi[nt][2 * hf + 1] + lo[nt][2 * hf + 1];
          std::uint32_t vh, vl;
          detail::split_bf16(v0, v1, vh, vl);
          if (b.dvn16)  // the hi part: dVnew rounded to bf16 once, as the chunk kernel stages it
            *reinterpret_cast<std::uint32_t*>(dVn16 + std::int64_t(r) * Dv + j) = vh;
          else
            *reinterpret_cast<float2*>(dVn + std::int64_t(r) * Dv + j) = make_float2(v0, v1);
          *reinterpret_cast<std::uint32_t*>(sVhi + r * ldB + j) = vh;
          *reinterpret_cast<std::uint32_t*>(sVlo + r * ldB + j) = vl;
        }
    }
    __syncthreads();  // #2: dVnew and chunk c's Qs, W published; chunk c's P, Kd no longer read
    if (c > c_lo) {
      cp_async_wait<1>();  // chunk c - 1's P, Kd (this thread's copies)
      convert_pkd();       // read after chunk c - 1's barrier #1
    }
    if (c - 2 >= c_lo) copy_pkd(c - 2);
    detail::cp_async_commit();
    // dS <- gn dS + Qs^T dO - W^T dVnew on this warp's rows.
    {
      float wv[NT][4] = {};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dS[nt][e] *= gn;
      const __nv_bfloat16* cQs = sQs;
      const __nv_bfloat16* cW = sW;
#pragma unroll
      for (int k0 = 0; k0 < kC; k0 += 16) {
        const uint4 aq = frag_a_trans(cQs, ldX, i0, k0);
        const uint4 aw = frag_a_trans(cW, ldX, i0, k0);
        // Columns c0w .. c0w + 15 (BV = 16: c0w .. c0w + 7, the x4's second half unused).
        const uint4 bo = frag_b_cols(cdO, ldB, c0w, k0);
        const uint4 bh = frag_b_cols(sVhi, ldB, c0w, k0);
        const uint4 bl = frag_b_cols(sVlo, ldB, c0w, k0);
        detail::mma_bf16(dS[0], aq, bo.x, bo.y);
        detail::mma_bf16(wv[0], aw, bh.x, bh.y);
        detail::mma_bf16(wv[0], aw, bl.x, bl.y);
        if constexpr (NT == 2) {
          detail::mma_bf16(dS[1], aq, bo.z, bo.w);
          detail::mma_bf16(wv[1], aw, bh.z, bh.w);
          detail::mma_bf16(wv[1], aw, bl.z, bl.w);
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dS[nt][e] -= wv[nt][e];
    }
  }
  cp_async_wait<0>();
  // dS leaving the window: into the carry (an earlier window continues from it) or dh0.
  if (to_dh0)
    store_state_slice(b.dh0, n * b.dh0_s0 + h * b.dh0_s1, b.dh0_s2, a.v_first, col0 + c0w, i0, dS);
  else
    store_state_slice(b.dS_carry, carry, Dv, false, col0 + c0w, i0, dS);
}

}  // namespace gdr::cuda::chunked
