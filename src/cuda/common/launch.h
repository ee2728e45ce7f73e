// Host helpers of every CUDA path: error checks, the call's device, SM counts and occupancy,
// shared-memory opt-in and the launch itself (with or without programmatic dependent launch).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace gdr::cuda {

// Throws RuntimeFailure("<op>: <what> failed: <CUDA's message>") unless err is cudaSuccess.
void check(cudaError_t err, const char* op, const char* what);

// Throws InvalidArgument("<op>: <what>").
[[noreturn]] void refuse(const char* op, const std::string& what);

// Runs the call on the tensors' device and restores the caller's current device.
class DeviceGuard {
 public:
  DeviceGuard(int device, const char* op);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0, device_ = 0;
};

// The device's SM count (asked once per device).
int sm_count(int device, const char* op);

// The device's opt-in limit of dynamic shared memory per block, in bytes (asked once per device).
int smem_optin(int device, const char* op);

// Blocks of `kernel` resident at once on one SM for `threads` per block and `smem` bytes of
// dynamic shared memory; asked once per (kernel, device, block shape).
int blocks_per_sm(const void* kernel, int threads, std::size_t smem, int device, const char* op);

// Allows `kernel` `smem` bytes of dynamic shared memory (above the default 48 KB) on `device`,
// once per (kernel, device). prefer_shared: also asks for the largest shared-memory carveout of
// the unified L1 / shared storage, so that as many blocks of a shared-memory-bound kernel are
// resident as the shared memory allows (the driver's default split may leave room for fewer).
void allow_shared(const void* kernel, std::size_t smem, int device, const char* op,
                  bool prefer_shared = false);

// Launches kernel(args...) on `grid` blocks; with `pdl`, as a programmatic dependent launch
// (sm_90: the kernel may start while the previous kernel in the stream drains and waits for it in
// wait_for_prior_grids before any global memory access).
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), unsigned grid, unsigned threads, std::size_t smem,
                   cudaStream_t stream, bool pdl, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, args...);  // errors: cudaGetLastError after the launch
}

}  // namespace gdr::cuda
