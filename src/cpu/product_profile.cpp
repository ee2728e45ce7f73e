// Per-thread counters of the chunkwise products (product_profile.h). Always compiled (the bench
// asks kEnabled); only GDR_PRODUCT calls add(), and only when GDR_PROFILE_PRODUCTS is defined.
#include "cpu/product_profile.h"

#include <omp.h>

#include <chrono>

namespace gdr::cpu::profile {
namespace {

constexpr int kMaxThreads = 256;

// One thread's counters, on cache lines of their own.
struct alignas(64) Slot {
  ThreadCounters c{};
};
Slot g_slots[kMaxThreads];

}  // namespace

const char* site_name(Site s) {
  switch (s) {
    case Site::fwd_qk_kk: return "fwd  Q K^T, K K^T        [n,Dk]x[Dk,n]";
    case Site::fwd_qw_S: return "fwd  [e.*Q; Kb] S        [2n,Dk]x[Dk,Dv]";
    case Site::fwd_P_vnew: return "fwd  O += P Vnew         [n,n]x[n,Dv]";
    case Site::fwd_S_update: return "fwd  S += (d.*K)^T Vnew  [Dk,n]x[n,Dv]";
    case Site::st_kk: return "st   K K^T               [n,Dk]x[Dk,n]";
    case Site::st_S_update: return "st   S += (d.*K)^T Vnew  [Dk,n]x[n,Dv]";
    case Site::bwd_qk_kk: return "bwd  Q K^T, K K^T        [n,Dk]x[Dk,n]";
    case Site::kb_S: return "bwd  z = vb - Kb S       [n,Dk]x[Dk,Dv]";
    case Site::bwd_kd_dS: return "bwd  (d.*K) dS           [n,Dk]x[Dk,Dv]";
    case Site::bwd_Pt_dO: return "bwd  P^T dO              [n,n]x[n,Dv]";
    case Site::bwd_vnew_dSt: return "bwd  Vnew dS^T           [n,Dv]x[Dv,Dk]";
    case Site::bwd_r2_St: return "bwd  r2 S^T              [2n,Dv]x[Dv,Dk]";
    case Site::bwd_dS_update: return "bwd  dS += qw^T r2       [Dk,2n]x[2n,Dv]";
    case Site::bwd_Tinvt: return "bwd  dVb = Tinv^T dVnew  [n,n]x[n,Dv]";
    case Site::bwd_dA_dP: return "bwd  dA, dP = r2 Vnew^T  [n,Dv]x[Dv,n]";
    case Site::tinv_rows: return "both Tinv fwd subst      [1,r]x[r,r]";
    case Site::tinv_vnew: return "both Vnew = Tinv z       [n,n]x[n,Dv]";
    case Site::pair_bwd: return "bwd  pairwise dX, dY     [n,n]x[n,Dk]";
    case Site::pk_offdiag: return "pk   off-diagonal blocks";
    case Site::pk_diag_rows: return "pk   diagonal-block rows [1,len]x[len,Dk]";
    case Site::count: break;
  }
  return "?";
}

void reset() {
  for (Slot& s : g_slots) s.c = ThreadCounters{};
}

std::vector<ThreadCounters> snapshot(int threads) {
  std::vector<ThreadCounters> out;
  for (int t = 0; t < threads && t < kMaxThreads; ++t) out.push_back(g_slots[t].c);
  return out;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void add(Site s, double t0, double flops) {
  const double dt = now() - t0;
  const int t = omp_get_thread_num();
  if (t < 0 || t >= kMaxThreads) return;
  Counter& c = g_slots[t].c[static_cast<int>(s)];
  c.seconds += dt;
  c.flops += flops;
  ++c.calls;
}

}  // namespace gdr::cpu::profile
