// bwd_chunk_bf16_kernel: bwd_dvb_kernel and bwd_key_kernel (backward_kernels.cuh, which states the
// math) fused into one kernel per (chunk slot, value head) for the common training case: scalar
// gate, bf16 inputs with 16-byte aligned dO rows, no mask, Dk = Dv = 128 (chunked_backward.cu
// takes it there unless DecodeOverrides::chunked_backward_fused = 1). Every product runs on the
// tensor cores (mma.sync m16n8k16, fragments by ldmatrix) on bf16 operands in shared memory: the
// raw dO rows, and the fp32 scratch (Vnew, dVnew, Tinv, S, dS, the normalised Q, K) rounded once
// to bf16 as it is staged (as FLA's backward keeps them); sums in fp32, the row recurrences of dg
// in double as before. dVb, dMq, dA and the per-row partial sums never leave the chip (the
// general kernels pass 2 C Dv + 2 C^2 + 2 C Dk + C floats per item through global scratch).
//
// Phases (8 warps; [r0, r0 + 16) row blocks):
//   0   dO rows (cp.async); Vnew as bf16 hi + lo (from the fp32 scratch, or formed here: phase V)
//   Y   by quarters of the key channels (32 each, dS rows staged per quarter as bf16 hi + lo):
//       Y = Vnew dS^T in three products (hi hi, hi lo, lo hi: dg's prefix sums of d Y k lose
//       digits to cancellation, measured in a float64 model of these roundings: with Vnew or dS
//       rounded once to bf16, dg's relative error reached ~1e-2 at strong decay on some draws);
//       d Y -> dk_h, the row sums of d Y k; <S, dS> partial sums
//   A1  dVb = Tinv^T dVnew            (Tinv^T upper triangular: k blocks >= the row block)
//       dv = beta .* dVb -> dv;  dbeta partial rowsum(dVb .* V)
//   A2  dMq = scale (dO Vnew^T) .* lower,  dA = -(dVb Vnew^T) .* strict_lower
//       Mq' = dMq .* Gam, Mk' = diag(beta) dA .* Gam -> shared (bf16);  dbeta partial
//       rowsum(dA .* KK)
//   B   by quarters of the key channels (S rows, as bf16 hi + lo for fp32 states, and Q, K
//       columns staged per quarter):
//       X1 = scale dO S^T, dKb = -dVb S^T, dxq = Mq' K, dxk = Mk' K, dyk = Mq'^T Q + Mk'^T K;
//       dq_h, dk_h (+= phase Y's d Y) -> scratch (fp32, bwd_keygrad_kernel sums them); the row
//       sums of c1, e dKb k per 16-channel tile
//   C   Q, K staged whole (over the dead dO, Vnew rows): Z = Mq' .* (Q K^T) + Mk' .* (K K^T), then
//       dg, dbeta and the gate parameters' partials exactly as bwd_key_kernel's scalar gate.
// Given the forward's saved chunk states, Vnew = U - W S is formed here first (phase V: bf16
// products with W and fp32 states as hi + lo, fused_vnew; bwd_vnew_kernel is not run and Vnew
// never goes to global memory).
// Shared memory (bytes, ~107 KB: two blocks per SM):
//   sdO, sVn, sdVb [C][136] bf16 (Vnew's lo part in sdVb until A1) | sMq, sMk [C][72] bf16 |
//   region R (Y: dS hi, lo [32][136]; A: sTi [C][72] + sdVn [C][136]; B: S hi, lo [32][136] + sQq,
//   sKq [C][40]; C: sZ [C][65] fp32) | small fp32 arrays; phase V: W hi, lo [C][72] in region R,
//   S hi, lo [64][136] (half the rows at a time) over sdVb, sMq, sMk.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/chunked/backward_kernels.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kBwdFusedD = 128;  // Dk = Dv
inline constexpr int kBwdFusedThreads = 256;

struct BwdFusedSmem {
  static constexpr int ldD =
      kBwdFusedD + 8;                 // [C][D] bf16 rows (272 bytes: ldmatrix conflict-free)
  static constexpr int ldC = kC + 8;  // [C][C] bf16 rows
  static constexpr int ldQ = 32 + 8;  // a quarter's Q, K columns
  static constexpr int ldZ = kC + 1;  // fp32 Z
  static constexpr std::size_t rowsD = 2 * kC * ldD, rowsC = 2 * kC * ldC;
  static constexpr std::size_t regionA = rowsC + rowsD;
  static constexpr std::size_t regionB = 2 * (2 * 32 * ldD) + 2 * (2 * kC * ldQ);
  static constexpr std::size_t regionC = 4 * kC * ldZ;
  static constexpr std::size_t region = regionA > regionB ? (regionA > regionC ? regionA : regionC)
                                                          : (regionB > regionC ? regionB : regionC);
  // sG, sBeta, sDbp, sC1, sYk, sF, sDb, sRow [C]; sPart [3][C][8]; sPartA [2][C][2]; sRed [8].
  static constexpr std::size_t small = 4 * (8 * kC + 3 * kC * 8 + 2 * kC * 2 + 8);
  static constexpr std::size_t bytes = 3 * rowsD + 2 * rowsC + region + small;
  static_assert(region >= 2 * rowsC && rowsD + 2 * rowsC >= 2 * kBwdFusedD * ldD, "phase V");
};

// A [16 x 16] fragment of rows r0.. of a row-major bf16 matrix (ld elements), columns k0..
__device__ __forceinline__ uint4 frag_a(const __nv_bfloat16* m, int ld, int r0, int k0) {
  const int lane = threadIdx.x & 31;
  return detail::ldmatrix_x4(m + (r0 + (lane & 15)) * ld + k0 + 8 * (lane >> 4));
}
// The A fragment of M^T (rows r0.. of M^T = columns r0.. of M, k0.. along M's rows).
__device__ __forceinline__ uint4 frag_a_trans(const __nv_bfloat16* m, int ld, int r0, int k0) {
  const int lane = threadIdx.x & 31;
  return detail::ldmatrix_x4_trans(m + (k0 + (lane & 7) + 8 * (lane >> 4)) * ld + r0 +
                                   8 * ((lane >> 3) & 1));
}
// B fragments of 16 columns j0.. for X Y^T: Y's rows j0.. (row-major, k along the row).
// x, y: columns j0 .. j0 + 7; z, w: j0 + 8 .. j0 + 15.
__device__ __forceinline__ uint4 frag_b_rows(const __nv_bfloat16* y, int ld, int j0, int k0) {
  const int lane = threadIdx.x & 31;
  return detail::ldmatrix_x4(y + (j0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 +
                             8 * ((lane >> 3) & 1));
}
// B fragments of 16 columns c0.. for X B with B row-major (k along the rows k0..).
__device__ __forceinline__ uint4 frag_b_cols(const __nv_bfloat16* b, int ld, int c0, int k0) {
  const int lane = threadIdx.x & 31;
  return detail::ldmatrix_x4_trans(b + (k0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * ld + c0 +
                                   8 * (lane >> 4));
}
__device__ __forceinline__ void mma_n16(float (&acc)[2][4], uint4 a, uint4 b) {
  detail::mma_bf16(acc[0], a, b.x, b.y);
  detail::mma_bf16(acc[1], a, b.z, b.w);
}

// rows x 128 fp32 (global, row stride 128) -> bf16 shared rows [rows][ld]: 8 elements per unit;
// with `lo`, the residual x - bf16(x) rounded to bf16 into lo's rows (the pair carries x to
// ~2^-18 relative, mma_bf16.cuh).
template <int Rows>
__device__ __forceinline__ void stage_f32_rows(__nv_bfloat16* dst, int ld, const float* src,
                                               __nv_bfloat16* lo = nullptr) {
  constexpr int units = Rows * kBwdFusedD / 8;
  static_assert(units % kBwdFusedThreads == 0);
#pragma unroll
  for (int u = 0; u < units / kBwdFusedThreads; ++u) {
    const int e = threadIdx.x + u * kBwdFusedThreads;
    const int r = e / (kBwdFusedD / 8), c = 8 * (e % (kBwdFusedD / 8));
    const float4 x0 = *reinterpret_cast<const float4*>(src + r * kBwdFusedD + c);
    const float4 x1 = *reinterpret_cast<const float4*>(src + r * kBwdFusedD + c + 4);
    uint4 o, l;
    detail::split_bf16(x0.x, x0.y, o.x, l.x);
    detail::split_bf16(x0.z, x0.w, o.y, l.y);
    detail::split_bf16(x1.x, x1.y, o.z, l.z);
    detail::split_bf16(x1.z, x1.w, o.w, l.w);
    *reinterpret_cast<uint4*>(dst + r * ld + c) = o;
    if (lo) *reinterpret_cast<uint4*>(lo + r * ld + c) = l;
  }
}

// rows x 128 bf16 (global, row stride 128) -> shared rows [rows][ld], 16 bytes per unit.
template <int Rows>
__device__ __forceinline__ void copy_bf16_rows(__nv_bfloat16* dst, int ld,
                                               const __nv_bfloat16* src) {
  constexpr int units = Rows * kBwdFusedD / 8;
  static_assert(units % kBwdFusedThreads == 0);
#pragma unroll
  for (int u = 0; u < units / kBwdFusedThreads; ++u) {
    const int e = threadIdx.x + u * kBwdFusedThreads;
    const int r = e / (kBwdFusedD / 8), c = 8 * (e % (kBwdFusedD / 8));
    *reinterpret_cast<uint4*>(dst + r * ld + c) =
        *reinterpret_cast<const uint4*>(src + r * kBwdFusedD + c);
  }
}

// Rows row0 .. row0 + Rows - 1 of the chunk's saved state (the record at st_off, [D][D]) into
// shared rows [Rows][ldD]: bf16 records copied as they are (exact), fp32 ones as bf16 hi (dst) +
// lo (lo's rows).
template <bool S16, int Rows>
__device__ __forceinline__ void stage_state_rows(const BwdArgs& b, std::int64_t st_off, int row0,
                                                 __nv_bfloat16* dst, __nv_bfloat16* lo) {
  constexpr int D = kBwdFusedD, ldD = BwdFusedSmem::ldD;
  const std::int64_t off = st_off + std::int64_t(row0) * D;
  if constexpr (S16) {
    copy_bf16_rows<Rows>(dst, ldD, b.states16 + off);
  } else {
    stage_f32_rows<Rows>(dst, ldD, b.states + off, lo);
  }
}

// Vnew = U - W S of the chunk into sVn (bf16 hi) and sVnLo (bf16 lo), by halves of k (Dk): W's
// columns (fp32 scratch) as bf16 hi + lo in `w16` ([2][C][ldC]), S's rows (the saved record) in
// `s16` ([2][64][ldD]: bf16 rows exact as saved; fp32 rows as hi + lo), U read from global as the
// products finish: W_hi S_hi + W_lo S_hi (+ W_hi S_lo), ~2^-16 relative, since Vnew enters Y = Vnew
// dS^T (phase Y). Warp tile rows r0.., columns c0 .. c0 + 63. sVnLo may overlap s16: the lo parts
// are written after a barrier.
template <bool S16>
__device__ __forceinline__ void fused_vnew(const BwdArgs& b, std::int64_t st_off, const float* W,
                                           const float* U, __nv_bfloat16* w16, __nv_bfloat16* s16,
                                           __nv_bfloat16* sVn, __nv_bfloat16* sVnLo) {
  constexpr int D = kBwdFusedD, ldD = BwdFusedSmem::ldD, ldC = BwdFusedSmem::ldC, H = D / 2;
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, lg = lane >> 2, lc = lane & 3;
  const int r0 = 16 * (warp & 3), c0 = 64 * (warp >> 2);
  __nv_bfloat16* wl = w16 + kC * ldC;
  __nv_bfloat16* sl = s16 + H * ldD;
  float acc[4][2][4] = {};
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int u = 0; u < kC * H / 4 / kBwdFusedThreads; ++u) {  // W[:, H half .. + H)
      const int e = tid + u * kBwdFusedThreads;
      const int r = e / (H / 4), c = 4 * (e % (H / 4));
      const float4 x = *reinterpret_cast<const float4*>(W + r * D + H * half + c);
      uint2 hi, lo;
      detail::split_bf16(x.x, x.y, hi.x, lo.x);
      detail::split_bf16(x.z, x.w, hi.y, lo.y);
      *reinterpret_cast<uint2*>(w16 + r * ldC + c) = hi;
      *reinterpret_cast<uint2*>(wl + r * ldC + c) = lo;
    }
    stage_state_rows<S16, H>(b, st_off, H * half, s16, sl);  // S rows H half .. + H
    __syncthreads();
#pragma unroll 2
    for (int k0 = 0; k0 < H; k0 += 16) {
      const uint4 ah = frag_a(w16, ldC, r0, k0), al = frag_a(wl, ldC, r0, k0);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const uint4 bh = frag_b_cols(s16, ldD, c0 + 16 * m, k0);
        mma_n16(acc[m], ah, bh);
        mma_n16(acc[m], al, bh);
        if constexpr (!S16) mma_n16(acc[m], ah, frag_b_cols(sl, ldD, c0 + 16 * m, k0));
      }
    }
    __syncthreads();  // w16, s16 are overwritten next
  }
  std::uint32_t lo[4][2][2];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = r0 + lg + 8 * hr, col = c0 + 16 * m + 8 * nt + 2 * lc;
        const float2 u2 = *reinterpret_cast<const float2*>(U + r * D + col);
        std::uint32_t hi;
        detail::split_bf16(u2.x - acc[m][nt][2 * hr], u2.y - acc[m][nt][2 * hr + 1], hi,
                           lo[m][nt][hr]);
        *reinterpret_cast<std::uint32_t*>(sVn + r * ldD + col) = hi;
      }
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        *reinterpret_cast<std::uint32_t*>(sVnLo + (r0 + lg + 8 * hr) * ldD + c0 + 16 * m + 8 * nt +
                                          2 * lc) = lo[m][nt][hr];
}

// Phase C's row sums by the whole block (backward_kernels.cuh z_column_suffix_sums, z_row_prefix
// and dg_scalar_rows state them; those run them on one thread per column or row, or on one
// thread): the same sums in another fixed order, so the gradients stay bitwise reproducible.

// z[t][j] = sum_{r >= t} Z[r, j] in place, 256 threads: column j = tid % C, rows of quarter
// tid / C summed bottom up, then the totals of the quarters below added (in order, from the
// bottom); tot [4][C] floats of scratch. Ends with a barrier.
__device__ __forceinline__ void z_column_suffix_sums_by_quarters(float* z, int ld, float* tot) {
  static_assert(kBwdFusedThreads == 4 * kC, "a thread per column and quarter");
  const int j = threadIdx.x % kC, q = threadIdx.x / kC, r0 = 16 * q;
  float acc = 0.f;
#pragma unroll
  for (int r = r0 + 15; r >= r0; --r) {
    acc += z[r * ld + j];
    z[r * ld + j] = acc;
  }
  tot[q * kC + j] = acc;
  __syncthreads();
  float below = 0.f;
  for (int qb = 3; qb > q; --qb) below += tot[qb * kC + j];
#pragma unroll
  for (int r = r0; r < r0 + 16; ++r) z[r * ld + j] += below;
  __syncthreads();
}

// Part `part` (0 .. 3) of F_r = sum_{j < r} z[r][j]: columns 8 part + 32 h + e (h = 0, 1; e =
// 0 .. 7) below r; the four parts of a row are adjacent lanes (rows r and r + 1 ... of a warp hit
// 32 distinct banks at ld = C + 1).
__device__ __forceinline__ float z_row_prefix_part(const float* z, int ld, int r, int part) {
  float f = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int j = 8 * part + 32 * h + e;
      if (j < r) f += z[r * ld + j];
    }
  return f;
}

// dg_scalar_rows by one warp (lane l: rows 2 l, 2 l + 1), in double: row[t] = gn sd + sum_{len > r
// >= t} c1_r + float(sum_{r < t} yk_r) + F_t for t < len, 0 past len; the prefix and suffix sums
// as warp scans.
__device__ __forceinline__ void dg_scalar_rows_warp(float* row, const float* sd_parts, int nparts,
                                                    float gn, const float* c1, const float* yk,
                                                    const float* F, int len) {
  static_assert(kC == 64, "two rows per lane");
  const int lane = threadIdx.x & 31, r0 = 2 * lane;
  double sd = 0.0;
  for (int w = 0; w < nparts; ++w) sd += static_cast<double>(sd_parts[w]);
  const double y0 = yk[r0], y1 = yk[r0 + 1];
  const double c0 = r0 < len ? static_cast<double>(c1[r0]) : 0.0;
  const double c1v = r0 + 1 < len ? static_cast<double>(c1[r0 + 1]) : 0.0;
  double pre = y0 + y1, suf = c0 + c1v;  // inclusive scans: up (prefix) and down (suffix)
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const double up = __shfl_up_sync(0xffffffffu, pre, m);
    const double down = __shfl_down_sync(0xffffffffu, suf, m);
    if (lane >= m) pre += up;
    if (lane + m < 32) suf += down;
  }
  const double pre_prev = __shfl_up_sync(0xffffffffu, pre, 1);
  const double suf_next = __shfl_down_sync(0xffffffffu, suf, 1);
  const double before = lane > 0 ? pre_prev : 0.0;  // sum_{r < r0} yk_r
  const double after = lane < 31 ? suf_next : 0.0;  // sum_{r > r0 + 1} c1_r (rows < len)
  const double rc = static_cast<double>(gn) * sd;
  const float pf0 = static_cast<float>(before), pf1 = static_cast<float>(before + y0);
  row[r0] = r0 < len ? static_cast<float>((rc + after + c1v + c0) + static_cast<double>(pf0) +
                                          static_cast<double>(F[r0]))
                     : 0.f;
  row[r0 + 1] = r0 + 1 < len ? static_cast<float>((rc + after + c1v) + static_cast<double>(pf1) +
                                                  static_cast<double>(F[r0 + 1]))
                             : 0.f;
}

// The chunk's normalised q or k rows of one key head (fp32 values, rows >= len zero): the prep's
// fp32 rows (scratch [C][D]), or (Raw, DecodeOverrides::chunked_backward_qk = 2) the raw bf16 input
// rows times the prep's per-row norms (scratch [C]): the same fp32 products the prep forms, so the
// values are the same bits.
template <bool Raw>
struct QKRows {
  const float* scratch;      // Raw: the norms [C]; else the rows [C][D]
  const __nv_bfloat16* raw;  // Raw: the chunk's row 0 of the input (row stride st)
  std::int64_t st;
  int len;
  // Elements i, i + 1 of row r (i even).
  __device__ __forceinline__ float2 pair(int r, int i) const {
    if constexpr (Raw) {
      if (r >= len) return make_float2(0.f, 0.f);
      const float n = scratch[r];
      const float2 x =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(raw + r * st + i));
      return make_float2(n * x.x, n * x.y);
    } else {
      return *reinterpret_cast<const float2*>(scratch + r * kBwdFusedD + i);
    }
  }
  // Elements c .. c + 7 of row r (c a multiple of 8) rounded to bf16, as a 16-byte unit.
  __device__ __forceinline__ uint4 eight_bf16(int r, int c) const {
    float x[8];
    if constexpr (Raw) {
      if (r >= len) return make_uint4(0u, 0u, 0u, 0u);
      const float n = scratch[r];
      unpack8_as_float(*reinterpret_cast<const uint4*>(raw + r * st + c), 2, x);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] *= n;
    } else {
      const float4 x0 = *reinterpret_cast<const float4*>(scratch + r * kBwdFusedD + c);
      const float4 x1 = *reinterpret_cast<const float4*>(scratch + r * kBwdFusedD + c + 4);
      x[0] = x0.x, x[1] = x0.y, x[2] = x0.z, x[3] = x0.w;
      x[4] = x1.x, x[5] = x1.y, x[6] = x1.z, x[7] = x1.w;
    }
    return make_uint4(detail::pack_bf16(x[0], x[1]), detail::pack_bf16(x[2], x[3]),
                      detail::pack_bf16(x[4], x[5]), detail::pack_bf16(x[6], x[7]));
  }
};

// The C rows of `rows` as bf16 into shared rows [C][ld] (8 elements per unit; as stage_f32_rows
// without a lo part).
template <bool Raw>
__device__ __forceinline__ void stage_qk_rows(__nv_bfloat16* dst, int ld, const QKRows<Raw> rows) {
  constexpr int units = kC * kBwdFusedD / 8;
#pragma unroll
  for (int u = 0; u < units / kBwdFusedThreads; ++u) {
    const int e = threadIdx.x + u * kBwdFusedThreads;
    const int r = e / (kBwdFusedD / 8), c = 8 * (e % (kBwdFusedD / 8));
    *reinterpret_cast<uint4*>(dst + r * ld + c) = rows.eight_bf16(r, c);
  }
}

// FuseVnew: Vnew = U - W S computed here from the saved chunk states (bwd_vnew_kernel not run);
// else Vnew is in U (the recomputed state pass wrote it).
// RawQK: the q, k rows from the inputs and the prep's per-row norms (QKRows).
template <bool S16, bool FuseVnew, bool RawQK = false>
__global__ void __launch_bounds__(kBwdFusedThreads, 2) bwd_chunk_bf16_kernel(BwdArgs b) {
  using L = BwdFusedSmem;
  constexpr int D = kBwdFusedD, ldD = L::ldD, ldC = L::ldC, ldQ = L::ldQ, ldZ = L::ldZ;
  const ChunkArgs& a = b.c;
  extern __shared__ float4 smem4[];
  char* p = reinterpret_cast<char*>(smem4);
  __nv_bfloat16* sdO = reinterpret_cast<__nv_bfloat16*>(p);
  __nv_bfloat16* sVn = sdO + kC * ldD;
  __nv_bfloat16* sdVb = sVn + kC * ldD;
  __nv_bfloat16* sMq = sdVb + kC * ldD;
  __nv_bfloat16* sMk = sMq + kC * ldC;
  char* region = reinterpret_cast<char*>(sMk + kC * ldC);
  __nv_bfloat16* sTi = reinterpret_cast<__nv_bfloat16*>(region);  // phase A
  __nv_bfloat16* sdVn = sTi + kC * ldC;
  __nv_bfloat16* sdSh = reinterpret_cast<__nv_bfloat16*>(region);  // phase Y: dS hi, lo rows
  __nv_bfloat16* sdSl = sdSh + 32 * ldD;
  __nv_bfloat16* sS = reinterpret_cast<__nv_bfloat16*>(region);  // phase B: S rows (hi)
  __nv_bfloat16* sSl = sS + 32 * ldD;                            // fp32 states: their lo parts
  __nv_bfloat16* sQq = sSl + 32 * ldD;
  __nv_bfloat16* sKq = sQq + kC * ldQ;
  __nv_bfloat16* sVnLo = sdVb;                   // Vnew's lo part until phase A1 writes dVb
  float* sZ = reinterpret_cast<float*>(region);  // phase C
  __nv_bfloat16* sQ = sdO;                       // phase C: Q, K rows over dO, Vnew
  __nv_bfloat16* sK = sVn;
  float* sG = reinterpret_cast<float*>(region + L::region);
  float* sBeta = sG + kC;
  float* sC1 = sBeta + kC;
  float* sYk = sC1 + kC;
  float* sF = sYk + kC;
  float* sDb = sF + kC;
  float* sRow = sDb + kC;
  float* sDbp = sRow + kC;
  float* sPart = sDbp + kC;            // [3][C][8]: c1, d Y k, e dKb k per 16-channel tile
  float* sPartA = sPart + 3 * kC * 8;  // [2][C][2]: dVb .* V, dA .* KK per 64-column half
  float* sRed = sPartA + 2 * kC * 2;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int lg = lane >> 2, lc = lane & 3;
  const std::int64_t wslot = blockIdx.x;  // within the window (scratch items)
  const std::int64_t slot = a.slot_base + wslot;
  const int h = blockIdx.y;
  const int hk = h / a.group;
  SeqInfo seq;
  std::int64_t t0;
  int len;
  if (!slot_chunk(a, slot, seq, t0, len)) return;
  __shared__ long long phase_last;
  phase_mark(b.phase_cycles, phase_last, -1);
  const std::int64_t pidx = wslot * a.Hv + h;
  const std::int64_t gidx = slot * a.Hv + h;
  const std::int64_t kidx = (wslot * a.Hk + hk) * kC * D;
  const float* Qn = a.Qn_out + kidx;
  const float* Kn = a.Kn_out + kidx;
  const QKRows<RawQK> qrows{
      Qn, static_cast<const __nv_bfloat16*>(a.q) + seq.b * a.q_sb + t0 * a.q_st + hk * a.q_sh,
      a.q_st, len};
  const QKRows<RawQK> krows{
      Kn, static_cast<const __nv_bfloat16*>(a.k) + seq.b * a.k_sb + t0 * a.k_st + hk * a.k_sh,
      a.k_st, len};
  const float* Vn = f32(a.U) + pidx * kC * D;
  const float* dS = b.dS + pidx * D * D;
  const std::int64_t st_off = slot * b.st_s0 + h * b.st_s1;
  float* dqh = f32(a.W) + pidx * kC * D;
  float* dkh = f32(a.Qs) + pidx * kC * D;
  // Optional L2 prefetches (BwdArgs::prefetch_l2; thread 0, the bulk copy engine): phase 0 / V's
  // and Y's operands now, A's and B's after phase 0, C's after Y, so that a phase's first loads
  // find L2 rather than DRAM. Hints only: the results do not depend on them.
  if (b.prefetch_l2 && tid == 0) {
    if (FuseVnew) detail::prefetch_l2_bulk(f32(a.W) + pidx * kC * D, kC * D * 4);
    detail::prefetch_l2_bulk(Vn, kC * D * 4);
    if (S16)
      detail::prefetch_l2_bulk(b.states16 + st_off, D * D * 2);
    else
      detail::prefetch_l2_bulk(b.states + st_off, D * D * 4);
    detail::prefetch_l2_bulk(dS, D * D * 4);
  }

  // Phase 0: dO (cp.async), Vnew (hi + lo), G, beta.
  copy_token_rows(sdO, ldD, b.dout, b.do_sb, b.do_st, b.do_sh, seq.b, t0, h, len, D);
  detail::cp_async_commit();
  if constexpr (FuseVnew)  // W in region R, S over sdVb .. sMk (free until phase A1)
    fused_vnew<S16>(b, st_off, f32(a.W) + pidx * kC * D, Vn, sTi, sdVb, sVn, sVnLo);
  else
    stage_f32_rows<kC>(sVn, ldD, Vn, sVnLo);
  if (tid < kC) {
    float beta = 0.f;
    if (tid < len) {
      beta = load_as_float(a.beta, seq.b * a.beta_sb + (t0 + tid) * a.beta_st + h * a.beta_sh,
                           a.beta_dtype);
      if (a.beta_sigmoid) beta = 1.f / (1.f + expf(-beta));
    }
    sBeta[tid] = beta;
    sG[tid] = a.G_out[pidx * kC + tid];
  }
  cp_async_wait<0>();
  __syncthreads();
  phase_mark(b.phase_cycles, phase_last, 0);
  if (b.prefetch_l2 && tid == 0) {
    detail::prefetch_l2_bulk(b.dVn + pidx * kC * D, kC * D * 4);
    detail::prefetch_l2_bulk(a.Tinv_out + pidx * kC * kC, kC * kC * 4);
    detail::prefetch_l2_bulk(a.KK_out + pidx * kC * kC, kC * kC * 4);
    if (!RawQK) detail::prefetch_l2_bulk(Kn, kC * D * 4);
  }

  // Phase Y: Y = Vnew dS^T by quarters of the key channels, with Vnew and dS both as bf16 hi + lo
  // (three products: hi hi, hi lo, lo hi; dg's prefix sums of d Y k lose digits to cancellation,
  // so Y keeps ~2^-16 relative); d Y -> dk_h (phase B adds the rest), the row sums of d Y k;
  // <S, dS> partial sums.
  float sd = 0.f;  // this thread's part of <S, dS>
  const float Gn = sG[kC - 1];
  for (int qi = 0; qi < 4; ++qi) {
    const int ch0 = 32 * qi;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = tid + u * kBwdFusedThreads;
      const int r = e / (D / 8), c = 8 * (e % (D / 8));
      const std::int64_t off = std::int64_t(ch0 + r) * D + c;
      float sv[8];
      if constexpr (S16) {
        unpack8_as_float(*reinterpret_cast<const uint4*>(b.states16 + st_off + off), 2, sv);
      } else {
        const float4 x0 = *reinterpret_cast<const float4*>(b.states + st_off + off);
        const float4 x1 = *reinterpret_cast<const float4*>(b.states + st_off + off + 4);
        sv[0] = x0.x, sv[1] = x0.y, sv[2] = x0.z, sv[3] = x0.w;
        sv[4] = x1.x, sv[5] = x1.y, sv[6] = x1.z, sv[7] = x1.w;
      }
      const float4 d0 = *reinterpret_cast<const float4*>(dS + off);
      const float4 d1 = *reinterpret_cast<const float4*>(dS + off + 4);
      uint4 hi, lo;
      detail::split_bf16(d0.x, d0.y, hi.x, lo.x);
      detail::split_bf16(d0.z, d0.w, hi.y, lo.y);
      detail::split_bf16(d1.x, d1.y, hi.z, lo.z);
      detail::split_bf16(d1.z, d1.w, hi.w, lo.w);
      *reinterpret_cast<uint4*>(sdSh + r * ldD + c) = hi;
      *reinterpret_cast<uint4*>(sdSl + r * ldD + c) = lo;
      sd += sv[0] * d0.x + sv[1] * d0.y + sv[2] * d0.z + sv[3] * d0.w + sv[4] * d1.x +
            sv[5] * d1.y + sv[6] * d1.z + sv[7] * d1.w;
    }
    __syncthreads();
    const int r0 = 16 * (warp & 3), i0 = 16 * (warp >> 2);  // i0 within the quarter
    float y[2][4] = {}, ylo[2][4] = {};
#pragma unroll 2
    for (int k0 = 0; k0 < D; k0 += 16) {
      const uint4 avh = frag_a(sVn, ldD, r0, k0), avl = frag_a(sVnLo, ldD, r0, k0);
      const uint4 bh = frag_b_rows(sdSh, ldD, i0, k0), bl = frag_b_rows(sdSl, ldD, i0, k0);
      mma_n16(y, avh, bh);
      mma_n16(ylo, avh, bl);
      mma_n16(ylo, avl, bh);
    }
    float rs[2] = {};  // row sums (rows lg, lg + 8) of d Y k
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = r0 + lg + 8 * hr, i = ch0 + i0 + 8 * nt + 2 * lc;
        const float d = expf(Gn - sG[r]);
        const float2 k2 = krows.pair(r, i);
        const float y0 = y[nt][2 * hr] + ylo[nt][2 * hr],
                    y1 = y[nt][2 * hr + 1] + ylo[nt][2 * hr + 1];
        rs[hr] += d * y0 * k2.x + d * y1 * k2.y;
        *reinterpret_cast<float2*>(dkh + r * D + i) = make_float2(d * y0, d * y1);
      }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float x = rs[hr];
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      if (lc == 0) sPart[(1 * kC + r0 + lg + 8 * hr) * 8 + 2 * qi + (warp >> 2)] = x;
    }
    __syncthreads();  // the quarter's staging is overwritten next
  }
  phase_mark(b.phase_cycles, phase_last, 1);
  if (!RawQK && b.prefetch_l2 && tid == 0) detail::prefetch_l2_bulk(Qn, kC * D * 4);

  // Phase A0: dVnew (fp32 -> bf16, or bf16 as the reverse pass wrote it: BwdArgs::dvn16), Tinv
  // (fp32 -> bf16) into region R.
  if (b.dvn16)
    copy_bf16_rows<kC>(sdVn, ldD, reinterpret_cast<const __nv_bfloat16*>(b.dVn) + pidx * kC * D);
  else
    stage_f32_rows<kC>(sdVn, ldD, b.dVn + pidx * kC * D);
  {
    const float* Ti = a.Tinv_out + pidx * kC * kC;
#pragma unroll
    for (int u = 0; u < kC * kC / 4 / kBwdFusedThreads; ++u) {
      const int e = tid + u * kBwdFusedThreads;
      const int r = e / (kC / 4), c = 4 * (e % (kC / 4));
      const float4 x = *reinterpret_cast<const float4*>(Ti + r * kC + c);
      *reinterpret_cast<uint2*>(sTi + r * ldC + c) =
          make_uint2(detail::pack_bf16(x.x, x.y), detail::pack_bf16(x.z, x.w));
    }
  }
  __syncthreads();
  phase_mark(b.phase_cycles, phase_last, 2);

  // Phase A1: dVb = Tinv^T dVnew, warp tile rows r0.., columns c0 .. c0 + 63.
  {
    const int r0 = 16 * (warp & 3), c0 = 64 * (warp >> 2);
    float acc[4][2][4] = {};
    for (int k0 = r0; k0 < kC; k0 += 16) {
      const uint4 at = frag_a_trans(sTi, ldC, r0, k0);
#pragma unroll
      for (int m = 0; m < 4; ++m) mma_n16(acc[m], at, frag_b_cols(sdVn, ldD, c0 + 16 * m, k0));
    }
    float dbv[2] = {0.f, 0.f};
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = r0 + lg + 8 * hr, col = c0 + 16 * m + 8 * nt + 2 * lc;
          const float x0 = acc[m][nt][2 * hr], x1 = acc[m][nt][2 * hr + 1];
          *reinterpret_cast<std::uint32_t*>(sdVb + r * ldD + col) = detail::pack_bf16(x0, x1);
          if (r < len) {
            const std::int64_t voff = seq.b * a.v_sb + (t0 + r) * a.v_st + h * a.v_sh + col;
            dbv[hr] += x0 * load_as_float(a.v, voff, a.in_dtype) +
                       x1 * load_as_float(a.v, voff + 1, a.in_dtype);
            if (b.dv) {
              const std::int64_t o = seq.b * b.dv_sb + (t0 + r) * b.dv_st + h * b.dv_sh + col;
              store_from_float(b.dv, o, a.in_dtype, sBeta[r] * x0);
              store_from_float(b.dv, o + 1, a.in_dtype, sBeta[r] * x1);
            }
          }
        }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float x = dbv[hr];
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      if (lc == 0) sPartA[(r0 + lg + 8 * hr) * 2 + (warp >> 2)] = x;
    }
  }
  __syncthreads();
  phase_mark(b.phase_cycles, phase_last, 3);

  // Phase A2: dMq = scale dO Vnew^T (lower), dA = -dVb Vnew^T (strict lower); tiles rows r0..,
  // columns j0 .. j0 + 31 (wholly above the diagonal: zeros).
  {
    const int r0 = 16 * (warp & 3), j0 = 32 * (warp >> 2);
    float aq[2][2][4] = {}, ad[2][2][4] = {};
    if (j0 <= r0 + 15) {
#pragma unroll 2
      for (int k0 = 0; k0 < D; k0 += 16) {
        const uint4 ao = frag_a(sdO, ldD, r0, k0), ab = frag_a(sdVb, ldD, r0, k0);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const uint4 bv = frag_b_rows(sVn, ldD, j0 + 16 * m, k0);
          mma_n16(aq[m], ao, bv);
          mma_n16(ad[m], ab, bv);
        }
      }
    }
    const float* KK = a.KK_out + pidx * kC * kC;
    float dbk[2] = {0.f, 0.f};
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = r0 + lg + 8 * hr, j = j0 + 16 * m + 8 * nt + 2 * lc;
          float mq[2], mk[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int jj = j + e;
            const float gam = jj <= r ? expf(sG[r] - sG[jj]) : 0.f;
            const float dq = jj <= r ? a.scale * aq[m][nt][2 * hr + e] : 0.f;
            const float dA = jj < r ? -ad[m][nt][2 * hr + e] : 0.f;
            if (jj < r) dbk[hr] += dA * KK[r * kC + jj];
            mq[e] = dq * gam;
            mk[e] = sBeta[r] * dA * gam;
          }
          *reinterpret_cast<std::uint32_t*>(sMq + r * ldC + j) = detail::pack_bf16(mq[0], mq[1]);
          *reinterpret_cast<std::uint32_t*>(sMk + r * ldC + j) = detail::pack_bf16(mk[0], mk[1]);
        }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float x = dbk[hr];
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      if (lc == 0) sPartA[2 * kC + (r0 + lg + 8 * hr) * 2 + (warp >> 2)] = x;
    }
  }
  __syncthreads();
  phase_mark(b.phase_cycles, phase_last, 4);

  // Phase B: by quarters of the key channels.
  for (int qi = 0; qi < 4; ++qi) {
    const int ch0 = 32 * qi;
    // S rows ch0 .. ch0 + 31; Q, K columns.
    stage_state_rows<S16, 32>(b, st_off, ch0, sS, sSl);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = tid + u * kBwdFusedThreads;  // 512 units: Q then K, 64 rows x 4 of 8
      const int which = e >> 8, r = (e >> 2) & 63, c = 8 * (e & 3);
      *reinterpret_cast<uint4*>((which ? sKq : sQq) + r * ldQ + c) =
          which ? krows.eight_bf16(r, ch0 + c) : qrows.eight_bf16(r, ch0 + c);
    }
    __syncthreads();

    const int r0 = 16 * (warp & 3), i0 = 16 * (warp >> 2);  // i0 within the quarter
    float x1[2][4] = {}, kb[2][4] = {};
#pragma unroll 2
    for (int k0 = 0; k0 < D; k0 += 16) {
      // fp32 states as hi + lo (X1 enters dg through c1; bf16 saved states are exact as read)
      const uint4 bs = frag_b_rows(sS, ldD, i0, k0);
      const uint4 ao = frag_a(sdO, ldD, r0, k0), ab = frag_a(sdVb, ldD, r0, k0);
      mma_n16(x1, ao, bs);
      mma_n16(kb, ab, bs);
      if constexpr (!S16) {
        const uint4 bl = frag_b_rows(sSl, ldD, i0, k0);
        mma_n16(x1, ao, bl);
        mma_n16(kb, ab, bl);
      }
    }
    float dxq[2][4] = {}, dxk[2][4] = {}, dyk[2][4] = {};
    // Mq', Mk' are lower triangular: k blocks <= the row block for Mq' K, >= for Mq'^T Q.
    for (int k0 = 0; k0 <= r0; k0 += 16) {
      const uint4 bk = frag_b_cols(sKq, ldQ, i0, k0);
      mma_n16(dxq, frag_a(sMq, ldC, r0, k0), bk);
      mma_n16(dxk, frag_a(sMk, ldC, r0, k0), bk);
    }
    for (int k0 = r0; k0 < kC; k0 += 16) {
      mma_n16(dyk, frag_a_trans(sMq, ldC, r0, k0), frag_b_cols(sQq, ldQ, i0, k0));
      mma_n16(dyk, frag_a_trans(sMk, ldC, r0, k0), frag_b_cols(sKq, ldQ, i0, k0));
    }
    float rs[2][2] = {};  // row sums (rows lg, lg + 8) of c1, e dKb k
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = r0 + lg + 8 * hr, i = ch0 + i0 + 8 * nt + 2 * lc;
        const float eg = expf(sG[r]), beta = sBeta[r];
        const float2 q2 = qrows.pair(r, i);
        const float2 k2 = krows.pair(r, i);
        const float2 dy = *reinterpret_cast<const float2*>(dkh + r * D + i);  // d Y (phase Y)
        float dq[2], dk[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int f = 2 * hr + e;
          const float q = e ? q2.y : q2.x, k = e ? k2.y : k2.x;
          const float X1 = a.scale * x1[nt][f], dkb = -kb[nt][f];
          rs[0][hr] += eg * (X1 * q + beta * dkb * k);
          rs[1][hr] += eg * dkb * k;
          dq[e] = eg * X1 + dxq[nt][f];
          dk[e] = beta * eg * dkb + (e ? dy.y : dy.x) + dxk[nt][f] + dyk[nt][f];
        }
        *reinterpret_cast<float2*>(dqh + r * D + i) = make_float2(dq[0], dq[1]);
        *reinterpret_cast<float2*>(dkh + r * D + i) = make_float2(dk[0], dk[1]);
      }
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float x = rs[w][hr];
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        if (lc == 0) sPart[(2 * w * kC + r0 + lg + 8 * hr) * 8 + 2 * qi + (warp >> 2)] = x;
      }
    __syncthreads();  // the quarter's staging is overwritten next
  }
  phase_mark(b.phase_cycles, phase_last, 5);

  // Phase C: Q, K rows whole over dO, Vnew; Z = Mq' .* (Q K^T) + Mk' .* (K K^T); <S, dS>.
  stage_qk_rows(sQ, ldD, qrows);
  stage_qk_rows(sK, ldD, krows);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sd += __shfl_xor_sync(0xffffffffu, sd, m);
  if (lane == 0) sRed[warp] = sd;
  __syncthreads();
  {
    const int r0 = 16 * (warp & 3), j0 = 32 * (warp >> 2);
    float qk[2][2][4] = {}, kk[2][2][4] = {};
    if (j0 <= r0 + 15) {
#pragma unroll 2
      for (int k0 = 0; k0 < D; k0 += 16) {
        const uint4 aq = frag_a(sQ, ldD, r0, k0), ak = frag_a(sK, ldD, r0, k0);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const uint4 bk = frag_b_rows(sK, ldD, j0 + 16 * m, k0);
          mma_n16(qk[m], aq, bk);
          mma_n16(kk[m], ak, bk);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const int r = r0 + lg + 8 * (f >> 1), j = j0 + 16 * m + 8 * nt + 2 * lc + (f & 1);
          sZ[r * ldZ + j] = __bfloat162float(sMq[r * ldC + j]) * qk[m][nt][f] +
                            __bfloat162float(sMk[r * ldC + j]) * kk[m][nt][f];
        }
  }
  __syncthreads();
  phase_mark(b.phase_cycles, phase_last, 6);
  // dg per row (backward_kernels.cuh dg_scalar_rows states the sum): by the whole block
  // (DecodeOverrides::chunked_backward_rows = 2, opt-in until measured), or a thread per column /
  // row and one thread for the recurrences (the rule). by_block is uniform.
  const bool by_block = b.rows_by_block;
  if (by_block) {
    z_column_suffix_sums_by_quarters(sZ, ldZ, sC1);  // sC1 .. sDb: its [4][C] scratch until then
  } else {
    z_column_suffix_sums(sZ, ldZ);
    __syncthreads();
  }
  {  // F_t = sum_{j < t} (suffix sums) (four lanes or one thread per row), the tiles' row sums
    const int r = by_block ? tid >> 2 : tid;
    float f = 0.f;
    if (by_block) {
      f = z_row_prefix_part(sZ, ldZ, r, tid & 3);
      f += __shfl_xor_sync(0xffffffffu, f, 1);
      f += __shfl_xor_sync(0xffffffffu, f, 2);
    } else if (tid < kC) {
      f = z_row_prefix(sZ, ldZ, r);
    }
    if (by_block ? (tid & 3) == 0 : tid < kC) {
      float c1 = 0.f, ykr = 0.f, db = 0.f;
#pragma unroll
      for (int part = 0; part < 8; ++part) {
        c1 += sPart[(0 * kC + r) * 8 + part];
        ykr += sPart[(1 * kC + r) * 8 + part];
        db += sPart[(2 * kC + r) * 8 + part];
      }
      sF[r] = f;
      sC1[r] = c1;
      sYk[r] = ykr;
      sDb[r] = db;
      sDbp[r] = (sPartA[r * 2] + sPartA[r * 2 + 1]) +
                (sPartA[2 * kC + r * 2] + sPartA[2 * kC + r * 2 + 1]);
    }
  }
  __syncthreads();
  if (by_block) {
    if (warp == 0)
      dg_scalar_rows_warp(sRow, sRed, kBwdFusedThreads / 32, expf(Gn), sC1, sYk, sF, len);
  } else if (tid == 0) {  // the row recurrences in double, in order
    dg_scalar_rows(sRow, sRed, kBwdFusedThreads / 32, expf(Gn), sC1, sYk, sF, 1, len);
    for (int r = len; r < kC; ++r) sRow[r] = 0.f;
  }
  __syncthreads();

  // dbeta and dg (with the chain rules of the fused options) per row; the gate parameters'
  // partials of this chunk, summed in row order (by_block: per-row terms in sGateTerms, sZ dead).
  if (tid < len && b.dbeta)
    store_from_float(b.dbeta, seq.b * b.db_sb + (t0 + tid) * b.db_st + h * b.db_sh, a.beta_dtype,
                     beta_chain(a, seq, t0, tid, h, sDbp[tid] + sDb[tid]));
  const float negA = a.gate_in_kernel ? -expf(a.A_log[h * a.A_log_s]) : 0.f;
  const float bias = a.gate_in_kernel && a.dt_bias ? a.dt_bias[h * a.dt_bias_sh] : 0.f;
  double* sGateTerms = reinterpret_cast<double*>(region);  // [2][C]
  const int row0 = by_block ? tid : 0, rows = by_block ? (tid < len ? 1 : 0) : (tid == 0 ? len : 0);
  double dAl = 0.0, ddt = 0.0;
  for (int r = row0; r < row0 + rows; ++r) {
    const std::int64_t goff = seq.b * a.g_sb + (t0 + r) * a.g_st + h * a.g_sh;
    const float out = gate_chain(a, goff, sRow[r], negA, bias, dAl, ddt);
    if (b.dg)
      store_from_float(b.dg, seq.b * b.dg_sb + (t0 + r) * b.dg_st + h * b.dg_sh, a.g_dtype, out);
  }
  if (a.gate_in_kernel && by_block) {
    if (rows) {
      sGateTerms[tid] = dAl;
      sGateTerms[kC + tid] = ddt;
    }
    __syncthreads();
    dAl = ddt = 0.0;
    if (tid == 0)
      for (int r = 0; r < len; ++r) {
        dAl += sGateTerms[r];
        ddt += sGateTerms[kC + r];
      }
  }
  if (a.gate_in_kernel && tid == 0) {
    b.gpart[gidx * 2] = dAl;
    b.gpart[gidx * 2 + 1] = ddt;
  }
  if (b.phase_cycles) {  // the block's end: after its last stores
    __syncthreads();
    if (tid == 0) {
      phase_mark(b.phase_cycles, phase_last, 7);
      atomicAdd(b.phase_cycles + 8, 1ull);
    }
  }
}

}  // namespace gdr::cuda::chunked
