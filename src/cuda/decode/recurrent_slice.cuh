// The slice kernel: the decode step of 1 to 8 tokens for few sequences, where a call is bound by
// latency rather than by bandwidth (B = 1: 2 MB of state over 132 SMs). Each block takes one
// slice of 32 value columns x 128 keys of one (sequence, value head): Hv x Dv / 32 blocks, four
// per head at Dv = 128, so that B = 1 reaches as many SMs as the narrow staged tile does. The T
// tokens are one chunk on the tensor cores, in the chunk form and fragment layouts of
// recurrent_chunk.cuh (its header states the math), so that the serial chain per token of
// recurrent.cuh's token loop (~0.44 us per token at B = 1, docs/cuda-decode.md v41) becomes a few
// short chains of products per call, the same for any T. Exists for a k-first fp32 state with
// Dk = 128, 16-bit inputs (exact in tf32) with a scalar gate, T <= 8, no varlen, 16-byte aligned
// token and state rows (tuning.h, recurrent_slice_applies).
//
// The block: 4 state warps and a coefficient warp. State warp w takes the slice's columns
// 16 (w % 2) .. + 15 and keys 64 (w / 2) .. + 63, 32 floats per thread in registers.
//  0. Before the wait for the previous grid (a programmatic dependent launch may start this grid
//     while that one drains), everything that needs only the kernel's parameters: the item but
//     its pool row, the token rows, every thread's token copies and state offsets; and the
//     block's state rows asked of the L2. (Measured on the H200, docs/cuda-decode.md v47: the
//     parameter work moved before the wait took B = 1, T = 8 from 5.66 to 4.77 us, the L2 ask
//     to 4.23, the coefficient warp to 4.12.)
//  1. every thread copies its share of the chunk's raw token rows (cp.async 16-byte units: q and
//     k rows of 128 keys, v rows of the slice's 32 columns) and of its scalars; the state warps
//     load their state fragments straight from the pool into registers (8-byte loads: keys
//     8 j + 2c and + 1, columns 16 (w % 2) + 2g and + 1, as recurrent_chunk.cuh's registers hold
//     them), all in flight at once;
//  2. once the tokens are in (block barrier): the state warps form a quarter of the Gram X X^T
//     each and hand it to the coefficient warp (named barrier, arrival only), which forms the
//     chunk's coefficients (chunk_coefficients) while the state warps go on: their K fragments of
//     the update, and their partial P^T = S0^T [K; Q]^T over their keys (the state's registers
//     as the A fragments), into shared memory;
//  3. block barrier; each state warp sums the two key halves' partials (in the same order in both
//     warps of a column group, so that they form the same U), forms B, U^T and O^T (the warps of
//     the first key half store o) and the update of its keys, stored from the registers to the
//     pool (8-byte stores, key tile by key tile).
// Decode in place: a block reads its whole slice before it writes; blocks share no columns.
#pragma once

#include <cstdint>

#include "cuda/decode/recurrent_chunk.cuh"

namespace gdr::cuda::detail {

constexpr int kSliceCols = 32;  // value columns of a block
constexpr int kSliceWarps = 5;  // 4 state warps and the coefficient warp

// The slice kernel's shared memory (static): the raw token rows, the chunk's coefficients and the
// partial P^T.
struct SliceShared {
  static constexpr int kRQ = kChunkRQ;        // q, k row stride (elements): conflict-free reads
  static constexpr int kRV = kSliceCols + 8;  // v row stride (elements): rows 16-byte aligned
  alignas(16) std::uint16_t q[8 * kRQ];       // raw 16-bit rows [token][key]
  alignas(16) std::uint16_t k[8 * kRQ];
  alignas(16) std::uint16_t v[8 * kRV];  // [token][the slice's columns]
  alignas(16) float gs[8];               // a = exp(g)
  alignas(16) float bs[8];               // beta
  alignas(16) float ms[8];               // mask (1 = step)
  alignas(16) float gram[4 * 256];       // [4][16][16] partial Grams, summed into [0]
  alignas(16) float lc[64];              // L (the coefficient warp's scratch)
  alignas(16) float ti[64];              // Ti (the coefficient warp's scratch)
  alignas(16) float coef[ChunkCoef::kSize];
  float4 part[2][2][2][32];  // [key half][column group][P_k, P_q][lane] partial P^T
};

// DT: the token dtype (kBF16 or kF16).
template <int DT>
__global__ void __launch_bounds__(kSliceWarps * 32) recurrent_slice_kernel(const RecurrentArgs a) {
  static_assert(DT != kF32, "16-bit inputs: exact in tf32, no lo parts");
  using Cf = ChunkCoef;
  using Sh = SliceShared;
  constexpr int NT = kSliceWarps * 32, ES = 2, DK = 128, JT = DK / 8 / 2;  // key tiles per warp
  constexpr int SW = 4;  // state warps (and Gram quarters); warp SW forms the coefficients
  __shared__ Sh sh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int lg = lane >> 2, lc = lane & 3, cg = warp & 1, share = warp >> 1;
  // Before the wait for the previous grid (programmatic dependent launch: this grid may start
  // while that one drains), everything that needs only the parameters: the item (but its pool
  // row), the token rows and this thread's token copies.
  BlockItem it = block_item_head(a, blockIdx.x);  // no varlen (recurrent_slice_applies)
  const int cnt = static_cast<int>(it.len), col0 = it.split * kSliceCols;
  const std::int64_t orow = it.b * a.o_sb + it.hv * a.o_sh + col0;
  const BlockRows rows = block_rows(a, it, col0);
  // This thread's token units (q, k: 16 units of 16 bytes per row; v: 4 per row): sources and
  // shared destinations.
  constexpr int QU = DK * ES / 16, VU = kSliceCols * ES / 16;
  constexpr int MAXU = (8 * (2 * QU + VU) + NT - 1) / NT;  // units per thread, at most
  const char* tok_src[MAXU];
  std::uint16_t* tok_dst[MAXU];
#pragma unroll
  for (int i = 0; i < MAXU; ++i) {
    const int f = tid + i * NT;
    tok_src[i] = nullptr, tok_dst[i] = nullptr;
    if (f < cnt * (2 * QU + VU)) {
      if (f < 2 * cnt * QU) {
        const int is_k = f >= cnt * QU, e = f - is_k * cnt * QU, t = e / QU, u = e % QU;
        tok_src[i] = (is_k ? rows.k : rows.q).at(t) + 16 * u;
        tok_dst[i] = (is_k ? sh.k : sh.q) + t * Sh::kRQ + 8 * u;
      } else {
        const int e = f - 2 * cnt * QU, t = e / VU, u = e % VU;
        tok_src[i] = rows.v.at(t) + 16 * u;
        tok_dst[i] = sh.v + t * Sh::kRV + 8 * u;
      }
    }
  }
  // This thread's state: keys 8 j + 2c (+ 1) of its key tiles j = share JT + jj, columns
  // 16 cg + 2g (+ 1) of the slice (the offset within a pool row); s[jj] = (key 2c col c0, key
  // 2c + 1 col c0, key 2c col c1, key 2c + 1 col c1), recurrent_chunk.cuh's register order.
  const int c0 = 16 * cg + 2 * lg;
  const std::int64_t in_off = it.hv * a.hin_s1 + col0 + c0 + (8 * JT * share + 2 * lc) * a.hin_s2;
  {
    // The block's state rows asked of the L2 (128 rows of 128 bytes, a row per thread) before
    // the wait. The pool row comes from a load that bypasses L1: the previous grid may still
    // write state_indices, a stale row only wastes the prefetch, and the lookup after the wait
    // reads the index afresh.
    std::int64_t row = it.n;
    if (a.state_indices)
      row = a.idx_dtype == kI64 ? __ldcg(static_cast<const long long*>(a.state_indices) + it.n)
                                : __ldcg(static_cast<const int*>(a.state_indices) + it.n);
    if (a.h_in && state_row_live(a, row) && tid < DK) {
      const float* p = a.h_in + row * a.hin_s0 + it.hv * a.hin_s1 + col0 + tid * a.hin_s2;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
  }
  wait_for_prior_grids();

  it.row = item_state_row(a, it.n);
  if (!state_row_live(a, it.row)) {  // a skipped pool row: o = 0 (negative index) or NaN (>= P)
    const float fill = it.row < 0 ? 0.f : __int_as_float(0x7fc00000);
    for (int e = tid; e < cnt * kSliceCols; e += NT)
      store_from_float(a.o, orow + (e / kSliceCols) * a.o_st + e % kSliceCols, DT, fill);
    return;
  }

  // 1. The chunk's raw token rows, then the scalars and the state.
#pragma unroll
  for (int i = 0; i < MAXU; ++i)
    if (tok_src[i]) cp_async16(tok_dst[i], tok_src[i]);
  cp_async_commit();
  float xs = 0.f;  // this thread's raw scalar (threads [0, 3 cnt))
  load_scalars<false, 1>(a, rows, cnt, 0, &xs, tid, NT);
  float s[JT][4];
  {
    const float* src = a.h_in ? a.h_in + it.row * a.hin_s0 + in_off : nullptr;
#pragma unroll
    for (int jj = 0; jj < JT; ++jj) {
      float2 r0 = make_float2(0.f, 0.f), r1 = r0;
      if (src && warp < SW) {  // (not the coefficient warp)
        r0 = __ldcs(reinterpret_cast<const float2*>(src + 8 * jj * a.hin_s2));
        r1 = __ldcs(reinterpret_cast<const float2*>(src + (8 * jj + 1) * a.hin_s2));
      }
      s[jj][0] = r0.x, s[jj][1] = r1.x, s[jj][2] = r0.y, s[jj][3] = r1.y;
    }
  }
  {
    const float A = a.gate_in_kernel && tid < cnt ? -expf(__ldg(a.A_log + it.hv)) : 0.f;
    const float* dtb = a.dt_bias ? a.dt_bias + it.hv * a.dt_bias_sh : nullptr;
    store_scalars<false, 1>(a, cnt, A, dtb, &xs, sh.gs, sh.bs, sh.ms, tid, NT);
  }
  cp_async_wait_all();
  __syncthreads();  // the tokens and scalars are in

  // 2. The Gram and the coefficients.
  const char* qraw = reinterpret_cast<const char*>(sh.q);
  const char* kraw = reinterpret_cast<const char*>(sh.k);
  if (warp < SW) {  // a quarter of the Gram each, handed to the coefficient warp
    chunk_gram_part<DT, SW>(qraw, kraw, cnt, sh.ms, sh.gram + 256 * warp, warp, lane);
    named_barrier_arrive(1, 32 * (SW + 1));
  } else {
    named_barrier_sync(1, 32 * (SW + 1));
    chunk_coefficients<SW>(a, cnt, sh.gs, sh.bs, sh.ms, sh.gram, sh.lc, sh.ti, sh.coef, lane);
    __syncthreads();  // the coefficients are in
    return;
  }
  // K's B fragments of the update: (k_2c[8 j + g], k_2c+1[8 j + g]), zero for masked or padding
  // tokens.
  const int s0 = 2 * lc, s1 = s0 + 1;
  const bool live0 = s0 < cnt && sh.ms[s0] != 0.f, live1 = s1 < cnt && sh.ms[s1] != 0.f;
  float2 kf[JT];
#pragma unroll
  for (int jj = 0; jj < JT; ++jj) {
    const int key = 8 * (JT * share + jj) + lg;
    const float y0 = raw_at(kraw, s0 * Sh::kRQ + key, DT),
                y1 = raw_at(kraw, s1 * Sh::kRQ + key, DT);
    kf[jj] = make_float2(live0 ? y0 : 0.f, live1 ? y1 : 0.f);
  }

  // 3. The partial P^T = S0^T [K; Q]^T over this warp's keys: main and correction accumulators,
  // even and odd key tiles apart (four chains).
  const bool live_g = lg < cnt && sh.ms[lg] != 0.f;
  float pk[2][4] = {}, pke[2][4] = {}, pq[2][4] = {}, pqe[2][4] = {};
#pragma unroll
  for (int jj = 0; jj < JT; ++jj) {
    const int key = 8 * (JT * share + jj) + 2 * lc, e = jj & 1;
    const float2 kk = raw_pair(kraw, lg * Sh::kRQ + key, DT);
    const float2 qq = raw_pair(qraw, lg * Sh::kRQ + key, DT);
    const float4 x = live_g ? make_float4(kk.x, kk.y, qq.x, qq.y) : make_float4(0.f, 0.f, 0.f, 0.f);
    chunk_pt_tile(s[jj], x.x, x.y, x.z, x.w, pk[e], pke[e], pq[e], pqe[e]);
  }
  sh.part[share][cg][0][lane] = make_float4(
      pk[0][0] + pke[0][0] + (pk[1][0] + pke[1][0]), pk[0][1] + pke[0][1] + (pk[1][1] + pke[1][1]),
      pk[0][2] + pke[0][2] + (pk[1][2] + pke[1][2]), pk[0][3] + pke[0][3] + (pk[1][3] + pke[1][3]));
  sh.part[share][cg][1][lane] = make_float4(
      pq[0][0] + pqe[0][0] + (pq[1][0] + pqe[1][0]), pq[0][1] + pqe[0][1] + (pq[1][1] + pqe[1][1]),
      pq[0][2] + pqe[0][2] + (pq[1][2] + pqe[1][2]), pq[0][3] + pqe[0][3] + (pq[1][3] + pqe[1][3]));
  __syncthreads();  // the partials and the coefficients are in

  // The two key halves' partials, in the same order in both warps of the column group.
  const float4 k0 = sh.part[0][cg][0][lane], k1 = sh.part[1][cg][0][lane];
  const float4 q0 = sh.part[0][cg][1][lane], q1 = sh.part[1][cg][1][lane];
  const float4 fk = make_float4(k0.x + k1.x, k0.y + k1.y, k0.z + k1.z, k0.w + k1.w);
  const float4 fq = make_float4(q0.x + q1.x, q0.y + q1.y, q0.z + q1.z, q0.w + q1.w);
  // Column phase in C fragment order: (row g, token 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1);
  // fragment rows g and g + 8 are the slice's columns c0 and c0 + 1.
  const float* coef = sh.coef;
  const float be0 = coef[Cf::kBE + s0], be1 = coef[Cf::kBE + s1];
  const float ck0 = coef[Cf::kCK + s0], ck1 = coef[Cf::kCK + s1];
  const char* vraw = reinterpret_cast<const char*>(sh.v);
  auto bval = [&](int tok, int col, float be, float ck, float p) {
    return be != 0.f ? be * raw_at(vraw, tok * Sh::kRV + col, DT) - ck * p : 0.f;
  };
  const float4 bb = make_float4(bval(s0, c0, be0, ck0, fk.x), bval(s0, c0 + 1, be0, ck0, fk.z),
                                bval(s1, c0, be1, ck1, fk.y), bval(s1, c0 + 1, be1, ck1, fk.w));
  float u[4] = {0.f, 0.f, 0.f, 0.f};
  chunk_u(bb, reinterpret_cast<const float4*>(coef + Cf::kTiF)[lane], u);
  if (share == 0) {  // O^T = diag(cQ) P_q^T + U^T Mo^T
    const float cq0 = coef[Cf::kCQ + s0], cq1 = coef[Cf::kCQ + s1];
    float o[4] = {cq0 * fq.x, cq1 * fq.y, cq0 * fq.z, cq1 * fq.w};
    chunk_store_o<DT>(a, o, u, reinterpret_cast<const float4*>(coef + Cf::kMoF)[lane], orow, cnt,
                      s0, c0);
  }
  // S^T = gamma S^T + (U diag(cU))^T K, each key tile stored as soon as it is formed; nothing is
  // stored without an output state, nor in place when every token is masked (the state stays as
  // it is, bit for bit).
  bool any_step = false;
#pragma unroll
  for (int t = 0; t < 8; ++t) any_step = any_step || (t < cnt && sh.ms[t] != 0.f);
  if (!a.h_out || (a.in_place && !any_step)) return;
  const float cu0 = coef[Cf::kCU + s0], cu1 = coef[Cf::kCU + s1], gl = coef[Cf::kGamma];
  const float4 ua = make_float4(u[0] * cu0, u[2] * cu0, u[1] * cu1, u[3] * cu1);
  const float4 uh = tf32_hi4(ua), ul = sub4(ua, uh);
  float* out = a.h_out + it.row * a.hout_s0 + it.hv * a.hout_s1 + col0 + c0 +
               (8 * JT * share + 2 * lc) * a.hout_s2;
#pragma unroll
  for (int jj = 0; jj < JT; ++jj) {
    chunk_update_tile(s[jj], gl, uh, ul, kf[jj].x, kf[jj].y);
    __stcs(reinterpret_cast<float2*>(out + 8 * jj * a.hout_s2), make_float2(s[jj][0], s[jj][2]));
    __stcs(reinterpret_cast<float2*>(out + (8 * jj + 1) * a.hout_s2),
           make_float2(s[jj][1], s[jj][3]));
  }
}

}  // namespace gdr::cuda::detail
