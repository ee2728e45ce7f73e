// The CUDA decode plan (src/cuda/decode/plan.h) on the CPU: for the decode benchmark's shapes
// (Hk = 16, Hv = 32, Dk = Dv = 128, bf16 inputs, a contiguous k-first pool, 132 SMs) the plan
// names the kernel, block, grid and schedule that the launcher chose before the plan existed
// (derived by hand from that code, docs/cuda-decode.md §Dispatch table), under the H200's
// occupancy: the staged and one-token kernels 16 warps per SM, the chunk kernel 2 blocks of 8
// warps or 4 of 4 per SM, the ring kernel 1 block per SM. Also the overrides' fallbacks, and the
// CUDA-only validation of the core (src/core/cuda_support.h) with its messages.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/cuda_support.h"
#include "cuda/decode/plan.h"
#include "gdr/decode_overrides.h"
#include "gdr/error.h"
#include "gdr/problem.h"
#include "support_gtest.h"

namespace gdr::test {
namespace {

using cuda::DecodePlan;
using cuda::DecodeProblem;
using cuda::DeviceFacts;

constexpr int kSMs = 132;

DeviceFacts h200() {
  DeviceFacts d;
  d.sm_count = kSMs;
  d.blocks_per_sm = [](const DecodeProblem&, const DecodePlan& plan) {
    switch (plan.kernel) {
      case DecodeKernel::ring: return 1;
      case DecodeKernel::chunk: return plan.warps == 8 ? 2 : 4;
      case DecodeKernel::slice: return 0;  // not asked
      default: return 16 / plan.warps;
    }
  };
  return d;
}

// A decode call of the benchmark: B sequences of T tokens on a contiguous fp32 or bf16 pool.
DecodeProblem bench(std::int64_t B, std::int64_t T, bool bf16_pool = false, bool per_key = false) {
  DecodeProblem p;
  p.N = B;
  p.T = T;
  p.Hv = 32;
  p.Dk = p.Dv = 128;
  p.dtype = DType::bf16;
  p.per_key = per_key;
  p.state_bf16 = bf16_pool;
  return p;
}

DecodePlan plan(const DecodeProblem& p, const DecodeOverrides& ov = {}) {
  return cuda::plan_decode(p, h200(), ov);
}

std::string where(const DecodeProblem& p) {
  return "B = " + std::to_string(p.N) + ", T = " + std::to_string(p.T) +
         (p.state_bf16 ? ", bf16 pool" : ", fp32 pool") + (p.per_key ? ", per-key gate" : "");
}

// The staged / one-token kernels' plan: kernel, warps, blocks, resident blocks, prefetch
// distances and the load policy.
void expect_staged(const DecodeProblem& p, DecodeKernel kernel, int warps, std::int64_t blocks,
                   std::int64_t resident, int prefetch_blocks, int prefetch_wave,
                   bool loads_normal) {
  const DecodePlan got = plan(p);
  SCOPED_TRACE(where(p));
  EXPECT_EQ(got.kernel, kernel);
  EXPECT_EQ(got.warps, warps);
  EXPECT_EQ(got.blocks, blocks);
  EXPECT_EQ(got.items, blocks);
  EXPECT_EQ(got.resident, resident);
  EXPECT_EQ(got.prefetch_blocks, prefetch_blocks);
  EXPECT_EQ(got.prefetch_wave, prefetch_wave);
  EXPECT_EQ(got.state_loads_normal, loads_normal);
  EXPECT_TRUE(got.token_units);
  EXPECT_TRUE(got.pdl);
}

void expect_chunk(const DecodeProblem& p, int columns, std::int64_t items, std::int64_t blocks,
                  bool first_late, bool dynamic) {
  const DecodePlan got = plan(p);
  SCOPED_TRACE(where(p));
  EXPECT_EQ(got.kernel, DecodeKernel::chunk);
  EXPECT_EQ(got.columns, columns);
  EXPECT_EQ(got.warps, columns / 16);
  EXPECT_EQ(got.items, items);
  EXPECT_EQ(got.blocks, blocks);
  EXPECT_EQ(got.chunk_first_late, first_late);
  EXPECT_EQ(got.chunk_dynamic, dynamic);
  EXPECT_EQ(got.prefetch_blocks, 0);
  EXPECT_FALSE(got.state_loads_normal);
  EXPECT_TRUE(got.pdl);
}

void expect_ring(const DecodeProblem& p, bool chunk_math, std::int64_t items,
                 std::int64_t dynamic_round, bool setup_early) {
  const DecodePlan got = plan(p);
  SCOPED_TRACE(where(p));
  EXPECT_EQ(got.kernel, DecodeKernel::ring);
  EXPECT_EQ(got.ring_chunk_math, chunk_math);
  EXPECT_EQ(got.warps, chunk_math ? 10 : 9);
  EXPECT_EQ(got.columns, 128);
  EXPECT_EQ(got.items, items);
  EXPECT_EQ(got.resident, kSMs);
  EXPECT_EQ(got.blocks, kSMs);
  EXPECT_EQ(got.ring_dynamic_round, dynamic_round);
  EXPECT_EQ(got.ring_setup_early, setup_early);
  EXPECT_FALSE(got.state_loads_normal);
  EXPECT_TRUE(got.pdl);
}

TEST(DecodePlan, OneTokenFp32Pool) {
  // The one-token kernel below 3 items per SM and above 8; the ring kernel between (B = 32).
  expect_staged(bench(1, 1), DecodeKernel::one_token, 1, 256, 2112, 0, 0, false);
  expect_staged(bench(8, 1), DecodeKernel::one_token, 1, 2048, 2112, 0, 0, false);
  expect_ring(bench(32, 1), false, 1024, 0, true);
  expect_staged(bench(128, 1), DecodeKernel::one_token, 4, 8192, 528, 264, 0, true);
  expect_staged(bench(256, 1), DecodeKernel::one_token, 4, 16384, 528, 264, 0, true);
}

TEST(DecodePlan, EightTokensFp32Pool) {
  // The slice kernel at B = 1, the chunk kernel at B = 8, the ring kernel with its chunk
  // consumers from B = 32 (dynamic items in the last round at B = 32, from round 3 beyond).
  const DecodePlan one = plan(bench(1, 8));
  EXPECT_EQ(one.kernel, DecodeKernel::slice);
  EXPECT_EQ(one.warps, 5);
  EXPECT_EQ(one.columns, 32);
  EXPECT_EQ(one.blocks, 128);
  EXPECT_EQ(one.prefetch_blocks, 0);
  expect_chunk(bench(8, 8), 128, 256, 256, true, false);
  expect_ring(bench(32, 8), true, 1024, 7, true);
  expect_ring(bench(128, 8), true, 4096, 3, false);
  expect_ring(bench(256, 8), true, 8192, 3, false);
}

TEST(DecodePlan, Bf16Pool) {
  // The ring and slice kernels read an fp32 state only: the one-token kernel at T = 1 (2 warps
  // and the half-wave prefetch from B = 32, the default load policy from 8 waves), the chunk
  // kernel at T = 8 (64-column items at B = 1, dynamic items beyond 8 per block).
  expect_staged(bench(1, 1, true), DecodeKernel::one_token, 1, 256, 2112, 0, 0, false);
  expect_staged(bench(8, 1, true), DecodeKernel::one_token, 1, 2048, 2112, 0, 0, false);
  expect_staged(bench(32, 1, true), DecodeKernel::one_token, 2, 4096, 1056, 528, 0, false);
  expect_staged(bench(128, 1, true), DecodeKernel::one_token, 4, 8192, 528, 264, 0, true);
  expect_staged(bench(256, 1, true), DecodeKernel::one_token, 4, 16384, 528, 264, 0, true);
  expect_chunk(bench(1, 8, true), 64, 64, 64, true, false);
  expect_chunk(bench(8, 8, true), 128, 256, 256, true, false);
  expect_chunk(bench(32, 8, true), 128, 1024, 264, true, false);
  expect_chunk(bench(128, 8, true), 128, 4096, 264, false, true);
  expect_chunk(bench(256, 8, true), 128, 8192, 264, false, true);
}

TEST(DecodePlan, PerKeyGate) {
  // T = 1: the ring kernel between 3 and 16 items per SM (B = 32), the one-token kernel else.
  expect_staged(bench(1, 1, false, true), DecodeKernel::one_token, 1, 256, 2112, 0, 0, false);
  expect_staged(bench(8, 1, false, true), DecodeKernel::one_token, 1, 2048, 2112, 0, 0, false);
  expect_ring(bench(32, 1, false, true), false, 1024, 0, true);
  expect_staged(bench(128, 1, false, true), DecodeKernel::one_token, 4, 8192, 528, 264, 0, true);
  expect_staged(bench(256, 1, false, true), DecodeKernel::one_token, 4, 16384, 528, 264, 0, true);
  // T = 2 and 4: the staged kernel's narrow tile at B = 1 (4 warps of 8 columns), the ring
  // kernel (token by token) from 1.5 items per SM.
  for (std::int64_t T : {2, 4}) {
    const DecodeProblem b1 = bench(1, T, false, true);
    const DecodePlan p1 = plan(b1);
    SCOPED_TRACE(where(b1));
    EXPECT_EQ(p1.kernel, DecodeKernel::staged_narrow);
    EXPECT_EQ(p1.warps, 4);
    EXPECT_EQ(p1.columns, 32);
    EXPECT_EQ(p1.blocks, 128);
    EXPECT_EQ(p1.prefetch_blocks, 0);
    EXPECT_EQ(p1.prefetch_wave, 0);
    EXPECT_FALSE(p1.state_loads_normal);
    expect_ring(bench(8, T, false, true), false, 256, 0, true);
    expect_ring(bench(32, T, false, true), false, 1024, 0, true);
    expect_ring(bench(128, T, false, true), false, 4096, 3, false);
    expect_ring(bench(256, T, false, true), false, 8192, 3, false);
  }
}

TEST(DecodePlan, RingMapsUnavailable) {
  // Where tensor maps cannot describe the tensors, no chunk consumers: at T = 8 the ring kernel
  // is then not preferred and the chunk kernel runs (static items, the first wait late).
  DecodeProblem p = bench(32, 8);
  p.ring_maps_ok = false;
  const DecodePlan got = plan(p);
  EXPECT_EQ(got.kernel, DecodeKernel::chunk);
  EXPECT_EQ(got.columns, 128);
  EXPECT_EQ(got.blocks, 264);
  EXPECT_FALSE(got.chunk_dynamic);
  EXPECT_TRUE(got.chunk_first_late);
  // Rows not one item wide (a padded pool): no ring kernel at T = 1 either.
  DecodeProblem padded = bench(32, 1);
  padded.ring_items_contiguous = false;
  EXPECT_EQ(plan(padded).kernel, DecodeKernel::one_token);
}

TEST(DecodePlan, ForwardWithoutInitialState) {
  // gdr::forward without h0 reads no state: no ring kernel, no prefetch; many tokens of a
  // (varlen) forward take the staged kernel.
  DecodeProblem p = bench(32, 1);
  p.reads_state = false;
  p.state_in_rows16 = false;
  const DecodePlan got = plan(p);
  EXPECT_EQ(got.kernel, DecodeKernel::one_token);
  EXPECT_EQ(got.prefetch_blocks, 0);
  EXPECT_EQ(got.prefetch_wave, 0);
  DecodeProblem varlen = bench(1, 1000);
  varlen.N = 4;
  varlen.varlen = true;
  const DecodePlan v = plan(varlen);
  EXPECT_EQ(v.kernel, DecodeKernel::staged);  // 128 heads x 8 warps: the narrow tile not below 2
  EXPECT_EQ(v.warps, 4);                      // blocks of 8 warps would be fewer than 2 per SM
}

TEST(DecodePlan, Overrides) {
  DecodeOverrides ov;
  // The ring kernel forced where it does not apply (a bf16 pool): the rules.
  ov.kernel = DecodeKernel::ring;
  EXPECT_EQ(plan(bench(8, 8, true), ov).kernel, DecodeKernel::chunk);
  // Forced where it applies but is not preferred: the ring, with chunk consumers at T = 8.
  const DecodePlan ring = plan(bench(8, 8), ov);
  EXPECT_EQ(ring.kernel, DecodeKernel::ring);
  EXPECT_TRUE(ring.ring_chunk_math);
  ov.ring_math = 1;
  EXPECT_FALSE(plan(bench(8, 8), ov).ring_chunk_math);
  ov.ring_math = 0;
  ov.persistent_blocks = 2;
  ov.ring_schedule = 3;  // dynamic after the full rounds: 256 items on 2 blocks
  const DecodePlan capped = plan(bench(8, 1), ov);
  EXPECT_EQ(capped.blocks, 2);
  EXPECT_EQ(capped.ring_dynamic_round, 128);
  ov = {};
  // The chunk kernel forced where it does not apply (a per-key gate): the staged kernel's usual
  // tile, not the narrow one.
  ov.kernel = DecodeKernel::chunk;
  EXPECT_EQ(plan(bench(1, 4, false, true), ov).kernel, DecodeKernel::staged);
  // Items of 32 columns are gone: the rule's columns.
  ov.chunk_columns = 32;
  EXPECT_EQ(plan(bench(8, 8), ov).columns, 128);
  ov.chunk_columns = 64;
  EXPECT_EQ(plan(bench(8, 8), ov).columns, 64);
  ov.chunk_schedule = 2;
  ov.chunk_first_wait = 2;
  const DecodePlan chunk = plan(bench(8, 8), ov);
  EXPECT_TRUE(chunk.chunk_dynamic);
  EXPECT_FALSE(chunk.chunk_first_late);
  ov = {};
  // The staged kernel forced on a bf16 pool at T = 1: the one-token kernel (the staged kernel
  // reads a bf16 pool only beyond it).
  ov.kernel = DecodeKernel::staged;
  EXPECT_EQ(plan(bench(8, 1, true), ov).kernel, DecodeKernel::one_token);
  EXPECT_EQ(plan(bench(8, 1), ov).kernel, DecodeKernel::staged);
  // Warps: a width that divides the head's warps, else the rule.
  ov.warps = 2;
  EXPECT_EQ(plan(bench(8, 1), ov).warps, 2);
  ov.warps = 3;
  EXPECT_EQ(plan(bench(8, 1), ov).warps, 4);
  ov = {};
  // Prefetch: 1 off, 2 every block, 3 (gone) the rule; loads and pdl.
  ov.prefetch = 2;
  EXPECT_EQ(plan(bench(8, 1), ov).prefetch_blocks, 1);
  ov.prefetch = 1;
  EXPECT_EQ(plan(bench(128, 1), ov).prefetch_blocks, 0);
  ov.prefetch = 3;
  EXPECT_EQ(plan(bench(128, 1), ov).prefetch_blocks, 264);
  ov.state_loads = 1;
  EXPECT_FALSE(plan(bench(128, 1), ov).state_loads_normal);
  ov.pdl = 1;
  EXPECT_FALSE(plan(bench(128, 1), ov).pdl);
}

// ---- the CUDA-only validation of the core ----

Problem cuda_problem(std::int64_t D) {
  Problem prob;
  prob.B = prob.N = 1;
  prob.T = 1;
  prob.Hk = prob.Hv = 2;
  prob.Dk = prob.Dv = D;
  prob.dtype = DType::bf16;
  prob.device = DeviceType::cuda;
  return prob;
}

TEST(CudaSupport, Messages) {
  DecodeParams p;
  std::uint16_t x = 0;
  float s = 0.f;
  p.q = TensorView::contiguous(&x, DType::bf16, {1, 1, 2, 128}, DeviceType::cuda);
  p.state = TensorView::contiguous(&s, DType::f32, {1, 2, 128, 128}, DeviceType::cuda);
  EXPECT_EQ(refusal([&] { validate_cuda_decode(cuda_problem(128), p, "gdr.decode"); }), "");
  EXPECT_EQ(refusal([&] { validate_cuda_decode(cuda_problem(96), p, "gdr.decode"); }),
            "gdr.decode: Dk is 96; the CUDA recurrent kernel supports 64, 128, 256");
  p.state.dtype = DType::f16;
  EXPECT_EQ(refusal([&] { validate_cuda_decode(cuda_problem(128), p, "gdr.decode"); }),
            "gdr.decode: state has dtype float16; on cuda supported: float32, bfloat16");
  ForwardParams f;
  f.in.q = p.q;
  f.in.h0 = TensorView::contiguous(&x, DType::bf16, {1, 2, 128, 128}, DeviceType::cuda);
  const ExecConfig config;
  EXPECT_EQ(refusal([&] {
              validate_cuda_forward(cuda_problem(128), f, Path::sequential, config, "gdr.forward");
            }),
            "gdr.forward: h0 must be float32");
  f.in.h0 = TensorView{};
  EXPECT_EQ(refusal([&] {
              validate_cuda_forward(cuda_problem(96), f, Path::chunkwise, config, "gdr.forward");
            }),
            "gdr.forward: Dk is 96; the CUDA chunked forward supports 64, 128, 256");
  ExecConfig chunk32;
  chunk32.chunk_size = 32;
  EXPECT_EQ(refusal([&] {
              validate_cuda_forward(cuda_problem(128), f, Path::chunkwise, chunk32, "gdr.forward");
            }),
            "gdr.forward: chunk_size is 32; the CUDA chunked forward runs chunks of 64");
  // The backward leaves saved's dtype to validate_saved (bf16 chunk states are allowed there
  // under 16-bit inputs) and keeps the fp32-only rule for the state-shaped gradients.
  BackwardParams b;
  b.in.q = p.q;
  b.saved = TensorView::contiguous(&x, DType::bf16, {1, 2, 128 * 128}, DeviceType::cuda);
  EXPECT_EQ(refusal([&] { validate_cuda_backward(cuda_problem(128), b, config, "gdr.backward"); }),
            "");
  b.dh0 = TensorView::contiguous(&x, DType::bf16, {1, 2, 128, 128}, DeviceType::cuda);
  EXPECT_EQ(refusal([&] { validate_cuda_backward(cuda_problem(128), b, config, "gdr.backward"); }),
            "gdr.backward: dh0 has dtype bfloat16; on cuda it must be float32");
}

}  // namespace
}  // namespace gdr::test
