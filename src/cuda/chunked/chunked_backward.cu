// Host side of the chunked backward (docs/operator.md §4, C = 64; kernels in
// backward_kernels.cuh, which states the math): gdr::cuda::chunked_backward. Order of the
// kernels on the call's stream:
//   chunk_table_kernel (varlen)  ->  chunk_prep_kernel (the forward's, with Tinv, KK, G and the
//   normalised Q, K kept)  ->  state_pass_kernel (the forward's; the chunk states and Vnew) or,
//   given BackwardParams::saved (the forward's chunk states), bwd_vnew_kernel (Vnew, every chunk
//   independent)  ->  bwd_state_kernel (reverse, dS per chunk, dh0)  ->  bwd_dvb_kernel  ->
//   bwd_key_kernel  ->  bwd_keygrad_kernel  ->  bwd_gate_param_kernel (gate in kernel).
// The fused path (scalar gate, bf16, no mask, Dk = Dv = 128, 16-byte aligned dO rows; unless
// DecodeOverrides::chunked_backward_fused = 1): bwd_state_bf16_kernel for the reverse pass and
// bwd_chunk_bf16_kernel for bwd_dvb + bwd_key (and, given `saved`, bwd_vnew): bf16 tensor-core
// products, the per-chunk gradients kept on chip, and no scratch for dVb, dMq, dA, yk, dbk, dbp;
// its recompute is chunk_prep_bf16_kernel<true> (bf16 products on the raw q, k, v rows, fp32
// scratch out) where q, k, v rows are 16-byte aligned (chunked_backward_fused = 4: the fp32 prep).
// Otherwise the forward's prep kernel and state pass run here in one fixed mode (chunked_host.cuh
// launch_prep_fp32 / launch_state_pass_fp32), whatever the dtype and DecodeOverrides: fp32 scratch
// (3xTF32), Qs and Kd stored, fp32 chunk states, unsplit state pass, no overlap; the backward's
// kernels read that scratch as fp32 (the forward's 16-bit scratch, row factors, bf16 chunk states,
// segment split and overlap are for forward-only calls; docs/cuda-chunked.md).
// No host synchronisation and no device-to-host copy (stream-ordered scratch: ExecConfig::scratch
// or cudaMallocAsync; cu_seqlens read on the device): a call can be captured in a CUDA graph.
// Deterministic: every sum has a fixed order.
//   scratch per chunk slot of one window and value head, floats: the forward's
//   (3 Dk + Dv + C) C + Wg, plus 2 C^2 (Tinv, KK) + C Wg (G) + Dk Dv (dS) + 2 C Dv (dVnew, dVb) +
//   2 C^2 (dMq, dA) + C + 2 C Dk (yk, dbk; none of dVb .. dbk on the fused path); per chunk
//   slot of the window and key head 2 C Dk
//   (normalised Q, K). At Dk = Dv = 128 about 6.4 KB per token of the window and value head, plus
//   1 KB per token and key head. Per chunk slot of the call and value head: 1 + Wg doubles (the
//   gate-parameter partials) and, without `saved`, Dk Dv fp32 chunk states (one window then);
//   with several windows the dS carry, Dk Dv floats per sequence and value head
//   (docs/cuda-chunked.md §Backward memory).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/heuristics.h"
#include "cuda/chunked/backward_kernels.cuh"
#include "cuda/chunked/bwd_chunk_bf16_kernel.cuh"
#include "cuda/chunked/bwd_state_bf16_kernel.cuh"
#include "cuda/chunked/bwd_state_wgmma_kernel.cuh"
#include "cuda/chunked/chunked_host.cuh"
#include "cuda/chunked/prep_bf16_kernel.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/scratch.h"
#include "cuda/paths.h"
#include "gdr/decode_overrides.h"

namespace gdr::cuda {
namespace {

using chunked::BwdArgs;
using chunked::kC;
using chunked::kThreads;

template <class Kernel>
void prepare(Kernel kernel, std::size_t smem, int device, const char* op) {
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
}

template <int BV, bool X3>
void launch_bwd_state(const BwdArgs& b, int device, cudaStream_t stream, const char* op) {
  const bool staged =
      chunked::bwd_state_staged(b.c.Dk, BV, static_cast<std::size_t>(smem_optin(device, op)));
  const auto kernel =
      staged ? chunked::bwd_state_kernel<BV, X3, true> : chunked::bwd_state_kernel<BV, X3, false>;
  const std::size_t smem = chunked::bwd_state_smem_bytes(b.c.Dk, BV, staged);
  prepare(kernel, smem, device, op);
  kernel<<<dim3(static_cast<unsigned>(b.c.N), static_cast<unsigned>(b.c.Hv),
                static_cast<unsigned>(b.c.Dv / BV)),
           kThreads, smem, stream>>>(b);
  check(cudaGetLastError(), op, "bwd_state_kernel launch");
}

// The bf16 prep kernel in its backward mode (prep_bf16_kernel.cuh: products on the raw bf16 rows,
// the backward's fp32 scratch and extra outputs), on the fused path with 16-byte aligned q, k, v.
void launch_prep_bf16_bwd(const chunked::ChunkArgs& a, int device, cudaStream_t stream,
                          const char* op) {
  if (chunked::window_slots(a) == 0) return;
  const auto kernel = a.prep_wgmma ? chunked::chunk_prep_bf16_kernel<true, true>
                                   : chunked::chunk_prep_bf16_kernel<true>;
  const std::size_t smem = chunked::prep_bf16_smem_bytes(a.Dk, a.Dv);
  prepare(kernel, smem, device, op);
  kernel<<<dim3(static_cast<unsigned>(chunked::window_slots(a)), static_cast<unsigned>(a.Hv)),
           chunked::kPrepBf16Threads, smem, stream>>>(a);
  check(cudaGetLastError(), op, "chunk_prep_bf16_kernel launch");
}

// The reverse pass with dS in registers and bf16 products (bwd_state_bf16_kernel.cuh), on the
// fused path; its operands in bf16 where the prep wrote them so (a.P16: Op16).
template <int BV>
void launch_bwd_state_bf16(const BwdArgs& b, int device, cudaStream_t stream, const char* op) {
  const bool op16 = b.c.P16 != nullptr;
  const auto kernel =
      op16 ? chunked::bwd_state_bf16_kernel<BV, true> : chunked::bwd_state_bf16_kernel<BV, false>;
  const std::size_t smem = op16 ? chunked::BwdStateBf16Smem<BV, true>::bytes
                                : chunked::BwdStateBf16Smem<BV, false>::bytes;
  prepare(kernel, smem, device, op);
  kernel<<<dim3(static_cast<unsigned>(b.c.N), static_cast<unsigned>(b.c.Hv),
                static_cast<unsigned>(b.c.Dv / BV)),
           chunked::kBwdStateBf16Threads, smem, stream>>>(b);
  check(cudaGetLastError(), op, "bwd_state_bf16_kernel launch");
}

// The reverse pass on warpgroup products (bwd_state_wgmma_kernel.cuh): the bf16 operands given,
// 32 value columns per block; two stages of copies where the blocks fit one wave, else one (two
// blocks per SM).
template <int NS>
void launch_bwd_state_wgmma_stages(const BwdArgs& b, int device, cudaStream_t stream,
                                   const char* op) {
  const auto kernel = chunked::bwd_state_wgmma_kernel<NS>;
  constexpr std::size_t smem = chunked::BwdStateWgmmaSmem<NS>::bytes;
  prepare(kernel, smem, device, op);
  kernel<<<dim3(static_cast<unsigned>(b.c.N), static_cast<unsigned>(b.c.Hv),
                static_cast<unsigned>(b.c.Dv / chunked::wgmma_pass::kBV)),
           chunked::kBwdStateWgmmaThreads, smem, stream>>>(b);
  check(cudaGetLastError(), op, "bwd_state_wgmma_kernel launch");
}
void launch_bwd_state_wgmma(const BwdArgs& b, int device, cudaStream_t stream, const char* op) {
  const std::int64_t blocks = b.c.N * b.c.Hv * (b.c.Dv / chunked::wgmma_pass::kBV);
  if (blocks > sm_count(device, op))
    launch_bwd_state_wgmma_stages<1>(b, device, stream, op);
  else
    launch_bwd_state_wgmma_stages<2>(b, device, stream, op);
}

// bwd_dvb + bwd_key fused into bwd_chunk_bf16_kernel (its header states where it applies); with
// the forward's saved chunk states it also forms Vnew (no bwd_vnew_kernel).
template <bool RawQK>
void launch_bwd_fused(const BwdArgs& b, bool with_saved, dim3 grid, int device, cudaStream_t stream,
                      const char* op) {
  const auto kernel = !with_saved  ? chunked::bwd_chunk_bf16_kernel<false, false, RawQK>
                      : b.states16 ? chunked::bwd_chunk_bf16_kernel<true, true, RawQK>
                                   : chunked::bwd_chunk_bf16_kernel<false, true, RawQK>;
  constexpr std::size_t smem = chunked::BwdFusedSmem::bytes;
  prepare(kernel, smem, device, op);
  kernel<<<grid, chunked::kBwdFusedThreads, smem, stream>>>(b);
  check(cudaGetLastError(), op, "bwd_chunk_bf16_kernel launch");
}

template <bool X3>
void launch_chunks(const BwdArgs& b, bool with_saved, bool fused, bool state_bf16, int device,
                   cudaStream_t stream, const char* op) {
  const chunked::ChunkArgs& a = b.c;
  const std::int64_t slots = chunked::window_slots(a);  // this window's
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(a.Hv));
  if (with_saved && !fused && slots > 0) {
    (b.states16 ? chunked::bwd_vnew_kernel<X3, !X3> : chunked::bwd_vnew_kernel<X3, false>)<<<
        dim3(grid.x, grid.y, static_cast<unsigned>(a.Dv / 64)), kThreads, 0, stream>>>(b);
    check(cudaGetLastError(), op, "bwd_vnew_kernel launch");
  }
  // The reverse pass: 32 value columns per block, 16 when 32 would leave more than half the SMs
  // idle (as the forward's state pass).
  const std::int64_t blocks32 = a.N * a.Hv * (a.Dv / 32);
  const bool narrow = 2 * blocks32 <= sm_count(device, op);
  if (state_bf16 && b.state_wgmma && b.c.P16)
    launch_bwd_state_wgmma(b, device, stream, op);
  else if (state_bf16)
    narrow ? launch_bwd_state_bf16<16>(b, device, stream, op)
           : launch_bwd_state_bf16<32>(b, device, stream, op);
  else if (narrow)
    launch_bwd_state<16, X3>(b, device, stream, op);
  else
    launch_bwd_state<32, X3>(b, device, stream, op);
  if (slots == 0) return;  // T = 0: dh0 = dfinal_state (or 0), nothing else to write
  if (fused) {
    if (a.qk_norms_only)
      launch_bwd_fused<true>(b, with_saved, grid, device, stream, op);
    else
      launch_bwd_fused<false>(b, with_saved, grid, device, stream, op);
  } else {
    const auto dvb = chunked::bwd_dvb_kernel<X3>;
    const std::size_t dvb_smem = chunked::bwd_dvb_smem_bytes(a.Dv);
    prepare(dvb, dvb_smem, device, op);
    dvb<<<grid, kThreads, dvb_smem, stream>>>(b);
    check(cudaGetLastError(), op, "bwd_dvb_kernel launch");
    const auto key = b.states16 ? (a.per_key ? chunked::bwd_key_kernel<true, X3, !X3>
                                             : chunked::bwd_key_kernel<false, X3, !X3>)
                                : (a.per_key ? chunked::bwd_key_kernel<true, X3, false>
                                             : chunked::bwd_key_kernel<false, X3, false>);
    const std::size_t key_smem = chunked::bwd_key_smem_bytes(a.Dk, a.Dv, a.per_key);
    prepare(key, key_smem, device, op);
    key<<<grid, kThreads, key_smem, stream>>>(b);
    check(cudaGetLastError(), op, "bwd_key_kernel launch");
  }
  if (b.dq || b.dk) {
    chunked::bwd_keygrad_kernel<<<dim3(grid.x, static_cast<unsigned>(a.Hk)), kThreads, 0, stream>>>(
        b);
    check(cudaGetLastError(), op, "bwd_keygrad_kernel launch");
  }
}

}  // namespace

void chunked_backward(const Problem& prob, const BackwardParams& p, const ExecConfig& config,
                      const char* op) {
  const Inputs& in = p.in;
  // Validated by the dispatcher (core/cuda_support.cpp validate_cuda_backward).
  if (prob.N == 0 || prob.Hv == 0) return;
  DeviceGuard guard(prob.device_index, op);
  const auto stream = static_cast<cudaStream_t>(config.stream);

  BwdArgs b{};
  b.c = chunked::chunk_inputs(prob, in, p.opts, op);
  chunked::take_prep_overrides(b.c, config.decode_overrides);
  chunked::ChunkArgs& a = b.c;
  b.dout = p.dout.data;
  b.do_sb = p.dout.stride[0], b.do_st = p.dout.stride[1], b.do_sh = p.dout.stride[2];
  if (p.dfinal_state.defined()) {
    b.dht = static_cast<const float*>(p.dfinal_state.data);
    b.dht_s0 = p.dfinal_state.stride[0], b.dht_s1 = p.dfinal_state.stride[1];
    b.dht_s2 = p.dfinal_state.stride[2];
  }
  if (p.dh0.defined()) {
    b.dh0 = static_cast<float*>(p.dh0.data);
    b.dh0_s0 = p.dh0.stride[0], b.dh0_s1 = p.dh0.stride[1], b.dh0_s2 = p.dh0.stride[2];
  }
  auto grad = [](const TensorView& t, void*& ptr, std::int64_t& sb, std::int64_t& st,
                 std::int64_t& sh) {
    if (!t.defined()) return;
    ptr = t.data;
    sb = t.stride[0], st = t.stride[1], sh = t.stride[2];
  };
  grad(p.dq, b.dq, b.dq_sb, b.dq_st, b.dq_sh);
  grad(p.dk, b.dk, b.dk_sb, b.dk_st, b.dk_sh);
  grad(p.dv, b.dv, b.dv_sb, b.dv_st, b.dv_sh);
  grad(p.dg, b.dg, b.dg_sb, b.dg_st, b.dg_sh);
  grad(p.dbeta, b.dbeta, b.db_sb, b.db_st, b.db_sh);
  const bool gate_params = p.opts.gate_in_kernel && (p.dA_log.defined() || p.ddt_bias.defined());
  if (p.opts.gate_in_kernel && p.dA_log.defined()) {
    b.dA_log = static_cast<float*>(p.dA_log.data);
    b.dA_log_s = p.dA_log.stride[0];
  }
  if (p.opts.gate_in_kernel && p.ddt_bias.defined()) {
    b.ddt_bias = static_cast<float*>(p.ddt_bias.data);
    b.ddt_sh = p.ddt_bias.stride[0];
  }

  // Windows of chunk slots, the last first (heuristics.h cuda_backward_window_slots): the
  // per-chunk scratch holds one window, dS crosses windows in the carry. Without `saved` the
  // recomputed state pass needs every chunk's W and U at once: one window.
  const bool own_states = !p.saved.defined();
  const int dev = prob.device_index;
  std::int64_t wslots = a.slots;
  if (!own_states && a.slots > 0) {
    const int forced =
        config.decode_overrides ? config.decode_overrides->chunked_backward_window : 0;
    wslots = forced > 0
                 ? std::min<std::int64_t>(forced, a.slots)
                 : heuristics::cuda_backward_window_slots(a.slots, prob.Hv, sm_count(dev, op));
  }
  const std::int64_t windows = a.slots > 0 ? (a.slots + wslots - 1) / wslots : 1;

  // The fused bf16 kernel for bwd_dvb + bwd_key (bwd_chunk_bf16_kernel.cuh): it keeps dVb, dMq,
  // dA and the row partials on chip, so their scratch is not allocated.
  const int fused_rule =
      config.decode_overrides ? config.decode_overrides->chunked_backward_fused : 0;
  const bool fused = fused_rule != 1 && prob.dtype == DType::bf16 && !a.per_key &&
                     !in.mask.defined() && prob.Dk == chunked::kBwdFusedD &&
                     prob.Dv == chunked::kBwdFusedD && chunked::rows_16byte_aligned(p.dout) &&
                     (own_states || (p.saved.stride[0] % 8 == 0 && p.saved.stride[1] % 8 == 0 &&
                                     reinterpret_cast<std::uintptr_t>(p.saved.data) % 16 == 0));
  const bool prep_bf16 = fused && a.rows16 && fused_rule != 4;
  // The bf16 reverse pass (bwd_state_bf16_kernel.cuh, or on warpgroup products: state_wgmma) with
  // the fused chunk kernel, unless rule 3 forces the general one.
  const bool state_bf16 = fused && fused_rule != 3;
  // The bf16 reverse pass's operands in bf16 (chunked_common.cuh P16 ..): the bf16 prep writes
  // them, given the forward's states (without them the forward's state pass reads fp32 W, Kd).
  // The same roundings as the fp32 operands, so the gradients are bit-identical (FusedChunkKernel
  // checks); the rule since 350ff10 (H100, ef0210b: forward + backward 2-3% less time, 1 x 16384
  // 7.09 -> 6.89 ms); chunked_backward_fused = 2 forces the fp32 operands.
  const bool op16 =
      prep_bf16 && !own_states && (fused_rule == 0 || fused_rule == 5 || fused_rule == 6);
  // Rule 6 (opt-in: correct and slower on an H100, a560176): the reverse pass on warpgroup products
  // wherever its operands are bf16 (any number of blocks: it has 32 value columns only).
  b.state_wgmma = op16 && fused_rule == 6;
  b.phase_cycles =
      config.decode_overrides ? config.decode_overrides->backward_phase_cycles : nullptr;
  b.prefetch_l2 =
      config.decode_overrides && config.decode_overrides->chunked_backward_prefetch == 2;
  b.rows_by_block = config.decode_overrides && config.decode_overrides->chunked_backward_rows == 2;
  // The fused chunk kernel reads the raw q, k rows and the bf16 prep writes only their norms
  // (chunked_backward_qk = 2, opt-in until measured; the same values, so bit-identical gradients).
  a.qk_norms_only =
      prep_bf16 && config.decode_overrides && config.decode_overrides->chunked_backward_qk == 2;
  // The bf16 reverse pass hands dVnew to the fused chunk kernel in bf16 (chunked_backward_dvn = 2,
  // opt-in until measured; the rounding the chunk kernel made, so bit-identical gradients).
  b.dvn16 = state_bf16 && !b.state_wgmma && config.decode_overrides &&
            config.decode_overrides->chunked_backward_dvn == 2;

  // Scratch (see the header), every float region a multiple of 4 floats except the last ones.
  const std::int64_t items = wslots * prob.Hv, keys = wslots * prob.Hk;
  const std::int64_t all_items = a.slots * prob.Hv;
  const std::int64_t Dk = prob.Dk, Dv = prob.Dv, wg = a.per_key ? Dk : 1;
  const std::int64_t per_item = kC * (3 * Dk + Dv + kC)  // W, Qs, Kd, U, P
                                + 2 * kC * kC + kC * wg  // Tinv, KK, G
                                + Dk * Dv + kC * Dv      // dS, dVn
                                + wg                     // gn
                                + (fused ? 0 : kC * Dv + 2 * kC * kC + 2 * kC * Dk + kC);
  // dVb, dMq, dA, yk, dbk, dbp (the general kernels)
  const std::int64_t carry = windows > 1 ? prob.N * prob.Hv * Dk * Dv : 0;
  const std::int64_t floats =
      items * per_item + keys * 2 * kC * Dk + (own_states ? all_items * Dk * Dv : 0) + carry;
  const std::int64_t doubles = all_items * (1 + wg);
  const std::int64_t bytes = floats * 4 + doubles * 8 + (prob.varlen ? (prob.N + 1) * 8 : 0) + 512;
  const DeviceScratch scratch(config, static_cast<std::size_t>(bytes), stream, op);
  float* f = static_cast<float*>(scratch.data());
  a.W = f, f += items * kC * Dk;
  a.U = f, f += items * kC * Dv;
  a.Qs = f, f += items * kC * Dk;
  a.Kd = f, f += items * kC * Dk;
  a.P = f, f += items * kC * kC;
  a.Tinv_out = f, f += items * kC * kC;
  a.KK_out = f, f += items * kC * kC;
  a.G_out = f, f += items * kC * wg;
  a.Qn_out = f, f += keys * kC * Dk;
  a.Kn_out = f, f += keys * kC * Dk;
  if (op16) {
    // In the fp32 regions they replace, per window: P16 in P's, Kd16 and Qs16 in Kd's halves, W16
    // in Qs's (free until bwd_chunk_bf16_kernel writes dk_h there, after the reverse pass that
    // reads W16). Dense [items][C][width] bf16 each.
    a.P16 = reinterpret_cast<__nv_bfloat16*>(a.P);
    a.Kd16 = reinterpret_cast<__nv_bfloat16*>(a.Kd);
    a.Qs16 = a.Kd16 + items * kC * Dk;
    a.W16 = reinterpret_cast<__nv_bfloat16*>(a.Qs);
  }
  b.dS = f, f += items * Dk * Dv;
  b.dVn = f, f += items * kC * Dv;
  if (!fused) {
    b.dVb = f, f += items * kC * Dv;
    b.dMq = f, f += items * kC * kC;
    b.dA = f, f += items * kC * kC;
    b.yk = f, f += items * kC * Dk;
    b.dbk = f, f += items * kC * Dk;
    b.dbp = f, f += items * kC;
  }
  if (own_states) {
    a.saved = f, f += all_items * Dk * Dv;
    a.saved_s0 = prob.Hv * Dk * Dv, a.saved_s1 = Dk * Dv;
    b.states = a.saved;
    b.st_s0 = a.saved_s0, b.st_s1 = a.saved_s1;
  } else {
    if (p.saved.dtype == DType::bf16)  // 16-bit inputs only (validate_saved)
      b.states16 = static_cast<const __nv_bfloat16*>(p.saved.data);
    else
      b.states = static_cast<const float*>(p.saved.data);
    b.st_s0 = p.saved.stride[0], b.st_s1 = p.saved.stride[1];
  }
  if (carry > 0) b.dS_carry = f, f += carry;
  a.gn = f, f += items * wg;
  auto align = [](void* ptr) {
    return reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(ptr) + 15) &
                                   ~static_cast<std::uintptr_t>(15));
  };
  b.gpart = static_cast<double*>(align(f));
  a.chunk_off = reinterpret_cast<std::int64_t*>(align(b.gpart + doubles));
  a.states_vec = false;

  const bool x3 = prob.dtype == DType::f32;
  if (prob.varlen) {
    chunked::chunk_table_kernel<<<1, 1024, 0, stream>>>(a);
    check(cudaGetLastError(), op, "chunk_table_kernel launch");
  }
  if (gate_params)
    check(cudaMemsetAsync(b.gpart, 0, static_cast<std::size_t>(doubles) * 8, stream), op,
          "cudaMemsetAsync");
  for (std::int64_t w = windows - 1; w >= 0; --w) {
    a.slot_base = w * wslots;
    a.slot_end = w == windows - 1 ? INT64_MAX : (w + 1) * wslots;  // the last: every later slot
    {
      // The prep kernel zeroes the chunk-state rows of surplus slots: not the caller's `saved`.
      chunked::ChunkArgs prep = a;
      if (!own_states) prep.saved = nullptr;
      if (prep_bf16)
        launch_prep_bf16_bwd(prep, dev, stream, op);
      else
        chunked::launch_prep_fp32(prep, dev, stream, op);
    }
    if (own_states) chunked::launch_state_pass_fp32(a, dev, stream, op);  // states, Vnew
    x3 ? launch_chunks<true>(b, !own_states, false, false, dev, stream, op)
       : launch_chunks<false>(b, !own_states, fused, state_bf16, dev, stream, op);
  }
  if (gate_params) {
    chunked::bwd_gate_param_kernel<<<static_cast<unsigned>(prob.Hv), kThreads, 0, stream>>>(b);
    check(cudaGetLastError(), op, "bwd_gate_param_kernel launch");
  }
}

}  // namespace gdr::cuda
