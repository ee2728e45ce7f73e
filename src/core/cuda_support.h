// What the CUDA paths support beyond the operator's contract (docs/cuda-decode.md §Coverage):
// head dims 64, 128 and 256, float32 / float16 / bfloat16 inputs, an f32 or bf16 pool, f32 h0
// and final_state, contiguous index and cu_seqlens vectors on the device. The dispatcher checks a
// validated CUDA call here before it launches anything; each refusal names the value and what is
// supported.
#pragma once

#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr {

void validate_cuda_decode(const Problem& prob, const DecodeParams& p, const char* op);
// `path`: sequential (the recurrent kernel) or chunkwise (the chunked forward), as resolved.
void validate_cuda_forward(const Problem& prob, const ForwardParams& p, Path path,
                           const ExecConfig& config, const char* op);
// The chunked backward (the only CUDA backward): as the chunked forward, plus dfinal_state, dh0,
// dA_log, ddt_bias float32 and `saved` holding chunk states (float32).
void validate_cuda_backward(const Problem& prob, const BackwardParams& p, const ExecConfig& config,
                            const char* op);

}  // namespace gdr
