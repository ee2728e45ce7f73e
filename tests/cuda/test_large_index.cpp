// 64-bit indexing: one forward call whose q, k and v each hold more than 2^31 elements, on both
// CUDA forward paths (the recurrent kernel and the chunked forward).
//
// The call packs R copies of one small problem (L tokens, its h0 row) with cu_seqlens, so that
// every sequence must come out as the small problem's float64 reference says: the small
// problem's reference is computed once on the host, and each sequence of the big call is compared
// with it (bytes equal to sequence 0's are not compared again). The copies are made on the
// device. bf16, Hk = Hv = 16, Dk = Dv = 128: 2048 elements per token, R L = 1,050,000 tokens,
// 2.15e9 elements in each of q, k, v and o (4.3 GB each). The chunked forward's fp32 scratch
// adds ~57 GB: where the device has not that much memory free the case is skipped with the
// allocation's message (recorded), never passed silently.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_support.h"
#include "support_gtest.h"

namespace gdr::test {
namespace {

constexpr std::int64_t kTokensPerSequence = 1000;  // L: not a multiple of the chunk
constexpr std::int64_t kSequences = 1050;          // R

// A contiguous device tensor of `rows` copies of host tensor `small` (contiguous, first dim 1),
// one after the other: shape [rows, ...] (along_tokens false: state rows) or [1, rows * T, ...]
// (along_tokens true: the token axis).
TensorView tile_to_device(DeviceMirror& m, const HostTensor& small, std::int64_t rows,
                          bool along_tokens) {
  TensorView big = small.view();
  EXPECT_EQ(big.shape[0], 1);
  big.shape[along_tokens ? 1 : 0] *= rows;
  for (int i = big.rank - 1; i > 0; --i) big.stride[i - 1] = big.stride[i] * big.shape[i];
  const std::size_t bytes = span_bytes(small.view());
  TensorView d = m.allocate(big);
  for (std::int64_t r = 0; r < rows; ++r)
    cuda_check(cudaMemcpy(static_cast<char*>(d.data) + r * bytes, small.data(), bytes,
                          cudaMemcpyHostToDevice),
               "tile");
  return d;
}

// Sequence r of a big device output, as doubles in the small tensor's shape; `bytes_of_first`
// keeps sequence 0's bytes, and a sequence with the same bytes returns false (nothing to check).
bool sequence_values(const std::vector<unsigned char>& big, std::int64_t r, HostTensor& small,
                     std::vector<unsigned char>& first, std::vector<double>& out) {
  const std::size_t bytes = span_bytes(small.view());
  const unsigned char* at = big.data() + r * bytes;
  if (r == 0) first.assign(at, at + bytes);
  if (r > 0 && std::memcmp(at, first.data(), bytes) == 0) return false;
  std::memcpy(small.data(), at, bytes);
  out = small.to_double();
  return true;
}

void check_large(Path path) {
  Case c;
  c.B = 1;
  c.T = kTokensPerSequence;
  c.Hk = 16, c.Hv = 16, c.Dk = 128, c.Dv = 128;
  c.dtype = DType::bf16;
  c.decay = Decay::strong;
  TestData d = make_problem(c);
  const ForwardResult ref = reference_forward(d);
  const std::string label = describe(d.c, d.seed) + " x " + std::to_string(kSequences) + " " +
                            std::string(to_string(path));

  DeviceMirror m;
  ForwardParams p = d.forward_params();
  p.in.q = tile_to_device(m, d.q, kSequences, true);
  p.in.k = tile_to_device(m, d.k, kSequences, true);
  p.in.v = tile_to_device(m, d.v, kSequences, true);
  p.in.g = tile_to_device(m, d.g, kSequences, true);
  p.in.beta = tile_to_device(m, d.beta, kSequences, true);
  p.in.h0 = tile_to_device(m, d.h0, kSequences, false);
  d.o.poison();
  d.final_state.poison();
  p.o = tile_to_device(m, d.o, kSequences, true);
  p.final_state = tile_to_device(m, d.final_state, kSequences, false);
  HostTensor cu(DType::i64, {kSequences + 1});
  for (std::int64_t r = 0; r <= kSequences; ++r)
    cu.set(r, static_cast<double>(r * kTokensPerSequence));
  p.in.cu_seqlens = m.to_device(cu.view());
  ASSERT_GT(p.in.q.numel(), std::int64_t{1} << 31) << label;
  ASSERT_GT(p.in.v.numel(), std::int64_t{1} << 31) << label;

  ExecConfig cfg;
  cfg.path = path;
  try {
    forward(p, cfg);
    cuda_check(cudaDeviceSynchronize(), "forward");
  } catch (const RuntimeFailure& e) {
    const std::string what = e.what();
    if (what.find("out of memory") != std::string::npos)
      GTEST_SKIP() << label << ": not enough device memory for this path: " << what;
    throw;
  }

  std::vector<unsigned char> o_big(span_bytes(p.o)), s_big(span_bytes(p.final_state));
  cuda_check(cudaMemcpy(o_big.data(), p.o.data, o_big.size(), cudaMemcpyDeviceToHost), "o");
  cuda_check(cudaMemcpy(s_big.data(), p.final_state.data, s_big.size(), cudaMemcpyDeviceToHost),
             "final state");
  std::vector<unsigned char> o_first, s_first;
  int checked = 0;
  for (std::int64_t r = 0; r < kSequences; ++r) {
    ForwardResult got;
    const bool o_new = sequence_values(o_big, r, d.o, o_first, got.o);
    const bool s_new = sequence_values(s_big, r, d.final_state, s_first, got.final_state);
    if (!o_new && !s_new) continue;
    if (!o_new) got.o = ref.o;  // equal to sequence 0's, checked there
    if (!s_new) got.final_state = ref.final_state;
    ++checked;
    expect_forward_close(got, ref, forward_tolerance(d.c),
                         label + " sequence " + std::to_string(r));
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("[large index] %s: %d of %lld sequences differed from sequence 0 and were checked\n",
              label.c_str(), checked, static_cast<long long>(kSequences));
}

TEST(CudaLargeIndex, RecurrentForward) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  check_large(Path::sequential);
}

TEST(CudaLargeIndex, ChunkedForward) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  check_large(Path::chunkwise);
}

}  // namespace
}  // namespace gdr::test
