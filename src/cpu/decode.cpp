// The CPU decode step: T (1..16) tokens for each of B sequences, the recurrence of docs/operator.md
// Section 2 with the state updated in place in a pool.
//
//   state [P, Hv, Dk, Dv] (k-first) or [P, Hv, Dv, Dk] (v-first), f32 or bf16 (computed in
//   fp32, stored rounded to nearest even)
//   sequence b uses pool row r = state_indices[b] (or b without indices); r < 0 skips b: its
//   o rows are written as 0 and no state row is read or written.
//
// Parallel over (sequence, value head): each item loads its pool row into a private [Dk, Dv]
// buffer (fp32, or double for f64 inputs), runs the per-token loop of sequential_kernel.h and
// stores the row back. The inputs go through the same canonical helpers as the other CPU paths
// (fused gate, sigmoid and L2-norm options, mask), viewed as B sequences of T tokens.
#include <omp.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <vector>

#include "cpu/canonical.h"
#include "cpu/paths.h"
#include "cpu/sequential_head.h"

namespace gdr::cpu {
namespace {

using std::int64_t;

int64_t pool_row(const DecodeParams& p, int64_t b) {
  if (!p.state_indices.defined()) return b;
  const TensorView& idx = p.state_indices;
  const int64_t off = b * idx.stride[0];
  if (idx.dtype == DType::i32) return static_cast<const std::int32_t*>(idx.data)[off];
  return static_cast<const std::int64_t*>(idx.data)[off];
}

template <class Real>
void decode_impl(const Problem& prob, const DecodeParams& p, const ExecConfig& config) {
  const int64_t B = prob.B, T = prob.T, Hv = prob.Hv, Dk = prob.Dk, Dv = prob.Dv;
  const Inputs in = p.inputs();

  std::exception_ptr error;
  std::mutex error_mutex;
  const int threads = config.num_threads > 0 ? config.num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t item = 0; item < B * Hv; ++item) {
    try {
      const int64_t b = item / Hv, hv = item % Hv;
      const SequenceSpan seq{b, 0, T};
      std::vector<Real> o(static_cast<std::size_t>(T * Dv), Real(0));
      const int64_t row = pool_row(p, b);
      if (row >= 0 && T > 0) {
        std::vector<Real> S(static_cast<std::size_t>(Dk * Dv));
        load_state<Real>(prob, p.state, p.opts, row, hv, S.data());
        forward_one_head<Real>(prob, in, p.opts, seq, hv, S.data(), o.data());
        store_state<Real>(prob, p.opts, row, hv, S.data(), p.state);
      }
      if (T > 0) store_output<Real>(prob, in, seq, hv, o.data(), p.o);  // zeros when skipped
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

void decode(const Problem& prob, const DecodeParams& p, const ExecConfig& config) {
  if (prob.dtype == DType::f64)
    decode_impl<double>(prob, p, config);
  else
    decode_impl<float>(prob, p, config);
}

}  // namespace gdr::cpu
