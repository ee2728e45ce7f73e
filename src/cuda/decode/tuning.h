// The rules of the CUDA decode plan (plan.h): where each decode kernel exists, where it is
// preferred, and its launch shape and schedule. Plain constexpr C++ (no CUDA), so that the plan
// and these rules compile and are tested on the CPU (tests/cpp/test_decode_plan.cpp). Every
// threshold was chosen by a measurement on the H200 (132 SMs); the table, the numbers and the
// results files are in docs/cuda-decode.md §Dispatch table. The static_asserts below each rule
// state its facts at the benchmark's shapes (Hv = 32, Dk = Dv = 128, k-first, 132 SMs).
#pragma once

#include <cstdint>

namespace gdr::cuda {

// Facts of the kernels that the rules need (the kernels' own constants are checked against
// these in launch.cu): the ring kernel's item of 128 value columns, its slots' 48 bytes per key
// of token rows, its kRingSlots items in flight and its warps, the slice kernel's 32 columns and
// 5 warps per block.
constexpr int kRingItemColumns = 128;
constexpr int kRingTokenBytesPerKey = 48;
constexpr int kRingSlotsRule = 3;
constexpr int kRingConsumerWarps = 8;  // and a producer warp (and with chunk math a tenth)
constexpr int kSliceColumns = 32;
constexpr int kSliceWarpsRule = 5;

// Value columns one warp owns (recurrent.cuh, Tile::kCW): k-first 16 (8 at Dk = 256 or with the
// narrow tile), v-first 32 / (Dk / 32), so that a thread keeps at most 64 state floats in
// registers.
constexpr int recurrent_columns_per_warp(std::int64_t dk, bool v_first, bool narrow = false) {
  return v_first ? static_cast<int>(32 / (dk / 32)) : (dk == 256 || narrow ? 8 : 16);
}

// The staged kernel's narrow k-first tile (8 columns per warp at Dk = 64 and 128) below two warps
// per SM: a lone warp's token loop is bound by its instruction count, which the narrow tile
// halves (docs/cuda-decode.md §Dispatch table, "staged (narrow)").
constexpr bool recurrent_narrow_applies(std::int64_t heads, std::int64_t dk, std::int64_t dv,
                                        bool v_first, int sm_count) {
  return !v_first && dk < 256 &&
         heads * (dv / recurrent_columns_per_warp(dk, false)) <
             2 * static_cast<std::int64_t>(sm_count);
}
static_assert(recurrent_narrow_applies(32, 128, 128, false, 132));       // B = 1 (256 warps)
static_assert(!recurrent_narrow_applies(32 * 2, 128, 128, false, 132));  // B = 2 (512 warps)

// Warps per block of the staged kernel: 8 from T = 4 tokens, else 4; one step down (to 4, or at
// T = 1 to 1) while that would leave fewer than two blocks per SM; never more than Dv / CW
// (docs/cuda-decode.md §Dispatch table, "staged (narrow)").
constexpr int recurrent_warps_per_block(std::int64_t heads, std::int64_t tokens, std::int64_t dk,
                                        std::int64_t dv, bool v_first, int sm_count,
                                        bool narrow = false) {
  const std::int64_t warps_per_head = dv / recurrent_columns_per_warp(dk, v_first, narrow);
  const std::int64_t big = tokens >= 4 ? 8 : 4, small = tokens >= 2 ? 4 : 1;
  std::int64_t w = heads * (warps_per_head / (big < warps_per_head ? big : warps_per_head)) >=
                           2 * static_cast<std::int64_t>(sm_count)
                       ? big
                       : small;
  if (w > warps_per_head) w = warps_per_head;
  return static_cast<int>(w);
}
static_assert(recurrent_warps_per_block(32, 1, 128, 128, false, 132) == 1);        // B = 1
static_assert(recurrent_warps_per_block(32 * 8, 1, 128, 128, false, 132) == 4);    // B = 8
static_assert(recurrent_warps_per_block(32, 2, 128, 128, false, 132, true) == 4);  // B = 1, T = 2
static_assert(recurrent_warps_per_block(32 * 8, 8, 128, 128, false, 132) == 4);    // B = 8, T = 8
static_assert(recurrent_warps_per_block(32 * 32, 8, 128, 128, false, 132) == 8);   // B = 32, T = 8
static_assert(recurrent_warps_per_block(32, 8, 128, 128, false, 132, true) == 4);  // B = 1, T = 8

// The one-token kernel (recurrent_one.cuh) exists for one token per sequence (no varlen) on a
// k-first state whose q, k, v (and per-key g) rows are 16-byte aligned.
constexpr bool recurrent_one_applies(std::int64_t tokens, bool varlen, bool v_first,
                                     bool rows_aligned) {
  return tokens == 1 && !varlen && !v_first && rows_aligned;
}

// Warps per block of the one-token kernel (its warps share nothing), by the warps of the whole
// grid: 1 below 32 per SM, 2 below 128 per SM, else 4; never more than Dv / CW
// (docs/cuda-decode.md §Dispatch table, "one-token warps").
constexpr int recurrent_one_warps_per_block(std::int64_t heads, std::int64_t dk, std::int64_t dv,
                                            int sm_count) {
  const std::int64_t warps_per_head = dv / recurrent_columns_per_warp(dk, false);
  const std::int64_t grid_warps = heads * warps_per_head, sms = sm_count;
  std::int64_t w = grid_warps < 32 * sms ? 1 : (grid_warps < 128 * sms ? 2 : 4);
  if (w > warps_per_head) w = warps_per_head;
  return static_cast<int>(w);
}
static_assert(recurrent_one_warps_per_block(32 * 8, 128, 128, 132) == 1);    // B = 8
static_assert(recurrent_one_warps_per_block(32 * 32, 128, 128, 132) == 2);   // B = 32
static_assert(recurrent_one_warps_per_block(32 * 128, 128, 128, 132) == 4);  // B = 128

// The chunk kernel (recurrent_chunk.cuh) exists for a k-first fp32 or bf16 state with Dk = 128
// and a scalar gate whose state rows (read and written) are 16-byte aligned; any T, varlen, pools.
constexpr bool recurrent_chunk_applies(bool v_first, bool per_key, std::int64_t dk,
                                       bool state_rows_aligned) {
  return !v_first && !per_key && dk == 128 && state_rows_aligned;
}

// Value columns per chunk-kernel item: 128 (blocks of 8 warps, 2 per SM) where those items fill
// their waves (at least 4 waves, or the waves at least 90 % full), else 64 (4 warps, 4 per SM)
// (docs/cuda-decode.md §Dispatch table, "chunk columns").
constexpr int recurrent_chunk_columns(std::int64_t heads, std::int64_t dv, int sm_count) {
  if (dv % 128 != 0) return 64;
  const std::int64_t items = heads * (dv / 128), slots = 2 * static_cast<std::int64_t>(sm_count);
  const std::int64_t waves = (items + slots - 1) / slots;
  return items >= 4 * slots || 10 * items >= 9 * waves * slots ? 128 : 64;
}
static_assert(recurrent_chunk_columns(32 * 8, 128, 132) == 128);
static_assert(recurrent_chunk_columns(32 * 16, 128, 132) == 128);
static_assert(recurrent_chunk_columns(32 * 32, 128, 132) == 128);
static_assert(recurrent_chunk_columns(32 * 256, 128, 132) == 128);
static_assert(recurrent_chunk_columns(32 * 2, 128, 132) == 64);
static_assert(recurrent_chunk_columns(32 * 6, 128, 132) == 64);
static_assert(recurrent_chunk_columns(32 * 12, 128, 132) == 64);
static_assert(recurrent_chunk_columns(32 * 4, 64, 132) == 64);

// The ring kernel (recurrent_ring.cuh) exists for 1 to 8 tokens per sequence whose rows fit a
// slot's 48 bytes per key (T x (3 input bytes + 4 with a per-key gate) <= 48; no varlen) on a
// k-first fp32 state that is read, with Dk = 128, Dv % 128 == 0 and 16-byte aligned state and
// token rows.
constexpr bool recurrent_ring_applies(std::int64_t tokens, int input_bytes, bool varlen,
                                      bool v_first, bool per_key, std::int64_t dk, std::int64_t dv,
                                      bool bf16_state, bool reads_state, bool rows_aligned) {
  return tokens >= 1 && tokens * (3 * input_bytes + (per_key ? 4 : 0)) <= kRingTokenBytesPerKey &&
         !varlen && !v_first && dk == 128 && dv % kRingItemColumns == 0 && !bf16_state &&
         reads_state && rows_aligned;
}
static_assert(recurrent_ring_applies(8, 2, false, false, false, 128, 128, false, true, true) &&
              !recurrent_ring_applies(5, 4, false, false, false, 128, 128, false, true, true) &&
              recurrent_ring_applies(4, 2, false, false, true, 128, 128, false, true, true) &&
              !recurrent_ring_applies(5, 2, false, false, true, 128, 128, false, true, true) &&
              recurrent_ring_applies(3, 4, false, false, true, 128, 128, false, true, true) &&
              !recurrent_ring_applies(4, 4, false, false, true, 128, 128, false, true, true));

// Where the rules take the ring kernel (when it applies) instead of the one-token, staged or chunk
// kernels: contiguous items; T = 1 more than 3 and at most 8 items per SM (per-key at most 16),
// T = 2..5 more than 2 per SM (per-key more than 1.5); T = 6 to 8 with the chunk consumers more
// than 2.5 per SM, T = 6 without them more than 3 per SM; else never (docs/cuda-decode.md
// §Dispatch table, "ring").
constexpr bool recurrent_ring_preferred(std::int64_t tokens, std::int64_t heads, std::int64_t dv,
                                        bool contiguous, bool per_key, int sm_count,
                                        bool chunk_math = false) {
  const std::int64_t items = heads * (dv / kRingItemColumns), sms = sm_count;
  if (!contiguous) return false;
  if (tokens >= 6 && chunk_math) return 2 * items > 5 * sms;
  if (tokens >= 7) return false;
  if (tokens == 1) return items > 3 * sms && items <= (per_key ? 16 : 8) * sms;
  if (tokens <= 5) return per_key ? 2 * items > 3 * sms : items > 2 * sms;
  return tokens == 6 && items > 3 * sms;
}
// T = 1 at 3 to 8 items per SM: B = 16..32 yes, B = 12 and 40 no.
static_assert(recurrent_ring_preferred(1, 32 * 16, 128, true, false, 132) &&
              recurrent_ring_preferred(1, 32 * 32, 128, true, false, 132));
static_assert(!recurrent_ring_preferred(1, 32 * 12, 128, true, false, 132) &&
              !recurrent_ring_preferred(1, 32 * 40, 128, true, false, 132) &&
              !recurrent_ring_preferred(1, 32 * 32, 128, false, false, 132));
// 2 to 5 tokens from B = 9 (2.2 items per SM) on, 6 from B = 13, never 7 or 8 token by token.
static_assert(recurrent_ring_preferred(2, 32 * 9, 128, true, false, 132) &&
              recurrent_ring_preferred(5, 32 * 256, 128, true, false, 132) &&
              !recurrent_ring_preferred(4, 32 * 8, 128, true, false, 132) &&
              recurrent_ring_preferred(6, 32 * 13, 128, true, false, 132) &&
              !recurrent_ring_preferred(6, 32 * 12, 128, true, false, 132) &&
              !recurrent_ring_preferred(7, 32 * 32, 128, true, false, 132) &&
              !recurrent_ring_preferred(8, 32 * 32, 128, true, false, 132));
// T = 6 to 8 with the chunk consumers from 2.5 items per SM: B = 12 and 32 yes, B = 8 no.
static_assert(recurrent_ring_preferred(8, 32 * 32, 128, true, false, 132, true) &&
              recurrent_ring_preferred(7, 32 * 256, 128, true, false, 132, true) &&
              recurrent_ring_preferred(8, 32 * 12, 128, true, false, 132, true) &&
              recurrent_ring_preferred(6, 32 * 12, 128, true, false, 132, true) &&
              !recurrent_ring_preferred(8, 32 * 8, 128, true, false, 132, true) &&
              !recurrent_ring_preferred(6, 32 * 8, 128, true, false, 132, true) &&
              !recurrent_ring_preferred(8, 32 * 32, 128, true, false, 132, false) &&
              !recurrent_ring_preferred(8, 32 * 32, 128, false, false, 132, true));
// A per-key gate: T = 1 at 3 to 16 items per SM (B = 13..66), T = 2..4 from B = 7.
static_assert(recurrent_ring_preferred(1, 32 * 64, 128, true, true, 132) &&
              !recurrent_ring_preferred(1, 32 * 67, 128, true, true, 132) &&
              recurrent_ring_preferred(2, 32 * 7, 128, true, true, 132) &&
              !recurrent_ring_preferred(4, 32 * 6, 128, true, true, 132));

// The ring kernel's consumers take the item's tokens as one chunk on the tensor cores (16-bit
// inputs, exact in tf32, and a scalar gate) from 6 tokens; below, token by token
// (docs/cuda-decode.md §Dispatch table, "ring consumers").
constexpr bool recurrent_ring_chunk_math(std::int64_t tokens, int input_bytes, bool per_key) {
  return tokens >= 6 && input_bytes == 2 && !per_key;
}
static_assert(recurrent_ring_chunk_math(8, 2, false) && recurrent_ring_chunk_math(6, 2, false) &&
              !recurrent_ring_chunk_math(5, 2, false) && !recurrent_ring_chunk_math(8, 4, false) &&
              !recurrent_ring_chunk_math(8, 2, true));

// The slice kernel (recurrent_slice.cuh) exists for 1 to 8 tokens of 16-bit inputs with a scalar
// gate (no varlen) on a k-first fp32 state with Dk = 128, whose token and state rows (read and
// written) are 16-byte aligned.
constexpr bool recurrent_slice_applies(std::int64_t tokens, int input_bytes, bool varlen,
                                       bool v_first, bool per_key, std::int64_t dk, bool bf16_state,
                                       bool rows_aligned) {
  return tokens >= 1 && tokens <= 8 && input_bytes == 2 && !varlen && !v_first && !per_key &&
         dk == 128 && !bf16_state && rows_aligned;
}
static_assert(recurrent_slice_applies(8, 2, false, false, false, 128, false, true) &&
              !recurrent_slice_applies(9, 2, false, false, false, 128, false, true) &&
              !recurrent_slice_applies(8, 4, false, false, false, 128, false, true) &&
              !recurrent_slice_applies(8, 2, false, false, true, 128, false, true));

// Where the rules take the slice kernel (when it applies): few heads, a latency-bound call; from
// 2 tokens at up to two blocks per SM, from 4 tokens at up to four (docs/cuda-decode.md
// §Dispatch table, "slice").
constexpr bool recurrent_slice_preferred(std::int64_t tokens, std::int64_t heads, std::int64_t dv,
                                         int sm_count) {
  const std::int64_t blocks = heads * (dv / kSliceColumns), sms = sm_count;
  return (tokens >= 2 && blocks <= 2 * sms) || (tokens >= 4 && blocks <= 4 * sms);
}
// From 2 tokens at B = 1 and 2 (128 and 256 blocks), from 4 at B = 4 (512), not at B = 8 or T = 1.
static_assert(recurrent_slice_preferred(2, 32, 128, 132) &&
              recurrent_slice_preferred(2, 32 * 2, 128, 132) &&
              !recurrent_slice_preferred(2, 32 * 4, 128, 132) &&
              recurrent_slice_preferred(4, 32 * 4, 128, 132) &&
              recurrent_slice_preferred(8, 32 * 4, 128, 132) &&
              !recurrent_slice_preferred(8, 32 * 8, 128, 132) &&
              !recurrent_slice_preferred(1, 32, 128, 132));

// The chunk kernel's first chunk with its state wait late (recurrent_chunk.cuh, FIRST_LATE): at
// most 8 items per block, or items of more than one chunk (more than 8 tokens)
// (docs/cuda-decode.md §Dispatch table, "chunk first wait").
constexpr bool recurrent_chunk_first_late(std::int64_t items, std::int64_t blocks,
                                          std::int64_t tokens) {
  return items <= 8 * blocks || tokens > 8;
}
// T = 8 B = 64 (2048 items on 264 blocks) yes, B = 128 no; T = 16 always.
static_assert(recurrent_chunk_first_late(32 * 64, 264, 8));
static_assert(!recurrent_chunk_first_late(32 * 128, 264, 8));
static_assert(recurrent_chunk_first_late(32 * 256, 264, 16));

// The chunk kernel's items taken dynamically from a counter pair (recurrent_chunk.cuh, DYNAMIC)
// instead of round-robin: one chunk per item and more than 6 items per block, 8 with a bf16 pool
// (docs/cuda-decode.md §Dispatch table, "chunk schedule").
constexpr bool recurrent_chunk_dynamic(std::int64_t items, std::int64_t blocks, std::int64_t tokens,
                                       bool bf16_state) {
  return items > (bf16_state ? 8 : 6) * blocks && tokens <= 8;
}
static_assert(recurrent_chunk_dynamic(32 * 64, 264, 8, false));
static_assert(!recurrent_chunk_dynamic(32 * 64, 264, 8, true));
static_assert(recurrent_chunk_dynamic(32 * 80, 264, 8, true));
static_assert(recurrent_chunk_dynamic(32 * 128, 264, 8, true));
static_assert(!recurrent_chunk_dynamic(32 * 32, 264, 8, false));
static_assert(!recurrent_chunk_dynamic(32 * 128, 264, 16, false));

// The ring kernel's dynamic items (recurrent_ring.cuh, ring_next_item): the first round whose
// items its blocks take from a per-launch counter (0: static). From 10 items per block dynamic
// from round 3 (kRingSlotsRule, the rounds its start looks up together); from 6 with the chunk
// consumers the last round only; else static (docs/cuda-decode.md §Dispatch table, "ring
// schedule").
constexpr std::int64_t recurrent_ring_dynamic_round(std::int64_t items, std::int64_t blocks,
                                                    bool chunk_math) {
  if (items >= 10 * blocks) return kRingSlotsRule;
  return chunk_math && items >= 6 * blocks ? items / blocks : 0;
}
static_assert(recurrent_ring_dynamic_round(16 * 32, 132, true) == 0 &&
              recurrent_ring_dynamic_round(32 * 32, 132, true) == 7 &&
              recurrent_ring_dynamic_round(32 * 32, 132, false) == 0 &&
              recurrent_ring_dynamic_round(64 * 32, 132, true) == kRingSlotsRule &&
              recurrent_ring_dynamic_round(128 * 32, 132, false) == kRingSlotsRule);

// The ring kernel's mbarriers and tensor-map prefetches before its dependent-launch wait: up to
// 16 items per block (docs/cuda-decode.md §Dispatch table, "ring setup").
constexpr bool recurrent_ring_setup_early(std::int64_t items, std::int64_t blocks) {
  return items <= 16 * blocks;
}

// Where the rules take the chunk kernel for an fp32 state (when it applies, and the ring kernel
// is not preferred): from 4 tokens per sequence (no varlen) and 24 heads >= max(T, 8) x SMs
// (docs/cuda-decode.md §Dispatch table, "chunk").
constexpr bool recurrent_chunk_preferred(std::int64_t tokens, bool varlen, std::int64_t heads,
                                         int sm_count) {
  const std::int64_t t = tokens < 8 ? 8 : tokens;
  return !varlen && tokens >= 4 && 24 * heads >= t * static_cast<std::int64_t>(sm_count);
}
// T = 8 from B = 2 (64 heads), T = 16 from B = 4, T = 4 from B = 2, never T = 3.
static_assert(recurrent_chunk_preferred(8, false, 32 * 2, 132));
static_assert(!recurrent_chunk_preferred(8, false, 32, 132));
static_assert(recurrent_chunk_preferred(16, false, 32 * 4, 132));
static_assert(!recurrent_chunk_preferred(16, false, 32 * 2, 132));
static_assert(recurrent_chunk_preferred(32, false, 32 * 32, 132));
static_assert(recurrent_chunk_preferred(4, false, 32 * 2, 132) &&
              !recurrent_chunk_preferred(4, false, 32, 132) &&
              !recurrent_chunk_preferred(3, false, 32 * 32, 132));

// Where the rules take the chunk kernel for a bf16 pool (the ring kernel reads fp32 only): from 3
// tokens on 24 heads >= 8 x SMs (B >= 2 at Hv = 32), 2 tokens from 1.5 heads per SM (B >= 7),
// and with fewer heads one chunk of 6 to 8 tokens; no varlen (docs/cuda-decode.md §Dispatch
// table, "chunk").
constexpr bool recurrent_chunk_preferred_bf16(std::int64_t tokens, bool varlen, std::int64_t heads,
                                              int sm_count) {
  const std::int64_t sms = sm_count;
  if (varlen || tokens < 2) return false;
  if (tokens == 2) return 2 * heads >= 3 * sms;
  if (24 * heads >= 8 * sms) return true;
  return tokens >= 6 && tokens <= 8;
}
static_assert(recurrent_chunk_preferred_bf16(3, false, 32 * 2, 132) &&
              recurrent_chunk_preferred_bf16(2, false, 32 * 8, 132) &&
              !recurrent_chunk_preferred_bf16(2, false, 32 * 4, 132) &&
              !recurrent_chunk_preferred_bf16(1, false, 32 * 32, 132) &&
              !recurrent_chunk_preferred_bf16(8, true, 32 * 32, 132));
static_assert(recurrent_chunk_preferred_bf16(16, false, 32 * 2, 132) &&
              recurrent_chunk_preferred_bf16(8, false, 32, 132) &&
              !recurrent_chunk_preferred_bf16(5, false, 32, 132) &&
              !recurrent_chunk_preferred_bf16(12, false, 32, 132));

// The next-wave L2 prefetch (recurrent.cuh, prefetch_state_of_block): how many blocks ahead a
// block prefetches the state (0 = none) for a grid of `blocks` of which `resident` run at once:
// half a wave, from 2 waves (one-token kernel) or 6 waves (staged kernel) (docs/cuda-decode.md
// §Dispatch table, "prefetch").
constexpr std::int64_t recurrent_prefetch_blocks(std::int64_t blocks, std::int64_t resident,
                                                 bool one_token) {
  const std::int64_t min_waves = one_token ? 2 : 6;
  return resident >= 2 && blocks >= min_waves * resident ? resident / 2 : 0;
}
// One-token B = 32 (4096 blocks, 1056 resident) yes, B = 8 no; staged T = 8 B = 32 (1024 blocks,
// 264 resident) no, B = 64 yes.
static_assert(recurrent_prefetch_blocks(4096, 1056, true) == 528);
static_assert(recurrent_prefetch_blocks(2048, 2112, true) == 0);
static_assert(recurrent_prefetch_blocks(1024, 264, false) == 0);
static_assert(recurrent_prefetch_blocks(2048, 264, false) == 132);

// The first wave's prefetch distance (0 = none) for a one-token grid of one to two waves: the
// first wave's blocks prefetch the whole second wave (docs/cuda-decode.md §Dispatch table,
// "prefetch").
constexpr std::int64_t recurrent_prefetch_wave(std::int64_t blocks, std::int64_t resident,
                                               bool one_token) {
  return one_token && resident >= 2 && blocks > resident && blocks < 2 * resident ? resident : 0;
}
// One-token B = 16 (4096 blocks of one warp, 2112 resident) yes; B = 8 and B = 32 no.
static_assert(recurrent_prefetch_wave(4096, 2112, true) == 2112);
static_assert(recurrent_prefetch_wave(2048, 2112, true) == 0);
static_assert(recurrent_prefetch_wave(4096, 1056, true) == 0);

// The one-token kernel's state loads with the default cache policy instead of evict-first: from
// 4 waves (fp32 pool) or 8 waves (bf16 pool) (docs/cuda-decode.md §Dispatch table, "loads").
constexpr bool recurrent_one_loads_normal(std::int64_t blocks, std::int64_t resident,
                                          bool bf16_state) {
  return resident >= 1 && blocks >= (bf16_state ? 8 : 4) * resident;
}
// fp32: B = 48 (6144 blocks, 1056 resident) yes, B = 32 no; bf16: B = 64 no, B = 128 yes.
static_assert(recurrent_one_loads_normal(6144, 1056, false));
static_assert(!recurrent_one_loads_normal(4096, 1056, false));
static_assert(!recurrent_one_loads_normal(8192, 1056, true));
static_assert(recurrent_one_loads_normal(8192, 528, true));

}  // namespace gdr::cuda
