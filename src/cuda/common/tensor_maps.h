// Tensor maps (CUtensorMap) for the bulk-copy engine's tensor copies (tensor_copy.cuh), encoded
// through the driver's entry point (no link against libcuda). Each returns false where a map
// cannot describe the tensor (no encoder in the driver; an address or a stride not a multiple of
// 16 bytes; a stride not positive or from 2^40 bytes; a coordinate beyond 32 bits): the caller
// then moves the data another way.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "gdr/problem.h"

namespace gdr::cuda {

// A state [rows][Hv][Dk][Dv] f32 with strides (s0, s1, s2) elements, columns contiguous, as a 5-D
// tensor (32 columns, Dv / 32 stripes of them 128 bytes apart, keys, value heads, rows) moved in
// boxes of 32 x (box_columns / 32) x box_keys (one item: its columns and keys, in the order of its
// rows) with the 128-byte swizzle.
bool encode_state_map(CUtensorMap* map, const float* base, const Problem& prob, std::int64_t rows,
                      std::int64_t s0, std::int64_t s1, std::int64_t s2, int box_columns,
                      int box_keys);

// A token input [B][T][heads][d] of prob.dtype (16-bit) with strides (sb, st, sh) elements, rows
// contiguous, moved in boxes of box_elements x 1 head x T tokens x 1 sequence (elements past d
// read as zeros); false also beyond max_tokens tokens.
bool encode_token_map(CUtensorMap* map, const void* base, const Problem& prob, std::int64_t heads,
                      std::int64_t d, std::int64_t sb, std::int64_t st, std::int64_t sh,
                      int box_elements, int max_tokens);

}  // namespace gdr::cuda
