// Tuning decisions in one place, each with the reason it holds.
#pragma once

#include <cstdint>

#include "gdr/problem.h"
#include "gdr/types.h"

namespace gdr::heuristics {

// Chunk sizes the chunkwise path is built for. 64 by default: docs/operator.md's C, and large
// enough that the chunk products run near the matrix-product rate.
inline constexpr int kDefaultChunk = 64;
inline constexpr bool is_supported_chunk(int c) {
  return c == 16 || c == 32 || c == 64;
}

// Up to this many tokens per sequence the CPU fp32 per-token loop is at least as fast as the
// chunkwise form. Measured with bench/cpu_paths (A/B pairs after A/A, B=4, Hk=16, Hv=32,
// Dk=Dv=128, fp32, 2 cores, 2026-11-29, after the chunkwise speedups of 9bc9ad9;
// bench/results/2026-11-29-cpu-paths-2.json): median time(sequential) / time(chunkwise)
//   forward:            T=16 0.88, 32 1.05, 64 0.98, 128 1.25, 256 1.10, 512 1.37
//   forward + backward: T=4 0.97 (0.87 in a second run), 8 1.37, 16 1.47
// (32 and 64 are ties within the A/A spread). The forward loop makes one pass over the state
// per token; its backward makes four (two recomputed steps, two reverse passes), so the
// crossover comes much earlier for the backward. Re-measure when either path changes.
inline constexpr std::int64_t kCpuSequentialMaxTokens = 64;
inline constexpr std::int64_t kCpuSequentialMaxTokensBackward = 4;

inline std::int64_t tokens_per_sequence(const Problem& prob) {
  return prob.N > 0 ? (prob.B * prob.T) / prob.N : 0;
}

// The path `automatic` resolves to on the CPU. (A call given the saved-for-backward tensor
// resolves to chunkwise in both directions whatever T is, dispatch.cpp: only that path fills and
// reads it. Up to 64 tokens its forward is within 0.88-1.05x of the loop's, ratios above.)
inline Path cpu_forward_path(const Problem& prob) {
  return tokens_per_sequence(prob) <= kCpuSequentialMaxTokens ? Path::sequential : Path::chunkwise;
}
inline Path cpu_backward_path(const Problem& prob) {
  return tokens_per_sequence(prob) <= kCpuSequentialMaxTokensBackward ? Path::sequential
                                                                      : Path::chunkwise;
}

// CUDA forward: above this many tokens per sequence the chunked forward (src/cuda/chunked/)
// runs, at or below it the recurrent kernel. Not yet measured: 64, one chunk, until the
// crossover is measured with bench/cuda_chunked.py (docs/cuda-chunked.md).
inline constexpr std::int64_t kCudaRecurrentMaxTokens = 64;

inline Path cuda_forward_path(const Problem& prob) {
  return tokens_per_sequence(prob) <= kCudaRecurrentMaxTokens ? Path::sequential
                                                                : Path::chunkwise;
}

}  // namespace gdr::heuristics
