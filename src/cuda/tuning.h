// Launch shape of the CUDA recurrent (decode) kernel: the heuristic, and a override for
// benchmarks that sweep it. Internal to gdr (not part of the public API).
#pragma once

#include <cstdint>

namespace gdr::cuda {

// Value columns one warp owns (recurrent.cuh, Tile::kCW): k-first 16 (8 at Dk = 256 or with the
// narrow tile), v-first 32 / (Dk / 32), so that a thread keeps at most 64 state floats in
// registers.
constexpr int recurrent_columns_per_warp(std::int64_t dk, bool v_first, bool narrow = false) {
  return v_first ? static_cast<int>(32 / (dk / 32)) : (dk == 256 || narrow ? 8 : 16);
}

// The staged kernel's narrow k-first tile (8 columns per warp at Dk = 64 and 128) when the usual
// tile gives fewer than two warps per SM: a lone warp's token loop is bound by its own
// instruction count (docs/cuda-decode.md, v26), which the narrow tile halves. Measured on the H200
// (v27, Hv = 32, Dk = Dv = 128, us usual | narrow): B = 1 (256 warps): T = 2 5.14 | 4.96, T = 8
// 8.33 | 7.01, T = 16 12.9 | 10.7; B = 2 (512 warps): T = 2 6.21 | 6.54, T = 8 9.30 | 9.18;
// B = 4: the narrow tile 1-9 % slower.
constexpr bool recurrent_narrow_applies(std::int64_t heads, std::int64_t dk, std::int64_t dv,
                                        bool v_first, int sm_count) {
  return !v_first && dk < 256 &&
         heads * (dv / recurrent_columns_per_warp(dk, false)) <
             2 * static_cast<std::int64_t>(sm_count);
}

// Warps per block. The warps of a block share one staging of q, k (and the gates) per chunk,
// so larger blocks stage less per state byte, while small grids want more, smaller blocks to
// reach more SMs. Measured on the H200 (docs/cuda-decode.md, sweeps of 1/2/4/8 warps, Hv = 32,
// Dk = Dv = 128, B = 1..256): T = 1: 4 warps best from B = 32 on, all within 2 % at B = 8,
// 1 warp best at B = 1 (4.7 us vs 5.1 us with 4); T = 8: 8 warps best from B = 32 on, 4 warps
// best at B = 1 and 8; T = 2 and 3 (v33, us for 1 | 4 warps, the tile the rules pick): B = 1
// 4.98 | 4.40 and 5.54 | 4.83, B = 2 6.06 | 6.05 and 6.81 | 6.40, B = 4 8.49 | 8.43 and
// 9.39 | 9.01. Rule: 8 warps from T = 4 tokens, else 4; one step down (to 4, or at T = 1 to 1)
// while that would leave fewer than two blocks per SM; never more than Dv / CW.
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

// The one-token kernel (recurrent_one.cuh) takes a call of one token per sequence (no varlen)
// on a k-first state whose q, k, v (and per-key g) rows are 16-byte aligned.
constexpr bool recurrent_one_applies(std::int64_t tokens, bool varlen, bool v_first,
                                     bool rows_aligned) {
  return tokens == 1 && !varlen && !v_first && rows_aligned;
}

// Warps per block of the one-token kernel, whose warps share nothing: small blocks spread few warps
// over more SMs, larger ones cost less to schedule. Measured on the H200 (docs/cuda-decode.md, v16,
// Hv = 32, Dk = Dv = 128, us for 1 / 2 / 4 / 8 warps): B = 1: 3.77 / 4.31 / 4.50 / 5.23, B = 8:
// 11.27 / 11.95 / 11.89 / 12.01, B = 32: 42.85 / 39.98 / 40.30 / 41.26, B = 128: 169.8 / 149.9 /
// 147.2 / 147.4, B = 256: 340.2 / 295.7 / 290.0 / 289.8. Rule by the warps of the whole grid: 1
// below 32 per SM, 2 below 128 per SM, else 4; never more than Dv / CW.
constexpr int recurrent_one_warps_per_block(std::int64_t heads, std::int64_t dk, std::int64_t dv,
                                            int sm_count) {
  const std::int64_t warps_per_head = dv / recurrent_columns_per_warp(dk, false);
  const std::int64_t grid_warps = heads * warps_per_head, sms = sm_count;
  std::int64_t w = grid_warps < 32 * sms ? 1 : (grid_warps < 128 * sms ? 2 : 4);
  if (w > warps_per_head) w = warps_per_head;
  return static_cast<int>(w);
}

// The chunk kernel (recurrent_chunk.cuh: state in registers, products on the tensor cores)
// exists for a k-first fp32 or bf16 state with Dk = 128 and a scalar gate whose state rows (read
// and written) are 16-byte aligned; any T, varlen, pools.
constexpr bool recurrent_chunk_applies(bool v_first, bool per_key, std::int64_t dk,
                                       bool state_rows_aligned) {
  return !v_first && !per_key && dk == 128 && state_rows_aligned;
}

// Value columns per item of the chunk kernel: 128 (blocks of 8 warps, 2 per SM) where those items
// fill their waves (at least 4 waves, or the waves at least 90 % full), else 64 (4 warps, 4 per
// SM). Measured on the H200 (docs/cuda-decode.md, v32; Hv = 32, Dk = Dv = 128, T = 8, us for
// 128 | 64 | 32 columns): B = 2 9.26 | 8.63 | 9.22, B = 4 11.04 | 10.67 | 11.01, B = 6 14.10 |
// 13.07 | 19.96, B = 8 16.39 | 19.73 | 21.88, B = 12 25.36 | 23.70 | 31.34, B = 16 28.74 |
// 31.52 | 40.52; B = 256 (v31) 357 | 373 | 492. Items of 32 columns are never faster.
constexpr int recurrent_chunk_columns(std::int64_t heads, std::int64_t dv, int sm_count) {
  if (dv % 128 != 0) return 64;
  const std::int64_t items = heads * (dv / 128), slots = 2 * static_cast<std::int64_t>(sm_count);
  const std::int64_t waves = (items + slots - 1) / slots;
  return items >= 4 * slots || 10 * items >= 9 * waves * slots ? 128 : 64;
}

// The ring kernel (recurrent_ring.cuh: one block per SM, a ring of item states in shared memory
// filled and drained by the bulk-copy engine) exists for 1 to 8 tokens per sequence whose rows fit
// a slot's 48 bytes per key (the raw q, k, v rows and, with a per-key gate, the f32 decays:
// T x (3 input bytes + 4 per-key) <= 48, so T <= 8 of 16-bit inputs and T <= 4 of f32 with a
// scalar gate, T <= 4 and T <= 3 with a per-key gate; no varlen) on a k-first fp32 state that is
// read (h_in) with Dk = 128, Dv % 128 == 0 and 16-byte aligned state and token rows.
constexpr bool recurrent_ring_applies(std::int64_t tokens, int input_bytes, bool varlen,
                                      bool v_first, bool per_key, std::int64_t dk, std::int64_t dv,
                                      bool bf16_state, bool reads_state, bool rows_aligned) {
  return tokens >= 1 && tokens * (3 * input_bytes + (per_key ? 4 : 0)) <= 48 && !varlen &&
         !v_first && dk == 128 && dv % 128 == 0 && !bf16_state && reads_state && rows_aligned;
}

// Where the rules take the ring kernel (when it applies) instead of the one-token, staged or chunk
// kernels. Each SM moves one 64 KB item in and out per ~4.7 us whatever the math of one token
// (without it: the same; loads alone run at the copy rate, so the mixed load / store stream is the
// limit), ~88 % of the copy rate (an average: v39's per-block timelines put the steady state at an
// item per ~4.1 us, the copy rate, and the rest in the start, the end and the SMs' spread); at
// T = 1 the one-token kernel's waves lose more than that only between ~4 and ~12 items per SM.
// Measured on the H200 (docs/cuda-decode.md v36; Hv = 32, Dk = Dv = 128, T = 1, us one-token |
// ring, same process): B = 8 (1.9 items per SM) 11.1-11.3 |
// 11.3-11.8, B = 16 (3.9) 21.4 | 21.2, B = 32 (7.8) 39.1-39.2 | 38.1-38.5, B = 64 (15.5) 70.9-71.6
// | 75.7-76.0, B = 128 136 | 147, B = 256 265 | 290. An item whose rows are not contiguous (Dv >
// 128, padded rows) moves as a bulk copy per 512-byte row, which doubles the period (B = 32 75 us).
// Three harness runs without the producer's L2 read-ahead (v36, v37; us one-token | ring): B = 24
// (5.8 items per SM) 30.19 | 30.13, 30.05 | 30.59, 29.81 | 30.38; B = 32 39.12 | 37.79, 39.15 |
// 38.08, 38.91 | 38.53; B = 40 (9.7) 47.02 | 47.10, 47.01 | 47.81, 46.90 | 48.16; with it (v37;
// the ring alone: B = 24 28.3-28.6, B = 32 37.7-37.9, B = 40 46.9-47.2, B = 64 72.1-72.3; same
// process, one-token | ring: B = 16 (3.9) 21.54 | 20.55, B = 24 30.14 | 28.99, B = 32 39.23 |
// 38.19, B = 40 46.62 | 47.44). With 2 to 8 tokens (v38; us, the best of the staged and chunk
// kernels | ring, same process): a token costs the ring ~0.5 us per item and SM, hidden behind
// the copy up to T = 3 (B = 32: T = 1 38.9, T = 2 39.2, T = 3 39.6, T = 4 40.8, T = 5 42.7, T = 6
// 45.6, T = 8 53.3), where the staged kernel's waves pay for every token and the chunk kernel's
// cost is flat (B = 32: 45-47 us at T = 3..8):
//   T = 2: B = 8 (1.9) 12.67 | 12.98, B = 12 (2.9) 19.56 | 16.41, B = 32 42.99 | 39.20,
//          B = 256 (62) 280.8 | 274.5;
//   T = 4: B = 8 13.94 | 15.16, B = 12 21.38 | 19.03, B = 32 45.74 | 40.77, B = 256 286.2 | 279.5;
//   T = 5: B = 12 21.49 | 20.72, B = 32 46.21 | 42.66, B = 256 289.5 | 280.3;
//   T = 6: B = 12 21.66 | 22.67, B = 16 (3.9) 27.06 | 27.35, B = 24 (5.8) 36.98 | 36.21, B = 32
//          46.80 | 45.58, B = 256 293.6 | 291.7;
//   T = 7: B = 32 47.23 | 49.20, B = 256 293.9 | 314.3 (T = 8: B = 32 46.8 | 53.3).
// With the producer's lookups a period ahead (v39, same process, us staged | one-token | chunk |
// ring): T = 1: B = 16 23.23 | 21.51 | 26.01 | 19.66, B = 32 40.85 | 39.10 | 44.85 | 38.35, B = 40
// (9.7) 49.58 | 46.72 | 53.78 | 46.90, B = 48 58.93 | 54.91 | 62.99 | 55.39; T = 6 (chunk | ring):
// B = 12 21.85 | 21.70, B = 16 27.06 | 26.45, B = 20 35.91 | 31.05, B = 24 36.64 | 35.42, B = 32
// 46.62 | 44.50, B = 64 83.78 | 79.47, B = 256 292.2 | 288.5; T = 7: B = 24 37.15 | 38.32, B = 32
// 46.83 | 48.66, B = 256 291.1 | 307.8; T = 8: B = 32 47.06 | 52.74.
// A per-key gate (v39; same process, us one-token or staged | ring; the chunk kernel takes only a
// scalar gate): T = 1: B = 8 11.59 | 12.18, B = 16 22.53 | 19.83, B = 32 41.87 | 38.61, B = 64
// (15.5) 75.73 | 71.90; T = 2: B = 8 (1.9) 14.31 | 13.07, B = 16 27.01 | 19.79, B = 32 49.46 |
// 39.28, B = 64 91.15 | 73.34; T = 4: B = 8 17.21 | 16.07, B = 16 32.59 | 24.19, B = 32 62.58 |
// 41.68, B = 64 113.6 | 78.22.
// With its consumers on one chunk (chunk_math: recurrent_ring_chunk_math below; docs/cuda-decode.md
// v45, bench/results/2026-12-04-decode-ring-chunk.json; us, the rule's chunk kernel | ring token
// by token | ring on one chunk, same process): T = 8: B = 8 (1.9 items per SM) 13.61 | 18.82 |
// 16.17, B = 32 (7.8) 46.52 | 50.87 | 43.13, B = 128 158.96 | 176.26 | 151.51, B = 256 315.00 |
// 341.63 | 293.70 (90.8 % of copy).
// With the state as one swizzled tensor copy each way (v46, bench/results/
// 2026-12-04-decode-ring-swizzle-rules.json; us, the rule before v46 | ring token by token | ring
// on one chunk, same process): T = 8: B = 12 (2.9 items per SM) 21.05 | 24.07 | 17.53, B = 16
// 25.48 | 29.22 | 22.63, B = 24 35.72 | 40.26 | 31.85, B = 32 42.06 | 50.88 | 42.02, B = 256
// 285.56 | 338.80 | 285.43; T = 6: B = 12 20.71 | 20.79 | 16.98, B = 16 24.91 | 24.94 | 22.25,
// B = 32 42.51 | 42.33 | 41.35, B = 256 283.93 | 286.59 | 281.97; T = 8, B = 8 (1.9 per SM): the
// chunk kernel 13.57, the ring on one chunk 13.80 (2026-12-04-decode-ring-swizzle.json).
// Rule: contiguous items; T = 1 more than 3 and at most 8 items per SM (per-key at most 16),
// T = 2..5 more than 2 per SM (per-key more than 1.5); T = 6 to 8 with the chunk consumers more
// than 2.5 per SM (between 1.9 and 2.9 not timed), T = 6 without them more than 3 per SM; else
// never.
constexpr bool recurrent_ring_preferred(std::int64_t tokens, std::int64_t heads, std::int64_t dv,
                                        bool contiguous, bool per_key, int sm_count,
                                        bool chunk_math = false) {
  const std::int64_t items = heads * (dv / 128), sms = sm_count;
  if (!contiguous) return false;
  if (tokens >= 6 && chunk_math) return 2 * items > 5 * sms;
  if (tokens >= 7) return false;
  if (tokens == 1) return items > 3 * sms && items <= (per_key ? 16 : 8) * sms;
  if (tokens <= 5) return per_key ? 2 * items > 3 * sms : items > 2 * sms;
  return tokens == 6 && items > 3 * sms;
}

// The ring kernel's consumers take the item's tokens as one chunk on the tensor cores
// (recurrent_ring.cuh, ring_consume_chunk) instead of token by token: 16-bit inputs (exact in
// tf32) with a scalar gate. Their cost per item is flat in T (v45: above the copy period of ~4.1
// us per item and SM; v46, with the swizzled tensor copies, about at it), where token by token
// costs ~0.5 us per token. Measured on the H200
// (docs/cuda-decode.md v45, bench/results/2026-12-04-decode-ring-chunk.json; Hv = 32, Dk = Dv =
// 128, the ring forced, us tokens | chunk): T = 1: B = 32 36.55 | 39.77, B = 256 268.2 | 280.5;
// T = 4: B = 8 14.18 | 15.69, B = 32 38.91 | 41.15, B = 128 140.4 | 147.9, B = 256 275.5 | 286.4;
// T = 8: B = 8 18.82 | 16.17, B = 32 50.87 | 43.13, B = 128 176.3 | 151.5, B = 256 341.6 | 293.7
// (T = 6 in the form with register stores, v45: about even). With the swizzled tensor copies (v46;
// tokens | chunk): T = 5: B = 12 19.00 | 16.41, B = 16 22.61 | 21.71, B = 24 30.58 | 30.75, B = 32
// 40.20 | 40.71, B = 256 281.15 | 279.13; T = 6: B = 12 20.79 | 16.98, B = 24 33.60 | 31.67, B = 32
// 42.33 | 41.35, B = 256 286.59 | 281.97. Rule: from 6 tokens (T = 5 is mixed: ahead at B <= 16,
// up to 1.3 % behind at B = 24 and 32).
constexpr bool recurrent_ring_chunk_math(std::int64_t tokens, int input_bytes, bool per_key) {
  return tokens >= 6 && input_bytes == 2 && !per_key;
}

// Tests and benchmarks: the ring kernel's consumers 1 = token by token, 2 = one chunk on the
// tensor cores wherever it exists (16-bit inputs, scalar gate); 0 restores the rule.
void set_recurrent_ring_math_override(int mode);

// The slice kernel (recurrent_slice.cuh: a block per 32 value columns of a (sequence, value head),
// the tokens as one chunk on the tensor cores, the state in registers) exists for 1 to 8 tokens of
// 16-bit inputs with a scalar gate (no varlen) on a k-first fp32 state with Dk = 128, whose token
// and state rows (read and written) are 16-byte aligned.
constexpr bool recurrent_slice_applies(std::int64_t tokens, int input_bytes, bool varlen,
                                       bool v_first, bool per_key, std::int64_t dk, bool bf16_state,
                                       bool rows_aligned) {
  return tokens >= 1 && tokens <= 8 && input_bytes == 2 && !varlen && !v_first && !per_key &&
         dk == 128 && !bf16_state && rows_aligned;
}

// Where the rules take the slice kernel (when it applies) instead of the staged, chunk or ring
// kernels: few heads, where a call is latency-bound. Measured on the H200 (docs/cuda-decode.md v47,
// bench/results/2026-12-04-decode-slice-paths.json, 545b92a; Hv = 32, Dk = Dv = 128, bf16 inputs,
// us, the best other kernel | slice, same process): B = 1 (128 blocks): T = 2 4.10 (narrow
// staged) | 3.81, T = 4 4.94 (narrow) | 3.88, T = 8 6.67 (narrow) | 3.93; B = 2: T = 2 5.44
// (staged) | 4.97, T = 4 6.44 (staged) | 5.01, T = 8 7.16 (chunk) | 5.12; B = 4 (512 blocks, 3.9
// per SM): T = 2 7.60 (staged) | 8.07, T = 4 9.06 (staged) | 8.28, T = 8
// 10.00 (chunk) | 8.45. Rule: from 2 tokens at up to two blocks per SM, from 4 tokens at up to
// four (B <= 2, and B <= 4 from T = 4, at Hv = 32; T = 3 and B = 3 not timed).
constexpr bool recurrent_slice_preferred(std::int64_t tokens, std::int64_t heads, std::int64_t dv,
                                         int sm_count) {
  const std::int64_t blocks = heads * (dv / 32), sms = sm_count;
  return (tokens >= 2 && blocks <= 2 * sms) || (tokens >= 4 && blocks <= 4 * sms);
}

// Tests and benchmarks: the chunk kernel's items of 32, 64 or 128 value columns whatever the grid
// (128 only where Dv % 128 == 0); 0 restores the rule.
void set_recurrent_chunk_columns_override(int columns);

// The chunk kernel's first chunk with its state wait late (recurrent_chunk.cuh, FIRST_LATE): every
// block of the first wave waits ~8 us for its first state at the H200's bandwidth, and its tokens,
// copied first, let it form that chunk's coefficients and fragments meanwhile; the instantiation's
// register allocation differs (spills), which cost in the steady state of one-chunk items.
// Measured on the H200 (docs/cuda-decode.md v34; Hv = 32, Dk = Dv = 128, us early | late, same
// process): T = 8: B = 2 (64-column items) 7.99 | 7.54, B = 6 13.18 | 11.98, B = 8 (1 item per
// block) 16.15 | 14.73, B = 32 (3.9) 49.04 | 47.86, B = 64 (7.8) 88.08 | 86.91, B = 128 (15.5)
// 160.83 | 161.30, B = 256 (31) 308.38 | 312.38; T = 16: B = 8 20.78 | 19.52, B = 32 66.67 |
// 64.94, B = 128 228.72 | 225.76, B = 256 441.49 | 434.70. Rule: at most 8 items per block, or
// items of more than one chunk (more than 8 tokens).
constexpr bool recurrent_chunk_first_late(std::int64_t items, std::int64_t blocks,
                                          std::int64_t tokens) {
  return items <= 8 * blocks || tokens > 8;
}

// Tests and benchmarks: the chunk kernel's first state wait 1 = always late, 2 = never; 0 restores
// the rule.
void set_recurrent_chunk_first_override(int mode);

// The chunk kernel's items taken dynamically from a counter pair of the launch
// (recurrent_chunk.cuh, DYNAMIC; with the first state wait late) instead of round-robin: the
// blocks' periods differ by up to ~10 % by SM, and a static schedule ends with the slowest.
// Measured on the H200 (us static | dynamic). fp32 pool (docs/cuda-decode.md v35,
// bench/results/2026-11-30-decode-21.json, 6d1f3b2): T = 8 B = 32 46.9 | 47.8, B = 64 85.4 |
// 83.0, B = 128 162.4 | 152.7, B = 256 310.3 | 291.1; T = 16 B = 32 62.9 | 65.0, B = 128 218.8 |
// 222.7, B = 256 421.9 | 430.0. bf16 pool, where an item moves half the bytes (v51,
// 2026-12-04-decode-chunk-bf16-schedule.json, 5313716): T = 8 B = 48 45.38 | 47.27, B = 64 59.56 |
// 61.34, B = 80 76.08 | 74.93, B = 96 90.12 | 88.61, B = 128 118.84 | 115.35; T = 4 B = 64 55.77 |
// 57.92, B = 96 86.57 | 83.92, B = 128 114.54 | 109.27; T = 16 static by 3-5 us at B = 64..128.
// Rule: one chunk per item and more than 6 items per block, 8 with a bf16 pool (at Hv = 32 on 264
// blocks: B = 64 has 7.8, B = 80 9.7).
constexpr bool recurrent_chunk_dynamic(std::int64_t items, std::int64_t blocks, std::int64_t tokens,
                                       bool bf16_state) {
  return items > (bf16_state ? 8 : 6) * blocks && tokens <= 8;
}

// Tests and benchmarks: the chunk kernel's items 1 = static, 2 = dynamic; 0 restores the rule.
void set_recurrent_chunk_schedule_override(int mode);

// The ring kernel's dynamic items (recurrent_ring.cuh, ring_next_item): the first round whose
// items its blocks take from a per-launch counter (0: static items; at least kRingSlots = 3, the
// rounds its start looks up together). With a full round or more for every block the first rounds
// stay static: the spread of the SMs' rates (~20 %) then decides only who takes the last items;
// with many rounds all but the start's are dynamic, so the faster SMs take more over the call.
// Measured on the H200 (docs/cuda-decode.md v49; Hv = 32, Dk = Dv = 128, bf16 inputs, 16 calls per
// graph, the ring forced, us static | dynamic from round 3 | dynamic for the last round only, same
// process; bench/results/2026-12-04-decode-ring-schedule.json at bddd8d6, in brackets the
// experiment build's two rounds, 2026-12-04-decode-ring-dynamic.json): T = 8 (chunk consumers):
// B = 16 (3.9 items per block) 21.8 | 23.3 | 23.4 [21.9-22.0 | 23.4-23.5 | 23.5-23.6], B = 32 (7.8)
// 41.5 | 40.5 | 40.0 [40.9-41.0 | 40.7 | 40.2], B = 48 (11.6) 59.3 | 57.3 | 57.1 [59.0 | 57.5 |
// 57.2], B = 64 (15.5) 77.1 | 74.1 | 74.7 [77.1-77.3 | 74.3-74.4 | 74.6-74.8], B = 128 145.4 |
// 141.1 | 145.5, B = 256 284.4 | 275.4 | 285.0; T = 1 (token consumers): B = 32 36.2 | 36.6 |
// 36.3 [36.7-36.8 | 37.0-37.1 | 36.8-36.9], B = 64 70.0 | 69.3 | 69.8, B = 128 135.4 | 134.1 |
// 135.9, B = 256 267.7 | 263.5 | 268.0.
// Rule: from 10 items per block dynamic from round 3; from 6 with the chunk consumers the last
// round only; else static.
constexpr std::int64_t recurrent_ring_dynamic_round(std::int64_t items, std::int64_t blocks,
                                                    bool chunk_math) {
  if (items >= 10 * blocks) return 3;
  return chunk_math && items >= 6 * blocks ? items / blocks : 0;
}

// Where the ring kernel initializes its mbarriers and prefetches its tensor maps before the
// dependent-launch wait (both touch only the block's shared memory and the kernel's parameters),
// so that a block that starts while the grid before drains is ready when the wait releases.
// Measured on the H200 (docs/cuda-decode.md v50, v51; us, after | before the wait, alternating in
// one process): T = 8 B = 16 21.75-21.79 | 21.63, B = 32 39.74-39.80 | 39.61-39.65 and 40.40-40.67
// | 40.29-40.49, B = 64 73.93-73.96 | 73.79-73.80, B = 128 141.14-141.25 | 141.10-141.13, B = 256
// 275.37-275.42 | 275.71-276.59; T = 1 B = 32 36.26-36.31 | 36.12-36.19. About 0.1 us up to B = 64,
// mixed at B = 256. Rule: up to 16 items per block.
constexpr bool recurrent_ring_setup_early(std::int64_t items, std::int64_t blocks) {
  return items <= 16 * blocks;
}

// Tests and benchmarks: the ring kernel's items 1 = static, 2 = dynamic from round 3, 3 = dynamic
// for the rounds after the full ones (at least from round 3); 0 restores the rule.
void set_recurrent_ring_schedule_override(int mode);

// Tests: the chunk and ring kernels' grids capped at this many blocks (so that small problems run
// several items per block); 0 restores the resident blocks.
void set_recurrent_chunk_blocks_override(int blocks);

// Where the rules take the chunk kernel (when it applies) instead of the staged one. Measured on
// the H200 (docs/cuda-decode.md, v32; Hv = 32, Dk = Dv = 128, bf16 inputs, us best staged tile |
// chunk with the column rule, same process): T = 8: B = 1 7.0 | 7.9, B = 2 9.1 | 8.4, B = 4 12.5 |
// 10.4, B = 8 18.8 | 16.4, B = 32 66.1 | 49.2, B = 256 427 | 332; T = 16: B = 1 10.5 | 13.6,
// B = 2 13.4 | 14.2, B = 4 18.1 | 16.4, B = 8 27.8 | 21.4, B = 32 100 | 68.8, B = 256 687 | 450.
// With many heads a further chunk of 8 tokens costs the chunk kernel less than the staged one
// (T = 8 -> 16 at B = 256: +118 against +260 us); with few, more (B = 2: +5.9 against +4.3), so
// the heads it needs grow with T: T = 8 from 2 sequences (64 heads), T = 16 from 4 (forward only
// beyond 16: not timed there). From 4 to 7 tokens (v38) the chunk kernel's one partial chunk
// costs about what 8 tokens do, against a staged kernel paying per token: T = 3: B = 8 13.41 |
// 13.86; T = 4: B = 1 5.24 | 6.74, B = 2 6.92 | 6.98, B = 4 9.73 | 9.15, B = 8 14.55 | 13.94;
// T = 5: B = 1 5.62 | 6.82, B = 2 7.42 | 7.07, B = 4 10.36 | 9.24; T = 6: B = 1 5.95 | 6.90,
// B = 2 7.86 | 7.18, B = 4 10.95 | 9.34, B = 8 16.59 | 14.27; T = 7: B = 12 27.83 | 22.06.
// Rule: from 4 tokens per sequence (no varlen) and 24 heads >= max(T, 8) x SMs (where the ring
// kernel is not preferred, tuning above).
constexpr bool recurrent_chunk_preferred(std::int64_t tokens, bool varlen, std::int64_t heads,
                                         int sm_count) {
  const std::int64_t t = tokens < 8 ? 8 : tokens;
  return !varlen && tokens >= 4 && 24 * heads >= t * static_cast<std::int64_t>(sm_count);
}

// Where the rules take the chunk kernel for a bfloat16 pool (recurrent_chunk.cuh, SB), which the
// ring kernel does not take, instead of the staged one. Measured on the H200 (docs/cuda-decode.md
// v43, bench/results/2026-12-03-decode-bf16-chunk*.json; Hv = 32, Dk = Dv = 128, bf16 inputs, us
// staged (narrow tile at B = 1) | chunk, same process): B = 1: T = 4 5.75 | 6.19, T = 5 6.30 |
// 6.31, T = 6 6.67 | 6.43, T = 8 7.72 | 6.47, T = 12 9.64 | 11.42, T = 16 11.69 | 11.83; B = 2:
// T = 4 7.21 | 6.31, T = 8 9.76 | 6.72, T = 12 11.90 | 11.63, T = 16 14.33 | 12.03; B = 8: T = 2
// 9.22 | 9.07, T = 3 10.26 | 9.12, T = 8 16.26 | 9.58; B = 32: T = 2 32.66 | 29.95, T = 3 36.25 |
// 30.71, T = 8 59.38 | 32.42; T = 2: B = 2 6.14 | 6.13, B = 4 7.36 | 7.87; T = 3: B = 2 6.63 |
// 6.23, B = 4 8.02 | 7.95; B = 1: T = 2 4.81 | 5.98, T = 3 5.24 | 6.06, T = 7 7.07 | 6.45. Rule
// (no varlen): from 3 tokens per sequence on 24 heads >= 8 x SMs (B >= 2 at Hv = 32), 2 tokens
// from 1.5 heads per SM (B >= 7), and with fewer heads one chunk of 6 to 8 tokens.
constexpr bool recurrent_chunk_preferred_bf16(std::int64_t tokens, bool varlen, std::int64_t heads,
                                              int sm_count) {
  const std::int64_t sms = sm_count;
  if (varlen || tokens < 2) return false;
  if (tokens == 2) return 2 * heads >= 3 * sms;
  if (24 * heads >= 8 * sms) return true;
  return tokens >= 6 && tokens <= 8;
}

// Benchmarks only: force the warps per block (1, 2, 4 or 8; 0 restores the heuristic).
void set_recurrent_warps_override(int warps);

// Tests and benchmarks: 1 = always the staged kernel (recurrent.cuh) with its usual tile; 2 = the
// one-token kernel wherever recurrent_one_applies, the usual staged tile elsewhere; 3 = the staged
// kernel with the narrow tile wherever it exists (k-first, Dk < 256), the usual tile elsewhere;
// 4 = the chunk kernel wherever recurrent_chunk_applies, the usual staged tile elsewhere;
// 5 = the ring kernel wherever recurrent_ring_applies, the rules elsewhere; 6 = the slice kernel
// wherever recurrent_slice_applies, the rules elsewhere; 0 = the rules.
void set_recurrent_path_override(int path);

// The next-wave L2 prefetch (recurrent.cuh, prefetch_state_of_block): how many blocks ahead a
// block prefetches the state, 0 = none, for a grid of `blocks` of which `resident` run at once.
// Measured on the H200 (docs/cuda-decode.md, v25; Hv = 32, Dk = Dv = 128, us off | on): half a
// wave ahead is the best distance (a quarter, three quarters and a whole wave lose at some B);
// the one-token kernel gains from B = 32 (3.9 waves: 40.4 | 39.1; B = 256: 293 | 276), the
// staged kernel (T = 8) loses ~1 % at 3.9 waves (B = 32: 68.1 | 68.8) and gains from 7.8 (B = 64:
// 128 | 124; B = 256: 464 | 435). Rule: half a wave, from 2 waves (one-token kernel) or from 6
// waves (staged kernel).
constexpr std::int64_t recurrent_prefetch_blocks(std::int64_t blocks, std::int64_t resident,
                                                 bool one_token) {
  const std::int64_t min_waves = one_token ? 2 : 6;
  return resident >= 2 && blocks >= min_waves * resident ? resident / 2 : 0;
}

// The first wave's prefetch distance (0 = none) for a grid of one to two waves, where half a
// wave ahead has nothing to cover: the first wave's blocks prefetch one wave ahead, i.e. the
// whole second wave (at most a wave of state in L2 besides the first wave's). Measured on the
// H200 (docs/cuda-decode.md, v28; Hv = 32, Dk = Dv = 128, T = 1, us off | rule): one-token kernel
// B = 12 (1.45 waves) 17.2 | 15.9, B = 16 (1.94 waves) 22.6 | 21.3 (bf16 pool 15.4 | 15.1). The
// same first-wave distance beside the half-wave rule loses 1-5 % from 2.4 waves (B = 20 26.0 |
// 27.2, B = 32 39.0 | 40.2) and in the staged kernel (T = 8, B = 12..32). Rule: one to two
// waves, one-token kernel.
constexpr std::int64_t recurrent_prefetch_wave(std::int64_t blocks, std::int64_t resident,
                                               bool one_token) {
  return one_token && resident >= 2 && blocks > resident && blocks < 2 * resident ? resident : 0;
}

// The one-token kernel's state loads with the default cache policy instead of the evict-first
// hint (ld.global.cs). Measured on the H200 (docs/cuda-decode.md, v29; Hv = 32, Dk = Dv = 128,
// T = 1, us evict-first | default, same process): fp32 pool B = 16 (1.9 waves) 21.5 | 23.1,
// B = 32 (3.9) 39.4 | 39.2, B = 48 (5.8) 56.6 | 55.2, B = 64 (7.8) 73.5 | 71.5, B = 128 (15.5)
// 141.3 | 136.5, B = 256 275.6 | 266.3; bf16 pool B = 64 (7.8) 49.2 | 50.0, B = 128 92.8 | 91.4,
// B = 256 177.7 | 174.7. (The staged kernel, T = 8, was 0-2 % slower with it: it keeps the hint.)
// Rule: the default policy from 4 waves (fp32 pool) or 8 waves (bf16 pool).
constexpr bool recurrent_one_loads_normal(std::int64_t blocks, std::int64_t resident,
                                          bool bf16_state) {
  return resident >= 1 && blocks >= (bf16_state ? 8 : 4) * resident;
}

// Tests and benchmarks: the one-token kernel's state loads 1 = always evict-first, 2 = always the
// default policy; 0 restores the rule.
void set_recurrent_load_override(int mode);

// Tests and benchmarks: programmatic dependent launches 1 = off, 2 = on; 0 restores the rule (on).
// A dynamic schedule whose counter pair comes from gdr's pool (zeroed by a memset just before:
// eager launches, or captures once the arena is used up) is launched plainly.
void set_recurrent_pdl_override(int mode);

// Tests and benchmarks: the next-wave prefetch 1 = off, 2 = every block prefetches the next
// block's state whatever the grid (exercises the address arithmetic of both distances);
// 3 (experiments) = the first wave one wave ahead and the rest half a wave, whatever the kernel,
// from more than one wave; 0 restores the rules.
void set_recurrent_prefetch_override(int mode);

}  // namespace gdr::cuda
