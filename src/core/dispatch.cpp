// The one place where a call becomes a path: validate, resolve Path::automatic with the
// heuristics, check the path covers the call on this device, run it. Every refusal names the
// value and what is supported, and every message of a call starts with one name:
// ExecConfig::op_name when given (the public function a binding's caller called), else
// gdr.forward, gdr.backward or gdr.decode.
#include <string>

#include "core/cuda_support.h"
#include "core/heuristics.h"
#include "core/values.h"
#include "cpu/paths.h"
#include "gdr/api.h"
#include "gdr/error.h"
#include "gdr/problem.h"
#if GDR_WITH_CUDA
#include "cuda/paths.h"
#endif

namespace gdr {
namespace {

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw InvalidArgument(std::string(op) + ": " + what);
}

const char* op_name(const ExecConfig& config, const char* fallback) {
  return config.op_name != nullptr && config.op_name[0] != '\0' ? config.op_name : fallback;
}

// The values that validation checks only in host memory, on cuda, when the caller asks for it
// (ExecConfig::check_values): cu_seqlens (else clamped on the device) and g <= 0.
void check_device_values(const Problem& prob, const Inputs& in, const Options& opts,
                         const ExecConfig& config, const char* op) {
  if (prob.device != DeviceType::cuda || !config.check_values) return;
#if GDR_WITH_CUDA
  if (prob.varlen) cuda::check_cu_seqlens(in.cu_seqlens, prob.T, config.stream, op);
  if (opts.gate_in_kernel) return;
  PositiveGate found;
  found.index = cuda::first_positive(in.g, config.stream, &found.value, op);
  if (found.index >= 0) refuse_positive_gate(op, in.g, found);
#else
  (void)in, (void)opts, (void)op;
#endif
}

void check_config(const ExecConfig& config, const char* op) {
  if (!heuristics::is_supported_chunk(config.chunk_size))
    refuse(op, "chunk_size is " + std::to_string(config.chunk_size) + "; supported: 16, 32, 64");
  if (config.num_threads < 0)
    refuse(op, "num_threads is " + std::to_string(config.num_threads) + "; must be >= 0");
}

#if !GDR_WITH_CUDA
[[noreturn]] void no_cuda(const char* op) {
  refuse(op, "tensors are on cuda but this build of gdr has no CUDA paths (rebuild with nvcc)");
}
#endif

// `saved` (ForwardParams::saved / BackwardParams::saved) is written by the chunkwise forward
// (CPU: either content; CUDA: chunk states only) and read by the CPU chunkwise backward: with it,
// automatic resolves to chunkwise and any other path is refused.
Path resolve_saved(const Problem& prob, const TensorView& saved, const ExecConfig& config,
                   const char* op, const char* role, bool forward) {
  validate_saved(prob, saved, config.chunk_size, op);
  if (prob.device != DeviceType::cpu && saved.shape[2] != prob.Dk * prob.Dv)
    refuse(op, std::string("saved holds chunk intermediates but the tensors are on cuda; the CUDA "
                           "chunked ") +
                   (forward ? "forward keeps" : "backward reads") +
                   " chunk states only (SavedContent::chunk_states)");
  if (config.path != Path::automatic && config.path != Path::chunkwise)
    refuse(op, "saved is given with path " + std::string(to_string(config.path)) + "; saved is " +
                   role + " by the chunkwise path only (use chunkwise or automatic, or leave " +
                   "saved out)");
  return Path::chunkwise;
}

Path resolve_forward(const Problem& prob, const TensorView& saved, const ExecConfig& config,
                     const char* op) {
  check_config(config, op);
  if (saved.defined()) return resolve_saved(prob, saved, config, op, "written", true);
  if (prob.device == DeviceType::cpu)
    return config.path == Path::automatic ? heuristics::cpu_forward_path(prob) : config.path;
  // CUDA: the recurrent kernel (sequential) or the chunked forward (chunkwise).
  switch (config.path) {
    case Path::automatic:
      return config.chunk_size == heuristics::kDefaultChunk ? heuristics::cuda_forward_path(prob)
                                                            : Path::sequential;
    case Path::sequential: return Path::sequential;
    case Path::chunkwise:
      if (config.chunk_size != heuristics::kDefaultChunk)
        refuse(op, "chunk_size is " + std::to_string(config.chunk_size) +
                       "; the CUDA chunked forward runs chunks of 64");
      return Path::chunkwise;
    case Path::reference: refuse(op, "path reference runs on the CPU only; tensors are on cuda");
  }
  refuse(op, "unknown path");
}

Path resolve_backward(const Problem& prob, const TensorView& saved, const ExecConfig& config,
                      const char* op) {
  check_config(config, op);
  if (!backward_available(prob.device))
    refuse(op, "backward on " + std::string(to_string(prob.device)) +
                   " is not available yet; move the tensors to the cpu");
  if (saved.defined()) return resolve_saved(prob, saved, config, op, "read", false);
  if (prob.device == DeviceType::cpu)
    return config.path == Path::automatic ? heuristics::cpu_backward_path(prob) : config.path;
  // CUDA: the chunked backward is the one backward there.
  if (config.path != Path::automatic && config.path != Path::chunkwise)
    refuse(op, "path " + std::string(to_string(config.path)) +
                   " has no backward on cuda; supported there: chunkwise, automatic");
  if (config.chunk_size != heuristics::kDefaultChunk)
    refuse(op, "chunk_size is " + std::to_string(config.chunk_size) +
                   "; the CUDA chunked backward runs chunks of 64");
  return Path::chunkwise;
}

}  // namespace

Path resolve_forward_path(const ForwardParams& params, const ExecConfig& config) {
  const char* op = op_name(config, "gdr.forward");
  return resolve_forward(validate_forward(params, op), params.saved, config, op);
}

Path resolve_backward_path(const BackwardParams& params, const ExecConfig& config) {
  const char* op = op_name(config, "gdr.backward");
  return resolve_backward(validate_backward(params, op), params.saved, config, op);
}

void forward(const ForwardParams& params, const ExecConfig& config) {
  const char* op = op_name(config, "gdr.forward");
  const Problem prob = validate_forward(params, op);
  const Path path = resolve_forward(prob, params.saved, config, op);
  check_device_values(prob, params.in, params.opts, config, op);
  if (prob.device == DeviceType::cuda) {
#if GDR_WITH_CUDA
    validate_cuda_forward(prob, params, path, config, op);
    if (path == Path::chunkwise)
      cuda::chunked_forward(prob, params, config, op);
    else
      cuda::recurrent_forward(prob, params, config, op);
    return;
#else
    no_cuda(op);
#endif
  }
  switch (path) {
    case Path::reference: cpu::reference_forward(prob, params); return;
    case Path::sequential: cpu::sequential_forward(prob, params, config); return;
    case Path::chunkwise: cpu::chunkwise_forward(prob, params, config); return;
    case Path::automatic: break;
  }
  refuse(op, "path did not resolve");
}

void backward(const BackwardParams& params, const ExecConfig& config) {
  const char* op = op_name(config, "gdr.backward");
  const Problem prob = validate_backward(params, op);
  const Path path = resolve_backward(prob, params.saved, config, op);
  if (prob.device == DeviceType::cuda) {
#if GDR_WITH_CUDA
    validate_cuda_backward(prob, params, config, op);
    check_device_values(prob, params.in, params.opts, config, op);  // as the forward does
    cuda::chunked_backward(prob, params, config, op);
    return;
#else
    no_cuda(op);
#endif
  }
  switch (path) {
    case Path::reference: cpu::reference_backward(prob, params); return;
    case Path::sequential: cpu::sequential_backward(prob, params, config); return;
    case Path::chunkwise: cpu::chunkwise_backward(prob, params, config); return;
    case Path::automatic: break;
  }
  refuse(op, "path did not resolve");
}

void decode(const DecodeParams& params, const ExecConfig& config) {
  const char* op = op_name(config, "gdr.decode");
  const Problem prob = validate_decode(params, op);
  check_config(config, op);
  check_device_values(prob, params.inputs(), params.opts, config, op);
  if (config.path == Path::reference || config.path == Path::chunkwise)
    refuse(op, "path " + std::string(to_string(config.path)) +
                   " does not apply to decode; supported: automatic, sequential");
  if (prob.device == DeviceType::cuda) {
#if GDR_WITH_CUDA
    validate_cuda_decode(prob, params, op);
    cuda::decode(prob, params, config, op);
    return;
#else
    no_cuda(op);
#endif
  }
  cpu::decode(prob, params, config);
}

bool backward_available(DeviceType device) {
  if (device == DeviceType::cpu) return true;
#if GDR_WITH_CUDA
  return device == DeviceType::cuda;
#else
  return false;
#endif
}

bool cuda_available() {
#if GDR_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace gdr
