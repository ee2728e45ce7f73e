// The ring kernel: the decode step of 1 to 8 tokens as a copy pipeline. Each block (one per SM,
// persistent) keeps a ring of kRingSlots item states in shared memory; a producer warp fills the
// slots with the bulk-copy engine (cp.async.bulk, completing on an mbarrier per slot) and drains
// them the same way (bulk stores from shared memory), so that while the consumer warps update one
// item the DRAM reads the next ones and writes the previous one: reads and writes stay in flight
// all the time, as in a copy, instead of the wave-by-wave "load all, compute, store all" of
// recurrent_one.cuh's blocks (docs/cuda-decode.md v28a, v34: at B = 32 its first wave waits ~8 us
// for 17 MB of state before any store starts). Exists for a k-first fp32 state with Dk = 128,
// items of 128 value columns (Dv % 128 == 0), 16-byte aligned rows and T tokens whose raw q, k, v
// rows (and per-key g rows) fit a slot (T x (3 input bytes + 4 per-key) <= 48; tuning.h,
// recurrent_ring_applies). Measured (docs/cuda-decode.md v36, v39): in the steady state an SM moves
// one item in and out per ~4.1 us, the copy rate, with or without the math of one token; what a
// call loses is the start (the first state lands ~5 us in), the end (an SM's last item takes
// ~5 us from its fill to the end of its store) and the spread of the SMs' rates (stores from
// registers instead of bulk stores, the slot's read wait, the L2 policies and bulk copies in 4 or
// 16 pieces changed nothing; the next item's state asked of the L2 a period ahead gained 1-4 %,
// v37; lookups a period ahead 2-3 %, v39), so that it beats the one-token kernel's waves only at
// about 3 to 8 items per SM; each further token costs the consumers ~0.5 us per item (v38),
// hidden behind the copy up to T = 3 and ahead of the staged and chunk kernels up to T = 6
// (tuning.h, recurrent_ring_preferred). With 16-bit inputs and a scalar gate the consumers can
// instead take the T tokens as one chunk on the tensor cores (CM: ring_consume_chunk, with a tenth
// warp forming the chunks' coefficients), about flat in T (v45: T = 8 at B = 256 ~91 % of the copy
// rate); their state moves as one tensor copy each way, swizzled so that the consumers' fragment
// loads and stores are free of bank conflicts (v46: ~94 %), and the rules take them at T = 6 to 8
// from 2.5 items per SM.
//
// Math (docs/operator.md §2) of one token, per sequence and value head, S the item's [128 keys][128
// columns] slice, a = exp(g), k^ = rk k and q~ = fq q (rk = 1 / sqrt(||k||^2 + eps), fq = scale /
// sqrt(||q||^2 + eps) with the in-kernel L2 norm, else 1 and scale):
//   u_j    = beta (v_j - a rk (k . S[:, j]))
//   o_j    = a fq (q . S[:, j]) + u_j rk fq (k . q)
//   S[i,j] = a S[i, j] + rk k_i u_j
// (a masked token: o = 0, S unchanged), token after token; with a per-key gate a S is diag(a) S,
// a = exp(g) per key. The two column sums k . S[:, j] and q . S[:, j] are the only reductions over
// keys.
//
// Work of a consumer thread (warp w < 8, lane l): key rows 16 w .. 16 w + 15 of columns 4 l ..
// 4 l + 3 (a warp reads whole 512-byte rows of the slot: no bank conflicts), 64 floats in
// registers; per token its partial column sums into shared memory, a named barrier over the
// consumers, the column sums, u and o (ring_consume_one, ring_consume_tokens); after the item it
// fences (its generic writes to the slot before the bulk store's reads) and arrives on the slot's
// "done" mbarrier.
//
// The producer warp (warp 8) per slot: waits for "done", bulk-stores the item (rows of 512 bytes,
// or one 64 KB copy where the item's rows are contiguous; CM: one tensor copy), waits until the
// store has read the slot (looking up the item after the one it fills next meanwhile:
// ring_produce), and fills it with the item kRingSlots later (whose state it asked the L2 for when
// it filled the previous slot): the expected bytes, the state and the T tokens' rows q, k, v (and
// per-key g; bulk copies), then the item's scalars (gate, beta, mask per token; loaded one item
// ahead with its token rows, one per lane l < 3T) and the rest of the header written to the slot,
// then the arrivals of those 3T lanes on the slot's "full" mbarrier (each a release: the consumers'
// wait acquires the header). Decode in place: an item is read whole before it is written.
//
// Items: block b takes items b, b + G, b + 2G, ... (G blocks; round k holds items kG .. kG + G -
// 1). With dynamic items (RecurrentArgs::item_counter; tuning.h, recurrent_ring_dynamic_round) it
// takes its items of the first rounds that way, then the next untaken item of the later rounds
// from a counter, so that the SMs that move state faster (their rates differ by up to ~20 %,
// docs/cuda-decode.md v48) take more items and the call does not wait for the slowest SMs to finish
// a full share (v49). The producer marks the block's end with a header of live = -1 after its last
// item; the consumers and the coefficient warp stop there.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; launch.cu encodes the maps)

#include <cstdint>

#include "cuda/common/mma_tf32.cuh"
#include "cuda/common/tensor_copy.cuh"
#include "cuda/decode/recurrent.cuh"
#include "cuda/decode/recurrent_chunk.cuh"

namespace gdr::cuda::detail {

// The state's tensor maps of the chunk consumers (CM; encoded by the host, launch.cu): the input
// and the output state as 5-D tensors (32 columns, Dv / 32 stripes of them, keys Dk, value heads
// Hv, rows P; the state's strides) moved as one box per item (32 x 4 x 128: the item's 128 columns
// and 128 keys, 64 KB, in the order of its rows) with the 128-byte swizzle
// (RingLayoutT<true>::state_at). And the token inputs' maps: q and k as [B][T][Hk][Dk], v as
// [B][T][Hv][Dv] (their strides), moved as one box per item each (kRowBytes / 2 elements x 1 head x
// T tokens x 1 sequence: the item's T rows at the slot's padded row pitch, RingLayoutT<true>::row;
// the 8 elements past a row's 128 are the next columns or, past the tensor, zeros), so that a fill
// is three copies where one per row was 3 T: the producer's fills at T = 8 took ~2 us each with 24
// copies of 256 bytes (docs/cuda-decode.md v52). A kernel parameter (__grid_constant__): the maps
// stay in parameter space.
struct RingMaps {
  CUtensorMap in;
  CUtensorMap out;
  CUtensorMap q, k, v;
};

// ---- the kernel ----

constexpr int kRingSlots = 3;      // item states in flight per block
constexpr int kRingConsumers = 8;  // consumer warps (16 key rows each)

constexpr int kRingMaxTokens = 8;  // tokens per item (T * input bytes <= 16: kTokBytes below)
// Tokens per item with a per-key gate: the slot also holds the T raw g rows (at most 4 bytes per
// key), so T x (3 input bytes + 4) <= 48 (kTokBytes below): 4 tokens of 16-bit inputs, 3 of f32.
constexpr int kRingMaxKeyTokens = 4;

// Shared memory of the ring kernel, in bytes: per slot the state [128][128] f32 (CM: in swizzled
// rows, state_at), the raw token rows q [T][128], k [T][128], v [T][128] (the item's columns; any
// input dtype) and with a per-key gate the raw g rows [T][128] (at most kTokBytes in all), and a
// header; then the consumers' partial sums (two buffers by barrier parity), the token norms (two
// buffers by item parity) and the mbarriers.
template <bool CM>
struct RingLayoutT {
  static constexpr int kDK = 128, kCB = 128;
  static constexpr int kState = kDK * kCB * 4;  // 65536
  static constexpr int kTok = kState;           // raw q rows, then k rows, then v rows
  // Token rows: packed by T (q rows 0 .. T - 1, then k, then v); CM (16-bit inputs only): at fixed
  // places (q row t is row t, k row t row 8 + t, v row t row 16 + t) of 256 + 16 bytes, so that a
  // fragment's lanes (token g, key word 4 j + c) fall on banks 4 g + 4 j + c: all 32 different.
  // Bytes: CM 6528; else 6144 (T = 8 of 16-bit, 4 of f32).
  static constexpr int kRowBytes = kCB * 2 + 16;  // CM
  static constexpr int kTokBytes =
      CM ? 3 * kRingMaxTokens * kRowBytes : 3 * kRingMaxTokens * kCB * 2;
  static constexpr int kHead = kTok + kTokBytes;  // RingHeader
  // Bytes per slot: a multiple of 128; CM of 1024 (the state's swizzled boxes: state_at).
  static constexpr int kSlot = CM ? (kHead + 128 + 1023) / 1024 * 1024 : kHead + 128;
  static constexpr int kPart = kRingSlots * kSlot;  // [2][8 warps][2][128] f32 (consumer area)
  // CM: instead, two coefficient buffers (by item parity), each Gram [16][16], L [8][8], Ti [8][8]
  // and the coefficients (ChunkCoef), f32 (offsets in floats below).
  static constexpr int kCoefBuf = 2816;
  static constexpr int kCGram = 0, kCL = 256, kCTi = 320, kCCoef = 384;
  static constexpr int kPartX = kPart + (CM ? 2 * kCoefBuf : 2 * kRingConsumers * 2 * kCB * 4);
  static constexpr int kBars = kPartX + (CM ? 0 : 2 * kRingConsumers * 16);  // [2][8] float4
  // full[slots], done[slots]; CM: then ready[2], free[2] (the coefficient buffers) and
  // state_full[slots] (full is then the tokens' and the header's only).
  static constexpr int kUsed = kBars + (2 * kRingSlots + (CM ? 4 + kRingSlots : 0)) * 8;
  // Dynamic shared memory to ask for: CM 1024 bytes more, so that the kernel can start its layout
  // on a 1024-byte boundary (recurrent_ring_kernel).
  static constexpr int kBytes = kUsed + (CM ? 1024 : 0);
  // CM: byte offset in a slot of the state element (key r, column c): rows of 512 bytes whose four
  // 128-byte units (32 columns each) carry the tensor copy's 128-byte swizzle: 16-byte piece u of
  // unit n = 4 r + c / 32 at place u ^ (n % 8). So key r + 8 lies 4096 bytes after key r at the
  // same place in its row, and a consumer's 8-byte fragment loads (keys 8 j + c and 8 j + c + 4,
  // columns 16 w + 2g: odd and even keys fall on different halves of the banks) take 2 wavefronts
  // each, where plain 512-byte rows take 4.
  static __device__ __forceinline__ int state_at(int r, int c) {
    return r * 512 + (c >> 5) * 128 + ((((c & 31) >> 2) ^ ((4 * r + (c >> 5)) & 7)) << 4) +
           (c & 3) * 4;
  }
  // Byte offset in a slot of token t's raw row of q (which = 0), k (1) or v (2).
  static __device__ __forceinline__ int row(int which, int t, int T, int es) {
    return CM ? kTok + (which * kRingMaxTokens + t) * kRowBytes : kTok + (which * T + t) * kCB * es;
  }
  // Byte offset in a slot of token t's raw per-key g row (g_es bytes per key), after the v rows.
  static __device__ __forceinline__ int g_row(int t, int T, int es, int g_es) {
    return kTok + (3 * T * es + t * g_es) * kCB;
  }
};
using RingLayout = RingLayoutT<false>;
static_assert(RingLayout::kSlot % 128 == 0 && RingLayout::kBytes <= 232448);
static_assert(RingLayoutT<true>::kSlot % 1024 == 0 && RingLayoutT<true>::kBytes <= 232448 &&
              RingLayoutT<true>::kCCoef + ChunkCoef::kSize <= RingLayoutT<true>::kCoefBuf / 4 &&
              RingLayoutT<true>::kCoefBuf % 16 == 0);

// An item's scalars, written by the producer before its arrivals on the slot's "full" barrier.
struct RingHeader {
  int live;  // 1: the state row is in [0, P): state copied and stored; -1: no item, the end
  int fill;  // not live: o = 0 (1, a skipped pool row) or NaN (0, an index >= P)
  int hv;
  int split;
  long long n;                 // sequence (= batch row)
  long long row;               // state row
  float a[kRingMaxTokens];     // decay exp(g) per token (after the in-kernel gate; scalar gate)
  float beta[kRingMaxTokens];  // (after the sigmoid)
  float step[kRingMaxTokens];  // 1: the token steps; 0: masked (o = 0, state unchanged)
};
static_assert(sizeof(RingHeader) <= 128);

// The `dtype` raw row at `raw` (shared memory): 16 values from element i0 (i0 % 8 == 0) as floats.
__device__ __forceinline__ void ring_row16(const char* raw, int i0, int dtype, float* x) {
  if (dtype == kF32) {
#pragma unroll
    for (int u = 0; u < 4; ++u)
      unit_to_float(reinterpret_cast<const uint4*>(raw + 4 * i0)[u], kF32, x + 4 * u);
  } else {
#pragma unroll
    for (int u = 0; u < 2; ++u)
      unit_to_float(reinterpret_cast<const uint4*>(raw + 2 * i0)[u], dtype, x + 8 * u);
  }
}

// What the producer reads of an item before it fills a slot, looked up one item ahead (the loads'
// latency then hides behind the wait for the slot): the item, its token rows (v from its first
// column), and the lane's raw scalar (load_scalars over the warp: scalar gate lanes [0, T) g,
// [T, 2T) beta, [2T, 3T) mask; per-key gate lanes [0, T) beta, [T, 2T) mask).
struct RingLookup {
  BlockItem it;
  BlockRows rows;
  float x;
};

template <bool PK>
__device__ __forceinline__ RingLookup ring_lookup(const RecurrentArgs& a, unsigned item, int lane) {
  RingLookup x;
  x.it = block_item_at(a, item);
  x.rows = block_rows(a, x.it, x.it.split * RingLayout::kCB);
  load_scalars<PK, 1>(a, x.rows, static_cast<int>(a.T), 0, &x.x, lane, 32);
  return x;
}

// The producer warp: fills slot `slot` with the looked-up item (expected bytes, bulk copies of the
// state rows and of the T tokens' q, k, v rows, lane l < 3T copying row l, and per-key the raw g
// rows, lane 3T + t row t; the header; the 3T arrivals on `full`). Not live (pool row skipped or
// out of range): no copies, only the header.
// CM: the token rows come as three tensor copies (lanes 0, 1, 2: q, k, v, each its T rows;
// RingMaps) and the state completes on its own barrier `state_full` (one arrival, by lane 0), after
// the token copies have gone out, so that the coefficient warp can start on the tokens before the
// state is in; it comes as one tensor copy (swizzled: RingLayoutT<true>::state_at).
template <int DT, bool PK, bool CM = false>
__device__ __forceinline__ void ring_fill(const RecurrentArgs& a, const RingMaps& maps,
                                          const RingLookup& x, char* slot, std::uint64_t* full,
                                          std::uint64_t* state_full, std::uint64_t policy,
                                          int lane) {
  using L = RingLayoutT<CM>;
  constexpr int ES = DT == kF32 ? 4 : 2;
  const BlockItem& it = x.it;
  const bool live = state_row_live(a, it.row);
  const int T = static_cast<int>(a.T);
  const int g_es = dtype_bytes(a.g_dtype);
  // CM: the three boxes' bytes, rows at the padded pitch.
  const unsigned tok = CM ? static_cast<unsigned>(3 * T * L::kRowBytes)
                          : static_cast<unsigned>((3 * T * ES + (PK ? T * g_es : 0)) * L::kCB);
  const unsigned state_bytes = CM ? 0u : static_cast<unsigned>(L::kState);
  if (lane == 0) mbar_expect_tx(full, live ? state_bytes + tok : 0u);
  __syncwarp();
  auto copy_tokens = [&] {
    if constexpr (CM) {  // lane l < 3: the T rows of q, k or v as one box (RingMaps)
      if (live && lane < 3) {
        const int b = static_cast<int>(it.b);
        if (lane == 0)
          tensor_load_4d(slot + L::row(0, 0, T, ES), &maps.q, 0, it.hk, 0, b, full);
        else if (lane == 1)
          tensor_load_4d(slot + L::row(1, 0, T, ES), &maps.k, 0, it.hk, 0, b, full);
        else
          tensor_load_4d(slot + L::row(2, 0, T, ES), &maps.v, it.split * L::kCB, it.hv, 0, b, full);
      }
    } else if (live && lane < 3 * T) {  // row l: q (l < T), k, v of token l % T
      const int which = lane / T, t = lane - which * T;
      const TokenRows& r = which == 0 ? x.rows.q : (which == 1 ? x.rows.k : x.rows.v);
      bulk_copy(slot + L::row(which, t, T, ES), r.at(t), L::kCB * ES, full);
    }
  };
  std::uint64_t* sbar = CM ? state_full : full;
  if constexpr (CM) {
    copy_tokens();
    if (lane == 0) mbar_arrive_expect_tx(sbar, live ? static_cast<unsigned>(L::kState) : 0u);
    __syncwarp();
  }
  if (live && CM) {
    if (lane == 0)
      tensor_load(slot, &maps.in, 0, it.split * (L::kCB / 32), 0, it.hv, static_cast<int>(it.row),
                  sbar, policy);
  } else if (live) {
    const float* src = a.h_in + it.row * a.hin_s0 + it.hv * a.hin_s1 + it.split * L::kCB;
    if (a.hin_s2 == L::kCB) {  // the item's rows are contiguous: one copy
      if (lane == 0) bulk_copy_hint(slot, src, L::kState, sbar, policy);
    } else {  // a copy per row (one 512-byte copy per row doubled the period: v36)
#pragma unroll
      for (int r = lane; r < L::kDK; r += 32)
        bulk_copy_hint(slot + r * L::kCB * 4, src + r * a.hin_s2, L::kCB * 4, sbar, policy);
    }
    if constexpr (!CM) copy_tokens();
    if (PK && lane >= 3 * T && lane < 4 * T) {  // raw g row of token lane - 3T
      const int t = lane - 3 * T;
      bulk_copy(slot + L::g_row(t, T, ES, g_es), x.rows.g.at(t), L::kCB * g_es, full);
    }
  }
  RingHeader* h = reinterpret_cast<RingHeader*>(slot + L::kHead);
  warp_scalar_store<PK>(a, T, it.hv, x.x, lane, h->a, h->beta, h->step);  // lanes [0, 3T)
  if (lane == 0) {
    h->live = live;
    h->fill = it.row < 0;
    h->hv = it.hv;
    h->split = it.split;
    h->n = it.n;
    h->row = it.row;
  }
  if (lane < 3 * T) mbar_arrive(full);  // each writer's release arrival (the barrier counts 3T)
}

// The producer warp: once the consumers are done with the slot's item, its rows -> the output
// state (one bulk store, or one per row where the rows are not contiguous; CM: one tensor store),
// unless nothing is to be written (skipped row, every token masked in place, no output state).
template <bool CM = false>
__device__ __forceinline__ void ring_store(const RecurrentArgs& a, const RingMaps& maps,
                                           const char* slot, std::uint64_t policy, int lane) {
  using L = RingLayoutT<CM>;
  const RingHeader* h = reinterpret_cast<const RingHeader*>(slot + L::kHead);
  bool stepped = false;
  for (int t = 0; t < a.T; ++t) stepped |= h->step[t] != 0.f;
  if (CM && h->live && a.h_out && (stepped || !a.in_place)) {
    if (lane == 0)
      tensor_store(&maps.out, 0, h->split * (L::kCB / 32), 0, h->hv, static_cast<int>(h->row), slot,
                   policy);
  } else if (h->live && a.h_out && (stepped || !a.in_place)) {
    float* dst = a.h_out + h->row * a.hout_s0 + h->hv * a.hout_s1 + h->split * L::kCB;
    if (a.hout_s2 == L::kCB) {
      if (lane == 0) bulk_store(dst, slot, L::kState, policy);
    } else {
#pragma unroll
      for (int r = lane; r < L::kDK; r += 32)
        bulk_store(dst + r * a.hout_s2, slot + r * L::kCB * 4, L::kCB * 4, policy);
    }
  }
  bulk_commit();
}

// ---- the consumers ----

// A consumer thread's place: the partial-sum area (kPart; one token: [2][8 warps][64] float4 by
// barrier parity pb; several tokens: [8 warps][64] float4, then w [128] f32), the token-norm area
// (kPartX: several tokens: [2][8] float4 by parity pn of the live items; one token: [2][8] float4
// of partial norms by pb), its warp and lane.
struct ConsumerState {
  float4* part;
  float4* partx;
  int pb, pn;
  int warp, lane;
};

// Element index in o of token t, this lane's four columns of the item.
__device__ __forceinline__ std::int64_t ring_o_index(const RecurrentArgs& a, const RingHeader* h,
                                                     int t, int lane) {
  return h->n * a.o_sb + t * a.o_st + h->hv * a.o_sh + h->split * RingLayout::kCB + 4 * lane;
}

// Elements 4 lane .. 4 lane + 3 of the raw row at `raw` as floats: this lane's four columns of a v
// row, or four keys of a k or q row.
template <int DT>
__device__ __forceinline__ float4 ring_four(const char* raw, int lane) {
  float v[4];
  if constexpr (DT == kF32) {
    unit_to_float(reinterpret_cast<const uint4*>(raw)[lane], kF32, v);
  } else {
    const uint2 w = reinterpret_cast<const uint2*>(raw)[lane];
    const float2 lo = pair_to_float2(w.x, DT), hi = pair_to_float2(w.y, DT);
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  }
  return make_float4(v[0], v[1], v[2], v[3]);
}

// A per-key gate: the decays a_i = exp(g_i) (gate_decay: the in-kernel gate included) of rows
// r0 .. r0 + 15 of token t, for every lane of the warp: lane l forms row r0 + l % 16's from the
// slot's raw g row and the warp shares them by shuffles.
__device__ __forceinline__ void ring_row_decays(const RecurrentArgs& a, const char* slot,
                                                const RingHeader* h, int t, int T, int es, int r0,
                                                int lane, float* ar) {
  const int g_es = dtype_bytes(a.g_dtype), key = r0 + (lane & 15);
  const char* raw = slot + RingLayout::g_row(t, T, es, g_es);
  const float g =
      a.g_dtype == kF32
          ? reinterpret_cast<const float*>(raw)[key]
          : pair_to_float2(reinterpret_cast<const std::uint16_t*>(raw)[key], a.g_dtype).x;
  const float A = a.gate_in_kernel ? -expf(__ldg(a.A_log + h->hv)) : 0.f;
  const float* dtb = a.dt_bias ? a.dt_bias + h->hv * a.dt_bias_sh : nullptr;
  const float d = gate_decay(a, A, g, dtb, key);
#pragma unroll
  for (int i = 0; i < 16; ++i) ar[i] = __shfl_sync(0xffffffffu, d, i);
}

// A thread's partial column sums over its 16 key rows st[i] (4 columns each): pk = k . S, pq =
// q . S over those rows (kr, qr: the rows' k and q values).
__device__ __forceinline__ void ring_column_partials(const float* kr, const float* qr,
                                                     const float4* st, float4& pk, float4& pq) {
  pk = make_float4(0.f, 0.f, 0.f, 0.f), pq = pk;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    pk.x = fmaf(kr[i], st[i].x, pk.x);
    pk.y = fmaf(kr[i], st[i].y, pk.y);
    pk.z = fmaf(kr[i], st[i].z, pk.z);
    pk.w = fmaf(kr[i], st[i].w, pk.w);
    pq.x = fmaf(qr[i], st[i].x, pq.x);
    pq.y = fmaf(qr[i], st[i].y, pq.y);
    pq.z = fmaf(qr[i], st[i].z, pq.z);
    pq.w = fmaf(qr[i], st[i].w, pq.w);
  }
}

// Sum of the 8 warps' partial column sums in buffer pb: this lane's four columns of k . S (x) and
// q . S (y).
__device__ __forceinline__ void ring_column_sums(const ConsumerState& c, float4& sk, float4& sq) {
  sk = make_float4(0.f, 0.f, 0.f, 0.f), sq = sk;
#pragma unroll
  for (int w = 0; w < kRingConsumers; ++w) {
    const float4* theirs = c.part + (c.pb * kRingConsumers + w) * 64;
    const float4 x = theirs[c.lane], y = theirs[32 + c.lane];
    sk = make_float4(sk.x + x.x, sk.y + x.y, sk.z + x.z, sk.w + x.w);
    sq = make_float4(sq.x + y.x, sq.y + y.y, sq.z + y.z, sq.w + y.w);
  }
}

// One token (T = 1), the state read from and written back to the slot. Work of a thread: key rows
// 16 warp .. 16 warp + 15 of columns 4 lane .. 4 lane + 3 (a warp reads whole 512-byte rows of the
// slot: no bank conflicts), 64 floats in registers: its partial column sums (and the warp's
// partial ||k||^2, ||q||^2, k . q) into shared memory; named barrier 1 over the consumers; each
// thread sums the 8 warps' partials of its columns, forms u and o (warp 0 stores o), updates its
// rows in the slot. The partials alternate between two buffers by parity, so one barrier serves.
// A per-key gate (PK): the decays a_i of the thread's rows from the slot; k . S' and q . S' as
// (k_i a_i) . S and (q_i a_i) . S, the update S[i, j] = a_i S[i, j] + rk k_i u_j.
template <int DT, bool PK>
__device__ __forceinline__ void ring_consume_one(const RecurrentArgs& a, char* slot,
                                                 const RingHeader* h, ConsumerState& c) {
  using L = RingLayout;
  constexpr int ES = DT == kF32 ? 4 : 2, NC = kRingConsumers * 32;
  const int warp = c.warp, lane = c.lane, r0 = 16 * warp;
  if (h->step[0] == 0.f) {  // masked: o = 0, the state unchanged
    if (warp == 0)
      store4_from_float(a.o, ring_o_index(a, h, 0, lane), DT, a.vec_o,
                        make_float4(0.f, 0.f, 0.f, 0.f));
    return;
  }
  float4 st[16];
  float4* rows = reinterpret_cast<float4*>(slot) + r0 * (L::kCB / 4) + lane;
#pragma unroll
  for (int i = 0; i < 16; ++i) st[i] = rows[i * (L::kCB / 4)];
  float kr[16], qr[16], ar[16];
  ring_row16(slot + L::row(1, 0, 1, ES), r0, DT, kr);
  ring_row16(slot + L::row(0, 0, 1, ES), r0, DT, qr);
  if constexpr (PK) ring_row_decays(a, slot, h, 0, 1, ES, r0, lane, ar);
  // Partial column sums over this warp's 16 rows, and the partial norms and k . q.
  float4 pk, pq;
  if constexpr (PK) {
    float ka[16], qa[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) ka[i] = kr[i] * ar[i], qa[i] = qr[i] * ar[i];
    ring_column_partials(ka, qa, st, pk, pq);
  } else {
    ring_column_partials(kr, qr, st, pk, pq);
  }
  float kk = 0.f, qq = 0.f, kq = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    kk = fmaf(kr[i], kr[i], kk);
    qq = fmaf(qr[i], qr[i], qq);
    kq = fmaf(kr[i], qr[i], kq);
  }
  float4* mine = c.part + (c.pb * kRingConsumers + warp) * 64;
  mine[lane] = pk;
  mine[32 + lane] = pq;
  if (lane == 0) c.partx[c.pb * kRingConsumers + warp] = make_float4(kk, qq, kq, 0.f);
  named_barrier_sync(1, NC);
  float4 sk, sq, sx = make_float4(0.f, 0.f, 0.f, 0.f);
  ring_column_sums(c, sk, sq);
#pragma unroll
  for (int w = 0; w < kRingConsumers; ++w) {
    const float4 z = c.partx[c.pb * kRingConsumers + w];
    sx = make_float4(sx.x + z.x, sx.y + z.y, sx.z + z.z, sx.w);
  }
  c.pb ^= 1;
  const float rk = a.qk_l2norm ? 1.f / sqrtf(sx.x + a.eps) : 1.f;
  const float fq = a.scale * (a.qk_l2norm ? 1.f / sqrtf(sx.y + a.eps) : 1.f);
  const float dec = PK ? 1.f : h->a[0], be = h->beta[0];
  const float4 v = ring_four<DT>(slot + L::row(2, 0, 1, ES), lane);
  const float ka = dec * rk, qa = dec * fq, kqf = rk * fq * sx.z;
  const float4 u = make_float4(be * (v.x - ka * sk.x), be * (v.y - ka * sk.y),
                               be * (v.z - ka * sk.z), be * (v.w - ka * sk.w));
  if (warp == 0)
    store4_from_float(a.o, ring_o_index(a, h, 0, lane), DT, a.vec_o,
                      make_float4(qa * sq.x + kqf * u.x, qa * sq.y + kqf * u.y,
                                  qa * sq.z + kqf * u.z, qa * sq.w + kqf * u.w));
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float kn = rk * kr[i], di = PK ? ar[i] : dec;
    rows[i * (L::kCB / 4)] = make_float4(fmaf(di, st[i].x, kn * u.x), fmaf(di, st[i].y, kn * u.y),
                                         fmaf(di, st[i].z, kn * u.z), fmaf(di, st[i].w, kn * u.w));
  }
  fence_proxy_async();  // this thread's writes to the slot before the bulk store's reads
}

// Element i of the raw `DT` row at `raw` (shared memory) as float.
template <int DT>
__device__ __forceinline__ float ring_elem(const char* raw, int i) {
  if constexpr (DT == kF32)
    return reinterpret_cast<const float*>(raw)[i];
  else
    return pair_to_float2(reinterpret_cast<const std::uint16_t*>(raw)[i], DT).x;
}

// T = 2 .. 8 tokens in order, the thread's 64 state floats (as in ring_consume_one) kept in
// registers across them and written back to the slot after the last. The decay is applied lazily:
// the registers hold S~ with S = A S~, A the product of the item's decays so far (folded into the
// registers whenever it leaves [1e-24, 1e24]), so that a token's update is one FMA per state float:
//   k . S'[:, j] = A (k . S~[:, j]),  q . S'[:, j] = A (q . S~[:, j])   (S' = a S, A <- a A)
//   u_j = beta (v_j - rk A (k . S~[:, j])),  o_j = fq A (q . S~[:, j]) + rk fq (k . q) u_j
//   S~[i, j] += k_i w_j,  w_j = rk u_j / A.
// First warp w < T forms token w's factors (rk, fq, rk fq k . q) over all 128 keys with shuffles.
// Then per token: the partial column sums of the thread's rows into shared memory; named barrier;
// thread j < 128 sums column j's 8 partials of k . S~ and q . S~, forms u_j, stores o_j and writes
// w_j; named barrier; every thread reads the w of its four columns and updates its rows. A masked
// token runs the same steps with decay 1 and u = 0 (o = 0), so that every token of a live item has
// its barriers: the norm buffers alternate by live item (pn) and a writer of the next-but-one
// item's norms has passed a barrier of the item between. The partials and w need one buffer each:
// a buffer is written only after the barrier that follows every read of its previous contents.
// A per-key gate (PK): a stepping token first scales the thread's rows by their decays a_i (from
// the slot); A stays 1.
template <int DT, bool PK>
__device__ __forceinline__ void ring_consume_tokens(const RecurrentArgs& a, char* slot,
                                                    const RingHeader* h, ConsumerState& c) {
  using L = RingLayout;
  constexpr int ES = DT == kF32 ? 4 : 2, NC = kRingConsumers * 32;
  constexpr float kLow = 1e-24f, kHigh = 1e24f;  // the range of A kept apart from the registers
  const int T = static_cast<int>(a.T), warp = c.warp, lane = c.lane, r0 = 16 * warp;
  const int tid = 32 * warp + lane;
  float4* norms = c.partx + c.pn * kRingConsumers;
  c.pn ^= 1;
  float* part = reinterpret_cast<float*>(c.part);    // [8 warps][k . S~ of 128 columns, q . S~]
  float* wcol = part + kRingConsumers * 2 * L::kCB;  // [128] w_j
  if (warp < T) {  // token `warp`'s factors: the lane's 4 keys, then a butterfly over the warp
    const float4 k4 = ring_four<DT>(slot + L::row(1, warp, T, ES), lane);
    const float4 q4 = ring_four<DT>(slot + L::row(0, warp, T, ES), lane);
    float kk = k4.x * k4.x + k4.y * k4.y + k4.z * k4.z + k4.w * k4.w;
    float qq = q4.x * q4.x + q4.y * q4.y + q4.z * q4.z + q4.w * q4.w;
    float kq = k4.x * q4.x + k4.y * q4.y + k4.z * q4.z + k4.w * q4.w;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      kk += __shfl_xor_sync(0xffffffffu, kk, off);
      qq += __shfl_xor_sync(0xffffffffu, qq, off);
      kq += __shfl_xor_sync(0xffffffffu, kq, off);
    }
    const float rk = a.qk_l2norm ? 1.f / sqrtf(kk + a.eps) : 1.f;
    const float fq = a.scale * (a.qk_l2norm ? 1.f / sqrtf(qq + a.eps) : 1.f);
    if (lane == 0) norms[warp] = make_float4(rk, fq, rk * fq * kq, 0.f);
  }
  float4 st[16];
  float4* rows = reinterpret_cast<float4*>(slot) + r0 * (L::kCB / 4) + lane;
#pragma unroll
  for (int i = 0; i < 16; ++i) st[i] = rows[i * (L::kCB / 4)];
  const std::int64_t ocol = h->n * a.o_sb + h->hv * a.o_sh + h->split * L::kCB + tid;
  float A = 1.f;
  for (int t = 0; t < T; ++t) {
    const bool stepped = h->step[t] != 0.f;
    const float na = A * (stepped && !PK ? h->a[t] : 1.f);
    if (na >= kLow && na <= kHigh) {
      A = na;
    } else {  // fold the decay into the registers (the same value in every thread)
#pragma unroll
      for (int i = 0; i < 16; ++i)
        st[i] = make_float4(na * st[i].x, na * st[i].y, na * st[i].z, na * st[i].w);
      A = 1.f;
    }
    if (PK && stepped) {  // S' = diag(a) S
      float ar[16];
      ring_row_decays(a, slot, h, t, T, ES, r0, lane, ar);
#pragma unroll
      for (int i = 0; i < 16; ++i)
        st[i] = make_float4(ar[i] * st[i].x, ar[i] * st[i].y, ar[i] * st[i].z, ar[i] * st[i].w);
    }
    float kr[16], qr[16];
    ring_row16(slot + L::row(1, t, T, ES), r0, DT, kr);
    ring_row16(slot + L::row(0, t, T, ES), r0, DT, qr);
    float4 pk, pq;
    ring_column_partials(kr, qr, st, pk, pq);
    c.part[warp * 64 + lane] = pk;
    c.part[warp * 64 + 32 + lane] = pq;
    named_barrier_sync(1, NC);
    if (tid < L::kCB) {  // column tid
      float sk = 0.f, sq = 0.f;
#pragma unroll
      for (int w = 0; w < kRingConsumers; ++w) {
        sk += part[w * 2 * L::kCB + tid];
        sq += part[w * 2 * L::kCB + L::kCB + tid];
      }
      const float4 f = norms[t];  // rk, fq, rk fq k . q
      const float be = stepped ? h->beta[t] : 0.f;
      const float u = be * (ring_elem<DT>(slot + L::row(2, t, T, ES), tid) - f.x * A * sk);
      wcol[tid] = f.x * u / A;
      store_from_float(a.o, ocol + t * a.o_st, DT, stepped ? f.y * A * sq + f.z * u : 0.f);
    }
    named_barrier_sync(1, NC);
    const float4 w = reinterpret_cast<const float4*>(wcol)[lane];
#pragma unroll
    for (int i = 0; i < 16; ++i)
      st[i] = make_float4(fmaf(kr[i], w.x, st[i].x), fmaf(kr[i], w.y, st[i].y),
                          fmaf(kr[i], w.z, st[i].z), fmaf(kr[i], w.w, st[i].w));
  }
#pragma unroll
  for (int i = 0; i < 16; ++i)
    rows[i * (L::kCB / 4)] = make_float4(A * st[i].x, A * st[i].y, A * st[i].z, A * st[i].w);
  fence_proxy_async();  // this thread's writes to the slot before the bulk store's reads
}

// ---- the consumers as one chunk on the tensor cores (CM) ----
//
// T = 1 .. 8 tokens of 16-bit inputs (exact in tf32; bf16 ones also in the 3xBF16 products of
// P^T, chunk_pt_pair_bf16) with a scalar gate as one chunk: the chunk form of recurrent_chunk.cuh
// (its header states the math and the fragment layouts) on the slot, so that an item costs the
// consumers about the same whatever T instead of ~0.5 us per token (ring_consume_tokens). The
// chunk's coefficients need only its tokens and scalars: a tenth warp forms them an item ahead
// (ring_chunk_coefficients) into one of two buffers, so that the eight consumer warps never wait
// for each other: warp w takes the state's columns 16 w .. 16 w + 15 and reads the raw token rows
// itself (the slot's rows are padded so that those reads are free of bank conflicts).

// Coefficient buffer b's mbarriers: ready (the coefficient warp's 32 arrivals) and free (the
// consumers' NC arrivals after their last read).
struct RingCoefBars {
  std::uint64_t* ready;
  std::uint64_t* free;
};

// The coefficient warp's loop: item k of the block (slot k % kRingSlots) -> buffer k % 2, once the
// consumers are done with item k - 2's: its Gram X X^T over all keys on the tensor cores
// (chunk_gram_part), then chunk_coefficients; its arrival on ready[k % 2] releases them. An item
// that is not live has no coefficients, but the same arrivals (the buffers alternate strictly);
// the end (live = -1) ends the loop.
template <int DT>
__device__ __forceinline__ void ring_chunk_coefficients(const RecurrentArgs& a, char* sm,
                                                        std::uint64_t* full, RingCoefBars bars,
                                                        int lane) {
  using L = RingLayoutT<true>;
  constexpr int ES = 2, RS = L::kRowBytes / ES;
  const int T = static_cast<int>(a.T);
  int s = 0;
  for (unsigned k = 0;; ++k) {
    const char* slot = sm + s * L::kSlot;
    const int b = k & 1;
    mbar_wait(&full[s], (k / kRingSlots) & 1u);
    const RingHeader* h = reinterpret_cast<const RingHeader*>(slot + L::kHead);
    if (h->live < 0) break;  // the end
    if (k >= 2) mbar_wait(&bars.free[b], ((k - 2) >> 1) & 1u);
    if (h->live) {
      float* buf = reinterpret_cast<float*>(sm + L::kPart + b * L::kCoefBuf);
      chunk_gram_part<DT, 1, RS>(slot + L::row(0, 0, T, ES), slot + L::row(1, 0, T, ES), T, h->step,
                                 buf + L::kCGram, 0, lane);
      chunk_coefficients<1>(a, T, h->a, h->beta, h->step, buf + L::kCGram, buf + L::kCL,
                            buf + L::kCTi, buf + L::kCCoef, lane);
    }
    mbar_arrive(&bars.ready[b]);
    s = s + 1 == kRingSlots ? 0 : s + 1;
  }
}

// A consumer warp's item k (in `slot`, coefficients in buffer k % 2 once ready): K's B operands
// of the update (tokens 2c, 2c + 1, key 8 j + g / 2 + 4 (g % 2)) from the raw rows into registers
// (zero for masked or padding tokens); once the state is in (`state_full`), its fragments from the
// slot (an 8-byte load per key row of the swizzled rows: keys 8 j + c and 8 j + c + 4, columns
// c0 = 16 w + 2g, c1 = c0 + 1) and P^T = S0^T [K; Q]^T with X's B operands (tokens g, the same
// keys) read from the raw rows; once the coefficients are ready, those it uses into registers
// (then free[k % 2]); B = beta v - cK P_k with the v of its columns, U^T = B^T Ti^T, O^T = diag(cQ)
// P_q^T + U^T Mo^T (o to global memory) and S^T = gamma S^T + (U diag(cU))^T K written back to the
// slot, then `done` (the producer's tensor store takes it).
template <int DT>
__device__ __forceinline__ void ring_consume_chunk(const RecurrentArgs& a, char* slot,
                                                   const RingHeader* h, const float* buf,
                                                   RingCoefBars bars, unsigned coef_phase,
                                                   std::uint64_t* state_full, unsigned phase,
                                                   std::uint64_t* done, int warp, int lane) {
  static_assert(DT != kF32, "16-bit inputs: exact in tf32, no lo parts");
  using L = RingLayoutT<true>;
  using Cf = ChunkCoef;
  constexpr int ES = 2, KT = L::kDK / 8, CB = L::kCB;
  const int T = static_cast<int>(a.T), lg = lane >> 2, lc = lane & 3;
  const int c0 = 16 * warp + 2 * lg, c1 = c0 + 1, s0 = 2 * lc, s1 = s0 + 1;
  const float* ms = h->step;
  const bool live_g = lg < T && ms[lg] != 0.f;
  const bool live0 = s0 < T && ms[s0] != 0.f, live1 = s1 < T && ms[s1] != 0.f;
  const char* qrow = slot + L::row(0, live_g ? lg : 0, T, ES);
  const char* krow = slot + L::row(1, live_g ? lg : 0, T, ES);
  const char* k0row = slot + L::row(1, live0 ? s0 : 0, T, ES);
  const char* k1row = slot + L::row(1, live1 ? s1 : 0, T, ES);
  float s[KT][4];
  // K's B fragments of the update (tokens 2c, 2c + 1 at key 8 j + g / 2 + 4 (g % 2): the update's
  // output column n of tile j is key 8 j + n / 2 + 4 (n % 2), the keys this thread holds).
  float2 kf[KT];
#pragma unroll
  for (int j = 0; j < KT; ++j) {
    const int key = 8 * j + (lg >> 1) + 4 * (lg & 1);
    const float y0 = raw_at(k0row, key, DT), y1 = raw_at(k1row, key, DT);
    kf[j] = make_float2(live0 ? y0 : 0.f, live1 ? y1 : 0.f);
  }
  // This thread's state pairs (keys 8 j + c and 8 j + c + 4, columns c0 and c1) in the swizzled
  // rows: key r + 8 j lies 4096 j bytes after key r at the same place in its row.
  char* st0 = slot + L::state_at(lc, c0);
  char* st1 = slot + L::state_at(lc + 4, c0);
  mbar_wait(state_full, phase);
#pragma unroll
  for (int j = 0; j < KT; ++j) {
    const float2 r0 = *reinterpret_cast<const float2*>(st0 + 4096 * j);
    const float2 r1 = *reinterpret_cast<const float2*>(st1 + 4096 * j);
    s[j][0] = r0.x, s[j][2] = r0.y, s[j][1] = r1.x, s[j][3] = r1.y;
  }
  // P^T = S0^T [K; Q]^T: pk (k tokens), pq (q tokens), main + correction accumulators, each over
  // even and odd key tiles (bf16: pairs of tiles) apart, so that eight chains run side by side.
  // bf16 inputs: two key tiles per m16n8k16 product in 3xBF16 (six products per 16 keys where
  // 3xTF32 takes eight; docs/cuda-decode.md v51: T = 8, B = 32 40.4 -> 39.9 us, the state as
  // accurate); f16 keys are not exact in bf16 and keep 3xTF32.
  float pk[2][4] = {}, pke[2][4] = {}, pq[2][4] = {}, pqe[2][4] = {};
  if constexpr (DT == kBF16) {
    // K's (Q's) B fragment of keys 16 J .. 16 J + 15: k = 2c, 2c + 1 (tile 2J's slots: keys 16 J
    // + c, + 4), k = 2c + 8, 2c + 9 (tile 2J + 1's: keys 16 J + 8 + c, + 12), token g.
    auto pair_at = [](const char* row, int key0, int key1) {
      const auto* e = reinterpret_cast<const unsigned short*>(row);
      return static_cast<std::uint32_t>(e[key0]) | static_cast<std::uint32_t>(e[key1]) << 16;
    };
#pragma unroll
    for (int J = 0; J < KT / 2; ++J) {
      const int key = 16 * J + lc, e = J & 1;
      const uint2 kb =
          live_g ? make_uint2(pair_at(krow, key, key + 4), pair_at(krow, key + 8, key + 12))
                 : make_uint2(0u, 0u);
      const uint2 qb =
          live_g ? make_uint2(pair_at(qrow, key, key + 4), pair_at(qrow, key + 8, key + 12))
                 : make_uint2(0u, 0u);
      chunk_pt_pair_bf16(s[2 * J], s[2 * J + 1], kb, qb, pk[e], pke[e], pq[e], pqe[e]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < KT; ++j) {
      const int key = 8 * j + lc, e = j & 1;  // A's columns c, c + 4: keys 8 j + c, 8 j + c + 4
      const float4 x = live_g ? make_float4(raw_at(krow, key, DT), raw_at(krow, key + 4, DT),
                                            raw_at(qrow, key, DT), raw_at(qrow, key + 4, DT))
                              : make_float4(0.f, 0.f, 0.f, 0.f);
      chunk_pt_tile(s[j], x.x, x.y, x.z, x.w, pk[e], pke[e], pq[e], pqe[e]);
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    pk[0][r] += pke[0][r] + (pk[1][r] + pke[1][r]);
    pq[0][r] += pqe[0][r] + (pq[1][r] + pqe[1][r]);
  }
  // The coefficients this thread uses, then the buffer is free.
  mbar_wait(bars.ready, coef_phase);
  const float* coef = buf + L::kCCoef;
  const float be0 = coef[Cf::kBE + s0], be1 = coef[Cf::kBE + s1];
  const float ck0 = coef[Cf::kCK + s0], ck1 = coef[Cf::kCK + s1];
  const float cq0 = coef[Cf::kCQ + s0], cq1 = coef[Cf::kCQ + s1];
  const float cu0 = coef[Cf::kCU + s0], cu1 = coef[Cf::kCU + s1], gl = coef[Cf::kGamma];
  const float4 tf = reinterpret_cast<const float4*>(coef + Cf::kTiF)[lane];
  const float4 mf = reinterpret_cast<const float4*>(coef + Cf::kMoF)[lane];
  mbar_arrive(bars.free);
  // B = beta v - cK P_k in the A order of U^T's product.
  const char* v0row = slot + L::row(2, s0, T, ES);
  const char* v1row = slot + L::row(2, s1, T, ES);
  auto bval = [&](const char* vrow, int col, float be, float ck, float p) {
    return be != 0.f ? be * raw_at(vrow, col, DT) - ck * p : 0.f;
  };
  const float4 bb =
      make_float4(bval(v0row, c0, be0, ck0, pk[0][0]), bval(v0row, c1, be0, ck0, pk[0][2]),
                  bval(v1row, c0, be1, ck1, pk[0][1]), bval(v1row, c1, be1, ck1, pk[0][3]));
  const std::int64_t n = h->n, hv = h->hv, col0 = static_cast<std::int64_t>(h->split) * CB;
  // U^T = B^T Ti^T; O^T = diag(cQ) P_q^T + U^T Mo^T, stored for the item's tokens.
  float u[4] = {0.f, 0.f, 0.f, 0.f};
  chunk_u(bb, tf, u);
  float o[4] = {cq0 * pq[0][0], cq1 * pq[0][1], cq0 * pq[0][2], cq1 * pq[0][3]};
  chunk_store_o<DT>(a, o, u, mf, n * a.o_sb + hv * a.o_sh + col0, T, s0, c0);
  // S^T = gamma S^T + (U diag(cU))^T K, written back to the slot (the producer's tensor store
  // takes it: register stores to the pool ran 7-9 % slower from B = 128, docs/cuda-decode.md v45).
  const float4 ua = make_float4(u[0] * cu0, u[2] * cu0, u[1] * cu1, u[3] * cu1);
  const float4 uh = tf32_hi4(ua), ul = sub4(ua, uh);
#pragma unroll
  for (int j = 0; j < KT; ++j) {
    chunk_update_tile(s[j], gl, uh, ul, kf[j].x, kf[j].y);
    *reinterpret_cast<float2*>(st0 + 4096 * j) = make_float2(s[j][0], s[j][2]);
    *reinterpret_cast<float2*>(st1 + 4096 * j) = make_float2(s[j][1], s[j][3]);
  }
  fence_proxy_async();  // this thread's writes to the slot before the tensor store's reads
  mbar_arrive(done);
}

// The block's item k: blockIdx.x + k gridDim.x in its static rounds (all with static items, else
// those before a.dynamic_round), else the next untaken one of the later rounds from the launch's
// counter (lane 0 takes it, the warp shares it); `items` when there is none. Each block's producer
// asks in order of k and stops at the first none.
__device__ __forceinline__ unsigned ring_next_item(const RecurrentArgs& a, unsigned k,
                                                   unsigned items, int lane) {
  const unsigned G = gridDim.x;
  if (!a.item_counter || k < a.dynamic_round) {
    const unsigned it = blockIdx.x + k * G;
    return it < items ? it : items;
  }
  unsigned taken = 0;
  if (lane == 0) taken = atomicAdd(a.item_counter, 1u);
  taken = __shfl_sync(0xffffffffu, taken, 0);
  const unsigned first = a.dynamic_round * G;  // the first item of the counter's rounds
  return first < items && taken < items - first ? first + taken : items;
}

// The producer warp's loop. Item k of the block (ring_next_item) goes into slot k % kRingSlots
// once the slot's previous item (k - kRingSlots) is done, stored and read out of the slot; after
// the last, the end (a header with live = -1) in the next slot. An item is looked up (its row from
// state_indices, its scalars: dependent global loads) a period before its fill, while the producer
// waits for a store to read its slot, so that no load latency lies between that wait and the fill:
// on the H200 a lookup issued right before the fill held each fill ~1-3 us under the ring's own
// DRAM traffic (per-block timelines, docs/cuda-decode.md v39). The first fill goes out before any
// other lookup. CM: the state's own barrier (state_full, ring_fill) beside each slot's `full`. The
// chunk consumers' start once looked up the items of slots 1 and 2 with item 0's and filled the
// three slots one after the other (v48), while each fill issued 24 row copies; with three token
// boxes per fill (RingMaps) the lookup after each fill is faster again (docs/cuda-decode.md v52;
// T = 8, us, this | together, alternating in one process: B = 16 21.50-21.62 | 21.72-21.82, B = 32
// 39.30-39.39 | 39.54-39.57, B = 64 73.15-73.25 | 73.57-73.72; T = 6, B = 32 38.95-39.01 |
// 39.12-39.17).
template <int DT, bool PK, bool CM>
__device__ __forceinline__ void ring_produce(const RecurrentArgs& a, const RingMaps& maps, char* sm,
                                             std::uint64_t* full, std::uint64_t* state_full,
                                             std::uint64_t* done, unsigned items, int lane) {
  using L = RingLayoutT<CM>;
  const std::uint64_t load_policy = l2_policy(!a.state_ld_normal);
  const std::uint64_t store_policy = l2_policy(true);
  unsigned parity = 0;  // bit s: the parity of done[s]'s next phase
  int s = 0;
  RingLookup cur = ring_lookup<PK>(a, blockIdx.x, lane), next{};
  unsigned k = 0;  // the block's item in hand (cur)
  for (;; ++k) {
    char* slot = sm + s * L::kSlot;
    unsigned next_item;  // the block's item k + 1, or `items`: none
    if (k >= kRingSlots) {
      mbar_wait(&done[s], (parity >> s) & 1u);
      parity ^= 1u << s;
      ring_store<CM>(a, maps, slot, store_policy, lane);
      next_item = ring_next_item(a, k + 1, items, lane);
      if (next_item < items)
        next = ring_lookup<PK>(a, next_item, lane);  // while the store reads the slot
      bulk_wait_read();
      __syncwarp();
      ring_fill<DT, PK, CM>(a, maps, cur, slot, &full[s], &state_full[s], load_policy, lane);
    } else {
      ring_fill<DT, PK, CM>(a, maps, cur, slot, &full[s], &state_full[s], load_policy, lane);
      next_item = ring_next_item(a, k + 1, items, lane);
      if (next_item < items) next = ring_lookup<PK>(a, next_item, lane);
    }
    if (next_item >= items) break;
    // The next item's state asked of the L2 now (a contiguous item: one bulk prefetch), so that
    // its fill, once its slot frees about a period later, reads from the L2. Measured on the
    // H200 (docs/cuda-decode.md v37, us without | with, alternating runs): B = 24 29.7-29.9 |
    // 28.3-28.6, B = 32 37.9-38.3 | 37.7-37.9, B = 40 47.1-47.3 | 46.9-47.2, B = 64 74.1-74.6 |
    // 72.1-72.3.
    // CM: the next item's box (any strides the maps take).
    if (CM && state_row_live(a, next.it.row) && lane == 0)
      tensor_prefetch_l2(&maps.in, 0, next.it.split * (L::kCB / 32), 0, next.it.hv,
                         static_cast<int>(next.it.row));
    else if (!CM && lane == 0 && state_row_live(a, next.it.row) && a.hin_s2 == L::kCB)
      prefetch_l2(a.h_in + next.it.row * a.hin_s0 + next.it.hv * a.hin_s1 + next.it.split * L::kCB,
                  L::kState);
    cur = next;
    s = s + 1 == kRingSlots ? 0 : s + 1;
  }
  // The block's last take is done. Releasing the pair later (after the tail's stores, or from the
  // coefficient warp), or with one word reset by the last failing take instead (no fence), ran
  // 0.3-1.2 us slower at T = 8 B = 32 (docs/cuda-decode.md v52, v53).
  if (lane == 0) release_item_counter(a);
  // The last items in flight (at most kRingSlots), in order.
  const unsigned mine = k + 1;  // the block's items
  const unsigned tail = mine < kRingSlots ? mine : kRingSlots;
  s = static_cast<int>((mine - tail) % kRingSlots);  // the slot of the first of them
  for (unsigned j = 0; j < tail; ++j) {
    mbar_wait(&done[s], (parity >> s) & 1u);
    parity ^= 1u << s;
    ring_store<CM>(a, maps, sm + s * L::kSlot, store_policy, lane);
    s = s + 1 == kRingSlots ? 0 : s + 1;
  }
  // The end in slot `mine` % kRingSlots: its last item (mine - kRingSlots) is done and its store
  // reads only the state, so the header is free once every lane has read it (ring_store: the
  // __syncwarp, as before a fill); the same 3T arrivals as a fill.
  RingHeader* h = reinterpret_cast<RingHeader*>(sm + s * L::kSlot + L::kHead);
  __syncwarp();
  if (lane == 0) h->live = -1;
  if (lane < 3 * a.T) mbar_arrive(&full[s]);
  bulk_wait_all();
}

// Warps of the ring kernel's block: the consumers, the producer and (CM) the coefficient warp.
constexpr int ring_warps(bool cm) {
  return kRingConsumers + 1 + (cm ? 1 : 0);
}

// One block per SM (persistent): items blockIdx.x, + gridDim.x, ... (or dynamic ones:
// ring_next_item); 8 consumer warps and one producer warp. DT: the token dtype; PK: a per-key gate;
// CM: the consumers take the T tokens as one chunk on the tensor cores (ring_consume_chunk; 16-bit
// inputs, scalar gate), with a tenth warp forming the chunks' coefficients
// (ring_chunk_coefficients). maps: CM only (the state's tensor maps; unused otherwise).
template <int DT, bool PK, bool CM = false>
__global__ void __launch_bounds__(ring_warps(CM) * 32, 1)
    recurrent_ring_kernel(const RecurrentArgs a, const __grid_constant__ RingMaps maps) {
  static_assert(!CM || (DT != kF32 && !PK), "the chunk form: 16-bit inputs, scalar gate");
  using L = RingLayoutT<CM>;
  constexpr int NC = kRingConsumers * 32;  // consumer threads
  extern __shared__ float4 smem4[];
  char* sm = reinterpret_cast<char*>(smem4);
  // CM: the layout from the first 1024-byte boundary (the swizzled boxes; kBytes has the room).
  if constexpr (CM) sm += (1024u - (smem_addr(sm) & 1023u)) & 1023u;
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(sm + L::kBars);
  std::uint64_t* done = full + kRingSlots;
  std::uint64_t* coef_ready = done + kRingSlots;  // CM: [2], then coef_free [2]
  std::uint64_t* coef_free = coef_ready + 2;
  std::uint64_t* state_full = coef_free + 2;  // CM: [kRingSlots]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned items = static_cast<unsigned>(a.N * a.Hv * static_cast<std::int64_t>(a.splits));
  // The setup touches only this block's shared memory and the kernel's parameters: before the
  // wait where the rule says so (tuning.h, recurrent_ring_setup_early).
  if (!a.setup_before_wait) wait_for_prior_grids();
  if (CM && warp == kRingConsumers && lane == 0) {
    tensor_map_prefetch(&maps.in);
    if (a.h_out) tensor_map_prefetch(&maps.out);
    tensor_map_prefetch(&maps.q);
    tensor_map_prefetch(&maps.k);
    tensor_map_prefetch(&maps.v);
  }
  if (tid == 0) {
    for (int s = 0; s < kRingSlots; ++s) {
      mbar_init(&full[s], 3 * static_cast<unsigned>(a.T));  // producer lanes [0, 3T) (ring_fill)
      mbar_init(&done[s], NC);
    }
    if constexpr (CM) {
      for (int b = 0; b < 2; ++b) {
        mbar_init(&coef_ready[b], 32);
        mbar_init(&coef_free[b], NC);
      }
      for (int s = 0; s < kRingSlots; ++s) mbar_init(&state_full[s], 1);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (a.setup_before_wait) wait_for_prior_grids();

  if (warp == kRingConsumers) {
    ring_produce<DT, PK, CM>(a, maps, sm, full, state_full, done, items, lane);
    return;
  }
  if constexpr (CM) {
    if (warp == kRingConsumers + 1) {
      ring_chunk_coefficients<DT>(a, sm, full, RingCoefBars{coef_ready, coef_free}, lane);
      return;
    }
  }

  // The consumers.
  ConsumerState c{reinterpret_cast<float4*>(sm + L::kPart),
                  reinterpret_cast<float4*>(sm + L::kPartX),
                  0,
                  0,
                  warp,
                  lane};
  unsigned parity = 0;
  int s = 0;
  for (unsigned k = 0;; ++k) {
    char* slot = sm + s * L::kSlot;
    const unsigned phase = (parity >> s) & 1u;
    mbar_wait(&full[s], phase);
    parity ^= 1u << s;
    const RingHeader* h = reinterpret_cast<const RingHeader*>(slot + L::kHead);
    if (h->live < 0) break;  // the end (ring_produce)
    // CM: coefficient buffer k % 2 and the slot's state barrier, waited for by every item (the
    // buffers alternate strictly; each fill completes the state barrier once).
    const int b = k & 1;
    const unsigned coef_phase = (k >> 1) & 1u;
    if (!h->live) {  // o = 0 (skipped pool row) or NaN (index >= P) for every token
      const float f = h->fill ? 0.f : __int_as_float(0x7fc00000);
      for (int t = warp; t < a.T; t += kRingConsumers)
        store4_from_float(a.o, ring_o_index(a, h, t, lane), DT, a.vec_o, make_float4(f, f, f, f));
      if constexpr (CM) {
        mbar_wait(&state_full[s], phase);
        mbar_wait(&coef_ready[b], coef_phase);
        mbar_arrive(&coef_free[b]);
      }
      mbar_arrive(&done[s]);
    } else if constexpr (CM) {  // waits for the state and the coefficients, arrives on free[b]
                                // and done[s] itself
      ring_consume_chunk<DT>(a, slot, h,
                             reinterpret_cast<const float*>(sm + L::kPart + b * L::kCoefBuf),
                             RingCoefBars{&coef_ready[b], &coef_free[b]}, coef_phase,
                             &state_full[s], phase, &done[s], warp, lane);
    } else {
      if (a.T == 1)
        ring_consume_one<DT, PK>(a, slot, h, c);
      else
        ring_consume_tokens<DT, PK>(a, slot, h, c);
      mbar_arrive(&done[s]);
    }
    s = s + 1 == kRingSlots ? 0 : s + 1;
  }
}

}  // namespace gdr::cuda::detail
