// A check of the warpgroup-product layer (wgmma.cuh) on the device: D = A B for one 64-row tile
// through the no-swizzle layouts and descriptors, so that the GPU tests (CudaWgmma.Probe) confirm
// the layouts, descriptors and accumulator fragments before a kernel relies on them.
#pragma once

#include <cstdint>

namespace gdr::cuda::detail {

// A [64][K] row-major bf16 bits (staged K-major, or a_m_major: M-major, transposed in the
// instruction), B [N][K] (b_n_major false: staged K-major) or [K][N] (true: staged N-major,
// transposed in the instruction), D [64][N] fp32 row-major; device pointers. N in {16, 32, 64,
// 128}, K a multiple of 16 up to 256. Synchronous; returns the CUDA error (or cudaErrorInvalidValue
// for a shape it does not take).
int wgmma_probe_gemm(const std::uint16_t* A, const std::uint16_t* B, float* D, int N, int K,
                     bool a_m_major, bool b_n_major);

}  // namespace gdr::cuda::detail
