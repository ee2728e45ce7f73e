// The chunk kernel: the recurrent (decode / sequential forward) step, 8 tokens at a time, with
// the state in shared memory and its products on the tensor cores (bench/NOTES-gpu.md, v30).
// Exists for a k-first fp32 state, Dk = 128, scalar gate (tuning.h, recurrent_chunk_applies; any
// T, varlen, pools); the rules take it for 8 to 16 tokens per sequence from 4 heads per SM
// (recurrent_chunk_preferred), recurrent.cuh's kernels elsewhere.
//
// Math (SPEC Section 2) of one chunk of C <= 8 tokens, per sequence and value head, S0 the
// state entering the chunk (Dk x Dv), a_t the decay (1 for a masked or padding token), beta_t
// (0 for a masked or padding token), k^_t = rk_t k_t and q~_t = fq_t q_t the normed and scaled
// keys and queries (rk = 1 / ||k||, fq = scale / ||q|| with the in-kernel L2 norm, else 1 and
// scale):
//   Dec[t][s] = a_{s+1} ... a_t (s <= t),  gamma_t = a_0 ... a_t
//   u_s  = beta_s (v_s - gamma_s S0^T k^_s) - sum_{r<s} beta_s Dec[s][r] (k^_s . k^_r) u_r
//   o_t  = gamma_t S0^T q~_t + sum_{s<=t} Dec[t][s] (q~_t . k^_s) u_s
//   S_C  = gamma_{C-1} S0 + sum_s Dec[C-1][s] k^_s u_s^T
// which is the per-token recurrence (u_s = beta_s (v_s - S'_s^T k^_s), S_s = S'_s + k^_s u_s^T,
// S'_s = a_s S_{s-1}) unrolled over the chunk; the decays enter only as products over token
// ranges (no division by a cumulative decay that may underflow).
//
// A block owns CB = 8 NT value columns of one (sequence, value head) and all Dk keys. Per chunk:
//  1. stage the chunk's q, k, v, gates, beta, mask (recurrent.cuh's staging);
//  2. (first chunk) the state slice S0 [Dk][CB] -> shared memory by cp.async (16-byte units,
//     swizzled, below), in flight while 3.-4. run; the L2 asked for a later block's state
//     (recurrent.cuh, prefetch_state_of_block);
//  3. the A operand X = [k_0 .. k_7; q_0 .. q_7] (16 x Dk, raw values, zero rows for masked or
//     padding tokens) in mma fragment order, split into tf32 hi + lo parts;
//  4. warp 0: the Gram X X^T on the tensor cores (the fragments of X serve as those of X^T),
//     then the chunk's 8 x 8 coefficients (Dec, the solve's L, o's Mo, row factors);
//  5. P = X S0 (16 x CB) on the tensor cores, 3xTF32 (2 passes when X is exact in tf32, i.e.
//     16-bit inputs): rows 0-7 S0^T k_s, rows 8-15 S0^T q_t;
//  6. per value column: u by forward substitution, o (stored);
//  7. S_C = gamma S0 + K~^T U on the tensor cores (M = keys, N = values, K = 8 tokens; C read
//     from shared memory), stored to the state (last chunk) or back to shared memory.
// Decode in place: a block reads its whole slice before it writes; blocks share no columns.
//
// Shared state layout: S[i][j] at i * CB + 4 * ((j / 4) ^ (2 * (i % 4))) + j % 4. The XOR moves
// whole 16-byte units inside an aligned group of 8 units, so that the mma B fragment (keys
// kb + lane % 4 (+ 4), column nb + lane / 4), the C fragment pairs (rows ib + lane / 4 (+ 8),
// columns nb + 2 (lane % 4) .. + 1) and the cp.async unit stores all hit distinct banks.
#pragma once

#include <cstdint>

#include "cuda/mma_tf32.cuh"
#include "cuda/recurrent.cuh"

namespace gdr::cuda::detail {

// Shared memory of one block, in floats (every array starts on a 16-byte boundary).
template <int NT>
struct ChunkV30Layout {
  static constexpr int kDK = 128;      // keys
  static constexpr int kCB = 8 * NT;   // value columns of the block
  static constexpr int kTok = 8;       // tokens per chunk
  static constexpr int kPS = kCB + 8;  // row stride of P and U (conflict-free fragment access)
  static constexpr int kState = 0;     // [DK][CB], swizzled
  static constexpr int kQ = kState + kDK * kCB;  // [8][DK] staged q (raw)
  static constexpr int kK = kQ + kTok * kDK;     // [8][DK] staged k (raw)
  static constexpr int kV = kK + kTok * kDK;     // [8][CB] staged v
  static constexpr int kG = kV + kTok * kCB;     // [8] a = exp(g)
  static constexpr int kB = kG + kTok;           // [8] beta
  static constexpr int kM = kB + kTok;           // [8] mask (1 = step)
  static constexpr int kXhi = kM + kTok;         // [DK / 8][32 lanes][4] X, tf32 hi part
  static constexpr int kP = kXhi + 16 * kDK;     // [16][PS] P = X S0
  static constexpr int kU = kP + 16 * kPS;       // [8][PS] u
  static constexpr int kGram = kU + kTok * kPS;  // [16][16] X X^T
  static constexpr int kL = kGram + 256;         // [8][8] solve coefficients
  static constexpr int kMo = kL + 64;            // [8][8] o coefficients
  static constexpr int kCK = kMo + 64;           // [8] beta_s gamma_s rk_s
  static constexpr int kCQ = kCK + kTok;         // [8] gamma_t fq_t (0 if masked)
  static constexpr int kCU = kCQ + kTok;         // [8] Dec[C-1][s] rk_s
  static constexpr int kBE = kCU + kTok;         // [8] beta_s (0 if masked)
  static constexpr int kGamma = kBE + kTok;      // [4] gamma_{C-1}
  static constexpr int kXlo = kGamma + 4;        // X, tf32 lo part (fp32 inputs only)
  static constexpr int kFloatsExact = kXlo;      // 16-bit inputs: no lo part
  static constexpr int kFloats = kXlo + 16 * kDK;
};

template <int CB>
__device__ __forceinline__ int swizzled(int i, int j) {
  return i * CB + ((((j >> 2) ^ ((i & 3) << 1))) << 2) + (j & 3);
}

// The block's state slice S0 [128][CB] -> shared memory (swizzled) by cp.async, one commit
// group; thread: 16-byte unit c of key rows i0, i0 + RPI, ... (RPI % 4 == 0 keeps the row
// swizzle). Also the next-wave L2 prefetch of a later block's slice.
template <int CB, int NTHREADS>
__device__ __forceinline__ void copy_state_slice(const RecurrentArgs& a, float* Ss,
                                                 std::int64_t row, int hv, int col0, int tid) {
  constexpr int DK = 128, UPR = CB / 4, RPI = NTHREADS / UPR;
  static_assert(NTHREADS % UPR == 0 && RPI % 4 == 0 && DK % RPI == 0);
  const int c = tid % UPR, i0 = tid / UPR;
  const float* src = a.h_in + row * a.hin_s0 + hv * a.hin_s1 + col0 + i0 * a.hin_s2 + 4 * c;
  float* dst = Ss + swizzled<CB>(i0, 4 * c);
  const std::int64_t step = RPI * a.hin_s2;
#pragma unroll
  for (int it = 0; it < DK / RPI; ++it) cp_async16(dst + it * RPI * CB, src + it * step);
  cp_async_commit();
  if (a.prefetch_blocks > 0) prefetch_state_of_block<DK, false>(a, CB, 4);
}

// NT n-tiles (8 value columns each) per block, W warps; Dv % (8 NT) == 0 (host).
template <int NT, int W>
__global__ void __launch_bounds__(W * 32, NT == 16 ? 2 : (NT == 8 ? 3 : 4))
    recurrent_chunk_v30_kernel(const RecurrentArgs a) {
  using Ly = ChunkV30Layout<NT>;
  constexpr int DK = Ly::kDK, CB = Ly::kCB, PS = Ly::kPS, NTHREADS = W * 32;
  constexpr int KSTEPS = DK / 8, MTILES = DK / 16;
  constexpr int NPW = NT / W;            // n-tiles of P per warp
  constexpr int MPW = MTILES / W;        // m-tiles (16 keys) of the update per warp
  constexpr int GROUPS = NTHREADS / CB;  // threads per value column in step 6
  static_assert(NT % W == 0 && MTILES % W == 0 && NTHREADS % CB == 0 && 8 % GROUPS == 0);
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  float* Ss = sm + Ly::kState;
  float* qs = sm + Ly::kQ;
  float* ks = sm + Ly::kK;
  float* vs = sm + Ly::kV;
  float* gs = sm + Ly::kG;
  float* bs = sm + Ly::kB;
  float* ms = sm + Ly::kM;
  float* xhi = sm + Ly::kXhi;
  float* xlo = sm + Ly::kXlo;
  float* Ps = sm + Ly::kP;
  float* Us = sm + Ly::kU;
  float* Gr = sm + Ly::kGram;
  float* Lc = sm + Ly::kL;
  float* Mo = sm + Ly::kMo;
  float* cK = sm + Ly::kCK;
  float* cQ = sm + Ly::kCQ;
  float* cU = sm + Ly::kCU;
  float* bE = sm + Ly::kBE;
  float* gam = sm + Ly::kGamma;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int lg = lane >> 2, lc = lane & 3;  // mma fragment row group and column
  const BlockItem it = block_item(a);
  const int hv = it.hv, hk = it.hk;
  const std::int64_t b = it.b, t0 = it.t0, len = it.len, row = it.row;
  const int col0 = it.split * CB;
  if (fill_o_of_skipped_row(a, it, col0, CB)) return;

  // No h_in: a zero state (otherwise step 2 copies the slice).
  if (!a.h_in) {
    for (int f = tid; f < DK * CB / 4; f += NTHREADS)
      reinterpret_cast<float4*>(Ss)[f] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  const float A = a.gate_in_kernel ? -expf(__ldg(a.A_log + hv)) : 0.f;  // g = A softplus(a + dt_b)
  const float* dtb = a.dt_bias ? a.dt_bias + hv * a.dt_bias_sh : nullptr;
  const BlockRows rows = block_rows(a, it, col0);
  const std::int64_t orow = b * a.o_sb + t0 * a.o_st + hv * a.o_sh + col0;
  const bool x_exact = a.in_dtype != kF32;  // 16-bit inputs are exact in tf32 (X lo = 0)

  const std::int64_t nchunks = len > 0 ? (len + 7) / 8 : 1;
  for (std::int64_t ch = 0; ch < nchunks; ++ch) {
    const std::int64_t tb = ch * 8;
    const int cnt = static_cast<int>(len - tb < 8 ? len - tb : 8);  // 0 only when len == 0
    if (ch > 0) __syncthreads();  // the previous chunk's readers are done
    // 1. Staging.
    if (cnt > 0) {
      if (a.vec_tok) {
        stage_units<DK, false>(a, rows, cnt, tb, CB, A, dtb, qs, ks, vs, gs, bs, ms);
      } else {
        stage_elements<DK, false>(a, rows, t0, cnt, b, t0 + tb, hv, hk, col0, CB, A, dtb, qs, ks,
                                  vs, gs, bs, ms);
      }
    }
    // 2. The state slice, in flight while X, the Gram and the coefficients are formed. Issued
    //    after the staging loads: before them, the small token loads queue behind the 64 KB copy
    //    and the block waits longer (bench/NOTES-gpu.md, v30: T = 8, B = 256 421 -> 393 us).
    if (ch == 0 && a.h_in) copy_state_slice<CB, NTHREADS>(a, Ss, row, hv, col0, tid);
    __syncthreads();
    // 3. X in fragment order: float4 f = (k-step, lane) holds lane's a0..a3 of that k-step,
    //    i.e. k_t[col], q_t[col], k_t[col + 4], q_t[col + 4] with t = lane / 4, col = 8 k-step +
    //    lane % 4.
    for (int f = tid; f < KSTEPS * 32; f += NTHREADS) {
      const int t = (f & 31) >> 2, col = 8 * (f >> 5) + (f & 3);
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (t < cnt && ms[t] != 0.f)
        x = make_float4(ks[t * DK + col], qs[t * DK + col], ks[t * DK + col + 4],
                        qs[t * DK + col + 4]);
      const float4 h = make_float4(tf32_hi(x.x), tf32_hi(x.y), tf32_hi(x.z), tf32_hi(x.w));
      reinterpret_cast<float4*>(xhi)[f] = h;
      if (!x_exact)
        reinterpret_cast<float4*>(xlo)[f] = make_float4(x.x - h.x, x.y - h.y, x.z - h.z, x.w - h.w);
    }
    __syncthreads();
    // 4. Warp 0: the Gram X X^T (16 x 16; B fragments of X^T are X's a0/a2 for the k columns,
    //    a1/a3 for the q columns), then the coefficients of the chunk.
    if (warp == 0) {
      float gk[4] = {0.f, 0.f, 0.f, 0.f}, gq[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
      for (int kst = 0; kst < KSTEPS; ++kst) {
        const float4 h = reinterpret_cast<const float4*>(xhi)[kst * 32 + lane];
        if (!x_exact) {
          const float4 l = reinterpret_cast<const float4*>(xlo)[kst * 32 + lane];
          mma_tf32(gk, l, h.x, h.z);
          mma_tf32(gk, h, l.x, l.z);
          mma_tf32(gq, l, h.y, h.w);
          mma_tf32(gq, h, l.y, l.w);
        }
        mma_tf32(gk, h, h.x, h.z);
        mma_tf32(gq, h, h.y, h.w);
      }
      *reinterpret_cast<float2*>(Gr + lg * 16 + 2 * lc) = make_float2(gk[0], gk[1]);
      *reinterpret_cast<float2*>(Gr + (lg + 8) * 16 + 2 * lc) = make_float2(gk[2], gk[3]);
      *reinterpret_cast<float2*>(Gr + lg * 16 + 8 + 2 * lc) = make_float2(gq[0], gq[1]);
      *reinterpret_cast<float2*>(Gr + (lg + 8) * 16 + 8 + 2 * lc) = make_float2(gq[2], gq[3]);
      __syncwarp();
      // Lane t (mod 8): token t's decay, beta, norms; every lane gets all tokens' decays and key
      // norms by shuffles.
      const bool l2 = a.qk_l2norm;
      const int t = lane & 7;
      const bool live_t = t < cnt && ms[t] != 0.f;
      const float a_t = live_t ? gs[t] : 1.f;
      const float be_t = live_t ? bs[t] : 0.f;
      const float rk_t = l2 ? 1.f / sqrtf(Gr[t * 17] + a.eps) : 1.f;
      const float fq_t = a.scale * (l2 ? 1.f / sqrtf(Gr[(8 + t) * 17] + a.eps) : 1.f);
      float av[8], rk[8];
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        av[s] = __shfl_sync(0xffffffffu, a_t, s);
        rk[s] = __shfl_sync(0xffffffffu, rk_t, s);
      }
      float dec[8];  // Dec[t][s]; d ends as gamma_t
      float d = 1.f;
#pragma unroll
      for (int s = 7; s >= 0; --s) {
        dec[s] = s <= t ? d : 0.f;
        if (s <= t) d *= av[s];
      }
      if (lane < 8) {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          Lc[t * 8 + s] = s < t ? be_t * dec[s] * Gr[t * 16 + s] * rk_t * rk[s] : 0.f;
          Mo[t * 8 + s] = live_t && s <= t ? dec[s] * Gr[(8 + t) * 16 + s] * fq_t * rk[s] : 0.f;
        }
        cK[t] = be_t * d * rk_t;
        cQ[t] = live_t ? d * fq_t : 0.f;
        bE[t] = be_t;
        if (t == 7) {
#pragma unroll
          for (int s = 0; s < 8; ++s) cU[s] = dec[s] * rk[s];
          gam[0] = d;
        }
      }
    }
    if (ch == 0 && a.h_in) cp_async_wait_all();
    __syncthreads();
    // 5. P = X S0: warp w owns n-tiles w NPW .. + NPW - 1 over all keys.
    {
      float p[NPW][4], pe[NPW][4];  // main and correction products
#pragma unroll
      for (int nt = 0; nt < NPW; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) p[nt][r] = pe[nt][r] = 0.f;
      // B fragments: keys 8 k-step + lane % 4 (+ 4), columns 8 n-tile + lane / 4; the row
      // swizzle (key % 4 = lane % 4) is the same for every k-step: per-thread bases.
      const float* bcol[NPW];
#pragma unroll
      for (int nt = 0; nt < NPW; ++nt) bcol[nt] = Ss + swizzled<CB>(lc, 8 * (warp * NPW + nt) + lg);
#pragma unroll 4
      for (int kst = 0; kst < KSTEPS; ++kst) {
        const float4 h = reinterpret_cast<const float4*>(xhi)[kst * 32 + lane];
        const float4 l = x_exact ? h : reinterpret_cast<const float4*>(xlo)[kst * 32 + lane];
#pragma unroll
        for (int nt = 0; nt < NPW; ++nt)
          mma_3xtf32(p[nt], pe[nt], h, l, bcol[nt][8 * kst * CB], bcol[nt][(8 * kst + 4) * CB],
                     x_exact);
      }
#pragma unroll
      for (int nt = 0; nt < NPW; ++nt) {
        const int j = 8 * (warp * NPW + nt) + 2 * lc;
        *reinterpret_cast<float2*>(Ps + lg * PS + j) =
            make_float2(p[nt][0] + pe[nt][0], p[nt][1] + pe[nt][1]);
        *reinterpret_cast<float2*>(Ps + (lg + 8) * PS + j) =
            make_float2(p[nt][2] + pe[nt][2], p[nt][3] + pe[nt][3]);
      }
    }
    __syncthreads();
    // 6. Per value column j: u by forward substitution (every thread of the column), o for the
    //    tokens t with t % GROUPS == the thread's group, u stored by group 0.
    {
      const int j = tid % CB, grp = tid / CB;
      float u[8];
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        float x = 0.f;
        if (s < cnt) x = bE[s] != 0.f ? bE[s] * vs[s * CB + j] - cK[s] * Ps[s * PS + j] : 0.f;
#pragma unroll
        for (int r = 0; r < s; ++r) x -= Lc[s * 8 + r] * u[r];
        u[s] = x;
      }
      if (grp == 0) {
#pragma unroll
        for (int s = 0; s < 8; ++s) Us[s * PS + j] = u[s];
      }
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        if (t % GROUPS != grp || t >= cnt) continue;
        float o = cQ[t] * Ps[(8 + t) * PS + j];
#pragma unroll
        for (int s = 0; s <= t; ++s) o += Mo[t * 8 + s] * u[s];
        store_from_float(a.o, orow + (tb + t) * a.o_st + j, a.in_dtype, o);
      }
    }
    __syncthreads();
    // 7. S = gamma S0 + K~^T U, K~[s][i] = cU[s] k_s[i]: warp w owns key tiles w MPW .. + MPW - 1
    //    over all the block's columns.
    const bool last = ch + 1 == nchunks;
    if (last && !a.h_out) continue;
    const float gl = gam[0];
    float* out = last ? a.h_out + row * a.hout_s0 + hv * a.hout_s1 + col0 : nullptr;
    // C pairs: keys i (+ 8), columns 8 n-tile + 2 (lane % 4) .. + 1, shared offset
    // i CB + 2 (lane % 4) + 8 (n-tile ^ (i % 4)) (swizzled() with i % 4 = lane / 4 % 4).
    const int sw = lg & 3;
    const float* ub0 = Us + lc * PS + lg;  // B fragments: u of token lane % 4 (+ 4)
    const float* ub1 = ub0 + 4 * PS;
#pragma unroll
    for (int mi = 0; mi < MPW; ++mi) {
      const int i = 16 * (warp * MPW + mi) + lg;
      auto kt = [&](int s, int key) {
        const float c = cU[s];
        return c != 0.f ? c * ks[s * DK + key] : 0.f;
      };
      const float4 ka = make_float4(kt(lc, i), kt(lc, i + 8), kt(lc + 4, i), kt(lc + 4, i + 8));
      const float4 kh = make_float4(tf32_hi(ka.x), tf32_hi(ka.y), tf32_hi(ka.z), tf32_hi(ka.w));
      const float4 kl = make_float4(ka.x - kh.x, ka.y - kh.y, ka.z - kh.z, ka.w - kh.w);
      float* srow = Ss + i * CB + 2 * lc;
      // The new state of n-tile nt: gamma S0 + K~^T U (the shared S0 pairs and u as loaded); one
      // accumulator for the three products (d passed as both), the unrolled tiles interleave.
      auto tile = [&](int nt, float2 s01, float2 s23, float(&d)[4]) {
        d[0] = gl * s01.x, d[1] = gl * s01.y, d[2] = gl * s23.x, d[3] = gl * s23.y;
        mma_3xtf32(d, d, kh, kl, ub0[8 * nt], ub1[8 * nt], false);
      };
      if (last) {  // to the state rows in global memory (no shared store: loads run ahead)
        float* grow = out + i * a.hout_s2 + 2 * lc;
        const std::int64_t g8 = 8 * a.hout_s2;
#pragma unroll 4
        for (int nt = 0; nt < NT; ++nt) {
          const float* c01 = srow + 8 * (nt ^ sw);
          float d[4];
          tile(nt, *reinterpret_cast<const float2*>(c01),
               *reinterpret_cast<const float2*>(c01 + 8 * CB), d);
          __stcs(reinterpret_cast<float2*>(grow + 8 * nt), make_float2(d[0], d[1]));
          __stcs(reinterpret_cast<float2*>(grow + g8 + 8 * nt), make_float2(d[2], d[3]));
        }
      } else {  // back to shared memory for the next chunk (each pair read and written here)
#pragma unroll 4
        for (int nt = 0; nt < NT; ++nt) {
          float* c01 = srow + 8 * (nt ^ sw);
          float d[4];
          tile(nt, *reinterpret_cast<const float2*>(c01),
               *reinterpret_cast<const float2*>(c01 + 8 * CB), d);
          *reinterpret_cast<float2*>(c01) = make_float2(d[0], d[1]);
          *reinterpret_cast<float2*>(c01 + 8 * CB) = make_float2(d[2], d[3]);
        }
      }
    }
  }
}

}  // namespace gdr::cuda::detail
