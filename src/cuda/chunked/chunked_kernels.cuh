// Kernels of the chunked forward (docs/operator.md §3, C = 64; docs/cuda-chunked.md).
//
// chunk_table_kernel (varlen only, one block): chunk_off[n] = sum_{m<n} ceil(L_m / C) (and the
// segment slots seg_off under a segment split).
//
// chunk_prep_kernel, grid (chunk slots, Hv), 256 threads: per chunk of n <= 64 tokens and value
// head h (key head h / group), rows past n and masked rows zero (identity steps: g = beta = 0, q,
// k, v = 0), with G_r = g_1 + ... + g_r (fp32; rows past n repeat G_n, so G_63 = G_n):
//   A    = strict_lower(diag(beta) (Gam .* K K^T)),  Tinv = (I + A)^{-1}  (forward substitution,
//          fp32 FFMA)
//   W    = Tinv (beta e^G .* K)                        [C, Dk] -> scratch
//   U    = Tinv (beta .* V)                            [C, Dv] -> scratch
//   P    = scale lower(Gam .* Q K^T)  (diagonal kept)  [C, C]  -> scratch
//   Qs   = scale e^G .* Q,  Kd = e^{G_n - G} .* K      [C, Dk] -> scratch, or with row factors
//          (scalar gate, bf16, no mask) fq = scale e^G / |q|, fk = e^{G_n - G} / |k|  [C] each
//   gn   = e^{G_n}                                      [1] or [Dk] -> scratch
// Scalar gate: Gam[r, j] = e^{G_r - G_j}; the products K K^T, Q K^T on the tensor cores. Per-key
// gate: sum_i X[r, i] K[j, i] e^{G_r[i] - G_j[i]} elementwise (exact; a warp per (r, j) pair).
// Every exponent is <= 0.
//
// state_pass_kernel, grid (N, Hv, Dv / BV), 256 threads: the state slice S [Dk, BV] (fp32, shared
// memory) walks the sequence's chunks:
//   S -> chunk-state row (slot, h);  Vnew = U - W S -> U's place in scratch;
//   S <- diag(gn) S + Kd^T Vnew
// from h0 (or zeros) to final_state; the next chunk's W, U, Kd are copied (cp.async) while the
// current one computes. With row factors Kd^T Vnew = k^T (diag(fk) Vnew) on the k rows (input).
//
// chunk_output_kernel, grid (chunk slots, Hv, Dv / 64), 256 threads, independent chunks:
//   O = Qs S + P Vnew -> o (rows < n), S the chunk-state row (the state entering the chunk);
//   with row factors Qs S = diag(fq) (q S) on the q rows (input).
// Scratch elements St: fp32 for fp32 inputs, bf16 for f16 / bf16 inputs (W, U / Vnew, Qs, Kd, P
// rounded once to bf16 when written; gn, the state and the chunk states stay fp32). All products
// on the tensor cores: fp32 inputs 3xTF32 (m16n8k8, three products per pair, ~fp32 accuracy);
// 16-bit inputs: prep's products single tf32 on fp32 shared-memory operands, the state pass's and
// the output kernel's m16n8k16 bf16 (one product where both operands are bf16 scratch, two where
// one is the fp32 state or Vnew, split into bf16 hi + lo: src/cuda/common/mma_bf16.cuh).
#pragma once

#include <cub/block/block_scan.cuh>

#include "cuda/chunked/chunked_common.cuh"
#include "cuda/chunked/tinv.cuh"

namespace gdr::cuda::chunked {

inline constexpr int kThreads = 256;
inline constexpr int kLoads = 8;  // global loads in flight per thread (prep kernel)

// static: the header is included by the forward and the backward translation units.
static __global__ void __launch_bounds__(1024) chunk_table_kernel(ChunkArgs a) {
  using Scan = cub::BlockScan<std::int64_t, 1024>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ std::int64_t carry, seg_carry;
  if (threadIdx.x == 0) {
    carry = seg_carry = 0;
    a.chunk_off[0] = 0;
    if (a.seg_chunks > 0) a.seg_off[0] = 0;
  }
  __syncthreads();
  for (std::int64_t base = 0; base < a.N; base += 1024) {
    const std::int64_t n = base + threadIdx.x;
    std::int64_t count = 0, segs = 0;
    if (n < a.N) {
      std::int64_t bos, eos;
      seq_bounds(a, n, bos, eos);
      count = (eos - bos + kC - 1) / kC;
      if (a.seg_chunks > 0) {
        segs = (count + a.seg_chunks - 1) / a.seg_chunks;
        if (segs < 1) segs = 1;
      }
    }
    std::int64_t incl, total;
    Scan(temp).InclusiveSum(count, incl, total);
    if (n < a.N) {
      const std::int64_t off = carry + incl;
      a.chunk_off[n + 1] = off < a.slots ? off : a.slots;
    }
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    if (a.seg_chunks > 0) {  // segment slots (segment_of): max(1, ceil(chunks / seg_chunks)) each
      Scan(temp).InclusiveSum(segs, incl, total);
      if (n < a.N) {
        const std::int64_t off = seg_carry + incl;
        a.seg_off[n + 1] = off < a.seg_slots ? off : a.seg_slots;
      }
      __syncthreads();
      if (threadIdx.x == 0) seg_carry += total;
    }
    __syncthreads();
  }
}

// Shared memory of chunk_prep_kernel, in floats: sK, sQ [C][ld] (ld = max(Dk, Dv) + 4), sG
// [C][Dk + 4] (per-key) or [C], sA [C][68], beta [C], valid [C], the inverse norms of q and k [C]
// each (1 without qk_l2norm); with v_prefetch then the raw 16-bit v rows [C][Dv + 8], copied
// with cp.async as the block starts (they arrive while q, k, A and Tinv are computed).
inline std::size_t prep_smem_bytes(int Dk, int Dv, bool per_key, bool v_prefetch) {
  const int ld = (Dk > Dv ? Dk : Dv) + 4;
  return sizeof(float) * (2 * kC * ld + (per_key ? kC * (Dk + 4) : kC) + kC * 68 + 4 * kC) +
         (v_prefetch ? sizeof(std::uint16_t) * kC * (Dv + 8) : 0);
}

// X3: 3xTF32 products (fp32 inputs); single tf32 otherwise, also with fp32 scratch (the
// backward's recompute for 16-bit inputs, chunked_host.cuh launch_prep_fp32).
template <bool PerKey, class St, bool X3 = kX3<St>>
__global__ void __launch_bounds__(kThreads) chunk_prep_kernel(ChunkArgs a) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int Dk = a.Dk, Dv = a.Dv;
  const int ld = (Dk > Dv ? Dk : Dv) + 4;
  constexpr int ldA = 68;
  float* sK = smem;
  float* sQ = sK + kC * ld;
  float* sG = sQ + kC * ld;
  // Per-key log decays [C][ldG]: the row padding keeps the rows of an mma fragment (8 rows,
  // 4 columns) on distinct banks.
  const int ldG = PerKey ? Dk + 4 : 1;
  float* sA = sG + kC * ldG;
  float* sBeta = sA + kC * ldA;
  float* sValid = sBeta + kC;
  float* sNq = sValid + kC;
  float* sNk = sNq + kC;
  // v_prefetch: the raw 16-bit v rows (f16 or bf16 bits), row stride Dv + 8.
  std::uint16_t* sVraw = reinterpret_cast<std::uint16_t*>(sNk + kC);
  const int ldVr = Dv + 8;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const std::int64_t wslot = blockIdx.x;  // the slot within the window (scratch items)
  const std::int64_t slot = a.slot_base + wslot;
  const int h = blockIdx.y;
  const int hk = h / a.group;

  // (sequence, chunk) of this slot; surplus slots (varlen) zero their chunk-state rows.
  std::int64_t n = 0;
  if (!slot_sequence(a, slot, n)) {
    zero_surplus_state_row(a, slot, h);
    return;
  }
  const SeqInfo seq = seq_info(a, n);
  const std::int64_t c = slot - seq.slot0;
  const std::int64_t t0 = seq.bos + c * kC;
  const int len = chunk_rows(seq, c);
  if (a.v_prefetch) {  // v rows in flight from the start (rows past the chunk zero-filled)
    copy_token_rows(reinterpret_cast<__nv_bfloat16*>(sVraw), ldVr, a.v, a.v_sb, a.v_st, a.v_sh,
                    seq.b, t0, h, len, Dv);
    detail::cp_async_commit();
  }

  if (tid < kC) {
    bool valid = tid < len;
    if (valid && a.mask) valid = a.mask[seq.b * a.mask_sb + (t0 + tid) * a.mask_st] != 0;
    sValid[tid] = valid ? 1.f : 0.f;
    sNq[tid] = sNk[tid] = 1.f;
    float beta = 0.f;
    if (valid) {
      beta = load_as_float(a.beta, seq.b * a.beta_sb + (t0 + tid) * a.beta_st + h * a.beta_sh,
                           a.beta_dtype);
      if (a.beta_sigmoid) beta = 1.f / (1.f + expf(-beta));
    }
    sBeta[tid] = beta;
  }
  const float negA = a.gate_in_kernel ? -expf(a.A_log[h * a.A_log_s]) : 0.f;
  __syncthreads();
  // q, k rows (zero past the chunk and at masked positions) and the raw log decays; kLoads
  // elements per thread loaded before any is stored (independent loads in flight). 16-bit rows
  // 16-byte aligned (rows16): q, k 8 elements per load, 4 pieces of each per thread in flight.
  if (a.rows16) {
    const int pieces = Dk / 8, units = kC * pieces;
    for (int base = tid; base < units; base += 4 * kThreads) {
      float kv[4][8], qv[4][8];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = base + u * kThreads;
        const int r = e / pieces, i = 8 * (e - r * pieces);
        if (e < units && sValid[r] != 0.f) {
          const std::int64_t t = t0 + r;
          load8_as_float(a.k, seq.b * a.k_sb + t * a.k_st + hk * a.k_sh + i, a.in_dtype, kv[u]);
          load8_as_float(a.q, seq.b * a.q_sb + t * a.q_st + hk * a.q_sh + i, a.in_dtype, qv[u]);
        } else {
#pragma unroll
          for (int m = 0; m < 8; ++m) kv[u][m] = qv[u][m] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = base + u * kThreads;
        if (e >= units) continue;
        const int r = e / pieces, i = 8 * (e - r * pieces);
        float4* dk = reinterpret_cast<float4*>(sK + r * ld + i);
        float4* dq = reinterpret_cast<float4*>(sQ + r * ld + i);
        dk[0] = make_float4(kv[u][0], kv[u][1], kv[u][2], kv[u][3]);
        dk[1] = make_float4(kv[u][4], kv[u][5], kv[u][6], kv[u][7]);
        dq[0] = make_float4(qv[u][0], qv[u][1], qv[u][2], qv[u][3]);
        dq[1] = make_float4(qv[u][4], qv[u][5], qv[u][6], qv[u][7]);
      }
    }
  }
  // The element-wise loop: q, k without rows16, and the per-key log decays.
  for (int base = tid; base < ((a.rows16 && !PerKey) ? 0 : kC * Dk); base += kLoads * kThreads) {
    float kv[kLoads], qv[kLoads], gv[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = base + u * kThreads;
      const int r = e / Dk, i = e - r * Dk;
      kv[u] = qv[u] = gv[u] = 0.f;
      if (e < kC * Dk && sValid[r] != 0.f && !a.rows16) {
        const std::int64_t t = t0 + r;
        kv[u] = load_as_float(a.k, seq.b * a.k_sb + t * a.k_st + hk * a.k_sh + i, a.in_dtype);
        qv[u] = load_as_float(a.q, seq.b * a.q_sb + t * a.q_st + hk * a.q_sh + i, a.in_dtype);
      }
      if (e < kC * Dk && sValid[r] != 0.f) {
        const std::int64_t t = t0 + r;
        if constexpr (PerKey)
          gv[u] = load_as_float(a.g, seq.b * a.g_sb + t * a.g_st + h * a.g_sh + i, a.g_dtype);
      }
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = base + u * kThreads;
      if (e >= kC * Dk) continue;
      const int r = e / Dk, i = e - r * Dk;
      if (!a.rows16) {
        sK[r * ld + i] = kv[u];
        sQ[r * ld + i] = qv[u];
      }
      if constexpr (PerKey) {
        float x = gv[u];
        if (a.gate_in_kernel && sValid[r] != 0.f)
          x = negA * softplus(x + (a.dt_bias ? a.dt_bias[h * a.dt_bias_sh + i] : 0.f));
        sG[r * ldG + i] = floor_log_decay(x);
      }
    }
  }
  if constexpr (!PerKey) {
    if (tid < kC) {
      float gv = 0.f;
      if (sValid[tid] != 0.f) {
        gv = load_as_float(a.g, seq.b * a.g_sb + (t0 + tid) * a.g_st + h * a.g_sh, a.g_dtype);
        if (a.gate_in_kernel)
          gv = negA * softplus(gv + (a.dt_bias ? a.dt_bias[h * a.dt_bias_sh] : 0.f));
      }
      sG[tid] = floor_log_decay(gv);
    }
  }
  __syncthreads();
  // L2 norm of q and k rows (a warp per row); chunk-local cumulative log decay.
  if (a.qk_l2norm) {
    for (int r = warp; r < kC; r += kThreads / 32) {
      float sk = 0.f, sq = 0.f;
      for (int i = lane; i < Dk; i += 32) {
        sk += sK[r * ld + i] * sK[r * ld + i];
        sq += sQ[r * ld + i] * sQ[r * ld + i];
      }
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) {
        sk += __shfl_xor_sync(0xffffffffu, sk, m);
        sq += __shfl_xor_sync(0xffffffffu, sq, m);
      }
      const float ik = 1.f / sqrtf(sk + a.eps), iq = 1.f / sqrtf(sq + a.eps);
      if (lane == 0) sNq[r] = iq, sNk[r] = ik;
      for (int i = lane; i < Dk; i += 32) {
        sK[r * ld + i] *= ik;
        sQ[r * ld + i] *= iq;
      }
    }
  }
  if constexpr (PerKey) {
    for (int i = tid; i < Dk; i += kThreads) {
      float s = 0.f;
      for (int r = 0; r < kC; ++r) {
        s += sG[r * ldG + i];
        sG[r * ldG + i] = s;
      }
    }
  } else {
    // In token order, as the CPU paths: the roundings of G_r and G_j then cancel in G_r - G_j
    // (a tree scan measured a 4e-5 fp32 state error at g = -30; 2026-12-06).
    if (tid == 0) {
      float s = 0.f;
      for (int r = 0; r < kC; ++r) {
        s += sG[r];
        sG[r] = s;
      }
    }
  }
  __syncthreads();

  const std::int64_t pidx = wslot * a.Hv + h;
  if (a.G_out) {  // backward: G, and the normalised Q, K rows once per key head
    const int wg = PerKey ? Dk : 1;
    for (int e = tid; e < kC * wg; e += kThreads)
      a.G_out[pidx * kC * wg + e] = PerKey ? sG[(e / Dk) * ldG + e % Dk] : sG[e];
    if (h % a.group == 0) {
      const std::int64_t kidx = (wslot * a.Hk + hk) * kC * Dk;
      for (int e = tid; e < kC * Dk; e += kThreads) {
        const int r = e / Dk, i = e - r * Dk;
        a.Qn_out[kidx + e] = sQ[r * ld + i];
        a.Kn_out[kidx + e] = sK[r * ld + i];
      }
    }
  }
  St* Pg = static_cast<St*>(a.P) + pidx * kC * kC;
  const int lg = lane >> 2, lc = lane & 3;
  // A (shared) and P (scratch).
  if constexpr (!PerKey) {
    const int r0 = 16 * (warp & 3), j0 = 32 * (warp >> 2);
    float kk[4][4] = {}, qk[4][4] = {};
    mma_tile<4, X3>(
        kk, Dk, [&](int i, int k) { return sK[(r0 + i) * ld + k]; },
        [&](int k, int j) { return sK[(j0 + j) * ld + k]; });
    mma_tile<4, X3>(
        qk, Dk, [&](int i, int k) { return sQ[(r0 + i) * ld + k]; },
        [&](int k, int j) { return sK[(j0 + j) * ld + k]; });
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + lg + 8 * (e >> 1), j = j0 + 8 * nt + 2 * lc + (e & 1);
        const float gam = j <= r ? expf(sG[r] - sG[j]) : 0.f;
        sA[r * ldA + j] = j < r ? sBeta[r] * gam * kk[nt][e] : 0.f;
        Pg[r * kC + j] = to_scratch<St>(a.scale * gam * qk[nt][e]);
        if (a.KK_out) a.KK_out[pidx * kC * kC + r * kC + j] = j < r ? gam * kk[nt][e] : 0.f;
      }
  } else {
    // Per-key gate: X[r, j] = sum_i X_r[i] k_j[i] e^{G_r[i] - G_j[i]} (X = k for A, q for P),
    // by 16 x 16 blocks (R, J) of rows and columns. Off the diagonal (R > J) with the reference
    // row p = 16 R (r >= p > j): e^{G_r - G_j} = e^{G_r - G_p} e^{G_p - G_j}, both exponents
    // <= 0, so the block is a tensor-core product of rows scaled on the fly (warps 0 .. 5, one
    // block each); the four diagonal blocks elementwise (all warps, four lanes per pair).
    // Either factor is >= the true decay, so nothing underflows that the direct sum keeps.
    auto exp_le0 = [](float x) {
      if constexpr (X3)
        return expf(x);  // fp32 inputs: the accurate exponential
      else
        return __expf(x);  // 16-bit inputs: ~2^-21 relative at these arguments
    };
    auto write_pair = [&](int r, int j, float kk, float qk) {
      sA[r * ldA + j] = j < r ? sBeta[r] * kk : 0.f;
      Pg[r * kC + j] = to_scratch<St>(j <= r ? a.scale * qk : 0.f);
      if (a.KK_out) a.KK_out[pidx * kC * kC + r * kC + j] = j < r ? kk : 0.f;
    };
    for (int e = tid; e < kC * kC; e += kThreads) {  // above the diagonal: zeros
      const int r = e / kC, j = e - r * kC;
      if (j > r) write_pair(r, j, 0.f, 0.f);
    }
    if (warp < 6) {  // (R, J) = (1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)
      const int R = warp < 1 ? 1 : warp < 3 ? 2 : 3;
      const int J = warp - (R * (R - 1)) / 2;
      const int p = 16 * R, r0 = 16 * R, j0 = 16 * J;
      const float* Gp = sG + p * ldG;
      float kk[2][4] = {}, qk[2][4] = {};
      auto right = [&](int k, int j) {
        return sK[(j0 + j) * ld + k] * exp_le0(Gp[k] - sG[(j0 + j) * ldG + k]);
      };
      mma_tile<2, X3>(
          kk, Dk,
          [&](int i, int k) {
            return sK[(r0 + i) * ld + k] * exp_le0(sG[(r0 + i) * ldG + k] - Gp[k]);
          },
          right);
      mma_tile<2, X3>(
          qk, Dk,
          [&](int i, int k) {
            return sQ[(r0 + i) * ld + k] * exp_le0(sG[(r0 + i) * ldG + k] - Gp[k]);
          },
          right);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          write_pair(r0 + lg + 8 * (e >> 1), j0 + 8 * nt + 2 * lc + (e & 1), kk[nt][e], qk[nt][e]);
    }
    // Diagonal blocks: 4 x 136 pairs j <= r, four lanes per pair (i = quarter, quarter + 4, ...).
    constexpr int kTriangle = 16 * 17 / 2, kItems = 4 * 4 * kTriangle;
    for (int base = 0; base < kItems; base += kThreads) {
      const int item = base + tid, pair = item >> 2, quarter = item & 3;
      const bool live = item < kItems;
      int r = 0, j = 0;
      float kk = 0.f, qk = 0.f;
      if (live) {
        const int blk = pair / kTriangle, t = pair - blk * kTriangle;
        int rr = static_cast<int>((sqrtf(8.f * t + 1.f) - 1.f) * 0.5f);  // t = rr (rr + 1) / 2 + jj
        if ((rr + 1) * (rr + 2) / 2 <= t) ++rr;
        if (rr * (rr + 1) / 2 > t) --rr;
        r = 16 * blk + rr, j = 16 * blk + t - rr * (rr + 1) / 2;
        for (int i = quarter; i < Dk; i += 4) {
          const float d = exp_le0(sG[r * ldG + i] - sG[j * ldG + i]) * sK[j * ld + i];
          kk += sK[r * ld + i] * d;
          qk += sQ[r * ld + i] * d;
        }
      }
      kk += __shfl_xor_sync(0xffffffffu, kk, 1);
      qk += __shfl_xor_sync(0xffffffffu, qk, 1);
      kk += __shfl_xor_sync(0xffffffffu, kk, 2);
      qk += __shfl_xor_sync(0xffffffffu, qk, 2);
      if (live && quarter == 0) write_pair(r, j, kk, qk);
    }
  }
  __syncthreads();
  // Qs, Kd (or their row factors), gn to scratch; sK <- beta e^G .* K (the right-hand side of W).
  {
    const bool rows = !PerKey && a.row_factors;  // Qs, Kd recomputed from q, k where used
    St* Qs = rows ? nullptr : static_cast<St*>(a.Qs) + pidx * kC * Dk;
    St* Kd = rows ? nullptr : static_cast<St*>(a.Kd) + pidx * kC * Dk;
    static_assert(kThreads == 4 * kC, "four threads per chunk row");
    if (rows) {  // only sK <- beta e^G .* K: one factor per row, four threads per row, float4
      const int r = tid >> 2, part = tid & 3;
      const float f = sBeta[r] * expf(sG[r]);
      for (int i = 4 * part; i < Dk; i += 16) {
        float4* p = reinterpret_cast<float4*>(sK + r * ld + i);
        float4 x = *p;
        x.x *= f, x.y *= f, x.z *= f, x.w *= f;
        *p = x;
      }
    }
    for (int e = tid; e < (rows ? 0 : kC * Dk); e += kThreads) {
      const int r = e / Dk, i = e - r * Dk;
      const float G = PerKey ? sG[r * ldG + i] : sG[r];
      const float Gn = PerKey ? sG[(kC - 1) * ldG + i] : sG[kC - 1];
      const float eg = expf(G);
      const float kv = sK[r * ld + i];
      if (!rows) {
        Qs[e] = to_scratch<St>(a.scale * eg * sQ[r * ld + i]);
        Kd[e] = to_scratch<St>(expf(Gn - G) * kv);
      }
      sK[r * ld + i] = sBeta[r] * eg * kv;
    }
    if (rows && tid < kC) {  // Qs = diag(fq) q, Kd = diag(fk) k; 0 on rows past the chunk
      const bool valid = sValid[tid] != 0.f;
      a.fq[pidx * kC + tid] = valid ? a.scale * expf(sG[tid]) * sNq[tid] : 0.f;
      a.fk[pidx * kC + tid] = valid ? expf(sG[kC - 1] - sG[tid]) * sNk[tid] : 0.f;
    }
    if constexpr (PerKey) {
      for (int i = tid; i < Dk; i += kThreads) a.gn[pidx * Dk + i] = expf(sG[(kC - 1) * ldG + i]);
    } else {
      if (tid == 0) a.gn[pidx] = expf(sG[kC - 1]);
    }
  }
  __syncthreads();
  // Tinv = (I + A)^{-1} into sQ's space ([C][68]; tinv.cuh).
  float* sT = sQ;
  unit_lower_inverse(sA, sT, a.tinv_schedule);
  if (a.Tinv_out)
    for (int e = tid; e < kC * kC; e += kThreads)
      a.Tinv_out[pidx * kC * kC + e] = sT[(e / kC) * ldA + (e % kC)];
  // W = Tinv (beta e^G .* K), then U = Tinv (beta .* V): tiles of 16 x 32 over the 8 warps.
  {
    St* Wg = static_cast<St*>(a.W) + pidx * kC * Dk;
    const int tiles = 4 * (Dk / 32);
    for (int t = warp; t < tiles; t += kThreads / 32) {
      const int r0 = 16 * (t & 3), c0 = 32 * (t >> 2);
      float acc[4][4] = {};
      mma_tile<4, X3>(
          acc, kC, [&](int i, int k) { return sT[(r0 + i) * ldA + k]; },
          [&](int k, int j) { return sK[k * ld + c0 + j]; });
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = c0 + 8 * nt + 2 * lc;
        store_pair(Wg + (r0 + lg) * Dk + col, acc[nt][0], acc[nt][1]);
        store_pair(Wg + (r0 + lg + 8) * Dk + col, acc[nt][2], acc[nt][3]);
      }
    }
  }
  if (a.v_prefetch) cp_async_wait<0>();  // this thread's v copies
  __syncthreads();
  if (a.v_prefetch) {  // beta .* V from the prefetched raw rows, 8 elements per 16-byte read
    const int pieces = Dv / 8, units = kC * pieces;
    for (int e = tid; e < units; e += kThreads) {
      const int r = e / pieces, j = 8 * (e - r * pieces);
      float vv[8];
      smem8_as_float(sVraw + r * ldVr + j, a.in_dtype, vv);
      const float b = sBeta[r];
      const bool live = sValid[r] != 0.f;  // masked rows: zero (their v is never read)
      float4* dv = reinterpret_cast<float4*>(sK + r * ld + j);
      dv[0] = live ? make_float4(b * vv[0], b * vv[1], b * vv[2], b * vv[3])
                   : make_float4(0.f, 0.f, 0.f, 0.f);
      dv[1] = live ? make_float4(b * vv[4], b * vv[5], b * vv[6], b * vv[7])
                   : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  for (int base = tid; base < (a.v_prefetch ? 0 : kC * Dv); base += kLoads * kThreads) {
    float vv[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = base + u * kThreads;
      const int r = e / Dv, j = e - r * Dv;
      vv[u] = 0.f;
      if (e < kC * Dv && sValid[r] != 0.f)
        vv[u] = load_as_float(a.v, seq.b * a.v_sb + (t0 + r) * a.v_st + h * a.v_sh + j, a.in_dtype);
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = base + u * kThreads;
      if (e >= kC * Dv) continue;
      const int r = e / Dv, j = e - r * Dv;
      sK[r * ld + j] = sBeta[r] * vv[u];
    }
  }
  __syncthreads();
  {
    St* Ug = static_cast<St*>(a.U) + pidx * kC * Dv;
    const int tiles = 4 * (Dv / 32);
    for (int t = warp; t < tiles; t += kThreads / 32) {
      const int r0 = 16 * (t & 3), c0 = 32 * (t >> 2);
      float acc[4][4] = {};
      mma_tile<4, X3>(
          acc, kC, [&](int i, int k) { return sT[(r0 + i) * ldA + k]; },
          [&](int k, int j) { return sK[k * ld + c0 + j]; });
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = c0 + 8 * nt + 2 * lc;
        store_pair(Ug + (r0 + lg) * Dv + col, acc[nt][0], acc[nt][1]);
        store_pair(Ug + (r0 + lg + 8) * Dv + col, acc[nt][2], acc[nt][3]);
      }
    }
  }
}

// Row padding of St rows in shared memory (16 bytes: rows stay 16-byte aligned for cp.async and
// the bf16 A-operand pair reads are conflict-free), and the row stride of fp32 [*, BV] tiles read
// as B operands: BV + 8 for the tf32 fragments (k = c, c + 4), BV + 4 for the bf16 ones (k = 2c,
// 2c + 1, 2c + 8, 2c + 9).
template <class St>
inline constexpr int kPad = 16 / static_cast<int>(sizeof(St));
template <class St>
constexpr int fp32_ld(int BV) {
  return kX3<St> ? BV + 8 : BV + 4;
}

// Shared memory of state_pass_kernel, in bytes: fp32 sS [Dk][ldS], sV [C][ldS], gn [Dk], two fk
// buffers [C]; St nbuf W buffers and nbuf Kd buffers [C][Dk + pad], two U buffers [C][BV + pad].
template <class St>
std::size_t state_smem_bytes(int Dk, int BV, int nbuf) {
  const int ldS = fp32_ld<St>(BV), p = kPad<St>;
  return sizeof(float) * (Dk * ldS + kC * ldS + Dk + 2 * kC) +
         sizeof(St) * (2 * nbuf * kC * (Dk + p) + 2 * kC * (BV + p));
}

// Copies (cp.async) are in flight while the previous stage computes. Two W / Kd buffers (nbuf =
// 2): chunk c + 1's W, U, Kd are issued as chunk c starts (one group per chunk). One buffer
// (nbuf = 1): group A(c + 1) = W, U of chunk c + 1 issued once W S of chunk c is done, group
// B(c + 1) = Kd of chunk c + 1 once the state update of chunk c is done; at the top of chunk c
// the pending groups are A(c), B(c).
// Products: fp32 scratch: 3xTF32. bf16 scratch: W S and Kd^T Vnew with W, Kd exact bf16 data and
// S, Vnew (fp32, in shared memory) split into bf16 hi + lo (two m16n8k16 products, ~2^-17
// relative, mma_bf16.cuh), so the state update adds no rounding beyond the stored W, U, Kd; Vnew
// is rounded to bf16 only in the copy written for the output kernel. With row factors the Kd
// buffers hold k rows (bf16 input) and Kd^T Vnew = k^T (diag(fk) Vnew): fk scales sV's rows.
// mode 0: blockIdx.x = sequence, all its chunks from h0. Segment split (blockIdx.x = segment
// slot, segment_of): mode 1, the segment's map: columns < Dv walk the segment from a zero start
// (R), columns Dv .. Dv + Dk - 1 from the identity with U = 0 (M: the columns of a state evolve
// independently, S -> (diag(gn) - Kd^T W) S + Kd^T U per chunk, so M's columns are the product of
// the chunks' transitions), written to segmap; nothing else is written, and the last segment has
// no map to compute. mode 2: the segment from its true start (h0 for the first, segstart else)
// writes what mode 0 writes for its chunks, the final state from the last segment.
template <int BV, class St>
__global__ void __launch_bounds__(kThreads) state_pass_kernel(ChunkArgs a, int nbuf, int mode) {
  constexpr bool X3 = kX3<St>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int Dk = a.Dk, Dv = a.Dv;
  constexpr int ldS = fp32_ld<St>(BV), ldU = BV + kPad<St>;
  const int ldX = Dk + kPad<St>;
  const bool two = nbuf == 2;
  float* sS = smem;
  float* sV = sS + Dk * ldS;
  float* sgn = sV + kC * ldS;
  float* sfk = sgn + Dk;
  St* sW = reinterpret_cast<St*>(sfk + 2 * kC);
  St* sKd = sW + nbuf * kC * ldX;
  St* sU = sKd + nbuf * kC * ldX;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int lg = lane >> 2, lc = lane & 3;
  const int h = blockIdx.y;
  const int col0 = blockIdx.z * BV;
  std::int64_t n = blockIdx.x, segj = 0, nseg = 1;
  const std::int64_t xseg = blockIdx.x;
  if (mode != 0) {
    std::int64_t first;
    if (!segment_of(a, xseg, n, segj, nseg, first)) return;
    if (mode == 1 && segj == nseg - 1) return;
  }
  const SeqInfo seq = seq_info(a, n);
  std::int64_t cb = 0, ce = seq.chunks;  // this block's chunks
  if (mode != 0) {
    cb = segj * a.seg_chunks;
    ce = cb + a.seg_chunks < seq.chunks ? cb + a.seg_chunks : seq.chunks;
    if (cb > ce) cb = ce;
  }
  const bool mcols = mode == 1 && col0 >= Dv;  // M columns: U = 0, identity start
  const bool writes = mode != 1;               // chunk states, Vnew, the final state
  // Overlap: the output kernel may launch once every block of this grid has started (so that
  // its blocks, which wait on `progress`, never hold SMs a block of this pass still needs).
  int* progress = nullptr;
  if (mode == 0 && a.progress) {
    launch_dependents();
    progress = a.progress + (n * a.Hv + h) * (Dv / BV) + blockIdx.z;
  }
  const St* gW = static_cast<const St*>(a.W);
  St* gU = static_cast<St*>(a.U);
  const St* gKd = static_cast<const St*>(a.Kd);
  auto item = [&](std::int64_t c) { return (seq.slot0 + c) * a.Hv + h; };
  auto wbuf = [&](std::int64_t c) { return sW + (two ? int(c & 1) : 0) * kC * ldX; };
  auto kbuf = [&](std::int64_t c) { return sKd + (two ? int(c & 1) : 0) * kC * ldX; };
  auto ubuf = [&](std::int64_t c) { return sU + int(c & 1) * kC * ldU; };
  const int hk = h / a.group;
  auto issue_WU = [&](std::int64_t c) {
    copy_rows(wbuf(c), ldX, gW + item(c) * kC * Dk, Dk, kC, Dk);
    if (!mcols) copy_rows(ubuf(c), ldU, gU + item(c) * kC * Dv + col0, Dv, kC, BV);
    if (a.row_factors) copy_rows(sfk + int(c & 1) * kC, kC, a.fk + item(c) * kC, kC, 1, kC);
  };
  auto issue_K = [&](std::int64_t c) {
    if constexpr (!X3) {
      if (a.row_factors) {
        const std::int64_t rem = seq.len - c * kC;
        copy_token_rows(kbuf(c), ldX, a.k, a.k_sb, a.k_st, a.k_sh, seq.b, seq.bos + c * kC, hk,
                        rem < kC ? static_cast<int>(rem) : kC, Dk);
        return;
      }
    }
    copy_rows(kbuf(c), ldX, gKd + item(c) * kC * Dk, Dk, kC, Dk);
  };
  // gn of chunk c: thread tid < Dk holds gn[tid] (per-key gate), every thread the scalar.
  auto load_gn = [&](std::int64_t c) {
    if (a.per_key) return tid < Dk ? a.gn[item(c) * Dk + tid] : 0.f;
    return a.gn[item(c)];
  };

  // The first chunk's copies; S from h0 (or zeros), or the segment's start (segstart), or for a
  // map zeros (R) / the identity (M).
  float g_next = 0.f;
  if (ce > cb) {
    issue_WU(cb);
    detail::cp_async_commit();
    issue_K(cb);
    detail::cp_async_commit();
    g_next = load_gn(cb);
  }
  for (int e = tid; e < Dk * BV; e += kThreads) {
    const int i = e / BV, j = e - i * BV;
    float s = 0.f;
    if (mode == 1) {
      s = mcols && i == col0 - Dv + j ? 1.f : 0.f;
    } else if (segj > 0) {
      s = a.segstart[(xseg * a.Hv + h) * std::int64_t(Dk) * Dv + std::int64_t(i) * Dv + col0 + j];
    } else if (a.h0) {
      const std::int64_t base = n * a.h0_s0 + h * a.h0_s1;
      s = a.v_first ? a.h0[base + (col0 + j) * a.h0_s2 + i] : a.h0[base + i * a.h0_s2 + col0 + j];
    }
    sS[i * ldS + j] = s;
  }

  for (std::int64_t c = cb; c < ce; ++c) {
    const std::int64_t slot = seq.slot0 + c;
    const std::int64_t pidx = item(c);
    const bool more = c + 1 < ce;
    const float g_cur = g_next;
    const St* cW = wbuf(c);
    const St* cK = kbuf(c);
    const St* cU = ubuf(c);
    const float* cfk = sfk + int(c & 1) * kC;
    if (two) {
      cp_async_wait<0>();
      __syncthreads();
      if (more) {
        issue_WU(c + 1);
        issue_K(c + 1);
        g_next = load_gn(c + 1);
      }
      detail::cp_async_commit();
    } else {
      cp_async_wait<1>();  // A(c)
      __syncthreads();
    }
    // The state entering chunk c -> its row (slot, h): fp32, or bf16 pairs (states16).
    if (writes && a.states16) {
      __nv_bfloat16* rec = a.states16 + slot * a.saved_s0 + h * a.saved_s1;
      for (int e = tid; e < Dk * BV / 2; e += kThreads) {
        const int i = e / (BV / 2), j = 2 * (e - i * (BV / 2));
        store_pair(rec + std::int64_t(i) * Dv + col0 + j, sS[i * ldS + j], sS[i * ldS + j + 1]);
      }
    } else if (writes) {
      float* rec = a.saved + slot * a.saved_s0 + h * a.saved_s1;
      for (int e = tid; e < Dk * BV; e += kThreads) {
        const int i = e / BV, j = e - i * BV;
        rec[std::int64_t(i) * Dv + col0 + j] = sS[i * ldS + j];
      }
    }
    // Vnew = U - W S: tiles 16 x 16 of [C, BV] -> sV (fp32) and U's place in scratch (St, read
    // by the output kernel).
    constexpr int vtiles = 4 * (BV / 16);
    St* Ug = gU + pidx * kC * Dv + col0;
    for (int t = warp; t < vtiles; t += kThreads / 32) {
      const int r0 = 16 * (t & 3), j0 = 16 * (t >> 2);
      float acc[2][4] = {};
      if constexpr (X3)
        mma_tile<2, true>(
            acc, Dk, [&](int i, int k) { return cW[(r0 + i) * ldX + k]; },
            [&](int k, int j) { return sS[k * ldS + j0 + j]; });
      else
        mma_tile_bf16<2, true>(
            acc, Dk, [&](int i, int k) { return load_pair(cW + (r0 + i) * ldX + k); },
            [&](int k, int j) { return sS[k * ldS + j0 + j]; });
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = r0 + lg + 8 * hf, j = j0 + 8 * nt + 2 * lc;
          const float u0 = mcols ? 0.f : from_scratch(cU[r * ldU + j]);
          const float u1 = mcols ? 0.f : from_scratch(cU[r * ldU + j + 1]);
          const float v0 = u0 - acc[nt][2 * hf], v1 = u1 - acc[nt][2 * hf + 1];
          const float f = a.row_factors ? cfk[r] : 1.f;
          *reinterpret_cast<float2*>(sV + r * ldS + j) = make_float2(f * v0, f * v1);
          if (writes) store_pair(Ug + std::int64_t(r) * Dv + j, v0, v1);
        }
    }
    __syncthreads();
    if (!two) {
      if (more) {
        issue_WU(c + 1);
        g_next = load_gn(c + 1);
      }
      detail::cp_async_commit();  // A(c + 1)
    }
    if (tid < Dk) sgn[tid] = g_cur;
    if (!two) cp_async_wait<1>();  // B(c)
    __syncthreads();
    // S <- diag(gn) S + Kd^T Vnew: tiles 16 x BV of [Dk, BV] (one row band per warp: BV / 8
    // independent accumulators, BV / 4 with the hi / lo split).
    constexpr int NTs = BV / 8;
    for (int t = warp; t < Dk / 16; t += kThreads / 32) {
      const int i0 = 16 * t;
      float acc[NTs][4];
#pragma unroll
      for (int nt = 0; nt < NTs; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = i0 + lg + 8 * (e >> 1), j = 8 * nt + 2 * lc + (e & 1);
          acc[nt][e] = sgn[i] * sS[i * ldS + j];
        }
      if constexpr (X3)
        mma_tile<NTs, true>(
            acc, kC, [&](int i, int k) { return cK[k * ldX + i0 + i]; },
            [&](int k, int j) { return sV[k * ldS + j]; });
      else
        mma_tile_bf16<NTs, true>(
            acc, kC, [&](int i, int k) { return load_col_pair(cK + k * ldX + i0 + i, ldX); },
            [&](int k, int j) { return sV[k * ldS + j]; });
#pragma unroll
      for (int nt = 0; nt < NTs; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = i0 + lg + 8 * (e >> 1), j = 8 * nt + 2 * lc + (e & 1);
          sS[i * ldS + j] = acc[nt][e];
        }
    }
    __syncthreads();
    if (!two) {
      if (more) issue_K(c + 1);
      detail::cp_async_commit();  // B(c + 1)
    }
    // Chunk c's state row and Vnew are written by every thread (before the barrier above).
    if (progress && tid == 0) store_release(progress, static_cast<int>(c + 1));
  }
  cp_async_wait<0>();
  __syncthreads();
  if (mode == 1) {  // [R | M] -> segmap
    float* out = a.segmap + (xseg * a.Hv + h) * std::int64_t(Dk) * (Dv + Dk);
    for (int e = tid; e < Dk * BV; e += kThreads) {
      const int i = e / BV, j = e - i * BV;
      out[std::int64_t(i) * (Dv + Dk) + col0 + j] = sS[i * ldS + j];
    }
  } else if (a.hout && segj == nseg - 1) {
    for (int e = tid; e < Dk * BV; e += kThreads) {
      const int i = e / BV, j = e - i * BV;
      const std::int64_t base = n * a.hout_s0 + h * a.hout_s1;
      const float s = sS[i * ldS + j];
      if (a.v_first)
        a.hout[base + (col0 + j) * a.hout_s2 + i] = s;
      else
        a.hout[base + i * a.hout_s2 + col0 + j] = s;
    }
  }
}

// Segment split, between the map pass (mode 1) and the segment pass (mode 2): for sequence n,
// value head h and 32 value columns, S_0 = h0 (or zeros), S_{j+1} = M_j S_j + R_j for the
// segments j = 0 .. nseg - 2 (sequential over the few segments), each S_{j+1} -> segstart (row of
// segment j + 1). 3xTF32 products (fp32 accuracy: M, R, S are fp32). Grid (N, Hv, Dv / 32), 256
// threads; shared memory two fp32 [Dk][40] buffers.
inline constexpr int kCombineBV = 32;
inline std::size_t combine_smem_bytes(int Dk) {
  return sizeof(float) * 2 * Dk * (kCombineBV + 8);
}

static __global__ void __launch_bounds__(kThreads) segment_combine_kernel(ChunkArgs a) {
  extern __shared__ float4 smem4[];
  constexpr int BV = kCombineBV, ld = BV + 8;
  const int Dk = a.Dk, Dv = a.Dv;
  const std::int64_t ldm = Dk + Dv;  // segmap row length
  float* sCur = reinterpret_cast<float*>(smem4);
  float* sNext = sCur + Dk * ld;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int lg = lane >> 2, lc = lane & 3;
  const std::int64_t n = blockIdx.x;
  const int h = blockIdx.y;
  const int col0 = blockIdx.z * BV;
  std::int64_t first, nseg;
  if (a.varlen) {
    first = a.seg_off[n];
    nseg = a.seg_off[n + 1] - first;
  } else {
    nseg = a.nseg_fixed;
    first = n * nseg;
  }
  if (nseg <= 1) return;
  for (int e = tid; e < Dk * BV; e += kThreads) {
    const int i = e / BV, j = e - i * BV;
    float s = 0.f;
    if (a.h0) {
      const std::int64_t base = n * a.h0_s0 + h * a.h0_s1;
      s = a.v_first ? a.h0[base + (col0 + j) * a.h0_s2 + i] : a.h0[base + i * a.h0_s2 + col0 + j];
    }
    sCur[i * ld + j] = s;
  }
  __syncthreads();
  const int tiles = (Dk / 16) * (BV / 16);
  for (std::int64_t j = 0; j + 1 < nseg; ++j) {
    const float* map = a.segmap + ((first + j) * a.Hv + h) * std::int64_t(Dk) * ldm;
    float* out = a.segstart + ((first + j + 1) * a.Hv + h) * std::int64_t(Dk) * Dv + col0;
    for (int t = warp; t < tiles; t += kThreads / 32) {
      const int i0 = 16 * (t % (Dk / 16)), j0 = 16 * (t / (Dk / 16));
      float acc[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = i0 + lg + 8 * (e >> 1), jj = j0 + 8 * nt + 2 * lc + (e & 1);
          acc[nt][e] = map[i * ldm + col0 + jj];  // R
        }
      mma_tile<2, true>(
          acc, Dk, [&](int i, int k) { return map[(i0 + i) * ldm + Dv + k]; },  // M
          [&](int k, int jj) { return sCur[k * ld + j0 + jj]; });
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = i0 + lg + 8 * (e >> 1), jj = j0 + 8 * nt + 2 * lc + (e & 1);
          sNext[i * ld + jj] = acc[nt][e];
          out[std::int64_t(i) * Dv + jj] = acc[nt][e];
        }
    }
    __syncthreads();
    float* t = sCur;
    sCur = sNext;
    sNext = t;
  }
}

// Shared memory of chunk_output_kernel, in bytes: sS [Dk][ldS] (fp32, or bf16 [Dk][BV + 8] with
// S16); St sQ [C][Dk + pad], sP [C][C + pad], sV [C][BV + pad]; fq [C] (fp32).
template <class St, bool S16>
std::size_t output_smem_bytes(int Dk, int BV) {
  const int p = kPad<St>;
  return (S16 ? 2 * Dk * (BV + 8) : sizeof(float) * Dk * fp32_ld<St>(BV)) +
         sizeof(St) * (kC * (Dk + p) + kC * (kC + p) + kC * (BV + p)) + sizeof(float) * kC;
}

// O = Qs S + P Vnew for one chunk slot, value head and BV value columns (S: the state entering
// the chunk, from the chunk-state rows); rows < n written to o. Grid: one dimension, blocks in
// chunk-major order (slot, h, column block), so that with the overlap the blocks launch in the
// order the state pass finishes chunks. bf16 scratch: Qs S with S split
// into bf16 hi + lo (two products), or on the bf16 chunk states (S16: one product; S rounded to
// bf16, 2^-9 relative, enters only this chunk's inter-chunk term, nothing accumulates it), P Vnew
// on bf16 data (one product).
template <int BV, class St, bool S16>
__global__ void __launch_bounds__(kThreads) chunk_output_kernel(ChunkArgs a) {
  constexpr bool X3 = kX3<St>;
  static_assert(!(X3 && S16), "bf16 chunk states only with bf16 scratch");
  extern __shared__ float4 smem4[];
  const int Dk = a.Dk, Dv = a.Dv;
  constexpr int ldS = S16 ? BV + 8 : fp32_ld<St>(BV), ldP = kC + kPad<St>, ldV = BV + kPad<St>;
  const int ldX = Dk + kPad<St>;
  float* sS = reinterpret_cast<float*>(smem4);
  __nv_bfloat16* sS16 = reinterpret_cast<__nv_bfloat16*>(smem4);
  St* sQ = reinterpret_cast<St*>(S16 ? static_cast<void*>(sS16 + Dk * ldS)
                                     : static_cast<void*>(sS + Dk * ldS));
  St* sP = sQ + kC * ldX;
  St* sV = sP + kC * ldP;
  float* sfq = reinterpret_cast<float*>(sV + kC * ldV);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lg = lane >> 2, lc = lane & 3;
  const int nz = Dv / BV;
  const std::int64_t block = blockIdx.x;
  const std::int64_t slot = block / (std::int64_t(a.Hv) * nz);
  const int hz = static_cast<int>(block - slot * a.Hv * nz);
  const int h = hz / nz;
  const int col0 = (hz - h * nz) * BV;
  // Overlap: this grid may run while the state pass still does; one block waits for that grid
  // to complete, so that this grid's completion (what the stream's later work waits for) implies
  // the state pass's (its final state).
  if (a.progress && block == gridDim.x - 1) wait_prior_grids();
  std::int64_t n = 0;
  if (!slot_sequence(a, slot, n)) return;
  const SeqInfo seq = seq_info(a, n);
  const std::int64_t c = slot - seq.slot0;
  const std::int64_t t0 = seq.bos + c * kC;
  const int len = chunk_rows(seq, c);
  if (len == 0 || c >= seq.chunks) return;
  if (a.progress) {  // chunk c done by the state-pass blocks of these columns
    if (threadIdx.x == 0) {
      const int* f = a.progress + (n * a.Hv + h) * (Dv / a.state_bv) + col0 / a.state_bv;
      for (int z = 0; z < BV / a.state_bv; ++z)
        while (load_acquire(f + z) <= c) __nanosleep(200);
    }
    __syncthreads();
  }
  const std::int64_t pidx = slot * a.Hv + h;
  bool rows = false;  // row factors: sQ holds q rows, Qs = diag(fq) q
  if constexpr (!X3) rows = a.row_factors;
  if (rows) {
    if constexpr (!X3)
      copy_token_rows(sQ, ldX, a.q, a.q_sb, a.q_st, a.q_sh, seq.b, t0, h / a.group, len, Dk);
    copy_rows(sfq, kC, a.fq + pidx * kC, kC, 1, kC);
  } else {
    copy_rows(sQ, ldX, static_cast<const St*>(a.Qs) + pidx * kC * Dk, Dk, kC, Dk);
  }
  copy_rows(sP, ldP, static_cast<const St*>(a.P) + pidx * kC * kC, kC, kC, kC);
  copy_rows(sV, ldV, static_cast<const St*>(a.U) + pidx * kC * Dv + col0, Dv, kC, BV);
  if constexpr (S16)
    copy_rows(sS16, ldS, a.states16 + slot * a.saved_s0 + h * a.saved_s1 + col0, Dv, Dk, BV);
  else
    copy_rows(sS, ldS, a.saved + slot * a.saved_s0 + h * a.saved_s1 + col0, Dv, Dk, BV,
              a.states_vec);
  detail::cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  constexpr int vtiles = 4 * (BV / 16);
  if constexpr (S16) {
    if (rows) {  // bf16 states and q rows: fragments by ldmatrix, P V over the causal k steps
      static_assert(BV % 32 == 0, "tiles of 16 x 32");
      const __nv_bfloat16* q16 = reinterpret_cast<const __nv_bfloat16*>(sQ);
      const __nv_bfloat16* p16 = reinterpret_cast<const __nv_bfloat16*>(sP);
      const __nv_bfloat16* v16 = reinterpret_cast<const __nv_bfloat16*>(sV);
      const int a_row = lane & 15, a_col = 8 * (lane >> 4);
      const int b_row = (lane & 7) + 8 * ((lane >> 3) & 1), b_col = 8 * (lane >> 4);
      for (int t = warp; t < 4 * (BV / 32); t += kThreads / 32) {
        // Row blocks 3 - i for the second half of the tiles (P V's k steps balanced over warps).
        const int rb = ((t >> 3) & 1) ? 3 - (t & 3) : (t & 3), r0 = 16 * rb, j0 = 32 * (t >> 2);
        float acc[4][4] = {}, pv[4][4] = {};
        for (int k0 = 0; k0 < Dk; k0 += 16) {
          const uint4 qa = detail::ldmatrix_x4(q16 + (r0 + a_row) * ldX + a_col + k0);
          const uint4 b01 = detail::ldmatrix_x4_trans(sS16 + (k0 + b_row) * ldS + j0 + b_col);
          const uint4 b23 = detail::ldmatrix_x4_trans(sS16 + (k0 + b_row) * ldS + j0 + 16 + b_col);
          detail::mma_bf16_n32(acc, qa, b01, b23);
        }
        for (int kb = 0; kb <= rb; ++kb) {
          const int k0 = 16 * kb;
          const uint4 pa = detail::ldmatrix_x4(p16 + (r0 + a_row) * ldP + a_col + k0);
          const uint4 b01 = detail::ldmatrix_x4_trans(v16 + (k0 + b_row) * ldV + j0 + b_col);
          const uint4 b23 = detail::ldmatrix_x4_trans(v16 + (k0 + b_row) * ldV + j0 + 16 + b_col);
          detail::mma_bf16_n32(pv, pa, b01, b23);
        }
        store_output_tile<4>(a, seq, t0, h, col0 + j0, r0, len, sfq, acc, pv);
      }
      return;
    }
  }
  for (int t = warp; t < vtiles; t += kThreads / 32) {
    const int r0 = 16 * (t & 3), j0 = 16 * (t >> 2);
    float acc[2][4] = {};
    if constexpr (X3) {
      mma_tile<2, true>(
          acc, Dk, [&](int i, int k) { return sQ[(r0 + i) * ldX + k]; },
          [&](int k, int j) { return sS[k * ldS + j0 + j]; });
      mma_tile<2, true>(
          acc, kC, [&](int i, int k) { return sP[(r0 + i) * ldP + k]; },
          [&](int k, int j) { return sV[k * ldV + j0 + j]; });
    } else {
      if constexpr (S16)
        mma_tile_bf16<2, false>(
            acc, Dk, [&](int i, int k) { return load_pair(sQ + (r0 + i) * ldX + k); },
            [&](int k, int j) { return load_col_pair(sS16 + k * ldS + j0 + j, ldS); });
      else
        mma_tile_bf16<2, true>(
            acc, Dk, [&](int i, int k) { return load_pair(sQ + (r0 + i) * ldX + k); },
            [&](int k, int j) { return sS[k * ldS + j0 + j]; });
      if (rows) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] *= sfq[r0 + lg + 8 * (e >> 1)];
      }
      mma_tile_bf16<2, false>(
          acc, kC, [&](int i, int k) { return load_pair(sP + (r0 + i) * ldP + k); },
          [&](int k, int j) { return load_col_pair(sV + k * ldV + j0 + j, ldV); });
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + lg + 8 * (e >> 1), j = j0 + 8 * nt + 2 * lc + (e & 1);
        if (r < len)
          store_from_float(a.o, seq.b * a.o_sb + (t0 + r) * a.o_st + h * a.o_sh + col0 + j,
                           a.in_dtype, acc[nt][e]);
      }
  }
}

}  // namespace gdr::cuda::chunked
