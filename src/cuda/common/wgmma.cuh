// Warpgroup matrix products (sm_90a `wgmma.mma_async`) on bf16 operands in shared memory, fp32
// accumulators in registers: the 64-bit matrix descriptor of an operand laid out as
// wgmma_layout.h says (no swizzling), the proxy fence, the group fences, and the m64nNk16 products
// (N = 16, 32, 64, 128; either operand K-major or MN-major). One warpgroup (4 consecutive warps,
// the first warp index a multiple of 4) issues each product; one instruction stands for what
// mma.sync needs ~30 (ldmatrix + m16n8k16) for, which is what the instruction-bound kernels want
// (docs/cuda-chunked.md). Checked by CudaWgmma.Probe (tests/cuda/test_wgmma.cpp) through
// wgmma_probe.cu.
//
// Accumulator fragment of m64nNk16 (f32), held as d[N / 8][4]: thread t of the warpgroup, warp
// w = t / 32 (of the group), g = lane / 4, c = lane % 4; d[j][e] holds row 16 w + g + 8 (e / 2),
// column 8 j + 2 c + (e % 2): per 8 columns, mma.sync m16n8's C fragment of the warp's 16 rows.
#pragma once

#include <cstdint>

#include "cuda/common/mma_tf32.cuh"  // smem_addr, fence_proxy_async
#include "cuda/common/wgmma_layout.h"

namespace gdr::cuda::detail {

// The descriptor of operand d of the tile at byte tile_byte of a shared region whose shared
// address / 16 is base16: start address >> 4 (bits 0-13), leading byte offset >> 4 (16-29),
// stride byte offset >> 4 (32-45), base offset 0 (49-51), layout 0 = no swizzling (62-63). No
// mask on the sum: shared addresses / 16 stay below 2^14, the width of the address field. Where
// tile_byte and d are compile-time constants a descriptor costs an add (RegionDescriptors).
__device__ __forceinline__ std::uint64_t wgmma_desc16(std::uint32_t base16, std::uint32_t tile_byte,
                                                      wgmma_layout::Operand d) {
  return std::uint64_t(base16 + ((tile_byte + d.start) >> 4)) |
         (std::uint64_t((d.lbo >> 4) & 0x3fffu) << 16) |
         (std::uint64_t((d.sbo >> 4) & 0x3fffu) << 32);
}
// The descriptor of operand d of the tile at `tile` (shared memory).
__device__ __forceinline__ std::uint64_t wgmma_desc(const void* tile, wgmma_layout::Operand d) {
  return wgmma_desc16(smem_addr(tile) >> 4, 0, d);
}
// The descriptors of the operands in one shared region (a kernel's dynamic shared memory): the
// region's address / 16 taken once, tiles named by their byte offsets in it.
struct RegionDescriptors {
  std::uint32_t base16;
  __device__ explicit RegionDescriptors(const void* region) : base16(smem_addr(region) >> 4) {}
  __device__ std::uint64_t operator()(std::uint32_t tile_byte, wgmma_layout::Operand d) const {
    return wgmma_desc16(base16, tile_byte, d);
  }
};

// Shared-memory writes of the generic proxy (st.shared, cp.async landed and waited for) are made
// visible to the async proxy that wgmma reads through by fence_proxy_async (mma_tf32.cuh), by
// every writing thread, before the barrier that precedes the products.

// The warpgroup index of the calling thread (threadIdx.x / 128) broadcast from lane 0, so that the
// compiler knows it is uniform across the warp and keeps what depends on it (the descriptors) in
// uniform registers instead of moving each one there (R2UR) before its instruction.
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

// Before the first product of a group whose accumulators the threads wrote.
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
// Pins the accumulator registers at this point of the program: after wgmma_wait, no use of them
// may be moved above the wait (and before the products, no write below them).
template <int J>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[J][4]) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// D (+)= A B (accumulate false: D = A B), m64n16k16, bf16 x bf16 -> f32. TransA: A MN-major (A^T
// stored), else K-major; TransB: B MN-major, else K-major.
template <bool TransA, bool TransB>
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[2][4], std::uint64_t da,
                                                std::uint64_t db, bool accumulate = true) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, %12;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TransA ? 1 : 0),
        "n"(TransB ? 1 : 0));
}

// D += A B, m64n32k16 (as m64n16k16).
template <bool TransA, bool TransB>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[4][4], std::uint64_t da,
                                                std::uint64_t db, bool accumulate = true) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, "
      "%19, %20;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TransA ? 1 : 0),
        "n"(TransB ? 1 : 0));
}

// D += A B, m64n64k16 (as m64n16k16).
template <bool TransA, bool TransB>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], std::uint64_t da,
                                                std::uint64_t db, bool accumulate = true) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, "
      "%36;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TransA ? 1 : 0),
        "n"(TransB ? 1 : 0));
}

template <bool TransA, bool TransB>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[16][4], std::uint64_t da,
                                                 std::uint64_t db, bool accumulate = true) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(da), "l"(db), "r"(static_cast<int>(accumulate)), "n"(TransA ? 1 : 0),
        "n"(TransB ? 1 : 0));
}

// D (+)= A B, m64nNk16 for N = 16, 32, 64, 128 (the instruction of that width above), so that a
// kernel templated on its columns names one product.
template <int N, bool TransA, bool TransB>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 8][4], std::uint64_t da,
                                             std::uint64_t db, bool accumulate = true) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "m64nNk16: N in {16, 32, 64, 128}");
  if constexpr (N == 16)
    wgmma_m64n16k16<TransA, TransB>(d, da, db, accumulate);
  else if constexpr (N == 32)
    wgmma_m64n32k16<TransA, TransB>(d, da, db, accumulate);
  else if constexpr (N == 64)
    wgmma_m64n64k16<TransA, TransB>(d, da, db, accumulate);
  else
    wgmma_m64n128k16<TransA, TransB>(d, da, db, accumulate);
}

}  // namespace gdr::cuda::detail
