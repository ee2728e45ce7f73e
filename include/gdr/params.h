// Parameter structs of the three operations: forward, backward, decode.
// Plain data: pointers (as TensorViews), shapes, int64 strides and options. Shapes use
//   B batch (1 under varlen), T tokens, N sequences (B, or len(cu_seqlens) - 1),
//   Hk query/key heads, Hv value heads (Hv % Hk == 0), Dk key dim, Dv value dim.
// Every tensor's last dim must be contiguous (stride 1).
#pragma once

#include <cstddef>

#include "gdr/tensor.h"
#include "gdr/types.h"

namespace gdr {

struct DecodeOverrides;  // gdr/decode_overrides.h

// Where a CUDA call takes its temporary device memory (the chunked forward and backward need
// scratch; ExecConfig::scratch). allocate returns at least `bytes` of device memory usable in
// stream order on `stream` (a cudaStream_t) until release is called with the same pointer and
// stream, after the call's last kernel that uses it has been queued (release must not throw);
// allocate returns nullptr (or throws) when it cannot. A framework passes its own allocator so that
// the scratch shows in its memory accounting (torch.cuda.max_memory_allocated) and is reused from
// its cache; the Python layer does (python/gdr/_ops.py).
struct ScratchAllocator {
  void* context = nullptr;
  void* (*allocate)(void* context, std::size_t bytes, void* stream) = nullptr;
  void (*release)(void* context, void* ptr, void* stream) = nullptr;
};

// Options shared by all operations.
struct Options {
  float scale = 0.0f;  // o_t = scale * S_t^T q_t; 0 means 1/sqrt(Dk)
  StateLayout state_layout = StateLayout::k_first;  // layout of h0, final_state, dh0, pool state
  // Gate in kernel: `g` holds the raw `a`; g = -exp(A_log) * softplus(a + dt_bias).
  bool gate_in_kernel = false;
  // Beta sigmoid in kernel: `beta` holds the raw `b`; beta = sigmoid(b).
  bool beta_sigmoid = false;
  // q and k are L2-normalised over Dk before use: x / sqrt(sum(x^2) + l2norm_eps).
  bool qk_l2norm = false;
  float l2norm_eps = 1e-6f;
};

// The inputs every direction reads.
struct Inputs {
  TensorView q;           // [B, T, Hk, Dk]      f32 | f16 | bf16 (| f64 on CPU)
  TensorView k;           // [B, T, Hk, Dk]      as q
  TensorView v;           // [B, T, Hv, Dv]      as q
  TensorView g;           // [B, T, Hv] scalar gate or [B, T, Hv, Dk] per-key gate; natural log
                          //   of the decay (<= 0; g > 0 is refused, -inf and NaN pass through,
                          //   see ExecConfig::check_values), or raw `a` with
                          //   gate_in_kernel; f32 or q's dtype
  TensorView beta;        // [B, T, Hv]          f32 or q's dtype; raw `b` with beta_sigmoid
  TensorView A_log;       // [Hv]                f32; only with gate_in_kernel
  TensorView dt_bias;     // [Hv] (scalar gate) or [Hv, Dk] (per-key gate) f32; only with gate_in_kernel
  TensorView h0;          // optional [N, Hv, Dk, Dv] (k-first) or [N, Hv, Dv, Dk] (v-first) f32
  TensorView mask;        // optional [B, T] bool; false = identity step, o_t = 0
  TensorView cu_seqlens;  // optional [N + 1] i32 | i64: 0 = c_0 <= c_1 <= ... <= c_N = T, B == 1
};

// Saved for backward (optional, CPU chunkwise path only): what the chunkwise forward computes
// per chunk and value head and the backward would otherwise recompute in a pass over the
// chunks (docs/operator.md §3): the state entering the chunk (SavedContent::chunk_states,
// docs/operator.md §3's training forward) or that state and the chunk's Tinv and Vnew
// (SavedContent::chunk_intermediates).
//   saved  [chunk_rows, Hv, record]  f32 (f64 for f64 inputs); saved_shape() (problem.h) gives
//          the shape and bytes for a call. Row c0(n) + c holds chunk c of sequence n, c0(n) =
//          sum_{m < n} ceil(L_m / C); record = Dk Dv floats, S [Dk, Dv] (k-first), for chunk
//          states; Dk Dv + C^2 + C Dv floats, S | Tinv [C, C] | Vnew [C, Dv] (a chunk of
//          n < C tokens fills the first n rows, each block row-major [n, ...], and zeros after
//          them), for chunk intermediates. The record length tells the two apart. Every element
//          is written: rows past the last chunk are zeros.
//   Cost per token and value head at C = 64, Dk = Dv = 128: 1 KB (chunk states; 0.13 GB for
//   T = 4096, Hv = 32) or 1.75 KB (chunk intermediates, 0.23 GB), against one state per chunk of
//   the item being worked on kept inside the backward otherwise. Its layout is the CPU chunkwise
//   path's own: fill it with forward and hand it, unchanged, to backward with the same inputs,
//   options and chunk_size. With chunk states the backward recomputes each chunk's Tinv and
//   Vnew in its reverse pass (no pass over the chunks first); with chunk intermediates it
//   recomputes nothing.
// ForwardParams::saved makes forward run the chunkwise path (Path::automatic resolves to it);
// BackwardParams::saved makes the chunkwise backward read the states (and per-chunk matrices)
// instead of recomputing them (automatic resolves to chunkwise). Forcing another path, or
// tensors on cuda, with `saved` given is an error.
struct ForwardParams {
  Inputs in;
  TensorView o;            // [B, T, Hv, Dv]  q's dtype (written)
  TensorView final_state;  // optional, like h0, f32 (written)
  TensorView saved;        // optional [chunk_rows, Hv, record] (written; see above)
  Options opts;
};

// Gradients of a loss L given dL/do and, optionally, dL/d(final_state).
// Each gradient is optional (not written when not given) and has its input's shape and dtype;
// dg is the gradient w.r.t. the tensor passed as g (raw `a` under gate_in_kernel), dbeta
// likewise w.r.t. the tensor passed as beta (raw `b` under beta_sigmoid).
struct BackwardParams {
  Inputs in;
  TensorView dout;          // [B, T, Hv, Dv]  q's dtype
  TensorView dfinal_state;  // optional, like h0, f32
  TensorView dq, dk, dv, dg, dbeta;
  TensorView dA_log, ddt_bias;  // only with gate_in_kernel
  TensorView dh0;               // only with h0
  TensorView saved;             // optional: ForwardParams::saved of the same call (read)
  Options opts;
};

// One decode step of T = 1..16 tokens per sequence for B sequences, the state updated in place.
struct DecodeParams {
  TensorView q, k;          // [B, T, Hk, Dk]
  TensorView v;             // [B, T, Hv, Dv]
  TensorView g;             // [B, T, Hv] or [B, T, Hv, Dk] (see Inputs::g)
  TensorView beta;          // [B, T, Hv]
  TensorView A_log, dt_bias;
  TensorView mask;          // optional [B, T] bool
  TensorView state;         // [P, Hv, Dk, Dv] (k-first) or [P, Hv, Dv, Dk] f32 or bf16 (computed
                            //   in fp32, stored rounded to nearest even once per step), read
                            //   and written
  TensorView state_indices; // optional [B] i32 | i64: sequence b uses state row state_indices[b]
                            //   (negative: skip b, its o rows are written as 0); else row b (P >= B)
  TensorView o;             // [B, T, Hv, Dv] written
  Options opts;

  // The token inputs as the forward takes them (h0 and cu_seqlens not given): what validation
  // and the paths read, so that decode and forward share one description of the inputs.
  Inputs inputs() const {
    Inputs in;
    in.q = q;
    in.k = k;
    in.v = v;
    in.g = g;
    in.beta = beta;
    in.A_log = A_log;
    in.dt_bias = dt_bias;
    in.mask = mask;
    return in;
  }
};

// How to run a call: which path, tuning knobs, and the CUDA stream for device tensors.
struct ExecConfig {
  Path path = Path::automatic;
  int chunk_size = 64;     // chunkwise path: 16, 32 or 64
  int num_threads = 0;     // CPU: 0 = OpenMP default
  void* stream = nullptr;  // cudaStream_t for CUDA tensors (nullptr = default stream)
  // Tests and benchmarks only: forced choices of the CUDA decode plan (gdr/decode_overrides.h),
  // read by decode and forward on CUDA tensors; nullptr = the rules.
  const DecodeOverrides* decode_overrides = nullptr;
  // The name that starts every error message of the call (gdr::InvalidArgument, and
  // gdr::RuntimeFailure); nullptr means "gdr.forward", "gdr.backward" or "gdr.decode". A binding
  // passes the public function its caller called, so that every message of one call starts
  // with one name (the Python functions pass e.g. "gdr.chunk_gated_delta_rule").
  const char* op_name = nullptr;
  // Check the values of g and cu_seqlens before running: g is the natural log of the decay,
  // so g > 0 (a forgotten log-sigmoid, say) is refused with the first offending value and its
  // index; -inf and NaN are not refused: they pass through to the outputs (docs/operator.md
  // §6). Not with gate_in_kernel (g then holds the raw `a`, any real value). cu_seqlens must
  // start at 0, not decrease and end at T.
  // CPU tensors: always checked, whatever this flag (one read of each, small next to the call).
  // CUDA tensors: checked only when this is true, by a reduction kernel over g and a copy of
  // cu_seqlens to the host on `stream`, followed by a synchronisation of `stream`: a round trip
  // per call, and a call with it cannot be captured in a CUDA graph. Off by default (serving,
  // graphs): the kernels then clamp cu_seqlens values into [0, T] (an invalid tensor gives
  // meaningless outputs for the sequences it misdescribes, never an access out of bounds).
  bool check_values = false;
  // Temporary device memory of CUDA calls; nullptr: cudaMallocAsync / cudaFreeAsync on `stream`
  // (the device's default memory pool, which torch's accounting does not see).
  const ScratchAllocator* scratch = nullptr;
};

}  // namespace gdr
