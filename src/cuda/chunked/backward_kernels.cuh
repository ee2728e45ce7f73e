// Kernels of the chunked backward (docs/operator.md §4, C = 64; host side chunked_backward.cu).
// The chunk prep of the forward (chunked_kernels.cuh, chunk_prep_kernel with the backward's extra
// outputs) has left, per chunk slot and value head (p = slot * Hv + h), in fp32 scratch:
//   W = Tinv Kb, U, Qs = scale e .* Q, Kd = d .* K, P = scale lower(Gam .* Q K^T), gn = e^{G_n},
//   Tinv, KK = strict_lower(Gam .* K K^T), G (cumulative log decay), and per key head the
//   L2-normalised Q, K rows;
// the state pass of the forward (or bwd_vnew_kernel, given the forward's saved chunk states) has
// replaced U by Vnew = U - W S and the states S entering each chunk are in `states`.
// With e = e^G, d = e^{G_n - G}, beta, and dS the gradient of the state leaving the chunk:
//
// bwd_state_kernel, grid (N, Hv, Dv / BV), sequential over a sequence's chunks (last first), the
// dS slice [Dk, BV] in shared memory, from dfinal_state (or 0) to dh0:
//   dS -> dS record (slot, h)
//   dVnew = P^T dO + Kd dS                                 -> dVn scratch
//   dS   <- gn .* dS + Qs^T dO - W^T dVnew                 (docs/operator.md §4's dS_in)
// The columns of dS over Dv are independent (as the state's in the forward state pass).
//
// bwd_dvb_kernel, grid (slots, Hv), every chunk independent:
//   dVb = Tinv^T dVnew -> scratch;  dv = beta .* dVb -> dv
//   dMq = scale (dO Vnew^T) .* lower         (the upstream gradient of P / scale, diagonal kept)
//   dA  = -(dVb Vnew^T) .* strict_lower
//   dbeta partial: rowsum(dVb .* V) + rowsum(dA .* KK)
//
// bwd_key_kernel, grid (slots, Hv), every chunk independent; per value head (dq_hat, dk_hat
// summed over the group later, in a fixed order):
//   X1 = scale dO S^T,  dKb = -dVb S^T,  Y = Vnew dS^T                       [C, Dk]
//   dq_h = e .* X1 + dxq,   dk_h = beta e .* dKb + d .* Y + dxk + dyk
//   with the pairwise terms of M = Gam .* (X Y^T) (X = Q, Y = K, upstream dMq; X = Y = K,
//   upstream diag(beta) dA): dX += (dM .* Gam) Y, dY += (dM .* Gam)^T X, formed per key channel
//   i with Gam[r, j] = e^{G_r[i] - G_j[i]} (r >= j, exponent <= 0; one G for a scalar gate);
//   dbeta += rowsum(e .* dKb .* K);
//   dg per channel (summed over channels for a scalar gate), as src/cpu/chunkwise_backward.cpp:
//     dg_t = sum_{r >= t} dG_r + gn <S, dS>_i + sum_{r < t} d_r Y_r K_r
//            + sum_{r >= t} sum_{j < t} t[r, j],   dG_r = e_r (X1_r Q_r + beta_r dKb_r K_r),
//     t[r, j] = dM[r, j] Gam[r, j] X_r Y_j: no O(1) terms that cancel only in exact arithmetic,
//     so dg keeps its relative accuracy at g = -30. Per-key gate: by 16 x 16 blocks, off the
//     diagonal on the tensor cores through a reference row, the diagonal blocks elementwise
//     (bwd_key_kernel's phase 2).
//   Then the chain rules of the fused options (gate in kernel: dL/da = dg_log (-exp(A_log))
//   softplus'(a + dt_bias), partial sums of dA_log and ddt_bias per chunk; beta sigmoid).
//
// bwd_keygrad_kernel, grid (slots, Hk): dq_hat, dk_hat = sum over the key head's value heads in
//   order; the L2-norm backward (dx = (dx_hat - x_hat <x_hat, dx_hat>) / sqrt(|x|^2 + eps)).
// bwd_gate_param_kernel, grid (Hv): dA_log, ddt_bias = sum of the chunks' partials in slot order
//   (double).
// Every sum has a fixed order: the results are bitwise reproducible (no atomics).
// Products on the tensor cores (mma_tile, tf32; 3xTF32 for fp32 inputs); the per-key gate's
// diagonal blocks and the gate sums are fp32 FFMA (per-channel loops; the revcumsum in double).
#pragma once

#include "cuda/chunked/chunked_kernels.cuh"

namespace gdr::cuda::chunked {

// The forward's scratch pointers (void*: the forward's St) as the fp32 the backward's recompute
// writes (chunked_host.cuh launch_prep_fp32 / launch_state_pass_fp32).
__device__ __forceinline__ float* f32(void* p) {
  return static_cast<float*>(p);
}

struct BwdArgs {
  ChunkArgs c;  // inputs, options and the prep's scratch (chunked_common.cuh)
  // The states entering each chunk [slot, Hv, Dk * Dv] (k-first): saved or recomputed; fp32, or
  // bf16 (states16, the forward's bf16 saved record: S16 kernels widen them to fp32 as they read).
  const float* states;
  const __nv_bfloat16* states16;
  std::int64_t st_s0, st_s1;
  const void* dout;
  std::int64_t do_sb, do_st, do_sh;
  const float* dht;  // dfinal_state, like h0 (optional)
  std::int64_t dht_s0, dht_s1, dht_s2;
  float* dh0;
  std::int64_t dh0_s0, dh0_s1, dh0_s2;
  void* dq;
  void* dk;
  void* dv;
  void* dg;
  void* dbeta;
  std::int64_t dq_sb, dq_st, dq_sh, dk_sb, dk_st, dk_sh, dv_sb, dv_st, dv_sh;
  std::int64_t dg_sb, dg_st, dg_sh, db_sb, db_st, db_sh;
  float* dA_log;
  std::int64_t dA_log_s;
  float* ddt_bias;
  std::int64_t ddt_sh;
  // Scratch per item p = (slot - slot_base) * Hv + h (fp32 unless said): dS [Dk * Dv]; dVn, dVb [C,
  // Dv]; dMq, dA [C, C]; dbp [C]; yk, dbk [C, Dk]; gpart [1 + Wg] (double). dq_h, dk_h and the
  // per-channel dg reuse the prep's W, Qs and Kd (dead once the reverse pass is done).
  float* dS;
  float* dVn;
  float* dVb;
  float* dMq;
  float* dA;
  float* dbp;
  float* yk;
  float* dbk;
  double* gpart;  // [slots * Hv, 1 + Wg]: every slot, not only the window's
  // dS between two windows of the reverse pass, [N, Hv, Dk, Dv] (fp32, k-first); null with one
  // window.
  float* dS_carry;
  // DecodeOverrides::backward_phase_cycles (null: no timing).
  unsigned long long* phase_cycles;
  // bwd_chunk_bf16_kernel: L2 prefetches of the next phases' operands (chunked_backward_prefetch).
  bool prefetch_l2;
  // bwd_chunk_bf16_kernel: phase C's row sums by the whole block (chunked_backward_rows = 2)
  // instead of a thread per column / row and one thread for dg's recurrences.
  bool rows_by_block;
  // bwd_state_bf16_kernel writes dVnew as bf16 (its hi part, what bwd_chunk_bf16_kernel rounds it
  // to as it stages it) into dVn's region, dense [C][Dv] per item (chunked_backward_dvn = 2).
  bool dvn16;
  // The reverse pass on warpgroup products (bwd_state_wgmma_kernel.cuh) where its bf16 operands
  // are given (chunked_backward_fused = 6).
  bool state_wgmma;
};

__device__ __forceinline__ bool row_live(const ChunkArgs& a, const SeqInfo& seq, std::int64_t t0,
                                         int r, int len) {
  if (r >= len) return false;
  return a.mask == nullptr || a.mask[seq.b * a.mask_sb + (t0 + r) * a.mask_st] != 0;
}

// The chunk of a slot: its sequence, first token and length (false: surplus slot).
__device__ __forceinline__ bool slot_chunk(const ChunkArgs& a, std::int64_t slot, SeqInfo& seq,
                                           std::int64_t& t0, int& len) {
  std::int64_t n = 0;
  if (!slot_sequence(a, slot, n)) return false;
  seq = seq_info(a, n);
  const std::int64_t c = slot - seq.slot0;
  t0 = seq.bos + c * kC;
  len = chunk_rows(seq, c);
  return len > 0;
}

// The reverse pass's chunks of a sequence in the launch's window [slot_base, slot_end):
// c_lo .. c_hi - 1 (false: none of the sequence is in this window). A sequence without chunks
// belongs to the window that holds its slot0 (the last window's slot_end is past every slot, so
// exactly one does).
__device__ __forceinline__ bool window_chunks(const ChunkArgs& a, const SeqInfo& seq,
                                              std::int64_t& c_lo, std::int64_t& c_hi) {
  c_lo = a.slot_base > seq.slot0 ? a.slot_base - seq.slot0 : 0;
  c_hi = a.slot_end - seq.slot0 < seq.chunks ? a.slot_end - seq.slot0 : seq.chunks;
  return seq.chunks > 0 ? c_lo < c_hi : !(seq.slot0 < a.slot_base || seq.slot0 >= a.slot_end);
}

// dg of the scalar gate, shared by bwd_key_kernel and bwd_chunk_bf16_kernel:
//   dg_t = gn <S, dS> + sum_{r >= t} c1_r + sum_{r < t} (d Y k)_r + sum_{r >= t} sum_{j < t} Z[r,
//   j].
// z_column_suffix_sums (threads 0 .. C - 1): Z [C][ld] in place, z[t][j] = sum_{r >= t} Z[r, j].
__device__ __forceinline__ void z_column_suffix_sums(float* z, int ld) {
  if (threadIdx.x < kC) {
    const int j = threadIdx.x;
    float acc = 0.f;
    for (int r = kC - 1; r >= 0; --r) {
      acc += z[r * ld + j];
      z[r * ld + j] = acc;
    }
  }
}
// F_r = sum_{j < r} of row r of the suffix sums.
__device__ __forceinline__ float z_row_prefix(const float* z, int ld, int r) {
  float f = 0.f;
  for (int j = 0; j < r; ++j) f += z[r * ld + j];
  return f;
}
// One thread, in double and in row order: row[t] = gn sd + sum_{len > r >= t} c1_r +
// sum_{r < t} yk_r + F_t for t < len (rows past len: the caller's), sd = <S, dS> as the sum of its
// `nparts` partials in order; c1, yk, F at row stride ld.
__device__ __forceinline__ void dg_scalar_rows(float* row, const float* sd_parts, int nparts,
                                               float gn, const float* c1, const float* yk,
                                               const float* F, int ld, int len) {
  double sd = 0.0;
  for (int w = 0; w < nparts; ++w) sd += static_cast<double>(sd_parts[w]);
  double prefix = 0.0;  // sum_{r < t} yk_r
  for (int r = 0; r < kC; ++r) {
    row[r] = static_cast<float>(prefix);
    prefix += static_cast<double>(yk[r * ld]);
  }
  double rc = static_cast<double>(gn) * sd;
  for (int r = len - 1; r >= 0; --r) {
    rc += static_cast<double>(c1[r * ld]);
    row[r] = static_cast<float>(rc + static_cast<double>(row[r]) + static_cast<double>(F[r * ld]));
  }
}

// dO rows of the chunk (fp32, zero at rows that are not live), columns [col0, col0 + width),
// into shared rows of stride ld.
__device__ __forceinline__ void load_dout_rows(const BwdArgs& b, const SeqInfo& seq,
                                               std::int64_t t0, int len, int h, int col0, int width,
                                               float* dst, int ld) {
  const ChunkArgs& a = b.c;
  for (int e = threadIdx.x; e < kC * width; e += blockDim.x) {
    const int r = e / width, j = e - r * width;
    float x = 0.f;
    if (row_live(a, seq, t0, r, len))
      x = load_as_float(b.dout, seq.b * b.do_sb + (t0 + r) * b.do_st + h * b.do_sh + col0 + j,
                        a.in_dtype);
    dst[r * ld + j] = x;
  }
}

// Shared memory of bwd_state_kernel, in floats: sdS [Dk][BV + 8], sdO, sDV [C][BV + 8], sgn [Dk];
// staged (bwd_state_staged: the chunk's operands fit next to them) also sP [C][C + 4] and sKd,
// sQs, sW [C][Dk + 4].
inline std::size_t bwd_state_smem_bytes(int Dk, int BV, bool staged) {
  const std::size_t base = Dk * (BV + 8) + 2 * kC * (BV + 8) + Dk;
  return sizeof(float) * (base + (staged ? kC * (kC + 4) + 3 * kC * (Dk + 4) : 0));
}
// The operands P, Kd, Qs, W of a chunk are staged in shared memory (cp.async, one chunk ahead)
// when they fit within the opt-in limit of one block (Dk <= 128 at BV <= 32: 160 KB); else the
// kernel reads them from global memory (Dk = 256).
inline bool bwd_state_staged(int Dk, int BV, std::size_t smem_optin) {
  return bwd_state_smem_bytes(Dk, BV, true) <= smem_optin;
}

// Staged: per chunk c (last first) two groups of copies, each issued one phase ahead of its use:
// A(c) = P, Kd (read by the dVnew product) is issued once chunk c + 1's dVnew product is done,
// B(c) = Qs, W (read by the dS update) as chunk c starts, so both overlap the other phase's work.
template <int BV, bool X3, bool Staged>
__global__ void __launch_bounds__(kThreads) bwd_state_kernel(BwdArgs b) {
  const ChunkArgs& a = b.c;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int Dk = a.Dk, Dv = a.Dv;
  constexpr int ld = BV + 8;
  constexpr int ldP = kC + 4;
  const int ldX = Dk + 4;
  float* sdS = smem;
  float* sdO = sdS + Dk * ld;
  float* sDV = sdO + kC * ld;
  float* sgn = sDV + kC * ld;
  float* sP = sgn + Dk;  // staged only
  float* sKd = sP + kC * ldP;
  float* sQs = sKd + kC * ldX;
  float* sW = sQs + kC * ldX;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int lg = lane >> 2, lc = lane & 3;
  const std::int64_t n = blockIdx.x;
  const int h = blockIdx.y;
  const int col0 = blockIdx.z * BV;
  const SeqInfo seq = seq_info(a, n);
  std::int64_t c_lo, c_hi;  // the sequence's chunks in this launch's window
  if (!window_chunks(a, seq, c_lo, c_hi)) return;
  const bool from_dht = c_hi == seq.chunks;  // else dS leaving the window from the carry
  const bool to_dh0 = c_lo == 0;             // else dS entering the window to the carry
  auto item = [&](std::int64_t c) { return (seq.slot0 + c - a.slot_base) * a.Hv + h; };
  auto issue_A = [&](std::int64_t c) {
    copy_rows(sP, ldP, f32(a.P) + item(c) * kC * kC, kC, kC, kC);
    copy_rows(sKd, ldX, f32(a.Kd) + item(c) * kC * Dk, Dk, kC, Dk);
  };
  auto issue_B = [&](std::int64_t c) {
    copy_rows(sQs, ldX, f32(a.Qs) + item(c) * kC * Dk, Dk, kC, Dk);
    copy_rows(sW, ldX, f32(a.W) + item(c) * kC * Dk, Dk, kC, Dk);
  };
  if constexpr (Staged) {
    if (c_hi > c_lo) issue_A(c_hi - 1);
    detail::cp_async_commit();
  }
  // The carry: dS between windows, [N, Hv, Dk, Dv] k-first, this block's columns only.
  float* carry = b.dS_carry ? b.dS_carry + (n * a.Hv + h) * Dk * Dv + col0 : nullptr;
  for (int e = tid; e < Dk * BV; e += kThreads) {
    const int i = e / BV, j = e - i * BV;
    float s = 0.f;
    if (!from_dht) {
      s = carry[std::int64_t(i) * Dv + j];
    } else if (b.dht) {
      const std::int64_t base = n * b.dht_s0 + h * b.dht_s1;
      s = a.v_first ? b.dht[base + (col0 + j) * b.dht_s2 + i]
                    : b.dht[base + i * b.dht_s2 + col0 + j];
    }
    sdS[i * ld + j] = s;
  }
  for (std::int64_t c = c_hi - 1; c >= c_lo; --c) {
    const std::int64_t pidx = item(c);
    const std::int64_t t0 = seq.bos + c * kC;
    const std::int64_t rem = seq.len - c * kC;
    const int len = rem < kC ? static_cast<int>(rem) : kC;
    __syncthreads();  // the previous chunk's update of sdS, reads of sdO / sDV / sQs / sW
    if constexpr (Staged) {
      issue_B(c);
      detail::cp_async_commit();
    }
    {
      float* rec = b.dS + pidx * Dk * Dv;
      for (int e = tid; e < Dk * BV; e += kThreads) {
        const int i = e / BV, j = e - i * BV;
        rec[std::int64_t(i) * Dv + col0 + j] = sdS[i * ld + j];
      }
    }
    load_dout_rows(b, seq, t0, len, h, col0, BV, sdO, ld);
    for (int i = tid; i < Dk; i += kThreads) sgn[i] = a.per_key ? a.gn[pidx * Dk + i] : a.gn[pidx];
    if constexpr (Staged) cp_async_wait<1>();  // A(c)
    __syncthreads();
    // dVnew = P^T dO + Kd dS: tiles 16 x 16 of [C, BV].
    {
      const float* P = Staged ? sP : f32(a.P) + pidx * kC * kC;
      const float* Kd = Staged ? sKd : f32(a.Kd) + pidx * kC * Dk;
      const int lp = Staged ? ldP : kC, lk = Staged ? ldX : Dk;
      float* dVn = b.dVn + pidx * kC * Dv + col0;
      constexpr int tiles = 4 * (BV / 16);
      for (int t = warp; t < tiles; t += kThreads / 32) {
        const int r0 = 16 * (t & 3), j0 = 16 * (t >> 2);
        float acc[2][4] = {};
        mma_tile<2, X3>(
            acc, kC, [&](int i, int k) { return P[k * lp + r0 + i]; },
            [&](int k, int j) { return sdO[k * ld + j0 + j]; });
        mma_tile<2, X3>(
            acc, Dk, [&](int i, int k) { return Kd[(r0 + i) * lk + k]; },
            [&](int k, int j) { return sdS[k * ld + j0 + j]; });
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int r = r0 + lg + 8 * hf, j = j0 + 8 * nt + 2 * lc;
            const float2 v = make_float2(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
            *reinterpret_cast<float2*>(sDV + r * ld + j) = v;
            *reinterpret_cast<float2*>(dVn + std::int64_t(r) * Dv + j) = v;
          }
      }
    }
    __syncthreads();
    if constexpr (Staged) {
      if (c > c_lo) issue_A(c - 1);
      detail::cp_async_commit();
      cp_async_wait<1>();  // B(c)
      __syncthreads();
    }
    // dS <- gn .* dS + Qs^T dO - W^T dVnew: tiles 16 x 16 of [Dk, BV].
    {
      const float* Qs = Staged ? sQs : f32(a.Qs) + pidx * kC * Dk;
      const float* W = Staged ? sW : f32(a.W) + pidx * kC * Dk;
      const int lx = Staged ? ldX : Dk;
      const int tiles = (Dk / 16) * (BV / 16);
      for (int t = warp; t < tiles; t += kThreads / 32) {
        const int i0 = 16 * (t % (Dk / 16)), j0 = 16 * (t / (Dk / 16));
        float acc[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = i0 + lg + 8 * (e >> 1), j = j0 + 8 * nt + 2 * lc + (e & 1);
            acc[nt][e] = sgn[i] * sdS[i * ld + j];
          }
        mma_tile<2, X3>(
            acc, kC, [&](int i, int k) { return Qs[k * lx + i0 + i]; },
            [&](int k, int j) { return sdO[k * ld + j0 + j]; });
        mma_tile<2, X3>(
            acc, kC, [&](int i, int k) { return -W[k * lx + i0 + i]; },
            [&](int k, int j) { return sDV[k * ld + j0 + j]; });
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = i0 + lg + 8 * (e >> 1), j = j0 + 8 * nt + 2 * lc + (e & 1);
            sdS[i * ld + j] = acc[nt][e];
          }
      }
    }
  }
  if constexpr (Staged) cp_async_wait<0>();
  __syncthreads();
  if (!to_dh0) {
    for (int e = tid; e < Dk * BV; e += kThreads) {
      const int i = e / BV, j = e - i * BV;
      carry[std::int64_t(i) * Dv + j] = sdS[i * ld + j];
    }
  } else if (b.dh0) {
    for (int e = tid; e < Dk * BV; e += kThreads) {
      const int i = e / BV, j = e - i * BV;
      const std::int64_t base = n * b.dh0_s0 + h * b.dh0_s1;
      const float s = sdS[i * ld + j];
      if (a.v_first)
        b.dh0[base + (col0 + j) * b.dh0_s2 + i] = s;
      else
        b.dh0[base + i * b.dh0_s2 + col0 + j] = s;
    }
  }
}

// Vnew = U - W S over U, every chunk independent (the forward's saved chunk states given: no state
// pass). Grid (slots, Hv, Dv / 64).
// The state S of a chunk as fp32 at element e of its record: fp32 rows, or bf16 rows (S16).
template <bool S16>
struct StateRow {
  const float* f;
  const __nv_bfloat16* h;
  __device__ __forceinline__ StateRow(const BwdArgs& b, std::int64_t slot, int h_, int col0) {
    const std::int64_t off = slot * b.st_s0 + h_ * b.st_s1 + col0;
    f = S16 ? nullptr : b.states + off;
    h = S16 ? b.states16 + off : nullptr;
  }
  __device__ __forceinline__ float operator[](std::int64_t e) const {
    if constexpr (S16)
      return __bfloat162float(h[e]);
    else
      return f[e];
  }
};

template <bool X3, bool S16>
__global__ void __launch_bounds__(kThreads) bwd_vnew_kernel(BwdArgs b) {
  const ChunkArgs& a = b.c;
  const int Dk = a.Dk, Dv = a.Dv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lg = lane >> 2, lc = lane & 3;
  const std::int64_t wslot = blockIdx.x;  // within the window (scratch items)
  const std::int64_t slot = a.slot_base + wslot;
  const int h = blockIdx.y;
  const int col0 = blockIdx.z * 64;
  SeqInfo seq;
  std::int64_t t0;
  int len;
  if (!slot_chunk(a, slot, seq, t0, len)) return;
  const std::int64_t pidx = wslot * a.Hv + h;
  const float* W = f32(a.W) + pidx * kC * Dk;
  const StateRow<S16> S(b, slot, h, col0);
  float* U = f32(a.U) + pidx * kC * Dv + col0;
  for (int t = warp; t < 16; t += kThreads / 32) {
    const int r0 = 16 * (t & 3), j0 = 16 * (t >> 2);
    float acc[2][4] = {};
    mma_tile<2, X3>(
        acc, Dk, [&](int i, int k) { return W[(r0 + i) * Dk + k]; },
        [&](int k, int j) { return S[std::int64_t(k) * Dv + j0 + j]; });
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + lg + 8 * (e >> 1), j = j0 + 8 * nt + 2 * lc + (e & 1);
        U[r * Dv + j] -= acc[nt][e];
      }
  }
}

// Shared memory of bwd_dvb_kernel, in floats: sdO [C][Dv + 4].
inline std::size_t bwd_dvb_smem_bytes(int Dv) {
  return sizeof(float) * kC * (Dv + 4);
}

template <bool X3>
__global__ void __launch_bounds__(kThreads) bwd_dvb_kernel(BwdArgs b) {
  const ChunkArgs& a = b.c;
  extern __shared__ float4 smem4[];
  float* sdO = reinterpret_cast<float*>(smem4);
  const int Dv = a.Dv;
  const int ld = Dv + 4;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int lg = lane >> 2, lc = lane & 3;
  const std::int64_t wslot = blockIdx.x;  // within the window (scratch items)
  const std::int64_t slot = a.slot_base + wslot;
  const int h = blockIdx.y;
  SeqInfo seq;
  std::int64_t t0;
  int len;
  if (!slot_chunk(a, slot, seq, t0, len)) return;
  const std::int64_t pidx = wslot * a.Hv + h;
  load_dout_rows(b, seq, t0, len, h, 0, Dv, sdO, ld);
  __syncthreads();
  const float* Ti = a.Tinv_out + pidx * kC * kC;
  const float* dVn = b.dVn + pidx * kC * Dv;
  const float* Vn = f32(a.U) + pidx * kC * Dv;
  float* dVb = b.dVb + pidx * kC * Dv;
  // dVb = Tinv^T dVnew; dv = beta .* dVb.
  const int tiles = 4 * (Dv / 16);
  for (int t = warp; t < tiles; t += kThreads / 32) {
    const int r0 = 16 * (t & 3), j0 = 16 * (t >> 2);
    float acc[2][4] = {};
    mma_tile<2, X3>(
        acc, kC, [&](int i, int k) { return Ti[k * kC + r0 + i]; },
        [&](int k, int j) { return dVn[k * Dv + j0 + j]; });
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + lg + 8 * (e >> 1), j = j0 + 8 * nt + 2 * lc + (e & 1);
        dVb[r * Dv + j] = acc[nt][e];
        if (b.dv && r < len) {
          float x = 0.f;
          if (row_live(a, seq, t0, r, len)) {
            float beta = load_as_float(
                a.beta, seq.b * a.beta_sb + (t0 + r) * a.beta_st + h * a.beta_sh, a.beta_dtype);
            if (a.beta_sigmoid) beta = 1.f / (1.f + expf(-beta));
            x = beta * acc[nt][e];
          }
          store_from_float(b.dv, seq.b * b.dv_sb + (t0 + r) * b.dv_st + h * b.dv_sh + j, a.in_dtype,
                           x);
        }
      }
  }
  __syncthreads();
  // dMq = scale (dO Vnew^T) .* lower, dA = -(dVb Vnew^T) .* strict_lower: 16 tiles each.
  for (int t = warp; t < 32; t += kThreads / 32) {
    const int which = t >> 4, tt = t & 15;
    const int r0 = 16 * (tt & 3), j0 = 16 * (tt >> 2);
    float acc[2][4] = {};
    if (j0 <= r0 + 15) {
      if (which == 0)
        mma_tile<2, X3>(
            acc, Dv, [&](int i, int k) { return sdO[(r0 + i) * ld + k]; },
            [&](int k, int j) { return Vn[(j0 + j) * Dv + k]; });
      else
        mma_tile<2, X3>(
            acc, Dv, [&](int i, int k) { return dVb[(r0 + i) * Dv + k]; },
            [&](int k, int j) { return Vn[(j0 + j) * Dv + k]; });
    }
    float* out = (which == 0 ? b.dMq : b.dA) + pidx * kC * kC;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + lg + 8 * (e >> 1), j = j0 + 8 * nt + 2 * lc + (e & 1);
        out[r * kC + j] =
            which == 0 ? (j <= r ? a.scale * acc[nt][e] : 0.f) : (j < r ? -acc[nt][e] : 0.f);
      }
  }
  __syncthreads();
  // dbeta partial per row: rowsum(dVb .* V) + rowsum(dA .* KK), in a fixed order.
  if (tid < kC) {
    const int r = tid;
    float s = 0.f;
    if (row_live(a, seq, t0, r, len)) {
      const std::int64_t voff = seq.b * a.v_sb + (t0 + r) * a.v_st + h * a.v_sh;
      for (int j = 0; j < Dv; ++j) s += dVb[r * Dv + j] * load_as_float(a.v, voff + j, a.in_dtype);
      const float* dA = b.dA + pidx * kC * kC + r * kC;
      const float* KK = a.KK_out + pidx * kC * kC + r * kC;
      for (int j = 0; j < r; ++j) s += dA[j] * KK[j];
    }
    b.dbp[pidx * kC + r] = s;
  }
}

// Shared memory of bwd_key_kernel: sChan [Wg] double (per-channel dA_log parts), then floats:
// sdO [C][Dv + 4] (per-key: [C][max(Dk, Dv) + 4], then sBC [C][Dk + 4]), sMq, sMk [C][C + 1],
// sG [C][1] or [C][Dk + 4] (per-key), sBeta [C], sRow [C] (per-row dg, scalar gate); per-key also
// sTot [6][Dk] (the off-diagonal blocks' sums);
// scalar gate also: sZ [C][C + 1], sPart [3][C][Dk / 16] (row sums of the tiles), sDb [C] (row
// sums for dbeta), sRed [kThreads / 32] (the warps' parts of <S, dS>).
inline std::size_t bwd_key_smem_bytes(int Dk, int Dv, bool per_key) {
  const int wg = per_key ? Dk : 1, ldG = per_key ? Dk + 4 : 1;
  const int rows = (per_key && Dk > Dv ? Dk : Dv) + 4;
  const std::size_t extra =
      per_key ? std::size_t(6) * Dk
              : std::size_t(kC) * (kC + 1) + 3 * kC * (Dk / 16) + kC + kThreads / 32;
  return sizeof(double) * ((wg + 1) / 2 * 2) +
         sizeof(float) * (kC * rows + 2 * kC * (kC + 1) + kC * ldG + 2 * kC + extra);
}

__device__ __forceinline__ float softplus_grad(float x) {
  return x > 20.f ? 1.f : 1.f / (1.f + expf(-x));
}

// dbeta of row r through the fused beta sigmoid (beta = sigmoid(raw): d raw = dbeta s (1 - s));
// db as it is without the option.
__device__ __forceinline__ float beta_chain(const ChunkArgs& a, const SeqInfo& seq, std::int64_t t0,
                                            int r, int h, float db) {
  if (!a.beta_sigmoid) return db;
  const float raw =
      load_as_float(a.beta, seq.b * a.beta_sb + (t0 + r) * a.beta_st + h * a.beta_sh, a.beta_dtype);
  const float s = 1.f / (1.f + expf(-raw));
  return db * (s * (1.f - s));
}

// The gate's gradient at one (row, channel) (g's offset goff) through the gate in kernel (g = -exp(
// A_log) softplus(a + dt_bias): da = dg negA softplus'(a + bias), negA = -exp(A_log)), with the
// entry's terms of dA_log and ddt_bias added to dA, ddt; dg as it is without the option.
__device__ __forceinline__ float gate_chain(const ChunkArgs& a, std::int64_t goff, float dgl,
                                            float negA, float bias, double& dA, double& ddt) {
  if (!a.gate_in_kernel) return dgl;
  const float x = load_as_float(a.g, goff, a.g_dtype) + bias;
  const float out = dgl * negA * softplus_grad(x);
  dA += static_cast<double>(dgl) * static_cast<double>(negA * softplus(x));
  ddt += static_cast<double>(out);
  return out;
}

template <bool PerKey, bool X3, bool S16>
__global__ void __launch_bounds__(kThreads, PerKey ? 2 : 1) bwd_key_kernel(BwdArgs b) {
  const ChunkArgs& a = b.c;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int Dk = a.Dk, Dv = a.Dv;
  constexpr int ldM = kC + 1;
  const int wg = PerKey ? Dk : 1;
  const int ldG = PerKey ? Dk + 4 : 1;  // sG row stride (per-key rows padded: distinct banks)
  const int ld = Dv + 4;
  double* sChan = reinterpret_cast<double*>(smem4);
  float* sdO = smem + 2 * ((wg + 1) / 2 * 2);
  float* sMq = sdO + kC * ((PerKey && Dk > Dv ? Dk : Dv) + 4);
  float* sMk = sMq + kC * ldM;
  float* sG = sMk + kC * ldM;
  float* sBeta = sG + kC * ldG;
  float* sRow = sBeta + kC;
  float* sTot = sRow + kC;  // per-key: [6][Dk]
  // Scalar gate only (bwd_key_smem_bytes):
  float* sZ = sRow + kC;
  const int parts = Dk / 16;
  float* sPart = sZ + kC * ldM;  // [3][C][parts]: c1, yk, dbk row sums per 16-column tile
  float* sDb = sPart + 3 * kC * parts;
  float* sRed = sDb + kC;
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
  const std::int64_t gidx = slot * a.Hv + h;  // gpart holds every slot (summed at the end)
  const std::int64_t kidx = (wslot * a.Hk + hk) * kC * Dk;
  const float* Qn = a.Qn_out + kidx;
  const float* Kn = a.Kn_out + kidx;
  const StateRow<S16> S(b, slot, h, 0);
  const float* dS = b.dS + pidx * Dk * Dv;
  const float* Vn = f32(a.U) + pidx * kC * Dv;
  const float* dVb = b.dVb + pidx * kC * Dv;
  float* dqh = f32(a.W) + pidx * kC * Dk;
  float* dkh = f32(a.Qs) + pidx * kC * Dk;
  float* dgc = f32(a.Kd) + pidx * kC * Dk;
  float* yk = b.yk + pidx * kC * Dk;
  float* dbk = b.dbk + pidx * kC * Dk;

  load_dout_rows(b, seq, t0, len, h, 0, Dv, sdO, ld);
  if (tid < kC) {
    float beta = 0.f;
    if (row_live(a, seq, t0, tid, len)) {
      beta = load_as_float(a.beta, seq.b * a.beta_sb + (t0 + tid) * a.beta_st + h * a.beta_sh,
                           a.beta_dtype);
      if (a.beta_sigmoid) beta = 1.f / (1.f + expf(-beta));
    }
    sBeta[tid] = beta;
  }
  for (int e = tid; e < kC * wg; e += kThreads)
    sG[PerKey ? (e / Dk) * ldG + e % Dk : e] = a.G_out[pidx * kC * wg + e];
  __syncthreads();
  for (int e = tid; e < kC * kC; e += kThreads) {
    const int r = e / kC, j = e - r * kC;
    sMq[r * ldM + j] = b.dMq[pidx * kC * kC + e];
    sMk[r * ldM + j] = sBeta[r] * b.dA[pidx * kC * kC + e];
  }

  if constexpr (!PerKey) {
    // Scalar gate: Gam[r, j] = e^{G_r - G_j} is the same for every key channel, so the pairwise
    // terms are products of [C, C] matrices: Mq' = dMq .* Gam, Mk' = diag(beta) dA .* Gam (lower;
    // zero past the chunk's rows and columns, as dMq and dA are).
    __syncthreads();
    for (int e = tid; e < kC * kC; e += kThreads) {
      const int r = e / kC, j = e - r * kC;
      const float gam = j <= r ? expf(sG[r] - sG[j]) : 0.f;
      sMq[r * ldM + j] *= gam;
      sMk[r * ldM + j] *= gam;
    }
  }

  // Phase 1: X1, dKb, Y on the tensor cores, tiles 16 x 16 of [C, Dk]; elementwise terms. Scalar
  // gate: also the pairwise terms dxq = Mq' K, dxk = Mk' K, dyk = Mq'^T Q + Mk'^T K of the same
  // tile, and the tile's row sums of c1 = e (X1 q + beta dKb k), d Y k and e dKb k (fixed order:
  // each lane's four columns, then the quad's lanes by shuffles) into sPart.
  __syncthreads();
  const int tiles = 4 * (Dk / 16);
  for (int t = warp; t < tiles; t += kThreads / 32) {
    const int r0 = 16 * (t & 3), i0 = 16 * (t >> 2);
    float x1[2][4] = {}, kb[2][4] = {}, y[2][4] = {};
    mma_tile<2, X3>(
        x1, Dv, [&](int i, int k) { return sdO[(r0 + i) * ld + k]; },
        [&](int k, int j) { return S[std::int64_t(i0 + j) * Dv + k]; });
    mma_tile<2, X3>(
        kb, Dv, [&](int i, int k) { return dVb[(r0 + i) * Dv + k]; },
        [&](int k, int j) { return S[std::int64_t(i0 + j) * Dv + k]; });
    mma_tile<2, X3>(
        y, Dv, [&](int i, int k) { return Vn[(r0 + i) * Dv + k]; },
        [&](int k, int j) { return dS[std::int64_t(i0 + j) * Dv + k]; });
    float dxq[2][4] = {}, dxk[2][4] = {}, dyk[2][4] = {};
    if constexpr (!PerKey) {
      mma_tile<2, X3>(
          dxq, kC, [&](int i, int k) { return sMq[(r0 + i) * ldM + k]; },
          [&](int k, int j) { return Kn[k * Dk + i0 + j]; });
      mma_tile<2, X3>(
          dxk, kC, [&](int i, int k) { return sMk[(r0 + i) * ldM + k]; },
          [&](int k, int j) { return Kn[k * Dk + i0 + j]; });
      mma_tile<2, X3>(
          dyk, kC, [&](int i, int k) { return sMq[k * ldM + r0 + i]; },
          [&](int k, int j) { return Qn[k * Dk + i0 + j]; });
      mma_tile<2, X3>(
          dyk, kC, [&](int i, int k) { return sMk[k * ldM + r0 + i]; },
          [&](int k, int j) { return Kn[k * Dk + i0 + j]; });
    }
    float rs[3][2] = {};  // row sums (rows lg, lg + 8) of c1, d Y k, e dKb k
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + lg + 8 * (e >> 1), i = i0 + 8 * nt + 2 * lc + (e & 1);
        const float G = sG[r * ldG + (PerKey ? i : 0)];
        const float Gn = sG[(kC - 1) * ldG + (PerKey ? i : 0)];
        const float eg = expf(G), d = expf(Gn - G);
        const float q = Qn[r * Dk + i], k = Kn[r * Dk + i], beta = sBeta[r];
        const float X1 = a.scale * x1[nt][e], dkb = -kb[nt][e], Y = y[nt][e];
        const int o = r * Dk + i;
        const float c1 = eg * (X1 * q + beta * dkb * k), ykv = d * Y * k, dbkv = eg * dkb * k;
        dqh[o] = eg * X1 + dxq[nt][e];
        dkh[o] = beta * eg * dkb + d * Y + dxk[nt][e] + dyk[nt][e];
        if constexpr (PerKey) {
          dgc[o] = c1;
          yk[o] = ykv;
          dbk[o] = dbkv;
        } else {
          rs[0][e >> 1] += c1;
          rs[1][e >> 1] += ykv;
          rs[2][e >> 1] += dbkv;
        }
      }
    if constexpr (!PerKey) {
#pragma unroll
      for (int w = 0; w < 3; ++w)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float x = rs[w][hr];
          x += __shfl_xor_sync(0xffffffffu, x, 1);
          x += __shfl_xor_sync(0xffffffffu, x, 2);
          if (lc == 0) sPart[(w * kC + r0 + lg + 8 * hr) * parts + i0 / 16] = x;
        }
    }
  }
  __syncthreads();

  if constexpr (!PerKey) {
    // Scalar gate, dg per row (docs: the per-channel form below summed over the channels):
    //   dg_t = gn <S, dS> + sum_{r >= t} c1_r + sum_{r < t} (d Y k)_r
    //          + sum_{r >= t} sum_{j < t} Z[r, j],   Z = Mq' .* (Q K^T) + Mk' .* (K K^T).
    // Z on the tensor cores (16 tiles of 16 x 16), <S, dS> by fixed-order partial sums.
    for (int t = warp; t < 16; t += kThreads / 32) {
      const int r0 = 16 * (t & 3), j0 = 16 * (t >> 2);
      float qk[2][4] = {}, kk[2][4] = {};
      mma_tile<2, X3>(
          qk, Dk, [&](int i, int k) { return Qn[(r0 + i) * Dk + k]; },
          [&](int k, int j) { return Kn[(j0 + j) * Dk + k]; });
      mma_tile<2, X3>(
          kk, Dk, [&](int i, int k) { return Kn[(r0 + i) * Dk + k]; },
          [&](int k, int j) { return Kn[(j0 + j) * Dk + k]; });
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = r0 + lg + 8 * (e >> 1), j = j0 + 8 * nt + 2 * lc + (e & 1);
          sZ[r * ldM + j] = sMq[r * ldM + j] * qk[nt][e] + sMk[r * ldM + j] * kk[nt][e];
        }
    }
    {
      float sd = 0.f;
      for (int e = tid; e < Dk * Dv; e += kThreads) sd += S[e] * dS[e];
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) sd += __shfl_xor_sync(0xffffffffu, sd, m);
      if (lane == 0) sRed[warp] = sd;
    }
    __syncthreads();
    z_column_suffix_sums(sZ, ldM);
    __syncthreads();
    if (tid < kC) {  // per row: F_t = sum_{j < t} (suffix sums), the tiles' row sums
      const int r = tid;
      const float f = z_row_prefix(sZ, ldM, r);
      float c1 = 0.f, ykr = 0.f, db = 0.f;
      for (int p = 0; p < parts; ++p) {
        c1 += sPart[(0 * kC + r) * parts + p];
        ykr += sPart[(1 * kC + r) * parts + p];
        db += sPart[(2 * kC + r) * parts + p];
      }
      sZ[r * ldM + kC] = f;  // column kC (the padding column) is free
      sMq[r * ldM + kC] = c1;
      sMk[r * ldM + kC] = ykr;
      sDb[r] = db;
    }
    __syncthreads();
    if (tid == 0) {  // the row recurrences in double, in order
      dg_scalar_rows(sRow, sRed, kThreads / 32, expf(sG[kC - 1]), sMq + kC, sMk + kC, sZ + kC, ldM,
                     len);
      for (int r = 0; r < kC; ++r)
        if (!row_live(a, seq, t0, r, len)) sRow[r] = 0.f;
    }
    __syncthreads();
  }

  // Phase 2 (per-key gate): the pairwise terms dxq, dxk, dyk and dg's double sums
  //   dgd[t, i] = sum_{r >= t} sum_{j < t} Z_i[r, j],  Z_i[r, j] = Gam_i[r, j] k_j[i] (Mq'[r, j]
  //   q_r[i] + Mk'[r, j] k_r[i]),  Gam_i[r, j] = e^{G_r[i] - G_j[i]}
  // by 16 x 16 blocks (R, J) of (r, j). For t in block T the rectangle {r >= t > j} splits into
  //   (a) r, j in T: elementwise (step B);
  //   (b) r in blocks > T, j in T, j < t: prefix over j of k_j[i] dyk_off[j, i] (the column sums
  //       of the blocks above T);
  //   (c) r in T, r >= t, j in blocks < T: suffix over r of q_r dxq_off + k_r dxk_off (the row
  //       sums of the blocks left of T);
  //   (d) r in blocks > T, j in blocks < T: whole blocks' sums (sTot), T = 1, 2 only.
  // Off the diagonal (step A) with the reference row p = 16 R (r >= p > j): Gam = e^{G_r - G_p}
  // e^{G_p - G_j}, both exponents <= 0, so the blocks are tensor-core products of rows scaled on
  // the fly. The same sums as a per-pair loop, reordered (tests/python/test_chunked_bwd_algebra.py
  // emulates this split in float64 against autograd and the per-pair sums). Every sum has a fixed
  // order; each (row, channel) has one writer per step.
  if constexpr (PerKey) {
    auto ex = [](float x) {  // x <= 0
      if constexpr (X3)
        return expf(x);
      else
        return __expf(x);
    };
    float* sBC = sdO;  // [C][ldB]: (b) + (c), then (a) added, then all of dgd (dead dO rows)
    const int ldB = Dk + 4;
    // Step A: task = (block B, 32-channel tile). As the row block (B > 0): dxq_off, dxk_off of
    // its rows (over J < B), the blocks' sums sTot, and (c); as the column block (B < 3):
    // dyk_off of its rows (over R > B) and (b).
    for (int task = warp; task < 4 * (Dk / 32); task += kThreads / 32) {
      const int B = task & 3, c0 = 32 * (task >> 2);
      const int rb = 16 * B;
      float ox[4][4] = {}, ok[4][4] = {}, oy[4][4] = {};
      for (int J = 0; J < B; ++J) {
        const int p = rb, jb = 16 * J;
        auto right = [&](int k, int j) {
          return Kn[(jb + k) * Dk + c0 + j] *
                 ex(sG[p * ldG + c0 + j] - sG[(jb + k) * ldG + c0 + j]);
        };
        float sx[4][4] = {}, sk[4][4] = {};
        mma_tile<4, X3>(
            sx, 16, [&](int i, int k) { return sMq[(rb + i) * ldM + jb + k]; }, right);
        mma_tile<4, X3>(
            sk, 16, [&](int i, int k) { return sMk[(rb + i) * ldM + jb + k]; }, right);
        float tot[4][2] = {};  // per column (nt, e & 1): sum over the block's rows
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = rb + lg + 8 * (e >> 1), i = c0 + 8 * nt + 2 * lc + (e & 1);
            const float f = ex(sG[r * ldG + i] - sG[p * ldG + i]);
            const float x = f * sx[nt][e], y = f * sk[nt][e];
            ox[nt][e] += x;
            ok[nt][e] += y;
            tot[nt][e & 1] += Qn[r * Dk + i] * x + Kn[r * Dk + i] * y;
          }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float v = tot[nt][c];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            if (lg == 0) sTot[(B * (B - 1) / 2 + J) * Dk + c0 + 8 * nt + 2 * lc + c] = v;
          }
      }
      for (int R = B + 1; R < 4; ++R) {
        const int p = 16 * R;
        float sy[4][4] = {};
        // Mq'^T (e^{G_r - G_p} q) + Mk'^T (e^{G_r - G_p} k) as one product over 32 k steps.
        mma_tile<4, X3>(
            sy, 32,
            [&](int i, int k) {
              return k < 16 ? sMq[(p + k) * ldM + rb + i] : sMk[(p + k - 16) * ldM + rb + i];
            },
            [&](int k, int j) {
              const int r = p + (k & 15), i = c0 + j;
              return (k < 16 ? Qn : Kn)[r * Dk + i] * ex(sG[r * ldG + i] - sG[p * ldG + i]);
            });
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = rb + lg + 8 * (e >> 1), i = c0 + 8 * nt + 2 * lc + (e & 1);
            oy[nt][e] += ex(sG[p * ldG + i] - sG[j * ldG + i]) * sy[nt][e];
          }
      }
      // (c): suffix sums over the block's rows of q dxq_off + k dxk_off; (b): exclusive prefix
      // sums of k dyk_off. Rows lg ("low") and lg + 8 ("high") of each column; scans over lg.
      auto suffix8 = [&](float x) {  // inclusive, over lg' >= lg
#pragma unroll
        for (int d = 1; d < 8; d <<= 1) {
          const float y = __shfl_down_sync(0xffffffffu, x, 4 * d);
          if (lg + d < 8) x += y;
        }
        return x;
      };
      auto prefix8 = [&](float x) {  // inclusive, over lg' <= lg
#pragma unroll
        for (int d = 1; d < 8; d <<= 1) {
          const float y = __shfl_up_sync(0xffffffffu, x, 4 * d);
          if (lg >= d) x += y;
        }
        return x;
      };
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int i = c0 + 8 * nt + 2 * lc + c;
          const int rlo = rb + lg, rhi = rlo + 8;
          float bc_lo = 0.f, bc_hi = 0.f;
          if (B > 0) {
            const float lo = Qn[rlo * Dk + i] * ox[nt][c] + Kn[rlo * Dk + i] * ok[nt][c];
            const float hi = Qn[rhi * Dk + i] * ox[nt][2 + c] + Kn[rhi * Dk + i] * ok[nt][2 + c];
            const float shi = suffix8(hi);
            const float total_hi = __shfl_sync(0xffffffffu, shi, lc);  // lane lg = 0
            bc_lo += suffix8(lo) + total_hi;
            bc_hi += shi;
          }
          if (B < 3) {
            const float lo = Kn[rlo * Dk + i] * oy[nt][c];
            const float hi = Kn[rhi * Dk + i] * oy[nt][2 + c];
            const float plo = prefix8(lo);
            const float total_lo = __shfl_sync(0xffffffffu, plo, 28 + lc);  // lane lg = 7
            bc_lo += plo - lo;
            bc_hi += prefix8(hi) - hi + total_lo;
          }
          sBC[rlo * ldB + i] = bc_lo;
          sBC[rhi * ldB + i] = bc_hi;
          if (B > 0) {
            dqh[rlo * Dk + i] += ox[nt][c];
            dqh[rhi * Dk + i] += ox[nt][2 + c];
          }
          dkh[rlo * Dk + i] += ok[nt][c] + oy[nt][c];
          dkh[rhi * Dk + i] += ok[nt][2 + c] + oy[nt][2 + c];
        }
    }
    __syncthreads();
    // Step B: the diagonal blocks elementwise, an item per (block, channel): (a) into sBC and the
    // blocks' own dxq, dxk, dyk (rows r, j in the block, j <= r; rows < len).
    for (int item = tid; item < 4 * Dk; item += kThreads) {
      const int B = item / Dk, i = item - B * Dk, rb = 16 * B;
      float Gd[16], kd[16], dyd[16], cs[16];
#pragma unroll
      for (int m = 0; m < 16; ++m) {
        Gd[m] = sG[(rb + m) * ldG + i];
        kd[m] = Kn[(rb + m) * Dk + i];
        dyd[m] = cs[m] = 0.f;
      }
#pragma unroll
      for (int rl = 15; rl >= 0; --rl) {
        const int r = rb + rl;
        if (r >= len) continue;
        const float qr = Qn[r * Dk + i], kr = kd[rl], Gr = Gd[rl];
        float dxq = 0.f, dxk = 0.f;
#pragma unroll
        for (int jl = 0; jl <= rl; ++jl) {
          const float E = ex(Gr - Gd[jl]);
          const float mq = sMq[r * ldM + rb + jl], mk = sMk[r * ldM + rb + jl];
          dxq += mq * E * kd[jl];
          dxk += mk * E * kd[jl];
          const float z = E * (mq * qr + mk * kr);
          dyd[jl] += z;
          if (jl < rl) cs[jl] += z * kd[jl];
        }
        float sa = 0.f;
#pragma unroll
        for (int jl = 0; jl < rl; ++jl) sa += cs[jl];
        sBC[r * ldB + i] += sa;
        dqh[r * Dk + i] += dxq;
        dkh[r * Dk + i] += dxk;
      }
#pragma unroll
      for (int m = 0; m < 16; ++m)
        if (rb + m < len) dkh[(rb + m) * Dk + i] += dyd[m];
    }
    __syncthreads();
    // Step C, per channel in row order: dgd += (d) + sum_{s < t} (d Y k)_s; then with gn_i
    // <S, dS>_i (row i of the state) the reverse cumulative sum of c1 in double (as before).
    for (int i = tid; i < Dk; i += kThreads) {
      const float d1 = sTot[1 * Dk + i] + sTot[3 * Dk + i];  // (R, J) = (2, 0), (3, 0)
      const float d2 = sTot[3 * Dk + i] + sTot[4 * Dk + i];  // (3, 0), (3, 1)
      float acc = 0.f;
      for (int t = 0; t < len; ++t) {
        const int T = t >> 4;
        sBC[t * ldB + i] += (T == 1 ? d1 : T == 2 ? d2 : 0.f) + acc;
        acc += yk[t * Dk + i];
      }
      float sd = 0.f;
      for (int j = 0; j < Dv; ++j) sd += S[std::int64_t(i) * Dv + j] * dS[std::int64_t(i) * Dv + j];
      double rc = static_cast<double>(expf(sG[(kC - 1) * ldG + i]) * sd);
      for (int r = len - 1; r >= 0; --r) {
        rc += static_cast<double>(dgc[r * Dk + i]);
        dgc[r * Dk + i] = static_cast<float>(rc + static_cast<double>(sBC[r * ldB + i]));
      }
    }
  }
  __syncthreads();

  // Phase 3: dbeta, dg (chain rules) per row; the gate parameters' partial sums.
  const float negA = a.gate_in_kernel ? -expf(a.A_log[h * a.A_log_s]) : 0.f;
  if (tid < kC) {
    const int r = tid;
    const bool live = row_live(a, seq, t0, r, len);
    if (r < len && b.dbeta) {
      float db = 0.f;
      if (live) {
        db = b.dbp[pidx * kC + r];
        if constexpr (PerKey) {
          for (int i = 0; i < Dk; ++i) db += dbk[r * Dk + i];
        } else {
          db += sDb[r];
        }
        db = beta_chain(a, seq, t0, r, h, db);
      }
      store_from_float(b.dbeta, seq.b * b.db_sb + (t0 + r) * b.db_st + h * b.db_sh, a.beta_dtype,
                       db);
    }
  }
  __syncthreads();
  // dg per (row, channel): thread per channel (scalar gate: channel 0 only), rows in order.
  for (int i = tid; i < wg; i += kThreads) {
    double ddt = 0.0, dA = 0.0;
    const float bias = a.gate_in_kernel && a.dt_bias ? a.dt_bias[h * a.dt_bias_sh + i] : 0.f;
    for (int r = 0; r < len; ++r) {
      const bool live = row_live(a, seq, t0, r, len);
      const float dgl = PerKey ? dgc[r * Dk + i] : sRow[r];
      const std::int64_t goff = seq.b * a.g_sb + (t0 + r) * a.g_st + h * a.g_sh + i;
      const float out = live ? gate_chain(a, goff, dgl, negA, bias, dA, ddt) : 0.f;
      if (b.dg)
        store_from_float(b.dg, seq.b * b.dg_sb + (t0 + r) * b.dg_st + h * b.dg_sh + i, a.g_dtype,
                         out);
    }
    if (a.gate_in_kernel) {
      b.gpart[gidx * (1 + wg) + 1 + i] = ddt;
      sChan[i] = dA;
    }
  }
  __syncthreads();
  if (a.gate_in_kernel && tid == 0) {
    double s = 0.0;
    for (int i = 0; i < wg; ++i) s += sChan[i];
    b.gpart[gidx * (1 + wg)] = s;
  }
}

// dq, dk of one chunk slot and key head: the group's value heads summed in order, then the
// L2-norm backward; a warp per row. Lane channels i = 4 lane + 128 (u / 4) + u % 4 (Dk a multiple
// of 4): the dq and dk rows of every value head are loaded (16 bytes per lane) before any is
// added, and a 16-bit gradient leaves as 8-byte stores where the row allows.
static __global__ void __launch_bounds__(kThreads) bwd_keygrad_kernel(BwdArgs b) {
  const ChunkArgs& a = b.c;
  const int Dk = a.Dk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t wslot = blockIdx.x;  // within the window (scratch items)
  const std::int64_t slot = a.slot_base + wslot;
  const int hk = blockIdx.y;
  SeqInfo seq;
  std::int64_t t0;
  int len;
  if (!slot_chunk(a, slot, seq, t0, len)) return;
  constexpr int kPer = 8;                       // Dk / 32 <= 8
  const float* src[2] = {f32(a.W), f32(a.Qs)};  // dq_hat, dk_hat of each value head
  void* const out[2] = {b.dq, b.dk};
  for (int r = warp; r < len; r += kThreads / 32) {
    const bool live = row_live(a, seq, t0, r, len);
    float gh[2][kPer];
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int u = 0; u < kPer; ++u) gh[w][u] = 0.f;
    for (int g = 0; g < a.group; ++g) {
      const std::int64_t row = (wslot * a.Hv + hk * a.group + g) * kC * Dk + r * Dk;
      float4 x[2][kPer / 4];
#pragma unroll
      for (int w = 0; w < 2; ++w)
#pragma unroll
        for (int u4 = 0; u4 < kPer / 4; ++u4) {
          const int i = 4 * lane + 128 * u4;
          x[w][u4] = out[w] != nullptr && i < Dk
                         ? *reinterpret_cast<const float4*>(src[w] + row + i)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
      for (int w = 0; w < 2; ++w)
#pragma unroll
        for (int u4 = 0; u4 < kPer / 4; ++u4) {
          gh[w][4 * u4] += x[w][u4].x, gh[w][4 * u4 + 1] += x[w][u4].y;
          gh[w][4 * u4 + 2] += x[w][u4].z, gh[w][4 * u4 + 3] += x[w][u4].w;
        }
    }
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      if (out[which] == nullptr) continue;
      float(&gw)[kPer] = gh[which];
      const std::int64_t ioff = which == 0 ? seq.b * a.q_sb + (t0 + r) * a.q_st + hk * a.q_sh
                                           : seq.b * a.k_sb + (t0 + r) * a.k_st + hk * a.k_sh;
      const std::int64_t ooff = which == 0 ? seq.b * b.dq_sb + (t0 + r) * b.dq_st + hk * b.dq_sh
                                           : seq.b * b.dk_sb + (t0 + r) * b.dk_st + hk * b.dk_sh;
      if (live && a.qk_l2norm) {
        const void* x = which == 0 ? a.q : a.k;
        float xv[kPer];
        float ss = 0.f;
#pragma unroll
        for (int u = 0; u < kPer; ++u) {
          const int i = 4 * lane + 128 * (u / 4) + u % 4;
          xv[u] = i < Dk ? load_as_float(x, ioff + i, a.in_dtype) : 0.f;
          ss += xv[u] * xv[u];
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
        const float rn = sqrtf(ss + a.eps);
        float dot = 0.f;
#pragma unroll
        for (int u = 0; u < kPer; ++u) dot += (xv[u] / rn) * gw[u];
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, m);
#pragma unroll
        for (int u = 0; u < kPer; ++u) gw[u] = (gw[u] - (xv[u] / rn) * dot) / rn;
      }
#pragma unroll
      for (int u4 = 0; u4 < kPer / 4; ++u4) {
        const int i = 4 * lane + 128 * u4;
        if (i >= Dk) continue;
        const float y[4] = {live ? gw[4 * u4] : 0.f, live ? gw[4 * u4 + 1] : 0.f,
                            live ? gw[4 * u4 + 2] : 0.f, live ? gw[4 * u4 + 3] : 0.f};
        store4_from_float(out[which], ooff + i, a.in_dtype, y);
      }
    }
  }
}

// dA_log [Hv], ddt_bias [Hv, Wg]: the chunks' partials summed in slot order (double).
static __global__ void __launch_bounds__(kThreads) bwd_gate_param_kernel(BwdArgs b) {
  const ChunkArgs& a = b.c;
  const int h = blockIdx.x;
  const int wg = a.per_key ? a.Dk : 1;
  for (int w = threadIdx.x; w < 1 + wg; w += kThreads) {
    double s = 0.0;
    for (std::int64_t slot = 0; slot < a.slots; ++slot)
      s += b.gpart[(slot * a.Hv + h) * (1 + wg) + w];
    if (w == 0) {
      if (b.dA_log) b.dA_log[h * b.dA_log_s] = static_cast<float>(s);
    } else if (b.ddt_bias) {
      b.ddt_bias[h * b.ddt_sh + (w - 1)] = static_cast<float>(s);
    }
  }
}

}  // namespace gdr::cuda::chunked
