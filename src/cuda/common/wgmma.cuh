// Warpgroup matrix products (sm_90a `wgmma.mma_async`) on bf16 operands in shared memory, fp32
// accumulators in registers: the shared-memory layout without swizzling, its 64-bit descriptor,
// and the m64n32k16 / m64n64k16 products. One warpgroup (4 consecutive warps, the first warp index
// a multiple of 4) issues each product; one instruction stands for what mma.sync needs ~30
// (ldmatrix + m16n8k16) for, which is what the instruction-bound kernels want (docs/cuda-chunked.md
// §What limits them now). Checked by CudaWgmma.Probe (tests/cuda/test_wgmma.cpp) through
// wgmma_probe.cu before any kernel relies on it.
//
// Layout without swizzling (PTX ISA, "Shared Memory Matrix Layout", canonical layouts), bf16
// (8 elements = 16 bytes = one "row" of a core matrix; a core matrix is 8 such rows, 128 bytes
// contiguous):
//   K-major (A [M][K], or B stored as [N][K]): element (r, k) at byte
//       (r % 8) * 16 + (r / 8) * SBO + (k % 8) * 2 + (k / 8) * LBO;
//   MN-major (B stored as [K][N], transposed in the instruction): element (k, n) at byte
//       (n % 8) * 2 + (k % 8) * 16 + (n / 8) * SBO + (k / 8) * LBO.
// The tiles here put the core matrices of one 8-row (8-column) group next to each other along K:
// K-major LBO = 128, SBO = (K / 8) * 128; MN-major SBO = 128, LBO = (N / 8) * 128. A k16 step
// advances the start address by 2 LBO.
#pragma once

#include <cstdint>

#include "cuda/common/mma_tf32.cuh"  // smem_addr

namespace gdr::cuda::detail {

// Byte offsets of the tiles above (no swizzling).
__host__ __device__ constexpr std::uint32_t kmajor_offset(int r, int k, int K) {
  return static_cast<std::uint32_t>((r % 8) * 16 + (r / 8) * (K / 8) * 128 + (k % 8) * 2 +
                                    (k / 8) * 128);
}
__host__ __device__ constexpr std::uint32_t nmajor_offset(int k, int n, int N) {
  return static_cast<std::uint32_t>((n % 8) * 2 + (k % 8) * 16 + (n / 8) * 128 +
                                    (k / 8) * (N / 8) * 128);
}

// The matrix descriptor: start address >> 4 (bits 0-13), leading byte offset >> 4 (16-29),
// stride byte offset >> 4 (32-45), base offset 0 (49-51), layout 0 = no swizzling (62-63).
__device__ __forceinline__ std::uint64_t wgmma_desc(const void* smem, std::uint32_t lbo,
                                                    std::uint32_t sbo) {
  const std::uint64_t addr = smem_addr(smem);
  return ((addr & 0x3ffffu) >> 4) | (std::uint64_t((lbo >> 4) & 0x3fffu) << 16) |
         (std::uint64_t((sbo >> 4) & 0x3fffu) << 32);
}

// Shared-memory writes of the generic proxy (st.shared, cp.async landed and waited for) made
// visible to the async proxy that wgmma reads through; before the barrier that precedes wgmma.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Before the first wgmma of a group whose accumulators the threads wrote.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Wait until at most N committed groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Accumulator fragment of m64nNk16 (f32): thread t of the warpgroup, warp w = t / 32, g = lane / 4,
// c = lane % 4; d[4 j + e] holds row 16 w + g + 8 (e / 2), column 8 j + 2 c + (e % 2), j < N / 8
// (mma.sync m16n8's C fragment per 8 columns; CudaWgmma.Probe checks it).

// D (+)= A B, m64n32k16, bf16 x bf16 -> f32. TransB: B MN-major (else K-major); A K-major.
template <bool TransB>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], std::uint64_t da, std::uint64_t db,
                                                bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, "
      "0, %19;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TransB ? 1 : 0));
}

// D (+)= A B, m64n64k16, bf16 x bf16 -> f32. TransB: B MN-major (else K-major); A K-major.
template <bool TransB>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], std::uint64_t da, std::uint64_t db,
                                                bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TransB ? 1 : 0));
}

}  // namespace gdr::cuda::detail
