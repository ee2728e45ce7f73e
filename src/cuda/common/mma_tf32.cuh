// Tensor-core and asynchronous-copy helpers of the chunk kernel (recurrent_chunk.cuh): cp.async
// 16-byte copies global -> shared, the tf32 hi / lo split, mma.sync m16n8k8 with tf32 inputs, the
// exact three-part bf16 split and mma.sync m16n8k16 with bf16 inputs (the ring kernel's chunk
// consumers), mbarriers and bulk copies (the ring kernel, recurrent_ring.cuh, uses the last two
// and adds its bulk stores and L2 policies).
#pragma once

#include <cstdint>

namespace gdr::cuda::detail {

// Shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous (completion: cp_async_wait_all + a barrier).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}
// A hint: bring `bytes` of global memory at p into L2, asynchronously, by the bulk copy engine
// (sm_90; p 16-byte aligned, bytes a multiple of 16; nothing to wait for).
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// x = hi + lo with hi exact in tf32 (the top 19 bits) and lo the rest (3xTF32 products).
__device__ __forceinline__ float tf32_hi(float x) {
  return __uint_as_float(__float_as_uint(x) & 0xffffe000u);
}

// D += A B, m16n8k8, tf32 inputs, fp32 accumulate. Fragments (g = lane / 4, c = lane % 4):
// A a0 (g, c), a1 (g + 8, c), a2 (g, c + 4), a3 (g + 8, c + 4); B b0 (c, g), b1 (c + 4, g);
// D d0 (g, 2c), d1 (g, 2c + 1), d2 (g + 8, 2c), d3 (g + 8, 2c + 1).
__device__ __forceinline__ void mma_tf32(float (&d)[4], float4 a, float b0, float b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(__float_as_uint(a.x)), "r"(__float_as_uint(a.y)), "r"(__float_as_uint(a.z)),
        "r"(__float_as_uint(a.w)), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}

// x and y as three bf16 pairs with x = hx + mx + lx exactly (and y alike): hx the top 16 bits of
// x (sign, exponent, 7 mantissa bits: a bf16 value as it stands), r = x - hx exact in f32 (at most
// 16 significant bits), mx the top 16 bits of r, lx = r - mx exact with at most 8 significant bits,
// so a bf16 value too. Each pair holds x in its low half, y in its high half (the operand order of
// mma_bf16). Truncation, not rounding, makes every part exact; products of the parts with exact
// bf16 operands, accumulated in f32, then carry all of x's 24 bits (3xBF16).
__device__ __forceinline__ void bf16_split3(float x, float y, std::uint32_t& h, std::uint32_t& m,
                                            std::uint32_t& l) {
  constexpr std::uint32_t kTop = 0xffff0000u;
  const std::uint32_t xb = __float_as_uint(x), yb = __float_as_uint(y);
  h = __byte_perm(xb, yb, 0x7632);  // the high halves of x (low) and y (high)
  const float rx = x - __uint_as_float(xb & kTop), ry = y - __uint_as_float(yb & kTop);
  const std::uint32_t rxb = __float_as_uint(rx), ryb = __float_as_uint(ry);
  m = __byte_perm(rxb, ryb, 0x7632);
  const float lx = rx - __uint_as_float(rxb & kTop), ly = ry - __uint_as_float(ryb & kTop);
  l = __byte_perm(__float_as_uint(lx), __float_as_uint(ly), 0x7632);
}

// D += A B, m16n8k16, bf16 inputs (pairs along k, the lower k in the low half), fp32 accumulate.
// Fragments (g = lane / 4, c = lane % 4): A a.x (g, 2c..2c+1), a.y (g + 8, 2c..), a.z (g, 2c +
// 8..), a.w (g + 8, 2c + 8..); B b0 (2c..2c+1, g), b1 (2c + 8.., g); D as mma_tf32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint4 a, std::uint32_t b0,
                                         std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// mbarrier (shared memory, 8 bytes): init with an arrival count; the arrival that also expects
// `bytes` of bulk-copy transactions; wait for the phase of the given parity to complete.
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Named barrier `id` (1 .. 15; 0 is __syncthreads) of `count` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// Arrival on named barrier `id` of `count` threads without waiting (producers; the consumers
// wait with named_barrier_sync on the same id and count).
__device__ __forceinline__ void named_barrier_arrive(unsigned id, unsigned count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// Orders this thread's earlier shared-memory accesses (generic proxy) before later accesses
// through the async proxy: its bulk copies, and (after a barrier) any thread's wgmma operands.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) global -> shared by the bulk-copy
// engine, completing as transactions on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes,
                                          std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

}  // namespace gdr::cuda::detail
