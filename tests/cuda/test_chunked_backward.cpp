// GPU tests of the CUDA chunked backward (src/cuda/chunked/chunked_backward.cu; gdr::backward on
// cuda tensors): every gradient (dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0) against the float64
// reference backward on the same rounded inputs, gradients poisoned with NaN before each call,
// within docs/operator.md §7's bar (1e-2 for f16/bf16 inputs, 1e-4 for fp32 inputs); with the
// chunk states recomputed and read from the CUDA forward's `saved`; two runs bit-identical; a
// CUDA-graph capture of a varlen call.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
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

// Largest error seen per (case family, gradient), printed at the end of the run for the report.
std::map<std::string, double>& worst() {
  static std::map<std::string, double> m;
  return m;
}
struct WorstPrinter : ::testing::Environment {
  void TearDown() override {
    for (const auto& [name, e] : worst())
      std::printf("[chunked bwd max rel err] %-40s %.3e\n", name.c_str(), e);
  }
};
const auto* const kPrinter = ::testing::AddGlobalTestEnvironment(new WorstPrinter);

void note(const std::string& family, const BackwardResult& got, const BackwardResult& ref) {
  for (const Field& f : fields(got, ref)) {
    if (f.ref->empty()) continue;
    double& w = worst()[family + " " + f.name];
    w = std::max(w, rel_error(*f.got, *f.ref));
  }
}

// The CUDA chunked forward with `saved` (chunk states, poisoned first) on device copies; returns
// the device saved tensor (owned by `m`).
// `forced`: the forward's DecodeOverrides (segment split, overlap), or null for its rules.
// saved_bf16: the saved tensor in bf16 (16-bit inputs; validate_saved).
TensorView forward_saved(TestData& d, DeviceMirror& m, const DecodeOverrides* forced = nullptr,
                         bool saved_bf16 = false) {
  HostTensor saved_host = make_saved(d, 64, SavedContent::chunk_states);
  if (saved_bf16) {
    const TensorView v = saved_host.view();
    saved_host = HostTensor(DType::bf16, {v.shape[0], v.shape[1], v.shape[2]});
    saved_host.poison();
  }
  ForwardParams p = mirror_forward_params(m, d.forward_params());
  p.saved = m.to_device(saved_host.view());
  ExecConfig cfg;
  cfg.path = Path::chunkwise;
  cfg.decode_overrides = forced;
  forward(p, cfg);
  cuda_check(cudaDeviceSynchronize(), "chunked forward");
  return p.saved;
}

// One case: the CUDA backward (states recomputed, and when with_saved also read from the CUDA
// forward's saved tensor) against the float64 reference, and (recomputed states) against the CPU
// chunkwise backward on the same inputs in the same dtype.
void check_backward(const std::string& family, TestData d, bool with_saved = true) {
  const BackwardResult ref = reference_backward(d);
  const std::string label = family + ": " + describe(d.c, d.seed);
  const double tol = backward_tolerance(d.c);
  const BackwardResult cpu = run_backward(d, Path::chunkwise);
  const BackwardResult got = run_backward_cuda(d);
  note(family, got, ref);
  note(family + " (vs CPU chunkwise)", got, cpu);
  expect_backward_close(got, ref, tol, label + " (recomputed states)");
  expect_backward_close(got, cpu, tol, label + " (recomputed states, against the CPU chunkwise)");
  if (with_saved) {
    DeviceMirror m;
    const TensorView saved = forward_saved(d, m);
    const BackwardResult got_saved = run_backward_cuda(d, nullptr, saved);
    note(family + " (saved)", got_saved, ref);
    expect_backward_close(got_saved, ref, tol, label + " (saved chunk states)");
  }
}

// got and ref bit for bit: every gradient the same size and every element the same bits; `what`
// names the pair in the message. Call it through ASSERT_NO_FATAL_FAILURE to stop at the first.
void expect_bit_identical(const BackwardResult& got, const BackwardResult& ref,
                          const std::string& what) {
  for (const Field& f : fields(got, ref)) {
    ASSERT_EQ(f.got->size(), f.ref->size()) << f.name << ": " << what;
    for (std::size_t i = 0; i < f.got->size(); ++i)
      ASSERT_EQ(std::memcmp(&(*f.got)[i], &(*f.ref)[i], sizeof(double)), 0)
          << f.name << " differs at " << i << ": " << what;
  }
}

void check_backward(const std::string& family, const Case& c, bool with_saved = true) {
  check_backward(family, make_problem(c), with_saved);
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

TEST(CudaChunkedBackward, Lengths) {
  REQUIRE_GPU();
  for (std::int64_t T : {0, 1, 63, 64, 65, 200})
    for (DType dtype : {DType::bf16, DType::f32}) {
      Case c = base_case(2, T, 1, 2, 64, dtype);
      c.layout = T % 2 ? StateLayout::v_first : StateLayout::k_first;
      c.h0 = T != 64;
      c.final_state = T != 65;  // dfinal_state given or not
      check_backward(dtype == DType::f32 ? "lengths f32" : "lengths bf16", c);
    }
}

TEST(CudaChunkedBackward, DecayRegimes) {
  REQUIRE_GPU();
  for (Decay decay : {Decay::mild, Decay::strong, Decay::extreme})
    for (GateKind gate : {GateKind::scalar, GateKind::per_key})
      for (DType dtype : {DType::bf16, DType::f32}) {
        Case c = base_case(1, 200, 1, 2, 64, dtype);
        c.decay = decay;
        c.gate = gate;
        check_backward(std::string("decay ") + std::string(to_string(decay)) +
                           (gate == GateKind::per_key ? " per-key" : " scalar"),
                       c);
      }
  // g = -30 everywhere (each step forgets the state entirely): dg must keep its relative accuracy.
  for (GateKind gate : {GateKind::scalar, GateKind::per_key})
    for (DType dtype : {DType::bf16, DType::f32}) {
      Case c = base_case(1, 130, 1, 2, 64, dtype);
      c.gate = gate;
      TestData d = make_problem(c);
      d.g.fill(-30.0);
      check_backward("decay g=-30", d);
    }
}

TEST(CudaChunkedBackward, BetaZeroAndOne) {
  REQUIRE_GPU();
  for (double beta : {0.0, 1.0})
    for (DType dtype : {DType::bf16, DType::f32}) {
      TestData d = make_problem(base_case(2, 150, 2, 4, 64, dtype));
      d.beta.fill(beta);
      check_backward("beta 0/1", d);
    }
}

TEST(CudaChunkedBackward, HeadDimsGatesLayouts) {
  REQUIRE_GPU();
  for (std::int64_t Dk : {64, 128, 256})
    for (std::int64_t Dv : {64, 128, 256})
      for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
        Case c = base_case(1, 100 + Dk / 64, 1, 2, 64, (Dk + Dv) % 3 ? DType::bf16 : DType::f16);
        c.Dk = Dk;
        c.Dv = Dv;
        c.gate = gate;
        c.layout = (Dk == Dv) ? StateLayout::v_first : StateLayout::k_first;
        check_backward("head dims", c, Dk == Dv);
      }
}

TEST(CudaChunkedBackward, GroupedHeadsMaskFused) {
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
      c.layout = opts == 3 ? StateLayout::v_first : StateLayout::k_first;
      check_backward(std::string("gqa/mask/fused ") + std::to_string(opts), c);
    }
}

TEST(CudaChunkedBackward, Varlen) {
  REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f32})
    for (bool i64 : {false, true}) {
      Case c = base_case(1, 0, 1, 4, 64, dtype);
      c.seqlens = {0, 1, 65, 0, 200, 64, 1, 3};
      c.cu_seqlens_i64 = i64;
      c.gate = i64 ? GateKind::per_key : GateKind::scalar;
      c.mask = !i64;
      c.gate_in_kernel = i64;
      c.layout = i64 ? StateLayout::v_first : StateLayout::k_first;
      check_backward("varlen", c);
    }
}

// Enough value heads for the reverse pass's 32-column blocks (more than half the SMs busy).
TEST(CudaChunkedBackward, WideReversePass) {
  REQUIRE_GPU();
  Case c = base_case(3, 130, 4, 16, 128);
  c.gate = GateKind::scalar;
  check_backward("wide reverse pass", c);
}

// The forward's rule where sequences x value heads fill the SMs (the fused pass, 128 columns:
// chunked_forward.cu fused_state_pass) writes the chunk states the backward reads: B = ceil(SMs /
// Hv) sequences, h0 and dht given.
TEST(CudaChunkedBackward, ForwardRuleAtManyBlocks) {
  REQUIRE_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const std::int64_t Hv = 16;
  Case c = base_case((sms + Hv - 1) / Hv, 64 + 30, 4, Hv, 128);
  c.gate = GateKind::scalar;
  c.h0 = c.final_state = true;
  check_backward("forward rule at many blocks", c);
}

// The saved chunk states written by the forward's fwd-fast modes (bf16 scratch with row factors:
// scalar gate, bf16, no mask; the exact segment split, forced to 2 chunks per segment; the state
// pass with the output kernel overlapped, or not; bf16 saved states) feed the backward, which
// recomputes W, U, Vnew in fp32 (chunked_host.cuh launch_prep_fp32) from them.
TEST(CudaChunkedBackward, SavedFromForwardModes) {
  REQUIRE_GPU();
  for (int mode = 0; mode < 4; ++mode)
    for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
      Case c = base_case(1, 0, 2, 4, 64);
      c.seqlens = {330, 70, 1};
      c.gate = gate;
      c.decay = Decay::strong;
      c.h0 = c.final_state = true;
      TestData d = make_problem(c);
      const BackwardResult ref = reference_backward(d);
      DecodeOverrides forced;
      if (mode == 0) forced.chunked_segments = 2;   // split (maps, combine, segments)
      if (mode == 1) forced.chunked_overlap = 2;    // unsplit, output kernel overlapped
      if (mode == 2) forced.chunked_segments = -1;  // unsplit, no overlap
      if (mode == 2) forced.chunked_overlap = 1;
      // mode 3: bf16 saved chunk states (the backward widens them to fp32 as it reads), windows of
      // 3 chunk slots.
      DeviceMirror m;
      const TensorView saved = forward_saved(d, m, &forced, mode == 3);
      if (mode == 3) forced.chunked_backward_window = 3;
      const BackwardResult got = run_backward_cuda(d, nullptr, saved, Path::automatic, &forced);
      const std::string family = "saved from fwd mode " + std::to_string(mode);
      note(family, got, ref);
      expect_backward_close(got, ref, backward_tolerance(c), family + ": " + describe(c, d.seed));
    }
}

// The fused backward's cases (scalar gate, bf16, Dk = Dv = 128): lengths around the chunk, decay
// regimes up to g = -30, beta 0 and 1, varlen with empty and 1-token sequences, GQA with every
// fused option, both layouts, h0 and dfinal_state.
std::vector<std::pair<std::string, TestData>> fused_cases() {
  std::vector<std::pair<std::string, TestData>> cases;
  for (std::int64_t T : {1, 63, 64, 65, 200}) {
    // At T = 1, dg holds one entry per value head, each a sum over the whole state (h0 . dS) that
    // can cancel: with bf16 saved states (h0 rounded, 2^-9 per entry) two heads' relative error
    // went past the 1e-2 bar on an unlucky seed (1.4e-2; 2.3e-3 on another). Eight value heads
    // make the norm of dg robust to one cancelling head; the rounding itself is the same.
    Case c = T == 1 ? base_case(1, T, 2, 8, 128) : base_case(1, T, 1, 2, 128);
    c.layout = T % 2 ? StateLayout::v_first : StateLayout::k_first;
    c.h0 = T != 64;
    c.final_state = T != 65;
    cases.emplace_back("fused T=" + std::to_string(T), make_problem(c));
  }
  for (Decay decay : {Decay::mild, Decay::strong, Decay::extreme}) {
    Case c = base_case(1, 190, 2, 4, 128);
    c.decay = decay;
    cases.emplace_back(std::string("fused decay ") + std::string(to_string(decay)),
                       make_problem(c));
  }
  {
    TestData d = make_problem(base_case(1, 130, 1, 2, 128));
    d.g.fill(-30.0);
    cases.emplace_back("fused g=-30", std::move(d));
  }
  for (double beta : {0.0, 1.0}) {
    TestData d = make_problem(base_case(1, 150, 2, 4, 128));
    d.beta.fill(beta);
    cases.emplace_back("fused beta " + std::to_string(static_cast<int>(beta)), std::move(d));
  }
  {
    Case c = base_case(1, 0, 2, 4, 128);
    c.seqlens = {0, 1, 65, 0, 200, 64, 1, 3};
    c.decay = Decay::strong;
    cases.emplace_back("fused varlen", make_problem(c));
  }
  {
    Case c = base_case(2, 130, 2, 8, 128);  // Hv / Hk = 4, every fused option
    c.gate_in_kernel = c.beta_sigmoid = c.qk_l2norm = true;
    c.gates_in_dtype = true;
    c.layout = StateLayout::v_first;
    cases.emplace_back("fused gqa options", make_problem(c));
  }
  return cases;
}

// The fused bf16 kernel for bwd_dvb + bwd_key (bwd_chunk_bf16_kernel.cuh: scalar gate, bf16, no
// mask, Dk = Dv = 128) with the bf16 reverse pass (bwd_state_bf16_kernel.cuh) or the general one,
// the bf16 prep's backward mode or the fp32 prep, and the general kernels
// (DecodeOverrides::chunked_backward_fused = 2, 3, 4, 1) on the same calls,
// both within the bar of the float64 reference: lengths around the chunk, decay regimes up to g =
// -30 everywhere, beta 0 and 1, varlen with empty and 1-token sequences, GQA, the fused options,
// both layouts, h0 and dfinal_state; states recomputed, read from the forward's fp32 saved record,
// and from its bf16 one by windows of 3 chunk slots; the fused kernel's row sums by the whole
// block (DecodeOverrides::chunked_backward_rows = 2) against the reference and run to run.
TEST(CudaChunkedBackward, FusedChunkKernel) {
  REQUIRE_GPU();
  auto cases = fused_cases();
  for (auto& [family, d] : cases) {
    const BackwardResult ref = reference_backward(d);
    const double tol = backward_tolerance(d.c);
    DeviceMirror m, m16;
    const TensorView saved = forward_saved(d, m);
    const TensorView saved16 = forward_saved(d, m16, nullptr, true);
    for (int rule : {1, 2, 3, 4}) {
      DecodeOverrides forced;
      forced.chunked_backward_fused = rule;
      const std::string label = family + (rule == 1   ? " general"
                                          : rule == 2 ? " fused"
                                          : rule == 3 ? " fused, general pass"
                                                      : " fused, fp32 prep");
      const BackwardResult got = run_backward_cuda(d, nullptr, {}, Path::automatic, &forced);
      note(label, got, ref);
      expect_backward_close(got, ref, tol, label + " (recomputed): " + describe(d.c, d.seed));
      const BackwardResult got_saved =
          run_backward_cuda(d, nullptr, saved, Path::automatic, &forced);
      note(label + " (saved)", got_saved, ref);
      expect_backward_close(got_saved, ref, tol, label + " (saved): " + describe(d.c, d.seed));
      forced.chunked_backward_window = 3;
      const BackwardResult got16 = run_backward_cuda(d, nullptr, saved16, Path::automatic, &forced);
      note(label + " (bf16 saved, windows)", got16, ref);
      expect_backward_close(got16, ref, tol,
                            label + " (bf16 saved, windows): " + describe(d.c, d.seed));
      if (rule == 2) {  // phase C's row sums by the whole block (chunked_backward_rows = 2)
        DecodeOverrides rows = forced;
        rows.chunked_backward_rows = 2;
        const BackwardResult by_block =
            run_backward_cuda(d, nullptr, saved, Path::automatic, &rows);
        note(label + " (saved, rows by block)", by_block, ref);
        expect_backward_close(by_block, ref, tol,
                              label + " (saved, rows by block): " + describe(d.c, d.seed));
        const BackwardResult again = run_backward_cuda(d, nullptr, saved, Path::automatic, &rows);
        ASSERT_NO_FATAL_FAILURE(expect_bit_identical(again, by_block, label + " (rows by block)"));
      }
    }
    // Given saved states, rule 5 has the bf16 prep write the reverse pass's operands in bf16; rule
    // 2 keeps them fp32 and the pass rounds them as it stages them: the same roundings, so the
    // gradients must be bit-identical. So must the chunk kernel's L2 prefetches (hints only) and
    // its q, k rows read raw and scaled by the prep's norms (the same fp32 products), and dVnew
    // handed from the reverse pass in bf16 (the rounding the chunk kernel makes as it stages it).
    for (const TensorView* sv : {&saved, &saved16}) {
      DecodeOverrides op32, op16, prefetch, raw_qk, dvn16;
      op32.chunked_backward_fused = prefetch.chunked_backward_fused = 2;
      raw_qk.chunked_backward_fused = dvn16.chunked_backward_fused = 2;
      op16.chunked_backward_fused = 5;
      prefetch.chunked_backward_prefetch = 2;
      raw_qk.chunked_backward_qk = 2;
      dvn16.chunked_backward_dvn = 2;
      op32.chunked_backward_window = op16.chunked_backward_window = 3;
      prefetch.chunked_backward_window = raw_qk.chunked_backward_window = 3;
      dvn16.chunked_backward_window = 3;
      const BackwardResult y = run_backward_cuda(d, nullptr, *sv, Path::automatic, &op32);
      for (const DecodeOverrides* other : {&op16, &prefetch, &raw_qk, &dvn16}) {
        const BackwardResult x = run_backward_cuda(d, nullptr, *sv, Path::automatic, other);
        const char* what = other == &op16       ? ", bf16 against fp32 reverse-pass operands"
                           : other == &prefetch ? ", with against without L2 prefetch"
                           : other == &raw_qk   ? ", raw q, k rows against the prep's fp32 rows"
                                                : ", dVnew handed over in bf16 against fp32";
        ASSERT_NO_FATAL_FAILURE(expect_bit_identical(
            x, y, family + (sv == &saved ? " (saved)" : " (bf16 saved)") + what));
      }
    }
  }
}

// The reverse pass on warpgroup products (bwd_state_wgmma_kernel.cuh, DecodeOverrides::
// chunked_backward_fused = 6) given the forward's states (fp32 and bf16, whole and by windows of 3
// chunk slots; the forward on its warpgroup-product state pass too, chunked_state_pass = 3):
// every gradient against the float64 reference, and against rule 5 (the same roundings of the
// operands, products summed in another order) within the same bar, also with the recompute's
// prep on warpgroup products (chunked_prep = 3), on fused_cases() and a varlen batch of more
// blocks than SMs (the pass's one-stage form).
TEST(CudaChunkedBackward, WgmmaReversePass) {
  REQUIRE_GPU();
  auto cases = fused_cases();
  {  // more blocks (sequences x value heads x 4) than SMs: the pass's one-stage form
    Case c = base_case(1, 0, 1, 2, 128);
    for (int n = 0; n < 48; ++n) c.seqlens.push_back(1 + (37 * n) % 150);
    c.h0 = c.final_state = true;
    cases.emplace_back("wgmma pass, 384 blocks", make_problem(c));
  }
  for (auto& [family, d] : cases) {
    const BackwardResult ref = reference_backward(d);
    const double tol = backward_tolerance(d.c);
    DecodeOverrides fwd;
    fwd.chunked_state_pass = 3;
    fwd.chunked_state_columns = 32;
    DeviceMirror m, m16;
    const TensorView saved = forward_saved(d, m, &fwd);
    const TensorView saved16 = forward_saved(d, m16, &fwd, true);
    for (const TensorView* sv : {&saved, &saved16})
      for (int window : {0, 3}) {
        const std::string label = family + (sv == &saved ? " (saved)" : " (bf16 saved)") +
                                  (window ? ", windows" : "") + ": " + describe(d.c, d.seed);
        DecodeOverrides rule5, rule6, prep3;
        rule5.chunked_backward_fused = 5;
        rule6.chunked_backward_fused = prep3.chunked_backward_fused = 6;
        prep3.chunked_prep = 3;  // the recompute's prep on warpgroup products too
        rule5.chunked_backward_window = rule6.chunked_backward_window = window;
        prep3.chunked_backward_window = window;
        const BackwardResult got = run_backward_cuda(d, nullptr, *sv, Path::automatic, &rule6);
        note("wgmma reverse pass", got, ref);
        expect_backward_close(got, ref, tol, label);
        const BackwardResult got3 = run_backward_cuda(d, nullptr, *sv, Path::automatic, &prep3);
        note("wgmma reverse pass, wgmma prep", got3, ref);
        expect_backward_close(got3, ref, tol, label + ", wgmma prep");
        const BackwardResult bf16_pass =
            run_backward_cuda(d, nullptr, *sv, Path::automatic, &rule5);
        expect_backward_close(got, bf16_pass, tol, label + " against rule 5");
      }
  }
}

// Tinv by lanes and on the tensor cores (tinv.cuh, DecodeOverrides::chunked_tinv = 1, 3; by columns
// is the rule, which the other tests run) in the backward's recompute (the bf16 prep's backward
// mode and the general prep) and in the forward that saves the states: every gradient against the
// float64 reference, both gates, fp32 and bf16, g = -30.
TEST(CudaChunkedBackward, TinvSchedules) {
  REQUIRE_GPU();
  for (int tinv : {1, 3})
    for (GateKind gate : {GateKind::scalar, GateKind::per_key})
      for (DType dtype : {DType::bf16, DType::f32})
        for (bool g30 : {false, true}) {
          DecodeOverrides forced;
          forced.chunked_tinv = tinv;
          const std::string name = tinv == 1 ? "tinv by lanes" : "tinv on tensor cores";
          Case c = base_case(1, 64 * 2 + 9, 2, 4, 128, dtype);
          c.gate = gate;
          c.decay = Decay::strong;
          c.h0 = c.final_state = true;
          TestData d = make_problem(c);
          if (g30) d.g.fill(-30.0);
          const BackwardResult ref = reference_backward(d);
          const double tol = backward_tolerance(d.c);
          const std::string label = name + (g30 ? " g=-30" : "") + ": " + describe(d.c, d.seed);
          const BackwardResult got = run_backward_cuda(d, nullptr, {}, Path::automatic, &forced);
          note(name, got, ref);
          expect_backward_close(got, ref, tol, label + " (recomputed)");
          DeviceMirror m;
          const TensorView saved = forward_saved(d, m, &forced);
          const BackwardResult got_saved =
              run_backward_cuda(d, nullptr, saved, Path::automatic, &forced);
          note(name + " (saved)", got_saved, ref);
          expect_backward_close(got_saved, ref, tol, label + " (saved)");
        }
}

// Two runs of the same call give bit-identical gradients (no float atomics; fixed-order sums).
TEST(CudaChunkedBackward, Deterministic) {
  REQUIRE_GPU();
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c = base_case(1, 0, 2, 8, 128);
    c.seqlens = {300, 1, 129};
    c.gate = gate;
    c.gate_in_kernel = true;
    c.qk_l2norm = true;
    TestData d = make_problem(c);
    const BackwardResult a = run_backward_cuda(d);
    const BackwardResult b = run_backward_cuda(d);
    ASSERT_NO_FATAL_FAILURE(expect_bit_identical(a, b, "between two runs"));
  }
}

// The reverse pass by windows of chunk slots (the scratch of one window at a time, dS carried
// between windows; heuristics.h cuda_backward_window_slots), forced to 1, 2, 3 and 5 slots
// per window: sequences that start, end or lie wholly inside a window, empty and 1-token ones,
// h0, dfinal_state and the gate parameters (their per-chunk partials summed over every window).
// The gradients are bit-identical to one window's (the same arithmetic per chunk; the carry is
// the fp32 dS itself) and within the bar of the float64 reference.
TEST(CudaChunkedBackward, Windows) {
  REQUIRE_GPU();
  for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
    Case c = base_case(1, 0, 2, 4, 64, gate == GateKind::scalar ? DType::bf16 : DType::f32);
    c.seqlens = {0, 130, 1, 0, 200, 64, 3, 0};
    c.gate = gate;
    c.gate_in_kernel = gate == GateKind::per_key;
    c.h0 = c.final_state = true;
    TestData d = make_problem(c);
    const BackwardResult ref = reference_backward(d);
    DeviceMirror m;
    const TensorView saved = forward_saved(d, m);
    DecodeOverrides one;
    one.chunked_backward_window = 1 << 30;
    const BackwardResult whole = run_backward_cuda(d, nullptr, saved, Path::automatic, &one);
    expect_backward_close(whole, ref, backward_tolerance(c), "one window: " + describe(c, d.seed));
    for (int w : {1, 2, 3, 5}) {
      DecodeOverrides forced;
      forced.chunked_backward_window = w;
      const BackwardResult got = run_backward_cuda(d, nullptr, saved, Path::automatic, &forced);
      ASSERT_NO_FATAL_FAILURE(expect_bit_identical(
          got, whole, "windows of " + std::to_string(w) + " slots against one window"));
    }
  }
}

// ExecConfig::scratch: the forward and backward take their device scratch from the caller's
// allocator (as the Python layer passes torch's), release every byte they took, and give the
// same results as with cudaMallocAsync; an allocator that gives nothing makes the call fail with
// a RuntimeFailure naming the operation.
struct CountingAllocator {
  int taken = 0, released = 0;
  std::size_t bytes = 0;
  bool refuse = false;
  ScratchAllocator hooks() {
    ScratchAllocator s;
    s.context = this;
    s.allocate = [](void* self, std::size_t n, void* stream) -> void* {
      auto* c = static_cast<CountingAllocator*>(self);
      if (c->refuse) return nullptr;
      void* ptr = nullptr;
      if (cudaMallocAsync(&ptr, n, static_cast<cudaStream_t>(stream)) != cudaSuccess)
        return nullptr;
      ++c->taken;
      c->bytes += n;
      return ptr;
    };
    s.release = [](void* self, void* ptr, void* stream) {
      auto* c = static_cast<CountingAllocator*>(self);
      ++c->released;
      (void)cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
    };
    return s;
  }
};

TEST(CudaChunkedBackward, ScratchAllocator) {
  REQUIRE_GPU();
  Case c = base_case(1, 0, 2, 4, 64);
  c.seqlens = {300, 1, 70};
  c.h0 = c.final_state = true;
  TestData d = make_problem(c);
  CountingAllocator counter;
  const ScratchAllocator hooks = counter.hooks();
  const ForwardResult fwd_default = run_forward_cuda(d, nullptr, Path::chunkwise);
  const ForwardResult fwd = run_forward_cuda(d, nullptr, Path::chunkwise, nullptr, &hooks);
  EXPECT_EQ(fwd.o, fwd_default.o);
  EXPECT_EQ(fwd.final_state, fwd_default.final_state);
  EXPECT_GE(counter.taken, 1);
  EXPECT_EQ(counter.taken, counter.released);
  const int after_forward = counter.taken;
  const BackwardResult bwd_default = run_backward_cuda(d);
  const BackwardResult bwd = run_backward_cuda(d, nullptr, {}, Path::automatic, nullptr, &hooks);
  for (const Field& f : fields(bwd, bwd_default)) EXPECT_EQ(*f.got, *f.ref) << f.name;
  EXPECT_GT(counter.taken, after_forward);
  EXPECT_EQ(counter.taken, counter.released);
  EXPECT_GT(counter.bytes, 0u);
  ScratchAllocator incomplete = hooks;
  incomplete.release = nullptr;
  EXPECT_THROW(run_backward_cuda(d, nullptr, {}, Path::automatic, nullptr, &incomplete),
               InvalidArgument);
  counter.refuse = true;
  try {
    run_backward_cuda(d, nullptr, {}, Path::automatic, nullptr, &hooks);
    ADD_FAILURE() << "an allocator that gives nothing was not reported";
  } catch (const RuntimeFailure& e) {
    EXPECT_NE(std::string(e.what()).find("gdr.backward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("scratch"), std::string::npos) << e.what();
  }
}

// A varlen backward captured in a CUDA graph and replayed: its gradients equal the eager call's.
TEST(CudaChunkedBackward, GraphCaptureVarlen) {
  REQUIRE_GPU();
  Case c = base_case(1, 0, 2, 4, 128);
  c.seqlens = {100, 0, 1, 300, 64};
  TestData d = make_problem(c);
  cudaStream_t stream;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  const BackwardResult eager = run_backward_cuda(d, stream);
  BackwardParams host = d.backward_params();
  DeviceMirror m;
  BackwardParams p = mirror_backward_params(m, host);
  ExecConfig cfg;
  cfg.stream = stream;
  cudaGraph_t graph;
  cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  backward(p, cfg);
  cuda_check(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < 2; ++rep) {
    for (const TensorView* t : {&p.dq, &p.dk, &p.dv, &p.dg, &p.dbeta, &p.dh0})
      cuda_check(cudaMemset(t->data, 0xff, span_bytes(*t)), "poison");
    cuda_check(cudaGraphLaunch(exec, stream), "graph launch");
    cuda_check(cudaStreamSynchronize(stream), "replay");
    DeviceMirror::to_host(p.dq, host.dq);
    DeviceMirror::to_host(p.dk, host.dk);
    DeviceMirror::to_host(p.dv, host.dv);
    DeviceMirror::to_host(p.dg, host.dg);
    DeviceMirror::to_host(p.dbeta, host.dbeta);
    DeviceMirror::to_host(p.dh0, host.dh0);
    EXPECT_EQ(d.dq.to_double(), eager.dq) << "replay " << rep;
    EXPECT_EQ(d.dk.to_double(), eager.dk) << "replay " << rep;
    EXPECT_EQ(d.dv.to_double(), eager.dv) << "replay " << rep;
    EXPECT_EQ(d.dg.to_double(), eager.dg) << "replay " << rep;
    EXPECT_EQ(d.dbeta.to_double(), eager.dbeta) << "replay " << rep;
    EXPECT_EQ(d.dh0.to_double(), eager.dh0) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Forced paths other than chunkwise have no CUDA backward; chunk intermediates are refused.
TEST(CudaChunkedBackward, Refusals) {
  REQUIRE_GPU();
  TestData d = make_problem(base_case(1, 70, 1, 2, 64));
  EXPECT_THROW(run_backward_cuda(d, nullptr, {}, Path::sequential), InvalidArgument);
  EXPECT_THROW(run_backward_cuda(d, nullptr, {}, Path::reference), InvalidArgument);
  HostTensor inter = make_saved(d, 64, SavedContent::chunk_intermediates);
  DeviceMirror m;
  EXPECT_THROW(run_backward_cuda(d, nullptr, m.to_device(inter.view())), InvalidArgument);
}

}  // namespace
}  // namespace gdr::test
