// Tuning decisions in one place, each with the reason it holds.
#pragma once

#include <cstdint>

#include "gdr/problem.h"
#include "gdr/types.h"

namespace gdr::heuristics {

// Chunk sizes the chunkwise path is built for. 64 by default: the SPEC's C, and large enough
// that the chunk products run near the matrix-product rate.
inline constexpr int kDefaultChunk = 64;
inline constexpr bool is_supported_chunk(int c) { return c == 16 || c == 32 || c == 64; }

// Below this many tokens per sequence the CPU fp32 per-token loop beats the chunkwise form
// (fixed per-chunk costs dominate; measured by bench/cpu_paths, see bench/results).
inline constexpr std::int64_t kCpuSequentialMaxTokens = 32;

// The path `automatic` resolves to on the CPU.
inline Path cpu_forward_path(const Problem& prob) {
  const std::int64_t tokens_per_seq = prob.N > 0 ? (prob.B * prob.T) / prob.N : 0;
  return tokens_per_seq <= kCpuSequentialMaxTokens ? Path::sequential : Path::chunkwise;
}
inline Path cpu_backward_path(const Problem& prob) { return cpu_forward_path(prob); }

}  // namespace gdr::heuristics
