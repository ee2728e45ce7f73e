// The opt-in value checks on cuda (ExecConfig::check_values, include/gdr/params.h): cu_seqlens
// (copied to the host and checked there) and g. g is the
// natural log of the decay, so an element > 0 is refused (-inf and NaN are not: they pass
// through, docs/operator.md §6). One grid-stride pass over g's elements in logical row-major order
// i = ((b T + t) Hv + h) [Dk + d]; element i lives at sum_k idx_k stride_k. Each thread stops
// at its first offending i (the smallest it would see) and merges it with one atomicMin into a
// 64-bit word that starts at ~0 (none). The host reads the word back (a synchronisation of the
// stream) and then the offending element itself, for the message.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/paths.h"
#include "gdr/error.h"

namespace gdr::cuda {
namespace {

struct Layout {
  long long shape[kMaxRank];
  long long stride[kMaxRank];
  int rank;
};

__device__ __forceinline__ float widen(float x) {
  return x;
}
__device__ __forceinline__ float widen(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__global__ void first_positive_kernel(const T* __restrict__ g, Layout l, long long n,
                                      unsigned long long* first) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    long long rest = i, offset = 0;
    for (int k = l.rank - 1; k >= 0; --k) {
      offset += (rest % l.shape[k]) * l.stride[k];
      rest /= l.shape[k];
    }
    if (widen(g[offset]) > 0.0f) {  // false for NaN and -inf
      atomicMin(first, static_cast<unsigned long long>(i));
      return;
    }
  }
}

void check(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess)
    throw RuntimeFailure(std::string(op) + ": " + what +
                         " failed in the value check: " + cudaGetErrorString(err));
}

}  // namespace

std::int64_t first_positive(const TensorView& g, void* stream_ptr, double* value, const char* op) {
  const long long n = g.numel();
  if (!g.defined() || n == 0) return -1;
  Layout l{};
  l.rank = g.rank;
  for (int k = 0; k < g.rank; ++k) {
    l.shape[k] = g.shape[k];
    l.stride[k] = g.stride[k];
  }
  int previous = 0;
  check(cudaGetDevice(&previous), op, "cudaGetDevice");
  check(cudaSetDevice(g.device_index), op, "cudaSetDevice");
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  unsigned long long* first = nullptr;
  unsigned long long host = ~0ull;
  try {
    check(cudaMallocAsync(reinterpret_cast<void**>(&first), sizeof host, stream), op,
          "cudaMallocAsync");
    check(cudaMemsetAsync(first, 0xff, sizeof host, stream), op, "cudaMemsetAsync");
    const int threads = 256;
    const long long blocks = (n + threads - 1) / threads;
    const int grid = static_cast<int>(blocks < 1024 ? blocks : 1024);
    switch (g.dtype) {
      case DType::f32:
        first_positive_kernel<<<grid, threads, 0, stream>>>(static_cast<const float*>(g.data), l, n,
                                                            first);
        break;
      case DType::f16:
        first_positive_kernel<<<grid, threads, 0, stream>>>(static_cast<const __half*>(g.data), l,
                                                            n, first);
        break;
      case DType::bf16:
        first_positive_kernel<<<grid, threads, 0, stream>>>(
            static_cast<const __nv_bfloat16*>(g.data), l, n, first);
        break;
      default:
        throw InvalidArgument(std::string(op) + ": g has dtype " + std::string(to_string(g.dtype)) +
                              "; the value check on cuda takes float32, float16 or bfloat16");
    }
    check(cudaGetLastError(), op, "the kernel launch");
    check(cudaMemcpyAsync(&host, first, sizeof host, cudaMemcpyDeviceToHost, stream), op,
          "cudaMemcpyAsync");
    check(cudaFreeAsync(first, stream), op, "cudaFreeAsync");
    first = nullptr;
    check(cudaStreamSynchronize(stream), op, "cudaStreamSynchronize");
    if (host != ~0ull) {
      long long rest = static_cast<long long>(host), offset = 0;
      for (int k = l.rank - 1; k >= 0; --k) {
        offset += (rest % l.shape[k]) * l.stride[k];
        rest /= l.shape[k];
      }
      const char* at = static_cast<const char*>(g.data) + offset * dtype_size(g.dtype);
      if (g.dtype == DType::f32) {
        float x = 0;
        check(cudaMemcpy(&x, at, sizeof x, cudaMemcpyDeviceToHost), op, "cudaMemcpy");
        *value = x;
      } else if (g.dtype == DType::f16) {
        __half x;
        check(cudaMemcpy(&x, at, sizeof x, cudaMemcpyDeviceToHost), op, "cudaMemcpy");
        *value = __half2float(x);
      } else {
        __nv_bfloat16 x;
        check(cudaMemcpy(&x, at, sizeof x, cudaMemcpyDeviceToHost), op, "cudaMemcpy");
        *value = __bfloat162float(x);
      }
    }
  } catch (...) {
    if (first != nullptr) cudaFreeAsync(first, stream);
    cudaSetDevice(previous);
    throw;
  }
  check(cudaSetDevice(previous), op, "cudaSetDevice");
  return host == ~0ull ? -1 : static_cast<std::int64_t>(host);
}

void check_cu_seqlens(const TensorView& cu, std::int64_t T, void* stream_ptr, const char* op) {
  const std::int64_t count = cu.numel();
  if (count == 0) return;  // refused by validation
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  std::vector<std::int64_t> host(static_cast<std::size_t>(count));  // large enough for i32 too
  int previous = 0;
  check(cudaGetDevice(&previous), op, "cudaGetDevice");
  check(cudaSetDevice(cu.device_index), op, "cudaSetDevice");
  const cudaError_t copied = cudaMemcpyAsync(host.data(), cu.data, count * dtype_size(cu.dtype),
                                             cudaMemcpyDeviceToHost, stream);
  const cudaError_t synced = copied == cudaSuccess ? cudaStreamSynchronize(stream) : copied;
  check(cudaSetDevice(previous), op, "cudaSetDevice");
  check(copied, op, "cudaMemcpyAsync(cu_seqlens)");
  check(synced, op, "cudaStreamSynchronize");
  check_cu_seqlens_values(host.data(), cu.dtype, count, T, op);
}

}  // namespace gdr::cuda
