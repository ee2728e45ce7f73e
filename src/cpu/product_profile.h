// Profile of the matrix products inside the chunkwise path (bench builds only).
//
// Compiled in when CMake's GDR_PROFILE_PRODUCTS is ON (default OFF). Each Eigen matrix product
// of chunkwise_{common,forward,backward}.cpp is wrapped in GDR_PRODUCT(site, m, n, k, stmt):
// an [m, k] x [k, n] product (every shape as executed, including the zero triangle of the
// [n, n] operands) counts 2 m n k flops, and the wall time of `stmt` (steady_clock, read before
// and after) is added to the calling thread's counter of `site`. Counters are per OpenMP thread
// (slot omp_get_thread_num(), one cache-line-aligned block per thread, no atomics), so the
// threads never share a line. With the option OFF, GDR_PRODUCT(site, m, n, k, stmt) is `stmt`
// and nothing else: zero cost.
//
// The forward substitution of Tinv (n row-vector x matrix products, row r: [1, r] x [r, r]) is
// one site timed as a whole, sum_r 2 r^2 flops. Products with a triangular factor or a
// triangular result (Eigen's triangularView) count the flops of the triangle they compute:
// tri_flops below.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace gdr::cpu::profile {

// One site per product in the source (forward, backward state pass, backward reverse pass).
// Shapes use n = tokens in the chunk (C = 64 but for the last chunk), D = Dk or Dv.
enum class Site : int {
  fwd_qk_kk,      // forward: Q K^T, K K^T                         [n, Dk] x [Dk, n]
  fwd_qw_S,       // forward: [e .* Q ; Kb] S                      [2n, Dk] x [Dk, Dv]
  fwd_P_vnew,     // forward: O += P Vnew                          [n, n] x [n, Dv]
  fwd_S_update,   // forward: S += (d .* K)^T Vnew                 [Dk, n] x [n, Dv]
  st_kk,          // backward state pass: K K^T                    [n, Dk] x [Dk, n]
  st_S_update,    // backward state pass: S += (d .* K)^T Vnew     [Dk, n] x [n, Dv]
  bwd_qk_kk,      // backward: Q K^T, K K^T                        [n, Dk] x [Dk, n]
  kb_S,           // backward (state pass or reverse pass): z = beta .* V - Kb S  [n, Dk] x [Dk, Dv]
  bwd_kd_dS,      // backward: dVnew = (d .* K) dS                 [n, Dk] x [Dk, Dv]
  bwd_Pt_dO,      // backward: dVnew += scale P^T dO               [n, n] x [n, Dv]
  bwd_vnew_dSt,   // backward: Y = Vnew dS^T                       [n, Dv] x [Dv, Dk]
  bwd_r2_St,      // backward: [X1 ; dKb] = r2 S^T                 [2n, Dv] x [Dv, Dk]
  bwd_dS_update,  // backward: dS += [e .* Q ; Kb]^T r2            [Dk, 2n] x [2n, Dv]
  bwd_Tinvt,      // backward: dVb = Tinv^T dVnew                  [n, n] x [n, Dv]
  bwd_dA_dP,      // backward: [dP ; dA] = r2 Vnew^T, lower        [n, Dv] x [Dv, n] twice
  tinv_rows,      // both: Tinv by forward substitution            sum_r [1, r] x [r, r]
  tinv_vnew,      // both: Vnew = Tinv z                           [n, n] x [n, Dv]
  pair_bwd,       // backward: pairwise dX = N Y, dY = N^T X        [n, n] x [n, Dk]
  pk_offdiag,     // per-key gate: off-diagonal blocks (P, KKg and their backward)
  pk_diag_rows,   // per-key gate: diagonal-block rows              [1, len] x [len, Dk]
  count
};
inline constexpr int kSites = static_cast<int>(Site::count);

// 2 x (multiply-adds) of an [n, n] triangle (diagonal included when `diag`) times [n, d], or
// of the [n, n] triangle of an [n, d] x [d, n] product.
constexpr double tri_flops(double n, double d, bool diag) {
  return (diag ? n * (n + 1) : n * (n - 1)) * d;
}

// Name and shape of each site, in Site order.
const char* site_name(Site s);

struct Counter {
  double seconds = 0.0;  // wall time inside the site's products
  double flops = 0.0;    // sum of 2 m n k over its products
  std::int64_t calls = 0;
};
using ThreadCounters = std::array<Counter, kSites>;

#ifdef GDR_PROFILE_PRODUCTS
inline constexpr bool kEnabled = true;
#else
inline constexpr bool kEnabled = false;
#endif

// Zeroes every thread's counters (call outside parallel regions).
void reset();
// Counters of OpenMP threads 0 .. threads-1 (call outside parallel regions).
std::vector<ThreadCounters> snapshot(int threads);
// Seconds since an arbitrary origin (steady_clock), and the adder used by GDR_PRODUCT.
double now();
void add(Site s, double t0, double flops);

}  // namespace gdr::cpu::profile

#ifdef GDR_PROFILE_PRODUCTS
#define GDR_PRODUCT(site, m, n, k, ...)                                        \
  do {                                                                         \
    const double gdr_profile_t0_ = ::gdr::cpu::profile::now();                 \
    __VA_ARGS__;                                                               \
    ::gdr::cpu::profile::add(::gdr::cpu::profile::Site::site, gdr_profile_t0_, \
                             2.0 * double(m) * double(n) * double(k));         \
  } while (0)
// A region of several products whose flops are given in total.
#define GDR_PRODUCT_REGION(site, flops, ...)                                             \
  do {                                                                                   \
    const double gdr_profile_t0_ = ::gdr::cpu::profile::now();                           \
    __VA_ARGS__;                                                                         \
    ::gdr::cpu::profile::add(::gdr::cpu::profile::Site::site, gdr_profile_t0_, (flops)); \
  } while (0)
#else
#define GDR_PRODUCT(site, m, n, k, ...) __VA_ARGS__
#define GDR_PRODUCT_REGION(site, flops, ...) __VA_ARGS__
#endif
