// Host side of the CUDA recurrent kernel (recurrent.cuh): gdr::cuda::decode (state pool
// updated in place) and gdr::cuda::recurrent_forward (h0 -> final_state, any T, varlen).
// Instantiated for Dk in {64, 128, 256}, both state layouts and both gate kinds (12 kernels),
// the narrow k-first tile at Dk 64 and 128 (4 kernels), plus the one-token kernel
// (recurrent_one.cuh: k-first, both gate kinds, an fp32 or a bf16 state pool, 12 kernels) and the
// chunk kernel (recurrent_chunk.cuh: k-first fp32 or bf16 state, Dk = 128, scalar gate; items of
// 32, 64 or 128 value columns x three token dtypes x {static items with the first state wait early
// or late, dynamic items} x two state dtypes, 54 kernels); Dv (64, 128, 256), dtypes (but the
// chunk kernel's) and the fused options are run-time values (read in the per-chunk staging code
// only); and the ring kernel (recurrent_ring.cuh: 1 to 8 tokens, k-first fp32 state, Dk = 128,
// Dv a multiple of 128, scalar gate; three token dtypes); and the slice kernel
// (recurrent_slice.cuh: 1 to 8 tokens of 16-bit inputs for few sequences, k-first fp32 state, Dk =
// 128, scalar gate; two token dtypes).
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled (the ring kernel's tensor maps)
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cuda/paths.h"
#include "cuda/recurrent.cuh"
#include "cuda/recurrent_chunk.cuh"
#include "cuda/recurrent_one.cuh"
#include "cuda/recurrent_ring.cuh"
#include "cuda/recurrent_slice.cuh"
#include "cuda/tuning.h"
#include "gdr/error.h"

namespace gdr::cuda {
namespace {

using detail::RecurrentArgs;

std::atomic<int> g_warps_override{0};
std::atomic<int> g_path_override{0};
std::atomic<int> g_prefetch_override{0};
std::atomic<int> g_load_override{0};
std::atomic<int> g_chunk_columns_override{0};
std::atomic<int> g_chunk_first_override{0};
std::atomic<int> g_chunk_schedule_override{0};
std::atomic<int> g_chunk_blocks_override{0};
std::atomic<int> g_pdl_override{0};
std::atomic<int> g_ring_math_override{0};
std::atomic<int> g_ring_schedule_override{0};

// Launches kernel(args...) on `grid` blocks; with `pdl`, as a programmatic dependent launch
// (sm_90: the kernel may start while the previous kernel in the stream drains and waits for it in
// wait_for_prior_grids before any global memory access).
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), unsigned grid, unsigned threads, std::size_t smem,
                   cudaStream_t stream, bool pdl, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, args...);  // errors: cudaGetLastError after the launch
}

// Programmatic dependent launches: the rule is on (docs/cuda-decode.md, v40: up to 0.3 us less
// per call at B = 1, the same elsewhere); the override 1 turns them off, 2 on.
bool pdl_wanted() {
  return g_pdl_override.load(std::memory_order_relaxed) != 1;
}

// The launch rule at the benchmarked shapes (Hv = 32, Dk = Dv = 128, k-first, 132 SMs).
static_assert(recurrent_warps_per_block(32, 1, 128, 128, false, 132) == 1);        // B = 1
static_assert(recurrent_warps_per_block(32 * 8, 1, 128, 128, false, 132) == 4);    // B = 8
static_assert(recurrent_warps_per_block(32, 2, 128, 128, false, 132, true) == 4);  // B = 1, T = 2
static_assert(recurrent_warps_per_block(32 * 8, 8, 128, 128, false, 132) == 4);    // B = 8, T = 8
static_assert(recurrent_warps_per_block(32 * 32, 8, 128, 128, false, 132) == 8);   // B = 32, T = 8
// The ring kernel (T = 1) at 3 to 8 items per SM: B = 16..32 yes, B = 12 and 40 no.
static_assert(recurrent_ring_preferred(1, 32 * 16, 128, true, false, 132) &&
              recurrent_ring_preferred(1, 32 * 32, 128, true, false, 132));
static_assert(!recurrent_ring_preferred(1, 32 * 12, 128, true, false, 132) &&
              !recurrent_ring_preferred(1, 32 * 40, 128, true, false, 132) &&
              !recurrent_ring_preferred(1, 32 * 32, 128, false, false, 132));
// recurrent_ring_applies's bound (48 bytes per key: T x (3 input bytes + 4 per-key)) is what the
// slot's token area holds, and the per-key bound is the kernel's kRingMaxKeyTokens.
static_assert(detail::RingLayout::kTokBytes == 48 * detail::RingLayout::kCB &&
              recurrent_ring_applies(8, 2, false, false, false, 128, 128, false, true, true) &&
              !recurrent_ring_applies(5, 4, false, false, false, 128, 128, false, true, true) &&
              recurrent_ring_applies(detail::kRingMaxKeyTokens, 2, false, false, true, 128, 128,
                                     false, true, true) &&
              !recurrent_ring_applies(detail::kRingMaxKeyTokens + 1, 2, false, false, true, 128,
                                      128, false, true, true) &&
              recurrent_ring_applies(3, 4, false, false, true, 128, 128, false, true, true) &&
              !recurrent_ring_applies(4, 4, false, false, true, 128, 128, false, true, true));
// With 2 to 5 tokens from B = 9 (2.2 items per SM) on, with 6 from B = 13, never with 7 or 8.
static_assert(recurrent_ring_preferred(2, 32 * 9, 128, true, false, 132) &&
              recurrent_ring_preferred(5, 32 * 256, 128, true, false, 132) &&
              !recurrent_ring_preferred(4, 32 * 8, 128, true, false, 132) &&
              recurrent_ring_preferred(6, 32 * 13, 128, true, false, 132) &&
              !recurrent_ring_preferred(6, 32 * 12, 128, true, false, 132) &&
              !recurrent_ring_preferred(7, 32 * 32, 128, true, false, 132) &&
              !recurrent_ring_preferred(8, 32 * 32, 128, true, false, 132));
// T = 6 to 8 with the chunk consumers (16-bit inputs, scalar gate) from 2.5 items per SM: B = 12
// and 32 yes, B = 8 no; T = 7 and 8 never with f32 inputs or a per-key gate (no chunk consumers
// there).
// The ring kernel's dynamic items (H200, Hv = 32): static at B = 16, the last round at B = 32 with
// the chunk consumers, from the start's last slot on from B = 64 (its rounds before are looked up
// together: at least kRingSlots static rounds).
static_assert(recurrent_ring_dynamic_round(16 * 32, 132, true) == 0 &&
              recurrent_ring_dynamic_round(32 * 32, 132, true) == 7 &&
              recurrent_ring_dynamic_round(32 * 32, 132, false) == 0 &&
              recurrent_ring_dynamic_round(64 * 32, 132, true) == detail::kRingSlots &&
              recurrent_ring_dynamic_round(128 * 32, 132, false) == detail::kRingSlots);
static_assert(recurrent_ring_chunk_math(8, 2, false) && recurrent_ring_chunk_math(6, 2, false) &&
              !recurrent_ring_chunk_math(5, 2, false) && !recurrent_ring_chunk_math(8, 4, false) &&
              !recurrent_ring_chunk_math(8, 2, true));
static_assert(recurrent_ring_preferred(8, 32 * 32, 128, true, false, 132, true) &&
              recurrent_ring_preferred(7, 32 * 256, 128, true, false, 132, true) &&
              recurrent_ring_preferred(8, 32 * 12, 128, true, false, 132, true) &&
              recurrent_ring_preferred(6, 32 * 12, 128, true, false, 132, true) &&
              !recurrent_ring_preferred(8, 32 * 8, 128, true, false, 132, true) &&
              !recurrent_ring_preferred(6, 32 * 8, 128, true, false, 132, true) &&
              !recurrent_ring_preferred(8, 32 * 32, 128, true, false, 132, false) &&
              !recurrent_ring_preferred(8, 32 * 32, 128, false, false, 132, true));
// A per-key gate: T = 1 at 3 to 16 items per SM (B = 13..66), T = 2..4 from B = 7.
static_assert(recurrent_ring_preferred(1, 32 * 64, 128, true, true, 132) &&
              !recurrent_ring_preferred(1, 32 * 67, 128, true, true, 132) &&
              recurrent_ring_preferred(2, 32 * 7, 128, true, true, 132) &&
              !recurrent_ring_preferred(4, 32 * 6, 128, true, true, 132));
// The slice kernel from 2 tokens at B = 1 and 2 (128 and 256 blocks), from 4 tokens at B = 4 (512
// blocks), not at B = 8 or T = 1.
static_assert(recurrent_slice_preferred(2, 32, 128, 132) &&
              recurrent_slice_preferred(2, 32 * 2, 128, 132) &&
              !recurrent_slice_preferred(2, 32 * 4, 128, 132) &&
              recurrent_slice_preferred(4, 32 * 4, 128, 132) &&
              recurrent_slice_preferred(8, 32 * 4, 128, 132) &&
              !recurrent_slice_preferred(8, 32 * 8, 128, 132) &&
              !recurrent_slice_preferred(1, 32, 128, 132));
static_assert(recurrent_slice_applies(8, 2, false, false, false, 128, false, true) &&
              !recurrent_slice_applies(9, 2, false, false, false, 128, false, true) &&
              !recurrent_slice_applies(8, 4, false, false, false, 128, false, true) &&
              !recurrent_slice_applies(8, 2, false, false, true, 128, false, true));
static_assert(recurrent_one_warps_per_block(32 * 8, 128, 128, 132) == 1);    // B = 8
static_assert(recurrent_one_warps_per_block(32 * 32, 128, 128, 132) == 2);   // B = 32
static_assert(recurrent_one_warps_per_block(32 * 128, 128, 128, 132) == 4);  // B = 128
// The narrow tile below two warps per SM: B = 1 (256 warps) yes, B = 2 (512) no.
static_assert(recurrent_narrow_applies(32, 128, 128, false, 132));
static_assert(!recurrent_narrow_applies(32 * 2, 128, 128, false, 132));
static_assert(recurrent_warps_per_block(32, 8, 128, 128, false, 132, true) == 4);  // B = 1, T = 8
// Prefetch half a wave ahead: one-token B = 32 (4096 blocks, 1056 resident) yes, B = 8 no;
// staged T = 8 at B = 32 (1024 blocks, 264 resident) no, B = 64 yes.
static_assert(recurrent_prefetch_blocks(4096, 1056, true) == 528);
static_assert(recurrent_prefetch_blocks(2048, 2112, true) == 0);
static_assert(recurrent_prefetch_blocks(1024, 264, false) == 0);
static_assert(recurrent_prefetch_blocks(2048, 264, false) == 132);
// The first wave one wave ahead: one-token B = 16 (4096 blocks of one warp, 2112 resident) yes,
// B = 8 (one wave) and B = 32 (4096 blocks, 1056 resident) no.
static_assert(recurrent_prefetch_wave(4096, 2112, true) == 2112);
static_assert(recurrent_prefetch_wave(2048, 2112, true) == 0);
static_assert(recurrent_prefetch_wave(4096, 1056, true) == 0);
// The default load policy from 4 waves (fp32 pool): one-token B = 48 (6144 blocks, 1056
// resident) yes, B = 32 (4096 blocks) no; from 8 waves (bf16 pool): B = 64 (8192 blocks) no,
// B = 128 (8192 blocks, 528 resident) yes.
static_assert(recurrent_one_loads_normal(6144, 1056, false));
static_assert(!recurrent_one_loads_normal(4096, 1056, false));
static_assert(!recurrent_one_loads_normal(8192, 1056, true));
static_assert(recurrent_one_loads_normal(8192, 528, true));
// The chunk kernel at T = 8 from B = 2 (64 heads), at T = 16 from B = 4, not at T = 4.
static_assert(recurrent_chunk_preferred(8, false, 32 * 2, 132));
static_assert(!recurrent_chunk_preferred(8, false, 32, 132));
static_assert(recurrent_chunk_preferred(16, false, 32 * 4, 132));
static_assert(!recurrent_chunk_preferred(16, false, 32 * 2, 132));
static_assert(recurrent_chunk_preferred(32, false, 32 * 32, 132));
static_assert(recurrent_chunk_preferred(4, false, 32 * 2, 132) &&
              !recurrent_chunk_preferred(4, false, 32, 132) &&
              !recurrent_chunk_preferred(3, false, 32 * 32, 132));
// A bf16 pool: the chunk kernel from 3 tokens at B >= 2 (Hv = 32), 2 tokens from B = 7, at B = 1
// for 6 to 8 tokens.
static_assert(recurrent_chunk_preferred_bf16(3, false, 32 * 2, 132) &&
              recurrent_chunk_preferred_bf16(2, false, 32 * 8, 132) &&
              !recurrent_chunk_preferred_bf16(2, false, 32 * 4, 132) &&
              !recurrent_chunk_preferred_bf16(1, false, 32 * 32, 132) &&
              !recurrent_chunk_preferred_bf16(8, true, 32 * 32, 132));
static_assert(recurrent_chunk_preferred_bf16(16, false, 32 * 2, 132) &&
              recurrent_chunk_preferred_bf16(8, false, 32, 132) &&
              !recurrent_chunk_preferred_bf16(5, false, 32, 132) &&
              !recurrent_chunk_preferred_bf16(12, false, 32, 132));
// Its items: 128 columns at B = 8, 16, 32, 256 (waves >= 90 % full or >= 4), 64 at B = 2, 6, 12.
static_assert(recurrent_chunk_columns(32 * 8, 128, 132) == 128);
static_assert(recurrent_chunk_columns(32 * 16, 128, 132) == 128);
static_assert(recurrent_chunk_columns(32 * 32, 128, 132) == 128);
static_assert(recurrent_chunk_columns(32 * 256, 128, 132) == 128);
static_assert(recurrent_chunk_columns(32 * 2, 128, 132) == 64);
static_assert(recurrent_chunk_columns(32 * 6, 128, 132) == 64);
static_assert(recurrent_chunk_columns(32 * 12, 128, 132) == 64);
static_assert(recurrent_chunk_columns(32 * 4, 64, 132) == 64);
// The first state wait late up to 8 items per block or beyond 8 tokens: T = 8 B = 64 (2048 items
// on 264 blocks) yes, B = 128 no; T = 16 always.
static_assert(recurrent_chunk_first_late(32 * 64, 264, 8));
static_assert(!recurrent_chunk_first_late(32 * 128, 264, 8));
static_assert(recurrent_chunk_first_late(32 * 256, 264, 16));
// Dynamic items beyond 6 per block (8 with a bf16 pool), one chunk each: T = 8 B = 64 (2048 items
// on 264 blocks) yes with an fp32 pool and no with a bf16 one, B = 80 and 128 yes, B = 32 no,
// T = 16 B = 128 no.
static_assert(recurrent_chunk_dynamic(32 * 64, 264, 8, false));
static_assert(!recurrent_chunk_dynamic(32 * 64, 264, 8, true));
static_assert(recurrent_chunk_dynamic(32 * 80, 264, 8, true));
static_assert(recurrent_chunk_dynamic(32 * 128, 264, 8, true));
static_assert(!recurrent_chunk_dynamic(32 * 32, 264, 8, false));
static_assert(!recurrent_chunk_dynamic(32 * 128, 264, 16, false));

void check(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess)
    throw RuntimeFailure(std::string(op) + ": " + what + " failed: " + cudaGetErrorString(err));
}

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw InvalidArgument(std::string(op) + ": " + what);
}

// Runs the call on the tensors' device and restores the caller's current device.
class DeviceGuard {
 public:
  DeviceGuard(int device, const char* op) {
    check(cudaGetDevice(&prev_), op, "cudaGetDevice");
    if (prev_ != device) check(cudaSetDevice(device), op, "cudaSetDevice");
    device_ = device;
  }
  ~DeviceGuard() {
    if (prev_ != device_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0, device_ = 0;
};

int sm_count(int device, const char* op) {
  static std::atomic<int> cache[64] = {};
  if (device >= 0 && device < 64) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), op,
        "cudaDeviceGetAttribute(multiProcessorCount)");
  if (device >= 0 && device < 64) cache[device].store(count, std::memory_order_relaxed);
  return count;
}

void check_dim(const char* op, const char* name, std::int64_t value) {
  if (value != 64 && value != 128 && value != 256)
    refuse(op, std::string(name) + " is " + std::to_string(value) +
                   "; the CUDA recurrent kernel supports 64, 128, 256");
}

void check_float_dtype(const char* op, const char* name, const TensorView& t, bool f32_only) {
  if (!t.defined()) return;
  const bool ok =
      t.dtype == DType::f32 || (!f32_only && (t.dtype == DType::f16 || t.dtype == DType::bf16));
  if (!ok)
    refuse(op, std::string(name) + " has dtype " + std::string(to_string(t.dtype)) +
                   (f32_only ? "; on cuda it must be float32"
                             : "; on cuda supported: float32, float16, bfloat16"));
}

// Rows of `t` (every dim but the last) start on 16-byte boundaries.
bool rows16(const TensorView& t) {
  if (!t.defined()) return false;
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) return false;
  const int es = dtype_size(t.dtype);
  for (int d = 0; d + 1 < t.rank; ++d)
    if ((t.stride[d] * es) % 16 != 0) return false;
  return true;
}

// 16-byte state accesses need a 16-byte aligned base and row strides of whole 16-byte units
// (4 f32 or 8 bf16 elements).
bool vectorizable(const TensorView& t) {
  if (!t.defined()) return false;
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  const std::int64_t unit = 16 / dtype_size(t.dtype);
  return addr % 16 == 0 && t.stride[0] % unit == 0 && t.stride[1] % unit == 0 &&
         t.stride[2] % unit == 0;
}

template <typename F>
void with_dim(std::int64_t d, F&& f) {
  switch (d) {
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    case 256: f(std::integral_constant<int, 256>{}); return;
  }
  throw InvalidArgument("gdr cuda: head dim " + std::to_string(d) + " has no kernel");
}

template <typename F>
void with_bool(bool x, F&& f) {
  if (x)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// Fills the token-input half of the arguments (shared by decode and forward).
void set_token_inputs(RecurrentArgs& a, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& g, const TensorView& beta,
                      const TensorView& mask, const TensorView& o, const TensorView& A_log,
                      const TensorView& dt_bias, const Options& opts, const Problem& prob) {
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.g = g.data;
  a.beta = beta.data;
  a.o = o.data;
  a.q_sb = q.stride[0], a.q_st = q.stride[1], a.q_sh = q.stride[2];
  a.k_sb = k.stride[0], a.k_st = k.stride[1], a.k_sh = k.stride[2];
  a.v_sb = v.stride[0], a.v_st = v.stride[1], a.v_sh = v.stride[2];
  a.o_sb = o.stride[0], a.o_st = o.stride[1], a.o_sh = o.stride[2];
  a.g_sb = g.stride[0], a.g_st = g.stride[1], a.g_sh = g.stride[2];
  a.beta_sb = beta.stride[0], a.beta_st = beta.stride[1], a.beta_sh = beta.stride[2];
  if (mask.defined()) {
    a.mask = static_cast<const std::uint8_t*>(mask.data);
    a.mask_sb = mask.stride[0], a.mask_st = mask.stride[1];
  }
  a.gate_in_kernel = opts.gate_in_kernel;
  if (opts.gate_in_kernel) {
    a.A_log = static_cast<const float*>(A_log.data);
    if (dt_bias.defined()) {
      a.dt_bias = static_cast<const float*>(dt_bias.data);
      a.dt_bias_sh = dt_bias.stride[0];
    }
  }
  a.beta_sigmoid = opts.beta_sigmoid;
  a.qk_l2norm = opts.qk_l2norm;
  a.eps = opts.l2norm_eps;
  a.scale = prob.scale != 0.f
                ? prob.scale
                : (opts.scale != 0.f ? opts.scale : 1.0f / std::sqrt(static_cast<float>(prob.Dk)));
  a.in_dtype = static_cast<int>(prob.dtype);
  a.g_dtype = static_cast<int>(g.dtype);
  a.beta_dtype = static_cast<int>(beta.dtype);
  a.Hv = static_cast<int>(prob.Hv);
  a.group = static_cast<int>(prob.Hv / prob.Hk);
  // 16-byte staging units (launch() also needs the block's v columns to be whole units).
  a.vec_tok = rows16(q) && rows16(k) && rows16(v) && (prob.gate == GateKind::scalar || rows16(g));
  a.vec_o = rows16(o);
}

void check_common(const char* op, const Problem& prob, const TensorView& q, const TensorView& g,
                  const TensorView& beta, const TensorView& A_log, const TensorView& dt_bias,
                  const TensorView& mask, const Options& opts) {
  check_dim(op, "Dk", prob.Dk);
  check_dim(op, "Dv", prob.Dv);
  check_float_dtype(op, "q", q, false);
  check_float_dtype(op, "g", g, false);
  check_float_dtype(op, "beta", beta, false);
  if (opts.gate_in_kernel) {
    if (!A_log.defined()) refuse(op, "gate_in_kernel needs A_log [Hv]");
    check_float_dtype(op, "A_log", A_log, true);
    check_float_dtype(op, "dt_bias", dt_bias, true);
  }
  if (mask.defined() && mask.dtype != DType::boolean)
    refuse(op, "mask has dtype " + std::string(to_string(mask.dtype)) + "; must be bool");
  if (prob.Hv > INT_MAX / 2) refuse(op, "Hv is " + std::to_string(prob.Hv) + "; too large");
}

// Blocks of `kernel` resident at once on the device (one wave), for `threads` per block and
// `smem` bytes of dynamic shared memory; asked once per (kernel, device, block shape).
std::int64_t resident_blocks(const void* kernel, int threads, std::size_t smem, int device, int sms,
                             const char* op) {
  using Key = std::tuple<const void*, int, std::size_t, int>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{kernel, threads, smem, device};
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = cache.find(key);
    if (it != cache.end()) return static_cast<std::int64_t>(it->second) * sms;
  }
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem), op,
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, per_sm);
  return static_cast<std::int64_t>(per_sm) * sms;
}

// gdr's own stream-ordered memory pool on `device` (created once, never released: it keeps its
// reserve however often the process synchronizes, unlike the default pool with its release
// threshold of 0, and leaves the default pool's settings to the caller), or null where the device
// has no memory pools.
cudaMemPool_t small_pool(int device) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = pools.find(device);
  if (it != pools.end()) return it->second;
  cudaMemPool_t pool = nullptr;
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess &&
      supported) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    if (cudaMemPoolCreate(&pool, &props) == cudaSuccess) {
      std::uint64_t keep = UINT64_MAX;
      (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    } else {
      pool = nullptr;
    }
  }
  (void)cudaGetLastError();  // a refused query or creation: no pool (callers fall back)
  pools.emplace(device, pool);
  return pool;
}

// `words` zeroed unsigned words from gdr's pool on `stream` (exclusive to the call, also as nodes
// of a captured graph: an allocation and a memset; the caller frees them on the stream after its
// kernel); null when the device has no stream-ordered memory.
unsigned* pooled_zero_words(int device, std::size_t words, cudaStream_t stream, const char* op) {
  const cudaMemPool_t pool = small_pool(device);
  unsigned* p = nullptr;
  if (!pool || cudaMallocFromPoolAsync(reinterpret_cast<void**>(&p), words * sizeof(unsigned), pool,
                                       stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  check(cudaMemsetAsync(p, 0, words * sizeof(unsigned), stream), op, "cudaMemsetAsync");
  return p;
}

// The counter pairs of the ring and chunk kernels' dynamic items (recurrent.cuh,
// release_item_counter; recurrent_ring.cuh ring_next_item, recurrent_chunk.cuh DYNAMIC): a
// launch needs a pair of its own, zero at its start, and its last block leaves it zero. A launch
// captured into a graph keeps a pair of a per-device arena for good: a graph's node never runs
// beside itself, and each run leaves the pair zero for the next (two instances of one graph run
// at once on two streams would share their pairs; torch and the serving engines instantiate a
// captured graph once). The arena is made and zeroed (the host waits for it) by the first eager
// launch on the device that wants dynamic items. The others (eager launches, captures before the
// arena exists or once it is used up) take 8 bytes from gdr's pool on the stream, zeroed by a
// memset before the kernel and freed after it.
constexpr std::int64_t kArenaPairs = 16384;

// A pair of the device's arena for a launch being captured on `stream` (null: none), or (not
// capturing) null, the arena made first if it is not yet.
unsigned* arena_counter_pair(int device, cudaStream_t stream, bool capturing) {
  struct Arena {
    unsigned* pairs = nullptr;
    std::int64_t used = 0;
    bool tried = false;
  };
  static std::mutex mutex;
  static std::map<int, Arena> arenas;
  std::lock_guard<std::mutex> lock(mutex);
  Arena& arena = arenas[device];
  if (capturing) {
    if (!arena.pairs || arena.used == kArenaPairs) return nullptr;
    return arena.pairs + 2 * arena.used++;
  }
  if (!arena.tried) {
    arena.tried = true;
    unsigned* pairs = nullptr;
    const std::size_t bytes = 2 * sizeof(unsigned) * kArenaPairs;
    if (cudaMalloc(reinterpret_cast<void**>(&pairs), bytes) == cudaSuccess) {
      if (cudaMemsetAsync(pairs, 0, bytes, stream) == cudaSuccess &&
          cudaStreamSynchronize(stream) == cudaSuccess)
        arena.pairs = pairs;
      else
        cudaFree(pairs);
    }
    (void)cudaGetLastError();  // no arena: captures take pool pairs
  }
  return nullptr;
}

// The counter pair of a launch with dynamic items on `stream`: an arena pair (capturing), else
// 8 bytes of the pool zeroed on the stream (*pooled: free it after the launch); null: none to be
// had (static items).
unsigned* dynamic_counter_pair(int device, cudaStream_t stream, bool* pooled, const char* op) {
  *pooled = false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  const bool capturing = status != cudaStreamCaptureStatusNone;
  if (unsigned* pair = arena_counter_pair(device, stream, capturing)) return pair;
  unsigned* pair = pooled_zero_words(device, 2, stream, op);
  *pooled = pair != nullptr;
  return pair;
}

// RecurrentArgs::prefetch_blocks and prefetch_wave by the rules (tuning.h) or the override; only
// 16-byte state rows.
void set_prefetch(RecurrentArgs& a, std::int64_t blocks, std::int64_t resident, bool one_token) {
  const int mode = g_prefetch_override.load(std::memory_order_relaxed);
  std::int64_t ahead = recurrent_prefetch_blocks(blocks, resident, one_token);
  std::int64_t wave = recurrent_prefetch_wave(blocks, resident, one_token);
  if (mode == 2) {  // block 0 through the first-wave distance, the others through the other
    ahead = wave = 1;
  } else if (mode == 3 && blocks > resident && resident >= 2) {
    ahead = resident / 2;
    wave = resident;
  }
  if (mode == 1 || !a.vec_in || ahead > INT_MAX || wave > INT_MAX) ahead = wave = 0;
  a.prefetch_blocks = static_cast<int>(ahead);
  a.prefetch_wave = static_cast<int>(wave);
}

// RecurrentArgs::state_ld_normal by the rule (tuning.h) or the override; the one-token kernel only.
void set_load_policy(RecurrentArgs& a, std::int64_t blocks, std::int64_t resident, bool one_token) {
  const int mode = g_load_override.load(std::memory_order_relaxed);
  a.state_ld_normal =
      one_token &&
      (mode == 2 || (mode == 0 && recurrent_one_loads_normal(blocks, resident, a.state_bf16)));
}

// Blocks of a grid of `heads` x `splits` (sequences x value heads, blocks per head), with
// RecurrentArgs::splits set; refused when beyond one launch's grid.
std::int64_t grid_blocks(RecurrentArgs& a, std::int64_t heads, std::int64_t splits,
                         const char* op) {
  const std::int64_t blocks = heads * splits;
  if (blocks > INT_MAX)
    refuse(op,
           "N * Hv is " + std::to_string(heads) + "; too many sequences x heads for one launch");
  a.splits = static_cast<int>(splits);
  return blocks;
}

// Allows `kernel` `smem` bytes of dynamic shared memory (above the default 48 KB) on `device`,
// once per (kernel, device).
void allow_shared(const void* kernel, std::size_t smem, int device, const char* op) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, std::size_t> done;
  std::lock_guard<std::mutex> lock(mutex);
  auto& have = done[{kernel, device}];
  if (have >= smem) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        op, "cudaFuncSetAttribute(maxDynamicSharedMemorySize)");
  have = smem;
}

// The grid of a persistent kernel (chunk, ring): one block per item up to the resident blocks (or
// the tests' cap, set_recurrent_chunk_blocks_override).
std::int64_t persistent_grid(std::int64_t items, std::int64_t resident) {
  std::int64_t blocks = items < resident ? items : resident;
  const int cap = g_chunk_blocks_override.load(std::memory_order_relaxed);
  if (cap > 0 && cap < blocks) blocks = cap;
  return blocks;
}

// The chunk kernel (recurrent_chunk.cuh): persistent blocks of 8, 4 or 2 warps on items of 128,
// 64 or 32 value columns, as many blocks as are resident.
void launch_chunk(RecurrentArgs& a, const Problem& prob, int sms, const char* op,
                  cudaStream_t stream) {
  const std::int64_t heads = a.N * prob.Hv;
  const int forced = g_chunk_columns_override.load(std::memory_order_relaxed);
  const int cols = forced == 32 || forced == 64 || (forced == 128 && prob.Dv % 128 == 0)
                       ? forced
                       : recurrent_chunk_columns(heads, prob.Dv, sms);
  const std::int64_t items = grid_blocks(a, heads, prob.Dv / cols, op);
  if (items == 0) return;
  // 16-bit inputs are exact in tf32: no shared lo parts.
  const bool x_exact = prob.dtype != DType::f32;
  a.prefetch_blocks = a.prefetch_wave = 0;  // the kernel copies its next item itself
  // The grid: the resident blocks (the same for every instantiation of one W: same registers and
  // shared memory), at most one per item (or the tests' cap); the schedule and the first-state
  // wait by the rules on that grid, or the overrides.
  auto by_first = [&](auto w, auto dt, auto layout, auto sb) {
    constexpr int W = decltype(w)::value, DT = decltype(dt)::value;
    constexpr bool SB = decltype(sb)::value;
    using Ly = decltype(layout);
    constexpr int threads = 2 * Ly::kCB;
    const std::size_t smem = Ly::bytes(x_exact, dtype_size(prob.dtype));
    const void* early =
        reinterpret_cast<const void*>(detail::recurrent_chunk_kernel<W, DT, false, false, SB>);
    allow_shared(early, smem, prob.device_index, op);
    const std::int64_t resident = resident_blocks(early, threads, smem, prob.device_index, sms, op);
    if (resident <= 0) refuse(op, "the chunk kernel does not fit on this device");
    const std::int64_t blocks = persistent_grid(items, resident);
    const int sched = g_chunk_schedule_override.load(std::memory_order_relaxed);
    bool dynamic = sched == 2 || (sched == 0 && recurrent_chunk_dynamic(items, blocks, a.T, SB));
    // The dynamic schedule's counter pair (dynamic_counter_pair: captured launches keep an arena
    // pair, the others a pooled pair zeroed on the stream); none to be had: the static schedule.
    bool pooled = false;
    unsigned* counter =
        dynamic ? dynamic_counter_pair(prob.device_index, stream, &pooled, op) : nullptr;
    dynamic = counter != nullptr;
    a.item_counter = counter;
    const int mode = g_chunk_first_override.load(std::memory_order_relaxed);
    const bool late = mode == 1 || (mode == 0 && recurrent_chunk_first_late(items, blocks, a.T));
    const dim3 grid(static_cast<unsigned>(blocks));
    auto launch = [&](auto kernel) {  // its shared memory allowed once per device (cached)
      allow_shared(reinterpret_cast<const void*>(kernel), smem, prob.device_index, op);
      // A pool pair's memset lies between this launch and the grid before it: a plain launch.
      launch_kernel(kernel, grid.x, threads, smem, stream, pdl_wanted() && !pooled, a);
    };
    if (dynamic)
      launch(detail::recurrent_chunk_kernel<W, DT, true, true, SB>);
    else if (late)
      launch(detail::recurrent_chunk_kernel<W, DT, true, false, SB>);
    else
      launch(detail::recurrent_chunk_kernel<W, DT, false, false, SB>);
    if (pooled) check(cudaFreeAsync(counter, stream), op, "cudaFreeAsync");
    a.item_counter = nullptr;
  };
  auto by_columns = [&](auto dt) {
    with_bool(a.state_bf16, [&](auto sb) {
      if (cols == 128)
        by_first(std::integral_constant<int, 8>{}, dt, detail::ChunkLayout<8>{}, sb);
      else if (cols == 64)
        by_first(std::integral_constant<int, 4>{}, dt, detail::ChunkLayout<4>{}, sb);
      else
        by_first(std::integral_constant<int, 2>{}, dt, detail::ChunkLayout<2>{}, sb);
    });
  };
  if (prob.dtype == DType::bf16)
    by_columns(std::integral_constant<int, detail::kBF16>{});
  else if (prob.dtype == DType::f16)
    by_columns(std::integral_constant<int, detail::kF16>{});
  else
    by_columns(std::integral_constant<int, detail::kF32>{});
  check(cudaGetLastError(), op, "chunk kernel launch");
}

// The ring kernel's items are contiguous (one bulk copy each way, as the kernel tests it): state
// rows of exactly one item's columns, read and (if any) written.
bool ring_items_contiguous(const RecurrentArgs& a) {
  constexpr int cb = detail::RingLayout::kCB;
  return a.hin_s2 == cb && (!a.h_out || a.hout_s2 == cb);
}

// The ring kernel's consumers take the tokens as one chunk on the tensor cores (16-bit inputs,
// scalar gate) by the rule or the override, else token by token: what launch decides for both its
// preference and launch_ring (which also needs the state's tensor maps: ring_maps).
bool ring_chunk_math(const RecurrentArgs& a, const Problem& prob) {
  const bool per_key = prob.gate == GateKind::per_key;
  const int math = g_ring_math_override.load(std::memory_order_relaxed);
  return prob.dtype != DType::f32 && !per_key &&
         (math == 2 ||
          (math == 0 && recurrent_ring_chunk_math(a.T, dtype_size(prob.dtype), per_key)));
}

// The driver's tensor-map encoder, through the runtime (no link against libcuda); null where the
// driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// A tensor map's byte strides (dims[1..n], element strides of es bytes, from the innermost up;
// `extent`: the bytes that dims[0] spans): false where one is not positive, not a multiple of 16
// or from 2^40 bytes. A dimension of one element takes the dense stride (its own is never used).
bool map_byte_strides(const cuuint64_t* dims, const std::int64_t* element_strides, int n, int es,
                      std::int64_t extent, cuuint64_t* strides) {
  for (int i = 0; i < n; ++i) {
    const std::int64_t bytes = dims[i + 1] == 1 ? (extent + 15) / 16 * 16 : element_strides[i] * es;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= (std::int64_t{1} << 40)) return false;
    strides[i] = static_cast<cuuint64_t>(bytes);
    extent = bytes * static_cast<std::int64_t>(dims[i + 1]);
  }
  return true;
}

// One state's tensor map for the chunk consumers (detail::RingMaps): [rows][Hv][Dk][Dv] f32 with
// strides (s0, s1, s2) elements, columns contiguous, as a 5-D tensor (32 columns, Dv / 32 stripes
// of them 128 bytes apart, keys, value heads, rows) moved in boxes of 32 x 4 x 128 (one item: its
// 128 columns and 128 keys, in the order of its rows) with the 128-byte swizzle. False where a map
// cannot describe it: an address or a stride not a multiple of 16 bytes, a stride not positive or
// from 2^40 bytes (map_byte_strides), more rows than a 32-bit coordinate.
bool encode_state_map(CUtensorMap* map, const float* base, const Problem& prob, std::int64_t rows,
                      std::int64_t s0, std::int64_t s1, std::int64_t s2) {
  const auto encode = tensor_map_encoder();
  if (!encode || reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || rows <= 0 || rows > INT_MAX)
    return false;
  constexpr int stripe = 32;  // columns per 128-byte unit of the swizzle
  const cuuint64_t dims[5] = {stripe, static_cast<cuuint64_t>(prob.Dv / stripe),
                              static_cast<cuuint64_t>(prob.Dk), static_cast<cuuint64_t>(prob.Hv),
                              static_cast<cuuint64_t>(rows)};
  const std::int64_t element_strides[4] = {stripe, s2, s1, s0};
  cuuint64_t strides[4];
  if (!map_byte_strides(dims, element_strides, 4, 4, stripe * 4, strides)) return false;
  constexpr int cb = detail::RingLayoutT<true>::kCB, dk = detail::RingLayoutT<true>::kDK;
  const cuuint32_t box[5] = {stripe, cb / stripe, dk, 1, 1};
  const cuuint32_t steps[5] = {1, 1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 5, const_cast<float*>(base), dims, strides,
                box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// One token input's tensor map for the chunk consumers (detail::RingMaps): [B][T][heads][D] of
// 16-bit elements with strides (sb, st, sh) elements, rows contiguous, moved in boxes of
// kRowBytes / 2 elements x 1 head x T tokens x 1 sequence (an item's T rows at the slot's padded
// pitch; elements past D read as zeros). False where a map cannot describe it (as
// encode_state_map).
bool encode_token_map(CUtensorMap* map, const void* base, const Problem& prob, std::int64_t heads,
                      std::int64_t d, std::int64_t sb, std::int64_t st, std::int64_t sh) {
  const auto encode = tensor_map_encoder();
  if (!encode || reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || prob.B > INT_MAX ||
      prob.T > detail::kRingMaxTokens)
    return false;
  constexpr int es = 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(prob.T), static_cast<cuuint64_t>(prob.B)};
  const std::int64_t element_strides[3] = {sh, st, sb};
  cuuint64_t strides[3];
  if (!map_byte_strides(dims, element_strides, 3, es, d * es, strides)) return false;
  const cuuint32_t box[4] = {detail::RingLayoutT<true>::kRowBytes / es, 1,
                             static_cast<cuuint32_t>(prob.T), 1};
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  const auto type = prob.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 4, const_cast<void*>(base), dims, strides, box, steps,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The chunk consumers' tensor maps: the input state and (if any) the output state, q, k and v.
// False: the maps cannot describe them (the ring's consumers then take the tokens one by one).
bool ring_maps(const RecurrentArgs& a, const Problem& prob, detail::RingMaps* maps) {
  *maps = detail::RingMaps{};
  return a.h_in && encode_state_map(&maps->in, a.h_in, prob, a.P, a.hin_s0, a.hin_s1, a.hin_s2) &&
         (!a.h_out ||
          encode_state_map(&maps->out, a.h_out, prob, a.P, a.hout_s0, a.hout_s1, a.hout_s2)) &&
         encode_token_map(&maps->q, a.q, prob, prob.Hk, prob.Dk, a.q_sb, a.q_st, a.q_sh) &&
         encode_token_map(&maps->k, a.k, prob, prob.Hk, prob.Dk, a.k_sb, a.k_st, a.k_sh) &&
         encode_token_map(&maps->v, a.v, prob, prob.Hv, prob.Dv, a.v_sb, a.v_st, a.v_sh);
}

// The ring kernel (recurrent_ring.cuh): one persistent block per SM (at most one per item) on
// items of 128 value columns; chunk_math: its consumers on one chunk, with the state's maps.
void launch_ring(RecurrentArgs& a, const Problem& prob, int sms, const char* op,
                 cudaStream_t stream, bool chunk_math, const detail::RingMaps& maps) {
  const std::int64_t items = grid_blocks(a, a.N * prob.Hv, prob.Dv / detail::RingLayout::kCB, op);
  if (items == 0) return;
  a.prefetch_blocks = a.prefetch_wave = 0;
  // Evict-first state loads unless the load override asks for the default policy.
  a.state_ld_normal = g_load_override.load(std::memory_order_relaxed) == 2;
  const std::size_t smem =
      chunk_math ? detail::RingLayoutT<true>::kBytes : detail::RingLayout::kBytes;
  const int threads = detail::ring_warps(chunk_math) * 32;
  auto go = [&](auto kernel) {
    const void* k = reinterpret_cast<const void*>(kernel);
    allow_shared(k, smem, prob.device_index, op);
    const std::int64_t resident = resident_blocks(k, threads, smem, prob.device_index, sms, op);
    if (resident <= 0) refuse(op, "the ring kernel does not fit on this device");
    const std::int64_t blocks = persistent_grid(items, resident);
    // Dynamic items by the rule or the override (2: from round 3, 3: after the full rounds).
    const int sched = g_ring_schedule_override.load(std::memory_order_relaxed);
    const std::int64_t round = sched == 1   ? 0
                               : sched == 2 ? detail::kRingSlots
                               : sched == 3
                                   ? std::max<std::int64_t>(items / blocks, detail::kRingSlots)
                                   : recurrent_ring_dynamic_round(items, blocks, chunk_math);
    bool pooled = false;
    a.item_counter =
        round > 0 ? dynamic_counter_pair(prob.device_index, stream, &pooled, op) : nullptr;
    a.dynamic_round = a.item_counter ? static_cast<unsigned>(round) : 0u;
    a.setup_before_wait = recurrent_ring_setup_early(items, blocks);
    // A pool pair's memset lies between this launch and the grid before it: a plain launch, as
    // the chunk kernel's dynamic one.
    launch_kernel(kernel, static_cast<unsigned>(blocks), threads, smem, stream,
                  pdl_wanted() && !pooled, a, maps);
    if (pooled) check(cudaFreeAsync(a.item_counter, stream), op, "cudaFreeAsync");
    a.item_counter = nullptr;
    a.dynamic_round = 0;
    a.setup_before_wait = false;
  };
  if (chunk_math) {
    if (prob.dtype == DType::bf16)
      go(detail::recurrent_ring_kernel<detail::kBF16, false, true>);
    else
      go(detail::recurrent_ring_kernel<detail::kF16, false, true>);
    check(cudaGetLastError(), op, "ring kernel launch");
    return;
  }
  with_bool(prob.gate == GateKind::per_key, [&](auto pk) {
    constexpr bool PK = decltype(pk)::value;
    if (prob.dtype == DType::bf16)
      go(detail::recurrent_ring_kernel<detail::kBF16, PK>);
    else if (prob.dtype == DType::f16)
      go(detail::recurrent_ring_kernel<detail::kF16, PK>);
    else
      go(detail::recurrent_ring_kernel<detail::kF32, PK>);
  });
  check(cudaGetLastError(), op, "ring kernel launch");
}

// The slice kernel (recurrent_slice.cuh): a block per 32 value columns of a (sequence, value
// head).
void launch_slice(RecurrentArgs& a, const Problem& prob, const char* op, cudaStream_t stream) {
  const std::int64_t blocks = grid_blocks(a, a.N * prob.Hv, prob.Dv / detail::kSliceCols, op);
  if (blocks == 0) return;
  a.prefetch_blocks = a.prefetch_wave = 0;
  const auto kernel = prob.dtype == DType::bf16 ? detail::recurrent_slice_kernel<detail::kBF16>
                                                : detail::recurrent_slice_kernel<detail::kF16>;
  launch_kernel(kernel, static_cast<unsigned>(blocks), detail::kSliceWarps * 32, 0, stream,
                pdl_wanted(), a);
  check(cudaGetLastError(), op, "slice kernel launch");
}

void launch(RecurrentArgs& a, const Problem& prob, bool v_first, const char* op,
            cudaStream_t stream) {
  const std::int64_t heads = a.N * prob.Hv;
  // The one-token kernel reads each lane's slices of 16-byte aligned rows (recurrent_one.cuh).
  const bool one_applies = recurrent_one_applies(a.T, a.cu_seqlens != nullptr, v_first, a.vec_tok);
  // A bf16 pool: the one-token kernel where it applies, else the chunk kernel by its rule, else the
  // staged kernel (the ring kernel reads an fp32 state only: recurrent_ring_applies).
  int path = g_path_override.load(std::memory_order_relaxed);
  const int sms = sm_count(prob.device_index, op);
  const bool per_key = prob.gate == GateKind::per_key;
  const bool varlen = a.cu_seqlens != nullptr;
  if (recurrent_ring_applies(a.T, dtype_size(prob.dtype), varlen, v_first, per_key, prob.Dk,
                             prob.Dv, a.state_bf16, a.h_in != nullptr,
                             a.vec_in && (!a.h_out || a.vec_out) && a.vec_tok) &&
      (path == 5 || path == 0)) {
    const bool contiguous = ring_items_contiguous(a);
    // The state's tensor maps (host work on every call) only where the ring kernel would run with
    // its chunk consumers; where they cannot describe the state, its consumers go token by token.
    detail::RingMaps maps{};
    const bool chunk_math = ring_chunk_math(a, prob) &&
                            (path == 5 || recurrent_ring_preferred(a.T, heads, prob.Dv, contiguous,
                                                                   per_key, sms, true)) &&
                            ring_maps(a, prob, &maps);
    if (path == 5 ||
        recurrent_ring_preferred(a.T, heads, prob.Dv, contiguous, per_key, sms, chunk_math)) {
      launch_ring(a, prob, sms, op, stream, chunk_math, maps);
      return;
    }
  }
  if (path == 5) path = 0;  // the ring kernel does not apply: the rules
  if (recurrent_slice_applies(a.T, dtype_size(prob.dtype), varlen, v_first, per_key, prob.Dk,
                              a.state_bf16,
                              (!a.h_in || a.vec_in) && (!a.h_out || a.vec_out) && a.vec_tok) &&
      (path == 6 || (path == 0 && recurrent_slice_preferred(a.T, heads, prob.Dv, sms)))) {
    launch_slice(a, prob, op, stream);
    return;
  }
  if (path == 6) path = 0;  // the slice kernel does not apply: the rules
  if (recurrent_chunk_applies(v_first, per_key, prob.Dk,
                              (!a.h_in || a.vec_in) && (!a.h_out || a.vec_out)) &&
      (path == 4 || (path == 0 && !one_applies &&
                     (a.state_bf16 ? recurrent_chunk_preferred_bf16(a.T, varlen, heads, sms)
                                   : recurrent_chunk_preferred(a.T, varlen, heads, sms))))) {
    launch_chunk(a, prob, sms, op, stream);
    return;
  }
  const bool one = one_applies && (a.state_bf16 || path == 0 || path == 2);
  const bool narrow_exists = !one && !v_first && prob.Dk < 256;
  const bool narrow =
      narrow_exists &&
      (path == 3 || (path == 0 && recurrent_narrow_applies(heads, prob.Dk, prob.Dv, v_first, sms)));
  int warps = g_warps_override.load(std::memory_order_relaxed);
  const int cw = recurrent_columns_per_warp(prob.Dk, v_first, narrow);
  if (warps <= 0 || (prob.Dv / cw) % warps != 0)
    warps = one ? recurrent_one_warps_per_block(heads, prob.Dk, prob.Dv, sms)
                : recurrent_warps_per_block(heads, a.T, prob.Dk, prob.Dv, v_first, sms, narrow);
  const std::int64_t splits = prob.Dv / (static_cast<std::int64_t>(warps) * cw);
  const std::int64_t blocks = grid_blocks(a, heads, splits, op);
  if (blocks == 0) return;
  const int values_per_unit = 16 / dtype_size(prob.dtype);
  a.vec_tok = a.vec_tok && (warps * cw) % values_per_unit == 0;
  // Launches `kernel` with `smem` bytes of dynamic shared memory, the next-wave prefetch and the
  // state-load policy set by their rules for this grid.
  auto run = [&](auto kernel, std::size_t smem) {
    const std::int64_t resident = resident_blocks(reinterpret_cast<const void*>(kernel), warps * 32,
                                                  smem, prob.device_index, sms, op);
    set_prefetch(a, blocks, resident, one);
    set_load_policy(a, blocks, resident, one);
    launch_kernel(kernel, static_cast<unsigned>(blocks), warps * 32, smem, stream, pdl_wanted(), a);
  };
  with_dim(prob.Dk, [&](auto dk) {
    constexpr int DK = decltype(dk)::value;
    if (one) {
      with_bool(per_key, [&](auto pk) {
        if (a.state_bf16)
          run(detail::recurrent_one_kernel<DK, decltype(pk)::value, true>, 0);
        else
          run(detail::recurrent_one_kernel<DK, decltype(pk)::value>, 0);
      });
      return;
    }
    constexpr int TC = detail::Tile<DK, false>::kTC;
    a.tc = static_cast<int>(a.T < TC ? (a.T > 0 ? a.T : 1) : TC);
    const std::size_t smem = sizeof(float) * detail::shared_floats(DK, per_key, a.tc, warps * cw);
    with_bool(v_first, [&](auto vf) {
      with_bool(per_key, [&](auto pk) {
        constexpr bool VF = decltype(vf)::value, PK = decltype(pk)::value;
        static_assert(detail::Tile<DK, VF>::kCW == recurrent_columns_per_warp(DK, VF));
        if constexpr (!VF && DK < 256) {
          static_assert(detail::Tile<DK, false, true>::kCW ==
                        recurrent_columns_per_warp(DK, false, true));
          if (narrow) {
            run(detail::recurrent_kernel<DK, false, PK, true>, smem);
            return;
          }
        }
        run(detail::recurrent_kernel<DK, VF, PK>, smem);
      });
    });
  });
  check(cudaGetLastError(), op, "recurrent kernel launch");
}

}  // namespace

void set_recurrent_warps_override(int warps) {
  g_warps_override.store(warps == 1 || warps == 2 || warps == 4 || warps == 8 ? warps : 0);
}

void set_recurrent_prefetch_override(int mode) {
  g_prefetch_override.store(mode >= 1 && mode <= 3 ? mode : 0);
}

void set_recurrent_pdl_override(int mode) {
  g_pdl_override.store(mode == 1 || mode == 2 ? mode : 0);
}

void set_recurrent_load_override(int mode) {
  g_load_override.store(mode == 1 || mode == 2 ? mode : 0);
}

void set_recurrent_chunk_schedule_override(int mode) {
  g_chunk_schedule_override.store(mode == 1 || mode == 2 ? mode : 0);
}

void set_recurrent_chunk_blocks_override(int blocks) {
  g_chunk_blocks_override.store(blocks > 0 ? blocks : 0);
}

void set_recurrent_ring_schedule_override(int mode) {
  g_ring_schedule_override.store(mode >= 1 && mode <= 3 ? mode : 0);
}

void set_recurrent_ring_math_override(int mode) {
  g_ring_math_override.store(mode == 1 || mode == 2 ? mode : 0);
}

void set_recurrent_chunk_first_override(int mode) {
  g_chunk_first_override.store(mode == 1 || mode == 2 ? mode : 0);
}

void set_recurrent_chunk_columns_override(int columns) {
  g_chunk_columns_override.store(columns == 32 || columns == 64 || columns == 128 ? columns : 0);
}

void set_recurrent_path_override(int path) {
  g_path_override.store(path >= 1 && path <= 6 ? path : 0);
}

void decode(const Problem& prob, const DecodeParams& p, const ExecConfig& config) {
  const char* op = "gdr.decode";
  check_common(op, prob, p.q, p.g, p.beta, p.A_log, p.dt_bias, p.mask, p.opts);
  if (p.state.dtype != DType::f32 && p.state.dtype != DType::bf16)
    refuse(op, "state has dtype " + std::string(to_string(p.state.dtype)) +
                   "; on cuda supported: float32, bfloat16");
  if (p.state_indices.defined() && p.state_indices.dtype != DType::i32 &&
      p.state_indices.dtype != DType::i64)
    refuse(op, "state_indices has dtype " + std::string(to_string(p.state_indices.dtype)) +
                   "; must be int32 or int64");
  if (prob.B == 0 || prob.T == 0 || prob.Hv == 0) return;
  DeviceGuard guard(prob.device_index, op);
  RecurrentArgs a{};
  set_token_inputs(a, p.q, p.k, p.v, p.g, p.beta, p.mask, p.o, p.A_log, p.dt_bias, p.opts, prob);
  a.h_in = static_cast<const float*>(p.state.data);
  a.h_out = static_cast<float*>(p.state.data);
  a.hin_s0 = a.hout_s0 = p.state.stride[0];
  a.hin_s1 = a.hout_s1 = p.state.stride[1];
  a.hin_s2 = a.hout_s2 = p.state.stride[2];
  a.vec_in = a.vec_out = vectorizable(p.state);
  a.in_place = true;
  a.state_bf16 = p.state.dtype == DType::bf16;
  if (p.state_indices.defined()) {
    a.state_indices = p.state_indices.data;
    a.idx_dtype = static_cast<int>(p.state_indices.dtype);
    if (p.state_indices.stride[0] != 1) refuse(op, "state_indices must be contiguous");
  }
  a.N = prob.B;
  a.T = prob.T;
  a.P = prob.P > 0 ? prob.P : p.state.shape[0];
  launch(a, prob, p.opts.state_layout == StateLayout::v_first, op,
         static_cast<cudaStream_t>(config.stream));
}

void recurrent_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config) {
  const char* op = "gdr.forward";
  const Inputs& in = p.in;
  check_common(op, prob, in.q, in.g, in.beta, in.A_log, in.dt_bias, in.mask, p.opts);
  if (in.h0.defined() && in.h0.dtype != DType::f32) refuse(op, "h0 must be float32");
  if (p.final_state.defined() && p.final_state.dtype != DType::f32)
    refuse(op, "final_state must be float32");
  if (prob.N == 0 || prob.Hv == 0) return;
  DeviceGuard guard(prob.device_index, op);
  const auto stream = static_cast<cudaStream_t>(config.stream);
  RecurrentArgs a{};
  if (prob.varlen) {
    // Validation reads cu_seqlens values only from host memory: copy a device tensor over
    // (ordered on the caller's stream) and check it here, before any kernel reads it.
    const TensorView& cu = in.cu_seqlens;
    if (cu.stride[0] != 1) refuse(op, "cu_seqlens must be contiguous");
    if (cu.device == DeviceType::cuda) {
      std::vector<std::int64_t> host(static_cast<std::size_t>(prob.N) + 1);
      check(cudaMemcpyAsync(host.data(), cu.data, (prob.N + 1) * dtype_size(cu.dtype),
                            cudaMemcpyDeviceToHost, stream),
            op, "cudaMemcpyAsync(cu_seqlens)");
      check(cudaStreamSynchronize(stream), op, "cudaStreamSynchronize");
      check_cu_seqlens_values(host.data(), cu.dtype, prob.N + 1, prob.T, op);
    } else {
      refuse(op, "cu_seqlens is on the cpu while the other tensors are on cuda");
    }
    a.cu_seqlens = cu.data;
    a.cu_dtype = static_cast<int>(cu.dtype);
  }
  if (prob.T == 0 && !prob.varlen && !p.final_state.defined()) return;
  set_token_inputs(a, in.q, in.k, in.v, in.g, in.beta, in.mask, p.o, in.A_log, in.dt_bias, p.opts,
                   prob);
  if (in.h0.defined()) {
    a.h_in = static_cast<const float*>(in.h0.data);
    a.hin_s0 = in.h0.stride[0], a.hin_s1 = in.h0.stride[1], a.hin_s2 = in.h0.stride[2];
    a.vec_in = vectorizable(in.h0);
  }
  if (p.final_state.defined()) {
    a.h_out = static_cast<float*>(p.final_state.data);
    a.hout_s0 = p.final_state.stride[0], a.hout_s1 = p.final_state.stride[1];
    a.hout_s2 = p.final_state.stride[2];
    a.vec_out = vectorizable(p.final_state);
  }
  a.N = prob.N;
  a.T = prob.T;
  a.P = prob.N;
  launch(a, prob, p.opts.state_layout == StateLayout::v_first, op, stream);
}

}  // namespace gdr::cuda
