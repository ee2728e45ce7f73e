// cpu_paths: two CPU paths of gdr on one shape, compared as a ratio measured in one run.
//
// Protocol (PERF.md, "How to measure", CPU): warm-up of both paths, then an A/A calibration
// (path A against itself, `pairs` alternating pairs: if the spread of that ratio does not
// include 1, the machine is too noisy and the verdict says so), then `pairs` A/B pairs in
// alternating order (A B, B A, ...). Reported: the median ratio time(A) / time(B) with its
// min / max and inter-quartile range, each path's median time, achieved GFLOP/s (work model
// below) and the fraction of the machine's fp32 FMA peak (measured here, bench/fma_peak.h).
// The two paths' outputs are compared (relative Frobenius error of o and dq, dk, dv, dg).
//
// Paths: sequential, chunkwise, reference, automatic. With --direction fwdbwd, chunkwise and
// automatic run a training step as the torch layer does by default (docs/operator.md §3): the
// forward fills the saved-for-backward tensor with the chunk-boundary states (ForwardParams::saved,
// allocated inside the timed call as a training step would) and the backward reads them and
// recomputes each chunk's Tinv and Vnew; the suffix `:intermediates` saves those too (the
// torch layer's save_chunk_intermediates=True, beyond docs/operator.md §3), `:recompute` leaves the
// saved tensor out (the backward then runs its own pass over the chunks).
//
// --mode single: one path only, `pairs` timed runs after a warm-up, and its peak memory (peak
// RSS of this process minus its RSS once inputs and outputs are allocated); run it in a fresh
// process per configuration (bench/cpu_compare.py does).
//
// --mode products: the rate inside the chunkwise path's matrix products, in a build configured
// with -DGDR_PROFILE_PRODUCTS=ON (src/cpu/product_profile.h; other builds refuse this mode).
// Every Eigen product of src/cpu/chunkwise_*.cpp is timed (steady_clock before and after, on
// the thread that runs it) and counted as 2 m n k flops for its [m, k] x [k, n] shape as
// executed (the zero triangles of the [n, n] operands included; the forward substitution of
// Tinv as sum_r 2 r^2), into per-thread, per-site counters. After a warm-up, `pairs` calls of
// the chunkwise path (forward, or forward + backward) run with the counters on. Reported per
// thread t: flops F_t, seconds inside products s_t, the rate F_t / s_t and s_t / wall time;
// in total: sum_t F_t / s_t (the machine's rate while every thread is inside a product; the
// threads run the same kind of work side by side), and per site: calls, flops, rate. The
// fp32 FMA peak is measured in the same run (bench/fma_peak.h: 12 independent 8-wide AVX2
// FMA chains per thread, no memory traffic, best of 3, with all threads at once and with one),
// before and after the timed calls; the larger is the peak quoted. A thread's product rate is
// compared with its share of the all-thread peak (peak / threads) and the total with the
// all-thread peak. The cost of the timer itself (two clock reads and one add per product) is
// measured after and reported as a fraction of the product time.
//
// Work model (PERF.md), per token and value head, chunk C: forward 6 Dk Dv + C (6 Dk + 4 Dv)
// flops; forward + backward counted as 3x forward. Bytes: q, k, v, g, beta read and o written
// once (fp32); the backward adds dout read, the inputs read again and dq, dk, dv, dg, dbeta
// written.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cpu/product_profile.h"
#include "fma_peak.h"
#include "gdr/gdr.h"
#include "process_memory.h"
#include "support.h"

namespace {

using std::int64_t;
using json = nlohmann::json;

struct Options {
  std::string a = "sequential", b = "chunkwise";  // ratio reported: time(a) / time(b)
  std::string direction = "fwdbwd";               // fwd | fwdbwd
  std::string mode = "ab";                        // ab | single (path a only)
  int64_t B = 1, T = 1024, Hk = 16, Hv = 32, Dk = 128, Dv = 128;
  std::string gate = "scalar";  // scalar | per_key
  int threads = 0;              // 0 = all
  int chunk = 64;
  int pairs = 15;
  std::uint64_t seed = 20261129;
  std::string json_path;

  bool backward() const { return direction == "fwdbwd"; }
  int64_t gw() const { return gate == "per_key" ? Dk : 1; }
  double flops() const {
    const double fwd =
        double(B) * double(T) * double(Hv) *
        (6.0 * double(Dk) * double(Dv) + chunk * (6.0 * double(Dk) + 4.0 * double(Dv)));
    return backward() ? 3.0 * fwd : fwd;
  }
  double bytes() const {
    const double BT = double(B) * double(T);
    const double in = BT * (2.0 * Hk * Dk + Hv * Dv + Hv * gw() + Hv) * 4.0;
    const double out = BT * Hv * Dv * 4.0;
    return backward() ? 2.0 * in + out + out /* dout */ + in /* grads */ : in + out;
  }
};

// A path as the command line names it: the gdr path and what a fwdbwd call saves for backward.
struct PathSpec {
  gdr::Path path = gdr::Path::chunkwise;
  bool saved = false;
  gdr::SavedContent content = gdr::SavedContent::chunk_states;
};

PathSpec parse_path(const std::string& s) {
  const std::size_t colon = s.find(':');
  const std::string name = s.substr(0, colon);
  const std::string suffix = colon == std::string::npos ? "" : s.substr(colon + 1);
  const bool trainable = name == "chunkwise" || name == "automatic";
  if (trainable || ((name == "sequential" || name == "reference") && suffix.empty())) {
    PathSpec spec;
    spec.path = name == "sequential"  ? gdr::Path::sequential
                : name == "reference" ? gdr::Path::reference
                : name == "chunkwise" ? gdr::Path::chunkwise
                                      : gdr::Path::automatic;
    if (suffix.empty() || suffix == "intermediates") {
      spec.saved = trainable;
      if (suffix == "intermediates") spec.content = gdr::SavedContent::chunk_intermediates;
      return spec;
    }
    if (suffix == "recompute") return spec;
  }
  throw gdr::InvalidArgument("cpu_paths: path " + s +
                             "; supported: sequential, reference, chunkwise, automatic, and "
                             "chunkwise or automatic with :intermediates or :recompute");
}

// fp32 inputs, outputs and gradient seed of one problem (docs/operator.md §7 inputs, mild decay).
struct Problem {
  std::vector<float> q, k, v, g, beta, dout, o, dq, dk, dv, dg, dbeta;
  gdr::ForwardParams fp;
  gdr::BackwardParams bp;

  explicit Problem(const Options& o_) {
    const int64_t B = o_.B, T = o_.T, Hk = o_.Hk, Hv = o_.Hv, Dk = o_.Dk, Dv = o_.Dv;
    const int64_t gw = o_.gw();
    std::mt19937_64 rng(o_.seed);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> uniform;
    auto sized = [](std::vector<float>& x, int64_t n) {
      x.assign(static_cast<std::size_t>(n), 0.f);
    };
    sized(q, B * T * Hk * Dk);
    sized(k, B * T * Hk * Dk);
    sized(v, B * T * Hv * Dv);
    sized(g, B * T * Hv * gw);
    sized(beta, B * T * Hv);
    sized(dout, B * T * Hv * Dv);
    for (auto& x : q) x = normal(rng);
    for (int64_t r = 0; r < B * T * Hk; ++r) {
      float n2 = 0;
      for (int64_t i = 0; i < Dk; ++i) n2 += (k[r * Dk + i] = normal(rng)) * k[r * Dk + i];
      for (int64_t i = 0; i < Dk; ++i) k[r * Dk + i] /= std::sqrt(n2);
    }
    for (auto& x : v) x = normal(rng);
    for (auto& x : g) x = -0.2f * uniform(rng);
    for (auto& x : beta) x = uniform(rng);
    for (auto& x : dout) x = normal(rng);
    sized(o, B * T * Hv * Dv);
    sized(dq, B * T * Hk * Dk);
    sized(dk, B * T * Hk * Dk);
    sized(dv, B * T * Hv * Dv);
    sized(dg, B * T * Hv * gw);
    sized(dbeta, B * T * Hv);
    using gdr::DType;
    using gdr::TensorView;
    auto view4 = [](std::vector<float>& x, int64_t a, int64_t b, int64_t c, int64_t d) {
      return TensorView::contiguous(x.data(), DType::f32, {a, b, c, d});
    };
    auto gate_view = [&](std::vector<float>& x) {
      return gw == 1 ? TensorView::contiguous(x.data(), DType::f32, {B, T, Hv})
                     : view4(x, B, T, Hv, Dk);
    };
    fp.in.q = view4(q, B, T, Hk, Dk);
    fp.in.k = view4(k, B, T, Hk, Dk);
    fp.in.v = view4(v, B, T, Hv, Dv);
    fp.in.g = gate_view(g);
    fp.in.beta = TensorView::contiguous(beta.data(), DType::f32, {B, T, Hv});
    fp.o = view4(o, B, T, Hv, Dv);
    bp.in = fp.in;
    bp.dout = view4(dout, B, T, Hv, Dv);
    bp.dq = view4(dq, B, T, Hk, Dk);
    bp.dk = view4(dk, B, T, Hk, Dk);
    bp.dv = view4(dv, B, T, Hv, Dv);
    bp.dg = gate_view(dg);
    bp.dbeta = TensorView::contiguous(dbeta.data(), DType::f32, {B, T, Hv});
  }
};

// Seconds of one call (forward, or forward + backward) of `path`. A fwdbwd call with
// path.saved allocates the saved tensor (uninitialised, as torch.empty would), lets the forward
// fill it and the backward read it, and frees it: all inside the timed region.
double time_once(Problem& p, const Options& o, const PathSpec& path) {
  gdr::ExecConfig cfg;
  cfg.path = path.path;
  cfg.num_threads = o.threads;
  cfg.chunk_size = o.chunk;
  const auto t0 = std::chrono::steady_clock::now();
  if (o.backward() && path.saved) {
    const gdr::SavedShape shape =
        gdr::saved_shape(gdr::validate_forward(p.fp), o.chunk, path.content);
    std::unique_ptr<float[]> saved(new float[static_cast<std::size_t>(shape.numel())]);
    gdr::ForwardParams fp = p.fp;
    gdr::BackwardParams bp = p.bp;
    fp.saved = bp.saved = shape.view(saved.get());
    gdr::forward(fp, cfg);
    gdr::backward(bp, cfg);
  } else {
    gdr::forward(p.fp, cfg);
    if (o.backward()) gdr::backward(p.bp, cfg);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double quantile(std::vector<double> x, double q) {
  std::sort(x.begin(), x.end());
  const double pos = q * double(x.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = std::min(lo + 1, x.size() - 1);
  return x[lo] + (pos - double(lo)) * (x[hi] - x[lo]);
}

json spread(const std::vector<double>& r) {
  return {{"median", quantile(r, 0.5)},
          {"min", *std::min_element(r.begin(), r.end())},
          {"max", *std::max_element(r.begin(), r.end())},
          {"q1", quantile(r, 0.25)},
          {"q3", quantile(r, 0.75)},
          {"samples", r}};
}

json machine() {
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::string model;
  std::ifstream cpu("/proc/cpuinfo");
  for (std::string line; std::getline(cpu, line);)
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return {{"cpu", model},
          {"hardware_threads", omp_get_num_procs()},
          {"loadavg_1min_at_start", load[0]}};
}

json shape(const Options& o) {
  return {{"B", o.B},
          {"T", o.T},
          {"Hk", o.Hk},
          {"Hv", o.Hv},
          {"Dk", o.Dk},
          {"Dv", o.Dv},
          {"gate", o.gate},
          {"chunk", o.chunk},
          {"direction", o.direction},
          {"threads", o.threads},
          {"seed", o.seed}};
}

int run_single(const Options& o) {
  Problem p(o);
  const PathSpec path = parse_path(o.a);
  const double baseline = gdr::process::rss_bytes();
  time_once(p, o, path);  // warm-up
  std::vector<double> t;
  for (int i = 0; i < std::max(1, o.pairs); ++i) t.push_back(time_once(p, o, path));
  const double peak = gdr::process::peak_rss_bytes();
  const double med = quantile(t, 0.5);
  json j = {{"program", "cpu_paths --mode single"},
            {"path", o.a},
            {"shape", shape(o)},
            {"machine", machine()},
            {"seconds", spread(t)},
            {"gflops", o.flops() / med / 1e9},
            {"gbytes_per_s", o.bytes() / med / 1e9},
            {"peak_rss_bytes", peak},
            {"baseline_rss_bytes", baseline},
            {"peak_extra_bytes", std::max(0.0, peak - baseline)}};
  std::printf(
      "%s %s B=%lld T=%lld Hk=%lld Hv=%lld: median %.4f s (min %.4f max %.4f), "
      "%.1f GFLOP/s, peak extra %.3f GB\n",
      o.a.c_str(), o.direction.c_str(), (long long)o.B, (long long)o.T, (long long)o.Hk,
      (long long)o.Hv, med, quantile(t, 0), quantile(t, 1), o.flops() / med / 1e9,
      std::max(0.0, peak - baseline) / 1e9);
  if (!o.json_path.empty()) std::ofstream(o.json_path) << j.dump(2) << "\n";
  return 0;
}

int run_products(const Options& o) {
  namespace prof = gdr::cpu::profile;
  if (!prof::kEnabled) {
    std::fprintf(stderr,
                 "cpu_paths: --mode products needs a build configured with "
                 "-DGDR_PROFILE_PRODUCTS=ON (e.g. cmake --preset cpu -B build/prof "
                 "-DGDR_PROFILE_PRODUCTS=ON)\n");
    return 2;
  }
  const PathSpec path = parse_path(o.a);
  if (path.path != gdr::Path::chunkwise) {
    std::fprintf(
        stderr,
        "cpu_paths: --mode products profiles --a chunkwise[:intermediates|:recompute] only\n");
    return 2;
  }
  Problem p(o);
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  double load[3] = {0, 0, 0};
  time_once(p, o, path);  // warm-up
  const double peak_before = gdr::bench::fma_peak_gflops(threads);
  const double peak1 = gdr::bench::fma_peak_gflops(1);
  prof::reset();
  std::vector<double> t;
  for (int i = 0; i < std::max(1, o.pairs); ++i) t.push_back(time_once(p, o, path));
  const std::vector<prof::ThreadCounters> snap = prof::snapshot(threads);
  const double peak_after = gdr::bench::fma_peak_gflops(threads);
  const double peak = std::max(peak_before, peak_after);
  getloadavg(load, 3);
  double wall = 0;
  for (double x : t) wall += x;
  // Cost of one timed product's bookkeeping (now() before, add() after), on this thread.
  prof::reset();
  const int probes = 200000;
  const double c0 = prof::now();
  for (int i = 0; i < probes; ++i) prof::add(prof::Site::fwd_qk_kk, prof::now(), 0.0);
  const double per_call = (prof::now() - c0) / probes;
  prof::reset();

  // Per thread and per site.
  std::int64_t calls = 0;
  double total_rate = 0, all_flops = 0, all_secs = 0;
  json per_thread = json::array(), per_site = json::array();
  std::printf(
      "%s %s, B=%lld T=%lld Hk=%lld Hv=%lld Dk=%lld Dv=%lld %s, C=%d, %d threads, "
      "%d calls, wall %.4f s (median call %.4f s)\n",
      o.a.c_str(), o.direction.c_str(), (long long)o.B, (long long)o.T, (long long)o.Hk,
      (long long)o.Hv, (long long)o.Dk, (long long)o.Dv, o.gate.c_str(), o.chunk, threads,
      (int)t.size(), wall, quantile(t, 0.5));
  std::printf(
      "fp32 FMA peak (same run): %.1f GFLOP/s with %d threads (before %.1f, after %.1f), "
      "%.1f with 1 thread; load average %.2f\n",
      peak, threads, peak_before, peak_after, peak1, load[0]);
  std::printf("%-8s %12s %10s %8s %14s %14s\n", "thread", "GFLOP", "s in prod", "% wall",
              "GFLOP/s prod", "% of peak/thr");
  for (std::size_t th = 0; th < snap.size(); ++th) {
    double f = 0, s = 0;
    for (const prof::Counter& c : snap[th]) {
      f += c.flops;
      s += c.seconds;
      calls += c.calls;
    }
    const double rate = s > 0 ? f / s / 1e9 : 0.0;
    total_rate += rate;
    all_flops += f;
    all_secs += s;
    per_thread.push_back({{"thread", th},
                          {"flops", f},
                          {"seconds_in_products", s},
                          {"fraction_of_wall", s / wall},
                          {"gflops_in_products", rate},
                          {"fraction_of_peak_share", peak > 0 ? rate / (peak / threads) : 0.0}});
    std::printf("%-8zu %12.2f %10.4f %7.1f%% %14.1f %13.0f%%\n", th, f / 1e9, s, 100 * s / wall,
                rate, peak > 0 ? 100 * rate / (peak / threads) : 0.0);
  }
  std::printf(
      "%-8s %12.2f %10s %8s %14.1f %13.0f%%  (sum of the threads' rates vs the "
      "%d-thread peak)\n",
      "total", all_flops / 1e9, "", "", total_rate, peak > 0 ? 100 * total_rate / peak : 0.0,
      threads);
  std::printf(
      "whole path: %.1f GFLOP/s of executed product flops over wall time; work model %.1f "
      "GFLOP/s (executed product flops / work model flops = %.2f)\n",
      all_flops / wall / 1e9, o.flops() * t.size() / wall / 1e9,
      all_flops / (o.flops() * t.size()));
  std::printf("timer cost %.1f ns per product, %lld products: %.1f%% of the product time\n",
              per_call * 1e9, (long long)calls, 100 * per_call * calls / std::max(all_secs, 1e-12));
  std::printf("\n%-42s %9s %10s %9s %8s %10s\n", "site (per thread-second)", "calls", "GFLOP", "s",
              "% prod", "GFLOP/s");
  for (int si = 0; si < prof::kSites; ++si) {
    prof::Counter c;
    for (const auto& th : snap) {
      c.flops += th[si].flops;
      c.seconds += th[si].seconds;
      c.calls += th[si].calls;
    }
    if (c.calls == 0) continue;
    const char* name = prof::site_name(static_cast<prof::Site>(si));
    per_site.push_back({{"site", name},
                        {"calls", c.calls},
                        {"flops", c.flops},
                        {"thread_seconds", c.seconds},
                        {"gflops_per_thread", c.flops / c.seconds / 1e9}});
    std::printf("%-42s %9lld %10.2f %9.4f %7.1f%% %10.1f\n", name, (long long)c.calls,
                c.flops / 1e9, c.seconds, 100 * c.seconds / all_secs, c.flops / c.seconds / 1e9);
  }
  json j = {{"program", "cpu_paths --mode products"},
            {"path", o.a},
            {"shape", shape(o)},
            {"machine", machine()},
            {"loadavg_1min_at_end", load[0]},
            {"threads", threads},
            {"calls", t.size()},
            {"seconds", spread(t)},
            {"fma_peak_gflops", peak},
            {"fma_peak_gflops_before", peak_before},
            {"fma_peak_gflops_after", peak_after},
            {"fma_peak_gflops_1thread", peak1},
            {"product_flops", all_flops},
            {"product_thread_seconds", all_secs},
            {"gflops_in_products_total", total_rate},
            {"fraction_of_fma_peak", peak > 0 ? total_rate / peak : 0.0},
            {"work_model_flops_per_call", o.flops()},
            {"timer_seconds_per_product", per_call},
            {"products", calls},
            {"per_thread", per_thread},
            {"per_site", per_site}};
  if (!o.json_path.empty()) std::ofstream(o.json_path) << j.dump(2) << "\n";
  return 0;
}

int run_ab(const Options& o) {
  Problem p(o);
  const PathSpec pa = parse_path(o.a), pb = parse_path(o.b);
  // Outputs of both paths (compared once, not timed).
  time_once(p, o, pb);
  const std::vector<float> ob = p.o, dqb = p.dq, dkb = p.dk, dvb = p.dv, dgb = p.dg;
  time_once(p, o, pa);
  json err = {{"o", gdr::test::rel_error(p.o, ob)}};
  if (o.backward()) {
    err["dq"] = gdr::test::rel_error(p.dq, dqb);
    err["dk"] = gdr::test::rel_error(p.dk, dkb);
    err["dv"] = gdr::test::rel_error(p.dv, dvb);
    err["dg"] = gdr::test::rel_error(p.dg, dgb);
  }
  // A/A calibration, then A/B in alternating order.
  std::vector<double> aa, ab, ta, tb;
  for (int i = 0; i < o.pairs; ++i) {
    const double x = time_once(p, o, pa), y = time_once(p, o, pa);
    aa.push_back(i % 2 == 0 ? x / y : y / x);
  }
  for (int i = 0; i < o.pairs; ++i) {
    double x, y;
    if (i % 2 == 0) {
      x = time_once(p, o, pa);
      y = time_once(p, o, pb);
    } else {
      y = time_once(p, o, pb);
      x = time_once(p, o, pa);
    }
    ta.push_back(x);
    tb.push_back(y);
    ab.push_back(x / y);
  }
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const double peak = gdr::bench::fma_peak_gflops(threads, 5'000'000);
  const double ma = quantile(ta, 0.5), mb = quantile(tb, 0.5);
  const bool aa_ok = *std::min_element(aa.begin(), aa.end()) <= 1.0 &&
                     *std::max_element(aa.begin(), aa.end()) >= 1.0;
  json j = {{"program", "cpu_paths --mode ab"},
            {"a", o.a},
            {"b", o.b},
            {"shape", shape(o)},
            {"machine", machine()},
            {"flops", o.flops()},
            {"bytes", o.bytes()},
            {"fma_peak_gflops", peak},
            {"aa_ratio", spread(aa)},
            {"aa_includes_1", aa_ok},
            {"ratio_a_over_b", spread(ab)},
            {"seconds_a", spread(ta)},
            {"seconds_b", spread(tb)},
            {"gflops_a", o.flops() / ma / 1e9},
            {"gflops_b", o.flops() / mb / 1e9},
            {"fraction_of_fma_peak_b", peak > 0 ? o.flops() / mb / 1e9 / peak : 0.0},
            {"rel_error_a_vs_b", err}};
  std::printf("%s vs %s, %s, B=%lld T=%lld Hk=%lld Hv=%lld Dk=%lld Dv=%lld %s, %d threads\n",
              o.a.c_str(), o.b.c_str(), o.direction.c_str(), (long long)o.B, (long long)o.T,
              (long long)o.Hk, (long long)o.Hv, (long long)o.Dk, (long long)o.Dv, o.gate.c_str(),
              threads);
  std::printf("  A/A ratio   median %.3f  [min %.3f, max %.3f]  %s\n", quantile(aa, 0.5),
              quantile(aa, 0), quantile(aa, 1),
              aa_ok ? "includes 1" : "DOES NOT include 1: machine too noisy, ratio not trusted");
  std::printf("  %-10s  median %.4f s  %7.1f GFLOP/s  %6.2f GB/s\n", o.a.c_str(), ma,
              o.flops() / ma / 1e9, o.bytes() / ma / 1e9);
  std::printf(
      "  %-10s  median %.4f s  %7.1f GFLOP/s  %6.2f GB/s  (%.0f%% of the %.1f GFLOP/s "
      "fp32 FMA peak)\n",
      o.b.c_str(), mb, o.flops() / mb / 1e9, o.bytes() / mb / 1e9,
      peak > 0 ? 100.0 * o.flops() / mb / 1e9 / peak : 0.0, peak);
  std::printf("  A/B ratio time(%s)/time(%s)  median %.3f  [IQR %.3f-%.3f, min %.3f, max %.3f]\n",
              o.a.c_str(), o.b.c_str(), quantile(ab, 0.5), quantile(ab, 0.25), quantile(ab, 0.75),
              quantile(ab, 0), quantile(ab, 1));
  std::printf("  rel error %s vs %s: %s\n", o.a.c_str(), o.b.c_str(), err.dump().c_str());
  if (!o.json_path.empty()) std::ofstream(o.json_path) << j.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Compare two gdr CPU paths (A/A then A/B alternating pairs), or time one path"};
  app.add_option("--a", o.a,
                 "path A (sequential, chunkwise, reference, automatic; fwdbwd of chunkwise and "
                 "automatic saves the chunk states, :intermediates also Tinv and Vnew, "
                 ":recompute nothing)")
      ->capture_default_str();
  app.add_option("--b", o.b, "path B")->capture_default_str();
  app.add_option("--direction", o.direction, "fwd or fwdbwd")->capture_default_str();
  app.add_option("--mode", o.mode,
                 "ab (compare a and b), single (time a, peak memory) or products (rate inside "
                 "the chunkwise products; needs -DGDR_PROFILE_PRODUCTS=ON)")
      ->capture_default_str();
  app.add_option("--B", o.B, "batch")->capture_default_str();
  app.add_option("--T", o.T, "tokens")->capture_default_str();
  app.add_option("--Hk", o.Hk, "key heads")->capture_default_str();
  app.add_option("--Hv", o.Hv, "value heads")->capture_default_str();
  app.add_option("--dk", o.Dk, "key head dim")->capture_default_str();
  app.add_option("--dv", o.Dv, "value head dim")->capture_default_str();
  app.add_option("--gate", o.gate, "scalar or per_key")->capture_default_str();
  app.add_option("--threads", o.threads, "threads (0 = all)")->capture_default_str();
  app.add_option("--chunk", o.chunk, "chunk size (and checkpoint interval)")->capture_default_str();
  app.add_option("--pairs", o.pairs, "A/A and A/B pairs (single: timed runs)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "input seed")->capture_default_str();
  app.add_option("--json", o.json_path, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  if (o.direction != "fwd" && o.direction != "fwdbwd") {
    std::fprintf(stderr, "cpu_paths: --direction is %s; supported: fwd, fwdbwd\n",
                 o.direction.c_str());
    return 2;
  }
  try {
    if (o.mode == "products") return run_products(o);
    return o.mode == "single" ? run_single(o) : run_ab(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu_paths: %s\n", e.what());
    return 1;
  }
}
