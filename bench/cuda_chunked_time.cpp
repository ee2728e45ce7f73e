// gdr alone, no Python: times gdr::forward on CUDA tensors with the chunked forward
// (Path::chunkwise) and, with --crossover, the recurrent kernel (Path::sequential) against it at
// short lengths. bf16 q, k (unit rows), v drawn on the GPU; fp32 g = -0.2 U(0,1) ([B, T, Hv] or
// [B, T, Hv, Dk]), beta U(0,1); fp32 h0 and final state. CUDA events around each call, warm-up,
// median of --reps. One JSON object per line on stdout. (bench/cuda_chunked.py times gdr and FLA
// side by side through torch; this program needs only the C++ build.)
//   cuda_chunked_time [--reps N] [--crossover] [--only I] [--segments S] [--state-bv B]
//                     [--state-buffers K] [--overlap O] [--prep P] [--state-pass K]
//                     [--tinv T] [--prep-cycles] [--backward [--window W] [--bwd-fused F]
//                     [--bwd-prefetch P] [--phase-cycles]]
// --only I times only the I-th shape of the list (0-based; e.g. one shape under nsys),
// --segments S forces the state pass's segment split (DecodeOverrides::chunked_segments: S chunks
// per segment, -1 no split; 0 the rule), --state-bv 16|32 and --state-buffers 1|2 the state
// pass's value columns per block and W / Kd buffers, --overlap 1|2 the output kernel after the
// state pass or overlapped with it or 3 inside the bf16 state pass, --prep 1|2|3 the general prep
// kernel or the bf16 one (where it applies) or that one on warpgroup products, --state-pass 1..5
// the general state pass or the bf16 one with the state in registers (wherever it applies, the
// stored Kd rows included) or that one on warpgroup products (32 value columns) or 4 the bf16
// one with single products (S and Vnew rounded to bf16 as operands) where the output is inside it
// or 5 the fused pass (fused_pass_kernel.cuh) on the row-factor path at Dk = Dv = 128,
// --tinv 1|2|3 the prep kernels' Tinv by lanes, by columns or on the tensor cores
//   (DecodeOverrides::chunked_tinv),
// --prep-cycles one more call timing the bf16 prep kernel's phases
// (DecodeOverrides::prep_phase_cycles). --backward also times gdr::backward given the forward's
// saved chunk states (every gradient, from a random dO and dfinal_state) with the default pool's
// high-water mark over it; --window W forces its chunk slots per window (the A/B of the backward's
// windows, docs/cuda-chunked.md §Backward memory: e.g. --window 0 against
// --window 1000000, one window).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_fill.h"
#include "gdr/decode_overrides.h"
#include "gdr/gdr.h"

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Shape {
  std::int64_t B, T, Hk, Hv;
  bool per_key;
  std::vector<std::int64_t> seqlens;  // varlen when not empty (B = 1)
};

// Backward timing (--backward): the time of one gdr::backward given the forward's saved chunk
// states, and the high-water mark of the device's default memory pool over it (the backward's
// scratch and gradients: cudaMallocAsync is where its scratch comes from without an allocator).
struct BackwardTiming {
  bool phases = false;  // in: also one call with DecodeOverrides::backward_phase_cycles
  double ms = -1;
  double pool_peak_bytes = 0;
  std::vector<double> phase_cycles;  // per block of the fused chunk kernel, phases 0 .. 7
  double blocks = 0;
};

// --prep-cycles: one more forward call timing the bf16 prep kernel's phases (clock64 cycles per
// block, DecodeOverrides::prep_phase_cycles).
struct PrepCycles {
  bool on = false;
  std::vector<double> cycles;  // per block, phases 0 .. kPrepPhaseCounters - 2
  double blocks = 0;
};

// counters zeroed on the device, `call` run with them in `timed`, then the per-block averages.
template <class Call>
void phase_counters(int n, Call call, std::vector<double>& per_block, double& blocks) {
  unsigned long long* counters = nullptr;
  const std::size_t bytes = n * sizeof(unsigned long long);
  ck(cudaMalloc(reinterpret_cast<void**>(&counters), bytes), "malloc");
  ck(cudaMemset(counters, 0, bytes), "memset");
  call(counters);
  std::vector<unsigned long long> host(n);
  ck(cudaMemcpy(host.data(), counters, bytes, cudaMemcpyDeviceToHost), "copy counters");
  cudaFree(counters);
  blocks = static_cast<double>(host.back());
  for (int i = 0; i + 1 < n; ++i) per_block.push_back(blocks > 0 ? host[i] / blocks : 0.0);
}

double time_forward(const Shape& s, gdr::Path path, int reps, const gdr::DecodeOverrides& overrides,
                    bool* ok, BackwardTiming* bwd = nullptr, PrepCycles* prep = nullptr) {
  using gdr::DType;
  const std::int64_t D = 128, B = s.B, T = s.T, Hk = s.Hk, Hv = s.Hv;
  const std::int64_t N = s.seqlens.empty() ? B : static_cast<std::int64_t>(s.seqlens.size());
  void *q, *k, *v, *g, *beta, *h0, *o, *fs, *cu = nullptr;
  const std::int64_t gk = s.per_key ? D : 1;
  ck(cudaMalloc(&q, B * T * Hk * D * 2), "malloc");
  ck(cudaMalloc(&k, B * T * Hk * D * 2), "malloc");
  ck(cudaMalloc(&v, B * T * Hv * D * 2), "malloc");
  ck(cudaMalloc(&o, B * T * Hv * D * 2), "malloc");
  ck(cudaMalloc(&g, B * T * Hv * gk * 4), "malloc");
  ck(cudaMalloc(&beta, B * T * Hv * 4), "malloc");
  ck(cudaMalloc(&h0, N * Hv * D * D * 4), "malloc");
  ck(cudaMalloc(&fs, N * Hv * D * D * 4), "malloc");
  using gdr::bench::fill_uniform;
  ck(fill_uniform(q, 2, B * T * Hk * D, 1, -1.f, 1.f, nullptr), "fill");
  ck(gdr::bench::fill_unit_rows(k, 2, B * T * Hk, static_cast<int>(D), 2, nullptr), "fill");
  ck(fill_uniform(v, 2, B * T * Hv * D, 3, -1.f, 1.f, nullptr), "fill");
  ck(fill_uniform(g, 0, B * T * Hv * gk, 4, -0.2f, 0.f, nullptr), "fill");
  ck(fill_uniform(beta, 0, B * T * Hv, 5, 0.f, 1.f, nullptr), "fill");
  ck(fill_uniform(h0, 0, N * Hv * D * D, 6, -1.f, 1.f, nullptr), "fill");
  gdr::ForwardParams p;
  auto dev = [](gdr::TensorView t) {
    t.device = gdr::DeviceType::cuda;
    return t;
  };
  p.in.q = dev(gdr::TensorView::contiguous(q, DType::bf16, {B, T, Hk, D}));
  p.in.k = dev(gdr::TensorView::contiguous(k, DType::bf16, {B, T, Hk, D}));
  p.in.v = dev(gdr::TensorView::contiguous(v, DType::bf16, {B, T, Hv, D}));
  p.o = dev(gdr::TensorView::contiguous(o, DType::bf16, {B, T, Hv, D}));
  p.in.g = s.per_key ? dev(gdr::TensorView::contiguous(g, DType::f32, {B, T, Hv, D}))
                     : dev(gdr::TensorView::contiguous(g, DType::f32, {B, T, Hv}));
  p.in.beta = dev(gdr::TensorView::contiguous(beta, DType::f32, {B, T, Hv}));
  p.in.h0 = dev(gdr::TensorView::contiguous(h0, DType::f32, {N, Hv, D, D}));
  p.final_state = dev(gdr::TensorView::contiguous(fs, DType::f32, {N, Hv, D, D}));
  if (!s.seqlens.empty()) {
    std::vector<std::int32_t> c(1, 0);
    for (auto L : s.seqlens) c.push_back(c.back() + static_cast<std::int32_t>(L));
    ck(cudaMalloc(&cu, c.size() * 4), "malloc");
    ck(cudaMemcpy(cu, c.data(), c.size() * 4, cudaMemcpyHostToDevice), "cu");
    p.in.cu_seqlens =
        dev(gdr::TensorView::contiguous(cu, DType::i32, {static_cast<std::int64_t>(c.size())}));
  }
  gdr::ExecConfig cfg;
  cfg.path = path;
  cfg.decode_overrides = &overrides;
  std::vector<float> ms, bwd_ms;
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  // --backward: the forward keeps its chunk states (as a training step), the backward reads them
  // and writes every gradient (bf16 dq, dk, dv; fp32 dg, dbeta, dh0) from a random dO and
  // dfinal_state.
  std::vector<void*> extra;
  gdr::BackwardParams bp;
  if (bwd) {
    gdr::Problem prob;
    prob.B = B, prob.T = T, prob.N = N, prob.varlen = !s.seqlens.empty();
    prob.Hv = Hv, prob.Dk = D, prob.Dv = D, prob.dtype = DType::bf16;
    const gdr::SavedShape shape = gdr::saved_shape(prob);
    auto take = [&](std::int64_t bytes) {
      void* x = nullptr;
      ck(cudaMalloc(&x, static_cast<std::size_t>(bytes)), "malloc");
      extra.push_back(x);
      return x;
    };
    p.saved = dev(shape.view(take(shape.bytes())));
    bp.in = p.in;
    bp.saved = p.saved;
    void* dout = take(B * T * Hv * D * 2);
    void* dfs = take(N * Hv * D * D * 4);
    ck(fill_uniform(dout, 2, B * T * Hv * D, 7, -1.f, 1.f, nullptr), "fill");
    ck(fill_uniform(dfs, 0, N * Hv * D * D, 8, -1.f, 1.f, nullptr), "fill");
    bp.dout = dev(gdr::TensorView::contiguous(dout, DType::bf16, {B, T, Hv, D}));
    bp.dfinal_state = dev(gdr::TensorView::contiguous(dfs, DType::f32, {N, Hv, D, D}));
    bp.dq = dev(gdr::TensorView::contiguous(take(B * T * Hk * D * 2), DType::bf16, {B, T, Hk, D}));
    bp.dk = dev(gdr::TensorView::contiguous(take(B * T * Hk * D * 2), DType::bf16, {B, T, Hk, D}));
    bp.dv = dev(gdr::TensorView::contiguous(take(B * T * Hv * D * 2), DType::bf16, {B, T, Hv, D}));
    bp.dg =
        s.per_key
            ? dev(gdr::TensorView::contiguous(take(B * T * Hv * D * 4), DType::f32, {B, T, Hv, D}))
            : dev(gdr::TensorView::contiguous(take(B * T * Hv * 4), DType::f32, {B, T, Hv}));
    bp.dbeta = dev(gdr::TensorView::contiguous(take(B * T * Hv * 4), DType::f32, {B, T, Hv}));
    bp.dh0 = dev(gdr::TensorView::contiguous(take(N * Hv * D * D * 4), DType::f32, {N, Hv, D, D}));
  }
  *ok = true;
  try {
    // reps calls of `call`, each between two events, into `out`.
    auto time_calls = [&](auto call, std::vector<float>& out) {
      for (int i = 0; i < reps; ++i) {
        ck(cudaEventRecord(a), "record");
        call();
        ck(cudaEventRecord(b), "record");
        ck(cudaEventSynchronize(b), "sync");
        float t = 0;
        ck(cudaEventElapsedTime(&t, a, b), "elapsed");
        out.push_back(t);
      }
    };
    for (int i = 0; i < 3; ++i) gdr::forward(p, cfg);
    time_calls([&] { gdr::forward(p, cfg); }, ms);
    // One call of `run` on this config with the overrides' diagnostic `field` set to the counters.
    auto counted = [&](unsigned long long* gdr::DecodeOverrides::*field, auto run) {
      return [&, field, run](unsigned long long* counters) {
        gdr::DecodeOverrides timed = overrides;
        timed.*field = counters;
        gdr::ExecConfig tcfg = cfg;
        tcfg.decode_overrides = &timed;
        run(tcfg);
      };
    };
    if (prep && prep->on)
      phase_counters(gdr::kPrepPhaseCounters,
                     counted(&gdr::DecodeOverrides::prep_phase_cycles,
                             [&](const gdr::ExecConfig& c) { gdr::forward(p, c); }),
                     prep->cycles, prep->blocks);
    if (bwd) {
      cudaMemPool_t pool;
      ck(cudaDeviceGetMemPool(&pool, 0), "cudaDeviceGetMemPool");
      for (int i = 0; i < 2; ++i) gdr::backward(bp, cfg);
      ck(cudaDeviceSynchronize(), "backward");
      std::uint64_t zero = 0, high = 0;
      ck(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero), "pool reset");
      time_calls([&] { gdr::backward(bp, cfg); }, bwd_ms);
      ck(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high), "pool high");
      std::sort(bwd_ms.begin(), bwd_ms.end());
      bwd->ms = bwd_ms[bwd_ms.size() / 2];
      bwd->pool_peak_bytes = static_cast<double>(high);
      if (bwd->phases)  // one more call, timed per phase inside the fused chunk kernel
        phase_counters(gdr::kBackwardPhaseCounters,
                       counted(&gdr::DecodeOverrides::backward_phase_cycles,
                               [&](const gdr::ExecConfig& c) { gdr::backward(bp, c); }),
                       bwd->phase_cycles, bwd->blocks);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", bwd ? "forward / backward" : "forward", e.what());
    *ok = false;
  }
  ck(cudaDeviceSynchronize(), "forward");
  for (void* x : {q, k, v, g, beta, h0, o, fs, cu})
    if (x) cudaFree(x);
  for (void* x : extra) cudaFree(x);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (ms.empty()) return -1;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, only = -1;
  gdr::DecodeOverrides overrides;
  bool crossover = false;
  CLI::App app{"gdr chunked forward timer (CUDA events, median of --reps; JSON lines)"};
  app.add_option("--reps", reps, "timed calls per shape")->check(CLI::PositiveNumber);
  app.add_flag("--crossover", crossover, "also time the recurrent path against the chunked one");
  app.add_option("--only", only, "time only this shape of the list (0-based)");
  app.add_option("--segments", overrides.chunked_segments,
                 "segment split: chunks per segment (> 0), -1 no split, 0 the rule");
  app.add_option(
      "--state-bv", overrides.chunked_state_columns,
      "state pass value columns per block: 16 or 32; the fused pass (--state-pass 5): 32, 64 or "
      "128 (0 the rule)");
  app.add_option("--state-buffers", overrides.chunked_state_buffers,
                 "state pass W / Kd buffers: 1 or 2; 3 or 4 stages of the bf16 pass's copies "
                 "(0 the rule)");
  app.add_option("--overlap", overrides.chunked_overlap,
                 "output kernel: 1 after the state pass, 2 overlapped, 3 the output inside the "
                 "bf16 state pass where it runs (0 the rule)")
      ->check(CLI::Range(0, 3));
  app.add_option("--prep", overrides.chunked_prep,
                 "prep kernel: 1 the general one, 2 the bf16 one where it applies, 3 that one on "
                 "warpgroup products at Dk = Dv = 128, also in the backward's recompute (0 the "
                 "rule)");
  app.add_option(
      "--state-pass", overrides.chunked_state_pass,
      "state pass: 1 the general one, 2 the bf16 one with the state in registers "
      "wherever it applies, also on the stored Kd rows, 3 that one on warpgroup "
      "products (32 value columns), 4 the bf16 one with single products where the "
      "output is inside it, 5 the fused pass (Vnew from the v rows on chip, 128 "
      "columns per block) on the row-factor path at Dk = Dv = 128, 6 the single-product one "
      "as a state warpgroup, an output warpgroup and a producer warp (32 columns, "
      "else 4; slower) (0 the rule)");
  app.add_option("--tinv", overrides.chunked_tinv,
                 "prep kernels' Tinv: 1 by lanes, 2 by columns, 3 the off-diagonal blocks on the "
                 "tensor cores (0 the rule)")
      ->check(CLI::Range(0, 3));
  bool backward = false;
  app.add_flag("--backward", backward,
               "also time gdr::backward given the forward's saved chunk states (bwd_ms, and the "
               "memory pool's high-water mark over it, bwd_pool_peak_bytes)");
  app.add_option("--window", overrides.chunked_backward_window,
                 "backward: chunk slots per window of its scratch (0 the rule; a huge value: "
                 "one window)");
  app.add_option("--bwd-fused", overrides.chunked_backward_fused,
                 "backward: 1 the general kernels, 2 the fused bf16 kernel and the bf16 reverse "
                 "pass and the bf16 prep where they apply, 3 that with the general reverse pass, 4 "
                 "that with the fp32 prep, 5 2 with the reverse pass's operands in bf16, 6 5 with "
                 "the reverse pass on warpgroup products (0 the rule)")
      ->check(CLI::Range(0, 6));
  app.add_option("--bwd-prefetch", overrides.chunked_backward_prefetch,
                 "backward: the fused chunk kernel's L2 prefetch of its next phases' operands: "
                 "1 off, 2 on (0 the rule)")
      ->check(CLI::Range(0, 2));
  app.add_option("--bwd-rows", overrides.chunked_backward_rows,
                 "backward: the fused chunk kernel's row sums of dg: 1 a thread per column / row "
                 "and one thread, 2 by the whole block (0 the rule)")
      ->check(CLI::Range(0, 2));
  app.add_option("--bwd-qk", overrides.chunked_backward_qk,
                 "backward: the fused chunk kernel's q, k rows: 1 the prep's normalised fp32 rows, "
                 "2 the raw bf16 inputs and the prep's per-row norms (0 the rule)")
      ->check(CLI::Range(0, 2));
  app.add_option("--bwd-dvn", overrides.chunked_backward_dvn,
                 "backward: dVnew from the bf16 reverse pass to the fused chunk kernel: 1 fp32, 2 "
                 "bf16 (0 the rule)")
      ->check(CLI::Range(0, 2));
  bool phase_cycles = false, prep_cycles = false;
  app.add_flag("--prep-cycles", prep_cycles,
               "one more forward call timing the bf16 prep kernel's phases (clock64 cycles per "
               "block: prep_phase_cycles, prep_blocks, sm_clock_khz)");
  app.add_flag("--phase-cycles", phase_cycles,
               "with --backward: one more call timing the fused chunk kernel's phases (clock64 "
               "cycles per block: bwd_phase_cycles, bwd_blocks, sm_clock_khz)");
  CLI11_PARSE(app, argc, argv);
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, 0), "props");
  std::vector<std::int64_t> lens;
  {
    std::uint64_t x = 20261205;
    for (int i = 0; i < 32; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      lens.push_back(100 + static_cast<std::int64_t>((x >> 33) % 7901));
    }
  }
  std::int64_t total = 0;
  for (auto L : lens) total += L;
  std::vector<Shape> shapes = {{1, 4096, 16, 32, false, {}},  {1, 16384, 16, 32, false, {}},
                               {1, 65536, 16, 32, false, {}}, {8, 4096, 16, 32, false, {}},
                               {1, 32768, 32, 32, false, {}}, {1, total, 16, 32, false, lens},
                               {1, 16384, 32, 32, true, {}}};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    if (only >= 0 && static_cast<std::size_t>(only) != i) continue;
    const Shape& s = shapes[i];
    bool ok;
    BackwardTiming bt;
    bt.phases = phase_cycles;
    PrepCycles pc;
    pc.on = prep_cycles;
    const double t =
        time_forward(s, gdr::Path::chunkwise, reps, overrides, &ok, backward ? &bt : nullptr, &pc);
    char bwd_fields[768] = "";
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    if (prep_cycles) {
      int n = std::snprintf(bwd_fields, sizeof bwd_fields,
                            "\"sm_clock_khz\": %d, \"prep_blocks\": %.0f, \"prep_phase_cycles\": [",
                            khz, pc.blocks);
      for (std::size_t j = 0; j < pc.cycles.size(); ++j)
        n += std::snprintf(bwd_fields + n, sizeof bwd_fields - n, "%s%.0f", j ? ", " : "",
                           pc.cycles[j]);
      std::snprintf(bwd_fields + n, sizeof bwd_fields - n, "], ");
    }
    if (backward) {
      int n = static_cast<int>(std::strlen(bwd_fields));
      n += std::snprintf(
          bwd_fields + n, sizeof bwd_fields - n,
          "\"window\": %d, \"bwd_fused\": %d, \"bwd_prefetch\": %d, \"bwd_rows\": %d, "
          "\"bwd_qk\": %d, \"bwd_dvn\": %d, \"bwd_ms\": %.4f, \"bwd_pool_peak_bytes\": %.0f, ",
          overrides.chunked_backward_window, overrides.chunked_backward_fused,
          overrides.chunked_backward_prefetch, overrides.chunked_backward_rows,
          overrides.chunked_backward_qk, overrides.chunked_backward_dvn, bt.ms, bt.pool_peak_bytes);
      if (phase_cycles) {
        if (!prep_cycles)  // else printed with the prep's cycles
          n += std::snprintf(bwd_fields + n, sizeof bwd_fields - n, "\"sm_clock_khz\": %d, ", khz);
        n += std::snprintf(bwd_fields + n, sizeof bwd_fields - n,
                           "\"bwd_blocks\": %.0f, \"bwd_phase_cycles\": [", bt.blocks);
        for (std::size_t j = 0; j < bt.phase_cycles.size(); ++j)
          n += std::snprintf(bwd_fields + n, sizeof bwd_fields - n, "%s%.0f", j ? ", " : "",
                             bt.phase_cycles[j]);
        std::snprintf(bwd_fields + n, sizeof bwd_fields - n, "], ");
      }
    }
    std::printf(
        "{\"device\": \"%s\", \"path\": \"chunkwise\", \"B\": %lld, \"T\": %lld, \"Hk\": %lld, "
        "\"Hv\": %lld, \"gate\": \"%s\", \"varlen\": %s, \"segments\": %d, \"state_bv\": %d, "
        "\"state_buffers\": %d, \"overlap\": %d, \"prep\": %d, \"state_pass\": %d, "
        "\"tinv\": %d, \"ms\": %.4f, %s"
        "\"ok\": %s}\n",
        prop.name, (long long)s.B, (long long)s.T, (long long)s.Hk, (long long)s.Hv,
        s.per_key ? "per_key" : "scalar", s.seqlens.empty() ? "false" : "true",
        overrides.chunked_segments, overrides.chunked_state_columns,
        overrides.chunked_state_buffers, overrides.chunked_overlap, overrides.chunked_prep,
        overrides.chunked_state_pass, overrides.chunked_tinv, t, bwd_fields, ok ? "true" : "false");
    std::fflush(stdout);
  }
  if (crossover && only < 0) {
    for (auto [B, T] : std::vector<std::pair<int, int>>{{1, 128},
                                                        {1, 256},
                                                        {1, 1024},
                                                        {1, 4096},
                                                        {8, 128},
                                                        {8, 256},
                                                        {8, 1024},
                                                        {8, 4096},
                                                        {32, 256},
                                                        {32, 512},
                                                        {32, 1024},
                                                        {64, 1024}})
      for (gdr::Path path : {gdr::Path::sequential, gdr::Path::chunkwise}) {
        bool ok;
        const double t = time_forward({B, T, 16, 32, false, {}}, path, reps, overrides, &ok);
        std::printf(
            "{\"device\": \"%s\", \"path\": \"%s\", \"B\": %d, \"T\": %d, \"Hk\": 16, "
            "\"Hv\": 32, \"gate\": \"scalar\", \"prep\": %d, \"state_pass\": %d, \"tinv\": %d, "
            "\"ms\": %.4f, \"ok\": %s}\n",
            prop.name, path == gdr::Path::chunkwise ? "chunkwise" : "sequential", B, T,
            overrides.chunked_prep, overrides.chunked_state_pass, overrides.chunked_tinv, t,
            ok ? "true" : "false");
        std::fflush(stdout);
      }
  }
  return 0;
}
