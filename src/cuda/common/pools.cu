// Device memory that a launch needs for itself (pools.h).
#include "cuda/common/pools.h"

#include <cstdint>
#include <map>
#include <mutex>

#include "cuda/common/launch.h"

namespace gdr::cuda {
namespace {

// gdr's own stream-ordered memory pool on `device` (created once, never released: it keeps its
// reserve however often the process synchronizes, unlike the default pool with its release
// threshold of 0, and leaves the default pool's settings to the caller), or null where the device
// has no memory pools.
cudaMemPool_t small_pool(int device) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = pools.find(device);
  if (it != pools.end()) return it->second;
  cudaMemPool_t pool = nullptr;
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess &&
      supported) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    if (cudaMemPoolCreate(&pool, &props) == cudaSuccess) {
      std::uint64_t keep = UINT64_MAX;
      (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    } else {
      pool = nullptr;
    }
  }
  (void)cudaGetLastError();  // a refused query or creation: no pool (callers fall back)
  pools.emplace(device, pool);
  return pool;
}

// `words` zeroed unsigned words from gdr's pool on `stream` (exclusive to the call, also as nodes
// of a captured graph: an allocation and a memset; the caller frees them on the stream after its
// kernel); null when the device has no stream-ordered memory.
unsigned* pooled_zero_words(int device, std::size_t words, cudaStream_t stream, const char* op) {
  const cudaMemPool_t pool = small_pool(device);
  unsigned* p = nullptr;
  if (!pool || cudaMallocFromPoolAsync(reinterpret_cast<void**>(&p), words * sizeof(unsigned), pool,
                                       stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  check(cudaMemsetAsync(p, 0, words * sizeof(unsigned), stream), op, "cudaMemsetAsync");
  return p;
}

constexpr std::int64_t kArenaPairs = 16384;

// A pair of the device's arena for a launch being captured on `stream` (null: none), or (not
// capturing) null, the arena made first if it is not yet.
unsigned* arena_counter_pair(int device, cudaStream_t stream, bool capturing) {
  struct Arena {
    unsigned* pairs = nullptr;
    std::int64_t used = 0;
    bool tried = false;
  };
  static std::mutex mutex;
  static std::map<int, Arena> arenas;
  std::lock_guard<std::mutex> lock(mutex);
  Arena& arena = arenas[device];
  if (capturing) {
    if (!arena.pairs || arena.used == kArenaPairs) return nullptr;
    return arena.pairs + 2 * arena.used++;
  }
  if (!arena.tried) {
    arena.tried = true;
    unsigned* pairs = nullptr;
    const std::size_t bytes = 2 * sizeof(unsigned) * kArenaPairs;
    if (cudaMalloc(reinterpret_cast<void**>(&pairs), bytes) == cudaSuccess) {
      if (cudaMemsetAsync(pairs, 0, bytes, stream) == cudaSuccess &&
          cudaStreamSynchronize(stream) == cudaSuccess)
        arena.pairs = pairs;
      else
        cudaFree(pairs);
    }
    (void)cudaGetLastError();  // no arena: captures take pool pairs
  }
  return nullptr;
}

}  // namespace

unsigned* dynamic_counter_pair(int device, cudaStream_t stream, bool* pooled, const char* op) {
  *pooled = false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  const bool capturing = status != cudaStreamCaptureStatusNone;
  if (unsigned* pair = arena_counter_pair(device, stream, capturing)) return pair;
  unsigned* pair = pooled_zero_words(device, 2, stream, op);
  *pooled = pair != nullptr;
  return pair;
}

}  // namespace gdr::cuda
