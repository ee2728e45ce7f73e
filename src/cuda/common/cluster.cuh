// Device helpers of thread-block clusters (sm_90): the block's rank in its cluster, the cluster
// barrier split into its arrive and wait halves, and the bulk copy global -> shared that lands the
// same bytes at the same offset in the shared memory of several blocks of the cluster (multicast),
// completing on the mbarrier at the same offset in each of them.
#pragma once

#include <cstdint>

#include "cuda/common/mma_tf32.cuh"  // smem_addr

namespace gdr::cuda::detail {

__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every non-exited thread of the cluster arrives (release: this thread's earlier memory accesses,
// its shared-memory reads included, are ordered before what other blocks do after their wait) ...
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
// ... and waits for every thread's arrival (acquire). Each thread alternates arrive and wait.
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global src to the shared
// address of dst in every block of the cluster whose bit is set in cta_mask, each completing as
// transactions on the mbarrier at bar's offset in that block.
__device__ __forceinline__ void bulk_copy_multicast(void* dst, const void* src, unsigned bytes,
                                                    std::uint64_t* bar, std::uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "h"(cta_mask)
      : "memory");
}

}  // namespace gdr::cuda::detail
