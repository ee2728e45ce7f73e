// The CUDA decode plan: a pure function from a call's facts and the device's to the kernel that
// runs it, its launch shape and its schedule (docs/cuda-decode.md §Dispatch table). Host C++ only
// (no CUDA), so that tests/cpp/test_decode_plan.cpp checks it on the CPU; launch.cu executes a
// plan. The rules themselves are tuning.h's; the forced choices of tests and benchmarks come in
// gdr::DecodeOverrides (ExecConfig::decode_overrides).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>

#include "cuda/decode/tuning.h"
#include "gdr/decode_overrides.h"
#include "gdr/types.h"

namespace gdr::cuda {

// What the plan reads of a call (decode, or forward through the same kernels): shapes, dtypes,
// layout and the alignment facts of its tensors.
struct DecodeProblem {
  std::int64_t N = 0;  // sequences
  std::int64_t T = 0;  // tokens per sequence (varlen: of the one batch row)
  std::int64_t Hv = 0, Dk = 0, Dv = 0;
  DType dtype = DType::bf16;  // q, k, v, o
  bool per_key = false;       // a per-key gate
  bool v_first = false;       // the state's layout
  bool varlen = false;
  bool state_bf16 = false;            // a bf16 pool (decode)
  bool reads_state = true;            // a state is read (the pool, or h0)
  bool writes_state = true;           // a state is written (the pool, or final_state)
  bool state_in_rows16 = true;        // the state read: 16-byte aligned base and rows (false: none)
  bool state_out_rows16 = true;       // the state written: likewise
  bool token_rows16 = true;           // q, k, v (and a per-key g) rows 16-byte aligned
  bool ring_items_contiguous = true;  // state rows of exactly one ring item's columns
  bool ring_maps_ok = true;  // tensor maps can describe the state and token rows (ring chunk math)
};

// The plan: which kernel, its blocks and their work, and the schedule's switches.
struct DecodePlan {
  DecodeKernel kernel = DecodeKernel::staged;  // never automatic
  int warps = 0;                               // warps per block
  int columns = 0;            // value columns of a block (staged, one-token, slice) or an item
  std::int64_t items = 0;     // (sequence, value head, columns) work units: N Hv Dv / columns
  std::int64_t resident = 0;  // blocks resident at once (staged, one-token, chunk, ring; 0 there:
                              //   the kernel does not fit)
  std::int64_t blocks = 0;    // the grid (one block per item, or the persistent blocks)
  bool pdl = true;            // a programmatic dependent launch
  // Staged and one-token kernels.
  bool token_units = false;         // 16-byte token staging (aligned rows, whole units per block)
  int prefetch_blocks = 0;          // next-wave L2 prefetch distance (blocks), 0 = none
  int prefetch_wave = 0;            // the first wave's prefetch distance, 0 = none
  bool state_loads_normal = false;  // one-token and ring: default cache policy, not evict-first
  // Chunk kernel.
  bool chunk_first_late = false;  // FIRST_LATE
  bool chunk_dynamic = false;     // DYNAMIC (wanted: no counter pair to be had means static)
  // Ring kernel.
  bool ring_chunk_math = false;         // consumers on one chunk (tensor cores, tensor maps)
  std::int64_t ring_dynamic_round = 0;  // first dynamic round, 0 = static
  bool ring_setup_early = false;        // setup before the dependent-launch wait
};

// The device: its SMs and the occupancy of a planned kernel.
struct DeviceFacts {
  int sm_count = 0;
  // Blocks of the plan's kernel (its kernel, warps, columns and ring_chunk_math set) resident on
  // one SM at its threads and shared memory; for the chunk kernel that of its static instantiation
  // with the early first wait (every instantiation of one width has the same registers and
  // shared memory). The launcher asks the device (cudaOccupancyMaxActiveBlocksPerMultiprocessor);
  // the CPU tests give the H200's figures.
  std::function<int(const DecodeProblem&, const DecodePlan&)> blocks_per_sm;
};

namespace plan_detail {

inline int valid_or_zero(int v, int lo, int hi) {
  return v >= lo && v <= hi ? v : 0;
}

// The grid of a persistent kernel (chunk, ring): one block per item up to the resident blocks, or
// the override's cap.
inline std::int64_t persistent_grid(std::int64_t items, std::int64_t resident, int cap) {
  std::int64_t blocks = items < resident ? items : resident;
  if (cap > 0 && cap < blocks) blocks = cap;
  return blocks;
}

inline std::int64_t resident_of(const DeviceFacts& dev, const DecodeProblem& p,
                                const DecodePlan& plan) {
  return dev.blocks_per_sm ? static_cast<std::int64_t>(dev.blocks_per_sm(p, plan)) * dev.sm_count
                           : 0;
}

// The ring kernel: one persistent block per SM (at most one per item) on items of 128 columns.
inline DecodePlan plan_ring(const DecodeProblem& p, const DeviceFacts& dev,
                            const DecodeOverrides& ov, bool chunk_math, DecodePlan plan) {
  plan.kernel = DecodeKernel::ring;
  plan.ring_chunk_math = chunk_math;
  plan.columns = kRingItemColumns;
  plan.warps = kRingConsumerWarps + 1 + (chunk_math ? 1 : 0);
  plan.items = p.N * p.Hv * (p.Dv / kRingItemColumns);
  plan.state_loads_normal = ov.state_loads == 2;  // evict-first unless forced
  if (plan.items == 0) return plan;
  plan.resident = resident_of(dev, p, plan);
  if (plan.resident <= 0) return plan;
  plan.blocks = persistent_grid(plan.items, plan.resident, ov.persistent_blocks);
  const int sched = valid_or_zero(ov.ring_schedule, 1, 3);
  plan.ring_dynamic_round = sched == 1   ? 0
                            : sched == 2 ? kRingSlotsRule
                            : sched == 3
                                ? std::max<std::int64_t>(plan.items / plan.blocks, kRingSlotsRule)
                                : recurrent_ring_dynamic_round(plan.items, plan.blocks, chunk_math);
  plan.ring_setup_early = recurrent_ring_setup_early(plan.items, plan.blocks);
  return plan;
}

// The slice kernel: a block per 32 value columns of a (sequence, value head).
inline DecodePlan plan_slice(const DecodeProblem& p, DecodePlan plan) {
  plan.kernel = DecodeKernel::slice;
  plan.columns = kSliceColumns;
  plan.warps = kSliceWarpsRule;
  plan.items = plan.blocks = p.N * p.Hv * (p.Dv / kSliceColumns);
  return plan;
}

// The chunk kernel: persistent blocks of 8 or 4 warps on items of 128 or 64 value columns.
inline DecodePlan plan_chunk(const DecodeProblem& p, const DeviceFacts& dev,
                             const DecodeOverrides& ov, DecodePlan plan) {
  const int forced = ov.chunk_columns;
  plan.kernel = DecodeKernel::chunk;
  plan.columns = forced == 64 || (forced == 128 && p.Dv % 128 == 0)
                     ? forced
                     : recurrent_chunk_columns(p.N * p.Hv, p.Dv, dev.sm_count);
  plan.warps = plan.columns / 16;
  plan.items = p.N * p.Hv * (p.Dv / plan.columns);
  if (plan.items == 0) return plan;
  plan.resident = resident_of(dev, p, plan);
  if (plan.resident <= 0) return plan;
  plan.blocks = persistent_grid(plan.items, plan.resident, ov.persistent_blocks);
  const int sched = valid_or_zero(ov.chunk_schedule, 1, 2);
  plan.chunk_dynamic = sched == 2 || (sched == 0 && recurrent_chunk_dynamic(plan.items, plan.blocks,
                                                                            p.T, p.state_bf16));
  const int first = valid_or_zero(ov.chunk_first_wait, 1, 2);
  plan.chunk_first_late =
      first == 1 || (first == 0 && recurrent_chunk_first_late(plan.items, plan.blocks, p.T));
  return plan;
}

// The staged kernel (usual or narrow tile) or the one-token kernel: a block of `warps` warps per
// warps x CW value columns of a (sequence, value head).
inline DecodePlan plan_staged(const DecodeProblem& p, const DeviceFacts& dev,
                              const DecodeOverrides& ov, bool one, bool narrow, DecodePlan plan) {
  const std::int64_t heads = p.N * p.Hv;
  const int sms = dev.sm_count;
  int warps = ov.warps == 1 || ov.warps == 2 || ov.warps == 4 || ov.warps == 8 ? ov.warps : 0;
  const int cw = recurrent_columns_per_warp(p.Dk, p.v_first, narrow);
  if (warps <= 0 || (p.Dv / cw) % warps != 0)
    warps = one ? recurrent_one_warps_per_block(heads, p.Dk, p.Dv, sms)
                : recurrent_warps_per_block(heads, p.T, p.Dk, p.Dv, p.v_first, sms, narrow);
  plan.kernel =
      one ? DecodeKernel::one_token : (narrow ? DecodeKernel::staged_narrow : DecodeKernel::staged);
  plan.warps = warps;
  plan.columns = warps * cw;
  plan.items = plan.blocks = heads * (p.Dv / plan.columns);
  plan.token_units = p.token_rows16 && plan.columns % (16 / dtype_size(p.dtype)) == 0;
  if (plan.blocks == 0) return plan;
  plan.resident = resident_of(dev, p, plan);
  // The next-wave prefetch (only 16-byte state rows) and the state-load policy.
  const int prefetch = valid_or_zero(ov.prefetch, 1, 2);
  std::int64_t ahead = recurrent_prefetch_blocks(plan.blocks, plan.resident, one);
  std::int64_t wave = recurrent_prefetch_wave(plan.blocks, plan.resident, one);
  if (prefetch == 2) ahead = wave = 1;  // block 0 through the first-wave distance, the others not
  if (prefetch == 1 || !p.state_in_rows16 || ahead > INT_MAX || wave > INT_MAX) ahead = wave = 0;
  plan.prefetch_blocks = static_cast<int>(ahead);
  plan.prefetch_wave = static_cast<int>(wave);
  const int loads = valid_or_zero(ov.state_loads, 1, 2);
  plan.state_loads_normal =
      one && (loads == 2 ||
              (loads == 0 && recurrent_one_loads_normal(plan.blocks, plan.resident, p.state_bf16)));
  return plan;
}

}  // namespace plan_detail

// The plan of a call: the ring kernel where it applies and the rules (or the override) prefer it,
// else the slice kernel likewise, else the chunk kernel likewise, else the one-token kernel where
// it applies, else the staged kernel (its narrow tile for small grids). docs/cuda-decode.md
// §Dispatch table gives the rules and the measurements behind them.
inline DecodePlan plan_decode(const DecodeProblem& p, const DeviceFacts& dev,
                              const DecodeOverrides& ov) {
  using namespace plan_detail;
  const int sms = dev.sm_count;
  const std::int64_t heads = p.N * p.Hv;
  const int in_bytes = dtype_size(p.dtype);
  int path = valid_or_zero(static_cast<int>(ov.kernel), 1, 6);
  DecodePlan plan;
  plan.pdl = ov.pdl != 1;
  const bool one_applies = recurrent_one_applies(p.T, p.varlen, p.v_first, p.token_rows16);
  const bool state_in_ok = !p.reads_state || p.state_in_rows16;
  const bool state_out_ok = !p.writes_state || p.state_out_rows16;
  if ((path == 5 || path == 0) &&
      recurrent_ring_applies(p.T, in_bytes, p.varlen, p.v_first, p.per_key, p.Dk, p.Dv,
                             p.state_bf16, p.reads_state,
                             p.state_in_rows16 && state_out_ok && p.token_rows16)) {
    const int math = valid_or_zero(ov.ring_math, 1, 2);
    const bool chunk_math =
        p.dtype != DType::f32 && !p.per_key &&
        (math == 2 || (math == 0 && recurrent_ring_chunk_math(p.T, in_bytes, p.per_key))) &&
        (path == 5 || recurrent_ring_preferred(p.T, heads, p.Dv, p.ring_items_contiguous, p.per_key,
                                               sms, true)) &&
        p.ring_maps_ok;
    if (path == 5 || recurrent_ring_preferred(p.T, heads, p.Dv, p.ring_items_contiguous, p.per_key,
                                              sms, chunk_math))
      return plan_ring(p, dev, ov, chunk_math, plan);
  }
  if (path == 5) path = 0;  // the ring kernel does not apply: the rules
  if ((path == 6 || (path == 0 && recurrent_slice_preferred(p.T, heads, p.Dv, sms))) &&
      recurrent_slice_applies(p.T, in_bytes, p.varlen, p.v_first, p.per_key, p.Dk, p.state_bf16,
                              state_in_ok && state_out_ok && p.token_rows16))
    return plan_slice(p, plan);
  if (path == 6) path = 0;  // the slice kernel does not apply: the rules
  if ((path == 4 || (path == 0 && !one_applies &&
                     (p.state_bf16 ? recurrent_chunk_preferred_bf16(p.T, p.varlen, heads, sms)
                                   : recurrent_chunk_preferred(p.T, p.varlen, heads, sms)))) &&
      recurrent_chunk_applies(p.v_first, p.per_key, p.Dk, state_in_ok && state_out_ok))
    return plan_chunk(p, dev, ov, plan);
  // The staged kernel reads a bf16 pool only beyond the one-token kernel's reach.
  const bool one = one_applies && (p.state_bf16 || path == 0 || path == 2);
  const bool narrow =
      !one && !p.v_first && p.Dk < 256 &&
      (path == 3 || (path == 0 && recurrent_narrow_applies(heads, p.Dk, p.Dv, p.v_first, sms)));
  return plan_staged(p, dev, ov, one, narrow, plan);
}

}  // namespace gdr::cuda
