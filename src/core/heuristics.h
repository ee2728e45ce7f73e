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

// CUDA forward, Path::automatic (chunk_size 64): the chunked forward (src/cuda/chunked/) when
//   - the sequences are longer than one chunk on average (tokens per sequence >
//     kCudaRecurrentMaxTokens: below that the chunk form has nothing to amortise its prep over),
//     and
//   - there are few value-head rows (N Hv <= kCudaChunkedMaxRows: the recurrent kernel fills the
//     chip with many rows, while the chunked state pass walks each row's chunks in sequence);
// the recurrent kernel otherwise.
// Measured 2026-12-06 on an H100 (bf16, Hk/Hv = 16/32, Dk = Dv = 128, commit f53d6ea: the bf16
// prep, state pass and output kernels; bench/cuda_chunked_time --crossover,
// bench/results/2026-12-06-chunk-fwd-h100-f53d6ea.json `gdr_alone`), chunked vs recurrent ms:
// B = 1: T = 128 0.084 vs 0.066, T = 256 0.089 vs 0.124, T = 1024 0.188 vs 0.473, T = 4096 0.573
// vs 2.13; B = 8 (256 rows): T = 128 0.208 vs 0.168, T = 1024 1.14 vs 1.24, T = 4096 4.35 vs
// 4.92; B = 32, T = 256: 1.20 vs 1.22 (a tie). So: more than 256 tokens per sequence, and at most
// 256 rows, the largest row count measured where chunked wins (the bound was 32 rows before these
// kernels: 2026-12-05, commit 6ca70a5, B = 8 T = 4096 5.94 vs 4.99).
inline constexpr std::int64_t kCudaRecurrentMaxTokens = 256;
inline constexpr std::int64_t kCudaChunkedMaxRows = 256;

inline Path cuda_forward_path(const Problem& prob) {
  const bool longer_than_a_chunk = tokens_per_sequence(prob) > kCudaRecurrentMaxTokens;
  const bool few_rows = prob.N * prob.Hv <= kCudaChunkedMaxRows;
  return longer_than_a_chunk && few_rows ? Path::chunkwise : Path::sequential;
}

// CUDA chunked forward on the row-factor path at Dk = Dv = 128 (src/cuda/chunked/
// chunked_forward.cu fused_state_pass): the fused state pass (Vnew formed on chip, one block of all
// 128 value columns per sequence and value head) where sequences x value heads fill the SMs, else
// the bf16 pass (32 value columns per block, single products). Measured on an H100 (921d278,
// bench/results/2026-12-07-chunk-sweep-h100-921d278.json): 8 x 4096, Hv = 32 (256 rows) 2.43 ms
// against 3.50; at 32 rows (1 x 16384) 2.47 against 1.54, and still 1.62 with 32 columns per
// block. The rows between 32 and 256 are not measured: the threshold is where a block of each
// fills the SMs once.
inline bool cuda_chunked_fused_pass(std::int64_t N, std::int64_t Hv, int sms) {
  return N * Hv >= sms;
}

// CUDA chunked forward, exact segment splitting of the state pass (docs/cuda-chunked.md
// §Segments): chunks per segment, or 0 for no split. The state pass is sequential over a
// sequence's chunks and has N Hv Dv / 16 blocks at 16 value columns; a split runs the segments
// of a sequence concurrently at the price of 3x the state-pass work (the maps [R | M] over Dv + Dk
// columns, then each segment again from its true start), so it can only pay where the unsplit
// pass leaves most of the chip idle. G = 2 sms / (Hv (Dv + Dk) / 16) segments in all keep the
// map pass within ~2 blocks per SM; the split is taken when G >= 4 (the critical path, two
// passes of 1 / G of the chunks, is then at most half the unsplit one), with at least
// kCudaMinSegmentChunks chunks per segment (the per-block setup, a state load and store, is
// amortised) and at least two segments' worth of chunks in the call. Under varlen the host does
// not know the lengths (cu_seqlens stays on the device): segments have a fixed chunk count, so a
// long sequence gets many and a short one one. Not measured yet (docs/cuda-chunked.md).
inline constexpr std::int64_t kCudaMinSegmentChunks = 4;
inline constexpr std::int64_t kCudaMinSegments = 4;

inline std::int64_t cuda_chunked_segment_chunks(std::int64_t N, std::int64_t Hv, std::int64_t Dk,
                                                std::int64_t Dv, std::int64_t chunks, int sms) {
  if (N <= 0 || Hv <= 0 || chunks <= 0 || sms <= 0) return 0;
  const std::int64_t G = (2 * static_cast<std::int64_t>(sms) * 16) / (Hv * (Dv + Dk));
  if (G < kCudaMinSegments) return 0;
  std::int64_t cs = (chunks + G - 1) / G;
  if (cs < kCudaMinSegmentChunks) cs = kCudaMinSegmentChunks;
  return chunks >= 2 * cs ? cs : 0;
}

// CUDA chunked backward given the forward's chunk states (src/cuda/chunked/chunked_backward.cu):
// chunk slots per window. The backward's per-chunk scratch (~6.4 KB per token and value head at
// Dk = Dv = 128: W, Vnew, Qs, Kd, P, Tinv, dS, dVnew, ... in fp32) holds one window of slots at a
// time, the windows taken last first with dS carried between them, so that its size is bounded
// by the window, not by T (docs/cuda-chunked.md §Backward memory). The window's per-chunk kernels
// have (slots in the window) x Hv blocks at about two per SM: up to kCudaBackwardWindowWaves full
// waves of them (4 x 132 blocks on an H100: ~216 MB at Dk = Dv = 128) keep them busy, at the price
// of one launch of each per window; a short call takes an eighth of its items per window, but at
// least two waves (so that its scratch stays small next to its saved states and gradients: at
// 1 x 4096, Hv = 32, the four-wave window was half of the peak, 2026-12-06). Not yet measured
// against other window sizes (bench/cuda_chunked_time --backward --window W).
inline constexpr std::int64_t kCudaBackwardWindowWaves = 4;
inline constexpr std::int64_t kCudaBackwardMinWindowWaves = 2;
inline constexpr std::int64_t kCudaBackwardWindowsPerCall = 8;

inline std::int64_t cuda_backward_window_slots(std::int64_t slots, std::int64_t Hv, int sms) {
  if (slots <= 0 || Hv <= 0 || sms <= 0) return slots > 0 ? slots : 1;
  const std::int64_t most = kCudaBackwardWindowWaves * static_cast<std::int64_t>(sms);
  const std::int64_t least = kCudaBackwardMinWindowWaves * static_cast<std::int64_t>(sms);
  std::int64_t items = slots * Hv / kCudaBackwardWindowsPerCall;
  items = items < least ? least : (items > most ? most : items);
  const std::int64_t w = (items + Hv - 1) / Hv;
  return w < slots ? w : slots;
}

}  // namespace gdr::heuristics
