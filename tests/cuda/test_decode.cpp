// GPU tests of the CUDA recurrent kernel (src/cuda/recurrent.cuh) through the public API:
// gdr::decode (state pool in place) and gdr::forward on CUDA tensors (recurrent path), each
// against the float64 CPU reference on the same (rounded) inputs, docs/operator.md §7 bounds:
// fp32 inputs < 1e-5, bf16/fp16 inputs < 5e-3, for o and the state. Outputs are poisoned
// (NaN) before every call; fresh random inputs every run (the seed is in each message). Every
// case runs through every kernel: the staged one (recurrent.cuh) with its usual tile and, on a
// k-first state with Dk < 256, with its narrow tile, where it applies (one token, k-first
// state, aligned rows), the one-token kernel (recurrent_one.cuh), and where it applies (k-first
// fp32 or bf16 state, Dk = 128, scalar gate) the chunk kernel (recurrent_chunk.cuh) and (1 to 8
// tokens, 1 to 4 with a per-key gate, k-first fp32 state, Dk = 128, Dv % 128 == 0) the ring kernel
// (recurrent_ring.cuh), through the plan's overrides (gdr/decode_overrides.h) in each call's
// ExecConfig.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gdr/decode_overrides.h"
#include "gpu_support.h"
#include "support_gtest.h"

namespace gdr::test {
namespace {

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

Case decode_case(std::int64_t B, std::int64_t T, std::int64_t Hk, std::int64_t Hv, std::int64_t D) {
  Case c;
  c.B = B;
  c.T = T;
  c.Hk = Hk;
  c.Hv = Hv;
  c.Dk = D;
  c.Dv = D;
  return c;
}

// The plan's overrides that every call of this file passes (ExecConfig::decode_overrides), set by
// the scopes below for their lifetime; all 0: the rules.
DecodeOverrides t_overrides;

// The config of a call of this file: the stream and the overrides of the current scopes.
ExecConfig test_config(cudaStream_t stream = nullptr) {
  ExecConfig cfg;
  cfg.stream = stream;
  cfg.decode_overrides = &t_overrides;
  return cfg;
}

// Sets one field of the overrides for its lifetime, then restores it.
class OverrideScope {
 public:
  OverrideScope(int DecodeOverrides::*field, int value)
      : field_(field), saved_(t_overrides.*field) {
    t_overrides.*field = value;
  }
  ~OverrideScope() { t_overrides.*field_ = saved_; }
  OverrideScope(const OverrideScope&) = delete;
  OverrideScope& operator=(const OverrideScope&) = delete;

 private:
  int DecodeOverrides::*field_;
  int saved_;
};

// A non-blocking stream owned for a test's scope.
class StreamScope {
 public:
  StreamScope() {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
  }
  ~StreamScope() { cudaStreamDestroy(stream_); }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_{};
};

// The kernel path: 1 = staged, 2 = one-token where it applies, 3 = staged with the narrow tile
// where it exists (k-first, Dk < 256), 4 = the chunk kernel where it applies (k-first, Dk = 128,
// scalar gate, fp32 or bf16 state with aligned rows), 5 = the chunk kernel with items of 128
// columns (6, items of 32 columns, is gone with those items), 7 = the chunk kernel with the rule's
// items and its first state wait early (the tests' grids take the late wait by the rule), 8 and 9 =
// the chunk kernel on a grid of 3 blocks (several items per block: the persistent loop of large
// grids, with each next item's state and tokens copied during the current one) with static and with
// dynamic items; 10 = the ring kernel where it applies (1 to 8 tokens of 16-bit inputs or 1 to 4 of
// f32, k-first fp32 state, Dk = 128, Dv % 128 == 0, scalar gate, aligned rows; the rules
// elsewhere), 11 = the ring kernel on a grid of 2 blocks (several items per block: its slots
// refilled and reused), 12 = the ring kernel with its consumers token by token, 13 and 14 = the
// ring kernel with its consumers on one chunk (tensor cores) wherever that exists (16-bit inputs,
// scalar gate), on the resident blocks and on 2; 15 = the slice kernel where it applies (1 to 8
// tokens of 16-bit inputs, k-first fp32 state, Dk = 128, scalar gate, aligned rows; the rules
// elsewhere); 16 and 17 = the ring kernel on 2 blocks with dynamic items from round 3, its
// consumers on one chunk and token by token; 18 = the ring kernel on 3 blocks, its consumers on one
// chunk, with dynamic items after the full rounds.
class PathScope {
 public:
  explicit PathScope(int path) : saved_(t_overrides) {
    const bool ring_dynamic = path >= 16;
    DecodeOverrides& o = t_overrides;
    o.kernel = static_cast<DecodeKernel>(
        ring_dynamic ? 5 : (path == 15 ? 6 : (path >= 10 ? 5 : (path >= 5 ? 4 : path))));
    o.chunk_columns = path == 5 ? 128 : 0;
    o.chunk_first_wait = path == 7 ? 2 : 0;
    o.persistent_blocks = path == 8 || path == 9 || path == 18
                              ? 3
                              : (path == 11 || path == 14 || ring_dynamic ? 2 : 0);
    o.chunk_schedule = path == 8 ? 1 : (path == 9 ? 2 : 0);
    o.ring_math = path == 12 || path == 17
                      ? 1
                      : (path == 13 || path == 14 || path == 16 || path == 18 ? 2 : 0);
    o.ring_schedule = ring_dynamic ? (path == 18 ? 3 : 2) : 1;
  }
  ~PathScope() { t_overrides = saved_; }  // scopes end in the reverse order of their start
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  DecodeOverrides saved_;
};
// The next-wave prefetch: 1 = off, 2 = every block prefetches the next block's state (block 0
// through the first wave's distance, the others through the half-wave one).
struct PrefetchScope : OverrideScope {
  explicit PrefetchScope(int mode) : OverrideScope(&DecodeOverrides::prefetch, mode) {}
};
// The one-token kernel's state loads: 1 = evict-first, 2 = the default cache policy.
struct LoadScope : OverrideScope {
  explicit LoadScope(int mode) : OverrideScope(&DecodeOverrides::state_loads, mode) {}
};

// Every path of PathScope (above).
constexpr int kAllPaths[] = {1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};

// The paths every case runs through: all, or those listed in GDR_TEST_PATHS (numbers separated
// by anything else, e.g. "8" or "4,10", to run one path under compute-sanitizer).
std::vector<int> test_paths() {
  const char* env = std::getenv("GDR_TEST_PATHS");
  std::set<int> listed;
  for (const char* p = env; p && *p;) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p) {
      ++p;
    } else {
      listed.insert(static_cast<int>(v));
      p = end;
    }
  }
  std::vector<int> paths;
  for (int p : kAllPaths)
    if (!env || listed.count(p)) paths.push_back(p);
  return paths;
}
const std::vector<int> kPaths = test_paths();
const char* path_name(int path) {
  switch (path) {
    case 2: return " [one-token path]";
    case 3: return " [narrow staged path]";
    case 4: return " [chunk path]";
    case 5: return " [chunk path, 128 columns]";
    case 7: return " [chunk path, early first state wait]";
    case 8: return " [chunk path, 3 blocks, static items]";
    case 9: return " [chunk path, 3 blocks, dynamic items]";
    case 10: return " [ring path]";
    case 11: return " [ring path, 2 blocks]";
    case 12: return " [ring path, token by token]";
    case 13: return " [ring path, one chunk]";
    case 14: return " [ring path, one chunk, 2 blocks]";
    case 15: return " [slice path]";
    case 16: return " [ring path, one chunk, 2 blocks, dynamic items]";
    case 17: return " [ring path, token by token, 2 blocks, dynamic items]";
    case 18: return " [ring path, one chunk, 3 blocks, dynamic last round]";
    default: return " [staged path]";
  }
}

// `t` with the same values, its rows (last dim) padded by `pad` elements.
void pad_rows(HostTensor& t, std::int64_t pad) {
  HostTensor padded(t.dtype(), t.shape(), pad);
  padded.from_double(t.to_double());
  t = std::move(padded);
}

// One decode step on the GPU vs the reference, with each path, all on one fresh random problem
// (its float64 reference computed once: on the host that is most of a case's time); with indices,
// also checks bit for bit that pool rows no sequence uses (and the skipped sequence's row) are
// untouched. state_pad > 0: the pool's rows padded by that many elements (its last-but-one
// stride); token_pad > 0: q's, k's and v's rows padded so.
void check_decode(const Case& c, std::int64_t P = 0, bool indices = false,
                  std::int64_t state_pad = 0, std::int64_t token_pad = 0) {
  DecodeData problem = make_decode_problem(c, P, indices);
  if (state_pad > 0) pad_rows(problem.state, state_pad);
  if (token_pad > 0)
    for (HostTensor* t : {&problem.base.q, &problem.base.k, &problem.base.v})
      pad_rows(*t, token_pad);
  const std::vector<unsigned char> before(
      static_cast<const unsigned char*>(problem.state.data()),
      static_cast<const unsigned char*>(problem.state.data()) + span_bytes(problem.state.view()));
  const ForwardResult ref = decode_reference(problem);
  std::set<std::int64_t> used;  // indices: the pool rows some sequence steps
  for (std::int64_t b = 0; indices && b < c.B; ++b) {
    const auto r = static_cast<std::int64_t>(problem.state_indices.get(b));
    if (r >= 0) used.insert(r);
  }
  for (int path : kPaths) {
    PathScope scope(path);
    DecodeData d = problem;  // the pool as before the step (run_decode_cuda steps it in place)
    const std::string label =
        describe(d.base.c, d.base.seed) + (indices ? " pool" : "") + path_name(path);
    std::vector<unsigned char> after;
    const ForwardResult got = run_decode_cuda(d, nullptr, &after, &t_overrides);
    expect_forward_close(got, ref, forward_tolerance(d.base.c), state_tolerance(d.base.c), label);
    if (!indices) continue;
    const std::size_t row_bytes = before.size() / static_cast<std::size_t>(d.P);
    for (std::int64_t r = 0; r < d.P; ++r) {
      if (used.count(r)) continue;
      EXPECT_EQ(0,
                std::memcmp(before.data() + r * row_bytes, after.data() + r * row_bytes, row_bytes))
          << label << ": pool row " << r << " is used by no sequence but changed";
    }
  }
}

// gdr::forward on CUDA tensors vs the reference, with each path, all on one fresh random problem
// (its float64 reference computed once, as check_decode's).
void check_forward(const Case& c) {
  TestData problem = make_problem(c);
  const ForwardResult ref = run_forward(problem, Path::reference);
  for (int path : kPaths) {
    PathScope scope(path);
    TestData d = problem;  // run_forward_cuda poisons o and the final state before the call
    const std::string label = describe(d.c, d.seed) + path_name(path);
    const ForwardResult got = run_forward_cuda(d, nullptr, Path::sequential, &t_overrides);
    expect_forward_close(got, ref, forward_tolerance(d.c), label);
  }
}

TEST(CudaDecode, TokensGatesLayoutsDtypes) {
  REQUIRE_GPU();
  for (std::int64_t T : {1, 2, 8, 16})
    for (GateKind gate : {GateKind::scalar, GateKind::per_key})
      for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first})
        for (DType dtype : {DType::f32, DType::bf16}) {
          Case c = decode_case(3, T, 2, 4, 128);
          c.gate = gate;
          c.layout = layout;
          c.dtype = dtype;
          check_decode(c);
        }
}

TEST(CudaDecode, HeadDims) {
  REQUIRE_GPU();
  for (std::int64_t Dk : {64, 128, 256})
    for (std::int64_t Dv : {64, 128, 256})
      for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first})
        for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
          Case c = decode_case(2, 1 + (Dk + Dv) % 3, 1, 2, 64);  // T = 1 or 2 (or 3)
          c.Dk = Dk;
          c.Dv = Dv;
          c.layout = layout;
          c.gate = gate;
          check_decode(c);
        }
}

TEST(CudaDecode, GroupedHeads) {
  REQUIRE_GPU();
  for (auto [Hk, Hv] : {std::pair<int, int>{4, 4}, {2, 8}, {3, 12}, {1, 5}})
    for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first}) {
      Case c = decode_case(2, Hk % 2 ? 1 : 3, Hk, Hv, 128);
      c.layout = layout;
      check_decode(c);
    }
}

TEST(CudaDecode, DtypesAndGateDtypes) {
  REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (bool gates_in_dtype : {false, true}) {
      Case c = decode_case(2, gates_in_dtype ? 1 : 4, 2, 4, 128);
      c.dtype = dtype;
      c.gates_in_dtype = gates_in_dtype;
      c.gate = gates_in_dtype ? GateKind::per_key : GateKind::scalar;
      check_decode(c);
    }
}

TEST(CudaDecode, FusedOptions) {
  REQUIRE_GPU();
  for (GateKind gate : {GateKind::scalar, GateKind::per_key})
    for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first})
      for (int opts = 1; opts < 8; ++opts) {
        Case c = decode_case(2, opts % 2 ? 1 : 3, 2, 4, 128);
        c.gate = gate;
        c.layout = layout;
        c.gate_in_kernel = opts & 1;
        c.beta_sigmoid = opts & 2;
        c.qk_l2norm = opts & 4;
        c.scale = (opts == 7) ? 0.3f : 0.0f;
        check_decode(c);
      }
}

TEST(CudaDecode, MaskDecayStrides) {
  REQUIRE_GPU();
  for (Decay decay : {Decay::mild, Decay::strong, Decay::extreme})
    for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first}) {
      Case c = decode_case(4, decay == Decay::mild ? 1 : 8, 2, 4, 128);
      c.mask = true;
      c.decay = decay;
      c.layout = layout;
      c.strided = decay != Decay::mild;
      check_decode(c);
    }
}

// Several tokens through the ring kernel's lazy decay (recurrent_ring.cuh, ring_consume_tokens:
// the product of the decays kept apart from the state until it leaves [1e-24, 1e24]; extreme decays
// of -30 make it leave within an item) with masked tokens, 16-bit inputs up to its 8 tokens and
// pool rows with a skipped sequence; every other path runs the same cases.
TEST(CudaDecode, ManyTokensMaskDecay) {
  REQUIRE_GPU();
  for (std::int64_t T : {5, 8})
    for (Decay decay : {Decay::strong, Decay::extreme}) {
      Case c = decode_case(4, T, 2, 4, 128);
      c.dtype = T == 8 ? DType::bf16 : DType::f16;
      c.mask = true;
      c.decay = decay;
      check_decode(c, 6, T == 8);
    }
}

// A per-key gate through the ring kernel's per-row decays (recurrent_ring.cuh, ring_row_decays:
// each warp forms its rows' decays from the slot's raw g rows, in-kernel gate included) at its
// most tokens (4 of bf16, 3 of f32), with masked tokens, strong decays, g in the input dtype, and
// pool rows with a skipped sequence; every other path runs the same cases.
TEST(CudaDecode, PerKeyGateTokens) {
  REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f32})
    for (bool gate_in_kernel : {false, true}) {
      Case c = decode_case(4, dtype == DType::bf16 ? 4 : 3, 2, 4, 128);
      c.gate = GateKind::per_key;
      c.dtype = dtype;
      c.mask = true;
      c.decay = Decay::strong;
      c.gate_in_kernel = gate_in_kernel;
      c.gates_in_dtype = dtype == DType::bf16 && !gate_in_kernel;
      check_decode(c, 6, true);
    }
}

TEST(CudaDecode, StatePool) {
  REQUIRE_GPU();
  for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first})
    for (bool i64 : {false, true}) {
      Case c = decode_case(5, i64 ? 1 : 2, 2, 4, 128);
      c.layout = layout;
      c.cu_seqlens_i64 = i64;  // the index dtype
      check_decode(c, 9, true);
    }
}

TEST(CudaDecode, LargeBatch) {
  REQUIRE_GPU();
  // Enough (sequence, head) pairs that the launch uses multi-warp blocks (4 warps in the staged
  // kernel, 2 in the one-token kernel on a 132-SM GPU).
  for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first}) {
    Case c = decode_case(80, 1, 4, 8, 128);
    c.layout = layout;
    c.dtype = DType::bf16;
    check_decode(c);
  }
}

// The next-wave L2 prefetch (recurrent.cuh, prefetch_state_of_block) forced on in every block,
// for its successor's state whatever the grid: whole heads (contiguous pools, both layouts, pool
// indices with a skipped sequence, heads of 64 KB and 256 KB, a bf16 pool) and one prefetch per
// row (pools padded in the last dim). A prefetch changes no result; this runs its address
// arithmetic on each kind of pool, under compute-sanitizer in scripts/device-check.
TEST(CudaDecode, NextWavePrefetch) {
  REQUIRE_GPU();
  PrefetchScope scope(2);
  for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first})
    for (std::int64_t pad : {0, 4}) {
      Case c = decode_case(6, layout == StateLayout::k_first ? 1 : 2, 2, 4, 128);
      c.layout = layout;
      check_decode(c, 9, true, pad);
    }
  for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first}) {  // 256 KB heads
    Case c = decode_case(3, layout == StateLayout::k_first ? 1 : 2, 1, 2, 256);
    c.layout = layout;
    check_decode(c, 5, true);
  }
  Case c = decode_case(6, 1, 2, 4, 64);
  c.bf16_state = true;
  check_decode(c, 9, true);
}

// The one-token kernel with its state loads under the default cache policy (the rule picks it
// for grids of many waves): fp32 and bf16 pools, pool indices with a skipped row.
TEST(CudaDecode, StateLoadPolicy) {
  REQUIRE_GPU();
  LoadScope scope(2);
  for (bool bf16_state : {false, true})
    for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
      Case c = decode_case(5, 1, 2, 4, 128);
      c.gate = gate;
      c.bf16_state = bf16_state;
      check_decode(c, 9, true);
    }
}

// A bfloat16 pool (one token, k-first): o as with an fp32 pool, the pool equal to the reference's
// state rounded to bf16 up to state_tolerance, rows nobody uses untouched bit for bit.
TEST(CudaDecode, Bf16StatePool) {
  REQUIRE_GPU();
  for (std::int64_t Dk : {64, 128, 256})
    for (GateKind gate : {GateKind::scalar, GateKind::per_key})
      for (DType dtype : {DType::f32, DType::bf16}) {
        Case c = decode_case(5, 1, 2, 4, Dk);
        c.Dv = Dk == 256 ? 64 : 128;
        c.gate = gate;
        c.dtype = dtype;
        c.bf16_state = true;
        c.mask = gate == GateKind::per_key;
        c.qk_l2norm = dtype == DType::bf16;
        check_decode(c, 9, true);
      }
}

// A bfloat16 pool outside the one-token kernel's reach (several tokens, a v-first pool, rows
// that are not 16-byte aligned; per-key gates at Dk = 128, which the chunk kernel does not take):
// the staged kernel, which the chunk and ring paths fall back to, holds the state in fp32
// registers and rounds it once at the end, so the pool matches the bf16 rounding of the
// reference; rows nobody uses untouched bit for bit.
TEST(CudaDecode, Bf16StatePoolTokens) {
  REQUIRE_GPU();
  for (std::int64_t T : {2, 8, 16})
    for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first})
      for (std::int64_t Dk : {64, 128, 256}) {
        Case c = decode_case(3, T, 2, 4, Dk);
        c.Dv = Dk == 256 ? 64 : 128;
        c.layout = layout;
        c.gate = Dk == 128 ? GateKind::per_key : GateKind::scalar;
        c.dtype = T == 8 ? DType::f32 : DType::bf16;
        c.mask = T == 16;
        c.qk_l2norm = T == 2;
        c.bf16_state = true;
        check_decode(c, 7, true);
      }
  Case one = decode_case(3, 1, 2, 4, 128);  // one token on a v-first pool
  one.layout = StateLayout::v_first;
  one.bf16_state = true;
  check_decode(one, 7, true);
  Case padded = decode_case(3, 2, 2, 4, 64);  // rows padded by one element: not 16-byte aligned
  padded.bf16_state = true;
  check_decode(padded, 0, false, 1);
}

// A bfloat16 pool in the chunk kernel's reach (k-first, Dk = 128, scalar gate, aligned rows;
// recurrent_chunk.cuh, SB): its paths read the bf16 rows into fp32 registers and round the state
// once per item at the store. Partial and several chunks per item, every token dtype, masks, the
// in-kernel L2 norm and gate, Dv = 256 (two items per head), a pool with a skipped sequence (the
// 3-block paths run several items per block), and rows padded by 8 elements (16 bytes: still
// aligned, but not contiguous, so no L2 read-ahead of whole items).
TEST(CudaDecode, Bf16StatePoolChunk) {
  REQUIRE_GPU();
  struct Row {
    std::int64_t T, Dv;
    DType dtype;
    bool mask, l2, gate_in_kernel;
  };
  for (const Row& r :
       {Row{4, 128, DType::bf16, false, true, false}, Row{8, 128, DType::f32, true, false, false},
        Row{8, 256, DType::bf16, false, false, true}, Row{13, 128, DType::f16, true, true, false},
        Row{16, 128, DType::bf16, false, false, false}}) {
    Case c = decode_case(3, r.T, 2, 4, 128);
    c.Dv = r.Dv;
    c.dtype = r.dtype;
    c.mask = r.mask;
    c.qk_l2norm = r.l2;
    c.gate_in_kernel = r.gate_in_kernel;
    c.bf16_state = true;
    check_decode(c, 7, true);
  }
  Case padded = decode_case(3, 8, 2, 4, 128);
  padded.dtype = DType::bf16;
  padded.bf16_state = true;
  check_decode(padded, 0, false, 8);
}

// A pool whose rows are not 16-byte aligned takes the scalar path; results must not change.
TEST(CudaDecode, MisalignedPool) {
  REQUIRE_GPU();
  for (int path : kPaths)
    for (StateLayout layout : {StateLayout::k_first, StateLayout::v_first}) {
      PathScope scope(path);
      Case c = decode_case(2, 2, 1, 2, 64);
      c.layout = layout;
      DecodeData d = make_decode_problem(c);
      const std::string label = describe(d.base.c, d.base.seed) + " misaligned" + path_name(path);
      const ForwardResult ref = decode_reference(d);
      d.base.o.poison();
      DecodeParams host = d.params();
      DeviceMirror m;
      DecodeParams p = mirror_decode_params(m, host);  // then the pool moved off alignment
      const std::size_t bytes = span_bytes(host.state);
      float* raw = nullptr;
      cuda_check(cudaMalloc(&raw, bytes + 16), "cudaMalloc");
      cuda_check(cudaMemcpy(raw + 1, host.state.data, bytes, cudaMemcpyHostToDevice), "H2D");
      p.state.data = raw + 1;
      p.state.device = DeviceType::cuda;
      decode(p, test_config());
      cuda_check(cudaDeviceSynchronize(), "decode");
      cuda_check(cudaMemcpy(host.state.data, raw + 1, bytes, cudaMemcpyDeviceToHost), "D2H");
      cudaFree(raw);
      DeviceMirror::to_host(p.o, host.o);
      ForwardResult got;
      got.o = d.base.o.to_double();
      got.final_state = d.state.to_double();
      expect_forward_close(got, ref, forward_tolerance(d.base.c), label);
    }
}

// The ring kernel's chunk consumers move the state and the token rows through tensor maps
// (src/cuda/common/tensor_maps.cu, encode_state_map: a 5-D box per item, 128-byte swizzle;
// encode_token_map: a box of an item's T rows of q, k or v): pools whose key rows are padded by 4
// and 8 elements (row strides of 528 and 544 bytes), token rows padded by 8 and 16 elements
// (strides of 272 and 288 bytes, the heads' and tokens' strides then not the dense ones), two items
// per head (Dv = 256: the stripe and the v box's column coordinates), a pool with indices and a
// skipped row, 16-bit inputs at 6 and 8 tokens with a mask. Paths 13 and 14 take the maps; the
// other paths run the same cases by their kernels.
TEST(CudaDecode, RingChunkTensorMaps) {
  REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f16})
    for (std::int64_t T : {6, 8})
      for (std::int64_t pad : {0, 4, 8}) {
        Case c = decode_case(5, T, 2, 4, 128);
        c.dtype = dtype;
        c.Dv = pad == 0 ? 256 : 128;
        c.mask = T == 8;
        check_decode(c, 9, true, pad, 2 * pad);
      }
}

// `steps` decode steps of case c (a pool with indices) run by `run` on a fresh stream (which it
// leaves synchronized), each reading the pool the one before wrote: the last o and the pool
// against the reference stepped as often (the pool within state_tol, by default
// state_tolerance(c)).
void check_decode_steps(const Case& c, int steps, const std::string& what,
                        const std::function<void(DecodeParams&, cudaStream_t)>& run,
                        double state_tol = -1.0) {
  DecodeData d = make_decode_problem(c, 7, true);
  DecodeData stepped = d;
  ForwardResult ref;
  for (int i = 0; i < steps; ++i) {
    ref = decode_reference(stepped);
    stepped.state.from_double(ref.final_state);
  }
  d.base.o.poison();
  DecodeParams host = d.params();
  DeviceMirror m;
  DecodeParams p = mirror_decode_params(m, host);
  StreamScope stream;
  run(p, stream.get());
  DeviceMirror::to_host(p.o, host.o);
  DeviceMirror::to_host(p.state, host.state);
  ForwardResult got;
  got.o = d.base.o.to_double();
  got.final_state = d.state.to_double();
  expect_forward_close(got, ref, forward_tolerance(c),
                       state_tol >= 0.0 ? state_tol : state_tolerance(c),
                       describe(c, d.base.seed) + what);
}

// `steps` decodes of p on `stream` with no host sync between them, then the stream synchronized
// (a `run` of check_decode_steps).
std::function<void(DecodeParams&, cudaStream_t)> decode_chained(int steps) {
  return [steps](DecodeParams& p, cudaStream_t stream) {
    const ExecConfig cfg = test_config(stream);
    for (int i = 0; i < steps; ++i) decode(p, cfg);
    cuda_check(cudaStreamSynchronize(stream), "sync");
  };
}

// One decode of p captured on `stream` into a graph, the graph replayed `replays` times, the stream
// synchronized.
void replay_captured_decode(DecodeParams& p, cudaStream_t stream, int replays) {
  const ExecConfig cfg = test_config(stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  decode(p, cfg);
  cuda_check(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int i = 0; i < replays; ++i) cuda_check(cudaGraphLaunch(exec, stream), "launch");
  cuda_check(cudaStreamSynchronize(stream), "sync");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// The launch is captured into a CUDA graph and replayed (the serving pattern); the kernel
// runs on the caller's stream.
TEST(CudaDecode, GraphReplayOnStream) {
  REQUIRE_GPU();
  Case c = decode_case(4, 1, 2, 4, 128);
  c.dtype = DType::bf16;
  check_decode_steps(c, 1, " graph", [](DecodeParams& p, cudaStream_t stream) {
    replay_captured_decode(p, stream, 1);  // one step: the state moves once
  });
}

// The ring and chunk kernels' dynamic items in graphs: each launch's last block leaves its counter
// pair zero, so that a captured launch (a pair of the arena, made by an eager launch before the
// capture, as a serving engine warms up) takes every item again at each replay. One eager step,
// then a captured step replayed three times (each replay reads the pool the one before wrote):
// the last o and the pool against the reference stepped four times; the ring with dynamic items
// from round 3 (2 blocks) and after the full rounds (3 blocks: 20 items, 2 of them dynamic), both
// consumer forms, and the chunk kernel with dynamic items on 3 blocks.
TEST(CudaDecode, DynamicItemsGraphReplays) {
  REQUIRE_GPU();
  constexpr int kReplays = 3;
  for (int path : {9, 16, 17, 18}) {
    PathScope scope(path);
    for (std::int64_t T : {1, 8}) {
      Case c = decode_case(5, T, 2, 4, 128);
      c.dtype = DType::bf16;
      check_decode_steps(
          c, 1 + kReplays, " graph replays" + std::string(path_name(path)),
          [](DecodeParams& p, cudaStream_t stream) {
            decode(p, test_config(stream));  // eager (and the arena made, if it is not yet)
            replay_captured_decode(p, stream, kReplays);
          });
    }
  }
}

// Several steps on one stream with no host sync between them, each reading the pool the one
// before wrote, launched plainly (override 1) and as programmatic dependent launches (2, the rule:
// each kernel may start while the one before drains and waits for it in wait_for_prior_grids
// before touching memory): the last o and the pool against the reference stepped as often,
// through every path.
TEST(CudaDecode, ChainedStepsDependentLaunch) {
  REQUIRE_GPU();
  constexpr int kSteps = 4;
  for (int mode : {1, 2}) {
    OverrideScope pdl(&DecodeOverrides::pdl, mode);
    for (std::int64_t T : {1, 2, 8}) {
      for (int path : kPaths) {
        PathScope scope(path);
        Case c = decode_case(5, T, 2, 4, 128);
        c.dtype = DType::bf16;
        check_decode_steps(c, kSteps,
                           " chained, pdl mode " + std::to_string(mode) + path_name(path),
                           decode_chained(kSteps));
      }
    }
  }
}

// The ring's chunk consumers keep an fp32 pool as accurate as fp32 arithmetic allows with 16-bit
// inputs (exact in the reference): their products split the state into parts (3xBF16 for bf16
// inputs, 3xTF32 for f16) that together carry all its bits, so after 8 chained steps the pool is
// within 2e-6 of the reference (measured ~1.4e-7 after one step; a product of the state's top
// 11 bits alone comes out ~1.2e-4), far inside forward_tolerance's 5e-3 for 16-bit inputs.
TEST(CudaDecode, RingChunkStateKeepsFp32Accuracy) {
  REQUIRE_GPU();
  constexpr int kSteps = 8;
  constexpr double kStateTol = 2e-6;
  for (int path : {13, 14, 18}) {
    PathScope scope(path);
    for (DType dtype : {DType::bf16, DType::f16})
      for (std::int64_t T : {6, 8}) {
        Case c = decode_case(5, T, 2, 4, 128);
        c.dtype = dtype;
        check_decode_steps(c, kSteps, " fp32 accuracy" + std::string(path_name(path)),
                           decode_chained(kSteps), kStateTol);
      }
  }
}

TEST(CudaDecode, UnsupportedHeadDim) {
  REQUIRE_GPU();
  Case c = decode_case(1, 1, 1, 1, 128);
  c.Dk = 96;
  DecodeData d = make_decode_problem(c);
  try {
    run_decode_cuda(d);
    ADD_FAILURE() << "Dk = 96 was accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Dk is 96"), std::string::npos) << msg;
    EXPECT_NE(msg.find("64, 128, 256"), std::string::npos) << msg;
  }
}

// ---- gdr::forward on CUDA tensors: the same kernel over any T ----

TEST(CudaRecurrentForward, LengthsGatesLayouts) {
  REQUIRE_GPU();
  for (std::int64_t T : {1, 63, 64, 65, 200, 1000})
    for (GateKind gate : {GateKind::scalar, GateKind::per_key}) {
      Case c;
      c.B = 2;
      c.T = T;
      c.Hk = 1;
      c.Hv = 2;
      c.Dk = c.Dv = 128;
      c.gate = gate;
      c.layout = T % 2 ? StateLayout::v_first : StateLayout::k_first;
      c.h0 = T != 64;
      c.decay = T == 1000 ? Decay::strong : Decay::mild;
      check_forward(c);
    }
}

// One token on a k-first state (the one-token and ring kernels) with masked sequences: the final
// state of a masked sequence is h0 itself, written to final_state (a tensor other than h0); and
// the same without a final state (o only).
TEST(CudaRecurrentForward, OneTokenMaskedFinalState) {
  REQUIRE_GPU();
  for (GateKind gate : {GateKind::scalar, GateKind::per_key})
    for (bool final_state : {true, false}) {  // without it: o only (the ring kernel stores nothing)
      Case c;
      c.B = 16;  // ~25 % of tokens masked: some sequence is masked in all but ~1 % of draws
      c.T = 1;
      c.Hk = 1;
      c.Hv = 2;
      c.Dk = c.Dv = 128;
      c.gate = gate;
      c.layout = StateLayout::k_first;
      c.mask = true;
      c.h0 = true;
      c.final_state = final_state;
      check_forward(c);
    }
}

// 8 tokens of bf16 inputs from h0 to a separate final state (the ring kernel's chunk consumers on
// paths 13 and 14: an input and an output tensor map, the state stored even where every token is
// masked), and without a final state (no output map: o only).
TEST(CudaRecurrentForward, RingChunkFinalState) {
  REQUIRE_GPU();
  for (bool final_state : {true, false}) {
    Case c;
    c.B = 6;
    c.T = 8;
    c.Hk = 1;
    c.Hv = 2;
    c.Dk = c.Dv = 128;
    c.dtype = DType::bf16;
    c.mask = true;
    c.h0 = true;
    c.final_state = final_state;
    check_forward(c);
  }
}

TEST(CudaRecurrentForward, VarlenMaskGqaDtypes) {
  REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (bool i64 : {false, true}) {
      Case c;
      c.seqlens = {17, 0, 40, 1};
      c.cu_seqlens_i64 = i64;
      c.Hk = 1;
      c.Hv = 4;
      c.Dk = 64;
      c.Dv = 128;
      c.dtype = dtype;
      c.mask = true;
      c.gate = i64 ? GateKind::per_key : GateKind::scalar;
      c.decay = Decay::extreme;
      check_forward(c);
    }
}

TEST(CudaRecurrentForward, NoFinalStateAndFusedOptions) {
  REQUIRE_GPU();
  for (int opts = 0; opts < 4; ++opts) {
    Case c;
    c.B = 3;
    c.T = 37;
    c.Hk = 2;
    c.Hv = 4;
    c.Dk = 256;
    c.Dv = 64;
    c.final_state = opts != 0;
    c.h0 = opts != 1;
    c.gate_in_kernel = opts >= 2;
    c.beta_sigmoid = opts >= 2;
    c.qk_l2norm = opts == 3;
    c.gate = opts == 3 ? GateKind::per_key : GateKind::scalar;
    check_forward(c);
  }
}

TEST(CudaRecurrentForward, EmptyTokens) {
  REQUIRE_GPU();
  Case c;
  c.B = 2;
  c.T = 0;
  c.Hk = 1;
  c.Hv = 2;
  c.Dk = c.Dv = 64;
  check_forward(c);  // final state = h0
}

}  // namespace
}  // namespace gdr::test
