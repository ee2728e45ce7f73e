// Overrides of the CUDA decode plan, for tests and benchmarks (ExecConfig::decode_overrides).
// The plan (docs/cuda-decode.md §Dispatch table) picks a kernel, its launch shape and schedule by
// rules measured on the H200; an override forces one choice where it exists and leaves the rules
// elsewhere. Production calls leave ExecConfig::decode_overrides null. gdr::decode and
// gdr::forward on CUDA tensors read it (the forward's recurrent path runs the same kernels), and
// gdr::backward its chunked_backward_window; the CPU paths ignore it. Not a stable interface: its
// fields follow the kernels.
#pragma once

#include <cstdint>
#include <string>

namespace gdr {

// The CUDA decode kernels (docs/cuda-decode.md §Kernels). The values are the benchmark's and the
// tests' path numbers (bench/cuda_decode --path).
enum class DecodeKernel : std::uint8_t {
  automatic = 0,      // the rules
  staged = 1,         // recurrent.cuh with its usual tile (the one-token kernel for a bf16 pool
                      //   where that applies: the staged kernel reads a bf16 pool only beyond it)
  one_token = 2,      // recurrent_one.cuh where it applies, else the staged kernel's usual tile
  staged_narrow = 3,  // recurrent.cuh with the narrow tile where it exists (k-first, Dk < 256)
  chunk = 4,          // recurrent_chunk.cuh where it applies, else the staged kernel's usual tile
  ring = 5,           // recurrent_ring.cuh where it applies, else the rules
  slice = 6,          // recurrent_slice.cuh where it applies, else the rules
};

// Each field 0 = the rule; a value outside those listed is ignored (the rule).
struct DecodeOverrides {
  DecodeKernel kernel = DecodeKernel::automatic;
  int warps = 0;              // staged and one-token kernels: 1, 2, 4 or 8 warps per block
                              //   (where Dv / columns per warp is a multiple of it)
  int chunk_columns = 0;      // chunk kernel: items of 64 or 128 value columns (128 only where
                              //   Dv % 128 == 0)
  int chunk_first_wait = 0;   // chunk kernel: 1 = the first state wait late, 2 = early
  int chunk_schedule = 0;     // chunk kernel: 1 = static items, 2 = dynamic items
  int persistent_blocks = 0;  // chunk and ring kernels: at most this many blocks (> 0), so that
                              //   small problems run several items per block
  int ring_math = 0;          // ring kernel: 1 = consumers token by token, 2 = on one chunk
                              //   (tensor cores) wherever that exists (16-bit inputs, scalar gate)
  int ring_schedule = 0;      // ring kernel: 1 = static items, 2 = dynamic from round 3,
                              //   3 = dynamic after the full rounds (at least from round 3)
  int prefetch = 0;           // staged and one-token kernels' next-wave L2 prefetch: 1 = off,
                              //   2 = every block prefetches its successor's state
  int state_loads = 0;        // one-token and ring kernels' state loads: 1 = evict-first,
                              //   2 = the default cache policy
  int pdl = 0;                // programmatic dependent launches: 1 = off, 2 = on (the rule: on;
                              //   a launch whose counter pair is zeroed by a memset just before
                              //   it is launched plainly either way)
  int chunked_segments = 0;   // the chunked forward (Path::chunkwise on cuda): chunks per segment
                              //   of the state pass's exact segment split (> 0), or -1 = no split
  int chunked_state_columns = 0;    // the chunked forward's state pass (unsplit): 16 or 32 value
                                    //   columns per block; the fused pass (chunked_state_pass =
                                    //   5): 32, 64 or 128
  int chunked_state_buffers = 0;    // the chunked forward's state pass: 1 or 2 W / Kd buffers
                                    //   (2 only where the shared memory allows); 3 or 4: the
                                    //   bf16 pass's stages of copies (row-factor path, not with
                                    //   the output inside it; else 2); the warpgroup pass's
                                    //   stages: 1 or 2 (else 2 in one wave of blocks, else 1);
                                    //   the fused pass at 64 or 32 columns: 1 = one stage (two
                                    //   blocks per SM; else 2)
  int chunked_overlap = 0;          // the chunked forward: 1 = the output kernel after the state
                                    //   pass, 2 = overlapped with it where possible, 3 = the
                                    //   output inside the bf16 state pass where that pass runs
                                    //   (else 2; the rule: 3)
  int chunked_backward_window = 0;  // the chunked backward given the forward's chunk states:
                                    //   chunk slots per window of its per-chunk scratch (> 0)
  int chunked_prep = 0;             // the chunked forward's prep kernel: 1 = the general one
                                    //   (fp32 staging, tf32 products), 2 = the bf16 one where it
                                    //   applies (the rule: row factors, 16-byte aligned rows),
                                    //   3 = that one on warpgroup products at Dk = Dv = 128 (also
                                    //   the backward's recompute; opt-in: correct and slower on
                                    //   an H100, a560176)
  int chunked_state_pass = 0;       // the chunked forward's unsplit state pass: 1 = the general
                                    //   one (state in shared memory), 2 = the bf16 one with the
                                    //   state in registers wherever it applies (bf16 scratch,
                                    //   Dk = 128), 3 = that pass on warpgroup products where it
                                    //   runs with 32 value columns (opt-in: correct and slower
                                    //   on an H100, a560176); 4 = 2 with one product where it
                                    //   takes two (S and Vnew rounded to bf16 as operands) where
                                    //   the output is inside it (elsewhere as 2); 5 = the fused
                                    //   pass (fused_pass_kernel.cuh: Vnew = T~ (V - diag(ek) K S)
                                    //   on chip, warpgroup products) on the row-factor path at
                                    //   Dk = Dv = 128 (elsewhere as 2). The rule (0): 5 where
                                    //   sequences x value heads fill the SMs, else 4 where the
                                    //   output is inside the bf16 pass, else 2 (H100, 921d278);
                                    //   6 = 4 as three specialised parts (state and output
                                    //   warpgroups, a producer warp) at 32 columns
                                    //   (state_pass_ws_kernel.cuh; opt-in: correct and
                                    //   slower on an H100, a5e57c5)
  int chunked_backward_fused = 0;   // the chunked backward's kernels: 1 = the general ones
                                    //   (fp32 scratch, tf32 products), 2 = where it applies
                                    //   (the rule: scalar gate, bf16, no mask, Dk = Dv = 128,
                                    //   16-byte aligned dO rows) bwd_chunk_bf16_kernel for
                                    //   bwd_dvb + bwd_key and bwd_state_bf16_kernel for the reverse
                                    //   pass (and the bf16 prep's backward mode for
                                    //   16-byte aligned q, k, v rows), 3 = the general reverse
                                    //   pass, 4 = the fp32 prep, 5 = 2 with the reverse pass's
                                    //   operands written in bf16 by the prep given the forward's
                                    //   states (bit-identical to 2; the rule: 5 where it
                                    //   applies, else 2), 6 = 5 with the reverse pass on
                                    //   warpgroup products (opt-in: correct and slower, H100)
  int chunked_tinv = 0;             // the chunked prep kernels' Tinv (forward and the backward's
                                    //   recompute): 1 = by lanes, 2 = by columns (a thread per
                                    //   column, registers; the rule: 5-8 % faster forward, H100),
                                    //   3 = the off-diagonal blocks on the tensor cores (3xTF32)
  int chunked_backward_prefetch = 0;  // the fused backward chunk kernel: 1 = no L2 prefetch,
                                      //   2 = each block prefetches its next phases' operands
                                      //   into L2 (bulk prefetch; the rule: 1, 2 measured
                                      //   3-4 % slower on an H100, 2026-12-07)
  // The fused backward chunk kernel's row sums of dg (phase C): 1 = a thread per column / row and
  // dg's recurrences on one thread (the rule), 2 = by the whole block (quarters, lanes, warp
  // scans; opt-in until measured).
  int chunked_backward_rows = 0;
  // The fused backward's q, k rows: 1 = the prep's L2-normalised fp32 rows in scratch (the rule),
  // 2 = the raw bf16 inputs times the prep's per-row norms, read by the chunk kernel (the same
  // values; opt-in until measured).
  int chunked_backward_qk = 0;
  // The fused backward's dVnew from the bf16 reverse pass to the chunk kernel: 1 = fp32 (the rule),
  // 2 = bf16 (the rounding the chunk kernel makes; opt-in until measured).
  int chunked_backward_dvn = 0;
  // Diagnostics, not a knob: a device buffer of kBackwardPhaseCounters (9) zeroed counters. When
  // set, thread 0 of every block of the fused backward chunk kernel (bwd_chunk_bf16_kernel.cuh)
  // adds the clock64 cycles of each of its phases, 0 .. 7 = staging and Vnew, Y, A0, A1, A2, B,
  // C's products, C's row sums and stores, and adds 1 to [8] (the block count);
  // bench/cuda_chunked_time --phase-cycles prints the averages per block.
  unsigned long long* backward_phase_cycles = nullptr;
  // Diagnostics, not a knob: a device buffer of kPrepPhaseCounters (8) zeroed counters. When set,
  // thread 0 of every block of the chunked forward's bf16 prep kernel (prep_bf16_kernel.cuh, the
  // forward's and the backward's recompute) adds the clock64 cycles of each of its phases, 0 .. 6
  // = the q, k rows' arrival, G and norms, K K^T / Q K^T / P, row factors, Tinv, split factors
  // and v's arrival, W and U, and adds 1 to [7]; bench/cuda_chunked_time --prep-cycles.
  unsigned long long* prep_phase_cycles = nullptr;
};

// The overrides written as "field=value,field=value" (each field of DecodeOverrides by its name,
// the kernel by its number; the diagnostic counters are not settable), e.g.
// "chunked_state_pass=3,chunked_prep=3": the Python module reads it from the environment variable
// GDR_OVERRIDES once (python/src/gdr_module.cpp), so that benchmarks through torch can A/B a
// switch without a rebuild. Throws InvalidArgument naming `what`, the item and what is allowed for
// an unknown field or a value that is not an integer.
DecodeOverrides parse_decode_overrides(const std::string& spec, const char* what = "GDR_OVERRIDES");

inline constexpr int kBackwardPhaseCounters = 9;
inline constexpr int kPrepPhaseCounters = 8;

}  // namespace gdr
