// Tensor-map encoding (tensor_maps.h).
#include "cuda/common/tensor_maps.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace gdr::cuda {
namespace {

// The driver's tensor-map encoder, through the runtime; null where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// A tensor map's byte strides (dims[1..n], element strides of es bytes, from the innermost up;
// `extent`: the bytes that dims[0] spans): false where one is not positive, not a multiple of 16
// or from 2^40 bytes. A dimension of one element takes the dense stride (its own is never used).
bool map_byte_strides(const cuuint64_t* dims, const std::int64_t* element_strides, int n, int es,
                      std::int64_t extent, cuuint64_t* strides) {
  for (int i = 0; i < n; ++i) {
    const std::int64_t bytes = dims[i + 1] == 1 ? (extent + 15) / 16 * 16 : element_strides[i] * es;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= (std::int64_t{1} << 40)) return false;
    strides[i] = static_cast<cuuint64_t>(bytes);
    extent = bytes * static_cast<std::int64_t>(dims[i + 1]);
  }
  return true;
}

}  // namespace

bool encode_state_map(CUtensorMap* map, const float* base, const Problem& prob, std::int64_t rows,
                      std::int64_t s0, std::int64_t s1, std::int64_t s2, int box_columns,
                      int box_keys) {
  const auto encode = tensor_map_encoder();
  if (!encode || reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || rows <= 0 || rows > INT_MAX)
    return false;
  constexpr int stripe = 32;  // columns per 128-byte unit of the swizzle
  const cuuint64_t dims[5] = {stripe, static_cast<cuuint64_t>(prob.Dv / stripe),
                              static_cast<cuuint64_t>(prob.Dk), static_cast<cuuint64_t>(prob.Hv),
                              static_cast<cuuint64_t>(rows)};
  const std::int64_t element_strides[4] = {stripe, s2, s1, s0};
  cuuint64_t strides[4];
  if (!map_byte_strides(dims, element_strides, 4, 4, stripe * 4, strides)) return false;
  const cuuint32_t box[5] = {stripe, static_cast<cuuint32_t>(box_columns / stripe),
                             static_cast<cuuint32_t>(box_keys), 1, 1};
  const cuuint32_t steps[5] = {1, 1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 5, const_cast<float*>(base), dims, strides,
                box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool encode_token_map(CUtensorMap* map, const void* base, const Problem& prob, std::int64_t heads,
                      std::int64_t d, std::int64_t sb, std::int64_t st, std::int64_t sh,
                      int box_elements, int max_tokens) {
  const auto encode = tensor_map_encoder();
  if (!encode || reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || prob.B > INT_MAX ||
      prob.T > max_tokens)
    return false;
  constexpr int es = 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(prob.T), static_cast<cuuint64_t>(prob.B)};
  const std::int64_t element_strides[3] = {sh, st, sb};
  cuuint64_t strides[3];
  if (!map_byte_strides(dims, element_strides, 3, es, d * es, strides)) return false;
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_elements), 1,
                             static_cast<cuuint32_t>(prob.T), 1};
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  const auto type = prob.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 4, const_cast<void*>(base), dims, strides, box, steps,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace gdr::cuda
