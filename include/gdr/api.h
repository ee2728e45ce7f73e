// The public entry points of gdr. Each validates its arguments (throwing gdr::InvalidArgument
// with a message naming the operation, tensor, value and what is allowed), picks a path in one
// place (src/core/dispatch.cpp) and runs it on the tensors' device.
#pragma once

#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr {

// o and final_state from the inputs (docs/operator.md §2-3); with params.saved (CPU chunkwise path)
// also the saved-for-backward tensor of a training step (params.h; sized by saved_shape).
void forward(const ForwardParams& params, const ExecConfig& config = {});

// Gradients of every input (docs/operator.md §4). Without params.saved it recomputes the
// chunk-boundary states internally (extra memory O(T / chunk) states per sequence and head,
// never one state per token); with the forward's params.saved it reads them from there (and
// the chunks' Tinv and Vnew too when the forward saved the chunk intermediates).
void backward(const BackwardParams& params, const ExecConfig& config = {});

// A few tokens (T = 1..16) for each of B sequences, the state updated in place.
void decode(const DecodeParams& params, const ExecConfig& config = {});

// The path `config` resolves to for these params (what forward/backward would run).
Path resolve_forward_path(const ForwardParams& params, const ExecConfig& config = {});
Path resolve_backward_path(const BackwardParams& params, const ExecConfig& config = {});

// True when this build has the CUDA paths compiled in.
bool cuda_available();

// True when gdr::backward runs for tensors on `device` in this build (the CPU: always; CUDA: not
// yet, the call is refused: the Python layer then runs the CPU backward on host copies).
bool backward_available(DeviceType device);

}  // namespace gdr
