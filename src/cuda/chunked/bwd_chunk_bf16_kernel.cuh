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
//   A1  dVb = Tinv^T dVnew            (Tinv^T upper triangular: k blocks >= the row block)
//       dv = beta .* dVb -> dv;  dbeta partial rowsum(dVb .* V)
//   A2  dMq = scale (dO Vnew^T) .* lower,  dA = -(dVb Vnew^T) .* strict_lower
//       Mq' = dMq .* Gam, Mk' = diag(beta) dA .* Gam -> shared (bf16);  dbeta partial
//       rowsum(dA .* KK)
//   B   by quarters of the key channels (32 each, S, dS rows and Q, K columns staged per quarter):
//       X1 = scale dO S^T, dKb = -dVb S^T, Y = Vnew dS^T, dxq = Mq' K, dxk = Mk' K,
//       dyk = Mq'^T Q + Mk'^T K; dq_h, dk_h -> scratch (fp32, bwd_keygrad_kernel sums them);
//       the row sums of c1, d Y k, e dKb k per 16-channel tile; <S, dS> partial sums
//   C   Q, K staged whole (over the dead dO, Vnew rows): Z = Mq' .* (Q K^T) + Mk' .* (K K^T), then
//       dg, dbeta and the gate parameters' partials exactly as bwd_key_kernel's scalar gate.
// Given the forward's saved chunk states, Vnew = U - W S is formed here first (phase V, bf16
// products; bwd_vnew_kernel is not run and Vnew never goes to global memory).
// Shared memory (bytes, ~107 KB: two blocks per SM):
//   sdO, sVn, sdVb [C][136] bf16 | sMq, sMk [C][72] bf16 | region R (A: sTi [C][72] + sdVn
//   [C][136]; B: sS, sdS [32][136] + sQq, sKq [C][40]; C: sZ [C][65] fp32) | small fp32 arrays;
//   phase V: W [C][136] in region R, S [Dk][136] over sdVb, sMq, sMk.
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
  static_assert(region >= rowsD && rowsD + 2 * rowsC >= 2 * kBwdFusedD * ldD, "phase V");
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

// rows x 128 fp32 (global, row stride 128) -> bf16 shared rows [rows][ld]: 8 elements per unit.
template <int Rows>
__device__ __forceinline__ void stage_f32_rows(__nv_bfloat16* dst, int ld, const float* src) {
  constexpr int units = Rows * kBwdFusedD / 8;
  static_assert(units % kBwdFusedThreads == 0);
#pragma unroll
  for (int u = 0; u < units / kBwdFusedThreads; ++u) {
    const int e = threadIdx.x + u * kBwdFusedThreads;
    const int r = e / (kBwdFusedD / 8), c = 8 * (e % (kBwdFusedD / 8));
    const float4 x0 = *reinterpret_cast<const float4*>(src + r * kBwdFusedD + c);
    const float4 x1 = *reinterpret_cast<const float4*>(src + r * kBwdFusedD + c + 4);
    uint4 o;
    o.x = detail::pack_bf16(x0.x, x0.y);
    o.y = detail::pack_bf16(x0.z, x0.w);
    o.z = detail::pack_bf16(x1.x, x1.y);
    o.w = detail::pack_bf16(x1.z, x1.w);
    *reinterpret_cast<uint4*>(dst + r * ld + c) = o;
  }
}

// Vnew = U - W S of the chunk into sVn (bf16): W (fp32 scratch) staged in `w16` [C][ldD], S whole
// in `s16` [Dk][ldD] (bf16, from the saved record), U read from global as the products finish.
// Warp tile rows r0.., columns c0 .. c0 + 63, k over Dk.
template <bool S16>
__device__ __forceinline__ void fused_vnew(const BwdArgs& b, std::int64_t st_off, const float* W,
                                           const float* U, __nv_bfloat16* w16, __nv_bfloat16* s16,
                                           __nv_bfloat16* sVn) {
  constexpr int D = kBwdFusedD, ldD = BwdFusedSmem::ldD;
  stage_f32_rows<kC>(w16, ldD, W);
#pragma unroll
  for (int u = 0; u < D * D / 8 / kBwdFusedThreads; ++u) {
    const int e = threadIdx.x + u * kBwdFusedThreads;
    const int r = e / (D / 8), c = 8 * (e % (D / 8));
    const std::int64_t off = st_off + std::int64_t(r) * D + c;
    if constexpr (S16) {
      *reinterpret_cast<uint4*>(s16 + r * ldD + c) =
          *reinterpret_cast<const uint4*>(b.states16 + off);
    } else {
      const float4 x0 = *reinterpret_cast<const float4*>(b.states + off);
      const float4 x1 = *reinterpret_cast<const float4*>(b.states + off + 4);
      *reinterpret_cast<uint4*>(s16 + r * ldD + c) =
          make_uint4(detail::pack_bf16(x0.x, x0.y), detail::pack_bf16(x0.z, x0.w),
                     detail::pack_bf16(x1.x, x1.y), detail::pack_bf16(x1.z, x1.w));
    }
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, lg = lane >> 2, lc = lane & 3;
  const int r0 = 16 * (warp & 3), c0 = 64 * (warp >> 2);
  float acc[4][2][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < D; k0 += 16) {
    const uint4 aw = frag_a(w16, ldD, r0, k0);
#pragma unroll
    for (int m = 0; m < 4; ++m) mma_n16(acc[m], aw, frag_b_cols(s16, ldD, c0 + 16 * m, k0));
  }
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = r0 + lg + 8 * hr, col = c0 + 16 * m + 8 * nt + 2 * lc;
        const float2 u2 = *reinterpret_cast<const float2*>(U + r * D + col);
        *reinterpret_cast<std::uint32_t*>(sVn + r * ldD + col) =
            detail::pack_bf16(u2.x - acc[m][nt][2 * hr], u2.y - acc[m][nt][2 * hr + 1]);
      }
  __syncthreads();  // w16, s16 are overwritten next
}

// FuseVnew: Vnew = U - W S computed here from the saved chunk states (bwd_vnew_kernel not run);
// else Vnew is in U (the recomputed state pass wrote it).
template <bool S16, bool FuseVnew>
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
  __nv_bfloat16* sS = reinterpret_cast<__nv_bfloat16*>(region);  // phase B
  __nv_bfloat16* sdS = sS + 32 * ldD;
  __nv_bfloat16* sQq = sdS + 32 * ldD;
  __nv_bfloat16* sKq = sQq + kC * ldQ;
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
  const std::int64_t pidx = wslot * a.Hv + h;
  const std::int64_t gidx = slot * a.Hv + h;
  const std::int64_t kidx = (wslot * a.Hk + hk) * kC * D;
  const float* Qn = a.Qn_out + kidx;
  const float* Kn = a.Kn_out + kidx;
  const float* Vn = f32(a.U) + pidx * kC * D;
  const float* dS = b.dS + pidx * D * D;
  const std::int64_t st_off = slot * b.st_s0 + h * b.st_s1;
  float* dqh = f32(a.W) + pidx * kC * D;
  float* dkh = f32(a.Qs) + pidx * kC * D;

  // Phase 0: dO (cp.async), Vnew, dVnew, Tinv (fp32 -> bf16), G, beta.
  copy_token_rows(sdO, ldD, b.dout, b.do_sb, b.do_st, b.do_sh, seq.b, t0, h, len, D);
  detail::cp_async_commit();
  if constexpr (FuseVnew)  // W in region R, S over sdVb .. sMk (free until phase A1)
    fused_vnew<S16>(b, st_off, f32(a.W) + pidx * kC * D, Vn, sTi, sdVb, sVn);
  else
    stage_f32_rows<kC>(sVn, ldD, Vn);
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

  // Phase B: by quarters of the key channels.
  float sd = 0.f;  // this thread's part of <S, dS>
  const float Gn = sG[kC - 1];
  for (int qi = 0; qi < 4; ++qi) {
    const int ch0 = 32 * qi;
    // S, dS rows ch0 .. ch0 + 31 (8 elements per unit, 2 units per thread); Q, K columns.
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = tid + u * kBwdFusedThreads;
      const int r = e / (D / 8), c = 8 * (e % (D / 8));
      const std::int64_t off = std::int64_t(ch0 + r) * D + c;
      float s[8];
      if constexpr (S16) {
        const uint4 raw = *reinterpret_cast<const uint4*>(b.states16 + st_off + off);
        *reinterpret_cast<uint4*>(sS + r * ldD + c) = raw;
        unpack8_as_float(raw, 2, s);
      } else {
        const float4 x0 = *reinterpret_cast<const float4*>(b.states + st_off + off);
        const float4 x1 = *reinterpret_cast<const float4*>(b.states + st_off + off + 4);
        s[0] = x0.x, s[1] = x0.y, s[2] = x0.z, s[3] = x0.w;
        s[4] = x1.x, s[5] = x1.y, s[6] = x1.z, s[7] = x1.w;
        *reinterpret_cast<uint4*>(sS + r * ldD + c) =
            make_uint4(detail::pack_bf16(s[0], s[1]), detail::pack_bf16(s[2], s[3]),
                       detail::pack_bf16(s[4], s[5]), detail::pack_bf16(s[6], s[7]));
      }
      const float4 d0 = *reinterpret_cast<const float4*>(dS + off);
      const float4 d1 = *reinterpret_cast<const float4*>(dS + off + 4);
      *reinterpret_cast<uint4*>(sdS + r * ldD + c) =
          make_uint4(detail::pack_bf16(d0.x, d0.y), detail::pack_bf16(d0.z, d0.w),
                     detail::pack_bf16(d1.x, d1.y), detail::pack_bf16(d1.z, d1.w));
      sd += s[0] * d0.x + s[1] * d0.y + s[2] * d0.z + s[3] * d0.w + s[4] * d1.x + s[5] * d1.y +
            s[6] * d1.z + s[7] * d1.w;
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = tid + u * kBwdFusedThreads;  // 512 units: Q then K, 64 rows x 4 of 8
      const int which = e >> 8, r = (e >> 2) & 63, c = 8 * (e & 3);
      const float* src = (which ? Kn : Qn) + r * D + ch0 + c;
      const float4 x0 = *reinterpret_cast<const float4*>(src);
      const float4 x1 = *reinterpret_cast<const float4*>(src + 4);
      *reinterpret_cast<uint4*>((which ? sKq : sQq) + r * ldQ + c) =
          make_uint4(detail::pack_bf16(x0.x, x0.y), detail::pack_bf16(x0.z, x0.w),
                     detail::pack_bf16(x1.x, x1.y), detail::pack_bf16(x1.z, x1.w));
    }
    __syncthreads();

    const int r0 = 16 * (warp & 3), i0 = 16 * (warp >> 2);  // i0 within the quarter
    float x1[2][4] = {}, kb[2][4] = {}, y[2][4] = {};
#pragma unroll 2
    for (int k0 = 0; k0 < D; k0 += 16) {
      const uint4 bs = frag_b_rows(sS, ldD, i0, k0), bd = frag_b_rows(sdS, ldD, i0, k0);
      mma_n16(x1, frag_a(sdO, ldD, r0, k0), bs);
      mma_n16(kb, frag_a(sdVb, ldD, r0, k0), bs);
      mma_n16(y, frag_a(sVn, ldD, r0, k0), bd);
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
    float rs[3][2] = {};  // row sums (rows lg, lg + 8) of c1, d Y k, e dKb k
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = r0 + lg + 8 * hr, i = ch0 + i0 + 8 * nt + 2 * lc;
        const float G = sG[r], eg = expf(G), d = expf(Gn - G), beta = sBeta[r];
        const float2 q2 = *reinterpret_cast<const float2*>(Qn + r * D + i);
        const float2 k2 = *reinterpret_cast<const float2*>(Kn + r * D + i);
        float dq[2], dk[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int f = 2 * hr + e;
          const float q = e ? q2.y : q2.x, k = e ? k2.y : k2.x;
          const float X1 = a.scale * x1[nt][f], dkb = -kb[nt][f], Y = y[nt][f];
          rs[0][hr] += eg * (X1 * q + beta * dkb * k);
          rs[1][hr] += d * Y * k;
          rs[2][hr] += eg * dkb * k;
          dq[e] = eg * X1 + dxq[nt][f];
          dk[e] = beta * eg * dkb + d * Y + dxk[nt][f] + dyk[nt][f];
        }
        *reinterpret_cast<float2*>(dqh + r * D + i) = make_float2(dq[0], dq[1]);
        *reinterpret_cast<float2*>(dkh + r * D + i) = make_float2(dk[0], dk[1]);
      }
#pragma unroll
    for (int w = 0; w < 3; ++w)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float x = rs[w][hr];
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        if (lc == 0) sPart[(w * kC + r0 + lg + 8 * hr) * 8 + 2 * qi + (warp >> 2)] = x;
      }
    __syncthreads();  // the quarter's staging is overwritten next
  }

  // Phase C: Q, K rows whole over dO, Vnew; Z = Mq' .* (Q K^T) + Mk' .* (K K^T); <S, dS>.
  stage_f32_rows<kC>(sQ, ldD, Qn);
  stage_f32_rows<kC>(sK, ldD, Kn);
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
  // dg per row (bwd_key_kernel's scalar gate):
  //   dg_t = gn <S, dS> + sum_{r >= t} c1_r + sum_{r < t} (d Y k)_r + sum_{r >= t} sum_{j < t} Z[r,
  //   j]
  if (tid < kC) {  // column suffix sums in place: sZ[t][j] = sum_{r >= t} Z[r, j]
    const int j = tid;
    float acc = 0.f;
    for (int r = kC - 1; r >= 0; --r) {
      acc += sZ[r * ldZ + j];
      sZ[r * ldZ + j] = acc;
    }
  }
  __syncthreads();
  if (tid < kC) {  // per row: F_t = sum_{j < t} (suffix sums), the tiles' row sums
    const int r = tid;
    float f = 0.f;
    for (int j = 0; j < r; ++j) f += sZ[r * ldZ + j];
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
    sDbp[r] =
        (sPartA[r * 2] + sPartA[r * 2 + 1]) + (sPartA[2 * kC + r * 2] + sPartA[2 * kC + r * 2 + 1]);
  }
  __syncthreads();
  if (tid == 0) {  // the row recurrences in double, in order
    double sdd = 0.0;
    for (int w = 0; w < kBwdFusedThreads / 32; ++w) sdd += static_cast<double>(sRed[w]);
    double prefix = 0.0;  // sum_{r < t} (d Y k)_r
    for (int r = 0; r < kC; ++r) {
      sRow[r] = static_cast<float>(prefix);
      prefix += static_cast<double>(sYk[r]);
    }
    double rc = static_cast<double>(expf(Gn)) * sdd;
    for (int r = len - 1; r >= 0; --r) {
      rc += static_cast<double>(sC1[r]);
      sRow[r] = static_cast<float>(rc + static_cast<double>(sRow[r]) + static_cast<double>(sF[r]));
    }
    for (int r = len; r < kC; ++r) sRow[r] = 0.f;
  }
  __syncthreads();

  // dbeta and dg (with the chain rules of the fused options) per row; the gate parameters'
  // partials of this chunk.
  if (tid < len) {
    const int r = tid;
    if (b.dbeta) {
      float db = sDbp[r] + sDb[r];
      if (a.beta_sigmoid) {
        const float raw = load_as_float(
            a.beta, seq.b * a.beta_sb + (t0 + r) * a.beta_st + h * a.beta_sh, a.beta_dtype);
        const float s = 1.f / (1.f + expf(-raw));
        db *= s * (1.f - s);
      }
      store_from_float(b.dbeta, seq.b * b.db_sb + (t0 + r) * b.db_st + h * b.db_sh, a.beta_dtype,
                       db);
    }
  }
  if (tid == 0) {
    const float negA = a.gate_in_kernel ? -expf(a.A_log[h * a.A_log_s]) : 0.f;
    const float bias = a.gate_in_kernel && a.dt_bias ? a.dt_bias[h * a.dt_bias_sh] : 0.f;
    double ddt = 0.0, dAl = 0.0;
    for (int r = 0; r < len; ++r) {
      const float dgl = sRow[r];
      const std::int64_t goff = seq.b * a.g_sb + (t0 + r) * a.g_st + h * a.g_sh;
      float out = dgl;
      if (a.gate_in_kernel) {
        const float x = load_as_float(a.g, goff, a.g_dtype) + bias;
        out = dgl * negA * softplus_grad(x);
        dAl += static_cast<double>(dgl) * static_cast<double>(negA * softplus(x));
        ddt += static_cast<double>(out);
      }
      if (b.dg)
        store_from_float(b.dg, seq.b * b.dg_sb + (t0 + r) * b.dg_st + h * b.dg_sh, a.g_dtype, out);
    }
    if (a.gate_in_kernel) {
      b.gpart[gidx * 2] = dAl;
      b.gpart[gidx * 2 + 1] = ddt;
    }
  }
}

}  // namespace gdr::cuda::chunked
