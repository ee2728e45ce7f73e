// Host pieces shared by the chunked forward (chunked_forward.cu) and backward
// (chunked_backward.cu): the kernel arguments of the call's inputs and options, the chunk-slot
// count, the launchers of the prep kernel and the state pass (chunked_kernels.cuh), and the fixed
// fp32 mode in which the backward runs them.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/chunked/chunked_kernels.cuh"
#include "cuda/common/launch.h"
#include "gdr/decode_overrides.h"
#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr::cuda::chunked {

// Rows of a 16-bit [B, T, H, D] tensor start 16-byte aligned (the data and the strides of the
// first three dims), so that they can be read 16 bytes at a time.
inline bool rows_16byte_aligned(const TensorView& t) {
  return reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 && t.stride[0] % 8 == 0 &&
         t.stride[1] % 8 == 0 && t.stride[2] % 8 == 0;
}

// The inputs, options, shapes and chunk-slot count of a call (scratch pointers left null).
inline ChunkArgs chunk_inputs(const Problem& prob, const Inputs& in, const Options& opts,
                              const char* op) {
  ChunkArgs a{};
  a.q = in.q.data, a.k = in.k.data, a.v = in.v.data, a.g = in.g.data, a.beta = in.beta.data;
  a.q_sb = in.q.stride[0], a.q_st = in.q.stride[1], a.q_sh = in.q.stride[2];
  a.k_sb = in.k.stride[0], a.k_st = in.k.stride[1], a.k_sh = in.k.stride[2];
  a.v_sb = in.v.stride[0], a.v_st = in.v.stride[1], a.v_sh = in.v.stride[2];
  a.g_sb = in.g.stride[0], a.g_st = in.g.stride[1], a.g_sh = in.g.stride[2];
  a.beta_sb = in.beta.stride[0], a.beta_st = in.beta.stride[1], a.beta_sh = in.beta.stride[2];
  if (in.mask.defined()) {
    a.mask = static_cast<const std::uint8_t*>(in.mask.data);
    a.mask_sb = in.mask.stride[0], a.mask_st = in.mask.stride[1];
  }
  a.gate_in_kernel = opts.gate_in_kernel;
  if (a.gate_in_kernel) {
    a.A_log = static_cast<const float*>(in.A_log.data);
    a.A_log_s = in.A_log.stride[0];
    if (in.dt_bias.defined()) {
      a.dt_bias = static_cast<const float*>(in.dt_bias.data);
      a.dt_bias_sh = in.dt_bias.stride[0];
    }
  }
  a.beta_sigmoid = opts.beta_sigmoid;
  a.qk_l2norm = opts.qk_l2norm;
  a.eps = opts.l2norm_eps;
  a.scale = prob.scale;
  a.in_dtype = static_cast<int>(prob.dtype);
  a.rows16 = prob.dtype != DType::f32 && rows_16byte_aligned(in.q) && rows_16byte_aligned(in.k) &&
             rows_16byte_aligned(in.v);
  a.g_dtype = static_cast<int>(in.g.dtype);
  a.beta_dtype = static_cast<int>(in.beta.dtype);
  a.per_key = prob.gate == GateKind::per_key;
  a.v_first = opts.state_layout == StateLayout::v_first;
  if (in.h0.defined()) {
    a.h0 = static_cast<const float*>(in.h0.data);
    a.h0_s0 = in.h0.stride[0], a.h0_s1 = in.h0.stride[1], a.h0_s2 = in.h0.stride[2];
  }
  a.B = prob.B, a.T = prob.T, a.N = prob.N;
  a.Hv = static_cast<int>(prob.Hv);
  a.Hk = static_cast<int>(prob.Hk);
  a.group = static_cast<int>(prob.Hv / prob.Hk);
  a.Dk = static_cast<int>(prob.Dk), a.Dv = static_cast<int>(prob.Dv);
  a.varlen = prob.varlen;
  a.nc = (prob.T + kC - 1) / kC;
  if (prob.varlen) {
    a.cu_seqlens = in.cu_seqlens.data;
    a.cu_dtype = static_cast<int>(in.cu_seqlens.dtype);
    a.slots = (prob.T + prob.N * (kC - 1)) / kC;  // saved_shape's chunk_rows: an upper bound
  } else {
    a.slots = prob.B * a.nc;
  }
  if (a.slots > INT_MAX) refuse(op, "too many chunks for one call");
  a.slot_base = 0, a.slot_end = INT64_MAX;  // one window: every slot
  return a;
}

// The prep kernels' rules and their diagnostic and schedule overrides (DecodeOverrides::
// prep_phase_cycles, chunked_tinv, chunked_prep), for the forward's prep and the backward's
// recompute alike; null: the rules. Tinv by columns is the rule (tinv.cuh; H100, a560176,
// bench/results/2026-12-07-chunk-knobs-h100-a560176.json: the forward 5-8 % faster on every
// benchmark row, the bf16 prep's Tinv phase 20.0 k -> 9.3 k cycles per block).
inline void take_prep_overrides(ChunkArgs& a, const DecodeOverrides* forced) {
  a.tinv_schedule = kTinvByColumns;
  if (!forced) return;
  a.phase_cycles = forced->prep_phase_cycles;
  if (forced->chunked_tinv != 0) a.tinv_schedule = forced->chunked_tinv;
  a.prep_wgmma = forced->chunked_prep == 3 && a.Dk == 128 && a.Dv == 128;
}

// Chunk slots of the launch's window [slot_base, min(slot_end, slots)) (chunked_common.cuh).
inline std::int64_t window_slots(const ChunkArgs& a) {
  const std::int64_t end = a.slot_end < a.slots ? a.slot_end : a.slots;
  return end > a.slot_base ? end - a.slot_base : 0;
}

template <bool PerKey, class St, bool X3 = kX3<St>>
void launch_prep_kernel(const ChunkArgs& args, int device, cudaStream_t stream, const char* op) {
  const auto kernel = chunk_prep_kernel<PerKey, St, X3>;
  ChunkArgs a = args;
  a.v_prefetch = a.rows16 && prep_smem_bytes(a.Dk, a.Dv, PerKey, true) <=
                                 static_cast<std::size_t>(smem_optin(device, op));
  const std::size_t smem = prep_smem_bytes(a.Dk, a.Dv, PerKey, a.v_prefetch);
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
  kernel<<<dim3(static_cast<unsigned>(window_slots(a)), static_cast<unsigned>(a.Hv)), kThreads,
           smem, stream>>>(a);
  check(cudaGetLastError(), op, "chunk_prep_kernel launch");
}

// mode 0: grid (N, Hv, Dv / BV); segment split: mode 1 (maps) grid (seg_slots, Hv, (Dv + Dk) /
// BV), mode 2 (segments) grid (seg_slots, Hv, Dv / BV).
template <int BV, class St>
void launch_state_kernel(const ChunkArgs& a, int nbuf, int mode, int device, cudaStream_t stream,
                         const char* op) {
  const auto kernel = state_pass_kernel<BV, St>;
  const std::size_t smem = state_smem_bytes<St>(a.Dk, BV, nbuf);
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
  const std::int64_t x = mode == 0 ? a.N : a.seg_slots;
  const int cols = mode == 1 ? a.Dv + a.Dk : a.Dv;
  kernel<<<dim3(static_cast<unsigned>(x), static_cast<unsigned>(a.Hv),
                static_cast<unsigned>(cols / BV)),
           kThreads, smem, stream>>>(a, nbuf, mode);
  check(cudaGetLastError(), op, "state_pass_kernel launch");
}

// The backward's recompute (chunked_backward.cu) runs the forward's prep kernel and state pass in
// one fixed mode whatever the input dtype: fp32 scratch (St = float; prep's products 3xTF32 for
// fp32 inputs and single tf32 for 16-bit ones, the state pass's 3xTF32; the
// backward's kernels read W, U / Vnew, Qs, Kd, P as fp32 and reuse some of them as fp32
// scratch), Qs and Kd stored (no row factors), fp32 chunk states (no states16), the unsplit state
// pass (mode 0, no segment split) and no overlap (no progress counters; there is no output
// kernel). The caller leaves row_factors, seg_chunks, progress and states16 at their zero values
// (chunk_inputs); these launchers refuse otherwise.
inline void check_backward_mode(const ChunkArgs& a, const char* op) {
  if (a.row_factors || a.seg_chunks != 0 || a.progress != nullptr || a.states16 != nullptr)
    refuse(op,
           "internal: the backward's recompute needs fp32 scratch, stored Qs / Kd, the "
           "unsplit state pass and no overlap");
}

// The chunk table (varlen) is built first by the caller.
inline void launch_prep_fp32(const ChunkArgs& a, int device, cudaStream_t stream, const char* op) {
  check_backward_mode(a, op);
  if (window_slots(a) == 0) return;
  // 3xTF32 products for fp32 inputs; single tf32 for 16-bit inputs (their bf16 tolerance; the
  // forward's own bf16 path rounds W, U to bf16, 2^-9, where tf32 rounds operands to 2^-11).
  const bool x3 = a.in_dtype == 0;
  if (a.per_key)
    x3 ? launch_prep_kernel<true, float, true>(a, device, stream, op)
       : launch_prep_kernel<true, float, false>(a, device, stream, op);
  else
    x3 ? launch_prep_kernel<false, float, true>(a, device, stream, op)
       : launch_prep_kernel<false, float, false>(a, device, stream, op);
}

// State pass (mode 0, fp32 scratch): 32 value columns per block, 16 when 32 would leave more than
// half the SMs idle; two W / Kd buffers (the next chunk's copies a whole chunk ahead) when the
// blocks fit in one wave and the shared memory allows, else one: the forward's rule without its
// DecodeOverrides.
inline void launch_state_pass_fp32(const ChunkArgs& a, int device, cudaStream_t stream,
                                   const char* op) {
  check_backward_mode(a, op);
  const int sms = sm_count(device, op);
  const int smem_optin = cuda::smem_optin(device, op);
  const std::int64_t blocks32 = a.N * a.Hv * (a.Dv / 32);
  const int bv = 2 * blocks32 <= sms ? 16 : 32;
  const std::int64_t blocks = blocks32 * (32 / bv);
  const int nbuf =
      blocks <= sms && state_smem_bytes<float>(a.Dk, bv, 2) <= static_cast<std::size_t>(smem_optin)
          ? 2
          : 1;
  if (bv == 16)
    launch_state_kernel<16, float>(a, nbuf, 0, device, stream, op);
  else
    launch_state_kernel<32, float>(a, nbuf, 0, device, stream, op);
}

}  // namespace gdr::cuda::chunked
