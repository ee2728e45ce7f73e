// The recurrent (per-token) gated delta rule kernel: decode (state in place, T = 1..16) and the
// sequential forward (h0 -> final_state, any T, varlen) run through the same kernel, except a
// single token on a k-first state with aligned rows, which recurrent_one.cuh's kernel takes
// (same tile and token step, kfirst_token below, without the shared-memory staging), and 8 or
// more tokens on a k-first fp32 state with Dk = 128 and a scalar gate on a large grid, which
// recurrent_chunk.cuh's kernel takes (tuning.h).
//
// Math (docs/operator.md §2), per sequence and value head, S in R^{Dk x Dv}, column j of S being
// the "value row" j (S^T row j):
//   S'    = a_t * S                (scalar gate, a_t = exp(g_t))
//   S'    = diag(a_t) S            (per-key gate, a_t[i] = exp(g_t[i]))
//   u_j   = beta_t * (v_t[j] - S'[:, j] . k_t)
//   S[:,j] = S'[:, j] + k_t u_j
//   o_t[j] = scale * S[:, j] . q_t = a_t * (S[:, j] . q~) + u_j * (k_t . q~)    (q~ = scale * q)
// Each value column j is independent given (q, k, a, beta), so the state is split by columns:
// one warp owns CW value columns x all Dk rows, kept in registers across the T tokens
// (Dk * CW / 32 floats = M float4 per thread), loaded and stored once with 16-byte
// accesses. The two Dk-reductions of a token (S'.k and S'.q) are a few shuffles inside the warp.
//
// Register tile of one thread (lane in 0..31), vector m in 0..M-1:
//   k-first ([.., Dk, Dv], rows contiguous over Dv): CG = CW / 4 lanes per state row,
//     RG = 32 / CG row groups; lane = rg * CG + cg; vector m holds S[rg*M + m, c0 + 4cg .. +3]
//     (4 columns of one key row; a thread's M rows are consecutive, so its k and q values are
//     M/4 16-byte shared loads). A warp's load touches RG rows x 16*CG contiguous bytes.
//   v-first ([.., Dv, Dk], S^T rows contiguous over Dk): LPC = 32 / CW lanes per value column;
//     lane = col * LPC + lic; vector m holds S[4(lic + LPC*m) .. +3, c0 + col] (4 keys of one
//     column). A warp's load touches CW rows x 16*LPC contiguous bytes.
// (CW, M per layout and Dk: Tile below.)
//
// A block is W warps (W * CW consecutive value columns of one (sequence, value head)); the
// per-token inputs of a chunk of up to TC tokens (raw q and k, the decays, beta, the block's
// v columns, the mask) are staged once per block in shared memory; the L2 norms, k.q and the
// scale ride along in the per-token butterfly. Blocks never share state columns, so decode in
// place has no cross-block hazard.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/sequences.cuh"

namespace gdr::cuda::detail {

// Element type codes as in gdr::DType (types.h): f32 = 0, f16 = 1, bf16 = 2, i32 = 4, i64 = 5.
enum : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 4, kI64 = 5 };

// Everything the kernel reads: plain pointers and int64 element strides (last dim contiguous).
struct RecurrentArgs {
  // Token inputs, [B, T, Hk, Dk] (q, k), [B, T, Hv, Dv] (v, o), [B, T, Hv] or [B, T, Hv, Dk] (g),
  // [B, T, Hv] (beta), [B, T] (mask); strides for (b, t, head).
  const void* q;
  const void* k;
  const void* v;
  const void* g;
  const void* beta;
  const std::uint8_t* mask;  // optional, bool
  void* o;
  std::int64_t q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh;
  std::int64_t g_sb, g_st, g_sh, beta_sb, beta_st, beta_sh, mask_sb, mask_st;
  std::int64_t o_sb, o_st, o_sh;
  // Gate in kernel: A_log [Hv], dt_bias [Hv] or [Hv, Dk] (optional), f32.
  const float* A_log;
  const float* dt_bias;
  std::int64_t dt_bias_sh;
  // State rows: [P, Hv, Dk, Dv] (k-first) or [P, Hv, Dv, Dk] (v-first), f32 (decode may hold
  // bf16: state_bf16, the pointers then address bf16 elements); strides of the first three dims.
  // h_in null: zeros; h_out null: not stored. Decode: both the pool.
  const float* h_in;
  float* h_out;
  std::int64_t hin_s0, hin_s1, hin_s2, hout_s0, hout_s1, hout_s2;
  // Sequences: n in [0, N). Decode/forward without varlen: batch row n, tokens [0, T).
  // Varlen (cu_seqlens [N + 1], i32|i64): batch row 0, tokens [cu[n], cu[n+1]).
  // state_indices [N] (i32|i64, optional): state row of sequence n; negative skips it.
  const void* cu_seqlens;
  const void* state_indices;
  std::int64_t N, T;
  std::int64_t P;  // state rows (decode pool); rows >= P are never touched
  int Hv, group;   // group = Hv / Hk
  int splits;      // blocks per (sequence, value head): Dv / (W * CW)
  int tc;          // tokens staged per chunk (<= TC of the instantiation)
  float scale, eps;
  int in_dtype, g_dtype, beta_dtype, cu_dtype, idx_dtype;
  bool gate_in_kernel, beta_sigmoid, qk_l2norm, vec_in, vec_out;
  // q, k, v (and a per-key g) rows start on 16-byte boundaries with strides to match: the
  // staging then moves 16-byte units (8 bf16/f16 or 4 f32 values) instead of elements.
  bool vec_tok;
  bool vec_o;       // o rows start on 16-byte boundaries with strides to match
  bool in_place;    // h_out is h_in (decode): a state left unchanged need not be stored
  bool state_bf16;  // decode: the pool holds bfloat16 (the one-token, staged and chunk kernels)
  // The next-wave L2 prefetch (prefetch_state_of_block): block b also asks the L2 for the state
  // of block b + prefetch_wave when b < prefetch_wave (a first-wave block, one wave ahead), else
  // of block b + prefetch_blocks (half a wave ahead); a distance of 0: no prefetch.
  int prefetch_blocks;
  int prefetch_wave;
  // The one-token kernel's 16-byte state loads with the default cache policy instead of
  // evict-first (tuning.h, recurrent_one_loads_normal).
  bool state_ld_normal;
  // Dynamic items: a pair (items taken, blocks done), zero at the launch and exclusive to it,
  // which the launch's last block leaves zero (release_item_counter); null: static items. The
  // chunk kernel (recurrent_chunk.cuh, DYNAMIC) takes its items beyond the first wave from it,
  // the ring kernel (recurrent_ring.cuh) the items of rounds from dynamic_round on (> 0).
  unsigned* item_counter;
  unsigned dynamic_round;
  // The ring kernel's barrier init and tensor-map prefetch before the dependent-launch wait
  // (tuning.h, recurrent_ring_setup_early).
  bool setup_before_wait;
};

// After a block's last take from a.item_counter (one thread): its arrival on the pair's second
// word; the launch's last block (every block has then taken its last) leaves both words zero for
// the next launch that uses the pair (after this grid has completed: stream order, or a dependent
// launch's wait), so that a graph's node can keep its pair without a memset node.
__device__ __forceinline__ void release_item_counter(const RecurrentArgs& a) {
  if (!a.item_counter) return;
  __threadfence();  // this block's takes before its arrival
  if (atomicAdd(a.item_counter + 1, 1u) == gridDim.x - 1) {
    atomicExch(a.item_counter, 0u);
    atomicExch(a.item_counter + 1, 0u);
  }
}

// Programmatic dependent launch (sm_90; the host sets the launch attribute, launch.cu): waits
// until the grids this one depends on in its stream have completed and their memory is visible,
// then lets the next grid in the stream launch (its blocks wait here in turn). Every kernel calls
// it before its first global memory access. Without the attribute both are no-ops.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The state row `row` is one the kernels read and write: in [0, P). A negative row (a skipped pool
// entry) or one >= P (an index the host could not check) leaves the state untouched.
__device__ __forceinline__ bool state_row_live(const RecurrentArgs& a, std::int64_t row) {
  return row >= 0 && row < a.P;
}

// Read-only (non-coherent, global space) load: lets the compiler batch loads ahead of the
// shared-memory stores of the staging code.
__device__ __forceinline__ float ldg_as_float(const void* p, std::int64_t i, int dtype) {
  if (dtype == kBF16) {
    const std::uint32_t bits = __ldg(static_cast<const unsigned short*>(p) + i);
    return __uint_as_float(bits << 16);
  }
  if (dtype == kF16) return __half2float(__ldg(static_cast<const __half*>(p) + i));
  return __ldg(static_cast<const float*>(p) + i);
}

__device__ __forceinline__ void store_from_float(void* p, std::int64_t i, int dtype, float x) {
  if (dtype == kBF16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  } else if (dtype == kF16) {
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  } else {
    static_cast<float*>(p)[i] = x;
  }
}

// Four consecutive outputs o[i .. i + 3] (i % 4 == 0); one 16-byte (f32) or 8-byte (f16, bf16)
// store when `vec` (the row starts on a 16-byte boundary).
__device__ __forceinline__ void store4_from_float(void* p, std::int64_t i, int dtype, bool vec,
                                                  float4 x) {
  if (!vec) {
    store_from_float(p, i, dtype, x.x);
    store_from_float(p, i + 1, dtype, x.y);
    store_from_float(p, i + 2, dtype, x.z);
    store_from_float(p, i + 3, dtype, x.w);
  } else if (dtype == kF32) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = x;
  } else if (dtype == kBF16) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p) + i) = make_uint2(
        *reinterpret_cast<const std::uint32_t*>(&lo), *reinterpret_cast<const std::uint32_t*>(&hi));
  } else {
    const __half2 lo = __floats2half2_rn(x.x, x.y), hi = __floats2half2_rn(x.z, x.w);
    *reinterpret_cast<uint2*>(static_cast<__half*>(p) + i) = make_uint2(
        *reinterpret_cast<const std::uint32_t*>(&lo), *reinterpret_cast<const std::uint32_t*>(&hi));
  }
}

// Four consecutive floats; one 16-byte access when the row is 16-byte aligned, by default with
// the evict-first hint (ld.global.cs: the state is read once per call); EVICT_FIRST = false: the
// default cache policy (RecurrentArgs::state_ld_normal).
template <bool EVICT_FIRST = true>
__device__ __forceinline__ float4 load4(const float* p, bool vec) {
  if (vec)
    return EVICT_FIRST ? __ldcs(reinterpret_cast<const float4*>(p))
                       : *reinterpret_cast<const float4*>(p);
  return make_float4(p[0], p[1], p[2], p[3]);
}
__device__ __forceinline__ void store4(float* p, float4 x, bool vec) {
  if (vec) {
    __stcs(reinterpret_cast<float4*>(p), x);
  } else {
    p[0] = x.x;
    p[1] = x.y;
    p[2] = x.z;
    p[3] = x.w;
  }
}

// Two 16-bit values (bf16 or f16 `dtype`) packed in one 32-bit word, low half first, as floats.
__device__ __forceinline__ float2 pair_to_float2(std::uint32_t w, int dtype) {
  if (dtype == kBF16)
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// load4 / store4 for a bfloat16 state (RecurrentArgs::state_bf16): four consecutive values as
// floats, one 8-byte access (evict-first) when the row is 16-byte aligned; stored rounded to
// nearest even.
__device__ __forceinline__ float4 load4_bf16(const std::uint16_t* p, bool vec) {
  std::uint32_t w0, w1;
  if (vec) {
    const uint2 w = __ldcs(reinterpret_cast<const uint2*>(p));
    w0 = w.x, w1 = w.y;
  } else {
    w0 = p[0] | (static_cast<std::uint32_t>(p[1]) << 16);
    w1 = p[2] | (static_cast<std::uint32_t>(p[3]) << 16);
  }
  const float2 lo = pair_to_float2(w0, kBF16), hi = pair_to_float2(w1, kBF16);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void store4_bf16(std::uint16_t* p, float4 x, bool vec) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
  const std::uint32_t w0 = *reinterpret_cast<const std::uint32_t*>(&lo);
  const std::uint32_t w1 = *reinterpret_cast<const std::uint32_t*>(&hi);
  if (vec) {
    __stcs(reinterpret_cast<uint2*>(p), make_uint2(w0, w1));
  } else {
    p[0] = static_cast<std::uint16_t>(w0);
    p[1] = static_cast<std::uint16_t>(w0 >> 16);
    p[2] = static_cast<std::uint16_t>(w1);
    p[3] = static_cast<std::uint16_t>(w1 >> 16);
  }
}

// Converts a 16-byte unit of `dtype` values (8 for 16-bit types, 4 for f32) to floats.
__device__ __forceinline__ int unit_to_float(uint4 u, int dtype, float* x) {
  const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
  if (dtype == kF32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = __uint_as_float(w[i]);
    return 4;
  }
  // The type's branch outside the loop: a literal type in each (the per-word branch had the
  // staged and one-token kernels compiled differently).
  auto pairs = [&](int type) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = pair_to_float2(w[i], type);
      x[2 * i] = f.x;
      x[2 * i + 1] = f.y;
    }
  };
  if (dtype == kBF16)
    pairs(kBF16);
  else
    pairs(kF16);
  return 8;
}

__device__ __forceinline__ float softplus(float x) {
  return x > 20.f ? x : log1pf(expf(x));
}

// The decay a = exp(g) of a raw gate value g; with the gate in the kernel, g = A softplus(g +
// dt_bias[i]) (A = -exp(A_log) of the value head, dtb its dt_bias row or null; dt_bias read only
// then).
__device__ __forceinline__ float gate_decay(const RecurrentArgs& a, float A, float g,
                                            const float* dtb, int i) {
  return expf(a.gate_in_kernel ? A * softplus(g + (dtb ? __ldg(dtb + i) : 0.f)) : g);
}

// Compile-time tile of one instantiation (see the header comment). A thread holds M float4:
//   k-first: CW = 16 (8 at Dk = 256, or NARROW) columns per warp, M = Dk * CW / 128 (4 .. 16);
//   v-first: LPC = Dk / 32 lanes per column (a 16-byte access per lane covers 4 keys),
//            CW = 32 / LPC, M = 8.
// Both keep the state plus the staged k (and q) values a thread reuses under 128 registers.
// NARROW (k-first, Dk < 256): half the columns per warp, for grids of fewer than two warps per
// SM (tuning.h, recurrent_narrow_applies): twice the warps, each with half the token loop's work
// and one more butterfly level.
template <int DK, bool VFIRST, bool NARROW = false>
struct Tile {
  static constexpr int kLPC = DK / 32;  // v-first
  static constexpr int kCW = VFIRST ? 32 / kLPC : (DK == 256 || NARROW ? 8 : 16);
  static constexpr int kM = DK * kCW / 128;            // float4 per thread
  static constexpr int kCG = kCW / 4, kRG = 32 / kCG;  // k-first
  static constexpr int kTC = DK == 256 ? 8 : 16;       // tokens per chunk
};

// Shared floats per block for `tc` staged tokens and `cb` value columns:
//   q[tc][Dk], k[tc][Dk], v[tc][cb], a[tc][Dk or 1], beta[tc], mask[tc].
inline constexpr int shared_floats(int dk, bool per_key, int tc, int cb) {
  return tc * (2 * dk + (per_key ? dk : 1) + cb + 2);
}

// ---- staging of one chunk of `cnt` tokens (tokens tok0 .. tok0 + cnt - 1 of batch row b) ----
// Shared layout (floats, each array from a multiple of 4): q[cnt][DK], k[cnt][DK], v[cnt][cb],
// a[cnt][DK or 1] = exp(g) (after the in-kernel gate), beta[cnt] (after the sigmoid), mask[cnt].

// Byte address of one input's row for the block's first token (batch row b, token t0, the
// block's head and, for v, its first column) and the byte stride from one token to the next;
// formed once per block so that the staging adds only (token * stride + unit offset).
struct TokenRows {
  const char* p;
  std::int64_t ts;
  __device__ __forceinline__ const char* at(std::int64_t tok) const { return p + tok * ts; }
};

struct BlockRows {
  TokenRows q, k, v, g, beta, mask;
};

__device__ __forceinline__ TokenRows token_rows(const void* base, int es, std::int64_t off,
                                                std::int64_t st) {
  if (!base) return {nullptr, 0};
  return {static_cast<const char*>(base) + es * off, es * st};
}

__device__ __forceinline__ int dtype_bytes(int dtype) {
  return dtype == kF32 ? 4 : 2;
}

// The `dtype` value at byte address p, as float (read-only load).
__device__ __forceinline__ float bytes_as_float(const char* p, int dtype) {
  return ldg_as_float(p, 0, dtype);
}

// The work item (n * Hv + hv) * splits + split (fewer than 2^31 items, host): sequence n, its
// batch row b and tokens [t0, t0 + len) (varlen: row 0, tokens from cu_seqlens), its state row
// (state_indices[n], or n), value head hv and key head hk. block_item_at and block_rows serve the
// chunk kernel (recurrent_chunk.cuh, persistent blocks); recurrent_kernel below keeps the same
// steps written inline for its block blockIdx.x: built on these helpers it measured 2-3 % slower
// at T = 8 on the H200 (87924c2, docs/cuda-decode.md v30), the way an earlier refactor of it did
// (3666dba).
struct BlockItem {
  std::int64_t n, b, t0, len, row;
  int hv, hk, split;
};

// The item's fields that its index alone gives (no memory read: a kernel may form them before
// wait_for_prior_grids): sequence, heads and split, tokens [0, T) of batch row n; the row is not
// set (item_state_row).
__device__ __forceinline__ BlockItem block_item_head(const RecurrentArgs& a, unsigned bid) {
  BlockItem it;
  const unsigned rest = bid / static_cast<unsigned>(a.splits);
  it.split = static_cast<int>(bid - rest * static_cast<unsigned>(a.splits));
  const unsigned nq = rest / static_cast<unsigned>(a.Hv);
  it.hv = static_cast<int>(rest - nq * static_cast<unsigned>(a.Hv));
  it.hk = it.hv / a.group;
  it.n = nq;
  it.b = it.n, it.t0 = 0, it.len = a.T;
  return it;
}

// The state row of sequence n: state_indices[n], or n.
__device__ __forceinline__ std::int64_t item_state_row(const RecurrentArgs& a, std::int64_t n) {
  return a.state_indices ? load_index(a.state_indices, n, a.idx_dtype) : n;
}

__device__ __forceinline__ BlockItem block_item_at(const RecurrentArgs& a, unsigned bid) {
  BlockItem it = block_item_head(a, bid);
  if (a.cu_seqlens) {
    std::int64_t eos;
    sequence_bounds(a.cu_seqlens, a.cu_dtype, it.n, a.T, it.t0, eos);
    it.b = 0;
    it.len = eos - it.t0;
  }
  it.row = item_state_row(a, it.n);
  return it;
}

// An item's first token row of every input (v from column col0).
__device__ __forceinline__ BlockRows block_rows(const RecurrentArgs& a, const BlockItem& it,
                                                int col0) {
  const std::int64_t b = it.b, t0 = it.t0;
  const int es = dtype_bytes(a.in_dtype);
  BlockRows rows;
  rows.q = token_rows(a.q, es, b * a.q_sb + t0 * a.q_st + it.hk * a.q_sh, a.q_st);
  rows.k = token_rows(a.k, es, b * a.k_sb + t0 * a.k_st + it.hk * a.k_sh, a.k_st);
  rows.v = token_rows(a.v, es, b * a.v_sb + t0 * a.v_st + it.hv * a.v_sh + col0, a.v_st);
  rows.g =
      token_rows(a.g, dtype_bytes(a.g_dtype), b * a.g_sb + t0 * a.g_st + it.hv * a.g_sh, a.g_st);
  rows.beta = token_rows(a.beta, dtype_bytes(a.beta_dtype),
                         b * a.beta_sb + t0 * a.beta_st + it.hv * a.beta_sh, a.beta_st);
  rows.mask = token_rows(a.mask, 1, b * a.mask_sb + t0 * a.mask_st, a.mask_st);
  return rows;
}

// Per-token scalars: [scalar g: cnt (scalar gate only)][beta: cnt][mask: cnt]; loaded into
// `x` (at most 2 per thread: 3 * 16 <= 2 * 32), stored by store_scalars after the other loads.
// `tb` is the chunk's first token relative to the block's first token. Thread f0 takes scalars
// f0, f0 + stride, ... (N of them; by default the block's threads, two each; a single warp
// passes its lane, 32 and N = 1 for at most 24 scalars).
template <bool PERKEY, int N = 2>
__device__ __forceinline__ void load_scalars(const RecurrentArgs& a, const BlockRows& r, int cnt,
                                             std::int64_t tb, float* x,
                                             int f0 = static_cast<int>(threadIdx.x),
                                             int stride = static_cast<int>(blockDim.x)) {
  const int s_b = PERKEY ? 0 : cnt, s_m = s_b + cnt, s_end = s_m + cnt;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int f = f0 + j * stride;
    x[j] = 0.f;
    if (f < s_b) {
      x[j] = bytes_as_float(r.g.at(tb + f), a.g_dtype);
    } else if (f < s_m) {
      x[j] = bytes_as_float(r.beta.at(tb + f - s_b), a.beta_dtype);
    } else if (f < s_end) {
      x[j] = (a.mask && !__ldg(reinterpret_cast<const std::uint8_t*>(r.mask.at(tb + f - s_m))))
                 ? 0.f
                 : 1.f;
    }
  }
}

template <bool PERKEY, int N = 2>
__device__ __forceinline__ void store_scalars(const RecurrentArgs& a, int cnt, float A,
                                              const float* dtb, const float* x, float* gs,
                                              float* bs, float* ms,
                                              int f0 = static_cast<int>(threadIdx.x),
                                              int stride = static_cast<int>(blockDim.x)) {
  const int s_b = PERKEY ? 0 : cnt, s_m = s_b + cnt, s_end = s_m + cnt;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int f = f0 + j * stride;
    if (f < s_b) {
      gs[f] = gate_decay(a, A, x[j], dtb, 0);
    } else if (f < s_m) {
      bs[f - s_b] = a.beta_sigmoid ? 1.f / (1.f + expf(-x[j])) : x[j];
    } else if (f < s_end) {
      ms[f - s_m] = x[j];
    }
  }
}

// One warp's scalars of `cnt` tokens of an item (load_scalars / store_scalars over the warp's
// lanes, one each: 3 cnt <= 24 scalars, per-key 2 cnt: no gate; lane f's raw value x), stored
// with the value head's fused-gate parameters. The chunk and ring kernels' issuing warps.
template <bool PERKEY = false>
__device__ __forceinline__ void warp_scalar_store(const RecurrentArgs& a, int cnt, int hv, float x,
                                                  int lane, float* gs, float* bs, float* ms) {
  const float A = !PERKEY && a.gate_in_kernel && lane < cnt ? -expf(__ldg(a.A_log + hv)) : 0.f;
  const float* dtb = a.dt_bias ? a.dt_bias + hv * a.dt_bias_sh : nullptr;
  store_scalars<PERKEY, 1>(a, cnt, A, dtb, &x, gs, bs, ms, lane, 32);
}

// Fast path (a.vec_tok): q, k, v rows (and per-key g rows) move as 16-byte units, two units in
// flight per thread before any shared store. Unit f of the chunk: q units [0, u_k), k units
// [u_k, u_v), v units [u_v, u_g), per-key g units [u_g, u_end); within an array, unit e is
// token e >> l, 16-byte word e & (2^l - 1) of that token's row.
template <int DK, bool PERKEY>
__device__ __forceinline__ void stage_units(const RecurrentArgs& a, const BlockRows& r, int cnt,
                                            std::int64_t tb, int cb, float A, const float* dtb,
                                            float* qs, float* ks, float* vs, float* gs, float* bs,
                                            float* ms) {
  constexpr int LDK = DK == 64 ? 6 : (DK == 128 ? 7 : 8);
  const int lve = a.in_dtype == kF32 ? 2 : 3;  // log2(values per unit)
  const int lveg = a.g_dtype == kF32 ? 2 : 3;
  const int lq = LDK - lve;               // log2(units per q/k row)
  const int lv = (31 - __clz(cb)) - lve;  // log2(units per v row); cb % ve == 0 (host)
  const int lg = PERKEY ? LDK - lveg : 0;
  const int u_k = cnt << lq, u_v = 2 * u_k, u_g = u_v + (cnt << lv);
  const int u_end = u_g + (PERKEY ? cnt << lg : 0);
  float xs[2];
  load_scalars<PERKEY>(a, r, cnt, tb, xs);
  for (int f0 = threadIdx.x; f0 < u_end; f0 += 2 * blockDim.x) {
    uint4 u[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int f = f0 + j * blockDim.x;
      if (f >= u_end) continue;
      const bool in_q = f < u_k, in_k = f < u_v, in_v = f < u_g;
      const char* p = in_q ? r.q.p : (in_k ? r.k.p : (in_v ? r.v.p : r.g.p));
      const std::int64_t ts = in_q ? r.q.ts : (in_k ? r.k.ts : (in_v ? r.v.ts : r.g.ts));
      const int e = f - (in_q ? 0 : (in_k ? u_k : (in_v ? u_v : u_g)));
      const int l = in_k ? lq : (in_v ? lv : lg);
      u[j] = __ldg(
          reinterpret_cast<const uint4*>(p + (tb + (e >> l)) * ts + 16 * (e & ((1 << l) - 1))));
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int f = f0 + j * blockDim.x;
      if (f >= u_end) continue;
      float x[8];
      float* dst;
      int n;
      if (f < u_g) {
        n = unit_to_float(u[j], a.in_dtype, x);
        dst = f < u_k ? qs + (f << lve)
                      : (f < u_v ? ks + ((f - u_k) << lve) : vs + ((f - u_v) << lve));
      } else {
        n = unit_to_float(u[j], a.g_dtype, x);
        const int e = f - u_g, i0 = (e & ((1 << lg) - 1)) << lveg;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (i < n) x[i] = gate_decay(a, A, x[i], dtb, i0 + i);
        dst = gs + (e << lveg);
      }
      reinterpret_cast<float4*>(dst)[0] = make_float4(x[0], x[1], x[2], x[3]);
      if (n == 8) reinterpret_cast<float4*>(dst)[1] = make_float4(x[4], x[5], x[6], x[7]);
    }
  }
  store_scalars<PERKEY>(a, cnt, A, dtb, xs, gs, bs, ms);
}

// General strides: element by element (read-only loads, unrolled so several are in flight).
template <int DK, bool PERKEY>
__device__ __forceinline__ void stage_elements(const RecurrentArgs& a, const BlockRows& r,
                                               std::int64_t t0, int cnt, std::int64_t b,
                                               std::int64_t tok0, int hv, int hk, int col0, int cb,
                                               float A, const float* dtb, float* qs, float* ks,
                                               float* vs, float* gs, float* bs, float* ms) {
  float xs[2];
  load_scalars<PERKEY>(a, r, cnt, tok0 - t0, xs);
#pragma unroll 4
  for (int e = threadIdx.x; e < cnt * DK; e += blockDim.x) {
    const std::int64_t tok = tok0 + e / DK;
    const int i = e % DK;
    qs[e] = ldg_as_float(a.q, b * a.q_sb + tok * a.q_st + hk * a.q_sh + i, a.in_dtype);
    ks[e] = ldg_as_float(a.k, b * a.k_sb + tok * a.k_st + hk * a.k_sh + i, a.in_dtype);
  }
#pragma unroll 4
  for (int e = threadIdx.x; e < cnt * cb; e += blockDim.x) {
    const std::int64_t tok = tok0 + e / cb;
    vs[e] = ldg_as_float(a.v, b * a.v_sb + tok * a.v_st + hv * a.v_sh + col0 + e % cb, a.in_dtype);
  }
  if constexpr (PERKEY) {
#pragma unroll 4
    for (int e = threadIdx.x; e < cnt * DK; e += blockDim.x) {
      const std::int64_t tok = tok0 + e / DK;
      const int i = e % DK;
      const float g = ldg_as_float(a.g, b * a.g_sb + tok * a.g_st + hv * a.g_sh + i, a.g_dtype);
      gs[e] = gate_decay(a, A, g, dtb, i);
    }
  }
  store_scalars<PERKEY>(a, cnt, A, dtb, xs, gs, bs, ms);
}

// One round of a transposing warp reduction of N values: lanes with bit OFF set keep the
// upper N / 2 values, the others the lower; each sends the other half to lane ^ OFF and adds
// what it receives (N / 2 shuffles; the values a lane keeps halve).
template <int N, int OFF>
__device__ __forceinline__ void transpose_reduce_round(float* x, int lane) {
  const bool upper = lane & OFF;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const float lo = x[i], hi = x[i + N / 2];  // values first: no select of addresses
    const float keep = upper ? hi : lo, send = upper ? lo : hi;
    x[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
  }
}

// The token step of the k-first tile on one lane's registers (row m of the lane: COLS / 4
// float4, s[m * COLS / 4 + h] = S[r0 + m, 4h .. 4h + 3 of its columns]), shared by
// recurrent_kernel and recurrent_one_kernel: the Dk-reductions on the raw q, k in one butterfly
// over the row groups (S'.k, S'.q, k.q and, with L2, ||q||^2 and ||k||^2; the norms and the
// scale applied to the reduced values), then
//   u = beta (v - S'^T k^),  o = S'^T q~ + u (k^ . q~),  S = S' + k^ u^T
// with S' = dec * S (a per-key decay is applied to s by the caller, dec = 1). k4(m4) / q4(m4)
// give k and q of rows r0 + 4 m4 .. + 3. COLS = 4 (an fp32 state, 16-byte rows of 4 columns):
// a butterfly reduction; v4(h) gives the lane's values 4h .. 4h + 3 of v, store_o(h, o) is
// called on every lane (the caller stores from one row group). COLS = 8 (a bf16 state, 16-byte
// rows of 8 columns): a scattered reduction (below); v4(c) gives the lane's value c of v (a
// float), store_o(c, o) is called on the one lane that holds o_c.
template <int M, int CG, bool L2, int COLS = 4, typename K4, typename Q4, typename V4,
          typename StoreO>
__device__ __forceinline__ void kfirst_token(float4 (&s)[M * COLS / 4], K4 k4, Q4 q4, V4 v4_of,
                                             StoreO store_o, float be, float dec, float scale,
                                             float eps) {
  constexpr int NV = COLS / 4;  // float4 per row
  float pk[COLS], pq[COLS];
#pragma unroll
  for (int c = 0; c < COLS; ++c) pk[c] = pq[c] = 0.f;
  float kq = 0.f, nq = 0.f, nk = 0.f;
#pragma unroll
  for (int m4 = 0; m4 < M / 4; ++m4) {
    const float4 k4v = k4(m4), q4v = q4(m4);
    const float kk[4] = {k4v.x, k4v.y, k4v.z, k4v.w}, qq[4] = {q4v.x, q4v.y, q4v.z, q4v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int h = 0; h < NV; ++h) {
        const float4 sv = s[(4 * m4 + e) * NV + h];
        pk[4 * h] += sv.x * kk[e];
        pk[4 * h + 1] += sv.y * kk[e];
        pk[4 * h + 2] += sv.z * kk[e];
        pk[4 * h + 3] += sv.w * kk[e];
        pq[4 * h] += sv.x * qq[e];
        pq[4 * h + 1] += sv.y * qq[e];
        pq[4 * h + 2] += sv.z * qq[e];
        pq[4 * h + 3] += sv.w * qq[e];
      }
      kq += kk[e] * qq[e];
      if constexpr (L2) {
        nq += qq[e] * qq[e];
        nk += kk[e] * kk[e];
      }
    }
  }
  // k.q and, with L2, ||q||^2 and ||k||^2: one butterfly step over the row groups.
  auto reduce_scalars = [&](int off) {
    kq += __shfl_xor_sync(0xffffffffu, kq, off);
    if constexpr (L2) {
      nq += __shfl_xor_sync(0xffffffffu, nq, off);
      nk += __shfl_xor_sync(0xffffffffu, nk, off);
    }
  };
  float u[COLS];
  if constexpr (COLS == 8) {
    // 16 row groups (CG = 2; 32 at Dk = 256, CG = 1): one transposing reduction of the 16 values
    // {S'.k, S'.q} (15 shuffles, + 1 with 32 groups, instead of a 16-value butterfly's 64 or 80)
    // leaves lane pair e = lane / 2 with value e: S'.k of column e (e < 8) or S'.q of column
    // e - 8; u_e is formed there, handed to pair e + 8 (lane bit 4) for o_e, and gathered by
    // every lane for the update.
    static_assert(CG == 1 || CG == 2, "the 8-column tile has 16 or 32 row groups");
    float x[16];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      x[c] = pk[c];
      x[8 + c] = pq[c];
    }
    const int lane = threadIdx.x & 31;
    transpose_reduce_round<16, 16>(x, lane);
    transpose_reduce_round<8, 8>(x, lane);
    transpose_reduce_round<4, 4>(x, lane);
    transpose_reduce_round<2, 2>(x, lane);
    if constexpr (CG == 1) x[0] += __shfl_xor_sync(0xffffffffu, x[0], 1);
#pragma unroll
    for (int off = CG; off < 32; off <<= 1) reduce_scalars(off);
    const float rk = L2 ? 1.f / sqrtf(nk + eps) : 1.f;
    const float fq = scale * (L2 ? 1.f / sqrtf(nq + eps) : 1.f);
    const float kqn = kq * rk * fq;
    const int e = lane >> 1, c = e & 7;
    const int cg = CG == 2 ? (lane & 1) : 0;  // the lane of the pair that holds the column group
    const float ue = be * (v4_of(c) - dec * x[0] * rk);  // u = beta (v - S'^T k^), e < 8
    const float uo = __shfl_xor_sync(0xffffffffu, ue, 16);
    if (e >= 8 && (lane & 1) == cg)
      store_o(c, dec * x[0] * fq + uo * kqn);  // o = S'^T q~ + u k^.q~
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) u[cc] = rk * __shfl_sync(0xffffffffu, ue, 2 * cc + cg);
  } else {
#pragma unroll
    for (int off = CG; off < 32; off <<= 1) {
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        pk[c] += __shfl_xor_sync(0xffffffffu, pk[c], off);
        pq[c] += __shfl_xor_sync(0xffffffffu, pq[c], off);
      }
      reduce_scalars(off);
    }
    const float rk = L2 ? 1.f / sqrtf(nk + eps) : 1.f;
    const float fq = scale * (L2 ? 1.f / sqrtf(nq + eps) : 1.f);
    const float kqn = kq * rk * fq;
#pragma unroll
    for (int h = 0; h < NV; ++h) {  // u = beta (v - S'^T k^)
      const float4 v4 = v4_of(h);
      u[4 * h] = be * (v4.x - dec * pk[4 * h] * rk);
      u[4 * h + 1] = be * (v4.y - dec * pk[4 * h + 1] * rk);
      u[4 * h + 2] = be * (v4.z - dec * pk[4 * h + 2] * rk);
      u[4 * h + 3] = be * (v4.w - dec * pk[4 * h + 3] * rk);
      store_o(h, make_float4(dec * pq[4 * h] * fq + u[4 * h] * kqn,
                             dec * pq[4 * h + 1] * fq + u[4 * h + 1] * kqn,
                             dec * pq[4 * h + 2] * fq + u[4 * h + 2] * kqn,
                             dec * pq[4 * h + 3] * fq + u[4 * h + 3] * kqn));
    }
#pragma unroll
    for (int c = 0; c < COLS; ++c) u[c] *= rk;
  }
#pragma unroll
  for (int m4 = 0; m4 < M / 4; ++m4) {  // S = S' + k^ u^T
    const float4 k4v = k4(m4);
    const float kk[4] = {k4v.x, k4v.y, k4v.z, k4v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int h = 0; h < NV; ++h) {
        float4& sv = s[(4 * m4 + e) * NV + h];
        sv.x = fmaf(dec, sv.x, kk[e] * u[4 * h]);
        sv.y = fmaf(dec, sv.y, kk[e] * u[4 * h + 1]);
        sv.z = fmaf(dec, sv.z, kk[e] * u[4 * h + 2]);
        sv.w = fmaf(dec, sv.w, kk[e] * u[4 * h + 3]);
      }
    }
  }
}

// Asks the L2 to fetch `bytes` (a multiple of 16) from the 16-byte aligned global address p;
// no completion, no registers written (cp.async.bulk.prefetch, sm_90).
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes));
#endif
}

// The next wave's state traffic started early (docs/cuda-decode.md, v25, v28): block b asks the
// L2 for the state of block b + a.prefetch_blocks, which the hardware dispatches (blocks go out in
// index order as resident ones retire) about half a block lifetime later when prefetch_blocks is
// half a wave. Its loads then hit L2, and the DRAM stays busy while the resident blocks compute
// instead of waiting on each block's serial load -> compute -> store. In a grid of one to two
// waves, the first wave's blocks (b < a.prefetch_wave) prefetch the block one wave ahead: the
// whole second wave. A head whose rows are contiguous ([DK][Dv] k-first or [Dv][DK] v-first, no
// padding) is prefetched whole, by the block holding its first columns, as one bulk prefetch;
// otherwise each block prefetches its own rows (k-first: DK rows of cb * eb bytes; v-first: cb
// rows of DK * eb bytes; eb = bytes per state element). Needs 16-byte aligned rows
// (RecurrentArgs::vec_in, checked on the host).
template <int DK, bool VFIRST>
__device__ __forceinline__ void prefetch_state_of_block(const RecurrentArgs& a, int cb, int eb) {
  const unsigned first = static_cast<unsigned>(a.prefetch_wave);
  const unsigned ahead = blockIdx.x < first ? first : static_cast<unsigned>(a.prefetch_blocks);
  const unsigned future = blockIdx.x + ahead;
  if (ahead == 0 || future >= gridDim.x || !a.h_in) return;
  const unsigned rest = future / static_cast<unsigned>(a.splits);
  const int split = static_cast<int>(future - rest * static_cast<unsigned>(a.splits));
  const unsigned nq = rest / static_cast<unsigned>(a.Hv);
  const int hv = static_cast<int>(rest - nq * static_cast<unsigned>(a.Hv));
  std::int64_t row = nq;
  if (a.state_indices) row = load_index(a.state_indices, row, a.idx_dtype);
  if (!state_row_live(a, row)) return;
  const char* head = reinterpret_cast<const char*>(a.h_in) + eb * (row * a.hin_s0 + hv * a.hin_s1);
  const std::int64_t dv = static_cast<std::int64_t>(a.splits) * cb;
  if (a.hin_s2 == (VFIRST ? DK : dv)) {
    if (split == 0 && threadIdx.x == 0) prefetch_l2(head, static_cast<unsigned>(DK * dv * eb));
    return;
  }
  const int col0 = split * cb, rows = VFIRST ? cb : DK;
  const unsigned bytes = static_cast<unsigned>((VFIRST ? DK : cb) * eb);
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const std::int64_t off = VFIRST ? (col0 + r) * a.hin_s2 : r * a.hin_s2 + col0;
    prefetch_l2(head + eb * off, bytes);
  }
}

// Dv is a run-time value (columns are split over warps and blocks: Dv % (W * CW) == 0).
template <int DK, bool VFIRST, bool PERKEY, bool NARROW = false>
__global__ void __launch_bounds__(256, 2) recurrent_kernel(const RecurrentArgs a) {
  using Tl = Tile<DK, VFIRST, NARROW>;
  constexpr int CW = Tl::kCW, M = Tl::kM, CG = Tl::kCG, LPC = Tl::kLPC;
  constexpr int GW = PERKEY ? DK : 1;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int cb = nwarps * CW;
  wait_for_prior_grids();
  // blockIdx.x = (n * Hv + hv) * splits + split; the grid is < 2^31 blocks (host).
  const unsigned bid = blockIdx.x, rest = bid / static_cast<unsigned>(a.splits);
  const int split = static_cast<int>(bid - rest * static_cast<unsigned>(a.splits));
  const unsigned nq = rest / static_cast<unsigned>(a.Hv);
  const int hv = static_cast<int>(rest - nq * static_cast<unsigned>(a.Hv));
  const std::int64_t n = nq;
  const int hk = hv / a.group;
  const int col0 = split * cb;        // first value column of the block
  const int colw = col0 + warp * CW;  // first value column of the warp

  std::int64_t b = n, t0 = 0, len = a.T;
  if (a.cu_seqlens) {
    std::int64_t eos;
    sequence_bounds(a.cu_seqlens, a.cu_dtype, n, a.T, t0, eos);
    b = 0;
    len = eos - t0;
  }
  std::int64_t row = n;
  if (a.state_indices) row = load_index(a.state_indices, n, a.idx_dtype);

  // Skipped pool row (negative index): o = 0 for the block's columns, state untouched. An
  // index >= P (device indices are not checked on the host) writes NaN to o, state untouched.
  if (!state_row_live(a, row)) {
    const float fill = row < 0 ? 0.f : __int_as_float(0x7fc00000);
    for (std::int64_t e = threadIdx.x; e < len * cb; e += blockDim.x) {
      const std::int64_t t = e / cb;
      const int c = static_cast<int>(e % cb);
      store_from_float(a.o, b * a.o_sb + (t0 + t) * a.o_st + hv * a.o_sh + col0 + c, a.in_dtype,
                       fill);
    }
    return;
  }

  // Offset of the thread's vector m inside one state row (s2 = stride of the third dim).
  auto offset = [&](int m, std::int64_t s2) -> std::int64_t {
    if constexpr (VFIRST) {
      return static_cast<std::int64_t>(colw + lane / LPC) * s2 + 4 * (lane % LPC + LPC * m);
    } else {
      return static_cast<std::int64_t>((lane / CG) * M + m) * s2 + colw + 4 * (lane % CG);
    }
  };

  // State loads first: they are the long-latency traffic and overlap the staging below. A bf16
  // state (decode) is held as fp32 in the registers like an fp32 one.
  float4 s[M];
  if (a.h_in && a.state_bf16) {
    const auto* base =
        reinterpret_cast<const std::uint16_t*>(a.h_in) + row * a.hin_s0 + hv * a.hin_s1;
#pragma unroll
    for (int m = 0; m < M; ++m) s[m] = load4_bf16(base + offset(m, a.hin_s2), a.vec_in);
  } else if (a.h_in) {
    const float* base = a.h_in + row * a.hin_s0 + hv * a.hin_s1;
    if (a.vec_in) {  // one uniform branch: 16-byte loads, none predicated off
#pragma unroll
      for (int m = 0; m < M; ++m) s[m] = load4(base + offset(m, a.hin_s2), true);
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m) s[m] = load4(base + offset(m, a.hin_s2), false);
    }
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m) s[m] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (a.prefetch_blocks > 0 || a.prefetch_wave > 0)
    prefetch_state_of_block<DK, VFIRST>(a, cb, a.state_bf16 ? 2 : 4);

  const int tc = a.tc;
  // Every array read as float4 starts at a multiple of 4 floats (Dk and cb are).
  float* qs = smem;          // [tc][DK]  q (raw)
  float* ks = qs + tc * DK;  // [tc][DK]  k (raw)
  float* vs = ks + tc * DK;  // [tc][cb]  v columns of the block
  float* gs = vs + tc * cb;  // [tc][GW]  decay a = exp(g)
  float* bs = gs + tc * GW;  // [tc]      beta
  float* ms = bs + tc;       // [tc]      1 = step, 0 = masked

  const float A = a.gate_in_kernel ? -expf(__ldg(a.A_log + hv)) : 0.f;  // g = A softplus(a + dt_b)
  const float* dtb = a.dt_bias ? a.dt_bias + hv * a.dt_bias_sh : nullptr;

  // The block's first token row of every input; o as an element index (store_from_float).
  const int es = dtype_bytes(a.in_dtype);
  BlockRows rows;
  rows.q = token_rows(a.q, es, b * a.q_sb + t0 * a.q_st + hk * a.q_sh, a.q_st);
  rows.k = token_rows(a.k, es, b * a.k_sb + t0 * a.k_st + hk * a.k_sh, a.k_st);
  rows.v = token_rows(a.v, es, b * a.v_sb + t0 * a.v_st + hv * a.v_sh + col0, a.v_st);
  rows.g = token_rows(a.g, dtype_bytes(a.g_dtype), b * a.g_sb + t0 * a.g_st + hv * a.g_sh, a.g_st);
  rows.beta = token_rows(a.beta, dtype_bytes(a.beta_dtype),
                         b * a.beta_sb + t0 * a.beta_st + hv * a.beta_sh, a.beta_st);
  rows.mask = token_rows(a.mask, 1, b * a.mask_sb + t0 * a.mask_st, a.mask_st);
  const std::int64_t orow = b * a.o_sb + t0 * a.o_st + hv * a.o_sh;

  for (std::int64_t tb = 0; tb < len; tb += tc) {
    const int cnt = static_cast<int>(len - tb < tc ? len - tb : tc);
    if (tb > 0) __syncthreads();  // the previous chunk's readers are done
    if (a.vec_tok) {
      stage_units<DK, PERKEY>(a, rows, cnt, tb, cb, A, dtb, qs, ks, vs, gs, bs, ms);
    } else {
      stage_elements<DK, PERKEY>(a, rows, t0, cnt, b, t0 + tb, hv, hk, col0, cb, A, dtb, qs, ks, vs,
                                 gs, bs, ms);
    }
    __syncthreads();
    // Bit t: token t of the chunk steps (1) or is masked (0); tc <= 16 < 32 lanes.
    const unsigned live = __ballot_sync(0xffffffffu, lane < cnt && ms[lane] != 0.f);

    // ---- the recurrence over the chunk, state in registers ----
    // The token's Dk-reductions are done on the raw q, k in one butterfly: S'.k, S'.q, k.q and,
    // with the in-kernel L2 norm, ||q||^2 and ||k||^2; the norms and the scale are applied to the
    // reduced values (q~ = scale q / ||q||, k^ = k / ||k||).
    auto step = [&](auto l2_tag, int t) {
      constexpr bool L2 = decltype(l2_tag)::value;
      const std::int64_t obase = orow + (tb + t) * a.o_st;
      const float* qt = qs + t * DK;
      const float* kt = ks + t * DK;
      const float* gt = gs + t * GW;
      const float be = bs[t];
      // Scalar gate: the decay is applied lazily (S'.x = a * (S.x)); per-key: S' first.
      float dec = 1.f;
      if constexpr (PERKEY) {
        if constexpr (VFIRST) {
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const float4 g4 = reinterpret_cast<const float4*>(gt)[lane % LPC + LPC * m];
            s[m].x *= g4.x;
            s[m].y *= g4.y;
            s[m].z *= g4.z;
            s[m].w *= g4.w;
          }
        } else {
#pragma unroll
          for (int m4 = 0; m4 < M / 4; ++m4) {
            const float4 g4 = reinterpret_cast<const float4*>(gt + (lane / CG) * M)[m4];
            const float gg[4] = {g4.x, g4.y, g4.z, g4.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              s[4 * m4 + e].x *= gg[e];
              s[4 * m4 + e].y *= gg[e];
              s[4 * m4 + e].z *= gg[e];
              s[4 * m4 + e].w *= gg[e];
            }
          }
        }
      } else {
        dec = gt[0];
      }
      if constexpr (VFIRST) {
        // One value column per group of LPC lanes: pk = S.k, pq = S.q over Dk.
        const float4* k4 = reinterpret_cast<const float4*>(kt);
        const float4* q4 = reinterpret_cast<const float4*>(qt);
        float pk = 0.f, pq = 0.f, kq = 0.f, nq = 0.f, nk = 0.f;
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float4 kk = k4[lane % LPC + LPC * m], qq = q4[lane % LPC + LPC * m];
          pk += s[m].x * kk.x + s[m].y * kk.y + s[m].z * kk.z + s[m].w * kk.w;
          pq += s[m].x * qq.x + s[m].y * qq.y + s[m].z * qq.z + s[m].w * qq.w;
          kq += kk.x * qq.x + kk.y * qq.y + kk.z * qq.z + kk.w * qq.w;
          if constexpr (L2) {
            nq += qq.x * qq.x + qq.y * qq.y + qq.z * qq.z + qq.w * qq.w;
            nk += kk.x * kk.x + kk.y * kk.y + kk.z * kk.z + kk.w * kk.w;
          }
        }
#pragma unroll
        for (int off = 1; off < LPC; off <<= 1) {
          pk += __shfl_xor_sync(0xffffffffu, pk, off);
          pq += __shfl_xor_sync(0xffffffffu, pq, off);
          kq += __shfl_xor_sync(0xffffffffu, kq, off);
          if constexpr (L2) {
            nq += __shfl_xor_sync(0xffffffffu, nq, off);
            nk += __shfl_xor_sync(0xffffffffu, nk, off);
          }
        }
        const float rk = L2 ? 1.f / sqrtf(nk + a.eps) : 1.f;
        const float fq = a.scale * (L2 ? 1.f / sqrtf(nq + a.eps) : 1.f);
        const int col = lane / LPC;
        // u = beta (v - S'^T k^); o = S'^T q~ + u (k^ . q~); S = S' + k^ u^T
        const float u = be * (vs[t * cb + warp * CW + col] - dec * pk * rk);
        const float out = dec * pq * fq + u * (kq * rk * fq);
        if (lane % LPC == 0) store_from_float(a.o, obase + colw + col, a.in_dtype, out);
        const float ur = u * rk;
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float4 kk = k4[lane % LPC + LPC * m];
          s[m].x = fmaf(dec, s[m].x, kk.x * ur);
          s[m].y = fmaf(dec, s[m].y, kk.y * ur);
          s[m].z = fmaf(dec, s[m].z, kk.z * ur);
          s[m].w = fmaf(dec, s[m].w, kk.w * ur);
        }
      } else {
        // Four value columns per thread, rows rg*M .. rg*M + M-1; reduce over the RG groups.
        const float4* k4 = reinterpret_cast<const float4*>(kt + (lane / CG) * M);
        const float4* q4 = reinterpret_cast<const float4*>(qt + (lane / CG) * M);
        kfirst_token<M, CG, L2>(
            s, [&](int m4) { return k4[m4]; }, [&](int m4) { return q4[m4]; },
            [&](int) {
              return reinterpret_cast<const float4*>(vs + t * cb + warp * CW)[lane % CG];
            },
            [&](int, float4 out) {
              if (lane < CG)
                store4_from_float(a.o, obase + colw + 4 * lane, a.in_dtype, a.vec_o, out);
            },
            be, dec, a.scale, a.eps);
      }
    };
#pragma unroll 1
    for (int t = 0; t < cnt; ++t) {
      if (!((live >> t) & 1u)) {  // masked: state unchanged, o_t = 0
        const std::int64_t obase = orow + (tb + t) * a.o_st;
        if constexpr (VFIRST) {
          if (lane % LPC == 0) store_from_float(a.o, obase + colw + lane / LPC, a.in_dtype, 0.f);
        } else {
          if (lane < CG) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
              store_from_float(a.o, obase + colw + 4 * lane + e, a.in_dtype, 0.f);
          }
        }
        continue;
      }
      if (a.qk_l2norm)
        step(std::true_type{}, t);
      else
        step(std::false_type{}, t);
    }
  }

  if (a.h_out && a.state_bf16) {
    auto* base = reinterpret_cast<std::uint16_t*>(a.h_out) + row * a.hout_s0 + hv * a.hout_s1;
#pragma unroll
    for (int m = 0; m < M; ++m) store4_bf16(base + offset(m, a.hout_s2), s[m], a.vec_out);
  } else if (a.h_out) {
    float* base = a.h_out + row * a.hout_s0 + hv * a.hout_s1;
    if (a.vec_out) {
#pragma unroll
      for (int m = 0; m < M; ++m) store4(base + offset(m, a.hout_s2), s[m], true);
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m) store4(base + offset(m, a.hout_s2), s[m], false);
    }
  }
}

}  // namespace gdr::cuda::detail
