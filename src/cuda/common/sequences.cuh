// Index tensors read on the device (cu_seqlens, state_indices; i32 or i64) and the token range
// of a varlen sequence, shared by the decode / recurrent and the chunked kernels.
//
// cu_seqlens values are not checked on the host by default (that needs a copy to the host and a
// synchronisation, so a call could not be captured in a CUDA graph; ExecConfig::check_values asks
// for it). Every kernel reads a sequence's range through sequence_bounds, which clamps the values
// into [0, T] and makes them non-decreasing: an invalid tensor gives meaningless results for the
// sequences it describes wrongly, never an access out of bounds.
#pragma once

#include <cstdint>

namespace gdr::cuda {

// Element type codes of index tensors, as in gdr::DType (include/gdr/types.h).
inline constexpr int kIndexI32 = 4;
inline constexpr int kIndexI64 = 5;

__device__ __forceinline__ std::int64_t load_index(const void* p, std::int64_t i, int dtype) {
  return dtype == kIndexI64 ? static_cast<const std::int64_t*>(p)[i]
                            : static_cast<std::int64_t>(static_cast<const std::int32_t*>(p)[i]);
}

// Tokens [bos, eos) of sequence n: cu_seqlens[n], cu_seqlens[n + 1], clamped so that
// 0 <= bos <= eos <= T.
__device__ __forceinline__ void sequence_bounds(const void* cu_seqlens, int dtype, std::int64_t n,
                                                std::int64_t T, std::int64_t& bos,
                                                std::int64_t& eos) {
  bos = load_index(cu_seqlens, n, dtype);
  eos = load_index(cu_seqlens, n + 1, dtype);
  bos = bos < 0 ? 0 : (bos > T ? T : bos);
  eos = eos < bos ? bos : (eos > T ? T : eos);
}

}  // namespace gdr::cuda
