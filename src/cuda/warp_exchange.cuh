// Exchanges of register arrays between the lanes of a warp, by lane bit: a transposing
// reduction (reduce-scatter) and its inverse gather. Used by the decode kernels' token and
// chunk steps (recurrent.cuh, recurrent_wy.cuh).
#pragma once

namespace gdr::cuda::detail {

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

// One round of the inverse: a lane's N values and those of lane ^ OFF become 2N values, the
// lane with bit OFF clear contributing the lower half (x[0 .. N) of the lane without the bit,
// x[N .. 2N) of the lane with it, in both lanes). N shuffles.
template <int N, int OFF>
__device__ __forceinline__ void gather_round(float* x, int lane) {
  const bool upper = lane & OFF;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float mine = x[i], theirs = __shfl_xor_sync(0xffffffffu, mine, OFF);
    x[i] = upper ? theirs : mine;
    x[N + i] = upper ? mine : theirs;
  }
}

}  // namespace gdr::cuda::detail
