// Host helpers of every CUDA path (launch.h).
#include "cuda/common/launch.h"

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "gdr/error.h"

namespace gdr::cuda {

void check(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess)
    throw RuntimeFailure(std::string(op) + ": " + what + " failed: " + cudaGetErrorString(err));
}

void refuse(const char* op, const std::string& what) {
  throw InvalidArgument(std::string(op) + ": " + what);
}

DeviceGuard::DeviceGuard(int device, const char* op) {
  check(cudaGetDevice(&prev_), op, "cudaGetDevice");
  if (prev_ != device) check(cudaSetDevice(device), op, "cudaSetDevice");
  device_ = device;
}

DeviceGuard::~DeviceGuard() {
  if (prev_ != device_) cudaSetDevice(prev_);
}

namespace {

// Attribute `A` of `device`, asked once per device (devices 0..63; others every time).
template <cudaDeviceAttr A>
int cached_attribute(int device, const char* op, const char* what) {
  static std::atomic<int> cache[64] = {};
  if (device >= 0 && device < 64) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int value = 0;
  check(cudaDeviceGetAttribute(&value, A, device), op, what);
  if (device >= 0 && device < 64) cache[device].store(value, std::memory_order_relaxed);
  return value;
}

}  // namespace

int sm_count(int device, const char* op) {
  return cached_attribute<cudaDevAttrMultiProcessorCount>(
      device, op, "cudaDeviceGetAttribute(multiProcessorCount)");
}

int smem_optin(int device, const char* op) {
  return cached_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(
      device, op, "cudaDeviceGetAttribute(maxSharedMemoryPerBlockOptin)");
}

int blocks_per_sm(const void* kernel, int threads, std::size_t smem, int device, const char* op) {
  using Key = std::tuple<const void*, int, std::size_t, int>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{kernel, threads, smem, device};
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem), op,
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, per_sm);
  return per_sm;
}

void allow_shared(const void* kernel, std::size_t smem, int device, const char* op,
                  bool prefer_shared) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, std::size_t> done;
  std::lock_guard<std::mutex> lock(mutex);
  auto& have = done[{kernel, device}];
  if (have >= smem) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        op, "cudaFuncSetAttribute(maxDynamicSharedMemorySize)");
  if (prefer_shared)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared),
          op, "cudaFuncSetAttribute(preferredSharedMemoryCarveout)");
  have = smem;
}

}  // namespace gdr::cuda
