// The one-token decode kernel (T = 1, k-first state, 16-byte input rows): the serving step of
// docs/operator.md §2 without the shared-memory staging of recurrent.cuh.
//
// Same register tile and math as recurrent_kernel's k-first step (recurrent.cuh: a warp owns CW
// value columns x all Dk rows, a lane holds M consecutive rows r0 .. r0 + M - 1 of 4 columns):
//   S'    = a * S                   (scalar gate; per-key: S' = diag(a) S)
//   u_j   = beta * (v[j] - S'[:, j] . k^)
//   o[j]  = S'[:, j] . q~ + u_j (k^ . q~)
//   S[:,j] = S'[:, j] + k^ u_j
// With a single token every lane can read the inputs it needs straight from global memory:
// the M-value slices q[r0 ..], k[r0 ..] (and per-key g[r0 ..]) as 16-byte loads, its 4 values
// of v as one 8- or 16-byte load, and the scalars; the lanes of a row group read the same bytes
// (one L1 transaction). There is no shared memory, no barrier and no per-block staging loop,
// whose index arithmetic was most of the instructions of a one-token block (docs/cuda-decode.md,
// v15, v16); the warps of a block are independent. From the second token on, the staging pays
// for itself (v18), so T > 1 stays with recurrent_kernel.
#pragma once

#include "cuda/decode/recurrent.cuh"

namespace gdr::cuda::detail {

// Four consecutive values (8- or 16-byte aligned) as floats.
__device__ __forceinline__ float4 load_four(const char* p, int dtype) {
  if (dtype == kF32) return __ldg(reinterpret_cast<const float4*>(p));
  const uint2 w = __ldg(reinterpret_cast<const uint2*>(p));
  float x[8];
  unit_to_float(make_uint4(w.x, w.y, 0u, 0u), dtype, x);
  return make_float4(x[0], x[1], x[2], x[3]);
}

// M consecutive values of one row (16-byte aligned) as floats: f32 as M / 4 float4 loads,
// f16 / bf16 as M / 8 16-byte units; M = 4 as one load_four.
template <int M>
__device__ __forceinline__ void load_slice(const char* p, int dtype, float* x) {
  if constexpr (M == 4) {  // (the bf16-state tile at Dk = 64)
    const float4 f = load_four(p, dtype);
    x[0] = f.x;
    x[1] = f.y;
    x[2] = f.z;
    x[3] = f.w;
    return;
  }
  if (dtype == kF32) {
#pragma unroll
    for (int i = 0; i < M / 4; ++i) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p) + i);
      x[4 * i] = f.x;
      x[4 * i + 1] = f.y;
      x[4 * i + 2] = f.z;
      x[4 * i + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < M / 8; ++i)
      unit_to_float(__ldg(reinterpret_cast<const uint4*>(p) + i), dtype, x + 8 * i);
  }
}

// A bf16 state row slice of 8 values: loaded as floats (one 16-byte access when `vec`, with the
// evict-first hint or the default policy, as load4), stored rounded to nearest even.
template <bool EVICT_FIRST = true>
__device__ __forceinline__ void load8_bf16(const __nv_bfloat16* p, bool vec, float4& lo,
                                           float4& hi) {
  float x[8];
  if (vec) {
    const auto* u = reinterpret_cast<const uint4*>(p);
    unit_to_float(EVICT_FIRST ? __ldcs(u) : *u, kBF16, x);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __bfloat162float(p[i]);
  }
  lo = make_float4(x[0], x[1], x[2], x[3]);
  hi = make_float4(x[4], x[5], x[6], x[7]);
}
__device__ __forceinline__ void store8_bf16(__nv_bfloat16* p, bool vec, float4 lo, float4 hi) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(lo.x, lo.y), b = __floats2bfloat162_rn(lo.z, lo.w);
  const __nv_bfloat162 c = __floats2bfloat162_rn(hi.x, hi.y), d = __floats2bfloat162_rn(hi.z, hi.w);
  if (vec) {
    __stcs(reinterpret_cast<uint4*>(p), make_uint4(*reinterpret_cast<const std::uint32_t*>(&a),
                                                   *reinterpret_cast<const std::uint32_t*>(&b),
                                                   *reinterpret_cast<const std::uint32_t*>(&c),
                                                   *reinterpret_cast<const std::uint32_t*>(&d)));
  } else {
    reinterpret_cast<__nv_bfloat162*>(p)[0] = a;
    reinterpret_cast<__nv_bfloat162*>(p)[1] = b;
    reinterpret_cast<__nv_bfloat162*>(p)[2] = c;
    reinterpret_cast<__nv_bfloat162*>(p)[3] = d;
  }
}

// BF16STATE: the state pool holds bfloat16 (a.h_in, a.h_out point at it; computed in fp32).
// Its lane tile has 8 columns (one 16-byte row access) and half the rows of the fp32 tile.
template <int DK, bool PERKEY, bool BF16STATE = false>
__global__ void __launch_bounds__(256, 2) recurrent_one_kernel(const RecurrentArgs a) {
  using Tl = Tile<DK, false>;
  constexpr int COLS = BF16STATE ? 8 : 4;      // columns per lane
  constexpr int NV = COLS / 4;                 // float4 per row
  constexpr int CW = Tl::kCW, CG = CW / COLS;  // columns per warp, lanes per row
  constexpr int M = DK * CG / 32;              // rows per lane
  static_assert(M % 8 == 0 || M == 4, "k and q slices are 8- or 16-byte units");

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  wait_for_prior_grids();
  // blockIdx.x = (n * Hv + hv) * splits + split; the grid is < 2^31 blocks (host).
  const unsigned bid = blockIdx.x, rest = bid / static_cast<unsigned>(a.splits);
  const int split = static_cast<int>(bid - rest * static_cast<unsigned>(a.splits));
  const unsigned nq = rest / static_cast<unsigned>(a.Hv);
  const int hv = static_cast<int>(rest - nq * static_cast<unsigned>(a.Hv));
  const std::int64_t n = nq;  // batch row (no varlen on this path), token 0
  const int hk = hv / a.group;
  const int r0 = (lane / CG) * M;                                       // the lane's first key row
  const int c4 = split * nwarps * CW + warp * CW + COLS * (lane % CG);  // its first value column
  const std::int64_t obase = n * a.o_sb + hv * a.o_sh + c4;

  std::int64_t row = n;
  if (a.state_indices) row = load_index(a.state_indices, n, a.idx_dtype);
  // Skipped pool row (negative index): o = 0, state untouched; an index >= P writes NaN to o.
  if (!state_row_live(a, row)) {
    if (lane < CG) {
      const float fill = row < 0 ? 0.f : __int_as_float(0x7fc00000);
#pragma unroll
      for (int h = 0; h < NV; ++h)
        store4_from_float(a.o, obase + 4 * h, a.in_dtype, a.vec_o,
                          make_float4(fill, fill, fill, fill));
    }
    return;
  }

  // State loads first (the long-latency traffic); vector m NV + h = S[r0 + m, c4 + 4h .. + 3].
  float4 s[M * NV];
  if constexpr (BF16STATE) {
    const auto* base = reinterpret_cast<const __nv_bfloat16*>(a.h_in) + row * a.hin_s0 +
                       hv * a.hin_s1 + r0 * a.hin_s2 + c4;
    if (a.vec_in && a.state_ld_normal) {
#pragma unroll
      for (int m = 0; m < M; ++m)
        load8_bf16<false>(base + m * a.hin_s2, true, s[2 * m], s[2 * m + 1]);
    } else if (a.vec_in) {
#pragma unroll
      for (int m = 0; m < M; ++m) load8_bf16(base + m * a.hin_s2, true, s[2 * m], s[2 * m + 1]);
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m) load8_bf16(base + m * a.hin_s2, false, s[2 * m], s[2 * m + 1]);
    }
  } else if (a.h_in) {
    const float* base = a.h_in + row * a.hin_s0 + hv * a.hin_s1 + r0 * a.hin_s2 + c4;
    if (a.vec_in && a.state_ld_normal) {
#pragma unroll
      for (int m = 0; m < M; ++m) s[m] = load4<false>(base + m * a.hin_s2, true);
    } else if (a.vec_in) {
#pragma unroll
      for (int m = 0; m < M; ++m) s[m] = load4(base + m * a.hin_s2, true);
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m) s[m] = load4(base + m * a.hin_s2, false);
    }
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m) s[m] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (a.prefetch_blocks > 0 || a.prefetch_wave > 0)
    prefetch_state_of_block<DK, false>(a, nwarps * CW, BF16STATE ? 2 : 4);

  // A masked token: o = 0 and the state unchanged (stored again only where the output state is
  // another tensor, as gdr::forward's final_state; decode in place has nothing to write).
  const bool masked = a.mask && !__ldg(a.mask + n * a.mask_sb);
  if (masked) {
    if (lane < CG) {
#pragma unroll
      for (int h = 0; h < NV; ++h)
        store4_from_float(a.o, obase + 4 * h, a.in_dtype, a.vec_o, make_float4(0, 0, 0, 0));
    }
    if (a.in_place) return;
  } else {
    // The token's inputs this lane needs.
    const int es = dtype_bytes(a.in_dtype);
    float kk[M], qq[M];
    load_slice<M>(static_cast<const char*>(a.k) + es * (n * a.k_sb + hk * a.k_sh + r0), a.in_dtype,
                  kk);
    load_slice<M>(static_cast<const char*>(a.q) + es * (n * a.q_sb + hk * a.q_sh + r0), a.in_dtype,
                  qq);
    const char* vp = static_cast<const char*>(a.v) + es * (n * a.v_sb + hv * a.v_sh + c4);
    float4 v4[NV];
#pragma unroll
    for (int h = 0; h < NV; ++h) v4[h] = load_four(vp + es * 4 * h, a.in_dtype);
    const char* gp = static_cast<const char*>(a.g) +
                     dtype_bytes(a.g_dtype) * (n * a.g_sb + hv * a.g_sh + (PERKEY ? r0 : 0));
    float be = bytes_as_float(static_cast<const char*>(a.beta) +
                                  dtype_bytes(a.beta_dtype) * (n * a.beta_sb + hv * a.beta_sh),
                              a.beta_dtype);
    if (a.beta_sigmoid) be = 1.f / (1.f + expf(-be));
    // a = exp(g); gate in kernel: g = -exp(A_log) softplus(g + dt_bias).
    const float A = a.gate_in_kernel ? -expf(__ldg(a.A_log + hv)) : 0.f;
    const float* dtb = a.dt_bias ? a.dt_bias + hv * a.dt_bias_sh : nullptr;
    float dec = 1.f;
    if constexpr (PERKEY) {
      float gg[M];
      load_slice<M>(gp, a.g_dtype, gg);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float d = gate_decay(a, A, gg[m], dtb, r0 + m);
#pragma unroll
        for (int h = 0; h < NV; ++h) {
          s[m * NV + h].x *= d;
          s[m * NV + h].y *= d;
          s[m * NV + h].z *= d;
          s[m * NV + h].w *= d;
        }
      }
    } else {
      const float x = bytes_as_float(gp, a.g_dtype);
      dec = gate_decay(a, A, x, dtb, 0);
    }

    auto k_at = [&](int m4) {
      return make_float4(kk[4 * m4], kk[4 * m4 + 1], kk[4 * m4 + 2], kk[4 * m4 + 3]);
    };
    auto q_at = [&](int m4) {
      return make_float4(qq[4 * m4], qq[4 * m4 + 1], qq[4 * m4 + 2], qq[4 * m4 + 3]);
    };
    auto update = [&](auto l2_tag) {
      constexpr bool L2 = decltype(l2_tag)::value;
      if constexpr (BF16STATE) {  // one column per call (kfirst_token, COLS = 8)
        const float vv[8] = {v4[0].x, v4[0].y, v4[0].z, v4[0].w,
                             v4[1].x, v4[1].y, v4[1].z, v4[1].w};
        kfirst_token<M, CG, L2, COLS>(
            s, k_at, q_at,
            [&](int c) {
              float x = vv[0];
#pragma unroll
              for (int i = 1; i < 8; ++i) x = c == i ? vv[i] : x;
              return x;
            },
            [&](int c, float out) { store_from_float(a.o, obase + c, a.in_dtype, out); }, be, dec,
            a.scale, a.eps);
      } else {
        kfirst_token<M, CG, L2, COLS>(
            s, k_at, q_at, [&](int h) { return v4[h]; },
            [&](int h, float4 out) {
              if (lane < CG) store4_from_float(a.o, obase + 4 * h, a.in_dtype, a.vec_o, out);
            },
            be, dec, a.scale, a.eps);
      }
    };
    if (a.qk_l2norm)
      update(std::true_type{});
    else
      update(std::false_type{});
  }

  if constexpr (BF16STATE) {
    auto* base = reinterpret_cast<__nv_bfloat16*>(a.h_out) + row * a.hout_s0 + hv * a.hout_s1 +
                 r0 * a.hout_s2 + c4;
    if (a.vec_out) {
#pragma unroll
      for (int m = 0; m < M; ++m) store8_bf16(base + m * a.hout_s2, true, s[2 * m], s[2 * m + 1]);
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m) store8_bf16(base + m * a.hout_s2, false, s[2 * m], s[2 * m + 1]);
    }
  } else if (a.h_out) {
    float* base = a.h_out + row * a.hout_s0 + hv * a.hout_s1 + r0 * a.hout_s2 + c4;
    if (a.vec_out) {
#pragma unroll
      for (int m = 0; m < M; ++m) store4(base + m * a.hout_s2, s[m], true);
    } else {
#pragma unroll
      for (int m = 0; m < M; ++m) store4(base + m * a.hout_s2, s[m], false);
    }
  }
}

}  // namespace gdr::cuda::detail
