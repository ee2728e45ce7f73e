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
// staged decays exp(g), betas and masks of the chunk's tokens).
template <bool L2>
__device__ __forceinline__ void wy_coefficients(const float* gs, const float* bs, const float* ms,
                                                int cnt, float scale, float eps, float* wy) {
  const int work = (cnt + kWyTokens - 1) / kWyTokens * 64;
  for (int p = threadIdx.x; p < work; p += blockDim.x) {
    const int pass = p >> 6, t = (p >> 3) & 7, s = p & 7, t0 = pass * kWyTokens;
    const int n = cnt - t0 < kWyTokens ? cnt - t0 : kWyTokens;
    float* d = wy + pass * WyShared::kFloats;
    auto live = [&](int j) { return j < n && ms[t0 + j] != 0.f; };
    auto decay = [&](int j) { return live(j) ? gs[t0 + j] : 1.f; };
    auto rk = [&](int j) { return L2 ? 1.f / sqrtf(d[WyShared::kKK + 9 * j] + eps) : 1.f; };
    auto fq = [&](int j) { return scale * (L2 ? 1.f / sqrtf(d[WyShared::kQQ + j] + eps) : 1.f); };
    float mc = 0.f, nc = 0.f;
    if (s <= t && live(t) && live(s)) {
      float ratio = 1.f;  // G_t / G_s
      for (int j = s + 1; j <= t; ++j) ratio *= decay(j);
      const float base = ratio * rk(s);
      nc = base * fq(t) * d[WyShared::kKQ + 8 * t + s];
      if (s < t) mc = bs[t0 + t] * base * rk(t) * d[WyShared::kKK + 8 * t + s];
    }
    d[WyShared::kMc + 8 * t + s] = mc;
    d[WyShared::kNc + 8 * t + s] = nc;
    if (s == 0) {                 // the per-token factors of token t
      float g = 1.f, rest = 1.f;  // G_t, G_{n-1} / G_t
      for (int j = 0; j <= t; ++j) g *= decay(j);
      for (int j = t + 1; j < n; ++j) rest *= decay(j);
      const bool lt = live(t);
      d[WyShared::kAl + t] = lt ? bs[t0 + t] * g * rk(t) : 0.f;
      d[WyShared::kGq + t] = lt ? g * fq(t) : 0.f;
      d[WyShared::kBt + t] = lt ? bs[t0 + t] : 0.f;
      d[WyShared::kW + t] = lt ? rest * rk(t) : 0.f;
      if (t == 0) d[WyShared::kGn] = g * rest;
    }
  }
}

// x[4 j + c] = sum over the lane's M rows r of S[r][c] * w_j[r] for the pass's live tokens j
// (rows: the pass's first k or q row in shared memory, [8][DK]; r0: the lane's first row).
template <int DK, int M>
__device__ __forceinline__ void wy_partials(const float4 (&s)[M], const float* rows, int r0,
                                            unsigned live, float (&x)[32]) {
#pragma unroll
  for (int j = 0; j < kWyTokens; ++j) {
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f);
    if ((live >> j) & 1u) {
      const float4* w4 = reinterpret_cast<const float4*>(rows + j * DK + r0);
#pragma unroll
      for (int m4 = 0; m4 < M / 4; ++m4) {
        const float4 w = w4[m4];
        const float ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float4 sv = s[4 * m4 + e];
          p.x = fmaf(sv.x, ww[e], p.x);
          p.y = fmaf(sv.y, ww[e], p.y);
          p.z = fmaf(sv.z, ww[e], p.z);
          p.w = fmaf(sv.w, ww[e], p.w);
        }
      }
    }
    x[4 * j] = p.x;
    x[4 * j + 1] = p.y;
    x[4 * j + 2] = p.z;
    x[4 * j + 3] = p.w;
  }
}

// Reduces x (wy_partials) over the 16 row groups (lane bits 1 .. 4): the lane keeps x[0 .. 1] =
// the sums for token j = lane >> 2 and columns 2 ch, 2 ch + 1 of its column group
// (ch = lane bit 1).
__device__ __forceinline__ void wy_reduce(float (&x)[32], int lane) {
  transpose_reduce_round<32, 16>(x, lane);
  transpose_reduce_round<16, 8>(x, lane);
  transpose_reduce_round<8, 4>(x, lane);
  transpose_reduce_round<4, 2>(x, lane);
}

// One pass of n <= 8 tokens on the lane's registers s (the narrow k-first tile: M rows from
// r0 = (lane >> 1) M, columns 4 (lane & 1) .. + 3 of the warp's 8). qs, ks: the pass's first q
// and k rows ([8][DK] in shared memory); vs: the pass's first v row ([8][cb]) at the lane's
// column group; d: the pass's coefficients; live: bit t = token t steps. store_o(t, o0, o1) is
// called for one token per lane with o of its columns 2 ch, 2 ch + 1 of the group (0 when
// masked).
template <int DK, int M, typename StoreO>
__device__ __forceinline__ void kfirst_wy_pass(float4 (&s)[M], const float* qs, const float* ks,
                                               const float* vs, int cb, const float* d,
                                               unsigned live, int n, int lane, StoreO store_o) {
  const int r0 = (lane >> 1) * M, ch = (lane >> 1) & 1, jown = lane >> 2;
  float x[32];
  // S0^T q of token jown, columns 2 ch .. + 1.
  wy_partials<DK, M>(s, qs, r0, live, x);
  wy_reduce(x, lane);
  const float bq0 = x[0], bq1 = x[1];
  // S0^T k of every token, columns 2 ch .. + 1: sk[2 t + i].
  wy_partials<DK, M>(s, ks, r0, live, x);
  wy_reduce(x, lane);
  gather_round<2, 4>(x, lane);
  gather_round<4, 8>(x, lane);
  gather_round<8, 16>(x, lane);
  // u of the lane's two columns, every token (each of the 8 lanes sharing them solves the same).
  float u[2 * kWyTokens];
  const float* v_lane = vs + 2 * ch;
#pragma unroll
  for (int t = 0; t < kWyTokens; ++t) {
    u[2 * t] = u[2 * t + 1] = 0.f;
    if ((live >> t) & 1u) {
      const float2 v = *reinterpret_cast<const float2*>(v_lane + t * cb);
      const float al = d[WyShared::kAl + t], bt = d[WyShared::kBt + t];
      float u0 = bt * v.x - al * x[2 * t], u1 = bt * v.y - al * x[2 * t + 1];
#pragma unroll
      for (int j = 0; j < t; ++j) {
        const float c = d[WyShared::kMc + 8 * t + j];
        u0 = fmaf(-c, u[2 * j], u0);
        u1 = fmaf(-c, u[2 * j + 1], u1);
      }
      u[2 * t] = u0;
      u[2 * t + 1] = u1;
    }
  }
  // o of token jown.
  if (jown < n) {
    float o0 = 0.f, o1 = 0.f;
    if ((live >> jown) & 1u) {
      const float* nrow = d + WyShared::kNc + 8 * jown;
      const float gq = d[WyShared::kGq + jown];
      o0 = gq * bq0;
      o1 = gq * bq1;
#pragma unroll
      for (int j = 0; j < kWyTokens; ++j) {
        if (j <= jown) {
          o0 = fmaf(nrow[j], u[2 * j], o0);
          o1 = fmaf(nrow[j], u[2 * j + 1], o1);
        }
      }
    }
    store_o(jown, o0, o1);
  }
  // w_t u_t of the lane's 4 columns (the other two from lane ^ 2), then the rank-n update.
  float uw[4 * kWyTokens];
#pragma unroll
  for (int t = 0; t < kWyTokens; ++t) {
    const float w = d[WyShared::kW + t];
    const float m0 = w * u[2 * t], m1 = w * u[2 * t + 1];
    const float p0 = __shfl_xor_sync(0xffffffffu, m0, 2), p1 = __shfl_xor_sync(0xffffffffu, m1, 2);
    uw[4 * t] = ch ? p0 : m0;
    uw[4 * t + 1] = ch ? p1 : m1;
    uw[4 * t + 2] = ch ? m0 : p0;
    uw[4 * t + 3] = ch ? m1 : p1;
  }
  const float gn = d[WyShared::kGn];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    s[m].x *= gn;
    s[m].y *= gn;
    s[m].z *= gn;
    s[m].w *= gn;
  }
#pragma unroll
  for (int t = 0; t < kWyTokens; ++t) {
    if (!((live >> t) & 1u)) continue;
    const float4* k4 = reinterpret_cast<const float4*>(ks + t * DK + r0);
#pragma unroll
    for (int m4 = 0; m4 < M / 4; ++m4) {
      const float4 kv = k4[m4];
      const float kk[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float4& sv = s[4 * m4 + e];
        sv.x = fmaf(kk[e], uw[4 * t], sv.x);
        sv.y = fmaf(kk[e], uw[4 * t + 1], sv.y);
        sv.z = fmaf(kk[e], uw[4 * t + 2], sv.z);
        sv.w = fmaf(kk[e], uw[4 * t + 3], sv.w);
      }
    }
  }
}

}  // namespace gdr::cuda::detail
