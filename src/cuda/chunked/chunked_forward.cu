// Host side of the chunked forward (docs/operator.md §3, C = 64; kernels in chunked_kernels.cuh,
// design in docs/cuda-chunked.md): gdr::cuda::chunked_forward. No host synchronisation and no
// device-to-host copy: the scratch is stream-ordered (ExecConfig::scratch, else cudaMallocAsync on
// the call's stream) and cu_seqlens is read on the device only (chunk_table_kernel), so a call
// can be captured in a CUDA graph.
//   scratch per chunk slot and value head: (3 Dk + Dv + C) C elements of the scratch type St
//   (fp32 for fp32 inputs, bf16 for f16 / bf16 inputs; (Dk + Dv + C) C with row factors, which
//   add 2 C floats), (Dk or 1) fp32 gn, plus Dk Dv elements of St of chunk state unless
//   ForwardParams::saved holds them (fp32), plus N + 1 int64 chunk offsets under varlen. At
//   Dk = Dv = 128, bf16, row factors: 0.64 KB + 0.5 KB per token and value head.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "core/heuristics.h"
#include "cuda/chunked/chunked_host.cuh"
#include "cuda/chunked/fused_pass_kernel.cuh"
#include "cuda/chunked/prep_bf16_kernel.cuh"
#include "cuda/chunked/state_pass_bf16_kernel.cuh"
#include "cuda/chunked/state_pass_wgmma_kernel.cuh"
#include "cuda/chunked/state_pass_ws_kernel.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/scratch.h"
#include "cuda/paths.h"
#include "gdr/decode_overrides.h"

namespace gdr::cuda {
namespace {

using chunked::ChunkArgs;
using chunked::kC;
using chunked::kThreads;

void launch_combine(const ChunkArgs& a, int device, cudaStream_t stream, const char* op) {
  const auto kernel = chunked::segment_combine_kernel;
  const std::size_t smem = chunked::combine_smem_bytes(a.Dk);
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
  kernel<<<dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(a.Hv),
                static_cast<unsigned>(a.Dv / chunked::kCombineBV)),
           kThreads, smem, stream>>>(a);
  check(cudaGetLastError(), op, "segment_combine_kernel launch");
}

constexpr int kOutBV = 64;  // value columns per block of the output kernel

// Grid: slots Hv (Dv / 64) blocks in one dimension (chunk-major); with a.progress a programmatic
// dependent launch of the state pass (the overlap).
template <class St, bool S16>
void launch_output(const ChunkArgs& a, int device, cudaStream_t stream, const char* op) {
  const auto kernel = chunked::chunk_output_kernel<kOutBV, St, S16>;
  const std::size_t smem = chunked::output_smem_bytes<St, S16>(a.Dk, kOutBV);
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
  const std::int64_t blocks = a.slots * a.Hv * (a.Dv / kOutBV);
  if (blocks > INT_MAX) refuse(op, "too many chunks for one call");
  launch_kernel(kernel, static_cast<unsigned>(blocks), kThreads, smem, stream,
                a.progress != nullptr, a);
  check(cudaGetLastError(), op, "chunk_output_kernel launch");
}

// The bf16 prep kernel (prep_bf16_kernel.cuh): grid (window slots, Hv).
void launch_prep_bf16(const ChunkArgs& a, int device, cudaStream_t stream, const char* op) {
  const bool fused = a.ek != nullptr;  // the fused pass's operands (prep_bf16_kernel.cuh)
  const auto kernel = a.prep_wgmma ? (fused ? chunked::chunk_prep_bf16_kernel<false, true, true>
                                            : chunked::chunk_prep_bf16_kernel<false, true>)
                                   : (fused ? chunked::chunk_prep_bf16_kernel<false, false, true>
                                            : chunked::chunk_prep_bf16_kernel<false>);
  const std::size_t smem = chunked::prep_bf16_smem_bytes(a.Dk, a.Dv, fused);
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
  kernel<<<dim3(static_cast<unsigned>(chunked::window_slots(a)), static_cast<unsigned>(a.Hv)),
           chunked::kPrepBf16Threads, smem, stream>>>(a);
  check(cudaGetLastError(), op, "chunk_prep_bf16_kernel launch");
}

// The unsplit bf16 state pass (state_pass_bf16_kernel.cuh): grid (N, Hv, Dv / BV); FuseOut: it
// computes the output too; Stored: it reads the stored Kd rows (no row factors); NS stages of
// copies; Single: one product per state-pass product (DecodeOverrides::chunked_state_pass = 4).
template <int BV, bool FuseOut, bool Stored = false, int NS = 2, bool Single = false>
void launch_state_bf16(const ChunkArgs& a, int device, cudaStream_t stream, const char* op) {
  const auto kernel = chunked::state_pass_bf16_kernel<BV, FuseOut, Stored, NS, Single>;
  constexpr std::size_t smem = chunked::state_bf16_smem_bytes<BV, FuseOut, NS>();
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
  kernel<<<dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(a.Hv),
                static_cast<unsigned>(a.Dv / BV)),
           chunked::kStateBf16Threads, smem, stream>>>(a);
  check(cudaGetLastError(), op, "state_pass_bf16_kernel launch");
}

// The warp-specialised single-product pass (state_pass_ws_kernel.cuh): grid (N, Hv, Dv / 32).
void launch_state_ws(const ChunkArgs& a, int device, cudaStream_t stream, const char* op) {
  const auto kernel = chunked::state_pass_ws_kernel;
  constexpr std::size_t smem = chunked::StateWsSmem::bytes;
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
  kernel<<<dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(a.Hv),
                static_cast<unsigned>(a.Dv / chunked::StateWsSmem::BV)),
           chunked::kStateWsThreads, smem, stream>>>(a);
  check(cudaGetLastError(), op, "state_pass_ws_kernel launch");
}

// The warpgroup-product state pass (state_pass_wgmma_kernel.cuh): grid (N, Hv, Dv / 32); FuseOut
// and Stored as launch_state_bf16's (FuseOut with fp32 `saved`: q S on S's hi and lo parts); NS
// stages of copies.
template <bool FuseOut, bool Stored, int NS>
void launch_state_wgmma_stages(const ChunkArgs& a, int device, cudaStream_t stream,
                               const char* op) {
  const auto kernel = FuseOut && a.saved
                          ? chunked::state_pass_wgmma_kernel<FuseOut, Stored, FuseOut, NS>
                          : chunked::state_pass_wgmma_kernel<FuseOut, Stored, false, NS>;
  constexpr std::size_t smem = chunked::StateWgmmaSmem<FuseOut, NS>::bytes;
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
  kernel<<<dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(a.Hv),
                static_cast<unsigned>(a.Dv / chunked::wgmma_pass::kBV)),
           chunked::kStateWgmmaThreads, smem, stream>>>(a);
  check(cudaGetLastError(), op, "state_pass_wgmma_kernel launch");
}
// Two stages where the blocks fit one wave (one block per SM), else one (two blocks per SM);
// DecodeOverrides::chunked_state_buffers = 1 or 2 forces it.
template <bool FuseOut, bool Stored = false>
void launch_state_wgmma(const ChunkArgs& a, int stages, int device, cudaStream_t stream,
                        const char* op) {
  if (stages == 1)
    launch_state_wgmma_stages<FuseOut, Stored, 1>(a, device, stream, op);
  else
    launch_state_wgmma_stages<FuseOut, Stored, 2>(a, device, stream, op);
}

// The fused pass (fused_pass_kernel.cuh): grid (N, Hv, 128 / BV), BV value columns per block.
template <int BV, int Stages = 2>
void launch_fused_pass_columns(const ChunkArgs& a, int device, cudaStream_t stream,
                               const char* op) {
  constexpr std::size_t smem = chunked::FusedPassSmem<BV, Stages>::bytes;
  const auto kernel = chunked::fused_pass_kernel<BV, Stages>;
  allow_shared(reinterpret_cast<const void*>(kernel), smem, device, op, true);
  kernel<<<dim3(static_cast<unsigned>(a.N), static_cast<unsigned>(a.Hv), chunked::kFusedD / BV),
           chunked::kFusedThreads, smem, stream>>>(a);
  check(cudaGetLastError(), op, "fused_pass_kernel launch");
}
// One stage (two blocks per SM) by DecodeOverrides::chunked_state_buffers = 1 at 64 or 32 columns
// (opt-in, unmeasured), else two.
void launch_fused_pass(const ChunkArgs& a, int columns, const DecodeOverrides& forced, int device,
                       cudaStream_t stream, const char* op) {
  const bool one_stage = forced.chunked_state_buffers == 1;
  if (columns == 32 && one_stage)
    launch_fused_pass_columns<32, 1>(a, device, stream, op);
  else if (columns == 32)
    launch_fused_pass_columns<32>(a, device, stream, op);
  else if (columns == 64 && one_stage)
    launch_fused_pass_columns<64, 1>(a, device, stream, op);
  else if (columns == 64)
    launch_fused_pass_columns<64>(a, device, stream, op);
  else
    launch_fused_pass_columns<128>(a, device, stream, op);
}

// Value columns per block of the fused pass: 128 (the rule takes the pass only where sequences x
// heads fill the SMs); DecodeOverrides::chunked_state_columns = 32, 64 or 128 forces it (forced
// into the pass at 1 x 16384, H100, 921d278: 128 columns 2.47 ms, 64 2.04, 32 1.62).
int fused_columns(const DecodeOverrides& forced) {
  const int f = forced.chunked_state_columns;
  return f == 32 || f == 64 || f == 128 ? f : chunked::kFusedD;
}
std::size_t fused_smem_bytes(int columns) {
  return columns == 32   ? chunked::FusedPassSmem<32>::bytes
         : columns == 64 ? chunked::FusedPassSmem<64>::bytes
                         : chunked::FusedPassSmem<128>::bytes;
}

// Value columns per block of the unsplit state pass: 32, 16 when 32 would leave more than half the
// SMs idle; DecodeOverrides::chunked_state_columns = 16 or 32 forces it.
int state_columns(const Problem& prob, const DecodeOverrides& forced, int sms) {
  if (forced.chunked_state_columns == 16 || forced.chunked_state_columns == 32)
    return forced.chunked_state_columns;
  return 2 * prob.N * prob.Hv * (prob.Dv / 32) <= sms ? 16 : 32;
}

// Whether the warpgroup-product pass runs (state_pass_wgmma_kernel.cuh; opt-in, correct and slower
// on an H100: DecodeOverrides::chunked_state_pass = 3): wherever the bf16 pass would (bf16 scratch,
// Dk = 128, unsplit) with 32 value columns.
bool wgmma_state_pass(const ChunkArgs& a, const Problem& prob, const DecodeOverrides& forced,
                      int sms, int smem_optin) {
  return forced.chunked_state_pass == 3 && prob.dtype != DType::f32 &&
         prob.Dk == chunked::kStateBf16Dk && a.seg_chunks == 0 &&
         state_columns(prob, forced, sms) == 32 &&
         chunked::StateWgmmaSmem<true>::bytes <= static_cast<std::size_t>(smem_optin);
}

// Whether the bf16 prep kernel runs (prep_bf16_kernel.cuh): the row-factor path with 16-byte
// aligned q, k, v rows, unless DecodeOverrides::chunked_prep = 1, where its shared memory fits.
bool prep_bf16_applies(const ChunkArgs& a, const DecodeOverrides& forced, int smem_optin) {
  return a.row_factors && a.rows16 && forced.chunked_prep != 1 &&
         chunked::prep_bf16_smem_bytes(a.Dk, a.Dv) <= static_cast<std::size_t>(smem_optin);
}

// Whether the fused pass runs (fused_pass_kernel.cuh): the row-factor path with the bf16 prep
// (16-byte aligned q, k, v rows) at Dk = Dv = 128, unsplit, with chunks, where both kernels' shared
// memory fits; by rule where sequences x value heads fill the SMs (heuristics::
// cuda_chunked_fused_pass, with its measurements), or forced by DecodeOverrides::chunked_state_pass
// = 5. It computes the output and takes prep's fused mode (T~ and ek instead of W and U).
bool fused_state_pass(const ChunkArgs& a, const Problem& prob, const DecodeOverrides& forced,
                      int sms, int smem_optin) {
  const bool wanted =
      forced.chunked_state_pass == 5 ||
      (forced.chunked_state_pass == 0 && heuristics::cuda_chunked_fused_pass(prob.N, prob.Hv, sms));
  return wanted && prep_bf16_applies(a, forced, smem_optin) && prob.Dk == chunked::kFusedD &&
         prob.Dv == chunked::kFusedD && a.seg_chunks == 0 && a.slots > 0 &&
         fused_smem_bytes(fused_columns(forced)) <= static_cast<std::size_t>(smem_optin);
}

// Whether the output is computed inside the state pass instead of by chunk_output_kernel: where the
// bf16 pass runs on the row-factor path (row factors, Dk = 128, unsplit, not forced to the general
// pass; state_pass_bf16_kernel<BV, true>), and wherever the warpgroup pass runs (also on the
// stored Qs, Kd rows), unless DecodeOverrides::chunked_overlap = 1 or 2 asks for the output
// kernel. The rule since 350ff10 (H100, ef0210b, bench/results/2026-12-07-chunk-knobs-h100-ef0210b
// .json): 16-24% less time than the overlapped output kernel on every scalar-gate benchmark row
// (1 x 16384: 2.52 -> 2.12 ms, 8 x 4096: 5.04 -> 4.02, 1 x 65536: 9.52 -> 7.67).
bool fused_output(const ChunkArgs& a, const Problem& prob, const DecodeOverrides& forced, int sms,
                  int smem_optin) {
  if (fused_state_pass(a, prob, forced, sms, smem_optin)) return true;
  if (forced.chunked_overlap == 1 || forced.chunked_overlap == 2 || a.slots == 0) return false;
  if (wgmma_state_pass(a, prob, forced, sms, smem_optin)) return true;
  return a.row_factors && prob.Dk == chunked::kStateBf16Dk && forced.chunked_state_pass != 1 &&
         a.seg_chunks == 0 &&
         chunked::state_bf16_smem_bytes<32, true>() <= static_cast<std::size_t>(smem_optin);
}

// Prep, state pass and output kernels with scratch elements St. fuse_out: fused_output's answer.
template <class St>
void run_kernels(ChunkArgs a, const Problem& prob, const DecodeOverrides& forced, int sms,
                 int smem_optin, int dev, cudaStream_t stream, const char* op, bool fuse_out) {
  // The bf16 prep kernel (prep_bf16_kernel.cuh) where it applies: the row-factor path with
  // 16-byte aligned q, k, v rows.
  bool prep_bf16 = false;
  if constexpr (sizeof(St) == 2) prep_bf16 = prep_bf16_applies(a, forced, smem_optin);
  const bool fused = prep_bf16 && fused_state_pass(a, prob, forced, sms, smem_optin);
  if (fused) a.ek = static_cast<float*>(a.U);  // prep's fused mode; U's scratch is free then
  if (a.slots > 0 && prep_bf16) {
    launch_prep_bf16(a, dev, stream, op);
  } else if (a.slots > 0) {
    if (a.per_key)
      chunked::launch_prep_kernel<true, St>(a, dev, stream, op);
    else
      chunked::launch_prep_kernel<false, St>(a, dev, stream, op);
  }
  // Two W / Kd buffers (the next chunk's copies a whole chunk ahead) when the blocks fit in one
  // wave and the shared memory allows, else one.
  auto buffers = [&](std::int64_t blocks, int bv) {
    const bool fit2 =
        chunked::state_smem_bytes<St>(a.Dk, bv, 2) <= static_cast<std::size_t>(smem_optin);
    if (forced.chunked_state_buffers == 1 || forced.chunked_state_buffers == 2)
      return fit2 ? forced.chunked_state_buffers : 1;
    return blocks <= sms && fit2 ? 2 : 1;
  };
  if (a.seg_chunks > 0) {
    // Segment split (heuristics::cuda_chunked_segment_chunks: only where the unsplit pass would
    // leave most SMs idle): maps, the sequential combine, the segments; 16 value columns.
    chunked::launch_state_kernel<16, St>(
        a, buffers(a.seg_slots * prob.Hv * (prob.Dv + prob.Dk) / 16, 16), 1, dev, stream, op);
    launch_combine(a, dev, stream, op);
    chunked::launch_state_kernel<16, St>(a, buffers(a.seg_slots * prob.Hv * prob.Dv / 16, 16), 2,
                                         dev, stream, op);
  } else {
    const std::int64_t blocks32 = prob.N * prob.Hv * (prob.Dv / 32);
    const int bv = state_columns(prob, forced, sms);
    const int nbuf = buffers(blocks32 * (32 / bv), bv);
    // Overlap of the output kernel with this pass (src/cuda/chunked/chunked_kernels.cuh): on by
    // rule where the output kernel reads the chunk states with 16-byte copies (cp.async.cg, L2:
    // never a stale L1 line) and there are chunks.
    const bool cg_states = a.states16 != nullptr || a.states_vec;
    if (!fuse_out && forced.chunked_overlap != 1 && cg_states && a.slots > 0 && a.progress_buf) {
      a.progress = a.progress_buf;
      a.state_bv = bv;
      check(cudaMemsetAsync(a.progress, 0, sizeof(int) * prob.N * prob.Hv * (prob.Dv / bv), stream),
            op, "cudaMemsetAsync(progress)");
    }
    // The bf16 state pass with the state in registers (state_pass_bf16_kernel.cuh) where it
    // applies: bf16 scratch at Dk = 128, on the row-factor path and on the stored Kd rows
    // (per-key gate, masks, f16 inputs; the rule there since 350ff10: per-key 1 x 16384 on an
    // H100 5.86 -> 5.31 ms against the general pass); DecodeOverrides::chunked_state_pass = 1
    // forces the general pass.
    bool state_bf16 = false;
    const bool stored = !a.row_factors;
    if constexpr (sizeof(St) == 2)
      state_bf16 = a.Dk == chunked::kStateBf16Dk && forced.chunked_state_pass != 1 &&
                   chunked::state_bf16_smem_bytes<32>() <= static_cast<std::size_t>(smem_optin);
    // Stages of the bf16 pass's copies: 2 (the rule), or 3 / 4 by DecodeOverrides::
    // chunked_state_buffers (opt-in until measured; not with the output inside the pass, whose
    // q and P rows would not fit a third stage).
    const int stages = forced.chunked_state_buffers == 3 || forced.chunked_state_buffers == 4
                           ? forced.chunked_state_buffers
                           : 2;
    const bool wgmma = wgmma_state_pass(a, prob, forced, sms, smem_optin);
    const int wgmma_stages = forced.chunked_state_buffers == 1 || forced.chunked_state_buffers == 2
                                 ? forced.chunked_state_buffers
                                 : (blocks32 > sms ? 1 : 2);
    if (fused)
      launch_fused_pass(a, fused_columns(forced), forced, dev, stream, op);
    else if (wgmma && fuse_out && stored)
      launch_state_wgmma<true, true>(a, wgmma_stages, dev, stream, op);
    else if (wgmma && fuse_out)
      launch_state_wgmma<true>(a, wgmma_stages, dev, stream, op);
    else if (wgmma && stored)
      launch_state_wgmma<false, true>(a, wgmma_stages, dev, stream, op);
    else if (wgmma)
      launch_state_wgmma<false>(a, wgmma_stages, dev, stream, op);
    else if (fuse_out && forced.chunked_state_pass == 6 && bv == 32 &&
             chunked::StateWsSmem::bytes <= static_cast<std::size_t>(smem_optin))
      // The warp-specialised single-product pass (opt-in: correct, slower on an H100).
      launch_state_ws(a, dev, stream, op);
    else if (fuse_out && (forced.chunked_state_pass == 0 || forced.chunked_state_pass == 4 ||
                          forced.chunked_state_pass == 6))
      // Single products (state_pass_bf16_kernel.cuh), the rule since it ran (H100, 921d278):
      // 1 x 16384 1.54 ms against 1.84 with the double products (chunked_state_pass = 2), 1 x
      // 65536 6.07 against 6.95, 1 x 32768 Hk 32 3.30 against 3.55, 1 x 4096 0.50 against 0.52.
      bv == 16 ? launch_state_bf16<16, true, false, 2, true>(a, dev, stream, op)
               : launch_state_bf16<32, true, false, 2, true>(a, dev, stream, op);
    else if (fuse_out && bv == 16)
      launch_state_bf16<16, true>(a, dev, stream, op);
    else if (fuse_out)
      launch_state_bf16<32, true>(a, dev, stream, op);
    else if (state_bf16 && stored)
      bv == 16 ? launch_state_bf16<16, false, true>(a, dev, stream, op)
               : launch_state_bf16<32, false, true>(a, dev, stream, op);
    else if (state_bf16 && stages == 3)
      bv == 16 ? launch_state_bf16<16, false, false, 3>(a, dev, stream, op)
               : launch_state_bf16<32, false, false, 3>(a, dev, stream, op);
    else if (state_bf16 && stages == 4)
      bv == 16 ? launch_state_bf16<16, false, false, 4>(a, dev, stream, op)
               : launch_state_bf16<32, false, false, 4>(a, dev, stream, op);
    else if (state_bf16 && bv == 16)
      launch_state_bf16<16, false>(a, dev, stream, op);
    else if (state_bf16)
      launch_state_bf16<32, false>(a, dev, stream, op);
    else if (bv == 16)
      chunked::launch_state_kernel<16, St>(a, nbuf, 0, dev, stream, op);
    else
      chunked::launch_state_kernel<32, St>(a, nbuf, 0, dev, stream, op);
  }
  if (a.slots > 0 && !fuse_out) {
    if constexpr (chunked::kX3<St>)
      launch_output<St, false>(a, dev, stream, op);
    else
      a.states16 ? launch_output<St, true>(a, dev, stream, op)
                 : launch_output<St, false>(a, dev, stream, op);
  }
}

}  // namespace

void chunked_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config,
                     const char* op) {
  const Inputs& in = p.in;
  // Validated by the dispatcher (core/cuda_support.cpp validate_cuda_forward).
  if (prob.N == 0 || prob.Hv == 0) return;
  DeviceGuard guard(prob.device_index, op);
  const auto stream = static_cast<cudaStream_t>(config.stream);

  ChunkArgs a = chunked::chunk_inputs(prob, in, p.opts, op);
  chunked::take_prep_overrides(a, config.decode_overrides);
  a.o = p.o.data;
  a.o_sb = p.o.stride[0], a.o_st = p.o.stride[1], a.o_sh = p.o.stride[2];
  if (p.final_state.defined()) {
    a.hout = static_cast<float*>(p.final_state.data);
    a.hout_s0 = p.final_state.stride[0], a.hout_s1 = p.final_state.stride[1];
    a.hout_s2 = p.final_state.stride[2];
  }
  const int dev = prob.device_index;
  const int sms = sm_count(dev, op);
  const int smem_optin = cuda::smem_optin(dev, op);

  // Segment split of the state pass: chunks per segment from the rule, or the override (tests).
  static const DecodeOverrides kRules{};
  const DecodeOverrides& overrides = config.decode_overrides ? *config.decode_overrides : kRules;
  {
    const int forced = overrides.chunked_segments;
    std::int64_t cs =
        heuristics::cuda_chunked_segment_chunks(prob.N, prob.Hv, prob.Dk, prob.Dv, a.slots, sms);
    if (forced > 0) cs = forced;
    if (forced < 0) cs = 0;
    if (cs > 0 && a.slots > 0) {
      a.seg_chunks = static_cast<int>(cs);
      if (prob.varlen) {
        a.seg_slots = prob.N + a.slots / cs;  // >= sum_n max(1, ceil(chunks(n) / cs))
      } else {
        a.nseg_fixed = a.nc > 0 ? (a.nc + cs - 1) / cs : 1;
        a.seg_slots = prob.N * a.nseg_fixed;
      }
      if (a.seg_slots > INT_MAX) a.seg_chunks = 0, a.seg_slots = 0, a.nseg_fixed = 0;
    }
  }

  // Scratch: W, U, Qs, Kd, P (St), the chunk states unless `saved` holds them, gn (fp32),
  // chunk offsets. Every region is a multiple of 16 bytes (C = 64 rows of Dk, Dv, C elements).
  const bool x3 = prob.dtype == DType::f32;
  const std::int64_t esize = x3 ? 4 : 2;
  const std::int64_t items = a.slots * prob.Hv;
  // Row factors instead of Qs and Kd: scalar gate, bf16 inputs, no mask (rows past a chunk are
  // the only zero rows), q and k rows 16-byte aligned for cp.async.
  a.row_factors = !a.per_key && prob.dtype == DType::bf16 && !in.mask.defined() &&
                  chunked::rows_16byte_aligned(in.q) && chunked::rows_16byte_aligned(in.k);
  // The output inside the state pass needs no chunk-state rows of its own (only `saved`'s).
  const bool fuse_out = fused_output(a, prob, overrides, sms, smem_optin);
  const bool own_states = !p.saved.defined() && !fuse_out;
  const std::int64_t st_elems = items * (kC * ((a.row_factors ? 1 : 3) * prob.Dk + prob.Dv + kC) +
                                         (own_states ? prob.Dk * prob.Dv : 0));
  const std::int64_t floats = items * ((a.per_key ? prob.Dk : 1) + (a.row_factors ? 2 * kC : 0));
  // Progress counters of the overlap (unsplit pass): [N, Hv, Dv / 16] ints at most.
  const std::int64_t progress_ints = a.seg_chunks > 0 ? 0 : prob.N * prob.Hv * (prob.Dv / 16);
  const std::int64_t seg_floats =
      a.seg_chunks > 0 ? a.seg_slots * prob.Hv * prob.Dk * (2 * prob.Dv + prob.Dk) : 0;
  const std::int64_t bytes = st_elems * esize + (floats + seg_floats + progress_ints) * 4 +
                             (prob.varlen ? 2 * (prob.N + 1) * 8 : 0) + 256;
  const DeviceScratch scratch(config, static_cast<std::size_t>(bytes), stream, op);
  char* b = static_cast<char*>(scratch.data());
  auto take = [&](std::int64_t elems, std::int64_t size) {
    void* r = b;
    b += elems * size;
    return r;
  };
  a.W = take(items * kC * prob.Dk, esize);
  a.U = take(items * kC * prob.Dv, esize);
  if (!a.row_factors) {
    a.Qs = take(items * kC * prob.Dk, esize);
    a.Kd = take(items * kC * prob.Dk, esize);
  }
  a.P = take(items * kC * kC, esize);
  if (own_states) {  // 16-byte aligned: every region before it is a multiple of 16 bytes
    // Only the output kernel reads them: bf16 for 16-bit inputs (states16), else fp32.
    void* rows = take(items * prob.Dk * prob.Dv, x3 ? 4 : 2);
    if (x3)
      a.saved = static_cast<float*>(rows);
    else
      a.states16 = static_cast<__nv_bfloat16*>(rows);
    a.saved_s0 = prob.Hv * prob.Dk * prob.Dv, a.saved_s1 = prob.Dk * prob.Dv;
  } else if (p.saved.defined() && p.saved.dtype == DType::bf16) {
    // bf16 chunk states (16-bit inputs; validate_saved)
    a.states16 = static_cast<__nv_bfloat16*>(p.saved.data);
    a.saved_s0 = p.saved.stride[0], a.saved_s1 = p.saved.stride[1];
  } else if (p.saved.defined()) {
    a.saved = static_cast<float*>(p.saved.data);
    a.saved_s0 = p.saved.stride[0], a.saved_s1 = p.saved.stride[1];
  }  // else fuse_out without `saved`: the chunk states stay on chip
  if (a.row_factors) {
    a.fq = static_cast<float*>(take(items * kC, 4));
    a.fk = static_cast<float*>(take(items * kC, 4));
  }
  if (a.seg_chunks > 0) {
    a.segmap = static_cast<float*>(take(a.seg_slots * prob.Hv * prob.Dk * (prob.Dv + prob.Dk), 4));
    a.segstart = static_cast<float*>(take(a.seg_slots * prob.Hv * prob.Dk * prob.Dv, 4));
  }
  if (progress_ints > 0) a.progress_buf = static_cast<int*>(take(progress_ints, 4));
  a.gn = static_cast<float*>(take(items * (a.per_key ? prob.Dk : 1), 4));
  a.states_vec = reinterpret_cast<std::uintptr_t>(a.saved) % 16 == 0 && a.saved_s0 % 4 == 0 &&
                 a.saved_s1 % 4 == 0;
  a.chunk_off = reinterpret_cast<std::int64_t*>((reinterpret_cast<std::uintptr_t>(b) + 15) &
                                                ~static_cast<std::uintptr_t>(15));
  if (prob.varlen && a.seg_chunks > 0) a.seg_off = a.chunk_off + prob.N + 1;
  if (prob.varlen) {
    chunked::chunk_table_kernel<<<1, 1024, 0, stream>>>(a);
    check(cudaGetLastError(), op, "chunk_table_kernel launch");
  }
  if (x3)
    run_kernels<float>(a, prob, overrides, sms, smem_optin, dev, stream, op, false);
  else
    run_kernels<__nv_bfloat16>(a, prob, overrides, sms, smem_optin, dev, stream, op, fuse_out);
}

}  // namespace gdr::cuda
