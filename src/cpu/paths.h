// The CPU paths. Each takes a validated Problem and does no validation of its own.
#pragma once

#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr::cpu {

// float64 sequential recurrence (docs/operator.md §2): the oracle every other path answers to.
void reference_forward(const Problem& prob, const ForwardParams& p);
void reference_backward(const Problem& prob, const BackwardParams& p);

// Per-token loop in fp32 (double when the inputs are f64); backward recomputes from states
// saved every `config.chunk_size` tokens (O(T / C) memory).
void sequential_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config);
void sequential_backward(const Problem& prob, const BackwardParams& p, const ExecConfig& config);

// Chunkwise-parallel form (docs/operator.md §3-4), fp32 (double for f64 inputs).
void chunkwise_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config);
void chunkwise_backward(const Problem& prob, const BackwardParams& p, const ExecConfig& config);

// Decode step (few tokens, state in place) on the CPU.
void decode(const Problem& prob, const DecodeParams& p, const ExecConfig& config);

}  // namespace gdr::cpu
