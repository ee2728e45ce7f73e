// The chunk form of the token loop on CUDA cores for the staged kernel's narrow k-first tile
// (recurrent.cuh, recurrent_kernel with WY = true): up to 8 tokens per pass, the state in
// registers, with a latency chain that does not grow with the tokens' reductions.
//
// Math (SPEC Section 2, scalar gate), tokens t = 0 .. n-1 of one pass, state S0 on entry,
// k^_t = rk_t k_t and q~_t = fq_t q_t (rk, fq: the L2 norms and the scale, 1 and scale without
// the in-kernel norm), decays d_t = exp(g_t), G_t = d_0 ... d_t:
//   S_t   = G_t S0 + sum_{s <= t} (G_t / G_s) k^_s u_s^T
//   u_t   = beta_t (v_t - S'_t^T k^_t),   S'_t = d_t S_{t-1}
//         = beta_t v_t - al_t (S0^T k_t) - sum_{s < t} Mc[t][s] u_s
//   o_t   = S_t^T q~_t = gq_t (S0^T q_t) + sum_{s <= t} Nc[t][s] u_s
//   S_n   = G_{n-1} S0 + sum_s k_s (w_s u_s)^T
// with al_t = beta_t G_t rk_t, gq_t = G_t fq_t, Mc[t][s] = beta_t (G_t / G_s) rk_s rk_t k_s.k_t,
// Nc[t][s] = (G_t / G_s) rk_s fq_t k_s.q_t, w_s = (G_{n-1} / G_s) rk_s. A masked token has
// d = 1, u = 0, o = 0 (every coefficient of it 0) and its inputs are never read into the state.
//
// The coefficients depend on the inputs only: the block forms them (wy_dots, wy_coefficients)
// while its state loads are in flight. A lane (M rows r0 .. r0 + M - 1 of 4 columns, the narrow
// tile: 16 row groups, 2 column groups) then forms its partial S0^T k_t and S0^T q_t of all n
// tokens (independent FMAs), reduces them over the row groups in one transposing reduction each
// (30 shuffles for 32 values), gathers S0^T k_t of its 2 columns for every t (14 shuffles) and
// solves the n x n triangular recurrence for u of those columns on its own; o_t of one token
// per lane; then the rank-n update of its 32 state floats. Against the token loop (per token two
// butterflies, a dependent u and the update), a pass of 8 tokens issues about half the
// instructions with most of them independent (bench/NOTES-gpu.md, v42).
#pragma once

#include "cuda/warp_exchange.cuh"

namespace gdr::cuda::detail {

// Tokens per pass.
constexpr int kWyTokens = 8;

// Shared floats of one pass's coefficients (offsets; every float4-read array at a multiple of 4):
// the dot products k_s.k_t (s <= t; s = t: ||k_t||^2), k_s.q_t (s <= t), ||q_t||^2, then the
// coefficients of the header comment (Mc, Nc row-major [t][s], zero outside their triangles and
// for masked or absent tokens), the per-token al, gq, beta (0 when masked), w, and G_{n-1}.
struct WyShared {
  static constexpr int kKK = 0, kKQ = 64, kQQ = 128, kMc = 136, kNc = 200, kAl = 264, kGq = 272,
                       kBt = 280, kW = 288, kGn = 296, kFloats = 300;
};

// Shared floats for a staged chunk of tc tokens (one block of WyShared per pass).
inline constexpr int wy_shared_floats(int tc) {
  return (tc + kWyTokens - 1) / kWyTokens * WyShared::kFloats;
}

// Block-cooperative: the dot products of every pass of a staged chunk of cnt tokens (qs, ks:
// [cnt][DK] raw floats in shared memory), one thread per (pass, t, s <= t). A thread walks the
// Dk values from its own offset s (16-byte units), so the 8 lanes of a shared-memory phase read
// 8 different bank groups.
template <int DK, bool L2>
__device__ __forceinline__ void wy_dots(const float* qs, const float* ks, int cnt, float* wy) {
  constexpr int U = DK / 4;  // 16-byte units per row
  const int work = (cnt + kWyTokens - 1) / kWyTokens * 64;
  for (int p = threadIdx.x; p < work; p += blockDim.x) {
    const int pass = p >> 6, t = (p >> 3) & 7, s = p & 7;
    const int tt = pass * kWyTokens + t, ts = pass * kWyTokens + s;
    if (s > t || tt >= cnt) continue;
    const float4* k_s = reinterpret_cast<const float4*>(ks + ts * DK);
    const float4* k_t = reinterpret_cast<const float4*>(ks + tt * DK);
    const float4* q_t = reinterpret_cast<const float4*>(qs + tt * DK);
    float kk = 0.f, kq = 0.f, qq = 0.f;
#pragma unroll 2
    for (int m = 0; m < U; ++m) {
      const int r = (m + s) & (U - 1);
      const float4 a = k_s[r], b = k_t[r], q = q_t[r];
      kk += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      kq += a.x * q.x + a.y * q.y + a.z * q.z + a.w * q.w;
      if (L2) qq += q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
    }
    float* d = wy + pass * WyShared::kFloats;
    d[WyShared::kKK + 8 * t + s] = kk;
    d[WyShared::kKQ + 8 * t + s] = kq;
    if (L2 && s == t) d[WyShared::kQQ + t] = qq;
  }
}

// Block-cooperative, after wy_dots and a barrier: the coefficients of every pass (gs, bs, ms: the
// staged decays exp(g), betas and masks of the chunk's tokens). The products of decays over
// token ranges are formed directly (no ratio of prefix products, which underflow for strong
// decays), as fixed 8-term products with the absent factors 1 (compact code: the block runs it
// once).
template <bool L2>
__device__ __forceinline__ void wy_coefficients(const float* gs, const float* bs, const float* ms,
                                                int cnt, float scale, float eps, float* wy) {
  const int work = (cnt + kWyTokens - 1) / kWyTokens * 64;
  for (int p = threadIdx.x; p < work; p += blockDim.x) {
    const int pass = p >> 6, t = (p >> 3) & 7, s = p & 7, t0 = pass * kWyTokens;
    const int n = cnt - t0 < kWyTokens ? cnt - t0 : kWyTokens;
    float* d = wy + pass * WyShared::kFloats;
    const bool lt = t < n && ms[t0 + t] != 0.f, ls = s < n && ms[t0 + s] != 0.f;
    float ratio = 1.f, g = 1.f, rest = 1.f;  // G_t / G_s, G_t, G_{n-1} / G_t
#pragma unroll
    for (int j = 0; j < kWyTokens; ++j) {
      const float dj = j < n && ms[t0 + j] != 0.f ? gs[t0 + j] : 1.f;
      ratio *= j > s && j <= t ? dj : 1.f;
      g *= j <= t ? dj : 1.f;
      rest *= j > t ? dj : 1.f;
    }
    const float rk_t = L2 ? rsqrtf(d[WyShared::kKK + 9 * t] + eps) : 1.f;
    const float rk_s = L2 ? rsqrtf(d[WyShared::kKK + 9 * s] + eps) : 1.f;
    const float fq_t = scale * (L2 ? rsqrtf(d[WyShared::kQQ + t] + eps) : 1.f);
    const bool pair = lt && ls && s <= t;
    const float beta = lt ? bs[t0 + t] : 0.f;
    d[WyShared::kMc + 8 * t + s] =
        pair && s < t ? beta * ratio * rk_s * rk_t * d[WyShared::kKK + 8 * t + s] : 0.f;
    d[WyShared::kNc + 8 * t + s] = pair ? ratio * rk_s * fq_t * d[WyShared::kKQ + 8 * t + s] : 0.f;
    if (s == 0) {  // the per-token factors of token t
      d[WyShared::kAl + t] = lt ? beta * g * rk_t : 0.f;
      d[WyShared::kGq + t] = lt ? g * fq_t : 0.f;
      d[WyShared::kBt + t] = beta;
      d[WyShared::kW + t] = lt ? rest * rk_t : 0.f;
      if (t == 0) d[WyShared::kGn] = g * rest;
    }
  }
}

// Per-warp shared floats of a pass: the reduced S0^T k_t and S0^T q_t of the warp's 8 columns
// ([8 tokens][16]: k columns 0 .. 7, then q), and w_t u_t ([8 tokens][8 columns]).
constexpr int kWyWarpFloats = kWyTokens * 16 + kWyTokens * 8;

// One pass of n <= 8 tokens on the lane's registers s (the narrow k-first tile: M rows from
// r0 = (lane >> 1) M, columns 4 (lane & 1) .. + 3 of the warp's 8). qs, ks: the pass's first q
// and k rows ([8][DK] in shared memory); vs: the pass's first v row ([8][cb]) at the warp's first
// column; d: the pass's coefficients; wbuf: the warp's kWyWarpFloats; live: bit t = token t
// steps. store_o(t, c, o) stores o_t of the warp's column c (0 for a masked token).
// Every loop over tokens is a loop (the straight-line form, 8 tokens unrolled, ran from the
// instruction cache: bench/NOTES-gpu.md, v42); values cross lanes through wbuf.
template <int DK, int M, typename StoreO>
__device__ __forceinline__ void kfirst_wy_pass(float4 (&s)[M], const float* qs, const float* ks,
                                               const float* vs, int cb, const float* d, float* wbuf,
                                               unsigned live, int n, int lane, StoreO store_o) {
  const int r0 = (lane >> 1) * M, cg = lane & 1;
  float* red = wbuf;                  // [8][16]
  float* uw = wbuf + kWyTokens * 16;  // [8][8]
  // 1. Per live token: the lane's partial S0^T k_t and S0^T q_t (4 columns each, over its M
  // rows), reduced over the 16 row groups (lane bits 1 .. 4) by a transposing reduction of the 8
  // values: value e = (lane >> 2) & 7 of the column group (k columns 0 .. 3, then q), stored by
  // the lanes with bit 1 clear.
  const int e = (lane >> 2) & 7;
  float* red_lane = red + (e < 4 ? 0 : 8) + 4 * cg + (e & 3);
#pragma unroll 2
  for (unsigned m = live; m; m &= m - 1) {
    const int t = __ffs(m) - 1;
    const float4* k4 = reinterpret_cast<const float4*>(ks + t * DK + r0);
    const float4* q4 = reinterpret_cast<const float4*>(qs + t * DK + r0);
    float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int m4 = 0; m4 < M / 4; ++m4) {
      const float4 kv = k4[m4], qv = q4[m4];
      const float kk[4] = {kv.x, kv.y, kv.z, kv.w}, qq[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float4 sv = s[4 * m4 + r];
        x[0] = fmaf(sv.x, kk[r], x[0]);
        x[1] = fmaf(sv.y, kk[r], x[1]);
        x[2] = fmaf(sv.z, kk[r], x[2]);
        x[3] = fmaf(sv.w, kk[r], x[3]);
        x[4] = fmaf(sv.x, qq[r], x[4]);
        x[5] = fmaf(sv.y, qq[r], x[5]);
        x[6] = fmaf(sv.z, qq[r], x[6]);
        x[7] = fmaf(sv.w, qq[r], x[7]);
      }
    }
    transpose_reduce_round<8, 16>(x, lane);
    transpose_reduce_round<4, 8>(x, lane);
    transpose_reduce_round<2, 4>(x, lane);
    x[0] += __shfl_xor_sync(0xffffffffu, x[0], 2);
    if (!(lane & 2)) red_lane[16 * t] = x[0];
  }
  __syncwarp();
  // 2. u of column c = lane & 7 for every token (the 4 lanes of a column solve the same), o of
  // tokens c4 and c4 + 4 (c4 = lane >> 3) of that column, w_t u_t to uw.
  const int c = lane & 7, c4 = lane >> 3;
  float u[kWyTokens];
#pragma unroll
  for (int t = 0; t < kWyTokens; ++t) {
    u[t] = 0.f;
    if ((live >> t) & 1u) {
      float x = d[WyShared::kBt + t] * vs[t * cb + c] - d[WyShared::kAl + t] * red[16 * t + c];
#pragma unroll
      for (int j = 0; j < t; ++j) x = fmaf(-d[WyShared::kMc + 8 * t + j], u[j], x);
      u[t] = x;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = c4 + 4 * h;
    if (t >= n) continue;
    float o = 0.f;
    if ((live >> t) & 1u) {
      const float* nrow = d + WyShared::kNc + 8 * t;
      o = d[WyShared::kGq + t] * red[16 * t + 8 + c];
#pragma unroll
      for (int j = 0; j < kWyTokens; ++j)
        if (j <= t) o = fmaf(nrow[j], u[j], o);
    }
    store_o(t, c, o);
  }
  if (lane < 8) {
#pragma unroll
    for (int t = 0; t < kWyTokens; ++t) uw[8 * t + c] = d[WyShared::kW + t] * u[t];
  }
  __syncwarp();
  // 3. S = G_{n-1} S0 + sum_t k_t (w_t u_t)^T on the lane's M rows and 4 columns.
  const float gn = d[WyShared::kGn];
#pragma unroll
  for (int m4 = 0; m4 < M; ++m4) {
    s[m4].x *= gn;
    s[m4].y *= gn;
    s[m4].z *= gn;
    s[m4].w *= gn;
  }
#pragma unroll 2
  for (unsigned m = live; m; m &= m - 1) {
    const int t = __ffs(m) - 1;
    const float4 w = reinterpret_cast<const float4*>(uw + 8 * t)[cg];
    const float4* k4 = reinterpret_cast<const float4*>(ks + t * DK + r0);
#pragma unroll
    for (int m4 = 0; m4 < M / 4; ++m4) {
      const float4 kv = k4[m4];
      const float kk[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float4& sv = s[4 * m4 + r];
        sv.x = fmaf(kk[r], w.x, sv.x);
        sv.y = fmaf(kk[r], w.y, sv.y);
        sv.z = fmaf(kk[r], w.z, sv.z);
        sv.w = fmaf(kk[r], w.w, sv.w);
      }
    }
  }
}

}  // namespace gdr::cuda::detail
