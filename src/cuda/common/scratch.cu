#include "cuda/common/scratch.h"

#include <string>

#include "cuda/common/launch.h"
#include "gdr/error.h"

namespace gdr::cuda {

DeviceScratch::DeviceScratch(const ExecConfig& config, std::size_t bytes, cudaStream_t stream,
                             const char* op)
    : allocator_(config.scratch), stream_(stream) {
  if (bytes == 0) return;
  if (allocator_ != nullptr) {
    if (allocator_->allocate == nullptr || allocator_->release == nullptr)
      refuse(op, "ExecConfig::scratch has no allocate or release function");
    ptr_ = allocator_->allocate(allocator_->context, bytes, stream);
    if (ptr_ == nullptr)
      throw RuntimeFailure(std::string(op) + ": the scratch allocator gave no memory for " +
                           std::to_string(bytes) + " bytes of device scratch");
    return;
  }
  check(cudaMallocAsync(&ptr_, bytes, stream), op, "cudaMallocAsync (device scratch)");
}

DeviceScratch::~DeviceScratch() {
  if (ptr_ == nullptr) return;
  if (allocator_ != nullptr)
    allocator_->release(allocator_->context, ptr_, stream_);
  else
    (void)cudaFreeAsync(ptr_, stream_);
}

}  // namespace gdr::cuda
