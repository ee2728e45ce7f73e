// Chunkwise form of the gated delta rule (docs/operator.md §3): the per-chunk algebra shared by the
// forward (chunkwise_forward.cpp) and the backward (chunkwise_backward.cpp).
//
// One work item is (sequence n, key head hk, value heads [hv0, hv1) of hk's group): the key-side
// products of a chunk (K K^T, Q K^T for scalar gates) are formed once and shared by those value
// heads. Per chunk of n <= C tokens, all buffers row-major, Real = float (double for f64 inputs):
//
//   q, k  [n, Dk]   v [n, Dv]   g [n, Wg] (Wg = 1 scalar gate, Dk per-key gate)   beta [n]
//   G = cumsum(g) (double), e = exp(G), d = exp(G_n - G), gn = exp(G_n)        [n, Wg], [Wg]
//   P   = lower(Gam .* (Q K^T))  (diagonal included)                            [n, n]
//   KKg = Gam .* (K K^T)         (A = strict_lower(diag(beta) KKg))             [n, n]
// Only lower triangles are used (KKg's upper part is 0): Q K^T and K K^T are formed on their
// lower triangle only (qk, kk keep zeros above the diagonal), and the products with P, Tinv and
// the backward's dP, dA go through Eigen's triangular views (about half the flops).
//   Tinv = (I + A)^{-1} by forward substitution: Tinv[r, :r] = -A[r, :r] Tinv[:r, :r]  [n, n]
//   qw  = [e .* Q ; Kb],  Kb = beta e .* K                                      [2n, Dk]
//   Vnew = Tinv (beta .* V - Kb S)                                              [n, Dv]
//        (= U - W S of the WY form, W = Tinv Kb, U = Tinv (beta .* V), with one triangular
//        product instead of two, and none in the backward's dKb: see chunkwise_backward.cpp)
//   O = scale (e .* Q S + P Vnew),  S_out = gn .* S + (d .* K)^T Vnew
//
// Scalar gates: Gam[r, j] = exp(G_r - G_j) for r >= j. Per-key gates: the pairwise products
// sum_i X[r,i] K[j,i] exp(G_r[i] - G_j[i]) are split into sub-blocks of kPkBlock rows. For a row
// block [r0, r1) and columns j < r0 the ratio factors through the reference row r0:
//   exp(G_r - G_j) = exp(G_r - G_r0) * exp(G_r0 - G_j),   both exponents <= 0 (r >= r0 > j),
// so that part is the product (X .* rf)(K .* cf)^T; inside the diagonal block the ratios are
// formed element by element (again every exponent <= 0). No exp(-G) is ever formed.
//
// Masked positions arrive from canonical.h as identity steps (g = 0, beta = 0, zero q, k, v),
// so masks run in-chunk. Extra memory: the per-thread Workspace (O(C D + C^2), plus D^2 states
// for the item's value heads) and, in the backward, per chunk and value head of the item being
// worked on: the state entering the chunk [Dk, Dv] and its Tinv, Vnew ([C, C], [C, Dv]; kept
// from the state pass for the reverse pass), unless the caller's saved-for-backward tensor
// (SavedRecords below) holds the states of every chunk already (the reverse pass then
// recomputes Tinv and Vnew chunk by chunk, or reads them too).
#pragma once

#ifndef EIGEN_DONT_PARALLELIZE
#define EIGEN_DONT_PARALLELIZE  // one (sequence, head) item per thread; no nested threading
#endif
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/eigen.h"
#include "gdr/params.h"
#include "gdr/problem.h"

namespace gdr::cpu::chunkwise {

using i64 = std::int64_t;

template <class Real>
using Mat = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Real>
using Vec = Eigen::Matrix<Real, Eigen::Dynamic, 1>;
template <class Real>
using MapMat = Eigen::Map<Mat<Real>>;

// Rows per sub-block of the per-key pairwise products (see the header comment).
inline constexpr int kPkBlock = 16;

// One unit of parallel work: sequence n, key head hk, value heads [hv0, hv1).
struct WorkItem {
  i64 n = 0, hk = 0, hv0 = 0, hv1 = 0;
  i64 split = 0;  // index of [hv0, hv1) within hk's group
  SequenceSpan seq;
  i64 chunk_row0 = 0;  // row of the sequence's first chunk in `saved`: sum_{m < n} ceil(L_m / C)
};

struct Plan {
  int threads = 1;
  i64 splits = 1;  // value-head ranges per key head (1: the whole group in one item)
  std::vector<WorkItem> items;
  i64 chunk_rows = 0;  // sum_n ceil(L_n / C): rows of `saved` that hold chunks
};

// The saved-for-backward tensor (ForwardParams::saved, [chunk_rows, Hv, record]): one record
// per chunk and value head, the state entering the chunk, followed (chunk_intermediates, record
// longer than Dk Dv) by the chunk's `solved` block (Workspace::solved_stride's layout):
//   S [Dk, Dv] at 0 | Tinv [C, C] at Dk Dv | Vnew [C, Dv] at Dk Dv + C^2
template <class Real>
struct SavedRecords {
  Real* data = nullptr;
  i64 row_stride = 0, head_stride = 0;  // elements between chunk rows, between value heads
  i64 state_size = 0;                   // Dk Dv: the solved block starts there
  bool has_solved = false;              // chunk_intermediates: Tinv, Vnew follow S

  SavedRecords() = default;
  SavedRecords(const TensorView& saved, i64 Dk, i64 Dv)
      : data(static_cast<Real*>(saved.data)),
        row_stride(saved.stride[0]),
        head_stride(saved.stride[1]),
        state_size(Dk * Dv),
        has_solved(saved.shape[2] > Dk * Dv) {}
  bool defined() const { return data != nullptr; }
  Real* state(i64 row, i64 hv) const { return data + row * row_stride + hv * head_stride; }
  Real* solved(i64 row, i64 hv) const { return state(row, hv) + state_size; }
};

// Asks the kernel (Linux madvise MADV_HUGEPAGE) to back the 2 MB-aligned interior of
// [data, data + bytes) with transparent huge pages, when bytes >= 4 MB; a no-op elsewhere. For
// the saved tensor: a caller allocates it afresh every training step and the forward touches
// every page first; at 4 KB a page, the page faults of a 92 MB tensor (T = 1024 of the seed
// layer) cost more than the state pass it saves (measured on the 2-core EPYC VM, 2026-11-29:
// 22k faults per step, ~15% of the step), one fault per 2 MB does not. Only advice: the data,
// and memory outside the range, are untouched.
void advise_huge_pages(void* data, i64 bytes);

// Items for every (sequence, key head); a key head's group of value heads is split into
// `splits` ranges only when there are fewer (sequence, key head) pairs than threads. Longest
// sequences first so that the dynamic schedule balances varlen batches.
// Every item's chunk_row0 uses config.chunk_size.
Plan make_plan(const Problem& prob, const Inputs& in, const ExecConfig& config);

// Per-thread buffers, allocated once per call and reused for every chunk (no allocation in the
// chunk loop). R = value heads per item.
template <class Real>
struct Workspace {
  int C = 0, Dk = 0, Dv = 0, Wg = 0;
  Mat<Real> q, k;             // [C, Dk]
  Mat<Real> qk, kk;           // [C, C] lower(Q K^T), lower(K K^T), 0 above (scalar gate; shared)
  Mat<Real> v, o, dout, dv;   // [C, Dv]
  Mat<Real> g;                // [C, Wg] log decay of the chunk
  Vec<Real> beta, dbeta;      // [C]
  Mat<double> G;              // [C, Wg] cumulative log decay
  Mat<Real> e, d;             // [C, Wg]
  Vec<Real> gn;               // [Wg]
  Mat<Real> gam;              // [C, C] scalar gate ratios
  Mat<Real> rf, cf;           // per key: [C, Dk] row factors, [sum of r0, Dk] column factors
  Mat<Real> ediag;            // per key: [C (kPkBlock + 1) / 2, Dk] diagonal-block ratios
  Mat<Real> ediag_k;          // per key: [kPkBlock, Dk] ratios .* K of one row
  Mat<Real> P, KKg, A, Tinv;  // [C, C]
  Mat<Real> vb;               // [C, Dv]  beta .* V
  Mat<Real> qw;               // [2C, Dk]  [e .* Q ; Kb],  Kb = beta e .* K
  Mat<Real> kd;               // [C, Dk]  d .* K
  Mat<Real> z, vnew;          // [C, Dv]  beta .* V - Kb S,  Vnew = Tinv z
  Mat<Real> qws;              // [2C, Dv]  qw S
  Mat<Real> xq, xk, yc;       // per key scratch [C, Dk]
  // backward
  Mat<Real> r2;                     // [2C, Dv]  [scale dO ; -dVb]
  Mat<Real> x;                      // [2C, Dk]  r2 S^T = [X1 ; dKb]
  Mat<Real> dvb, y;                 // [C, Dv] dVnew -> dVb;  [C, Dk] Vnew dS^T
  Mat<Real> dA, dP;                 // [C, C]
  Mat<Real> dxq, dxk, dyk;          // [C, Dk]
  Mat<Real> dG;                     // [C, Wg] gate terms summed by the reverse cumsum
  Mat<Real> dgd;                    // [C, Wg] gate terms added to dg_t directly
  Mat<Real> pk_acc;                 // per key: [2, Dk] running sums
  Mat<Real> dq_acc, dk_acc;         // [C, Dk] summed over the item's value heads
  Mat<Real> gate_n;                 // [1, Wg] exp(G_n) <S, dS> (per channel)
  Vec<Real> t1, t2, cs;             // [C] row dots, column suffix sums
  std::vector<Real> S, dS, states;  // [R, Dk, Dv], [R, Dk, Dv], [R, chunks, Dk, Dv]
  std::vector<Real> solved;         // [R, chunks, solved_stride()]: Tinv, Vnew per chunk
  std::vector<double> gate_part;    // [1 + Wg] dA_log, ddt_bias contributions of one chunk

  Workspace(int chunk, i64 key_dim, i64 value_dim, bool per_key, i64 heads, bool backward);

  // One chunk's entry of `solved`: Tinv [C, C] at 0, Vnew [C, Dv] at C^2 (first n rows used,
  // row-major, n columns for Tinv).
  i64 solved_stride() const { return i64(C) * C + i64(C) * Dv; }
};

// Copies the chunk's Tinv and Vnew from the workspace into a `solved` block
// (Workspace::solved_stride's layout), for the backward's reverse pass. A chunk of n < C tokens
// leaves the rest of each block as zeros, so every element is written.
template <class Real>
void keep_solved(const Workspace<Real>& w, int n, Real* solved);

// Loads the chunk's gates into w.g / w.beta beforehand. Computes G, e, d, gn and the ratios
// (gam for scalar gates, rf/cf for per-key gates) for n rows.
// Log decays below -kLogDecayFloor (-inf included) are raised to it in the chunk form: exp of any
// sum containing such a step underflows to exactly 0 in float and double.
inline constexpr double kLogDecayFloor = 1000.0;
template <class Real, bool PerKey>
void prepare_gates(Workspace<Real>& w, int n);

// P (when with_q) and KKg of the chunk (needs w.q, w.k and, for scalar gates, w.qk, w.kk).
template <class Real, bool PerKey>
void gated_products(Workspace<Real>& w, int n, bool with_q);

// A, Tinv = (I + A)^{-1}, vb = beta .* V and decayed_rows' qw, kd.
template <class Real, bool PerKey>
void solve_chunk(Workspace<Real>& w, int n, bool with_q);

// The decayed rows alone: qw = [e .* Q (top n rows, when with_q) ; Kb = beta e .* K] and
// kd = d .* K.
template <class Real, bool PerKey>
void decayed_rows(Workspace<Real>& w, int n, bool with_q);

// Vnew = Tinv z (n rows; the caller has set w.z = beta .* V - Kb S, its Kb S being part of a
// product it forms anyway).
template <class Real>
void solve_vnew(Workspace<Real>& w, int n);

// Vnew from the state S entering the chunk (after solve_chunk): z = beta .* V - Kb S, then
// solve_vnew. For the backward, which has no product of its own that forms Kb S.
template <class Real>
void vnew_from_state(Workspace<Real>& w, int n, const MapMat<Real>& S);

// Backward of the pairwise products (after gated_products of the same chunk and head, whose
// ratios it reuses): given upstream w.dP (for P) and w.dA already scaled by
// beta (for KKg), writes w.dxq (to dQ), w.dxk + w.dyk (to dK) and adds the gate terms to
// w.dgd, straight into dg (no reverse cumsum). With t[r, j] = dM[r, j] Gam[r, j] X_r . Y_j
// (per channel i for per-key gates), docs/operator.md §4's dG_r += sum_j t[r, j], dG_j -= sum_r
// t[r, j] followed by the reverse cumsum is, exactly,
//   dg_t += sum_{r >= t} sum_{j < t} t[r, j]
// (the diagonal r = j and the pairs with j >= t cancel). Formed this way there is nothing to
// cancel in fp32: under extreme decay every t[r, j], r > j, is ~exp(-30) and dg keeps its
// relative accuracy.
template <class Real, bool PerKey>
void pairwise_backward(Workspace<Real>& w, int n);

// Applies the chunk's state decay: S = gn .* S (row i scaled by gn[i] for per-key gates).
template <class Real, bool PerKey>
void decay_state(const Workspace<Real>& w, MapMat<Real>& S);

}  // namespace gdr::cpu::chunkwise
