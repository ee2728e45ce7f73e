// What the CUDA paths support beyond the operator's contract (cuda_support.h).
#include "core/cuda_support.h"

#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "gdr/error.h"

namespace gdr {
namespace {

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw InvalidArgument(std::string(op) + ": " + what);
}

void check_dim(const char* op, const char* name, std::int64_t value, const char* path) {
  if (value != 64 && value != 128 && value != 256)
    refuse(op, std::string(name) + " is " + std::to_string(value) + "; the CUDA " + path +
                   " supports 64, 128, 256");
}

void check_float_dtype(const char* op, const char* name, const TensorView& t, bool f32_only) {
  if (!t.defined()) return;
  const bool ok =
      t.dtype == DType::f32 || (!f32_only && (t.dtype == DType::f16 || t.dtype == DType::bf16));
  if (!ok)
    refuse(op, std::string(name) + " has dtype " + std::string(to_string(t.dtype)) +
                   (f32_only ? "; on cuda it must be float32"
                             : "; on cuda supported: float32, float16, bfloat16"));
}

void check_common(const char* op, const Problem& prob, const TensorView& q, const TensorView& g,
                  const TensorView& beta, const TensorView& A_log, const TensorView& dt_bias,
                  const TensorView& mask, const Options& opts, const char* path) {
  check_dim(op, "Dk", prob.Dk, path);
  check_dim(op, "Dv", prob.Dv, path);
  check_float_dtype(op, "q", q, false);
  check_float_dtype(op, "g", g, false);
  check_float_dtype(op, "beta", beta, false);
  if (opts.gate_in_kernel) {
    if (!A_log.defined()) refuse(op, "gate_in_kernel needs A_log [Hv]");
    check_float_dtype(op, "A_log", A_log, true);
    check_float_dtype(op, "dt_bias", dt_bias, true);
  }
  if (mask.defined() && mask.dtype != DType::boolean)
    refuse(op, "mask has dtype " + std::string(to_string(mask.dtype)) + "; must be bool");
  if (prob.Hv > INT_MAX / 2) refuse(op, "Hv is " + std::to_string(prob.Hv) + "; too large");
}

}  // namespace

void validate_cuda_decode(const Problem& prob, const DecodeParams& p, const char* op) {
  check_common(op, prob, p.q, p.g, p.beta, p.A_log, p.dt_bias, p.mask, p.opts, "recurrent kernel");
  if (p.state.dtype != DType::f32 && p.state.dtype != DType::bf16)
    refuse(op, "state has dtype " + std::string(to_string(p.state.dtype)) +
                   "; on cuda supported: float32, bfloat16");
  if (p.state_indices.defined() && p.state_indices.dtype != DType::i32 &&
      p.state_indices.dtype != DType::i64)
    refuse(op, "state_indices has dtype " + std::string(to_string(p.state_indices.dtype)) +
                   "; must be int32 or int64");
  if (prob.B == 0 || prob.T == 0 || prob.Hv == 0) return;  // nothing runs
  if (p.state_indices.defined() && p.state_indices.stride[0] != 1)
    refuse(op, "state_indices must be contiguous");
}

void validate_cuda_forward(const Problem& prob, const ForwardParams& p, Path path,
                           const ExecConfig& config, const char* op) {
  const Inputs& in = p.in;
  const bool chunked = path == Path::chunkwise;
  check_common(op, prob, in.q, in.g, in.beta, in.A_log, in.dt_bias, in.mask, p.opts,
               chunked ? "chunked forward" : "recurrent kernel");
  if (chunked && config.chunk_size != 64)
    refuse(op, "chunk_size is " + std::to_string(config.chunk_size) +
                   "; the CUDA chunked forward runs chunks of 64");
  if (chunked && prob.Hv > 65535)
    refuse(op,
           "Hv is " + std::to_string(prob.Hv) + "; the CUDA chunked forward supports Hv <= 65535");
  if (in.h0.defined() && in.h0.dtype != DType::f32) refuse(op, "h0 must be float32");
  if (p.final_state.defined() && p.final_state.dtype != DType::f32)
    refuse(op, "final_state must be float32");
  if (prob.N == 0 || prob.Hv == 0 || !prob.varlen) return;  // nothing runs, or no cu_seqlens
  // The recurrent launcher copies a device cu_seqlens to the host to check its values; the chunked
  // forward reads it on the device only.
  if (in.cu_seqlens.stride[0] != 1) refuse(op, "cu_seqlens must be contiguous");
  if (in.cu_seqlens.device != DeviceType::cuda)
    refuse(op, "cu_seqlens is on the cpu while the other tensors are on cuda");
}

void validate_cuda_backward(const Problem& prob, const BackwardParams& p, const ExecConfig& config,
                            const char* op) {
  const Inputs& in = p.in;
  check_common(op, prob, in.q, in.g, in.beta, in.A_log, in.dt_bias, in.mask, p.opts,
               "chunked backward");
  if (config.chunk_size != 64)
    refuse(op, "chunk_size is " + std::to_string(config.chunk_size) +
                   "; the CUDA chunked backward runs chunks of 64");
  if (prob.Hv > 65535)
    refuse(op,
           "Hv is " + std::to_string(prob.Hv) + "; the CUDA chunked backward supports Hv <= 65535");
  // saved's dtype (fp32, or bf16 chunk states under 16-bit inputs) is validate_saved's rule.
  const std::pair<const char*, const TensorView*> f32_only[] = {
      {"h0", &in.h0},         {"dfinal_state", &p.dfinal_state}, {"dh0", &p.dh0},
      {"dA_log", &p.dA_log}, {"ddt_bias", &p.ddt_bias}};
  for (const auto& [name, t] : f32_only)
    if (t->defined() && t->dtype != DType::f32)
      refuse(op, std::string(name) + " has dtype " + std::string(to_string(t->dtype)) +
                     "; on cuda it must be float32");
  if (p.saved.defined() && p.saved.shape[2] != prob.Dk * prob.Dv)
    refuse(op, "saved has records of " + std::to_string(p.saved.shape[2]) +
                   " floats (chunk intermediates); the CUDA chunked backward reads chunk states "
                   "only (records of Dk * Dv = " +
                   std::to_string(prob.Dk * prob.Dv) + ")");
  if (prob.N == 0 || prob.Hv == 0 || !prob.varlen) return;
  if (in.cu_seqlens.stride[0] != 1) refuse(op, "cu_seqlens must be contiguous");
  if (in.cu_seqlens.device != DeviceType::cuda)
    refuse(op, "cu_seqlens is on the cpu while the other tensors are on cuda");
}

}  // namespace gdr
