// Device mirrors of the host test tensors (support.h) for the GPU tests and for
// `gdr verify` on a CUDA build (no GoogleTest here): copy a host view to the device with the
// same shape and strides, run gdr there, copy outputs back into the host tensors so the
// host-side comparison helpers apply unchanged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gdr/decode_overrides.h"
#include "gdr/gdr.h"
#include "support.h"

namespace gdr::test {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Bytes a strided view spans from its data pointer (0 for an empty tensor).
inline std::size_t span_bytes(const TensorView& t) {
  if (!t.defined()) return 0;
  std::int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return 0;
    last += (t.shape[i] - 1) * t.stride[i];
  }
  return static_cast<std::size_t>(last + 1) * dtype_size(t.dtype);
}

// Owns device copies of host views; each copy keeps the host view's shape and strides.
class DeviceMirror {
 public:
  ~DeviceMirror() {
    for (void* p : buffers_) cudaFree(p);
  }
  // Device copy of `host` (undefined stays undefined).
  TensorView to_device(const TensorView& host) {
    if (!host.defined()) return host;
    TensorView d = host;
    d.device = DeviceType::cuda;
    d.device_index = 0;
    const std::size_t bytes = span_bytes(host);
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes > 0 ? bytes : 16), "cudaMalloc");
    buffers_.push_back(p);
    if (bytes > 0) cuda_check(cudaMemcpy(p, host.data, bytes, cudaMemcpyHostToDevice), "H2D");
    d.data = p;
    return d;
  }
  // A device buffer for `like`'s shape and strides (its data pointer is ignored), zero-filled.
  TensorView allocate(const TensorView& like) {
    TensorView d = like;
    d.device = DeviceType::cuda;
    d.device_index = 0;
    const std::size_t bytes = span_bytes(like);
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes > 0 ? bytes : 16), "cudaMalloc");
    buffers_.push_back(p);
    if (bytes > 0) cuda_check(cudaMemset(p, 0, bytes), "cudaMemset");
    d.data = p;
    return d;
  }
  // Copies a device view back over the host view it mirrors.
  static void to_host(const TensorView& dev, const TensorView& host) {
    if (!dev.defined()) return;
    const std::size_t bytes = span_bytes(host);
    if (bytes > 0)
      cuda_check(cudaMemcpy(host.data, dev.data, bytes, cudaMemcpyDeviceToHost), "D2H");
  }

 private:
  std::vector<void*> buffers_;
};

// The forward call `host` with every tensor (outputs included) copied to the device.
inline ForwardParams mirror_forward_params(DeviceMirror& m, const ForwardParams& host) {
  ForwardParams p = host;
  p.in.q = m.to_device(host.in.q);
  p.in.k = m.to_device(host.in.k);
  p.in.v = m.to_device(host.in.v);
  p.in.g = m.to_device(host.in.g);
  p.in.beta = m.to_device(host.in.beta);
  p.in.A_log = m.to_device(host.in.A_log);
  p.in.dt_bias = m.to_device(host.in.dt_bias);
  p.in.h0 = m.to_device(host.in.h0);
  p.in.mask = m.to_device(host.in.mask);
  p.in.cu_seqlens = m.to_device(host.in.cu_seqlens);
  p.o = m.to_device(host.o);
  p.final_state = m.to_device(host.final_state);
  return p;
}

// Runs gdr::forward on device copies of d's tensors (outputs poisoned first) and returns o and
// the final state as doubles, like run_forward does on the host. `path`: sequential (the recurrent
// kernel), chunkwise (the chunked forward) or automatic; `overrides`: the decode plan's
// (ExecConfig::decode_overrides), null for the rules.
inline ForwardResult run_forward_cuda(TestData& d, cudaStream_t stream = nullptr,
                                      Path path = Path::sequential,
                                      const DecodeOverrides* overrides = nullptr,
                                      const ScratchAllocator* scratch = nullptr) {
  d.o.poison();
  if (d.final_state.defined()) d.final_state.poison();
  ForwardParams host = d.forward_params();
  DeviceMirror m;
  ForwardParams p = mirror_forward_params(m, host);
  ExecConfig cfg;
  cfg.stream = stream;
  cfg.path = path;
  cfg.decode_overrides = overrides;
  cfg.scratch = scratch;
  forward(p, cfg);
  cuda_check(cudaStreamSynchronize(stream), "forward");
  DeviceMirror::to_host(p.o, host.o);
  DeviceMirror::to_host(p.final_state, host.final_state);
  ForwardResult r;
  r.o = d.o.to_double();
  if (d.final_state.defined()) r.final_state = d.final_state.to_double();
  return r;
}

// The backward call `host` with every tensor (the gradients included) copied to the device.
inline BackwardParams mirror_backward_params(DeviceMirror& m, const BackwardParams& host) {
  BackwardParams p = host;
  p.in.q = m.to_device(host.in.q);
  p.in.k = m.to_device(host.in.k);
  p.in.v = m.to_device(host.in.v);
  p.in.g = m.to_device(host.in.g);
  p.in.beta = m.to_device(host.in.beta);
  p.in.A_log = m.to_device(host.in.A_log);
  p.in.dt_bias = m.to_device(host.in.dt_bias);
  p.in.h0 = m.to_device(host.in.h0);
  p.in.mask = m.to_device(host.in.mask);
  p.in.cu_seqlens = m.to_device(host.in.cu_seqlens);
  p.dout = m.to_device(host.dout);
  p.dfinal_state = m.to_device(host.dfinal_state);
  p.dq = m.to_device(host.dq);
  p.dk = m.to_device(host.dk);
  p.dv = m.to_device(host.dv);
  p.dg = m.to_device(host.dg);
  p.dbeta = m.to_device(host.dbeta);
  p.dA_log = m.to_device(host.dA_log);
  p.ddt_bias = m.to_device(host.ddt_bias);
  p.dh0 = m.to_device(host.dh0);
  return p;
}

// Runs gdr::backward on device copies of d's tensors (every gradient poisoned with NaN first) and
// returns the gradients as doubles, like run_backward on the host. `saved`: a device tensor
// filled by the CUDA forward of the same call (BackwardParams::saved), or undefined.
// `overrides` and `scratch` as ExecConfig's (null: the rules, cudaMallocAsync).
inline BackwardResult run_backward_cuda(TestData& d, cudaStream_t stream = nullptr,
                                        const TensorView& saved = {}, Path path = Path::automatic,
                                        const DecodeOverrides* overrides = nullptr,
                                        const ScratchAllocator* scratch = nullptr) {
  for (HostTensor* t : {&d.dq, &d.dk, &d.dv, &d.dg, &d.dbeta, &d.dA_log, &d.ddt_bias, &d.dh0})
    t->poison();
  BackwardParams host = d.backward_params();
  DeviceMirror m;
  BackwardParams p = mirror_backward_params(m, host);
  p.saved = saved;
  ExecConfig cfg;
  cfg.stream = stream;
  cfg.path = path;
  cfg.decode_overrides = overrides;
  cfg.scratch = scratch;
  backward(p, cfg);
  cuda_check(cudaStreamSynchronize(stream), "backward");
  DeviceMirror::to_host(p.dq, host.dq);
  DeviceMirror::to_host(p.dk, host.dk);
  DeviceMirror::to_host(p.dv, host.dv);
  DeviceMirror::to_host(p.dg, host.dg);
  DeviceMirror::to_host(p.dbeta, host.dbeta);
  DeviceMirror::to_host(p.dA_log, host.dA_log);
  DeviceMirror::to_host(p.ddt_bias, host.ddt_bias);
  DeviceMirror::to_host(p.dh0, host.dh0);
  BackwardResult r;
  r.dq = d.dq.to_double();
  r.dk = d.dk.to_double();
  r.dv = d.dv.to_double();
  r.dg = d.dg.to_double();
  r.dbeta = d.dbeta.to_double();
  r.dA_log = d.dA_log.to_double();
  r.ddt_bias = d.ddt_bias.to_double();
  r.dh0 = d.dh0.to_double();
  return r;
}

// The decode call `host` with every tensor (the pool and o included) copied to the device.
inline DecodeParams mirror_decode_params(DeviceMirror& m, const DecodeParams& host) {
  DecodeParams p = host;
  p.q = m.to_device(host.q);
  p.k = m.to_device(host.k);
  p.v = m.to_device(host.v);
  p.g = m.to_device(host.g);
  p.beta = m.to_device(host.beta);
  p.A_log = m.to_device(host.A_log);
  p.dt_bias = m.to_device(host.dt_bias);
  p.mask = m.to_device(host.mask);
  p.state = m.to_device(host.state);
  p.state_indices = m.to_device(host.state_indices);
  p.o = m.to_device(host.o);
  return p;
}

// Runs gdr::decode on device copies (o poisoned first); returns o and the whole pool after,
// like run_decode. The pool's raw bytes after the step go to `pool_bytes` when given; `overrides`
// as run_forward_cuda's.
inline ForwardResult run_decode_cuda(DecodeData& d, cudaStream_t stream = nullptr,
                                     std::vector<unsigned char>* pool_bytes = nullptr,
                                     const DecodeOverrides* overrides = nullptr) {
  d.base.o.poison();
  DecodeParams host = d.params();
  DeviceMirror m;
  DecodeParams p = mirror_decode_params(m, host);
  ExecConfig cfg;
  cfg.stream = stream;
  cfg.decode_overrides = overrides;
  decode(p, cfg);
  cuda_check(cudaStreamSynchronize(stream), "decode");
  DeviceMirror::to_host(p.o, host.o);
  DeviceMirror::to_host(p.state, host.state);
  if (pool_bytes) {
    const auto* b = static_cast<const unsigned char*>(host.state.data);
    pool_bytes->assign(b, b + span_bytes(host.state));
  }
  ForwardResult r;
  r.o = d.base.o.to_double();
  r.final_state = d.state.to_double();
  return r;
}

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace gdr::test
