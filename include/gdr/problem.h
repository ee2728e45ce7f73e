// Problem: the dimensions and flags of one call, derived from its Params by validation.
#pragma once

#include <cstdint>

#include "gdr/params.h"
#include "gdr/types.h"

namespace gdr {

struct Problem {
  std::int64_t B = 0, T = 0;    // batch and tokens per batch row
  std::int64_t N = 0;           // sequences: B, or len(cu_seqlens) - 1 under varlen
  std::int64_t Hk = 0, Hv = 0;  // query/key heads, value heads (Hv % Hk == 0)
  std::int64_t Dk = 0, Dv = 0;  // head dims
  std::int64_t P = 0;           // decode only: rows of the state pool
  GateKind gate = GateKind::scalar;
  DType dtype = DType::f32;     // dtype of q, k, v, o
  DeviceType device = DeviceType::cpu;
  int device_index = 0;
  bool varlen = false;
  bool has_mask = false;
  bool has_h0 = false;
  bool has_final_state = false;
  float scale = 0.0f;           // resolved: opts.scale, or 1/sqrt(Dk) when that is 0

  std::int64_t group() const { return Hv / Hk; }  // value heads per key head
  std::int64_t key_head(std::int64_t hv) const { return hv / group(); }
};

// One sequence of the call: batch row `b`, tokens [t0, t0 + len).
struct SequenceSpan {
  std::int64_t b = 0;
  std::int64_t t0 = 0;
  std::int64_t len = 0;
};

// What the saved-for-backward tensor (ForwardParams::saved, params.h) holds per chunk and value
// head: the state entering the chunk alone (docs/operator.md §3's training forward; the backward
// recomputes the chunk's Tinv and Vnew from it), or that state and those two matrices
// (the backward recomputes nothing).
enum class SavedContent { chunk_states, chunk_intermediates };

// Shape and dtype of the saved-for-backward tensor: [chunk_rows, Hv, record], dtype f32 (f64
// when the inputs are f64; CUDA tensors with f16 / bf16 inputs also take bf16 chunk states, half
// the bytes, read back widened to fp32: validate_saved). chunk_rows is B ceil(T / C) or, under varlen,
// floor((T + N (C - 1)) / C): an upper bound of sum_n ceil(L_n / C) that depends on the shapes
// only (so a caller can size it without reading cu_seqlens; the forward writes zeros in the rows
// past the last sequence's chunks). record is Dk Dv (chunk_states) or Dk Dv + C^2 + C Dv
// (chunk_intermediates): the record length tells the two apart.
struct SavedShape {
  std::int64_t chunk_rows = 0, Hv = 0, record = 0;
  DType dtype = DType::f32;
  SavedContent content = SavedContent::chunk_states;

  std::int64_t numel() const { return chunk_rows * Hv * record; }
  std::int64_t bytes() const { return numel() * dtype_size(dtype); }
  // A contiguous [chunk_rows, Hv, record] view of `data` (bytes() bytes, owned by the caller),
  // for ForwardParams::saved and BackwardParams::saved.
  TensorView view(void* data) const {
    return TensorView::contiguous(data, dtype, {chunk_rows, Hv, record});
  }
};

// The saved shape of a validated problem for chunk size `chunk_size` (16, 32 or 64; another
// size throws InvalidArgument whose message starts with `op`). Only B, T, N, varlen, Hv, Dk, Dv
// and dtype of `prob` are read, so a caller may fill those alone (the Python binding does).
SavedShape saved_shape(const Problem& prob, int chunk_size = 64,
                       SavedContent content = SavedContent::chunk_states,
                       const char* op = "gdr.saved_shape");

// Checks `saved` (rank, shape, dtype, device, last-dim contiguity) against saved_shape(prob,
// chunk_size, content) for either content; throws InvalidArgument whose message starts with
// `op`.
void validate_saved(const Problem& prob, const TensorView& saved, int chunk_size, const char* op);

// Validate every argument (docs/operator.md §6) before any memory is touched; throws
// InvalidArgument whose message starts with `op`. The values of cu_seqlens (start 0,
// non-decreasing, end T), of state_indices (< P) and of g (<= 0, unless gate_in_kernel; see
// ExecConfig::check_values) are checked here when they live in host memory; a CUDA cu_seqlens
// and g are checked by the dispatcher when ExecConfig::check_values asks for it (cu_seqlens is
// then copied to the host and given to check_cu_seqlens_values).
Problem validate_forward(const ForwardParams& p, const char* op = "gdr.forward");
Problem validate_backward(const BackwardParams& p, const char* op = "gdr.backward");
Problem validate_decode(const DecodeParams& p, const char* op = "gdr.decode");

// Checks the values of cu_seqlens ([N + 1] in host memory, i32 or i64).
void check_cu_seqlens_values(const void* host_data, DType dtype, std::int64_t count, std::int64_t T,
                             const char* op);

// Sequence n of a validated problem (reads cu_seqlens from host memory under varlen).
SequenceSpan sequence_span(const Problem& prob, const Inputs& in, std::int64_t n);

}  // namespace gdr
