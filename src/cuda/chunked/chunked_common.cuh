// Shared pieces of the chunked forward (chunked_forward.cu): the kernel arguments, element
// loads/stores by run-time dtype, the fused element-wise options (docs/operator.md §1; the same
// formulas as src/cpu/canonical.cpp), the (sequence, chunk) map of a chunk slot, and warp-level
// tensor-core tile products: on fp32 operands (mma.sync m16n8k8 tf32: one product per operand
// pair, or three (hi*hi + hi*lo + lo*hi) for fp32 inputs), and on bf16 operands (mma.sync
// m16n8k16: one product where both operands are bf16 data, two where the second is fp32 data
// split into bf16 hi + lo, src/cuda/common/mma_bf16.cuh).
//
// Scratch element type St: float for fp32 inputs (the 3xTF32 path), __nv_bfloat16 for f16 and
// bf16 inputs (W, U / Vnew, Qs, Kd, P rounded once to bf16, as FLA stores them; the state and the
// chunk states stay fp32).
//
// Chunk slots: slot s holds chunk c of sequence n, s = c0(n) + c with c0(n) = sum_{m<n}
// ceil(L_m / C); without varlen c0(n) = n ceil(T / C). Under varlen c0 is built on the device
// (chunk_table_kernel) into chunk_off [N + 1]; the grids are sized by the shape-only upper bound
// floor((T + N (C - 1)) / C) and surplus blocks exit. The slot is also the row of the saved
// chunk states (include/gdr/problem.h, saved_shape).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/mma_bf16.cuh"
#include "cuda/common/mma_tf32.cuh"
#include "cuda/common/sequences.cuh"
#include "cuda/common/wgmma_layout.h"

namespace gdr::cuda::chunked {

inline constexpr int kC = 64;  // chunk length (docs/operator.md §3's C)

struct ChunkArgs {
  // Token inputs ([B, T, Hk, Dk] q, k; [B, T, Hv, Dv] v, o; [B, T, Hv] or [B, T, Hv, Dk] g;
  // [B, T, Hv] beta; [B, T] mask), strides for (b, t, head).
  const void* q;
  const void* k;
  const void* v;
  const void* g;
  const void* beta;
  const std::uint8_t* mask;
  void* o;
  std::int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh, o_sb, o_st, o_sh;
  std::int64_t g_sb, g_st, g_sh, beta_sb, beta_st, beta_sh, mask_sb, mask_st;
  const float* A_log;
  std::int64_t A_log_s;
  const float* dt_bias;
  std::int64_t dt_bias_sh;
  const void* cu_seqlens;
  // h0 / final state rows (k-first [N, Hv, Dk, Dv] or v-first [N, Hv, Dv, Dk]), strides of the
  // first three dims; null: zeros / not stored.
  const float* h0;
  float* hout;
  std::int64_t h0_s0, h0_s1, h0_s2, hout_s0, hout_s1, hout_s2;
  // Chunk states [chunk rows, Hv, Dk * Dv] (k-first S entering each chunk; row = chunk slot),
  // strides of the first two dims: ForwardParams::saved when given, else scratch. Written by the
  // state pass, read by the output kernel. states_vec: 16-byte aligned rows (16-byte copies).
  float* saved;
  std::int64_t saved_s0, saved_s1;
  // 16-bit inputs without ForwardParams::saved: the chunk states in bf16 scratch instead (same
  // layout and strides as `saved`, which is then null), read only by the output kernel's
  // inter-chunk term (the state the pass carries stays fp32).
  __nv_bfloat16* states16;
  bool states_vec;
  std::int64_t B, T, N;
  std::int64_t slots;  // chunk slots (grid of the chunk kernel)
  // The window of chunk slots [slot_base, slot_end) of a launch over a part of the slots (the
  // backward runs its per-chunk kernels window by window, last first, so that its scratch is
  // sized per window): grid x = slot - slot_base, and scratch items are window-local, p =
  // (slot - slot_base) Hv + h. The forward: one window, slot_base 0 (slot_end past every slot).
  std::int64_t slot_base, slot_end;
  std::int64_t nc;  // chunks per batch row without varlen: ceil(T / C)
  int Hv, group, Dk, Dv;
  float scale, eps;
  int in_dtype, g_dtype, beta_dtype, cu_dtype;
  // 16-bit q, k, v whose rows start 16-byte aligned (data and the strides of the first three dims):
  // the prep kernel loads them 8 elements (16 bytes) at a time.
  bool rows16;
  // rows16 and the raw v rows fit in the prep kernel's shared memory (chunked_host.cuh
  // launch_prep_kernel): the prep kernel copies them with cp.async as it starts.
  bool v_prefetch;
  bool varlen, per_key, v_first, gate_in_kernel, beta_sigmoid, qk_l2norm;
  // Scratch, per (slot, value head) p = (slot - slot_base) * Hv + h, elements of the scratch type
  // St (float for fp32 inputs, bf16 for f16 / bf16 inputs): W [C, Dk], U [C, Dv] (overwritten by
  // Vnew in the state pass), Qs [C, Dk], Kd [C, Dk], P [C, C] at p * C * width; fp32 gn [Dk] or [1]
  // at p * (per_key ? Dk : 1).
  std::int64_t* chunk_off;  // varlen: [N + 1]
  void* W;
  void* U;
  void* Qs;
  void* Kd;
  void* P;
  float* gn;
  // Row factors (row_factors: scalar gate, bf16 inputs without a mask, q and k rows 16-byte
  // aligned): Qs and Kd are not stored; the kernels that need them read q, k (bf16) and use
  // Qs = diag(fq) q, Kd = diag(fk) k with fq_r = scale e^{G_r} / |q_r|, fk_r = e^{G_n - G_r} /
  // |k_r| (norms only with qk_l2norm; both 0 on rows past the chunk), fp32 [C] each per (slot,
  // head).
  bool row_factors;
  float* fq;
  float* fk;
  // The fused state pass (fused_pass_kernel.cuh; null otherwise): the bf16 prep writes, per
  // (slot, value head) p, T~ = Tinv diag(beta) (bf16 [C, C] at W + p * C * C) and ek = e^G / |k|
  // (fp32 [C] at ek + p * C; 0 past the chunk) instead of W and U; ek aliases U's scratch, which
  // the fused pass does not use.
  float* ek;
  // Segment split of the state pass (seg_chunks > 0; docs/cuda-chunked.md §Segments): sequence n
  // has nseg(n) = max(1, ceil(chunks(n) / seg_chunks)) segments of seg_chunks chunks (the last
  // shorter) at segment slots s0(n) .. s0(n) + nseg(n) - 1, s0(n) = sum_{m<n} nseg(m) (varlen:
  // seg_off [N + 1] built by chunk_table_kernel; else n nseg_fixed). seg_slots bounds the slots
  // (the grids). segmap [seg_slots, Hv, Dk, Dv + Dk]: a segment's end state from a zero start
  // (R, columns < Dv) and its transition from the identity (M, columns Dv ..): S_end = M S_start
  // + R. segstart [seg_slots, Hv, Dk, Dv]: the true start state of each segment but the first.
  // Overlap of the output kernel with the state pass (unsplit pass only): progress [N, Hv,
  // Dv / state_bv] counts the chunks each state-pass block has finished (its chunk-state rows and
  // Vnew written; zeroed before the pass, published with release semantics); the output kernel,
  // a programmatic dependent launch of the state pass, waits (acquire) until its chunk is done.
  // Null: the output kernel runs after the state pass.
  int* progress;
  int* progress_buf;  // scratch for progress, [N, Hv, Dv / 16] ints (the host's choice)
  int state_bv;
  int seg_chunks;
  std::int64_t seg_slots, nseg_fixed;
  std::int64_t* seg_off;
  float* segmap;
  float* segstart;
  // Backward only (null in the forward; chunked_backward.cu): prep also writes, per (slot, value
  // head) p, Tinv [C, C] and KK = strict_lower(Gam .* K K^T) [C, C] at p * C * C, the cumulative
  // log decay G [C, Dk or 1] at p * C * (Dk or 1); per (slot, key head) s * Hk + hk, the
  // L2-normalised Q, K rows [C, Dk] (by the group's first value head).
  float* Tinv_out;
  float* KK_out;
  float* G_out;
  float* Qn_out;
  float* Kn_out;
  // The bf16 prep's backward mode writes only the per-row norms (nq, nk: C floats at the start of
  // each key item of Qn_out, Kn_out) for bwd_chunk_bf16_kernel<.., RawQK>, which reads the raw q, k
  // rows (DecodeOverrides::chunked_backward_qk = 2).
  bool qk_norms_only;
  // Backward, the bf16 reverse pass's operands (null otherwise; chunked_backward.cu `op16`): the
  // bf16 prep's backward mode writes P, Kd, Qs only as bf16 (P16 [C, C], Kd16, Qs16 [C, Dk] dense
  // at p * C * width; its fp32 P, Kd, Qs are not written) and W both as fp32 (a.W) and as bf16
  // (W16), each rounded once to nearest from the fp32 value the fp32 scratch would hold: what
  // bwd_state_bf16_kernel<BV, false> rounds as it stages, so the gradients are bit-identical.
  __nv_bfloat16* P16;
  __nv_bfloat16* Kd16;
  __nv_bfloat16* Qs16;
  __nv_bfloat16* W16;
  int Hk;
  // Tinv's schedule in the prep kernels (tinv.cuh kTinvBy..: 1 by lanes, 2 by columns, the rule, 3
  // on the tensor cores; DecodeOverrides::chunked_tinv).
  int tinv_schedule;
  // The bf16 prep kernel's warpgroup-product form (prep_bf16_kernel.cuh Wg; DecodeOverrides::
  // chunked_prep = 3, Dk = Dv = 128).
  bool prep_wgmma;
  // Diagnostics, null but when DecodeOverrides::prep_phase_cycles is given: the prep kernel's
  // clock64 cycles per phase (phase_mark).
  unsigned long long* phase_cycles;
};

// Diagnostics (DecodeOverrides::backward_phase_cycles, prep_phase_cycles): thread 0 adds the
// cycles since the last mark to counter `phase` (a reduction, fire and forget); `last` lives in
// shared memory so that no register stays live across the kernel for it. Nothing happens when
// `cycles` is null.
__device__ __forceinline__ void phase_mark(unsigned long long* cycles, long long& last, int phase) {
  if (cycles == nullptr || threadIdx.x != 0) return;
  const long long now = clock64();
  if (phase >= 0) atomicAdd(cycles + phase, static_cast<unsigned long long>(now - last));
  last = now;
}

// DType codes (include/gdr/types.h): f32 0, f16 1, bf16 2.
__device__ __forceinline__ float load_as_float(const void* p, std::int64_t off, int dtype) {
  if (dtype == 0) return static_cast<const float*>(p)[off];
  if (dtype == 1) return __half2float(static_cast<const __half*>(p)[off]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
}

// The 8 16-bit elements (f16: dtype 1, bf16: 2) packed in u, as floats.
__device__ __forceinline__ void unpack8_as_float(const uint4 u, int dtype, float (&x)[8]) {
  const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    float2 f;
    if (dtype == 1)
      f = __half22float2(*reinterpret_cast<const __half2*>(&w[m]));
    else
      f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[m]));
    x[2 * m] = f.x, x[2 * m + 1] = f.y;
  }
}

// The 8 consecutive 16-bit elements at global p + off (16-byte aligned), as floats.
__device__ __forceinline__ void load8_as_float(const void* p, std::int64_t off, int dtype,
                                               float (&x)[8]) {
  unpack8_as_float(
      __ldg(reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(p) + off)), dtype, x);
}

// The 8 consecutive 16-bit elements at shared p (16-byte aligned), as floats.
__device__ __forceinline__ void smem8_as_float(const std::uint16_t* p, int dtype, float (&x)[8]) {
  unpack8_as_float(*reinterpret_cast<const uint4*>(p), dtype, x);
}

__device__ __forceinline__ void store_from_float(void* p, std::int64_t off, int dtype, float x) {
  if (dtype == 0)
    static_cast<float*>(p)[off] = x;
  else if (dtype == 1)
    static_cast<__half*>(p)[off] = __float2half_rn(x);
  else
    static_cast<__nv_bfloat16*>(p)[off] = __float2bfloat16_rn(x);
}

// Four consecutive elements at p + off: one 8-byte store for 16-bit types where the address is
// 8-byte aligned (the same roundings as four store_from_float calls), else element by element.
__device__ __forceinline__ void store4_from_float(void* p, std::int64_t off, int dtype,
                                                  const float (&x)[4]) {
  auto* e16 = static_cast<std::uint16_t*>(p) + off;
  if (dtype != 0 && (reinterpret_cast<std::uintptr_t>(e16) & 7) == 0) {
    uint2 w;
    if (dtype == 1) {
      const __half2 a = __floats2half2_rn(x[0], x[1]), c = __floats2half2_rn(x[2], x[3]);
      w.x = *reinterpret_cast<const std::uint32_t*>(&a),
      w.y = *reinterpret_cast<const std::uint32_t*>(&c);
    } else {
      const __nv_bfloat162 a = __floats2bfloat162_rn(x[0], x[1]),
                           c = __floats2bfloat162_rn(x[2], x[3]);
      w.x = *reinterpret_cast<const std::uint32_t*>(&a),
      w.y = *reinterpret_cast<const std::uint32_t*>(&c);
    }
    *reinterpret_cast<uint2*>(e16) = w;
    return;
  }
#pragma unroll
  for (int m = 0; m < 4; ++m) store_from_float(p, off + m, dtype, x[m]);
}

// A log decay of -inf is an exact decay to 0 (docs/operator.md §6), but -inf - (-inf) in the
// chunk-local differences G_r - G_j would be NaN. Below -kLogDecayFloor a gate is raised to it:
// exp of any sum containing that step is then exactly 0 in fp32 (e^-110 < 2^-149), and the
// cumulative sums stay of the magnitude strong decays reach anyway. NaN passes (false compare).
inline constexpr float kLogDecayFloor = 110.f;
__device__ __forceinline__ float floor_log_decay(float g) {
  return g < -kLogDecayFloor ? -kLogDecayFloor : g;
}

__device__ __forceinline__ float softplus(float x) {
  return x > 20.f ? x : log1pf(expf(x));
}

// One sequence: batch row b, tokens [bos, bos + len), its chunk slots [slot0, slot0 + chunks).
struct SeqInfo {
  std::int64_t b, bos, len, slot0, chunks;
};

// Rows of chunk c of the sequence: min(C, len - c C), 0 past its end.
__device__ __forceinline__ int chunk_rows(const SeqInfo& s, std::int64_t c) {
  const std::int64_t rem = s.len - c * kC;
  return rem < kC ? static_cast<int>(rem < 0 ? 0 : rem) : kC;
}

// Scratch elements: St is float (fp32 inputs) or __nv_bfloat16 (16-bit inputs).
template <class St>
inline constexpr bool kX3 = sizeof(St) == 4;  // fp32 scratch: the 3xTF32 products
template <class St>
__device__ __forceinline__ St to_scratch(float x) {
  if constexpr (sizeof(St) == 4)
    return x;
  else
    return __float2bfloat16_rn(x);
}
template <class St>
__device__ __forceinline__ float from_scratch(St x) {
  if constexpr (sizeof(St) == 4)
    return x;
  else
    return __bfloat162float(x);
}
// p[0] = x, p[1] = y (p 2-element aligned).
template <class St>
__device__ __forceinline__ void store_pair(St* p, float x, float y) {
  if constexpr (sizeof(St) == 4)
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
  else
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
// Whether p is aligned to a pair of St (then so is p + any even offset).
template <class St>
__device__ __forceinline__ bool pair_aligned(const St* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & (2 * sizeof(St) - 1)) == 0;
}
// p[0] = x, p[1] = y where p may be only element-aligned (a caller's strided row or record): one
// store where `aligned` (pair_aligned(p), usually hoisted from a row's or record's base), else one
// per element; the same roundings either way.
template <class St>
__device__ __forceinline__ void store_pair_any(St* p, float x, float y, bool aligned) {
  if (aligned) {
    store_pair(p, x, y);
  } else {
    p[0] = to_scratch<St>(x);
    p[1] = to_scratch<St>(y);
  }
}

// The row-factor path's output of one warp's mma tile, rows r0 + lg and r0 + lg + 8 (those < len)
// of the chunk starting at token t0, NT x 8 columns from column `col` of value head h:
// o = fq_r (q S)[r, j] + (P Vnew)[r, j], one fma, rounded to bf16. chunk_output_kernel and
// state_pass_bf16_kernel<BV, true> both store through it (their outputs are bit-identical).
template <int NT>
__device__ __forceinline__ void store_output_tile(const ChunkArgs& a, const SeqInfo& seq,
                                                  std::int64_t t0, int h, int col, int r0, int len,
                                                  const float* fq, const float (&qs)[NT][4],
                                                  const float (&pv)[NT][4]) {
  const int lane = threadIdx.x & 31, lg = lane >> 2, lc = lane & 3;
  __nv_bfloat16* o16 = static_cast<__nv_bfloat16*>(a.o);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = r0 + lg + 8 * hf;
    if (r >= len) continue;
    const float f = fq[r];
    __nv_bfloat16* orow = o16 + seq.b * a.o_sb + (t0 + r) * a.o_st + h * a.o_sh + col;
    const bool pairs = pair_aligned(orow);  // col is even
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)  // the pair (j, j + 1), j even
      store_pair_any(orow + 8 * nt + 2 * lc, __fmaf_rn(f, qs[nt][2 * hf], pv[nt][2 * hf]),
                     __fmaf_rn(f, qs[nt][2 * hf + 1], pv[nt][2 * hf + 1]), pairs);
  }
}

// The state slice of the sequential passes with the state in registers (state_pass_bf16_kernel,
// state_pass_wgmma_kernel, and the reverse passes' dS: bwd_state_bf16_kernel,
// bwd_state_wgmma_kernel): S[j][e] is row i0 + lg + 8 (e >> 1), column col0 + 8 j + 2 lc + (e & 1)
// (an mma accumulator fragment of the warp's 16 rows from i0) of a [Dk, Dv] state in global
// memory, element (i, col) at p[base + i * s2 + col] (k-first) or p[base + col * s2 + i]
// (v-first). load_state_slice: zeros where p is null; store_state_slice: nothing where p is null.
template <int J>
__device__ __forceinline__ void load_state_slice(const float* p, std::int64_t base, std::int64_t s2,
                                                 bool v_first, int col0, int i0, float (&S)[J][4]) {
  const int lane = threadIdx.x & 31, lg = lane >> 2, lc = lane & 3;
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = i0 + lg + 8 * (e >> 1), col = col0 + 8 * j + 2 * lc + (e & 1);
      S[j][e] = p ? (v_first ? p[base + col * s2 + i] : p[base + i * s2 + col]) : 0.f;
    }
}
template <int J>
__device__ __forceinline__ void store_state_slice(float* p, std::int64_t base, std::int64_t s2,
                                                  bool v_first, int col0, int i0,
                                                  const float (&S)[J][4]) {
  if (!p) return;
  const int lane = threadIdx.x & 31, lg = lane >> 2, lc = lane & 3;
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = i0 + lg + 8 * (e >> 1), col = col0 + 8 * j + 2 * lc + (e & 1);
      if (v_first)
        p[base + col * s2 + i] = S[j][e];
      else
        p[base + i * s2 + col] = S[j][e];
    }
}

// The state slice (load_state_slice's fragment, J = 4: 32 columns) published for the warpgroup
// products: S -> bf16 hi + lo (|S - hi - lo| <= 2^-18 |S|) into the tiles [Dk][32] at hi and lo
// (wgmma_layout.h); with rec, also S itself into the fp32 rows rec[i * ld + column].
__device__ __forceinline__ void publish_state_tiles(const float (&S)[4][4], int i0,
                                                    unsigned char* hi, unsigned char* lo,
                                                    float* rec, std::int64_t ld) {
  const int lane = threadIdx.x & 31, lg = lane >> 2, lc = lane & 3;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = i0 + lg + 8 * hf, col = 8 * j + 2 * lc;
      std::uint32_t h, l;
      detail::split_bf16(S[j][2 * hf], S[j][2 * hf + 1], h, l);
      *reinterpret_cast<std::uint32_t*>(hi + wgmma_layout::tile_offset(i, col, 32)) = h;
      *reinterpret_cast<std::uint32_t*>(lo + wgmma_layout::tile_offset(i, col, 32)) = l;
      if (rec) {
        rec[i * ld + col] = S[j][2 * hf];
        rec[i * ld + col + 1] = S[j][2 * hf + 1];
      }
    }
}

// cu_seqlens values are read on the device only, clamped (common/sequences.cuh).
__device__ __forceinline__ void seq_bounds(const ChunkArgs& a, std::int64_t n, std::int64_t& bos,
                                           std::int64_t& eos) {
  sequence_bounds(a.cu_seqlens, a.cu_dtype, n, a.T, bos, eos);
}

__device__ __forceinline__ SeqInfo seq_info(const ChunkArgs& a, std::int64_t n) {
  SeqInfo s;
  if (a.varlen) {
    std::int64_t eos;
    seq_bounds(a, n, s.bos, eos);
    s.b = 0;
    s.len = eos - s.bos;
    s.slot0 = a.chunk_off[n];
    const std::int64_t end = a.chunk_off[n + 1];
    s.chunks = end > s.slot0 ? end - s.slot0 : 0;
    const std::int64_t need = (s.len + kC - 1) / kC;
    if (s.chunks > need) s.chunks = need;
  } else {
    s.b = n;
    s.bos = 0;
    s.len = a.T;
    s.slot0 = n * a.nc;
    s.chunks = a.nc;
  }
  return s;
}

// Chunk slot -> sequence n (false: a surplus slot of the varlen upper bound, past the last chunk).
__device__ __forceinline__ bool slot_sequence(const ChunkArgs& a, std::int64_t slot,
                                              std::int64_t& n) {
  if (!a.varlen) {
    n = slot / a.nc;
    return true;
  }
  if (slot >= a.chunk_off[a.N]) return false;
  std::int64_t lo = 0, hi = a.N;  // largest n with chunk_off[n] <= slot
  while (lo < hi) {
    const std::int64_t mid = (lo + hi + 1) / 2;
    if (a.chunk_off[mid] <= slot)
      lo = mid;
    else
      hi = mid - 1;
  }
  n = lo;
  return true;
}

// Segment slot x -> sequence n, its segment j, the segment count of n and its first slot
// (false: a surplus slot of the bound seg_slots).
__device__ __forceinline__ bool segment_of(const ChunkArgs& a, std::int64_t x, std::int64_t& n,
                                           std::int64_t& j, std::int64_t& nseg,
                                           std::int64_t& first) {
  if (!a.varlen) {
    nseg = a.nseg_fixed;
    n = x / nseg;
    if (n >= a.N) return false;
    first = n * nseg;
    j = x - first;
    return true;
  }
  if (x >= a.seg_off[a.N]) return false;
  std::int64_t lo = 0, hi = a.N;  // largest n with seg_off[n] <= x
  while (lo < hi) {
    const std::int64_t mid = (lo + hi + 1) / 2;
    if (a.seg_off[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  n = lo;
  first = a.seg_off[n];
  nseg = a.seg_off[n + 1] - first;
  j = x - first;
  return true;
}

// Release / acquire of a progress counter at GPU scope (after a block barrier, the releasing
// thread's fence orders every thread's earlier writes of the block: CUTLASS's generic barrier).
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("fence.acq_rel.gpu;\n\tst.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v)
               : "memory");
}
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Programmatic dependent launch (sm_90): let the dependent grid launch / wait until the grids
// this one depends on have completed and their memory is visible.
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void wait_prior_grids() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// The overlap's progress counter of a state-pass block (sequence n, value head h, the column block
// blockIdx.z of BV columns), or null without the overlap; with it, the output kernel may launch
// once every block of the pass has started (programmatic dependent launch).
__device__ __forceinline__ int* state_pass_progress(const ChunkArgs& a, std::int64_t n, int h,
                                                    int BV) {
  if (!a.progress) return nullptr;
  launch_dependents();
  return a.progress + (n * a.Hv + h) * (a.Dv / BV) + blockIdx.z;
}

// cp.async: wait until at most N of this thread's committed groups are pending; 4-byte copy.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// 16 bytes global -> shared, or 16 zero bytes when !valid (src is not read then).
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(detail::smem_addr(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(detail::smem_addr(dst)), "l"(src)
               : "memory");
}

// Issues cp.async copies of `rows` rows of `width` elements (row stride src_ld elements in global
// memory) into shared rows of stride ld; vec: 16-byte copies (both sides 16-byte aligned), else
// 4-byte (4-byte elements only: 16-bit scratch rows are always 16-byte aligned). Completion:
// cp_async_wait + a barrier.
template <class E>
__device__ __forceinline__ void copy_rows(E* dst, int ld, const E* src, std::int64_t src_ld,
                                          int rows, int width, bool vec = true) {
  if constexpr (sizeof(E) == 4) {
    if (!vec) {
      for (int e = threadIdx.x; e < rows * width; e += blockDim.x) {
        const int r = e / width, i = e - r * width;
        cp_async4(dst + r * ld + i, src + r * src_ld + i);
      }
      return;
    }
  }
  constexpr int per = 16 / static_cast<int>(sizeof(E));
  const int wv = width / per;
  for (int e = threadIdx.x; e < rows * wv; e += blockDim.x) {
    const int r = e / wv, i = e - r * wv;
    detail::cp_async16(dst + r * ld + per * i, src + r * src_ld + per * i);
  }
}

// copy_rows with the shape known when compiling: a [Rows][Width] block of E (row stride src_ld
// elements) into shared rows of stride ld by threads 0 .. Threads - 1 of the block, 16 bytes per
// copy. Thread t copies 16-byte column t % wv (wv = 16-byte columns per row) of rows
// t / wv + i Threads / wv, so that its offsets are loop invariants: a copy costs a few
// instructions where copy_rows' runtime shape and stride spend ~20 on the index arithmetic (SASS,
// sm_90a; the bf16 state pass issues ~15 copies per thread and chunk).
template <int Rows, int Width, int Threads, class E>
__device__ __forceinline__ void copy_block(E* dst, int ld, const E* src, std::int64_t src_ld) {
  constexpr int per = 16 / static_cast<int>(sizeof(E)), wv = Width / per, units = Rows * wv;
  static_assert(Width % per == 0 && Threads % wv == 0, "whole rows per round of copies");
  static_assert(units % Threads == 0 || units < Threads, "every thread copies as many units");
  const unsigned t = threadIdx.x;
  if (units < Threads && t >= static_cast<unsigned>(units)) return;
  const int r = static_cast<int>(t / wv), col = per * static_cast<int>(t % wv);
#pragma unroll
  for (int i = 0; i < (units + Threads - 1) / Threads; ++i) {
    const int row = r + i * (Threads / wv);
    detail::cp_async16(dst + row * ld + col, src + row * src_ld + col);
  }
}

// copy_token_rows the same way: C token rows of Width 16-bit elements (rows >= len zeros).
template <int Width, int Threads>
__device__ __forceinline__ void copy_token_block(__nv_bfloat16* dst, int ld, const void* src,
                                                 std::int64_t sb, std::int64_t st, std::int64_t sh,
                                                 std::int64_t b, std::int64_t t0, int hk, int len) {
  constexpr int wv = Width / 8, units = kC * wv;
  static_assert(Width % 8 == 0 && Threads % wv == 0 && units % Threads == 0, "whole rounds");
  const __nv_bfloat16* base = static_cast<const __nv_bfloat16*>(src) + b * sb + hk * sh + t0 * st;
  const unsigned t = threadIdx.x;
  const int r = static_cast<int>(t / wv), col = 8 * static_cast<int>(t % wv);
#pragma unroll
  for (int i = 0; i < units / Threads; ++i) {
    const int row = r + i * (Threads / wv);
    const bool valid = row < len;
    cp_async16_zfill(dst + row * ld + col, valid ? base + row * st + col : base, valid);
  }
}

// cp.async copies of C rows of a 16-bit token input (q or k of key head hk: Dk elements per row,
// rows t0 .. t0 + len - 1 of batch row b) into shared rows of stride ld; rows >= len are zeros.
// Needs 16-byte aligned rows (ChunkArgs::row_factors).
__device__ __forceinline__ void copy_token_rows(__nv_bfloat16* dst, int ld, const void* src,
                                                std::int64_t sb, std::int64_t st, std::int64_t sh,
                                                std::int64_t b, std::int64_t t0, int hk, int len,
                                                int Dk) {
  const __nv_bfloat16* base = static_cast<const __nv_bfloat16*>(src) + b * sb + hk * sh;
  const int wv = Dk / 8;
  for (int e = threadIdx.x; e < kC * wv; e += blockDim.x) {
    const int r = e / wv, i = e - r * wv;
    const bool valid = r < len;
    cp_async16_zfill(dst + r * ld + 8 * i, valid ? base + (t0 + r) * st + 8 * i : base, valid);
  }
}

// The same copies into warpgroup-product tiles (wgmma_layout.h): a bf16 block [rows][cols] (row
// stride src_ld elements; copy_tile) or C token rows as copy_token_rows reads them
// (copy_token_tile; rows >= len are zeros) by Threads threads, t the caller's index among them
// (threadIdx.x unless a part of the block copies; C rows: shapes known when compiling), unit u of
// the tile to byte 16 u so that consecutive threads write consecutive bytes. Completion:
// cp_async_wait (or an mbarrier the copies arrive on), fence_proxy_async (mma_tf32.cuh: the
// products read through the async proxy), a barrier.

// The unit that thread t copies in round i (unit t + i Threads, tile_unit): with whole bands per
// round (Threads a multiple of Cols) the same column group, rows 8 i Threads / Cols apart, so that
// its offsets are loop invariants (as copy_block's).
template <int Cols, int Threads>
__device__ __forceinline__ wgmma_layout::Unit tile_copy_unit(unsigned t, int i) {
  static_assert(Threads % Cols == 0 || Cols % Threads == 0, "whole bands or parts of one");
  if constexpr (Threads % Cols == 0) {
    const wgmma_layout::Unit p = wgmma_layout::tile_unit(static_cast<int>(t), Cols);
    return {p.row + i * (8 * Threads / Cols), p.col};
  } else {
    return wgmma_layout::tile_unit(static_cast<int>(t) + i * Threads, Cols);
  }
}
template <int Cols, int Threads = 256>
__device__ __forceinline__ void copy_tile(unsigned char* tile, const __nv_bfloat16* src,
                                          std::int64_t src_ld, unsigned t = threadIdx.x) {
  constexpr int units = kC * Cols / 8;
  static_assert(units % Threads == 0, "whole rounds of copies");
#pragma unroll
  for (int i = 0; i < units / Threads; ++i) {
    const wgmma_layout::Unit p = tile_copy_unit<Cols, Threads>(t, i);
    detail::cp_async16(tile + 16 * (t + i * Threads), src + p.row * src_ld + p.col);
  }
}
template <int Cols, int Threads = 256>
__device__ __forceinline__ void copy_token_tile(unsigned char* tile, const void* src,
                                                std::int64_t sb, std::int64_t st, std::int64_t sh,
                                                std::int64_t b, std::int64_t t0, int hk, int len,
                                                unsigned t = threadIdx.x) {
  constexpr int units = kC * Cols / 8;
  static_assert(units % Threads == 0, "whole rounds of copies");
  const __nv_bfloat16* base = static_cast<const __nv_bfloat16*>(src) + b * sb + hk * sh + t0 * st;
#pragma unroll
  for (int i = 0; i < units / Threads; ++i) {
    const wgmma_layout::Unit p = tile_copy_unit<Cols, Threads>(t, i);
    const bool valid = p.row < len;
    cp_async16_zfill(tile + 16 * (t + i * Threads), valid ? base + p.row * st + p.col : base,
                     valid);
  }
}

// A surplus chunk slot (varlen: past the last sequence's chunks) zeroes its chunk-state row
// (slot, h) in the record the forward writes: fp32 `saved` or bf16 `states16` (neither: the
// backward reading the caller's records). Called by every thread of the block.
__device__ __forceinline__ void zero_surplus_state_row(const ChunkArgs& a, std::int64_t slot,
                                                       int h) {
  const std::int64_t elems = std::int64_t(a.Dk) * a.Dv;
  if (a.saved) {
    float* rec = a.saved + slot * a.saved_s0 + h * a.saved_s1;
    for (std::int64_t i = threadIdx.x; i < elems; i += blockDim.x) rec[i] = 0.f;
  } else if (a.states16) {
    __nv_bfloat16* rec = a.states16 + slot * a.saved_s0 + h * a.saved_s1;
    for (std::int64_t i = threadIdx.x; i < elems; i += blockDim.x) rec[i] = __float2bfloat16(0.f);
  }
}

// The packed bf16 pair (p[0], p[1]) (p 2-element aligned), and (p[0], p[ld]) (a column pair).
__device__ __forceinline__ std::uint32_t load_pair(const __nv_bfloat16* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}
__device__ __forceinline__ std::uint32_t load_col_pair(const __nv_bfloat16* p, int ld) {
  return detail::pack_bf16(p[0], p[ld]);
}

// x rounded to tf32 (nearest, ties away), as the products' single-pass operands.
__device__ __forceinline__ float to_tf32(float x) {
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

// acc[nt] += A[16 x K] B[K x 8 NT] for one warp; a(i, k) and b(k, j) read the operands relative to
// the tile's origin. acc[nt][e]: row g + 8 (e >> 1), column 8 nt + 2 c + (e & 1) (g = lane / 4,
// c = lane % 4). X3: three tf32 products per pair (fp32-level accuracy), else one on rounded
// operands.
template <int NT, bool X3, class FA, class FB>
__device__ __forceinline__ void mma_tile(float (&acc)[NT][4], int K, FA a, FB b) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    float4 av = make_float4(a(g, k0 + c), a(g + 8, k0 + c), a(g, k0 + c + 4), a(g + 8, k0 + c + 4));
    if constexpr (X3) {
      const float4 ah = make_float4(detail::tf32_hi(av.x), detail::tf32_hi(av.y),
                                    detail::tf32_hi(av.z), detail::tf32_hi(av.w));
      const float4 al = make_float4(av.x - ah.x, av.y - ah.y, av.z - ah.z, av.w - ah.w);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float b0 = b(k0 + c, 8 * nt + g), b1 = b(k0 + c + 4, 8 * nt + g);
        const float b0h = detail::tf32_hi(b0), b1h = detail::tf32_hi(b1);
        detail::mma_tf32(acc[nt], al, b0h, b1h);
        detail::mma_tf32(acc[nt], ah, b0 - b0h, b1 - b1h);
        detail::mma_tf32(acc[nt], ah, b0h, b1h);
      }
    } else {
      av = make_float4(to_tf32(av.x), to_tf32(av.y), to_tf32(av.z), to_tf32(av.w));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        detail::mma_tf32(acc[nt], av, to_tf32(b(k0 + c, 8 * nt + g)),
                         to_tf32(b(k0 + c + 4, 8 * nt + g)));
    }
  }
}

// acc[nt] += A[16 x K] B[K x 8 NT] for one warp on bf16 operands (mma.sync m16n8k16, fp32
// accumulation), K a multiple of 16. A is bf16 data: a2(i, k) returns the packed pair A(i, k),
// A(i, k + 1) (k even). SplitB: B is fp32 data, b(k, j) returns B(k, j) as a float, split into
// bf16 hi + lo (two products; ~2^-17 relative, mma_bf16.cuh); else B is bf16 data and b(k, j)
// returns the packed pair B(k, j), B(k + 1, j) (one product, exact operands). acc as mma_tile.
// The lo products accumulate apart from the hi ones (added at the end): 2 NT independent
// accumulator chains instead of NT, half the dependent-mma depth (the state pass is latency-bound).
template <int NT, bool SplitB, class FA, class FB>
__device__ __forceinline__ void mma_tile_bf16(float (&acc)[NT][4], int K, FA a2, FB b) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  float lo[NT][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 16) {
    const int k = k0 + 2 * c;
    const uint4 av = make_uint4(a2(g, k), a2(g + 8, k), a2(g, k + 8), a2(g + 8, k + 8));
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int j = 8 * nt + g;
      if constexpr (SplitB) {
        std::uint32_t h0, l0, h1, l1;
        detail::split_bf16(b(k, j), b(k + 1, j), h0, l0);
        detail::split_bf16(b(k + 8, j), b(k + 9, j), h1, l1);
        detail::mma_bf16(lo[nt], av, l0, l1);
        detail::mma_bf16(acc[nt], av, h0, h1);
      } else {
        detail::mma_bf16(acc[nt], av, b(k, j), b(k + 8, j));
      }
    }
  }
  if constexpr (SplitB) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] += lo[nt][e];
  }
}

}  // namespace gdr::cuda::chunked
