// chunk_prep_bf16_kernel: the prep kernel of the row-factor path (scalar gate, bf16 q, k, v with
// 16-byte aligned rows, no mask; chunked_forward.cu takes it there unless
// DecodeOverrides::chunked_prep = 1). It writes what chunk_prep_kernel<false, bf16> writes in
// that mode (chunked_kernels.cuh: W, U, P in bf16, the row factors fq, fk and gn in fp32), with
// every product on the raw bf16 rows (mma.sync m16n8k16, fragments by ldmatrix):
//   KK = K K^T, QK = Q K^T on the raw rows (exact products, fp32 sums); the L2 norms and the gates
//        are row and column scalings of the [C, C] results:
//        A[r, j] = beta_r Gam[r, j] nk_r nk_j KK[r, j]   (j < r),
//        P[r, j] = scale Gam[r, j] nq_r nk_j QK[r, j]   (j <= r),  Gam[r, j] = e^{G_r - G_j};
//   Tinv = (I + A)^{-1} (tinv.cuh, fp32);
//   W = Tinv diag(beta e^G nk) K,  U = Tinv diag(beta) V: the column scalings folded into Tinv,
//        whose fp32 entries are split into bf16 hi + lo (two products, ~2^-17 relative,
//        mma_bf16.cuh) against the exact raw K, V rows; rows of Tinv past the diagonal block are
//        zero, so row block i takes the k steps 0 .. i only.
// nq_r, nk_r are 1 / |q_r|, 1 / |k_r| with qk_l2norm, else 1. One block of 256 threads per (chunk
// slot, value head); the q, k, v rows arrive by cp.async (rows past the chunk zero-filled).
// Shared memory (bytes, Dk = Dv = 128: ~89 KB, two blocks per SM):
//   sK [C][Dk + 8] bf16 | sQ [C][Dk + 8] bf16, later Tinv [C][68] fp32 | sV [C][Dv + 8] bf16 |
//   A [C][68] fp32, later the W factor's hi, lo [C][72] bf16 | the U factor's hi, lo [C][72] bf16 |
//   G, beta, nq, nk, the W column factor [C] fp32 each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/chunked/chunked_common.cuh"
#include "cuda/chunked/tinv.cuh"
#include "cuda/common/wgmma.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kPrepBf16Threads = 256;
inline constexpr int kLdT16 = kC + 8;    // row stride (bf16) of the split Tinv factors
inline constexpr int kPrepWgmmaD = 128;  // Dk = Dv of the warpgroup-product form

// Fused (the fused pass's operands, T~ and ek): no v rows and no split factors (~54 KB at
// Dk = 128 against ~89 KB).
struct PrepBf16Smem {
  std::size_t k, q, v, a, tu, small;
  __host__ __device__ PrepBf16Smem(int Dk, int Dv, bool fused = false) {
    k = 2 * std::size_t(kC) * (Dk + 8);
    const std::size_t tinv = 4 * std::size_t(kC) * kLdA;
    q = k > tinv ? k : tinv;
    v = fused ? 0 : 2 * std::size_t(kC) * (Dv + 8);
    const std::size_t split = fused ? 0 : 2 * 2 * std::size_t(kC) * kLdT16;
    a = tinv > split ? tinv : split;
    tu = split;
    small = 5 * 4 * std::size_t(kC);
  }
  __host__ __device__ std::size_t bytes() const { return k + q + v + a + tu + small; }
};

inline std::size_t prep_bf16_smem_bytes(int Dk, int Dv, bool fused = false) {
  return PrepBf16Smem(Dk, Dv, fused).bytes();
}

// acc[nt] += F[r0 .. r0 + 15, 0 .. 16 (rb + 1)) X[.., c0 .. c0 + 31] for F = hi + lo (split
// factors, [C][kLdT16]) and X bf16 rows [C][ldX] (k = token along the rows: ldmatrix .trans).
__device__ __forceinline__ void split_factor_product(float (&acc)[4][4], const __nv_bfloat16* hi,
                                                     const __nv_bfloat16* lo,
                                                     const __nv_bfloat16* sX, int ldX, int rb,
                                                     int c0) {
  const int lane = threadIdx.x & 31;
  const int a_off = (16 * rb + (lane & 15)) * kLdT16 + 8 * (lane >> 4);
  const __nv_bfloat16* bX = sX + ((lane & 7) + 8 * ((lane >> 3) & 1)) * ldX + c0 + 8 * (lane >> 4);
  for (int kb = 0; kb <= rb; ++kb) {
    const uint4 ah = detail::ldmatrix_x4(hi + a_off + 16 * kb);
    const uint4 al = detail::ldmatrix_x4(lo + a_off + 16 * kb);
    const uint4 b01 = detail::ldmatrix_x4_trans(bX + 16 * kb * ldX);
    const uint4 b23 = detail::ldmatrix_x4_trans(bX + 16 * kb * ldX + 16);
    detail::mma_bf16_n32(acc, ah, b01, b23);
    detail::mma_bf16_n32(acc, al, b01, b23);
  }
}

// out [C][D] (St: bf16, or fp32 for the backward, global) = F X over D / 32 column blocks of 32 and
// 4 row blocks of 16, tiles dealt to the 8 warps so that each gets the same number of k steps (row
// blocks i and 3 - i); out16 (optional, bf16 [C][D]): the same values rounded to bf16.
template <class St>
__device__ __forceinline__ void split_factor_rows(St* out, int D, const __nv_bfloat16* hi,
                                                  const __nv_bfloat16* lo, const __nv_bfloat16* sX,
                                                  int ldX, __nv_bfloat16* out16 = nullptr) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, lg = lane >> 2, lc = lane & 3;
  const int tiles = 4 * (D / 32);
  for (int t = warp; t < tiles; t += kPrepBf16Threads / 32) {
    const int rb = ((t >> 3) & 1) ? 3 - (t & 3) : (t & 3), c0 = 32 * (t >> 2);
    float acc[4][4] = {};
    split_factor_product(acc, hi, lo, sX, ldX, rb, c0);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int col = c0 + 8 * nt + 2 * lc, r = 16 * rb + lg;
      store_pair(out + r * D + col, acc[nt][0], acc[nt][1]);
      store_pair(out + (r + 8) * D + col, acc[nt][2], acc[nt][3]);
      if (out16) {
        store_pair(out16 + r * D + col, acc[nt][0], acc[nt][1]);
        store_pair(out16 + (r + 8) * D + col, acc[nt][2], acc[nt][3]);
      }
    }
  }
}

// The warpgroup-product form (Wg, DecodeOverrides::chunked_prep = 3; Dk = Dv = 128):
// out [C][128] = F X by the calling warpgroup, F = hi + lo tiles [C][C] (K-major, wgmma_layout.h)
// and X the rows' tile [C][128] read N-major, 64 columns at a time (8 x m64n64k16 each: the k steps
// of the zero blocks above Tinv's diagonal too); out16 as split_factor_rows'.
template <class St>
__device__ __forceinline__ void split_factor_rows_wgmma(St* out, const unsigned char* hi,
                                                        const unsigned char* lo,
                                                        const unsigned char* sX,
                                                        __nv_bfloat16* out16 = nullptr) {
  using wgmma_layout::kmajor_operand;
  using wgmma_layout::mnmajor_operand;
  constexpr int D = kPrepWgmmaD;
  const int wl = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, lg = lane >> 2, lc = lane & 3;
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    float acc[8][4] = {};
    detail::wgmma_fence_operand(acc);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64n64k16<false, true>(
          acc, detail::wgmma_desc(hi, kmajor_operand(kC, 0, 16 * ks)),
          detail::wgmma_desc(sX, mnmajor_operand(D, 16 * ks, 64 * half)), ks > 0);
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks)
      detail::wgmma_m64n64k16<false, true>(
          acc, detail::wgmma_desc(lo, kmajor_operand(kC, 0, 16 * ks)),
          detail::wgmma_desc(sX, mnmajor_operand(D, 16 * ks, 64 * half)));
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_operand(acc);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * wl + lg + 8 * hf, col = 64 * half + 8 * j + 2 * lc;
        store_pair(out + r * D + col, acc[j][2 * hf], acc[j][2 * hf + 1]);
        if (out16) store_pair(out16 + r * D + col, acc[j][2 * hf], acc[j][2 * hf + 1]);
      }
  }
}

// Bwd: the backward's recompute (chunked_backward.cu, the fused path): the same products, written
// in the backward's fp32 scratch (W, U, P, Qs = scale diag(e^G nq) q, Kd = diag(e^{G_n - G} nk) k
// stored instead of the row factors) with its extra outputs: Tinv, KK = strict_lower(Gam .* nk nk^T
// .* k k^T), G, and per key head the normalised rows nq q, nk k (by the group's first value head).
// With a.P16 (the bf16 reverse pass's operands, chunked_common.cuh): P, Kd, Qs in bf16 only and W
// in both.
// Wg (ChunkArgs::prep_wgmma, DecodeOverrides::chunked_prep = 3; Dk = Dv = 128; opt-in: correct
// and slower on an H100, a560176, its product phase 4.0 k -> 7.0 k cycles per block): the q, k, v
// rows and the split factors as warpgroup-product tiles (wgmma_layout.h), K K^T and Q K^T as 8
// m64n64k16 per warpgroup (one each), W and U as split_factor_rows_wgmma (one warpgroup each); the
// rest as above.
// Fused (ChunkArgs::ek set, forward only): the fused pass's operands (fused_pass_kernel.cuh)
// instead of the split factors, W and U: T~ = Tinv diag(beta) (bf16, in W's place) and ek = e^G nk;
// no v rows, less shared memory (PrepBf16Smem) and fewer registers: three blocks per SM.
template <bool Bwd = false, bool Wg = false, bool Fused = false>
__global__ void __launch_bounds__(kPrepBf16Threads, Fused ? 3 : 2)
    chunk_prep_bf16_kernel(ChunkArgs a) {
  static_assert(!(Bwd && Fused), "the fused pass's operands are the forward's");
  using St = std::conditional_t<Bwd, float, __nv_bfloat16>;
  extern __shared__ float4 smem4[];
  const int Dk = a.Dk, Dv = a.Dv, ldK = Dk + 8, ldV = Dv + 8;
  const PrepBf16Smem lay(Dk, Dv, Fused);
  char* p = reinterpret_cast<char*>(smem4);
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(p);
  p += lay.k;
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(p);
  float* sT = reinterpret_cast<float*>(p);  // Tinv, once the q rows are no longer read
  p += lay.q;
  __nv_bfloat16* sV = reinterpret_cast<__nv_bfloat16*>(p);
  p += lay.v;
  float* sA = reinterpret_cast<float*>(p);
  __nv_bfloat16* sTwHi = reinterpret_cast<__nv_bfloat16*>(p);  // once A is no longer read
  __nv_bfloat16* sTwLo = sTwHi + kC * kLdT16;
  p += lay.a;
  __nv_bfloat16* sTuHi = reinterpret_cast<__nv_bfloat16*>(p);
  __nv_bfloat16* sTuLo = sTuHi + kC * kLdT16;
  p += lay.tu;
  float* sG = reinterpret_cast<float*>(p);
  float* sBeta = sG + kC;
  float* sNq = sBeta + kC;
  float* sNk = sNq + kC;
  float* sFw = sNk + kC;  // beta e^G nk: W's column factor

  // Element (r, i) of the staged q, k rows (Dk columns) and of the split factors (C columns).
  auto at_k = [&](int r, int i) {
    return Wg ? static_cast<int>(wgmma_layout::tile_offset(r, i, kPrepWgmmaD) / 2) : r * ldK + i;
  };
  auto at_t = [&](int r, int j) {
    return Wg ? static_cast<int>(wgmma_layout::tile_offset(r, j, kC) / 2) : r * kLdT16 + j;
  };
  auto bytes = [](const __nv_bfloat16* x) { return reinterpret_cast<const unsigned char*>(x); };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const std::int64_t wslot = blockIdx.x;
  const std::int64_t slot = a.slot_base + wslot;
  const int h = blockIdx.y;
  const int hk = h / a.group;
  std::int64_t n = 0;
  if (!slot_sequence(a, slot, n)) {
    zero_surplus_state_row(a, slot, h);
    return;
  }
  const SeqInfo seq = seq_info(a, n);
  const std::int64_t c = slot - seq.slot0;
  const std::int64_t t0 = seq.bos + c * kC;
  const int len = chunk_rows(seq, c);
  // Phases timed with DecodeOverrides::prep_phase_cycles (kPrepPhaseCounters; thread 0's clock):
  // 0 the q, k rows' arrival, 1 G and the norms, 2 warp 0's K K^T, Q K^T tile and P, 3 the row
  // factors (Bwd: Qs, Kd, the normalised rows) and the other tiles, 4 Tinv, 5 the split factors
  // and the v rows' arrival, 6 W and U (to the block's last warp); [7] the blocks.
  __shared__ long long phase_last;
  phase_mark(a.phase_cycles, phase_last, -1);

  if constexpr (Wg) {
    auto tile = [](__nv_bfloat16* x) { return reinterpret_cast<unsigned char*>(x); };
    copy_token_tile<kPrepWgmmaD>(tile(sK), a.k, a.k_sb, a.k_st, a.k_sh, seq.b, t0, hk, len);
    copy_token_tile<kPrepWgmmaD>(tile(sQ), a.q, a.q_sb, a.q_st, a.q_sh, seq.b, t0, hk, len);
    detail::cp_async_commit();
    if constexpr (!Fused)  // the fused pass reads the v rows itself
      copy_token_tile<kPrepWgmmaD>(tile(sV), a.v, a.v_sb, a.v_st, a.v_sh, seq.b, t0, h, len);
    detail::cp_async_commit();
  } else {
    copy_token_rows(sK, ldK, a.k, a.k_sb, a.k_st, a.k_sh, seq.b, t0, hk, len, Dk);
    copy_token_rows(sQ, ldK, a.q, a.q_sb, a.q_st, a.q_sh, seq.b, t0, hk, len, Dk);
    detail::cp_async_commit();
    if constexpr (!Fused)
      copy_token_rows(sV, ldV, a.v, a.v_sb, a.v_st, a.v_sh, seq.b, t0, h, len, Dv);
    detail::cp_async_commit();
  }
  if (tid < kC) {  // beta and the log decay per row; rows past the chunk: 0 (identity steps)
    float beta = 0.f, g = 0.f;
    if (tid < len) {
      const std::int64_t t = t0 + tid;
      beta = load_as_float(a.beta, seq.b * a.beta_sb + t * a.beta_st + h * a.beta_sh, a.beta_dtype);
      if (a.beta_sigmoid) beta = 1.f / (1.f + expf(-beta));
      g = load_as_float(a.g, seq.b * a.g_sb + t * a.g_st + h * a.g_sh, a.g_dtype);
      if (a.gate_in_kernel)
        g = -expf(a.A_log[h * a.A_log_s]) *
            softplus(g + (a.dt_bias ? a.dt_bias[h * a.dt_bias_sh] : 0.f));
    }
    sBeta[tid] = beta;
    sG[tid] = floor_log_decay(g);
    sNq[tid] = sNk[tid] = 1.f;
  }
  cp_async_wait<1>();  // this thread's q, k copies
  if constexpr (Wg) detail::fence_proxy_async();
  __syncthreads();
  phase_mark(a.phase_cycles, phase_last, 0);
  if (tid == 0) {  // G in token order, as the CPU paths (the roundings cancel in G_r - G_j)
    float4* g4 = reinterpret_cast<float4*>(sG);
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < kC / 4; ++r) {  // 16-byte loads in flight, the sums in registers
      float4 x = g4[r];
      x.x = s += x.x;
      x.y = s += x.y;
      x.z = s += x.z;
      x.w = s += x.w;
      g4[r] = x;
    }
  }
  if (a.qk_l2norm) {  // 1 / |q_r|, 1 / |k_r| (a warp per row, bf16 pairs)
    for (int r = warp; r < kC; r += kPrepBf16Threads / 32) {
      float sk = 0.f, sq = 0.f;
      for (int i = 2 * lane; i < Dk; i += 64) {
        const float2 kf =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(sK + at_k(r, i)));
        const float2 qf =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(sQ + at_k(r, i)));
        sk += kf.x * kf.x + kf.y * kf.y;
        sq += qf.x * qf.x + qf.y * qf.y;
      }
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) {
        sk += __shfl_xor_sync(0xffffffffu, sk, m);
        sq += __shfl_xor_sync(0xffffffffu, sq, m);
      }
      if (lane == 0) sNk[r] = 1.f / sqrtf(sk + a.eps), sNq[r] = 1.f / sqrtf(sq + a.eps);
    }
  }
  __syncthreads();
  phase_mark(a.phase_cycles, phase_last, 1);

  // K K^T and Q K^T: warp tiles of rows r0 .. r0 + 15 and key columns j0 .. j0 + 31; tiles wholly
  // above the diagonal are zero.
  const std::int64_t pidx = wslot * a.Hv + h;
  St* Pg = static_cast<St*>(a.P) + pidx * kC * kC;
  const bool op16 = Bwd && a.P16 != nullptr;  // uniform
  const int lg = lane >> 2, lc = lane & 3;
  if constexpr (Wg) {
    // Warpgroup 0: K K^T, warpgroup 1: Q K^T, whole (64 x 64, the zero blocks too); each then
    // forms its half of the epilogue below (A and KK, or P).
    const int wg = warp >> 2, wl = warp & 3;
    float acc[8][4] = {};
    const unsigned char* sX = bytes(wg ? sQ : sK);
    detail::wgmma_fence_operand(acc);
    detail::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kPrepWgmmaD / 16; ++ks)
      detail::wgmma_m64n64k16<false, false>(
          acc, detail::wgmma_desc(sX, wgmma_layout::kmajor_operand(kPrepWgmmaD, 0, 16 * ks)),
          detail::wgmma_desc(bytes(sK), wgmma_layout::kmajor_operand(kPrepWgmmaD, 0, 16 * ks)),
          ks > 0);
    detail::wgmma_commit();
    detail::wgmma_wait<0>();
    detail::wgmma_fence_operand(acc);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * wl + lg + 8 * hf, j = 8 * nt + 2 * lc;
        float out[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float gam = j + e <= r ? expf(sG[r] - sG[j + e]) : 0.f;
          if (wg == 0) {
            const float kkn = j + e < r ? gam * sNk[r] * sNk[j + e] * acc[nt][2 * hf + e] : 0.f;
            sA[r * kLdA + j + e] = sBeta[r] * kkn;
            out[e] = kkn;
          } else {
            out[e] = a.scale * gam * sNq[r] * sNk[j + e] * acc[nt][2 * hf + e];
          }
        }
        if (wg == 0) {
          if constexpr (Bwd)
            *reinterpret_cast<float2*>(a.KK_out + pidx * kC * kC + r * kC + j) =
                make_float2(out[0], out[1]);
        } else if (op16) {
          store_pair(a.P16 + pidx * kC * kC + r * kC + j, out[0], out[1]);
        } else {
          store_pair(Pg + r * kC + j, out[0], out[1]);
        }
      }
  } else {
    {
      const int r0 = 16 * (warp & 3), j0 = 32 * (warp >> 2);
      float kk[4][4] = {}, qk[4][4] = {};
      if (j0 <= r0 + 15) {
        const int a_off = (r0 + (lane & 15)) * ldK + 8 * (lane >> 4);
        const __nv_bfloat16* bK =
            sK + (j0 + (lane & 7) + ((lane >> 4) << 3)) * ldK + 8 * ((lane >> 3) & 1);
        for (int k0 = 0; k0 < Dk; k0 += 16) {
          const uint4 ak = detail::ldmatrix_x4(sK + a_off + k0);
          const uint4 aq = detail::ldmatrix_x4(sQ + a_off + k0);
          const uint4 b01 = detail::ldmatrix_x4(bK + k0);
          const uint4 b23 = detail::ldmatrix_x4(bK + 16 * ldK + k0);
          detail::mma_bf16_n32(kk, ak, b01, b23);
          detail::mma_bf16_n32(qk, aq, b01, b23);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        float pv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = r0 + lg + 8 * (e >> 1), j = j0 + 8 * nt + 2 * lc + (e & 1);
          const float gam = j <= r ? expf(sG[r] - sG[j]) : 0.f;
          const float kkn = j < r ? gam * sNk[r] * sNk[j] * kk[nt][e] : 0.f;
          sA[r * kLdA + j] = sBeta[r] * kkn;
          if constexpr (Bwd) a.KK_out[pidx * kC * kC + r * kC + j] = kkn;
          pv[e] = a.scale * gam * sNq[r] * sNk[j] * qk[nt][e];
        }
        const int r = r0 + lg, j = j0 + 8 * nt + 2 * lc;
        if (op16) {
          __nv_bfloat16* P16 = a.P16 + pidx * kC * kC;
          store_pair(P16 + r * kC + j, pv[0], pv[1]);
          store_pair(P16 + (r + 8) * kC + j, pv[2], pv[3]);
        } else {
          store_pair(Pg + r * kC + j, pv[0], pv[1]);
          store_pair(Pg + (r + 8) * kC + j, pv[2], pv[3]);
        }
      }
    }
  }
  phase_mark(a.phase_cycles, phase_last, 2);  // thread 0's tile (the largest k range)
  if (tid < kC) {  // Qs = diag(fq) q, Kd = diag(fk) k; 0 on rows past the chunk
    const bool valid = tid < len;
    if constexpr (!Bwd) {
      a.fq[pidx * kC + tid] = valid ? a.scale * expf(sG[tid]) * sNq[tid] : 0.f;
      a.fk[pidx * kC + tid] = valid ? expf(sG[kC - 1] - sG[tid]) * sNk[tid] : 0.f;
    } else {
      a.G_out[pidx * kC + tid] = sG[tid];
    }
    sFw[tid] = sBeta[tid] * expf(sG[tid]) * sNk[tid];
  }
  if (tid == 0) a.gn[pidx] = expf(sG[kC - 1]);
  if constexpr (Bwd) {  // Qs, Kd rows (and the normalised rows) before Tinv takes the q rows' space
    const bool key_head = h % a.group == 0;
    const std::int64_t kidx = (wslot * a.Hk + hk) * kC * Dk;
    float* Qs = static_cast<float*>(a.Qs) + pidx * kC * Dk;
    float* Kd = static_cast<float*>(a.Kd) + pidx * kC * Dk;
    for (int e = tid; e < kC * Dk / 2; e += kPrepBf16Threads) {
      const int r = e / (Dk / 2), i = 2 * (e - r * (Dk / 2));
      const float2 qf =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(sQ + at_k(r, i)));
      const float2 kf =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(sK + at_k(r, i)));
      const float nq = sNq[r], nk = sNk[r];
      const float fq = a.scale * expf(sG[r]) * nq, fk = expf(sG[kC - 1] - sG[r]) * nk;
      if (op16) {
        store_pair(a.Qs16 + pidx * kC * Dk + r * Dk + i, fq * qf.x, fq * qf.y);
        store_pair(a.Kd16 + pidx * kC * Dk + r * Dk + i, fk * kf.x, fk * kf.y);
      } else {
        *reinterpret_cast<float2*>(Qs + r * Dk + i) = make_float2(fq * qf.x, fq * qf.y);
        *reinterpret_cast<float2*>(Kd + r * Dk + i) = make_float2(fk * kf.x, fk * kf.y);
      }
      if (key_head && !a.qk_norms_only) {
        *reinterpret_cast<float2*>(a.Qn_out + kidx + r * Dk + i) =
            make_float2(nq * qf.x, nq * qf.y);
        *reinterpret_cast<float2*>(a.Kn_out + kidx + r * Dk + i) =
            make_float2(nk * kf.x, nk * kf.y);
      }
    }
    if (key_head && a.qk_norms_only && tid < kC) {  // the rows' norms only (RawQK chunk kernel)
      a.Qn_out[kidx + tid] = sNq[tid];
      a.Kn_out[kidx + tid] = sNk[tid];
    }
  }
  __syncthreads();
  phase_mark(a.phase_cycles, phase_last, 3);
  unit_lower_inverse(sA, sT, a.tinv_schedule);  // into the q rows' space; ends with a barrier
  phase_mark(a.phase_cycles, phase_last, 4);
  // The fused pass's operands: T~ = Tinv diag(beta) (bf16, in W's place) and ek = e^G nk.
  if constexpr (Fused) {
    __nv_bfloat16* Tt = static_cast<__nv_bfloat16*>(a.W) + pidx * kC * kC;
    for (int e = tid; e < kC * kC / 2; e += kPrepBf16Threads) {
      const int r = e / (kC / 2), j = 2 * (e - r * (kC / 2));
      store_pair(Tt + r * kC + j, sT[r * kLdA + j] * sBeta[j], sT[r * kLdA + j + 1] * sBeta[j + 1]);
    }
    if (tid < kC) a.ek[pidx * kC + tid] = tid < len ? expf(sG[tid]) * sNk[tid] : 0.f;
  } else {
    // The split factors T_w = Tinv diag(beta e^G nk), T_u = Tinv diag(beta) (bf16 hi + lo pairs).
    for (int e = tid; e < kC * kC / 2; e += kPrepBf16Threads) {
      const int r = e / (kC / 2), j = 2 * (e - r * (kC / 2));
      const float t0v = sT[r * kLdA + j], t1v = sT[r * kLdA + j + 1];
      if constexpr (Bwd)
        *reinterpret_cast<float2*>(a.Tinv_out + pidx * kC * kC + r * kC + j) =
            make_float2(t0v, t1v);
      std::uint32_t hi, lo;
      detail::split_bf16(t0v * sFw[j], t1v * sFw[j + 1], hi, lo);
      *reinterpret_cast<std::uint32_t*>(sTwHi + at_t(r, j)) = hi;
      *reinterpret_cast<std::uint32_t*>(sTwLo + at_t(r, j)) = lo;
      detail::split_bf16(t0v * sBeta[j], t1v * sBeta[j + 1], hi, lo);
      *reinterpret_cast<std::uint32_t*>(sTuHi + at_t(r, j)) = hi;
      *reinterpret_cast<std::uint32_t*>(sTuLo + at_t(r, j)) = lo;
    }
  }
  cp_async_wait<0>();  // this thread's v copies (none when Fused)
  if constexpr (Wg) detail::fence_proxy_async();
  __syncthreads();
  phase_mark(a.phase_cycles, phase_last, 5);
  if constexpr (!Fused) {
    if constexpr (Wg) {  // W by warpgroup 0, U by warpgroup 1
      if (warp < 4)
        split_factor_rows_wgmma(static_cast<St*>(a.W) + pidx * kC * Dk, bytes(sTwHi), bytes(sTwLo),
                                bytes(sK), op16 ? a.W16 + pidx * kC * Dk : nullptr);
      else
        split_factor_rows_wgmma(static_cast<St*>(a.U) + pidx * kC * Dv, bytes(sTuHi), bytes(sTuLo),
                                bytes(sV));
    } else {
      split_factor_rows(static_cast<St*>(a.W) + pidx * kC * Dk, Dk, sTwHi, sTwLo, sK, ldK,
                        op16 ? a.W16 + pidx * kC * Dk : nullptr);
      split_factor_rows(static_cast<St*>(a.U) + pidx * kC * Dv, Dv, sTuHi, sTuLo, sV, ldV);
    }
  }
  if (a.phase_cycles) {  // the block's end: its last warp to finish
    __syncthreads();
    phase_mark(a.phase_cycles, phase_last, 6);
    if (tid == 0) atomicAdd(a.phase_cycles + 7, 1ull);
  }
}

}  // namespace gdr::cuda::chunked
