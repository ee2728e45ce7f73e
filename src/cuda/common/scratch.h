// The temporary device memory of one CUDA call, from ExecConfig::scratch when given (a
// framework's allocator), else from cudaMallocAsync on the call's stream. Released in stream
// order when the object goes out of scope, also when the call throws after taking it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "gdr/params.h"

namespace gdr::cuda {

class DeviceScratch {
 public:
  // Throws RuntimeFailure("<op>: ...") when the memory cannot be had. bytes may be 0 (no memory).
  DeviceScratch(const ExecConfig& config, std::size_t bytes, cudaStream_t stream, const char* op);
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  void* data() const { return ptr_; }

 private:
  const ScratchAllocator* allocator_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* ptr_ = nullptr;
};

}  // namespace gdr::cuda
