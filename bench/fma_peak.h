// The machine's fp32 FMA peak, measured: every thread runs an unrolled loop of 12 independent
// 8-wide AVX2 FMA chains, acc_c = acc_c * x + y (12 chains hide the 4-cycle FMA latency on two
// FMA pipes, which needs 8), so one iteration is 12 x 8 x 2 = 192 flops and the loop is bound
// by FMA throughput alone (no loads or stores). The rate reported is flops / wall time.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>

namespace gdr::bench {

__attribute__((target("avx2,fma"))) inline float fma_chains(std::int64_t iters, float seed) {
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-6f);
  __m256 a0 = _mm256_set1_ps(seed), a1 = _mm256_add_ps(a0, y), a2 = _mm256_add_ps(a1, y);
  __m256 a3 = _mm256_add_ps(a2, y), a4 = _mm256_add_ps(a3, y), a5 = _mm256_add_ps(a4, y);
  __m256 a6 = _mm256_add_ps(a5, y), a7 = _mm256_add_ps(a6, y), a8 = _mm256_add_ps(a7, y);
  __m256 a9 = _mm256_add_ps(a8, y), a10 = _mm256_add_ps(a9, y), a11 = _mm256_add_ps(a10, y);
  for (std::int64_t i = 0; i < iters; ++i) {
    a0 = _mm256_fmadd_ps(a0, x, y);
    a1 = _mm256_fmadd_ps(a1, x, y);
    a2 = _mm256_fmadd_ps(a2, x, y);
    a3 = _mm256_fmadd_ps(a3, x, y);
    a4 = _mm256_fmadd_ps(a4, x, y);
    a5 = _mm256_fmadd_ps(a5, x, y);
    a6 = _mm256_fmadd_ps(a6, x, y);
    a7 = _mm256_fmadd_ps(a7, x, y);
    a8 = _mm256_fmadd_ps(a8, x, y);
    a9 = _mm256_fmadd_ps(a9, x, y);
    a10 = _mm256_fmadd_ps(a10, x, y);
    a11 = _mm256_fmadd_ps(a11, x, y);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0] + out[7];
}

// fp32 FMA GFLOP/s of `threads` threads (each its own chains), best of `reps` runs of `iters`
// iterations. Returns 0 when the CPU has no AVX2/FMA.
inline double fma_peak_gflops(int threads, std::int64_t iters = 20'000'000, int reps = 3) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0.0;
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    total += fma_chains(iters, 1.0f + 0.001f * static_cast<float>(omp_get_thread_num()));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    const double gflops = 192.0 * static_cast<double>(iters) * threads / s / 1e9;
    if (gflops > best) best = gflops;
  }
  return best;
}

}  // namespace gdr::bench
