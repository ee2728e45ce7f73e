// The chunk kernel: the recurrent (decode / sequential forward) step, 8 tokens at a time, with
// the state slice in registers, its products on the tensor cores, and persistent blocks that
// copy the next item's state and tokens while they compute the current one (docs/cuda-decode.md,
// v31). Exists for a k-first fp32 or bf16 state (SB: read into fp32 registers, rounded to nearest
// even once at an item's store), Dk = 128, scalar gate (tuning.h, recurrent_chunk_applies;
// any T, varlen, pools); the rules take it from 8 tokens per sequence and 4 heads per SM
// (recurrent_chunk_preferred), recurrent.cuh's kernels elsewhere.
//
// Math (docs/operator.md §2) of one chunk of C <= 8 tokens, per sequence and value head, S0 the
// state entering the chunk (Dk x Dv), a_t the decay (1 for a masked or padding token), beta_t
// (0 for a masked or padding token), k^_t = rk_t k_t and q~_t = fq_t q_t the normed and scaled
// keys and queries (rk = 1 / ||k||, fq = scale / ||q|| with the in-kernel L2 norm, else 1 and
// scale):
//   Dec[t][s] = a_{s+1} ... a_t (s <= t),  gamma_t = a_0 ... a_t
//   L[s][r]   = beta_s Dec[s][r] (k^_s . k^_r) (r < s),  Ti = (I + L)^-1 (unit lower triangular)
//   b_s       = beta_s (v_s - gamma_s S0^T k^_s),         u = Ti b (per value column)
//   o_t       = gamma_t S0^T q~_t + sum_{s<=t} Dec[t][s] (q~_t . k^_s) u_s
//   S_C       = gamma_{C-1} S0 + sum_s Dec[C-1][s] k^_s u_s^T
// which is the per-token recurrence (u_s = beta_s (v_s - S'_s^T k^_s), S_s = S'_s + k^_s u_s^T,
// S'_s = a_s S_{s-1}) unrolled over the chunk; the decays enter only as products over token
// ranges (no division by a cumulative decay that may underflow).
//
// Work: an item is CB = 16 W value columns of one (sequence, value head) with all Dk keys; a
// block of W warps takes items blockIdx.x, + gridDim.x, ... (grid: the resident blocks), or after
// blockIdx.x the next from a per-call counter (DYNAMIC, tuning.h recurrent_chunk_dynamic). Warp w
// holds S^T of its 16 columns (M) x 128 keys (N) as the C fragments of 16 mma tiles, 64 floats
// per thread: thread (g = lane / 4, c = lane % 4) holds fragment rows g and g + 8, keys 8 j + 2 c
// (+ 1) of tile j, where fragment row g stands for column 16 w + 2 g and row g + 8 for column
// 16 w + 2 g + 1 (any order of the columns serves the math; this one puts a thread's two columns
// side by side, so each key row of the state leaves it as one 8-byte store: half the store
// instructions of columns g and g + 8, docs/cuda-decode.md v33). Per chunk, all on mma.sync
// m16n8k8 (tf32, 3xTF32 where an operand is not exact in tf32; raw 16-bit inputs are):
//  - P^T = S0^T [K; Q]^T (M = columns, N = 8 k + 8 q tokens, K = keys): the state's C
//    fragments are its A fragments when the K index c (c + 4) stands for key 2 c (2 c + 1), so
//    the B fragments of X = [K; Q] hold each token's keys in that order (X fragments below);
//  - U^T = B^T Ti^T, O^T = diag(gamma fq) P_q^T + U^T Mo^T (M = columns, N and K = tokens; the
//    C fragments of one product are the A fragments of the next by the same token order);
//  - S^T = gamma S^T + (U diag(cU))^T K (M = columns, N = keys, K = tokens): the update lands in
//    the state's C fragments.
//
// Pipeline per chunk: wait for the chunk's token copies (an mbarrier per raw token buffer) and
// state copy (cp.async); block barrier; the last warp issues the next chunk's token copies (the
// bulk-copy engine, a row per lane), asks the L2 for the next item's state (last chunk of an
// item whose rows are contiguous: 16 bulk prefetches, so that the DRAM works on it during this
// phase, before the staging buffer is free) and loads its scalars (DYNAMIC, an item's last chunk:
// it first takes the next item); warps 0 .. 3 form a quarter
// of the chunk's Gram X X^T each from the raw tokens, then warp 0 sums them (named barrier) and
// forms the 8 x 8 coefficients (L, Ti, Mo, the row factors) while warps 1 .. form the X and K
// fragments, and (first chunk of an item) every warp loads its state fragments from the staging
// buffer (a block's first chunk with FIRST_LATE: after the fragments, behind its own wait and
// barrier); block barrier; every thread copies the next item's state rows into the staging buffer
// (cp.async 16-byte units, from the L2 when prefetched; in flight during the whole compute);
// P^T, the column products, the update (last chunk: each key tile of the state -> the pool as
// soon as it is updated).
// Decode in place: an item reads its whole slice before it writes; items share no columns.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/mma_tf32.cuh"
#include "cuda/decode/recurrent.cuh"

namespace gdr::cuda::detail {

// A chunk's coefficients in shared memory (floats from ChunkLayout::kCoef; warp 0 writes them,
// every warp reads them).
struct ChunkCoef {
  static constexpr int kTiF = 0;           // [32] float4 B fragments of Ti^T (hi, lo)
  static constexpr int kMoF = kTiF + 128;  // [32] float4 B fragments of Mo^T (hi, lo)
  static constexpr int kCK = kMoF + 128;   // [8] beta_s gamma_s rk_s
  static constexpr int kCQ = kCK + 8;      // [8] gamma_t fq_t (0 if masked)
  static constexpr int kCU = kCQ + 8;      // [8] Dec[C-1][s] rk_s
  static constexpr int kBE = kCU + 8;      // [8] beta_s (0 if masked)
  static constexpr int kGamma = kBE + 8;   // [4] gamma_{C-1}
  static constexpr int kSize = kGamma + 4;
};

// Row stride (elements) of the q and k rows of a raw token buffer: Dk = 128 padded by 8 (16 or 32
// bytes, so rows stay 16-byte aligned for the bulk copies) so that the 8 tokens of a fragment
// read fall in different banks; v rows are padded the same way (ChunkLayout::kRV).
constexpr int kChunkRQ = 128 + 8;

// Shared memory of one block, in floats (every array starts on a 16-byte boundary); the two raw
// token buffers follow at kEndExact (16-bit inputs) or kEnd (f32 inputs, with the lo parts).
template <int W>
struct ChunkLayout {
  static constexpr int kDK = 128;               // keys
  static constexpr int kCB = 16 * W;            // value columns of an item
  static constexpr int kSS = kCB + 4;           // staging row stride: conflict-free fragments
  static constexpr int kSt = 0;                 // [DK][SS] the next item's state, staged
  static constexpr int kXh = kSt + kDK * kSS;   // [DK / 8][32] float4 X fragments, tf32 hi
  static constexpr int kKh = kXh + 16 * kDK;    // [DK / 8][32] float2 K fragments, tf32 hi
  static constexpr int kG = kKh + 8 * kDK;      // [8] a = exp(g)
  static constexpr int kB = kG + 8;             // [8] beta
  static constexpr int kM = kB + 8;             // [8] mask (1 = step)
  static constexpr int kGW = W < 4 ? W : 4;     // warps forming a partial Gram each
  static constexpr int kGram = kM + 8;          // [kGW][16][16] partials of X X^T
  static constexpr int kL = kGram + 256 * kGW;  // [8][8] L (warp 0's scratch)
  static constexpr int kTi = kL + 64;           // [8][8] Ti = (I + L)^-1 (warp 0's scratch)
  static constexpr int kCoef = kTi + 64;        // [ChunkCoef::kSize] the coefficients
  static constexpr int kBar = kCoef + ChunkCoef::kSize;  // [2] u64 mbarriers, token buffers
  static constexpr int kSrc = kBar + 4;       // pointer: the next item's state rows or null;
                                              // + 2: DYNAMIC's next item (unsigned)
  static constexpr int kXl = kSrc + 4;        // X fragments, tf32 lo (f32 inputs only)
  static constexpr int kKl = kXl + 16 * kDK;  // K fragments, tf32 lo (f32 inputs only)
  static constexpr int kEndExact = kXl;
  static constexpr int kEnd = kKl + 8 * kDK;
  // One raw token buffer: q [8][RQ], k [8][RQ], v [8][RV] elements of es bytes.
  static constexpr int kRQ = kChunkRQ;  // q, k row stride (elements)
  static constexpr int kRV = kCB + 8;   // v row stride (elements)
  static constexpr int kV0 = 16 * kRQ;  // first v element
  static constexpr int token_bytes(int es) { return 8 * (2 * kRQ + kRV) * es; }
  static_assert(kG % 4 == 0 && kM % 4 == 0, "a, mask: float4 loads");
  static constexpr int bytes(bool exact, int es) {
    return 4 * (exact ? kEndExact : kEnd) + 2 * token_bytes(es);
  }
};

// Raw 16-bit or f32 elements in shared memory as float: element i, and elements i, i + 1.
__device__ __forceinline__ float raw_at(const char* raw, int i, int dtype) {
  if (dtype == kBF16)
    return __uint_as_float(
        static_cast<std::uint32_t>(*reinterpret_cast<const unsigned short*>(raw + 2 * i)) << 16);
  if (dtype == kF16) return __half2float(*reinterpret_cast<const __half*>(raw + 2 * i));
  return *reinterpret_cast<const float*>(raw + 4 * i);
}
__device__ __forceinline__ float2 raw_pair(const char* raw, int i, int dtype) {
  if (dtype == kF32) return *reinterpret_cast<const float2*>(raw + 4 * i);
  return pair_to_float2(*reinterpret_cast<const std::uint32_t*>(raw + 2 * i), dtype);
}

__device__ __forceinline__ float4 tf32_hi4(float4 x) {
  return make_float4(tf32_hi(x.x), tf32_hi(x.y), tf32_hi(x.z), tf32_hi(x.w));
}
__device__ __forceinline__ float4 sub4(float4 x, float4 y) {
  return make_float4(x.x - y.x, x.y - y.y, x.z - y.z, x.w - y.w);
}

// Chunks of an item (an empty sequence has one, of no tokens), and the tokens of chunk ch.
__device__ __forceinline__ std::int64_t item_chunks(const BlockItem& x) {
  return x.len > 0 ? (x.len + 7) / 8 : 1;
}
__device__ __forceinline__ int chunk_tokens(const BlockItem& x, std::int64_t ch) {
  return static_cast<int>(x.len - 8 * ch < 8 ? x.len - 8 * ch : 8);
}

// The issuing warp: chunk ch of item `it` into the raw token buffer `raw` (q and k rows of Dk
// values, v from the item's first column), completing on `bar` (one arrival, expecting the
// bulk-copy bytes): 16-byte aligned rows (a.vec_tok) by the bulk-copy engine, a row per lane;
// other rows element by element (generic stores, visible after the next block barrier). Not
// `live`: only the arrival. Returns the lane's per-token scalar.
template <int CB>
__device__ __forceinline__ float issue_tokens(const RecurrentArgs& a, const BlockItem& it,
                                              std::int64_t ch, bool live, char* raw,
                                              std::uint64_t* bar, int lane) {
  using Ly = ChunkLayout<CB / 16>;
  constexpr int DK = Ly::kDK, RQ = Ly::kRQ, RV = Ly::kRV, V0 = Ly::kV0;
  if (!live) {
    if (lane == 0) mbar_arrive_expect_tx(bar, 0);
    return 0.f;
  }
  const int col0 = it.split * CB, cnt = chunk_tokens(it, ch);
  const std::int64_t tb = 8 * ch;
  const BlockRows r = block_rows(a, it, col0);
  float x = 0.f;
  load_scalars<false, 1>(a, r, cnt, tb, &x, lane, 32);
  const int es = dtype_bytes(a.in_dtype);
  const unsigned qbytes = DK * es, vbytes = CB * es;
  // Element path: this warp's earlier generic stores into the buffer are ordered before the
  // async proxy. Bulk copies write the buffers only of calls whose rows are aligned, where no
  // generic store into them ever precedes one: no fence there (alone it changed no timing, but
  // without it the FIRST_LATE instantiations spill less; docs/cuda-decode.md v34).
  if (!a.vec_tok) fence_proxy_async();
  if (lane == 0) mbar_arrive_expect_tx(bar, a.vec_tok ? cnt * (2 * qbytes + vbytes) : 0u);
  __syncwarp();
  if (a.vec_tok) {
    if (lane < 3 * cnt) {
      const int kind = lane < cnt ? 0 : (lane < 2 * cnt ? 1 : 2), t = lane - kind * cnt;
      const TokenRows& rows = kind == 0 ? r.q : (kind == 1 ? r.k : r.v);
      char* dst = raw + (kind < 2 ? (kind * 8 + t) * RQ : V0 + t * RV) * es;
      bulk_copy(dst, rows.at(tb + t), kind < 2 ? qbytes : vbytes, bar);
    }
  } else {
    for (int f = lane; f < cnt * (2 * DK + CB); f += 32) {
      const char* src;
      int at;
      if (f < 2 * cnt * DK) {
        const int is_k = f >= cnt * DK, e = f - is_k * cnt * DK, t = e / DK, i = e % DK;
        src = (is_k ? r.k : r.q).at(tb + t) + i * es;
        at = (is_k * 8 + t) * RQ + i;
      } else {
        const int e = f - 2 * cnt * DK, t = e / CB, i = e % CB;
        src = r.v.at(tb + t) + i * es;
        at = V0 + t * RV + i;
      }
      if (es == 4)
        reinterpret_cast<float*>(raw)[at] = __ldg(reinterpret_cast<const float*>(src));
      else
        reinterpret_cast<unsigned short*>(raw)[at] =
            __ldg(reinterpret_cast<const unsigned short*>(src));
    }
  }
  return x;
}

// The element type of the pool: fp32, or the bits of bfloat16 (SB: RecurrentArgs::state_bf16).
template <bool SB>
using StateElem = std::conditional_t<SB, std::uint16_t, float>;

// Row stride of the staging buffer in 16-bit elements for a bf16 state: CB + 8, i.e. CB / 2 + 4
// words, so that rows 2c of a fragment load are 8 c banks apart modulo 32 (CB = 32, 64, 128) and
// its lanes (g, c), each reading the word of columns 2g, 2g + 1, fall on 32 different banks; rows
// stay 16-byte aligned for cp.async.
template <int CB>
constexpr int kStagedBf16Stride = CB + 8;

// An item's state rows S0 [128][CB] (from `src`, row stride a.hin_s2 elements) -> the staging
// buffer by cp.async 16-byte units, every thread of the block, one commit group: fp32 rows at
// stride CB + 4 floats; bf16 rows (SB) as they are, at stride CB + 8 elements (the staging buffer
// reinterpreted; they take less than half of it).
template <int CB, int NTHREADS, bool SB>
__device__ __forceinline__ void copy_state(const RecurrentArgs& a, const StateElem<SB>* src,
                                           float* St) {
  constexpr int DK = 128, EPU = 16 / sizeof(StateElem<SB>);  // elements per 16-byte unit
  constexpr int UPR = CB / EPU, RPI = NTHREADS / UPR, SS = SB ? kStagedBf16Stride<CB> : CB + 4;
  static_assert(NTHREADS % UPR == 0 && DK % RPI == 0);
  const int u = threadIdx.x % UPR, i0 = threadIdx.x / UPR;
  src += i0 * a.hin_s2 + EPU * u;
  StateElem<SB>* dst = reinterpret_cast<StateElem<SB>*>(St) + i0 * SS + EPU * u;
#pragma unroll
  for (int i = 0; i < DK / RPI; ++i) cp_async16(dst + i * RPI * SS, src + i * RPI * a.hin_s2);
}

// The state rows of a live item in the pool (fp32 or bf16 elements).
template <bool SB>
__device__ __forceinline__ const StateElem<SB>* state_rows(const RecurrentArgs& a,
                                                           const BlockItem& it, int cb) {
  return reinterpret_cast<const StateElem<SB>*>(a.h_in) + it.row * a.hin_s0 + it.hv * a.hin_s1 +
         it.split * cb;
}

// Warp p of G: the partial Gram X X^T (16 x 16, X = [k_0..7; q_0..7] raw, zero rows for masked
// or padding tokens) over key tiles [p KT / G, (p + 1) KT / G) on the tensor cores, into Gp:
// lane (g, c) holds X's A fragment (x.x, x.z, x.y, x.w) and X^T's B fragments (x.x, x.y) (k
// columns), (x.z, x.w) (q columns) of x = (k_g[key], k_g[key + 1], q_g[key], q_g[key + 1]),
// key = 8 j + 2 c; two independent accumulations. The raw q rows start at `qraw` and the k rows
// at `kraw`, RS elements apart (rows of padding tokens are read and dropped: all 8 must lie in
// shared memory).
template <int DT, int G, int RS = kChunkRQ>
__device__ __forceinline__ void chunk_gram_part(const char* qraw, const char* kraw, int cnt,
                                                const float* ms, float* Gp, int p, int lane) {
  constexpr int DK = 128, KT = DK / 8, JP = KT / G;
  constexpr bool EXACT = DT != kF32;
  static_assert(KT % G == 0);
  const int lg = lane >> 2, lc = lane & 3;
  const bool live_g = lg < cnt && ms[lg] != 0.f;
  const int row = lg * RS;
  float gk[2][4], gq[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int r = 0; r < 4; ++r) gk[h][r] = gq[h][r] = 0.f;
#pragma unroll
  for (int jj = 0; jj < JP; ++jj) {
    const int key = 8 * (p * JP + jj) + 2 * lc;
    const float2 kk = raw_pair(kraw, row + key, DT);
    const float2 qq = raw_pair(qraw, row + key, DT);
    const float4 x = live_g ? make_float4(kk.x, kk.y, qq.x, qq.y) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 h = EXACT ? x : tf32_hi4(x);
    const float4 ah = make_float4(h.x, h.z, h.y, h.w);
    if constexpr (!EXACT) {
      const float4 l = sub4(x, h);
      const float4 al = make_float4(l.x, l.z, l.y, l.w);
      mma_tf32(gk[jj & 1], al, h.x, h.y);
      mma_tf32(gk[jj & 1], ah, l.x, l.y);
      mma_tf32(gq[jj & 1], al, h.z, h.w);
      mma_tf32(gq[jj & 1], ah, l.z, l.w);
    }
    mma_tf32(gk[jj & 1], ah, h.x, h.y);
    mma_tf32(gq[jj & 1], ah, h.z, h.w);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    gk[0][r] += gk[1][r];
    gq[0][r] += gq[1][r];
  }
  *reinterpret_cast<float2*>(Gp + lg * 16 + 2 * lc) = make_float2(gk[0][0], gk[0][1]);
  *reinterpret_cast<float2*>(Gp + (lg + 8) * 16 + 2 * lc) = make_float2(gk[0][2], gk[0][3]);
  *reinterpret_cast<float2*>(Gp + lg * 16 + 8 + 2 * lc) = make_float2(gq[0][0], gq[0][1]);
  *reinterpret_cast<float2*>(Gp + (lg + 8) * 16 + 8 + 2 * lc) = make_float2(gq[0][2], gq[0][3]);
}

// Warp 0, once the G partial Grams are in Gr [G][16][16] (its own and, after named barrier 1,
// the other warps'): their sum into Gr[0], then per lane (t = g, r = 2c, 2c + 1) the entries
// (t, r) of L and Mo (its B fragment of Mo^T), the row factors, Ti = (I + L)^-1 and its B
// fragments, into `coef` (ChunkCoef).
template <int G>
__device__ __forceinline__ void chunk_coefficients(const RecurrentArgs& a, int cnt, const float* gs,
                                                   const float* bs, const float* ms, float* Gr,
                                                   float* Lc, float* Ti, float* coef, int lane) {
  const int lg = lane >> 2, lc = lane & 3;
  const bool live_g = lg < cnt && ms[lg] != 0.f;
  if constexpr (G > 1) {
    float4* g4 = reinterpret_cast<float4*>(Gr);
    float4 x0 = g4[2 * lane], x1 = g4[2 * lane + 1];
#pragma unroll
    for (int p = 1; p < G; ++p) {
      const float4 y0 = g4[64 * p + 2 * lane], y1 = g4[64 * p + 2 * lane + 1];
      x0 = make_float4(x0.x + y0.x, x0.y + y0.y, x0.z + y0.z, x0.w + y0.w);
      x1 = make_float4(x1.x + y1.x, x1.y + y1.y, x1.z + y1.z, x1.w + y1.w);
    }
    g4[2 * lane] = x0;
    g4[2 * lane + 1] = x1;
  }
  __syncwarp();
  const bool l2 = a.qk_l2norm;
  const int t = lg, r0 = 2 * lc, r1 = r0 + 1;
  // Decays, 1 for a masked or padding token: all 16 values loaded at once (16-byte aligned
  // arrays), then selects (no load behind a per-token branch).
  float av[8], mv[8];
  *reinterpret_cast<float4*>(av) = reinterpret_cast<const float4*>(gs)[0];
  *reinterpret_cast<float4*>(av + 4) = reinterpret_cast<const float4*>(gs)[1];
  *reinterpret_cast<float4*>(mv) = reinterpret_cast<const float4*>(ms)[0];
  *reinterpret_cast<float4*>(mv + 4) = reinterpret_cast<const float4*>(ms)[1];
#pragma unroll
  for (int p = 0; p < 8; ++p) av[p] = p < cnt && mv[p] != 0.f ? av[p] : 1.f;
  const bool live_t = live_g;
  const float be_t = live_t ? bs[t] : 0.f;
  auto rk_of = [&](int i) { return l2 ? 1.f / sqrtf(Gr[i * 17] + a.eps) : 1.f; };
  const float rk_t = rk_of(t), rk0 = rk_of(r0), rk1 = rk_of(r1);
  const float fq_t = a.scale * (l2 ? 1.f / sqrtf(Gr[(8 + t) * 17] + a.eps) : 1.f);
  // Dec[i][r] = a_{r+1} ... a_i (a product over the range; r = -1: gamma_i).
  auto dec = [&](int i, int r) {
    float d = 1.f;
#pragma unroll
    for (int p = 0; p < 8; ++p)
      if (p > r && p <= i) d *= av[p];
    return d;
  };
  const float d0 = dec(t, r0), d1 = dec(t, r1), gamma_t = dec(t, -1);
  const float l0 = r0 < t ? be_t * d0 * Gr[t * 16 + r0] * rk_t * rk0 : 0.f;
  const float l1 = r1 < t ? be_t * d1 * Gr[t * 16 + r1] * rk_t * rk1 : 0.f;
  const float m0 = live_t && r0 <= t ? d0 * Gr[(8 + t) * 16 + r0] * fq_t * rk0 : 0.f;
  const float m1 = live_t && r1 <= t ? d1 * Gr[(8 + t) * 16 + r1] * fq_t * rk1 : 0.f;
  *reinterpret_cast<float2*>(Lc + t * 8 + r0) = make_float2(l0, l1);
  using Cf = ChunkCoef;
  const float mh0 = tf32_hi(m0), mh1 = tf32_hi(m1);
  reinterpret_cast<float4*>(coef + Cf::kMoF)[lane] = make_float4(mh0, mh1, m0 - mh0, m1 - mh1);
  if (lc == 0) {
    coef[Cf::kCK + t] = be_t * gamma_t * rk_t;
    coef[Cf::kCQ + t] = live_t ? gamma_t * fq_t : 0.f;
    coef[Cf::kBE + t] = be_t;
  }
  if (t == 7) {
    coef[Cf::kCU + r0] = dec(7, r0) * rk0;
    coef[Cf::kCU + r1] = dec(7, r1) * rk1;
    if (lc == 0) coef[Cf::kGamma] = gamma_t;
  }
  __syncwarp();
  // Ti = (I + L)^-1 by forward substitution, lane j < 8 its column j.
  if (lane < 8) {
    float tcol[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float x = i == lane ? 1.f : 0.f;
#pragma unroll
      for (int p = 0; p < i; ++p) x -= Lc[i * 8 + p] * tcol[p];
      tcol[i] = i >= lane ? x : 0.f;
      Ti[i * 8 + lane] = tcol[i];
    }
  }
  __syncwarp();
  // B fragments of Ti^T (K = token r in the order 2 c, 2 c + 1; N = token g).
  const float2 ti = *reinterpret_cast<const float2*>(Ti + lg * 8 + 2 * lc);
  const float th0 = tf32_hi(ti.x), th1 = tf32_hi(ti.y);
  reinterpret_cast<float4*>(coef + Cf::kTiF)[lane] = make_float4(th0, th1, ti.x - th0, ti.y - th1);
}

// U^T = B^T Ti^T for one warp's 16 columns (bb: B^T's A fragment; tf: Ti^T's B fragment, hi and
// lo), in 3xTF32.
__device__ __forceinline__ void chunk_u(float4 bb, float4 tf, float (&u)[4]) {
  float ue[4] = {0.f, 0.f, 0.f, 0.f};
  const float4 bh = tf32_hi4(bb), bl = sub4(bb, bh);
  mma_tf32(u, bh, tf.x, tf.y);
  mma_tf32(ue, bl, tf.x, tf.y);
  mma_tf32(ue, bh, tf.z, tf.w);
#pragma unroll
  for (int r = 0; r < 4; ++r) u[r] += ue[r];
}

// One key tile of P^T = S0^T [K; Q]^T in 3xTF32 with the state's registers as the A fragment
// (s: C order, recurrent_chunk_kernel's) and K's and Q's B fragments (k0, k1; q0, q1: hi): the
// main and the correction products into their own accumulators; XLO: K and Q are not exact in
// tf32 and kl0, kl1, ql0, ql1 are their lo parts.
template <bool XLO = false>
__device__ __forceinline__ void chunk_pt_tile(const float (&s)[4], float k0, float k1, float q0,
                                              float q1, float (&pk)[4], float (&pke)[4],
                                              float (&pq)[4], float (&pqe)[4], float kl0 = 0.f,
                                              float kl1 = 0.f, float ql0 = 0.f, float ql1 = 0.f) {
  const float4 xa = make_float4(s[0], s[2], s[1], s[3]);
  const float4 ah = tf32_hi4(xa), al = sub4(xa, ah);
  mma_tf32(pk, ah, k0, k1);
  mma_tf32(pke, al, k0, k1);
  mma_tf32(pq, ah, q0, q1);
  mma_tf32(pqe, al, q0, q1);
  if constexpr (XLO) {
    mma_tf32(pke, ah, kl0, kl1);
    mma_tf32(pqe, ah, ql0, ql1);
  }
}

// Two key tiles (j, j + 1: 16 keys) of P^T = S0^T [K; Q]^T with bf16 K and Q (exact) in 3xBF16:
// the state's registers of the two tiles (C order: row g, slots 2c, 2c + 1 of each tile) are, as
// bf16 pairs, the A fragment of one m16n8k16 product (tile j's slots as k = 2c, 2c + 1, tile j +
// 1's as k = 2c + 8, 2c + 9), split exactly into three parts (bf16_split3); kb, qb: K's and Q's B
// fragments at those keys (bf16 pairs). Six products where chunk_pt_tile takes eight for the two
// tiles; the main products into pk, pq, the middle and low parts into pke, pqe.
__device__ __forceinline__ void chunk_pt_pair_bf16(const float (&s0)[4], const float (&s1)[4],
                                                   uint2 kb, uint2 qb, float (&pk)[4],
                                                   float (&pke)[4], float (&pq)[4],
                                                   float (&pqe)[4]) {
  uint4 ah, am, al;
  bf16_split3(s0[0], s0[1], ah.x, am.x, al.x);
  bf16_split3(s0[2], s0[3], ah.y, am.y, al.y);
  bf16_split3(s1[0], s1[1], ah.z, am.z, al.z);
  bf16_split3(s1[2], s1[3], ah.w, am.w, al.w);
  mma_bf16(pk, ah, kb.x, kb.y);
  mma_bf16(pke, am, kb.x, kb.y);
  mma_bf16(pke, al, kb.x, kb.y);
  mma_bf16(pq, ah, qb.x, qb.y);
  mma_bf16(pqe, am, qb.x, qb.y);
  mma_bf16(pqe, al, qb.x, qb.y);
}

// One key tile of the update S^T = gamma S^T + (U diag(cU))^T K in 3xTF32: s (C order) becomes
// gl s + uh k + (ul k [+ uh kl]), the correction summed apart (uh, ul: the A fragment of
// (U diag(cU))^T, hi and lo; k0, k1: K's B fragment, hi; KLO: K is not exact in tf32 and kl0, kl1
// are its lo part).
template <bool KLO = false>
__device__ __forceinline__ void chunk_update_tile(float (&s)[4], float gl, float4 uh, float4 ul,
                                                  float k0, float k1, float kl0 = 0.f,
                                                  float kl1 = 0.f) {
  float e[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 4; ++r) s[r] *= gl;
  mma_tf32(s, uh, k0, k1);
  mma_tf32(e, ul, k0, k1);
  if constexpr (KLO) mma_tf32(e, uh, kl0, kl1);
#pragma unroll
  for (int r = 0; r < 4; ++r) s[r] += e[r];
}

// O^T = o + U^T Mo^T (o: diag(cQ) P_q^T in C order; mf: Mo^T's B fragment, hi and lo), stored for
// the tokens s0 and s0 + 1 below cnt at columns c0 and c0 + 1 of o from element orow.
template <int DT>
__device__ __forceinline__ void chunk_store_o(const RecurrentArgs& a, float (&o)[4],
                                              const float (&u)[4], float4 mf, std::int64_t orow,
                                              int cnt, int s0, int c0) {
  float oe[4] = {0.f, 0.f, 0.f, 0.f};
  const float4 ua = make_float4(u[0], u[2], u[1], u[3]);
  const float4 uh = tf32_hi4(ua), ul = sub4(ua, uh);
  mma_tf32(o, uh, mf.x, mf.y);
  mma_tf32(oe, ul, mf.x, mf.y);
  mma_tf32(oe, uh, mf.z, mf.w);
  const int s1 = s0 + 1, c1 = c0 + 1;
  if (s0 < cnt) {
    store_from_float(a.o, orow + s0 * a.o_st + c0, DT, o[0] + oe[0]);
    store_from_float(a.o, orow + s0 * a.o_st + c1, DT, o[2] + oe[2]);
  }
  if (s1 < cnt) {
    store_from_float(a.o, orow + s1 * a.o_st + c0, DT, o[1] + oe[1]);
    store_from_float(a.o, orow + s1 * a.o_st + c1, DT, o[3] + oe[3]);
  }
}

// W warps, items of 16 W value columns; Dv % (16 W) == 0 (host). DT: the token dtype (16-bit
// inputs are exact in tf32: no lo parts of X and K). FIRST_LATE (grids of few items per block,
// tuning.h recurrent_chunk_first_late): the first chunk's tokens are copied before the first
// item's state, and that item waits for its state after its coefficients and fragments (one more
// barrier, first chunk only), so that the phase that needs only the tokens runs while every block
// of the wave waits for its first state; the steady state's code is the same, but register
// allocation differs (0-28 bytes of spills either way by W and dtype; measured ~1 % slower at 31
// one-chunk items per block, docs/cuda-decode.md v34).
// DYNAMIC (more than 6 one-chunk items per block, 8 with a bf16 pool, tuning.h
// recurrent_chunk_dynamic): after a block's first item (blockIdx.x) the issuing warp takes each
// next item from a per-call counter (a.item_counter, a pair zero at the launch that the launch's
// last block leaves zero: release_item_counter) at the first barrier of the current item's last
// chunk, so that blocks on faster SMs take more items (with a static round-robin the blocks'
// periods differ by up to ~10 % by SM and the last ones end ~6 us after the median;
// docs/cuda-decode.md v34).
template <int W, int DT, bool FIRST_LATE, bool DYNAMIC = false, bool SB = false>
__global__ void __launch_bounds__(W * 32, 16 / W)  // 128 registers
    recurrent_chunk_kernel(const RecurrentArgs a) {
  using Ly = ChunkLayout<W>;
  using Cf = ChunkCoef;
  constexpr int DK = Ly::kDK, CB = Ly::kCB, SS = Ly::kSS, RQ = Ly::kRQ, NTHREADS = W * 32;
  constexpr int KT = DK / 8;  // key tiles of 8
  constexpr bool EXACT = DT != kF32;
  constexpr int ES = EXACT ? 2 : 4;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  float* St = sm + Ly::kSt;
  float4* Xh = reinterpret_cast<float4*>(sm + Ly::kXh);
  float4* Xl = reinterpret_cast<float4*>(sm + Ly::kXl);
  float2* Kh = reinterpret_cast<float2*>(sm + Ly::kKh);
  float2* Kl = reinterpret_cast<float2*>(sm + Ly::kKl);
  float* gs = sm + Ly::kG;
  float* bs = sm + Ly::kB;
  float* ms = sm + Ly::kM;
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(sm + Ly::kBar);
  const StateElem<SB>** next_src = reinterpret_cast<const StateElem<SB>**>(sm + Ly::kSrc);
  float* coef = sm + Ly::kCoef;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int lg = lane >> 2, lc = lane & 3;  // mma fragment row group and column
  char* tok0 = reinterpret_cast<char*>(sm + (EXACT ? Ly::kEndExact : Ly::kEnd));
  constexpr int tok_bytes = Ly::token_bytes(ES);
  // Items and their indices: 32 bits with dynamic items (fewer than 2^31 items, host; fewer
  // spills there), 64 with static ones.
  using Index = std::conditional_t<DYNAMIC, unsigned, std::int64_t>;
  const Index items = static_cast<Index>(a.N * a.Hv * static_cast<std::int64_t>(a.splits));
  auto live_of = [&](const BlockItem& x) { return state_row_live(a, x.row); };
  wait_for_prior_grids();

  if (tid == 0) {
    mbar_init(&bars[0], 1);
    mbar_init(&bars[1], 1);
    mbar_init_fence();
  }
  __syncthreads();

  // The current chunk: chunk ch of item `item`, in token buffer `buf`; bit b of `parity` is the
  // parity of the next phase of bars[b]. The last warp issues the copies of the next chunk's
  // tokens and loads its scalars; every thread copies the next item's state rows.
  constexpr int ISSUER = W - 1;
  Index item = blockIdx.x, ch = 0;
  BlockItem it = block_item_at(a, static_cast<unsigned>(item));
  // DYNAMIC: the next item, from the issuing warp to the others (after the second barrier), in
  // the slot after the next-state pointer.
  unsigned* next_shared = reinterpret_cast<unsigned*>(sm + Ly::kSrc + 2);
  int buf = 0;
  unsigned parity = 0;
  float xs = 0.f;  // the issuing warp's lane scalar of the chunk in flight
  if (warp == ISSUER) xs = issue_tokens<CB>(a, it, 0, live_of(it), tok0, &bars[0], lane);
  // The token copies go out before the state's. (Every warp waits at named barrier 2, the issuing
  // one too: with bar.arrive there, and at named barrier 1 below, compute-sanitizer racecheck
  // reports WAR hazards across the next block barriers from the second item of a block on; with
  // bar.sync at both it reports none, at the same speed: docs/cuda-decode.md v35.)
  if constexpr (FIRST_LATE) named_barrier_sync(2, NTHREADS);
  if (live_of(it) && a.h_in) copy_state<CB, NTHREADS, SB>(a, state_rows<SB>(a, it, CB), St);
  cp_async_commit();
  bool first = FIRST_LATE;  // the first chunk, whose state wait comes late

  float s[KT][4];  // S^T fragments (see the header)
  for (;;) {
    const int col0 = it.split * CB;
    const bool live = live_of(it);
    const std::int64_t nch = item_chunks(it), tb = 8 * ch;
    const int cnt = chunk_tokens(it, ch);
    const char* raw = tok0 + buf * tok_bytes;
    Index next_item = item, next_ch = ch + 1;
    // DYNAMIC: the next item is not known yet (the issuing warp takes it after the first barrier).
    if (next_ch == nch) next_item = DYNAMIC ? items : next_item + gridDim.x, next_ch = 0;
    bool more = next_item < items;
    mbar_wait(&bars[buf], (parity >> buf) & 1u);
    parity ^= 1u << buf;
    if (!first) cp_async_wait_all();
    if (warp == ISSUER && live) warp_scalar_store(a, cnt, it.hv, xs, lane, gs, bs, ms);
    __syncthreads();  // the chunk's copies and scalars are in; the previous chunk is done (its
                      // token buffer and coefficients are free)
    // The last warp: the next chunk's tokens and scalars; the next item's state rows for every
    // thread (copied after the next barrier).
    if (DYNAMIC && warp == ISSUER && next_ch == 0) {
      unsigned taken = 0;
      if (lane == 0) {
        taken = gridDim.x + atomicAdd(a.item_counter, 1u);
        *next_shared = taken;  // the other warps read it after the second barrier
      }
      next_item = static_cast<Index>(__shfl_sync(0xffffffffu, taken, 0));
      more = next_item < items;
    }
    if (warp == ISSUER && more) {
      const BlockItem nit = next_ch == 0 ? block_item_at(a, static_cast<unsigned>(next_item)) : it;
      const bool next_live = live_of(nit);
      const StateElem<SB>* next_rows =
          next_ch == 0 && next_live && a.h_in ? state_rows<SB>(a, nit, CB) : nullptr;
      if (lane == 0) *next_src = next_rows;
      // The next item's state -> L2 (its copy into the staging buffer starts a phase later):
      // only an item whose rows are contiguous (Dv = CB, no row padding), as 16 bulk prefetches
      // of a 16th each (lanes 0 .. 15). Measured on the H200 (docs/cuda-decode.md v33, T = 8,
      // B = 256, us, by number of pieces): 1: 311, 4: 311, 16: 306-309, 32: 305-307, 64: 313,
      // 128: 345; a row per prefetch (rows not contiguous, 64-column items) was slower than none.
      constexpr int kParts = 16;
      if (next_rows && a.hin_s2 == CB && lane < kParts)
        prefetch_l2(next_rows + lane * (DK * CB / kParts),
                    DK * CB * sizeof(StateElem<SB>) / kParts);
      xs = issue_tokens<CB>(a, nit, next_ch, next_live, tok0 + (buf ^ 1) * tok_bytes,
                            &bars[buf ^ 1], lane);
    }
    // Warps 0 .. GW - 1: a partial Gram each (a quarter of the keys), then named barrier 1; warp 0
    // forms the chunk's coefficients from them while the others go on to the fragments.
    constexpr int GW = Ly::kGW;
    if (live && warp < GW) {
      chunk_gram_part<DT, GW>(raw, raw + 8 * RQ * ES, cnt, ms, sm + Ly::kGram + 256 * warp, warp,
                              lane);
      if constexpr (GW > 1) named_barrier_sync(1, 32 * GW);
      if (warp == 0)
        chunk_coefficients<GW>(a, cnt, gs, bs, ms, sm + Ly::kGram, sm + Ly::kL, sm + Ly::kTi, coef,
                               lane);
    }
    // The item's state: staging buffer -> registers. Keys 8 j + 2c (+ 1), columns 16 w + 2g (+ 1).
    // (fp32: scalar loads, the 8-byte pair would need register pairs, which spilled; bf16: one
    // word holds the pair.)
    auto state_to_registers = [&] {
      if constexpr (SB) {                              // the decode pool: h_in is never null
        constexpr int WS = kStagedBf16Stride<CB> / 2;  // words per staged row
        const std::uint32_t* sp =
            reinterpret_cast<const std::uint32_t*>(St) + 2 * lc * WS + 8 * warp + lg;
#pragma unroll
        for (int j = 0; j < KT; ++j) {
          const float2 r0 = pair_to_float2(sp[8 * j * WS], kBF16);
          const float2 r1 = pair_to_float2(sp[(8 * j + 1) * WS], kBF16);
          s[j][0] = r0.x, s[j][2] = r0.y, s[j][1] = r1.x, s[j][3] = r1.y;
        }
      } else {
        const float* sp = St + (2 * lc) * SS + 16 * warp + 2 * lg;
#pragma unroll
        for (int j = 0; j < KT; ++j) {
          s[j][0] = a.h_in ? sp[8 * j * SS] : 0.f;
          s[j][1] = a.h_in ? sp[(8 * j + 1) * SS] : 0.f;
          s[j][2] = a.h_in ? sp[8 * j * SS + 1] : 0.f;
          s[j][3] = a.h_in ? sp[(8 * j + 1) * SS + 1] : 0.f;
        }
      }
    };
    if (live) {
      if (ch == 0 && !first) state_to_registers();
      // X fragments: float4 f = (key tile j, lane) = (k_g[key], k_g[key + 1], q_g[key],
      // q_g[key + 1]) with g = lane / 4, key = 8 j + 2 (lane % 4); zero rows for masked or
      // padding tokens. K fragments: float2 f = (k_2c[8 j + g], k_2c+1[8 j + g]), c = lane % 4.
      // Warps 1 .. FWARPS take fragment f = tid - 32 + i FW (W = 8: not the issuing warp, which has
      // the token copies; a fixed trip count: no division by the warps kept across the loop).
      constexpr int FWARPS = W >= 8 ? W - 2 : W - 1;  // W = 8: not the issuing warp either
      constexpr int FW = 32 * FWARPS, FITER = (KT * 32 + FW - 1) / FW;
#pragma unroll 4
      for (int i = 0; i < FITER; ++i) {
        const int f = tid - 32 + i * FW;
        if (warp == 0 || warp > FWARPS || f >= KT * 32) break;
        const int t = (f & 31) >> 2, c = f & 3, key = 8 * (f >> 5) + 2 * c;
        const float2 kk = raw_pair(raw, (8 + t) * RQ + key, DT);
        const float2 qq = raw_pair(raw, t * RQ + key, DT);
        const bool live_t = t < cnt && ms[t] != 0.f;
        const float4 x =
            live_t ? make_float4(kk.x, kk.y, qq.x, qq.y) : make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 h = EXACT ? x : tf32_hi4(x);
        Xh[f] = h;
        if constexpr (!EXACT) Xl[f] = sub4(x, h);
        const int key2 = 8 * (f >> 5) + t, s0 = 2 * c, s1 = s0 + 1;
        const float y0 = raw_at(raw, (8 + s0) * RQ + key2, DT);
        const float y1 = raw_at(raw, (8 + s1) * RQ + key2, DT);
        const float2 y =
            make_float2(s0 < cnt && ms[s0] != 0.f ? y0 : 0.f, s1 < cnt && ms[s1] != 0.f ? y1 : 0.f);
        const float2 yh = EXACT ? y : make_float2(tf32_hi(y.x), tf32_hi(y.y));
        Kh[f] = yh;
        if constexpr (!EXACT) Kl[f] = make_float2(y.x - yh.x, y.y - yh.y);
      }
    }
    if (FIRST_LATE && first) {  // the first item's state, after its coefficients and fragments
      cp_async_wait_all();
      __syncthreads();
      if (live) state_to_registers();
      first = false;
    }
    __syncthreads();  // state staging drained; fragments, coefficients, next state rows visible
    if (DYNAMIC && next_ch == 0) {
      next_item = *next_shared;
      more = next_item < items;
    }
    // The next item's state, in flight during this chunk's compute.
    if (more) {
      if (const StateElem<SB>* src = *next_src) copy_state<CB, NTHREADS, SB>(a, src, St);
    }
    cp_async_commit();

    // o of the chunk's first token, the item's first column (element index).
    auto o_row = [&] { return it.b * a.o_sb + (it.t0 + tb) * a.o_st + it.hv * a.o_sh + col0; };
    if (!live) {  // a skipped pool row: o = 0 (negative index) or NaN (index >= P)
      const float fill = it.row < 0 ? 0.f : __int_as_float(0x7fc00000);
      const std::int64_t orow = o_row();
      for (int e = tid; e < cnt * CB; e += NTHREADS)
        store_from_float(a.o, orow + (e / CB) * a.o_st + e % CB, DT, fill);
    } else {
      // P^T = S0^T [K; Q]^T: pk (k tokens), pq (q tokens), main + correction accumulators.
      float pk[4] = {0.f, 0.f, 0.f, 0.f}, pke[4] = {0.f, 0.f, 0.f, 0.f};
      float pq[4] = {0.f, 0.f, 0.f, 0.f}, pqe[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < KT; ++j) {
        const float4 h = Xh[j * 32 + lane];
        if constexpr (EXACT) {
          chunk_pt_tile(s[j], h.x, h.y, h.z, h.w, pk, pke, pq, pqe);
        } else {
          const float4 l = Xl[j * 32 + lane];
          chunk_pt_tile<true>(s[j], h.x, h.y, h.z, h.w, pk, pke, pq, pqe, l.x, l.y, l.z, l.w);
        }
      }
      // Column phase, C fragment order: (row g, token 2c), (g, 2c + 1), (g + 8, 2c),
      // (g + 8, 2c + 1); fragment rows g and g + 8 are the item's columns 16 w + 2g and + 1.
      const int s0 = 2 * lc, s1 = s0 + 1, c0 = 16 * warp + 2 * lg, c1 = c0 + 1;
      const float be0 = coef[Cf::kBE + s0], be1 = coef[Cf::kBE + s1];
      const float ck0 = coef[Cf::kCK + s0], ck1 = coef[Cf::kCK + s1];
      const char* vraw = raw + Ly::kV0 * ES;
      auto bval = [&](int tok, int col, float be, float ck, float p) {
        return be != 0.f ? be * raw_at(vraw, tok * Ly::kRV + col, DT) - ck * p : 0.f;
      };
      const float4 bb = make_float4(bval(s0, c0, be0, ck0, pk[0] + pke[0]),
                                    bval(s0, c1, be0, ck0, pk[2] + pke[2]),
                                    bval(s1, c0, be1, ck1, pk[1] + pke[1]),
                                    bval(s1, c1, be1, ck1, pk[3] + pke[3]));  // A order
      // U^T = B^T Ti^T.
      float u[4] = {0.f, 0.f, 0.f, 0.f};
      chunk_u(bb, reinterpret_cast<const float4*>(coef + Cf::kTiF)[lane], u);
      // O^T = diag(cQ) P_q^T + U^T Mo^T, stored for the chunk's tokens.
      {
        const float cq0 = coef[Cf::kCQ + s0], cq1 = coef[Cf::kCQ + s1];
        float o[4] = {cq0 * (pq[0] + pqe[0]), cq1 * (pq[1] + pqe[1]), cq0 * (pq[2] + pqe[2]),
                      cq1 * (pq[3] + pqe[3])};
        chunk_store_o<DT>(a, o, u, reinterpret_cast<const float4*>(coef + Cf::kMoF)[lane], o_row(),
                          cnt, s0, c0);
      }
      // S^T = gamma S^T + (U diag(cU))^T K; the item's last chunk stores each key tile of the
      // state to the pool as soon as it is updated (keys 8 j + 2c and + 1, each a pair of
      // columns 16 w + 2g, + 1): the stores spread over the update's products instead of
      // queueing behind them.
      {
        const float cu0 = coef[Cf::kCU + s0], cu1 = coef[Cf::kCU + s1], gl = coef[Cf::kGamma];
        const float4 ua = make_float4(u[0] * cu0, u[2] * cu0, u[1] * cu1, u[3] * cu1);
        const float4 uh = tf32_hi4(ua), ul = sub4(ua, uh);
        const bool store = ch + 1 == nch && a.h_out;
        // Rows 8 j + 2c and 8 j + 2c + 1 of the key tile j, advanced by 8 rows per tile (a pair
        // of fp32 or bf16 elements per row).
        StateElem<SB>* out0 = store
                                  ? reinterpret_cast<StateElem<SB>*>(a.h_out) + it.row * a.hout_s0 +
                                        it.hv * a.hout_s1 + col0 + c0 + s0 * a.hout_s2
                                  : nullptr;
        StateElem<SB>* out1 = store ? out0 + a.hout_s2 : nullptr;
        const std::int64_t r8 = 8 * a.hout_s2;
#pragma unroll
        for (int j = 0; j < KT; ++j) {
          const float2 kh = Kh[j * 32 + lane];
          if constexpr (EXACT) {
            chunk_update_tile(s[j], gl, uh, ul, kh.x, kh.y);
          } else {
            const float2 kl = Kl[j * 32 + lane];
            chunk_update_tile<true>(s[j], gl, uh, ul, kh.x, kh.y, kl.x, kl.y);
          }
          if (store) {
            if constexpr (SB) {  // rounded to nearest even, once per item
              const __nv_bfloat162 w0 = __floats2bfloat162_rn(s[j][0], s[j][2]);
              const __nv_bfloat162 w1 = __floats2bfloat162_rn(s[j][1], s[j][3]);
              __stcs(reinterpret_cast<unsigned*>(out0), *reinterpret_cast<const unsigned*>(&w0));
              __stcs(reinterpret_cast<unsigned*>(out1), *reinterpret_cast<const unsigned*>(&w1));
            } else {
              __stcs(reinterpret_cast<float2*>(out0), make_float2(s[j][0], s[j][2]));
              __stcs(reinterpret_cast<float2*>(out1), make_float2(s[j][1], s[j][3]));
            }
            out0 += r8;
            out1 += r8;
          }
        }
      }
    }
    if (!more) break;
    if (next_ch == 0) it = block_item_at(a, static_cast<unsigned>(next_item));
    item = next_item, ch = next_ch, buf ^= 1;
  }
  // After the block's last take (the issuing warp's lane 0 took it).
  if (DYNAMIC && threadIdx.x == ISSUER * 32) release_item_counter(a);
}

}  // namespace gdr::cuda::detail
