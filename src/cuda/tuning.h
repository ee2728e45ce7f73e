// Launch shape of the CUDA recurrent (decode) kernel: the heuristic, and a override for
// benchmarks that sweep it. Internal to gdr (not part of the public API).
#pragma once

#include <cstdint>

namespace gdr::cuda {

// Value columns one warp owns (recurrent.cuh, Tile::kCW): k-first 16 (8 at Dk = 256), v-first
// 32 / (Dk / 32), so that a thread keeps at most 64 state floats in registers; the narrow
// column tile (either layout) 32 / (Dk / 16), 16 state floats per thread.
constexpr int recurrent_columns_per_warp(std::int64_t dk, bool v_first, bool narrow = false) {
  if (narrow) return static_cast<int>(32 / (dk / 16));
  return v_first ? static_cast<int>(32 / (dk / 32)) : (dk == 256 ? 8 : 16);
}

// The narrow tile when the wide one would give the GPU fewer than `kNarrowBelowWarpsPerSm`
// warps per SM (few sequences x heads): there the time is the per-token dependency chain of
// too few warps, which a quarter of the state per lane shortens (bench/NOTES-gpu.md, v14).
inline constexpr int kNarrowBelowWarpsPerSm = 8;
constexpr bool recurrent_narrow(std::int64_t heads, std::int64_t dk, std::int64_t dv, bool v_first,
                                int sm_count) {
  return heads * (dv / recurrent_columns_per_warp(dk, v_first)) <
         static_cast<std::int64_t>(kNarrowBelowWarpsPerSm) * sm_count;
}

// Warps per block. The warps of a block share one staging of q, k (and the gates) per chunk,
// so larger blocks stage less per state byte, while small grids want more, smaller blocks to
// reach more SMs. Measured on the H200 (bench/NOTES-gpu.md, sweeps of 1/2/4/8 warps, Hv = 32,
// Dk = Dv = 128, B = 1..256): T = 1: 4 warps best from B = 32 on, all within 2 % at B = 8,
// 1 warp best at B = 1 (4.7 us vs 5.1 us with 4); T = 8: 8 warps best from B = 32 on, 4 warps
// best at B = 1 and 8. Rule: 8 warps from T = 4 tokens, else 4; one step down (to 4 or to 1)
// while that would leave fewer than two blocks per SM; never more than Dv / CW. The narrow
// tile: 4 warps from T = 4, else 2 (so that a block's v columns are whole 16-byte units).
constexpr int recurrent_warps_per_block(std::int64_t heads, std::int64_t tokens, std::int64_t dk,
                                        std::int64_t dv, bool v_first, int sm_count,
                                        bool narrow = false) {
  const std::int64_t warps_per_head = dv / recurrent_columns_per_warp(dk, v_first, narrow);
  std::int64_t w = 0;
  if (narrow) {
    w = tokens >= 4 ? 4 : 2;
  } else {
    const std::int64_t big = tokens >= 4 ? 8 : 4, small = tokens >= 4 ? 4 : 1;
    w = heads * (warps_per_head / (big < warps_per_head ? big : warps_per_head)) >=
                2 * static_cast<std::int64_t>(sm_count)
            ? big
            : small;
  }
  if (w > warps_per_head) w = warps_per_head;
  return static_cast<int>(w);
}

// Benchmarks only: force the warps per block (1, 2, 4 or 8; 0 restores the heuristic).
void set_recurrent_warps_override(int warps);

// Tests and benchmarks: force the tile (1 = the wide tile of the layout, 2 = the narrow column
// tile; 0 restores recurrent_narrow's choice).
void set_recurrent_tile_override(int tile);

}  // namespace gdr::cuda
