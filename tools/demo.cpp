// `gdr demo`: the per-token training loop against the chunkwise form on one layer, on the CPU
// (`gdr demo --device cuda`, the training step on the GPU, is demo_cuda.cpp; the layer and its
// inputs are demo_layer.h).
//
// On the seed layer (Hk = 16, Hv = 32, Dk = Dv = 128, one layer, forward + backward, fp32 by
// default) and for each T, runs
//   sequential - the fp32 per-token loop of docs/operator.md §2; backward by reverse mode with
//                states saved every C tokens (O(T / C) memory), the careful baseline
//   chunkwise  - the chunkwise-parallel form of docs/operator.md §3-4 (matrix products); a
//                training step as the torch layer runs it: the forward saves the chunk-boundary
//                states (ForwardParams::saved, allocated in each timed step) and the backward
//                recomputes each chunk's matrices from them
// each in a fresh child process (this binary re-executed with the hidden `demo-worker`
// subcommand), and prints time, peak memory, their ratios and the relative Frobenius error
// between the two paths' outputs and gradients.
//
// Peak memory: the child's peak RSS (VmHWM; getrusage's ru_maxrss would include this parent's
// RSS at fork time) minus its RSS once the inputs, the gradient seed and every output buffer
// are allocated and written, i.e. the extra memory the path itself needs for forward + backward.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "demo_layer.h"
#include "gdr/gdr.h"
#include "process_memory.h"

namespace {

using std::int64_t;
using json = nlohmann::json;
namespace demo = gdr::tools::demo;

struct WorkerOptions {
  std::string path = "chunkwise";
  int64_t T = 512, Hk = 16, Hv = 32, Dk = 128, Dv = 128, batch = 1;
  std::string dtype = "f32";
  int threads = 0, repeats = 2;
  std::uint64_t seed = 20261129;
  std::string dump;  // prefix of the files the outputs are written to (as f32); empty: none
};

// The child: one path, one T; prints one JSON line.
int run_worker(const WorkerOptions& w) {
  const gdr::DType dt = demo::parse_dtype(w.dtype);
  demo::Layer l = demo::make_layer({w.batch, w.T, w.Hk, w.Hv, w.Dk, w.Dv}, dt, w.seed);
  gdr::ForwardParams fp = demo::forward_params(l);
  gdr::BackwardParams bp = demo::backward_params(l);
  gdr::ExecConfig cfg;
  cfg.path = w.path == "sequential" ? gdr::Path::sequential : gdr::Path::chunkwise;
  cfg.num_threads = w.threads;

  const bool save_states = cfg.path == gdr::Path::chunkwise;

  const double baseline = gdr::process::rss_bytes();
  double best_f = 1e300, best_b = 1e300;
  for (int r = 0; r < std::max(1, w.repeats); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    // The chunk-boundary states of this step (docs/operator.md §3), fresh memory as in training.
    std::unique_ptr<std::byte[]> saved;
    if (save_states) {
      const gdr::SavedShape shape = gdr::saved_shape(gdr::validate_forward(fp));
      saved.reset(new std::byte[static_cast<std::size_t>(shape.bytes())]);
      fp.saved = bp.saved = shape.view(saved.get());
    }
    gdr::forward(fp, cfg);
    const auto t1 = std::chrono::steady_clock::now();
    gdr::backward(bp, cfg);
    const auto t2 = std::chrono::steady_clock::now();
    fp.saved = bp.saved = gdr::TensorView{};
    best_f = std::min(best_f, std::chrono::duration<double>(t1 - t0).count());
    best_b = std::min(best_b, std::chrono::duration<double>(t2 - t1).count());
  }
  const double peak = gdr::process::peak_rss_bytes();

  if (!w.dump.empty()) {
    const std::vector<demo::Buffer*> outs = l.outputs();
    for (std::size_t i = 0; i < outs.size(); ++i) {
      std::ofstream f(w.dump + "." + demo::kOutputNames[i], std::ios::binary);
      const std::vector<float> tmp = outs[i]->to_floats();
      f.write(reinterpret_cast<const char*>(tmp.data()), std::streamsize(tmp.size() * 4));
    }
  }
  json out = {{"forward_s", best_f},
              {"backward_s", best_b},
              {"peak_rss_bytes", peak},
              {"baseline_rss_bytes", baseline}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  const auto bytes = static_cast<std::size_t>(f.tellg());
  std::vector<float> x(bytes / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(x.data()), std::streamsize(bytes));
  return x;
}

std::string self_exe() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) throw gdr::RuntimeFailure("gdr demo: cannot find this program (/proc/self/exe)");
  return std::string(buf.data(), static_cast<std::size_t>(n));
}

struct Measured {
  double fwd = 0, bwd = 0, peak = 0, baseline = 0;
  double total() const { return fwd + bwd; }
  double extra_gb() const { return std::max(0.0, peak - baseline) / 1e9; }
};

Measured spawn_worker(const std::string& exe, const WorkerOptions& w) {
  std::ostringstream cmd;
  cmd << '"' << exe << "\" demo-worker --path " << w.path << " --T " << w.T << " --Hk " << w.Hk
      << " --Hv " << w.Hv << " --dk " << w.Dk << " --dv " << w.Dv << " --dtype " << w.dtype
      << " --threads " << w.threads << " --batch " << w.batch << " --repeats " << w.repeats
      << " --seed " << w.seed;
  if (!w.dump.empty()) cmd << " --dump \"" << w.dump << '"';
  FILE* pipe = popen(cmd.str().c_str(), "r");
  if (!pipe) throw gdr::RuntimeFailure("gdr demo: cannot start " + cmd.str());
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) out += buf;
  const int rc = pclose(pipe);
  if (rc != 0) throw gdr::RuntimeFailure("gdr demo: worker failed (" + cmd.str() + "): " + out);
  const json j = json::parse(out);
  return Measured{j.at("forward_s"), j.at("backward_s"), j.at("peak_rss_bytes"),
                  j.at("baseline_rss_bytes")};
}

int run_demo(const demo::Options& d) {
  if (d.heads.size() != 2)
    throw gdr::InvalidArgument("gdr demo: --heads takes Hk,Hv (two numbers)");
  demo::parse_dtype(d.dtype);
  const std::string exe = self_exe();
  char tmpl[] = "/tmp/gdr-demo-XXXXXX";
  if (!mkdtemp(tmpl)) throw gdr::RuntimeFailure("gdr demo: cannot create a temporary directory");
  const std::string tmpdir = tmpl;
  const int64_t Hk = d.heads[0], Hv = d.heads[1];

  std::fprintf(stdout,
               "gdr demo: one layer, B=%lld Hk=%lld Hv=%lld Dk=%lld Dv=%lld, %s, forward + "
               "backward, %s threads\n",
               (long long)d.batch, (long long)Hk, (long long)Hv, (long long)d.Dk, (long long)d.Dv,
               d.dtype.c_str(), d.threads > 0 ? std::to_string(d.threads).c_str() : "all");
  std::fprintf(
      stdout,
      "  sequential: fp32 per-token loop, backward from states saved every 64 tokens\n"
      "  chunkwise:  chunkwise-parallel form (docs/operator.md §3-4), chunk 64, matrix products; "
      "the\n"
      "              forward saves the chunk-boundary states for the backward\n"
      "  each (path, T) runs in a fresh process; time: the fastest of %d forward + backward;\n"
      "  GB: peak RSS minus the RSS once inputs and outputs are allocated (extra memory)\n\n",
      d.repeats);
  std::fflush(stdout);

  json rows = json::array();
  std::vector<std::string> lines;
  double seq_rate = 0;  // seconds per token of the sequential path, from the last row
  const size_t steps = d.T.size() * 2;
  size_t step = 0;
  const auto progress = [&](const std::string& what) {
    ++step;
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s ...", step, steps, what.c_str());
    std::fflush(stderr);
  };
  for (const int64_t T : d.T) {
    WorkerOptions w;
    w.T = T;
    w.Hk = Hk;
    w.Hv = Hv;
    w.Dk = d.Dk;
    w.Dv = d.Dv;
    w.batch = d.batch;
    w.dtype = d.dtype;
    w.threads = d.threads;
    w.repeats = d.repeats;
    w.seed = d.seed + static_cast<std::uint64_t>(T);
    // Sequential: when its predicted time exceeds the budget, measure it on fewer heads (the
    // heads are independent, so time scales with their number) and scale.
    int64_t shrink = 1;
    if (seq_rate > 0) {
      const double predicted = seq_rate * double(T) * double(d.repeats);
      while (predicted / double(shrink) > d.max_sequential_s && Hk % (shrink * 2) == 0 &&
             Hv % (shrink * 2) == 0)
        shrink *= 2;
    }
    WorkerOptions ws = w, wc = w;
    ws.path = "sequential";
    ws.Hk = Hk / shrink;
    ws.Hv = Hv / shrink;
    if (shrink == 1) ws.dump = tmpdir + "/seq";
    wc.dump = tmpdir + "/chunk";
    if (shrink > 1) wc.dump.clear();
    progress("T=" + std::to_string(T) + " chunkwise");
    const Measured mc = spawn_worker(exe, wc);
    progress("T=" + std::to_string(T) + " sequential" +
             (shrink > 1 ? " (on " + std::to_string(Hv / shrink) + " value heads)" : ""));
    Measured ms = spawn_worker(exe, ws);
    seq_rate = ms.total() * double(shrink) / double(T) / 1.0;
    ms.fwd *= double(shrink);
    ms.bwd *= double(shrink);

    json err = json::object();
    if (shrink == 1) {
      for (const char* name : {"o", "dq", "dk", "dv", "dg", "dbeta"}) {
        const std::string suffix = std::string(".") + name;
        err[name] = demo::rel_error(read_floats(wc.dump + suffix), read_floats(ws.dump + suffix));
        std::remove((wc.dump + suffix).c_str());
        std::remove((ws.dump + suffix).c_str());
      }
    }
    const double speedup = ms.total() / mc.total();
    const double mem_ratio = mc.extra_gb() > 0 ? ms.extra_gb() / mc.extra_gb() : NAN;
    json row = {{"T", T},
                {"sequential",
                 {{"forward_s", ms.fwd},
                  {"backward_s", ms.bwd},
                  {"seconds", ms.total()},
                  {"peak_extra_gb", ms.extra_gb()},
                  {"peak_total_gb", ms.peak / 1e9},
                  {"measured_value_heads", Hv / shrink},
                  {"time_scaled_by", shrink}}},
                {"chunkwise",
                 {{"forward_s", mc.fwd},
                  {"backward_s", mc.bwd},
                  {"seconds", mc.total()},
                  {"peak_extra_gb", mc.extra_gb()},
                  {"peak_total_gb", mc.peak / 1e9}}},
                {"speedup", speedup},
                {"memory_ratio", mem_ratio},
                {"rel_error_chunkwise_vs_sequential", err}};
    rows.push_back(row);
    char line[512];
    const double eo = err.contains("o") ? err["o"].get<double>() : NAN;
    double eg = 0;
    for (const char* name : {"dq", "dk", "dv", "dg", "dbeta"})
      if (err.contains(name)) eg = std::max(eg, err[name].get<double>());
    if (!err.contains("dq")) eg = NAN;
    std::snprintf(line, sizeof line,
                  "%6lld | %9.3f%s %8.3f | %9.3f %8.3f | %7.1fx %7.1fx | %8.1e %8.1e", (long long)T,
                  ms.total(), shrink > 1 ? "*" : " ", ms.extra_gb(), mc.total(), mc.extra_gb(),
                  speedup, mem_ratio, eo, eg);
    lines.push_back(line);
    if (shrink > 1)
      lines.push_back("         * sequential timed on " + std::to_string(Hv / shrink) +
                      " of the value heads and scaled by " + std::to_string(shrink) +
                      "; its memory is that run's; no error measured");
  }
  std::fprintf(stderr, "\r\033[K");
  std::printf("%6s | %10s %8s | %9s %8s | %8s %8s | %8s %8s\n", "T", "seq s", "seq GB", "chunk s",
              "chunk GB", "speedup", "memory", "err o", "err grad");
  std::printf("%s\n", std::string(96, '-').c_str());
  for (const std::string& l : lines) std::printf("%s\n", l.c_str());
  std::printf(
      "\nspeedup = sequential time / chunkwise time; memory = sequential GB / chunkwise GB;\n"
      "err = relative Frobenius error of chunkwise against sequential (grad: the largest of\n"
      "dq, dk, dv, dg, dbeta). Both paths are tested against the float64 reference.\n");
  std::fflush(stdout);
  rmdir(tmpdir.c_str());

  if (!d.json_path.empty()) {
    json doc = {{"command", "gdr demo"},
                {"shape", {{"B", d.batch}, {"Hk", Hk}, {"Hv", Hv}, {"Dk", d.Dk}, {"Dv", d.Dv}}},
                {"dtype", d.dtype},
                {"threads", d.threads},
                {"repeats", d.repeats},
                {"seed", d.seed},
                {"memory",
                 "peak RSS of a fresh process minus its RSS with inputs and outputs "
                 "allocated"},
                {"rows", rows}};
    std::ofstream f(d.json_path);
    f << doc.dump(2) << "\n";
    if (!f) throw gdr::RuntimeFailure("gdr demo: cannot write " + d.json_path);
    std::printf("wrote %s\n", d.json_path.c_str());
  }
  return 0;
}

// Runs f; a gdr or system error becomes a message and exit status 1.
template <class F>
void report_errors(const char* what, F&& f) {
  try {
    f();
  } catch (const CLI::Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    if (msg.rfind("gdr", 0) == 0)
      std::fprintf(stderr, "\n%s\n", msg.c_str());
    else
      std::fprintf(stderr, "\n%s: %s\n", what, msg.c_str());
    throw CLI::RuntimeError(1);
  }
}

}  // namespace

namespace gdr::tools {

void add_demo_command(CLI::App& app) {
  auto opts = std::make_shared<demo::Options>();
  CLI::App* demo = app.add_subcommand(
      "demo", "Time and peak memory of the per-token loop vs the chunkwise form on one layer");
  demo->add_option("--T", opts->T, "sequence lengths")->delimiter(',')->capture_default_str();
  demo->add_option("--heads", opts->heads, "Hk,Hv")->delimiter(',')->capture_default_str();
  demo->add_option("--dk", opts->Dk, "key head dim")->capture_default_str();
  demo->add_option("--dv", opts->Dv, "value head dim")->capture_default_str();
  demo->add_option("--dtype", opts->dtype, "f32, bf16, f16 or f64")->capture_default_str();
  demo->add_option("--threads", opts->threads, "CPU threads (0 = all)")->capture_default_str();
  demo->add_option("--batch", opts->batch, "batch size")->capture_default_str();
  demo->add_option("--repeats", opts->repeats, "timed runs per point (fastest kept)")
      ->capture_default_str();
  demo->add_option("--max-sequential-seconds", opts->max_sequential_s,
                   "above this predicted time the sequential path is timed on fewer heads and "
                   "scaled")
      ->capture_default_str();
  demo->add_option("--seed", opts->seed, "input seed")->capture_default_str();
  demo->add_option("--json", opts->json_path, "write the rows as JSON to this file");
  demo->add_option("--device", opts->device,
                   "cpu: the per-token loop against the chunkwise form; cuda: the training step on "
                   "the GPU (defaults there: --dtype bf16, --T 512,...,65536)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  demo->add_option("--max-check-T", opts->max_check_T,
                   "cuda: compare with the CPU sequential path up to this T")
      ->capture_default_str();
  demo->callback([opts, demo] {
    report_errors("gdr demo", [&] {
      if (opts->device == "cpu") {
        run_demo(*opts);
        return;
      }
      demo::Options d = *opts;
      if (demo->count("--dtype") == 0) d.dtype = "bf16";
      if (demo->count("--T") == 0) d.T = {512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
      demo::run_demo_cuda(d);
    });
  });

  auto w = std::make_shared<WorkerOptions>();
  CLI::App* worker = app.add_subcommand("demo-worker", "");
  worker->group("");  // hidden: the child process of `gdr demo`
  worker->add_option("--path", w->path);
  worker->add_option("--T", w->T);
  worker->add_option("--Hk", w->Hk);
  worker->add_option("--Hv", w->Hv);
  worker->add_option("--dk", w->Dk);
  worker->add_option("--dv", w->Dv);
  worker->add_option("--dtype", w->dtype);
  worker->add_option("--threads", w->threads);
  worker->add_option("--batch", w->batch);
  worker->add_option("--repeats", w->repeats);
  worker->add_option("--seed", w->seed);
  worker->add_option("--dump", w->dump);
  worker->callback([w] { report_errors("gdr demo-worker", [&] { run_worker(*w); }); });
}

}  // namespace gdr::tools
