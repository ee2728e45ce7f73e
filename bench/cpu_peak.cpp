// cpu_peak: the fp32 ceilings of this CPU that the CPU paths are measured against.
//
//   FMA peak  - bench/fma_peak.h: 12 independent 8-wide AVX2 FMA chains per thread, unrolled,
//               no memory traffic; 192 flops per iteration; one thread and all threads.
//   sgemm     - Eigen's C = A B on N x N fp32 matrices (2 N^3 flops), one thread and all
//               threads (Eigen's OpenMP-parallel product), best of a few runs.
//
// Usage: cpu_peak [--n 1024] [--threads 0] [--json PATH]
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cpu/eigen.h"
#include "fma_peak.h"

namespace {

struct Options {
  int n = 1024;     // sgemm size
  int threads = 0;  // 0 = all
  int reps = 5;
  std::string json_path;
  double sgemm_flops() const { return 2.0 * n * n * n; }
};

double sgemm_gflops(const Options& o, int threads) {
  Eigen::setNbThreads(threads);
  Eigen::MatrixXf A = Eigen::MatrixXf::Random(o.n, o.n), B = Eigen::MatrixXf::Random(o.n, o.n);
  Eigen::MatrixXf C(o.n, o.n);
  C.noalias() = A * B;  // warm-up
  double best = 0;
  for (int r = 0; r < o.reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    C.noalias() = A * B;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, o.sgemm_flops() / s / 1e9);
  }
  if (!std::isfinite(C(0, 0))) std::printf("(non-finite product)\n");
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"fp32 FMA peak and Eigen sgemm rate of this CPU"};
  app.add_option("--n", o.n, "sgemm size N")->capture_default_str();
  app.add_option("--threads", o.threads, "threads for the all-core figures (0 = all)");
  app.add_option("--reps", o.reps, "runs per figure (best kept)")->capture_default_str();
  app.add_option("--json", o.json_path, "write the figures as JSON");
  CLI11_PARSE(app, argc, argv);
  const int all = o.threads > 0 ? o.threads : omp_get_max_threads();

  const double fma1 = gdr::bench::fma_peak_gflops(1);
  const double fman = gdr::bench::fma_peak_gflops(all);
  const double gemm1 = sgemm_gflops(o, 1);
  const double gemmn = sgemm_gflops(o, all);
  std::printf("%-34s %10s %10s\n", "fp32", "1 thread", "threads");
  std::printf("%-34s %10.1f %10.1f  (%d threads)\n", "FMA peak GFLOP/s (12 AVX2 chains)", fma1,
              fman, all);
  std::printf("%-34s %10.1f %10.1f  (%.0f%% / %.0f%% of FMA peak)\n",
              ("Eigen sgemm GFLOP/s N=" + std::to_string(o.n)).c_str(), gemm1, gemmn,
              100 * gemm1 / fma1, 100 * gemmn / fman);
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"threads", all},
                        {"fma_peak_gflops_1thread", fma1},
                        {"fma_peak_gflops", fman},
                        {"sgemm_n", o.n},
                        {"sgemm_gflops_1thread", gemm1},
                        {"sgemm_gflops", gemmn},
                        {"method",
                         "FMA: 12 independent 8-wide AVX2 FMA chains per thread, 192 flops per "
                         "iteration, best of 3; sgemm: Eigen C=A*B, 2N^3 flops, best of reps"}};
    std::ofstream(o.json_path) << j.dump(2) << "\n";
  }
  return 0;
}
