// Device-side random fills for the CUDA benchmarks. dtype codes as gdr::DType: 0 f32, 1 f16,
// 2 bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gdr::bench {

// p[i] = lo + (hi - lo) * U(0, 1), i in [0, n).
cudaError_t fill_uniform(void* p, int dtype, std::int64_t n, std::uint64_t seed, float lo, float hi,
                         cudaStream_t stream);

// `rows` rows of `dim` values with unit L2 norm (keys).
cudaError_t fill_unit_rows(void* p, int dtype, std::int64_t rows, int dim, std::uint64_t seed,
                           cudaStream_t stream);

}  // namespace gdr::bench
