// GPU tests of the CUDA chunked forward (src/cuda/chunked/, Path::chunkwise on cuda tensors):
// each case against the float64 reference on the same rounded inputs, outputs poisoned with NaN
// first, within docs/operator.md §7's bar (5e-3 for f16/bf16 inputs on the tensor cores, 1e-5 for
// fp32 inputs: three tf32 products per pair); the saved chunk states against the CPU chunkwise
// path's record; a CUDA-graph capture of a varlen call against the eager call.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gdr/decode_overrides.h"
#include "gpu_support.h"
#include "support_gtest.h"

namespace gdr::test {
namespace {

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

// Largest error seen per case family (printed at the end of the run, for the report).
std::map<std::string, std::pair<double, double>>& worst() {
  static std::map<std::string, std::pair<double, double>> m;
  return m;
}
struct WorstPrinter : ::testing::Environment {
  void TearDown() override {
    for (const auto& [family, e] : worst())
      std::printf("[chunked max rel err] %-28s o %.3e  state %.3e\n", family.c_str(), e.first,
                  e.second);
  }
};
const auto* const kPrinter = ::testing::AddGlobalTestEnvironment(new WorstPrinter);

struct DeviceRun {
  ForwardResult r;
  std::vector<double> saved;  // the saved tensor as doubles (when asked)
};

// gdr::forward with Path::chunkwise on device copies of d's tensors (o, the final state and the
// saved tensor poisoned first), with the plan's overrides.
// saved_bf16: the saved tensor in bf16 (16-bit inputs; validate_saved), else fp32.
DeviceRun run_chunked(TestData& d, bool with_saved, cudaStream_t stream = nullptr,
                      const DecodeOverrides& overrides = {}, bool saved_bf16 = false) {
  d.o.poison();
  if (d.final_state.defined()) d.final_state.poison();
  HostTensor saved_host;
  if (with_saved) saved_host = make_saved(d, 64, SavedContent::chunk_states);  // NaN everywhere
  if (with_saved && saved_bf16) {
    saved_host = HostTensor(DType::bf16, {saved_host.view().shape[0], saved_host.view().shape[1],
                                          saved_host.view().shape[2]});
    saved_host.poison();
  }
  ForwardParams host = d.forward_params();
  DeviceMirror m;
  ForwardParams p = mirror_forward_params(m, host);
  if (with_saved) p.saved = m.to_device(saved_host.view());
  ExecConfig cfg;
  cfg.path = Path::chunkwise;
  cfg.stream = stream;
  cfg.decode_overrides = &overrides;
  forward(p, cfg);
  cuda_check(cudaStreamSynchronize(stream), "chunked forward");
  DeviceMirror::to_host(p.o, host.o);
  DeviceMirror::to_host(p.final_state, host.final_state);
  DeviceRun out;
  if (with_saved) {
    DeviceMirror::to_host(p.saved, saved_host.view());
    out.saved = saved_host.to_double();
  }
  out.r.o = d.o.to_double();
  if (d.final_state.defined()) out.r.final_state = d.final_state.to_double();
  return out;
}

void note(const std::string& family, const ForwardResult& got, const ForwardResult& ref) {
  auto& w = worst()[family];
  w.first = std::max(w.first, rel_error(got.o, ref.o));
  if (!ref.final_state.empty())
    w.second = std::max(w.second, rel_error(got.final_state, ref.final_state));
}

// One case: the chunked forward against the float64 reference (and, with `saved`, its chunk
// states against the CPU chunkwise path's).
// segments: DecodeOverrides::chunked_segments (0 the rule); overrides: the other fields.
// saved_bf16: the saved chunk states in bf16, compared with the CPU's fp32 ones within the
// forward's tolerance plus bf16's rounding (2^-8).
void check_chunked(const std::string& family, TestData d, bool with_saved = false, int segments = 0,
                   DecodeOverrides overrides = {}, bool saved_bf16 = false) {
  const ForwardResult ref = reference_forward(d);
  overrides.chunked_segments = segments;
  const std::string label = family + ": " + describe(d.c, d.seed) + " segments " +
                            std::to_string(segments) + " state bv " +
                            std::to_string(overrides.chunked_state_columns) + " buffers " +
                            std::to_string(overrides.chunked_state_buffers) + " overlap " +
                            std::to_string(overrides.chunked_overlap);
  const DeviceRun got = run_chunked(d, with_saved, nullptr, overrides, saved_bf16);
  note(family, got.r, ref);
  expect_forward_close(got.r, ref, forward_tolerance(d.c), label);
  if (with_saved) {
    TestData cpu = d;
    HostTensor saved_cpu = make_saved(cpu, 64, SavedContent::chunk_states);
    run_forward(cpu, Path::chunkwise, ExecConfig{}, saved_cpu.view());
    const std::vector<double> want = saved_cpu.to_double();
    ASSERT_EQ(got.saved.size(), want.size()) << label;
    for (double x : got.saved) ASSERT_TRUE(std::isfinite(x)) << label << ": saved not written";
    const double err = rel_error(got.saved, want);
    auto& w = worst()[family + " (saved)"];
    w.first = std::max(w.first, err);
    EXPECT_LE(err, forward_tolerance(d.c) + (saved_bf16 ? 1.0 / 256 : 0.0))
        << label << ": saved chunk states" << (saved_bf16 ? " (bf16)" : "");
    // Rows past the last chunk (varlen upper bound) are zeros in both.
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (want[i] == 0.0) {
        ASSERT_EQ(got.saved[i], 0.0) << label << ": saved element " << i;
      }
    }
  }
}

void check_chunked(const std::string& family, const Case& c, bool with_saved = false,
                   int segments = 0, DecodeOverrides overrides = {}, bool saved_bf16 = false) {
  check_chunked(family, make_problem(c), with_saved, segments, overrides, saved_bf16);
}

Case base_case(std::int64_t B, std::int64_t T, std::int64_t Hk, std::int64_t Hv, std::int64_t D,
               DType dtype = DType::bf16) {
  Case c;
  c.B = B;
  c.T = T;
  c.Hk = Hk;
  c.Hv = Hv;
  c.Dk = c.Dv = D;
  c.dtype = dtype;
  return c;
}

TEST(CudaChunkedForward, Lengths) {
  REQUIRE_GPU();
  for (std::int64_t T : {0, 1, 63, 64, 65, 1000})
    for (DType dtype : {DType::bf16, DType::f32}) {
      Case c = base_case(2, T, 1, 2, 128, dtype);
      c.layout = T % 2 ? StateLayout::v_first : StateLayout::k_first;
      c.h0 = T != 64;
      check_chunked(dtype == DType::f32 ? "lengths f32" : "lengths bf16", c);
    }
}

TEST(CudaChunkedForward, DecayRegimes) {
  REQUIRE_GPU();
  for (Decay decay : {Decay::mild, Decay::strong, Decay::extreme})
    for (GateKind gate : {GateKind::scalar, GateKind::per_key})
      for (DType dtype : {DType::bf16, DType::f32}) {
        Case c = base_case(1, 300, 1, 2, 64, dtype);
        c.decay = decay;
        c.gate = gate;
        check_chunked(std::string("decay ") + std::string(to_string(decay)), c);
      }
  // g = -30 everywhere (each step forgets the state entirely).
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c = base_case(1, 200, 1, 2, 64);
    c.gate = gate;
    TestData d = make_problem(c);
    d.g.fill(-30.0);
    check_chunked("decay g=-30", d);
  }
  // g = -inf at a few steps, one at a chunk's first row and one in the middle of a chunk: an exact
  // decay to 0 (docs/operator.md §6), finite outputs equal to the reference's.
  for (GateKind gate : {GateKind::scalar, GateKind::per_key})
    for (DType dtype : {DType::bf16, DType::f32}) {
      Case c = base_case(1, 200, 1, 2, 64, dtype);
      c.gate = gate;
      TestData d = make_problem(c);
      const std::int64_t width = gate == GateKind::per_key ? c.Dk : 1;
      for (std::int64_t t : {5, 64, 100, 101})
        for (std::int64_t i = 0; i < width; i += (t == 100 ? 1 : 3))
          d.g.set((t * 2 + 1) * width + i, -std::numeric_limits<double>::infinity());
      check_chunked("decay g=-inf", d);
    }
}

TEST(CudaChunkedForward, BetaZeroAndOne) {
  REQUIRE_GPU();
  for (double beta : {0.0, 1.0})
    for (DType dtype : {DType::bf16, DType::f32}) {
      TestData d = make_problem(base_case(2, 150, 2, 4, 64, dtype));
      d.beta.fill(beta);
      check_chunked("beta 0/1", d);
    }
}

TEST(CudaChunkedForward, HeadDimsGatesLayouts) {
  REQUIRE_GPU();
  for (std::int64_t Dk : {64, 128, 256})
    for (std::int64_t Dv : {64, 128, 256})
      for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
        Case c = base_case(1, 100 + Dk / 64, 1, 2, 64, (Dk + Dv) % 3 ? DType::bf16 : DType::f16);
        c.Dk = Dk;
        c.Dv = Dv;
        c.gate = gate;
        c.layout = (Dk == Dv) ? StateLayout::v_first : StateLayout::k_first;
        check_chunked("head dims", c);
      }
}

TEST(CudaChunkedForward, GroupedHeadsMaskFused) {
  REQUIRE_GPU();
  for (int opts = 0; opts < 4; ++opts)
    for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
      Case c = base_case(2, 130, 2, 8, 128, opts == 1 ? DType::f32 : DType::bf16);  // Hv/Hk = 4
      c.gate = gate;
      c.mask = opts >= 2;
      c.gate_in_kernel = opts >= 1;
      c.beta_sigmoid = opts >= 1;
      c.qk_l2norm = opts == 1 || opts == 3;
      c.gates_in_dtype = opts == 3;
      c.final_state = opts != 2;
      c.h0 = opts != 0;
      c.strided = opts == 2;
      check_chunked("gqa/mask/fused", c);
    }
}

TEST(CudaChunkedForward, Varlen) {
  REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f32})
    for (bool i64 : {false, true}) {
      Case c = base_case(1, 0, 1, 4, 64, dtype);
      c.seqlens = {0, 1, 65, 0, 200, 64, 1, 3};
      c.cu_seqlens_i64 = i64;
      c.gate = i64 ? GateKind::per_key : GateKind::scalar;
      c.mask = !i64;
      c.layout = i64 ? StateLayout::v_first : StateLayout::k_first;
      check_chunked("varlen", c);
    }
}

TEST(CudaChunkedForward, SavedChunkStates) {
  REQUIRE_GPU();
  for (bool varlen : {false, true})
    for (GateKind gate : {GateKind::scalar, GateKind::per_key})
      for (DType dtype : {DType::bf16, DType::f32}) {
        Case c = base_case(2, 140, 1, 2, 64, dtype);
        c.Dv = 128;
        c.gate = gate;
        if (varlen) {
          c.B = 1;
          c.seqlens = {70, 0, 1, 130, 64};
        }
        check_chunked("saved", c, true);
        // bf16 chunk states (16-bit inputs only; the segment split writes them too).
        if (dtype == DType::bf16) {
          check_chunked("saved bf16", c, true, 0, {}, true);
          check_chunked("saved bf16", c, true, 2, {}, true);
        }
      }
}

// Enough value heads for the state pass's 32-column blocks (src/cuda/chunked/chunked_forward.cu:
// more than half the SMs busy at 32 columns), in one wave (two W / Kd buffers) and in more than
// one (one buffer); the smaller cases above run 16 columns.
TEST(CudaChunkedForward, WideStatePass) {
  REQUIRE_GPU();
  for (std::int64_t B : {1, 3})
    for (DType dtype : {DType::bf16, DType::f32}) {
      Case c = base_case(B, B == 1 ? 300 : 130, 4, B == 1 ? 24 : 16, 128, dtype);
      c.gate = B == 1 ? GateKind::scalar : GateKind::per_key;
      c.layout = B == 1 ? StateLayout::k_first : StateLayout::v_first;
      check_chunked("wide state pass", c, B == 3);
    }
}

// The 16-bit scratch path (W, U / Vnew, Qs, Kd, P in bf16 for f16 / bf16 inputs) at the
// benchmark's head dims over many chunks, where the rounded intermediates' errors accumulate in
// the state: within the 5e-3 bar for both gates, f16 and bf16 inputs, with and without the fused
// normalisation.
TEST(CudaChunkedForward, Bf16ScratchManyChunks) {
  REQUIRE_GPU();
  for (GateKind gate : {GateKind::scalar, GateKind::per_key})
    for (DType dtype : {DType::bf16, DType::f16}) {
      Case c = base_case(1, 2048 + 17, 1, 2, 128, dtype);
      c.gate = gate;
      c.decay = Decay::mild;
      c.qk_l2norm = dtype == DType::bf16;
      check_chunked("bf16 scratch", c, gate == GateKind::scalar);
    }
}

// The prep kernels of the row-factor path (scalar gate, bf16, no mask): the general one (fp32
// staging, tf32 products; DecodeOverrides::chunked_prep = 1), the bf16 one (products on the raw
// rows, the Tinv factors split into bf16 hi + lo; prep_bf16_kernel.cuh, the rule) and its
// warpgroup-product form (chunked_prep = 3 at Dk = Dv = 128, else the bf16 one), each against the
// float64 reference: head dims 64 / 128 / 256, the fused options, GQA, g = -30, varlen
// with empty and 1-token sequences, h0 and the final state.
TEST(CudaChunkedForward, PrepKernels) {
  REQUIRE_GPU();
  for (int prep : {1, 2, 3})
    for (int opts = 0; opts < 5; ++opts) {
      Case c = base_case(opts == 3 ? 1 : 2, opts == 3 ? 0 : 64 * 3 + 5, 2, 4, 128);
      if (opts == 1) c.Dv = 256;
      if (opts == 2) c.Dk = c.Dv = 64;
      if (opts == 4) c.Dk = 256, c.Dv = 64;
      c.gate = GateKind::scalar;
      c.qk_l2norm = opts == 1 || opts == 3;
      c.gate_in_kernel = c.beta_sigmoid = opts == 2 || opts == 3;
      c.decay = opts == 4 ? Decay::extreme : (opts == 2 ? Decay::strong : Decay::mild);
      c.h0 = c.final_state = true;
      if (opts == 3) c.seqlens = {0, 1, 130, 64, 65};
      DecodeOverrides o;
      o.chunked_prep = prep;
      check_chunked("prep kernel " + std::to_string(prep), c, opts == 0, 0, o);
    }
  // The warpgroup form at its extremes: beta 1 (the largest A), g = -30, with the warpgroup
  // state pass too.
  for (int pass : {2, 3}) {
    Case c = base_case(1, 64 * 2 + 33, 1, 2, 128);
    c.h0 = c.final_state = true;
    TestData d = make_problem(c);
    d.beta.fill(1.0);
    DecodeOverrides o;
    o.chunked_prep = 3;
    o.chunked_state_pass = pass;
    o.chunked_state_columns = 32;
    check_chunked("prep kernel 3, beta 1", d, true, -1, o);
    d.g.fill(-30.0);
    check_chunked("prep kernel 3, beta 1, g=-30", d, true, -1, o);
  }
}

std::string tinv_label(int tinv) {
  return tinv == 1 ? "tinv by lanes" : tinv == 2 ? "tinv by columns" : "tinv on tensor cores";
}

// Tinv's three schedules (tinv.cuh: by columns, the rule, which every other test runs, by lanes and
// on the tensor cores, DecodeOverrides::chunked_tinv = 1, 3) against the float64 reference in every
// prep kernel that inverts: the bf16 prep (row factors), the general prep with bf16 scratch
// (per-key gate, a mask) and with fp32 scratch (fp32 inputs, 3xTF32), at mild, extreme and g = -30
// decay, beta 1 (the largest A), head dims 64 and 128, varlen with empty and 1-token sequences.
TEST(CudaChunkedForward, TinvSchedules) {
  REQUIRE_GPU();
  for (int variant = 0; variant < 4; ++variant)
    for (Decay decay : {Decay::mild, Decay::extreme}) {
      const bool varlen = variant == 2;
      Case c = base_case(varlen ? 1 : 2, varlen ? 0 : 64 * 3 + 7, 2, 4, variant == 3 ? 64 : 128,
                         variant == 3 ? DType::f32 : DType::bf16);
      c.gate = variant == 1 ? GateKind::per_key : GateKind::scalar;
      c.mask = variant == 2;
      c.decay = decay;
      c.h0 = c.final_state = true;
      if (varlen) c.seqlens = {0, 1, 130, 64, 65};
      for (int tinv : {1, 2, 3}) {
        DecodeOverrides o;
        o.chunked_tinv = tinv;
        check_chunked(tinv_label(tinv), c, variant != 1, -1, o);
      }
    }
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c = base_case(1, 64 * 2 + 33, 1, 2, 128);
    c.gate = gate;
    TestData d = make_problem(c);
    d.beta.fill(1.0);
    for (int tinv : {1, 2, 3}) {
      DecodeOverrides o;
      o.chunked_tinv = tinv;
      const std::string label = tinv_label(tinv);
      check_chunked(label + ", beta 1", d, false, -1, o);
      TestData d30 = d;
      d30.g.fill(-30.0);
      check_chunked(label + ", beta 1, g=-30", d30, false, -1, o);
    }
  }
}

// The two unsplit state passes of the row-factor path at Dk = 128: the general one (state in
// shared memory; DecodeOverrides::chunked_state_pass = 1) and the bf16 one with the state in
// registers (state_pass_bf16_kernel.cuh, the rule), at 16 and 32 value columns per block, the
// output kernel after the pass or overlapped with it or (overlap 3, bf16 pass) the output inside
// the pass, both layouts, varlen with empty and 1-token sequences, and the saved chunk states in
// fp32 and bf16 against the CPU path's.
TEST(CudaChunkedForward, StatePassKernels) {
  REQUIRE_GPU();
  for (int pass : {1, 2})
    for (int bv : {16, 32})
      for (int overlap : {1, 2, 3}) {
        const bool varlen = bv == 16;
        Case c = base_case(varlen ? 1 : 2, varlen ? 0 : 64 * 5 + 3, 2, 4, 128);
        c.Dv = overlap == 1 ? 64 : 128;
        c.gate = GateKind::scalar;
        c.h0 = c.final_state = true;
        c.layout = overlap == 1 ? StateLayout::v_first : StateLayout::k_first;
        c.decay = overlap == 1 ? Decay::strong : Decay::mild;
        if (varlen) c.seqlens = {130, 0, 1, 64, 300};
        DecodeOverrides o;
        o.chunked_state_pass = pass;
        o.chunked_state_columns = bv;
        o.chunked_overlap = overlap;
        const std::string family = "state pass " + std::to_string(pass);
        check_chunked(family, c, true, -1, o);
        check_chunked(family + " (bf16 saved)", c, true, -1, o, true);
        check_chunked(family + " (own states)", c, false, -1, o);
      }
}

// The bf16 state pass with 3 and 4 stages of copies (DecodeOverrides::chunked_state_buffers; the
// rule's 2 in StatePassKernels): sequences shorter and longer than the stages, varlen with empty
// and 1-token sequences, the saved chunk states.
TEST(CudaChunkedForward, StatePassStages) {
  REQUIRE_GPU();
  for (int stages : {3, 4})
    for (int bv : {16, 32}) {
      const bool varlen = bv == 16;
      Case c = base_case(varlen ? 1 : 2, varlen ? 0 : 64 * 6 + 17, 2, 4, 128);
      c.gate = GateKind::scalar;
      c.h0 = c.final_state = true;
      c.layout = stages == 4 ? StateLayout::v_first : StateLayout::k_first;
      if (varlen) c.seqlens = {130, 0, 1, 64, 300, 65};
      DecodeOverrides o;
      o.chunked_state_buffers = stages;
      o.chunked_state_columns = bv;
      const std::string family = "state pass stages " + std::to_string(stages);
      check_chunked(family, c, true, -1, o);
      check_chunked(family + " (own states)", c, false, -1, o);
    }
}

// The bf16 state pass on the stored Kd rows (state_pass_bf16_kernel<BV, false, true>: the path
// without row factors at Dk = 128; the rule, DecodeOverrides::chunked_state_pass = 0) and the
// general pass there (chunked_state_pass = 1): per-key gates (diag(gn) per state row),
// masks, f16 inputs, 16 and 32 value columns, both layouts, varlen, the saved chunk states in
// fp32 and bf16 and the own bf16 ones.
TEST(CudaChunkedForward, StoredStatePass) {
  REQUIRE_GPU();
  for (int pass : {1, 0})
    for (int variant = 0; variant < 4; ++variant) {
      const bool varlen = variant == 1 || variant == 3;
      Case c = base_case(varlen ? 1 : 2, varlen ? 0 : 64 * 4 + 9, 2, 4, 128,
                         variant == 2 ? DType::f16 : DType::bf16);
      c.gate = variant == 2 ? GateKind::scalar : GateKind::per_key;
      c.mask = variant == 1 || variant == 2;
      c.h0 = c.final_state = true;
      c.layout = variant == 3 ? StateLayout::v_first : StateLayout::k_first;
      c.decay = variant == 3 ? Decay::strong : Decay::mild;
      if (varlen) c.seqlens = {130, 0, 1, 64, 300};
      DecodeOverrides o;
      o.chunked_state_pass = pass;
      o.chunked_state_columns = variant == 0 ? 16 : 32;
      const std::string family = "stored state pass " + std::to_string(pass);
      check_chunked(family, c, true, -1, o);
      check_chunked(family + " (bf16 saved)", c, true, -1, o, true);
      check_chunked(family + " (own states)", c, false, -1, o);
    }
}

// The state pass on warpgroup products (state_pass_wgmma_kernel.cuh, DecodeOverrides::
// chunked_state_pass = 3, 32 value columns; one and two stages of copies, chunked_state_buffers)
// wherever the bf16 pass runs: the output inside it
// (without `saved`, with bf16 `saved`, with fp32 `saved`: q S on S's hi part or on hi + lo), the
// output kernel after it (overlap 1) and overlapped with it (overlap 2), the stored Qs, Kd rows
// (per-key gate, a mask, f16 inputs) with the output inside the pass (per-key, f16) and after it
// (per-key with a mask); both layouts, varlen with empty and 1-token sequences,
// mild, strong and g = -30 decay, beta 1, GQA; against the float64 reference, the saved chunk
// states against the CPU path's.
TEST(CudaChunkedForward, WgmmaStatePass) {
  REQUIRE_GPU();
  for (int variant = 0; variant < 7; ++variant) {
    const bool varlen = variant == 1 || variant == 4;
    Case c = base_case(varlen ? 1 : 2, varlen ? 0 : 64 * 5 + 3, 2, 4, 128,
                       variant == 6 ? DType::f16 : DType::bf16);
    c.gate = variant == 4 || variant == 5 ? GateKind::per_key : GateKind::scalar;
    c.mask = variant == 5 || variant == 6;
    c.h0 = c.final_state = true;
    c.layout = variant % 2 ? StateLayout::v_first : StateLayout::k_first;
    c.decay = variant == 2 ? Decay::strong : Decay::mild;
    c.qk_l2norm = variant == 3;
    if (varlen) c.seqlens = {130, 0, 1, 64, 300};
    for (int stages : {1, 2}) {
      DecodeOverrides o;
      o.chunked_state_pass = 3;
      o.chunked_state_columns = 32;
      o.chunked_state_buffers = stages;
      o.chunked_overlap = variant == 2 ? 1 : variant == 3 ? 2 : 0;
      const std::string family = "wgmma state pass, stages " + std::to_string(stages);
      check_chunked(family, c, true, -1, o);
      check_chunked(family + " (bf16 saved)", c, true, -1, o, true);
      check_chunked(family + " (own states)", c, false, -1, o);
    }
  }
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c = base_case(1, 64 * 3 + 33, 1, 2, 128);
    c.gate = gate;
    c.h0 = c.final_state = true;
    TestData d = make_problem(c);
    d.beta.fill(1.0);
    DecodeOverrides o;
    o.chunked_state_pass = 3;
    o.chunked_state_columns = 32;
    check_chunked("wgmma state pass, beta 1", d, true, -1, o);
    d.g.fill(-30.0);
    check_chunked("wgmma state pass, beta 1, g=-30", d, true, -1, o);
  }
}

// Exact segment split of the state pass (src/core/heuristics.h cuda_chunked_segment_chunks;
// forced here through DecodeOverrides::chunked_segments: -1 off, n > 0 chunks per segment): a
// long single sequence, varlen with one long sequence among short, empty and 1-token ones, and
// g = -30 (each step forgets the state, so the maps M are ~0), against the float64 reference,
// with the saved chunk states (each segment's from its true start) against the CPU path's.
TEST(CudaChunkedForward, SegmentSplit) {
  REQUIRE_GPU();
  for (int seg : {-1, 1, 3, 16})
    for (DType dtype : {DType::bf16, DType::f32})
      for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
        Case c = base_case(1, 64 * 40 + 5, 1, 2, 64, dtype);
        c.gate = gate;
        c.layout = seg == 3 ? StateLayout::v_first : StateLayout::k_first;
        c.Dv = seg == 16 ? 128 : 64;
        check_chunked("segments, one sequence", c, seg == 3, seg);
      }
  for (int seg : {2, 5})
    for (DType dtype : {DType::bf16, DType::f32}) {
      Case c = base_case(1, 0, 2, 4, 64, dtype);
      c.seqlens = {3, 0, 64 * 30 + 7, 1, 65, 200, 0};
      c.gate = seg == 5 ? GateKind::per_key : GateKind::scalar;
      c.mask = seg == 5;
      check_chunked("segments, varlen", c, seg == 2, seg);
    }
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c = base_case(2, 64 * 12 + 30, 1, 2, 64);
    c.gate = gate;
    TestData d = make_problem(c);
    d.g.fill(-30.0);
    check_chunked("segments, g=-30", d, false, 2);
  }
}

// The state pass's forced shapes (DecodeOverrides::chunked_state_columns / _buffers /
// chunked_overlap): 16 and 32 value columns, one and two W / Kd buffers, the output kernel after
// the state pass or overlapped with it, both scratch types, with and without row factors.
TEST(CudaChunkedForward, StatePassShapes) {
  REQUIRE_GPU();
  for (int bv : {16, 32})
    for (int nbuf : {1, 2})
      for (int overlap : {1, 2})
        for (DType dtype : {DType::bf16, DType::f32}) {
          Case c = base_case(1, 64 * 6 + 9, 2, 4, 128, dtype);
          c.mask = nbuf == 1;  // bf16: stored Qs / Kd with the mask, row factors without
          DecodeOverrides o;
          o.chunked_state_columns = bv;
          o.chunked_state_buffers = nbuf;
          o.chunked_overlap = overlap;
          check_chunked("state pass shapes", c, bv == 16, -1, o);
        }
}

// The output computed inside the bf16 state pass (DecodeOverrides::chunked_overlap = 3,
// state_pass_bf16_kernel<BV, true>) does the output kernel's arithmetic on the same operands: o
// and the final state bit-identical to the overlapped output kernel's (2) without `saved` and with
// bf16 `saved` (S's hi part, the bf16 chunk state, in q S), at 16 and 32 value columns, varlen
// with empty and 1-token sequences, GQA, a partial last chunk.
TEST(CudaChunkedForward, FusedOutput) {
  REQUIRE_GPU();
  for (int bv : {16, 32})
    for (bool varlen : {false, true}) {
      Case c = base_case(varlen ? 1 : 2, varlen ? 0 : 64 * 4 + 17, 2, 4, 128);
      c.gate = GateKind::scalar;
      c.h0 = c.final_state = true;
      c.qk_l2norm = varlen;
      if (varlen) c.seqlens = {130, 0, 1, 64, 300};
      TestData d = make_problem(c);
      const ForwardResult ref = reference_forward(d);
      for (bool saved_bf16 : {false, true}) {
        DecodeOverrides kernel, fused;
        kernel.chunked_state_columns = fused.chunked_state_columns = bv;
        kernel.chunked_overlap = 2;
        fused.chunked_overlap = 3;
        const DeviceRun want = run_chunked(d, saved_bf16, nullptr, kernel, saved_bf16);
        const DeviceRun got = run_chunked(d, saved_bf16, nullptr, fused, saved_bf16);
        const std::string label = "fused output: " + describe(c, d.seed) + " bv " +
                                  std::to_string(bv) + (saved_bf16 ? " (bf16 saved)" : "");
        note("fused output", got.r, ref);
        expect_forward_close(got.r, ref, forward_tolerance(c), label);
        ASSERT_EQ(got.r.o.size(), want.r.o.size()) << label;
        for (std::size_t i = 0; i < want.r.o.size(); ++i)
          ASSERT_EQ(got.r.o[i], want.r.o[i]) << label << ": o element " << i;
        ASSERT_EQ(got.r.final_state, want.r.final_state) << label << ": final state";
        if (saved_bf16) {
          ASSERT_EQ(got.saved, want.saved) << label << ": saved chunk states";
        }
      }
    }
}

// 4096 tokens at beta 1 and mild decay, h0 and the final state (Dk = Dv = 128, one key head, two
// value heads): the regime where the float64 model of the bf16 roundings
// (bench/cuda_chunked_error_model.py) puts the largest error, so that a rounding that accumulated
// over the chunks would show.
TestData beta_one_long_problem() {
  Case c = base_case(1, 4096, 1, 2, 128);
  c.decay = Decay::mild;
  c.h0 = c.final_state = true;
  TestData d = make_problem(c);
  d.beta.fill(1.0);
  return d;
}

// The bf16 pass with single products (DecodeOverrides::chunked_state_pass = 4: S and diag(fk) Vnew
// rounded to bf16 as the products' operands, the output inside the pass) against the float64
// reference at the tensor-core bar: both column widths and layouts, mild, strong and extreme
// decay, varlen with empty and 1-token sequences, the saved fp32 chunk states (the training
// forward) against the CPU path's, and 4096 tokens at beta 1 and mild decay (the regime where the
// float64 model's error is largest: a rounding that accumulated would show), then at g = -30.
TEST(CudaChunkedForward, SingleProductStatePass) {
  REQUIRE_GPU();
  DecodeOverrides single;
  single.chunked_state_pass = 4;
  for (int bv : {16, 32})
    for (Decay decay : {Decay::mild, Decay::strong, Decay::extreme}) {
      Case c = base_case(2, 64 * 3 + 5, 2, 4, 128);
      c.decay = decay;
      c.h0 = c.final_state = true;
      c.layout = bv == 16 ? StateLayout::v_first : StateLayout::k_first;
      DecodeOverrides o = single;
      o.chunked_state_columns = bv;
      check_chunked("single products", c, decay == Decay::mild, 0, o);
    }
  {
    Case c = base_case(1, 0, 2, 4, 128);
    c.seqlens = {130, 0, 1, 64, 300};
    c.h0 = c.final_state = true;
    check_chunked("single products, varlen", c, true, 0, single);
  }
  TestData d = beta_one_long_problem();
  check_chunked("single products, beta 1, 4096 tokens", d, false, 0, single);
  d.g.fill(-30.0);
  check_chunked("single products, beta 1, g=-30", d, false, 0, single);
}

// The cases of the single-product passes' variants (forced by `o`, labelled `family`): layouts,
// mild, strong and extreme decay, GQA, T not a multiple of the chunk, h0 and the final state, the
// saved fp32 and bf16 chunk states against the CPU path's; varlen with empty and 1-token sequences
// and the fused options; 4096 tokens at beta 1, then g = -30.
void check_single_pass_variant(const std::string& family, const DecodeOverrides& o) {
  for (Decay decay : {Decay::mild, Decay::strong, Decay::extreme}) {
    Case c = base_case(2, 64 * 3 + 5, 2, 4, 128);
    c.decay = decay;
    c.h0 = c.final_state = true;
    c.layout = decay == Decay::strong ? StateLayout::v_first : StateLayout::k_first;
    check_chunked(family, c, decay != Decay::extreme, 0, o);
  }
  {
    Case c = base_case(1, 64 * 2 + 40, 1, 2, 128);
    c.h0 = c.final_state = true;
    check_chunked(family + " (bf16 saved)", c, true, 0, o, true);
  }
  {
    Case c = base_case(1, 0, 2, 4, 128);
    c.seqlens = {130, 0, 1, 64, 300};
    c.h0 = c.final_state = true;
    c.gate_in_kernel = c.beta_sigmoid = c.qk_l2norm = true;
    check_chunked(family + ", varlen, fused options", c, true, 0, o);
  }
  TestData d = beta_one_long_problem();
  check_chunked(family + ", beta 1, 4096 tokens", d, false, 0, o);
  d.g.fill(-30.0);
  check_chunked(family + ", beta 1, g=-30", d, false, 0, o);
}

// The warp-specialised single-product pass (state_pass_ws_kernel.cuh, DecodeOverrides::
// chunked_state_pass = 6: a state warpgroup, an output warpgroup one chunk behind, a producer
// warp, mbarriers between them) against the float64 reference at the tensor-core bar: both
// layouts, mild, strong and extreme decay, GQA, T not a multiple of the chunk, h0 and the final
// state; the saved chunk states (fp32 and bf16) against the CPU path's; varlen with empty and
// 1-token sequences and the fused options; 4096 tokens at beta 1 (64 chunks: every buffer reused
// many times, so that a wrong barrier phase would hang or corrupt), then g = -30.
TEST(CudaChunkedForward, WarpSpecialisedStatePass) {
  REQUIRE_GPU();
  DecodeOverrides ws;
  ws.chunked_state_pass = 6;
  ws.chunked_state_columns = 32;
  check_single_pass_variant("warp-specialised pass", ws);
}

// The fused pass (fused_pass_kernel.cuh, DecodeOverrides::chunked_state_pass = 5: Vnew = T~ (V -
// diag(ek) K S) on chip from prep's fused mode, warpgroup products; 128, 64 or 32 value columns
// per block by chunked_state_columns) against the float64 reference at the tensor-core bar: both
// layouts, mild, strong and extreme decay, GQA, T not a multiple of the chunk, h0 and the final
// state, each column width; the saved chunk states (fp32 and bf16, the training forward) against
// the CPU path's; varlen with empty and 1-token sequences and the fused gate, beta sigmoid and
// q / k L2 norm (prep's part of the algebra); 4096 tokens at beta 1 and mild decay (also with one
// stage of copies, chunked_state_buffers = 1), then g = -30; the warpgroup prep (chunked_prep = 3)
// feeding it.
TEST(CudaChunkedForward, FusedStatePass) {
  REQUIRE_GPU();
  DecodeOverrides fused;
  fused.chunked_state_pass = 5;
  fused.chunked_state_columns = 128;
  auto columns = [&](int bv) {
    DecodeOverrides o = fused;
    o.chunked_state_columns = bv;
    return o;
  };
  for (int bv : {128, 64, 32})
    for (Decay decay : {Decay::mild, Decay::strong, Decay::extreme}) {
      Case c = base_case(2, 64 * 3 + 5, 2, 4, 128);
      c.decay = decay;
      c.h0 = c.final_state = true;
      c.layout = decay == Decay::strong ? StateLayout::v_first : StateLayout::k_first;
      check_chunked("fused pass, " + std::to_string(bv) + " columns", c, decay != Decay::extreme, 0,
                    columns(bv));
    }
  for (int bv : {128, 32}) {
    Case c = base_case(1, 64 * 2 + 40, 1, 2, 128);
    c.h0 = c.final_state = true;
    check_chunked("fused pass (bf16 saved), " + std::to_string(bv) + " columns", c, true, 0,
                  columns(bv), true);
  }
  for (int bv : {128, 64}) {
    Case c = base_case(1, 0, 2, 4, 128);
    c.seqlens = {130, 0, 1, 64, 300};
    c.h0 = c.final_state = true;
    c.gate_in_kernel = c.beta_sigmoid = c.qk_l2norm = true;
    check_chunked("fused pass, varlen, fused options, " + std::to_string(bv) + " columns", c, true,
                  0, columns(bv));
  }
  TestData d = beta_one_long_problem();
  check_chunked("fused pass, beta 1, 4096 tokens", d, false, 0, fused);
  check_chunked("fused pass, beta 1, 4096 tokens, 32 columns", d, false, 0, columns(32));
  for (int bv : {64, 32}) {  // one stage of copies (two blocks per SM)
    DecodeOverrides one = columns(bv);
    one.chunked_state_buffers = 1;
    check_chunked("fused pass, beta 1, 4096 tokens, one stage, " + std::to_string(bv) + " columns",
                  d, false, 0, one);
  }
  DecodeOverrides wg = fused;
  wg.chunked_prep = 3;
  check_chunked("fused pass, warpgroup prep", d, false, 0, wg);
  d.g.fill(-30.0);
  check_chunked("fused pass, beta 1, g=-30", d, false, 0, fused);
}

// The rule's choice where sequences x value heads fill the SMs (chunked_forward.cu
// fused_state_pass: the fused pass, 128 columns; the other tests have fewer rows and take the bf16
// pass): B = ceil(SMs / Hv) sequences, h0 and the final state, the saved fp32 chunk states
// against the CPU path's, then varlen with empty and 1-token sequences among them.
TEST(CudaChunkedForward, RuleAtManyBlocks) {
  REQUIRE_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const std::int64_t Hv = 16, B = (sms + Hv - 1) / Hv;
  Case c = base_case(B, 64 * 2 + 11, 4, Hv, 128);
  c.h0 = c.final_state = true;
  check_chunked("rule, B x Hv >= SMs", c, true);
  Case v = base_case(1, 0, 4, Hv, 128);
  for (std::int64_t n = 0; n < B + 2; ++n) v.seqlens.push_back(n % 5 == 0 ? 0 : 1 + 37 * n % 150);
  v.h0 = v.final_state = true;
  check_chunked("rule, varlen, N x Hv >= SMs", v, true);
}

TEST(CudaChunkedForward, LongSequence) {
  REQUIRE_GPU();
  Case c = base_case(1, 1 << 17, 1, 1, 64);
  c.decay = Decay::mild;
  check_chunked("2^17 tokens", c);
}

// A varlen call on `path` captured in a CUDA graph and replayed: its output equals the eager
// call's (no host copy or synchronisation inside the call: cu_seqlens is read on the device).
void graph_capture_varlen(Path path) {
  Case c = base_case(1, 0, 2, 4, 128);
  c.seqlens = {100, 0, 1, 300, 64};
  TestData d = make_problem(c);
  const ForwardResult ref = reference_forward(d);
  cudaStream_t stream;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  ForwardParams host = d.forward_params();
  DeviceMirror m;
  ForwardParams p = mirror_forward_params(m, host);
  ExecConfig cfg;
  cfg.path = path;
  cfg.stream = stream;
  forward(p, cfg);  // eager
  cuda_check(cudaStreamSynchronize(stream), "eager");
  DeviceMirror::to_host(p.o, host.o);
  DeviceMirror::to_host(p.final_state, host.final_state);
  const std::vector<double> eager_o = d.o.to_double(), eager_s = d.final_state.to_double();
  ForwardResult eager{eager_o, eager_s};
  expect_forward_close(eager, ref, forward_tolerance(d.c), "graph case, eager");
  cudaGraph_t graph;
  cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  forward(p, cfg);
  cuda_check(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < 2; ++rep) {
    cuda_check(cudaMemset(p.o.data, 0xff, span_bytes(p.o)), "poison o");
    cuda_check(cudaMemset(p.final_state.data, 0xff, span_bytes(p.final_state)), "poison state");
    cuda_check(cudaGraphLaunch(exec, stream), "graph launch");
    cuda_check(cudaStreamSynchronize(stream), "replay");
    DeviceMirror::to_host(p.o, host.o);
    DeviceMirror::to_host(p.final_state, host.final_state);
    EXPECT_EQ(d.o.to_double(), eager_o) << "replay " << rep;
    EXPECT_EQ(d.final_state.to_double(), eager_s) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(CudaChunkedForward, GraphCaptureVarlen) {
  REQUIRE_GPU();
  graph_capture_varlen(Path::chunkwise);
}

TEST(CudaRecurrentForward, GraphCaptureVarlen) {
  REQUIRE_GPU();
  graph_capture_varlen(Path::sequential);
}

// Path::automatic on cuda: the chunked forward above kCudaRecurrentMaxTokens tokens per sequence
// (and at most kCudaChunkedMaxRows value-head rows).
TEST(CudaChunkedForward, AutomaticAndRefusals) {
  REQUIRE_GPU();
  TestData d = make_problem(base_case(1, 400, 1, 2, 64));
  const ForwardResult ref = reference_forward(d);
  const ForwardResult got = run_forward_cuda(d, nullptr, Path::automatic);
  expect_forward_close(got, ref, forward_tolerance(d.c), "automatic");
  // Chunk intermediates are refused on cuda.
  TestData e = make_problem(base_case(1, 70, 1, 2, 64));
  HostTensor inter = make_saved(e, 64, SavedContent::chunk_intermediates);
  ForwardParams host = e.forward_params();
  DeviceMirror m;
  ForwardParams p = host;
  p.in.q = m.to_device(host.in.q);
  p.in.k = m.to_device(host.in.k);
  p.in.v = m.to_device(host.in.v);
  p.in.g = m.to_device(host.in.g);
  p.in.beta = m.to_device(host.in.beta);
  p.in.h0 = m.to_device(host.in.h0);
  p.o = m.to_device(host.o);
  p.final_state = m.to_device(host.final_state);
  p.saved = m.to_device(inter.view());
  EXPECT_THROW(forward(p, ExecConfig{}), InvalidArgument);
}

}  // namespace
}  // namespace gdr::test
