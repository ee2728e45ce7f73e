// Host side of the CUDA decode kernels: gdr::cuda::decode (state pool updated in place) and
// gdr::cuda::recurrent_forward (h0 -> final_state, any T, varlen) fill the kernels' arguments,
// ask plan.h for the call's plan and execute it (docs/cuda-decode.md). The calls arrive validated
// (core/validate.cpp, core/cuda_support.cpp). Every kernel instantiation is made here:
//  - the staged kernel (recurrent.cuh): Dk in {64, 128, 256} x both state layouts x both gate
//    kinds (12), and its narrow k-first tile at Dk 64 and 128 (4);
//  - the one-token kernel (recurrent_one.cuh): Dk x both gate kinds x an fp32 or a bf16 pool (12);
//  - the chunk kernel (recurrent_chunk.cuh): items of 64 or 128 value columns x three token
//    dtypes x {static items with the first state wait early or late, dynamic items} x two state
//    dtypes (36);
//  - the ring kernel (recurrent_ring.cuh): three token dtypes x both gate kinds with token-by-token
//    consumers, and the two 16-bit token dtypes with chunk consumers (8);
//  - the slice kernel (recurrent_slice.cuh): two 16-bit token dtypes (2).
// Dv, the dtypes (but the chunk, ring and slice kernels' token dtype) and the fused options are
// run-time values.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common/launch.h"
#include "cuda/common/pools.h"
#include "cuda/common/tensor_maps.h"
#include "cuda/decode/plan.h"
#include "cuda/decode/recurrent.cuh"
#include "cuda/decode/recurrent_chunk.cuh"
#include "cuda/decode/recurrent_one.cuh"
#include "cuda/decode/recurrent_ring.cuh"
#include "cuda/decode/recurrent_slice.cuh"
#include "cuda/decode/tuning.h"
#include "cuda/paths.h"
#include "gdr/decode_overrides.h"
#include "gdr/error.h"

namespace gdr::cuda {
namespace {

using detail::RecurrentArgs;

// The rules' facts of the kernels (tuning.h) are the kernels' own.
static_assert(detail::RingLayout::kCB == kRingItemColumns &&
              detail::RingLayoutT<true>::kCB == kRingItemColumns);
static_assert(detail::RingLayout::kTokBytes == kRingTokenBytesPerKey * detail::RingLayout::kCB);
static_assert(detail::kRingMaxKeyTokens == 4 &&
              recurrent_ring_applies(detail::kRingMaxKeyTokens, 2, false, false, true, 128, 128,
                                     false, true, true) &&
              !recurrent_ring_applies(detail::kRingMaxKeyTokens + 1, 2, false, false, true, 128,
                                      128, false, true, true));
static_assert(detail::kRingSlots == kRingSlotsRule);
static_assert(detail::ring_warps(false) == kRingConsumerWarps + 1 &&
              detail::ring_warps(true) == kRingConsumerWarps + 2);
static_assert(detail::kSliceCols == kSliceColumns && detail::kSliceWarps == kSliceWarpsRule);
static_assert(2 * detail::ChunkLayout<8>::kCB == 8 * 32 &&
              2 * detail::ChunkLayout<4>::kCB == 4 * 32);

// Rows of `t` (every dim but the last) start on 16-byte boundaries.
bool rows16(const TensorView& t) {
  if (!t.defined()) return false;
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) return false;
  const int es = dtype_size(t.dtype);
  for (int d = 0; d + 1 < t.rank; ++d)
    if ((t.stride[d] * es) % 16 != 0) return false;
  return true;
}

// 16-byte state accesses need a 16-byte aligned base and row strides of whole 16-byte units
// (4 f32 or 8 bf16 elements).
bool vectorizable(const TensorView& t) {
  if (!t.defined()) return false;
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  const std::int64_t unit = 16 / dtype_size(t.dtype);
  return addr % 16 == 0 && t.stride[0] % unit == 0 && t.stride[1] % unit == 0 &&
         t.stride[2] % unit == 0;
}

template <typename F>
void with_dim(std::int64_t d, F&& f) {
  switch (d) {
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    case 256: f(std::integral_constant<int, 256>{}); return;
  }
  throw InvalidArgument("gdr cuda: head dim " + std::to_string(d) + " has no kernel");
}

template <typename F>
void with_bool(bool x, F&& f) {
  if (x)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// Fills the token-input half of the arguments (shared by decode and forward).
void set_token_inputs(RecurrentArgs& a, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& g, const TensorView& beta,
                      const TensorView& mask, const TensorView& o, const TensorView& A_log,
                      const TensorView& dt_bias, const Options& opts, const Problem& prob) {
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.g = g.data;
  a.beta = beta.data;
  a.o = o.data;
  a.q_sb = q.stride[0], a.q_st = q.stride[1], a.q_sh = q.stride[2];
  a.k_sb = k.stride[0], a.k_st = k.stride[1], a.k_sh = k.stride[2];
  a.v_sb = v.stride[0], a.v_st = v.stride[1], a.v_sh = v.stride[2];
  a.o_sb = o.stride[0], a.o_st = o.stride[1], a.o_sh = o.stride[2];
  a.g_sb = g.stride[0], a.g_st = g.stride[1], a.g_sh = g.stride[2];
  a.beta_sb = beta.stride[0], a.beta_st = beta.stride[1], a.beta_sh = beta.stride[2];
  if (mask.defined()) {
    a.mask = static_cast<const std::uint8_t*>(mask.data);
    a.mask_sb = mask.stride[0], a.mask_st = mask.stride[1];
  }
  a.gate_in_kernel = opts.gate_in_kernel;
  if (opts.gate_in_kernel) {
    a.A_log = static_cast<const float*>(A_log.data);
    if (dt_bias.defined()) {
      a.dt_bias = static_cast<const float*>(dt_bias.data);
      a.dt_bias_sh = dt_bias.stride[0];
    }
  }
  a.beta_sigmoid = opts.beta_sigmoid;
  a.qk_l2norm = opts.qk_l2norm;
  a.eps = opts.l2norm_eps;
  a.scale = prob.scale;  // resolved once by validation (opts.scale, or 1/sqrt(Dk))
  a.in_dtype = static_cast<int>(prob.dtype);
  a.g_dtype = static_cast<int>(g.dtype);
  a.beta_dtype = static_cast<int>(beta.dtype);
  a.Hv = static_cast<int>(prob.Hv);
  a.group = static_cast<int>(prob.Hv / prob.Hk);
  // 16-byte staging units (the plan also needs the block's v columns to be whole units).
  a.vec_tok = rows16(q) && rows16(k) && rows16(v) && (prob.gate == GateKind::scalar || rows16(g));
  a.vec_o = rows16(o);
}

// The plan's view of a call whose arguments are filled.
DecodeProblem plan_problem(const RecurrentArgs& a, const Problem& prob, bool v_first) {
  DecodeProblem p;
  p.N = a.N;
  p.T = a.T;
  p.Hv = prob.Hv;
  p.Dk = prob.Dk;
  p.Dv = prob.Dv;
  p.dtype = prob.dtype;
  p.per_key = prob.gate == GateKind::per_key;
  p.v_first = v_first;
  p.varlen = a.cu_seqlens != nullptr;
  p.state_bf16 = a.state_bf16;
  p.reads_state = a.h_in != nullptr;
  p.writes_state = a.h_out != nullptr;
  p.state_in_rows16 = a.vec_in;
  p.state_out_rows16 = a.vec_out;
  p.token_rows16 = a.vec_tok;
  // One bulk copy each way per ring item, as the kernel tests it.
  p.ring_items_contiguous =
      a.hin_s2 == kRingItemColumns && (!a.h_out || a.hout_s2 == kRingItemColumns);
  return p;
}

// ---- the plan's kernel: each calls f(kernel) with the instantiation the plan names ----

// The staged kernel's tokens per staged chunk and its dynamic shared memory.
int staged_tc(const DecodeProblem& p) {
  int tc = 0;
  with_dim(p.Dk, [&](auto dk) {
    constexpr int TC = detail::Tile<decltype(dk)::value, false>::kTC;
    tc = static_cast<int>(p.T < TC ? (p.T > 0 ? p.T : 1) : TC);
  });
  return tc;
}
std::size_t staged_smem(const DecodeProblem& p, const DecodePlan& plan) {
  if (plan.kernel == DecodeKernel::one_token) return 0;
  return sizeof(float) *
         detail::shared_floats(static_cast<int>(p.Dk), p.per_key, staged_tc(p), plan.columns);
}

template <typename F>
void with_staged_kernel(const DecodeProblem& p, const DecodePlan& plan, F&& f) {
  const bool narrow = plan.kernel == DecodeKernel::staged_narrow;
  with_dim(p.Dk, [&](auto dk) {
    constexpr int DK = decltype(dk)::value;
    if (plan.kernel == DecodeKernel::one_token) {
      with_bool(p.per_key, [&](auto pk) {
        if (p.state_bf16)
          f(detail::recurrent_one_kernel<DK, decltype(pk)::value, true>);
        else
          f(detail::recurrent_one_kernel<DK, decltype(pk)::value>);
      });
      return;
    }
    with_bool(p.v_first, [&](auto vf) {
      with_bool(p.per_key, [&](auto pk) {
        constexpr bool VF = decltype(vf)::value, PK = decltype(pk)::value;
        static_assert(detail::Tile<DK, VF>::kCW == recurrent_columns_per_warp(DK, VF));
        if constexpr (!VF && DK < 256) {
          static_assert(detail::Tile<DK, false, true>::kCW ==
                        recurrent_columns_per_warp(DK, false, true));
          if (narrow) {
            f(detail::recurrent_kernel<DK, false, PK, true>);
            return;
          }
        }
        f(detail::recurrent_kernel<DK, VF, PK>);
      });
    });
  });
}

// The chunk kernel's block: 2 x item columns threads; its shared memory (16-bit inputs are exact
// in tf32: no shared lo parts).
template <int W>
std::size_t chunk_smem(const DecodeProblem& p) {
  return detail::ChunkLayout<W>::bytes(p.dtype != DType::f32, dtype_size(p.dtype));
}

template <typename F>
void with_chunk_kernel(const DecodeProblem& p, const DecodePlan& plan, F&& f) {
  auto by_schedule = [&](auto w, auto dt, auto sb) {
    constexpr int W = decltype(w)::value, DT = decltype(dt)::value;
    constexpr bool SB = decltype(sb)::value;
    const std::size_t smem = chunk_smem<W>(p);
    if (plan.chunk_dynamic)
      f(detail::recurrent_chunk_kernel<W, DT, true, true, SB>, smem);
    else if (plan.chunk_first_late)
      f(detail::recurrent_chunk_kernel<W, DT, true, false, SB>, smem);
    else
      f(detail::recurrent_chunk_kernel<W, DT, false, false, SB>, smem);
  };
  auto by_columns = [&](auto dt) {
    with_bool(p.state_bf16, [&](auto sb) {
      if (plan.columns == 128)
        by_schedule(std::integral_constant<int, 8>{}, dt, sb);
      else
        by_schedule(std::integral_constant<int, 4>{}, dt, sb);
    });
  };
  if (p.dtype == DType::bf16)
    by_columns(std::integral_constant<int, detail::kBF16>{});
  else if (p.dtype == DType::f16)
    by_columns(std::integral_constant<int, detail::kF16>{});
  else
    by_columns(std::integral_constant<int, detail::kF32>{});
}

template <typename F>
void with_ring_kernel(const DecodeProblem& p, const DecodePlan& plan, F&& f) {
  if (plan.ring_chunk_math) {
    if (p.dtype == DType::bf16)
      f(detail::recurrent_ring_kernel<detail::kBF16, false, true>);
    else
      f(detail::recurrent_ring_kernel<detail::kF16, false, true>);
    return;
  }
  with_bool(p.per_key, [&](auto pk) {
    constexpr bool PK = decltype(pk)::value;
    if (p.dtype == DType::bf16)
      f(detail::recurrent_ring_kernel<detail::kBF16, PK>);
    else if (p.dtype == DType::f16)
      f(detail::recurrent_ring_kernel<detail::kF16, PK>);
    else
      f(detail::recurrent_ring_kernel<detail::kF32, PK>);
  });
}

std::size_t ring_smem(const DecodePlan& plan) {
  return plan.ring_chunk_math ? detail::RingLayoutT<true>::kBytes : detail::RingLayout::kBytes;
}

// DeviceFacts::blocks_per_sm: the plan's kernel's occupancy on `device` (its shared memory allowed
// first where it needs more than the default).
int plan_blocks_per_sm(const DecodeProblem& p, const DecodePlan& plan, int device, const char* op) {
  int per_sm = 0;
  const int threads = plan.warps * 32;
  switch (plan.kernel) {
    case DecodeKernel::ring:
      with_ring_kernel(p, plan, [&](auto kernel) {
        const void* k = reinterpret_cast<const void*>(kernel);
        allow_shared(k, ring_smem(plan), device, op);
        per_sm = blocks_per_sm(k, threads, ring_smem(plan), device, op);
      });
      break;
    case DecodeKernel::chunk:
      with_chunk_kernel(p, plan, [&](auto kernel, std::size_t smem) {
        const void* k = reinterpret_cast<const void*>(kernel);
        allow_shared(k, smem, device, op);
        per_sm = blocks_per_sm(k, threads, smem, device, op);
      });
      break;
    case DecodeKernel::slice: break;  // one block per item: the grid needs no occupancy
    default:
      with_staged_kernel(p, plan, [&](auto kernel) {
        per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, staged_smem(p, plan),
                               device, op);
      });
  }
  return per_sm;
}

// ---- executing a plan ----

// RecurrentArgs::splits for the plan's grid; refused when beyond one launch's grid.
void set_splits(RecurrentArgs& a, const Problem& prob, const DecodePlan& plan, const char* op) {
  if (plan.items > INT_MAX)
    refuse(op, "N * Hv is " + std::to_string(a.N * prob.Hv) +
                   "; too many sequences x heads for one launch");
  a.splits = static_cast<int>(prob.Dv / plan.columns);
}

// The chunk consumers' tensor maps: the input state and (if any) the output state, q, k and v.
// False: the maps cannot describe them (the ring's consumers then take the tokens one by one).
bool ring_maps(const RecurrentArgs& a, const Problem& prob, detail::RingMaps* maps) {
  using L = detail::RingLayoutT<true>;
  constexpr int row = L::kRowBytes / 2, mt = detail::kRingMaxTokens;
  *maps = detail::RingMaps{};
  return a.h_in &&
         encode_state_map(&maps->in, a.h_in, prob, a.P, a.hin_s0, a.hin_s1, a.hin_s2, L::kCB,
                          L::kDK) &&
         (!a.h_out || encode_state_map(&maps->out, a.h_out, prob, a.P, a.hout_s0, a.hout_s1,
                                       a.hout_s2, L::kCB, L::kDK)) &&
         encode_token_map(&maps->q, a.q, prob, prob.Hk, prob.Dk, a.q_sb, a.q_st, a.q_sh, row, mt) &&
         encode_token_map(&maps->k, a.k, prob, prob.Hk, prob.Dk, a.k_sb, a.k_st, a.k_sh, row, mt) &&
         encode_token_map(&maps->v, a.v, prob, prob.Hv, prob.Dv, a.v_sb, a.v_st, a.v_sh, row, mt);
}

// The ring kernel: one persistent block per SM; its dynamic items' counter pair where the plan
// wants them (none to be had: static items).
void launch_ring(RecurrentArgs& a, const Problem& prob, const DecodeProblem& p,
                 const DecodePlan& plan, const detail::RingMaps& maps, const char* op,
                 cudaStream_t stream) {
  set_splits(a, prob, plan, op);
  if (plan.items == 0) return;
  a.prefetch_blocks = a.prefetch_wave = 0;
  a.state_ld_normal = plan.state_loads_normal;
  if (plan.resident <= 0) refuse(op, "the ring kernel does not fit on this device");
  bool pooled = false;
  a.item_counter = plan.ring_dynamic_round > 0
                       ? dynamic_counter_pair(prob.device_index, stream, &pooled, op)
                       : nullptr;
  a.dynamic_round = a.item_counter ? static_cast<unsigned>(plan.ring_dynamic_round) : 0u;
  a.setup_before_wait = plan.ring_setup_early;
  with_ring_kernel(p, plan, [&](auto kernel) {
    // A pool pair's memset lies between this launch and the grid before it: a plain launch.
    launch_kernel(kernel, static_cast<unsigned>(plan.blocks), plan.warps * 32, ring_smem(plan),
                  stream, plan.pdl && !pooled, a, maps);
  });
  if (pooled) check(cudaFreeAsync(a.item_counter, stream), op, "cudaFreeAsync");
  a.item_counter = nullptr;
  a.dynamic_round = 0;
  a.setup_before_wait = false;
  check(cudaGetLastError(), op, "ring kernel launch");
}

// The chunk kernel: persistent blocks; dynamic items where the plan wants them and a counter pair
// is to be had.
void launch_chunk(RecurrentArgs& a, const Problem& prob, const DecodeProblem& p,
                  const DecodePlan& plan, const char* op, cudaStream_t stream) {
  set_splits(a, prob, plan, op);
  if (plan.items == 0) return;
  a.prefetch_blocks = a.prefetch_wave = 0;  // the kernel copies its next item itself
  if (plan.resident <= 0) refuse(op, "the chunk kernel does not fit on this device");
  bool pooled = false;
  unsigned* counter =
      plan.chunk_dynamic ? dynamic_counter_pair(prob.device_index, stream, &pooled, op) : nullptr;
  a.item_counter = counter;
  DecodePlan run = plan;
  run.chunk_dynamic = counter != nullptr;
  with_chunk_kernel(p, run, [&](auto kernel, std::size_t smem) {
    allow_shared(reinterpret_cast<const void*>(kernel), smem, prob.device_index, op);
    // A pool pair's memset lies between this launch and the grid before it: a plain launch.
    launch_kernel(kernel, static_cast<unsigned>(plan.blocks), plan.warps * 32, smem, stream,
                  plan.pdl && !pooled, a);
  });
  if (pooled) check(cudaFreeAsync(counter, stream), op, "cudaFreeAsync");
  a.item_counter = nullptr;
  check(cudaGetLastError(), op, "chunk kernel launch");
}

void launch_slice(RecurrentArgs& a, const Problem& prob, const DecodePlan& plan, const char* op,
                  cudaStream_t stream) {
  set_splits(a, prob, plan, op);
  if (plan.blocks == 0) return;
  a.prefetch_blocks = a.prefetch_wave = 0;
  const auto kernel = prob.dtype == DType::bf16 ? detail::recurrent_slice_kernel<detail::kBF16>
                                                : detail::recurrent_slice_kernel<detail::kF16>;
  launch_kernel(kernel, static_cast<unsigned>(plan.blocks), plan.warps * 32, 0, stream, plan.pdl,
                a);
  check(cudaGetLastError(), op, "slice kernel launch");
}

// The staged kernel (either tile) or the one-token kernel: a block per plan.columns value columns
// of a (sequence, value head).
void launch_staged(RecurrentArgs& a, const Problem& prob, const DecodeProblem& p,
                   const DecodePlan& plan, const char* op, cudaStream_t stream) {
  set_splits(a, prob, plan, op);
  if (plan.blocks == 0) return;
  a.vec_tok = plan.token_units;
  if (plan.kernel != DecodeKernel::one_token) a.tc = staged_tc(p);
  a.prefetch_blocks = plan.prefetch_blocks;
  a.prefetch_wave = plan.prefetch_wave;
  a.state_ld_normal = plan.state_loads_normal;
  const std::size_t smem = staged_smem(p, plan);
  with_staged_kernel(p, plan, [&](auto kernel) {
    launch_kernel(kernel, static_cast<unsigned>(plan.blocks), plan.warps * 32, smem, stream,
                  plan.pdl, a);
  });
  check(cudaGetLastError(), op, "recurrent kernel launch");
}

void launch(RecurrentArgs& a, const Problem& prob, bool v_first, const ExecConfig& config,
            const char* op) {
  const auto stream = static_cast<cudaStream_t>(config.stream);
  static const DecodeOverrides kRules{};
  const DecodeOverrides& overrides = config.decode_overrides ? *config.decode_overrides : kRules;
  DecodeProblem p = plan_problem(a, prob, v_first);
  DeviceFacts device;
  device.sm_count = sm_count(prob.device_index, op);
  device.blocks_per_sm = [&](const DecodeProblem& q, const DecodePlan& plan) {
    return plan_blocks_per_sm(q, plan, prob.device_index, op);
  };
  DecodePlan plan = plan_decode(p, device, overrides);
  // The ring's chunk consumers need the tensors' maps (host work on every such call); where the
  // maps cannot describe them, the plan without those consumers.
  detail::RingMaps maps{};
  if (plan.kernel == DecodeKernel::ring && plan.ring_chunk_math && !ring_maps(a, prob, &maps)) {
    p.ring_maps_ok = false;
    plan = plan_decode(p, device, overrides);
  }
  switch (plan.kernel) {
    case DecodeKernel::ring: launch_ring(a, prob, p, plan, maps, op, stream); return;
    case DecodeKernel::slice: launch_slice(a, prob, plan, op, stream); return;
    case DecodeKernel::chunk: launch_chunk(a, prob, p, plan, op, stream); return;
    default: launch_staged(a, prob, p, plan, op, stream); return;
  }
}

}  // namespace

void decode(const Problem& prob, const DecodeParams& p, const ExecConfig& config, const char* op) {
  if (prob.B == 0 || prob.T == 0 || prob.Hv == 0) return;
  DeviceGuard guard(prob.device_index, op);
  RecurrentArgs a{};
  set_token_inputs(a, p.q, p.k, p.v, p.g, p.beta, p.mask, p.o, p.A_log, p.dt_bias, p.opts, prob);
  a.h_in = static_cast<const float*>(p.state.data);
  a.h_out = static_cast<float*>(p.state.data);
  a.hin_s0 = a.hout_s0 = p.state.stride[0];
  a.hin_s1 = a.hout_s1 = p.state.stride[1];
  a.hin_s2 = a.hout_s2 = p.state.stride[2];
  a.vec_in = a.vec_out = vectorizable(p.state);
  a.in_place = true;
  a.state_bf16 = p.state.dtype == DType::bf16;
  if (p.state_indices.defined()) {
    a.state_indices = p.state_indices.data;
    a.idx_dtype = static_cast<int>(p.state_indices.dtype);
  }
  a.N = prob.B;
  a.T = prob.T;
  a.P = prob.P > 0 ? prob.P : p.state.shape[0];
  launch(a, prob, p.opts.state_layout == StateLayout::v_first, config, op);
}

void recurrent_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config,
                       const char* op) {
  const Inputs& in = p.in;
  if (prob.N == 0 || prob.Hv == 0) return;
  DeviceGuard guard(prob.device_index, op);
  RecurrentArgs a{};
  if (prob.varlen) {  // read on the device only, clamped (common/sequences.cuh)
    a.cu_seqlens = in.cu_seqlens.data;
    a.cu_dtype = static_cast<int>(in.cu_seqlens.dtype);
  }
  if (prob.T == 0 && !prob.varlen && !p.final_state.defined()) return;
  set_token_inputs(a, in.q, in.k, in.v, in.g, in.beta, in.mask, p.o, in.A_log, in.dt_bias, p.opts,
                   prob);
  if (in.h0.defined()) {
    a.h_in = static_cast<const float*>(in.h0.data);
    a.hin_s0 = in.h0.stride[0], a.hin_s1 = in.h0.stride[1], a.hin_s2 = in.h0.stride[2];
    a.vec_in = vectorizable(in.h0);
  }
  if (p.final_state.defined()) {
    a.h_out = static_cast<float*>(p.final_state.data);
    a.hout_s0 = p.final_state.stride[0], a.hout_s1 = p.final_state.stride[1];
    a.hout_s2 = p.final_state.stride[2];
    a.vec_out = vectorizable(p.final_state);
  }
  a.N = prob.N;
  a.T = prob.T;
  a.P = prob.N;
  launch(a, prob, p.opts.state_layout == StateLayout::v_first, config, op);
}

}  // namespace gdr::cuda
