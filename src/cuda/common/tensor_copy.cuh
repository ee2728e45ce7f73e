// Device helpers of the bulk-copy engine (TMA) shared by the kernels that move state and token
// rows through shared memory asynchronously: L2 cache policies, mbarrier transaction counts,
// non-tensor bulk copies (global -> shared with a cache hint, shared -> global, their commit and
// wait groups) and tensor copies of 4-D and 5-D boxes through a CUtensorMap (encoded on the host,
// tensor_maps.h), with their L2 prefetches. The mbarrier, cp.async and mma wrappers are in
// mma_tf32.cuh.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only)

#include <cstdint>

#include "cuda/common/mma_tf32.cuh"

namespace gdr::cuda::detail {

// ---- bulk-copy (TMA, non-tensor) helpers with an L2 cache policy ----

// A 64-bit L2 cache policy: evict-first (the state is read and written once per call) or the
// default (evict-normal).
__device__ __forceinline__ std::uint64_t l2_policy(bool evict_first) {
  std::uint64_t p;
  if (evict_first)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  else
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// Adds `bytes` of expected transactions to the current phase of `bar` (no arrival).
__device__ __forceinline__ void mbar_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// One arrival on `bar` (release at CTA scope: this thread's earlier writes are visible to the
// threads that then see the phase complete).
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// bulk_copy (mma_tf32.cuh) with an L2 cache policy.
__device__ __forceinline__ void bulk_copy_hint(void* dst, const void* src, unsigned bytes,
                                               std::uint64_t* bar, std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

// `bytes` (a multiple of 16, 16-byte aligned) shared -> global by the bulk-copy engine, in this
// thread's current bulk group.
__device__ __forceinline__ void bulk_store(void* dst, const void* src, unsigned bytes,
                                           std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;" ::"l"(dst),
      "r"(smem_addr(src)), "r"(bytes), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Until this thread's bulk stores have read their shared memory (the slot may be refilled).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Until this thread's bulk stores are complete.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// ---- tensor (TMA) copies of a 5-D box through a tensor map (CM: the state, RingMaps) ----

// The box at coordinates (c0 innermost .. c4) of `map` global -> shared (`dst`, 1024-byte aligned
// for the 128-byte swizzle), completing as transactions on `bar`, with an L2 cache policy.
__device__ __forceinline__ void tensor_load(void* dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, int c4, std::uint64_t* bar,
                                            std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::"
      "cache_hint [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
      "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
// The box shared (`src`) -> global at those coordinates, in this thread's current bulk group.
__device__ __forceinline__ void tensor_store(const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                             int c4, const void* src, std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group.L2::cache_hint [%0, {%1, %2, %3, "
      "%4, %5}], [%6], %7;" ::"l"(reinterpret_cast<std::uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_addr(src)), "l"(policy)
      : "memory");
}
// The 4-D box at coordinates (c0 innermost .. c3) of `map` global -> shared (`dst`, 128-byte
// aligned), completing as transactions on `bar` (CM: an item's rows of q, k or v, RingMaps).
__device__ __forceinline__ void tensor_load_4d(void* dst, const CUtensorMap* map, int c0, int c1,
                                               int c2, int c3, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4, %5}], [%6];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_addr(bar))
      : "memory");
}
// The tensor map at `map` (kernel parameter space) brought into the descriptor cache ahead of its
// first copy.
__device__ __forceinline__ void tensor_map_prefetch(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}
// The box asked of the L2 (no copy to shared memory).
__device__ __forceinline__ void tensor_prefetch_l2(const CUtensorMap* map, int c0, int c1, int c2,
                                                   int c3, int c4) {
  asm volatile("cp.async.bulk.prefetch.tensor.5d.L2.global.tile [%0, {%1, %2, %3, %4, %5}];" ::"l"(
                   reinterpret_cast<std::uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
}

}  // namespace gdr::cuda::detail
