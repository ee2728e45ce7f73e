// The CPU sequential path: the per-token loop of docs/operator.md §2 in fp32 (double for f64
// inputs), forward and backward. The math of one (sequence, value head) is in
// sequential_kernel.h; this file moves the data through the canonical helpers and spreads the
// work over OpenMP threads.
//
// Forward: parallel over (sequence, value head). Each item loads q_hat, k_hat of its key head,
// v, the gates and h0, runs the loop with the state S [Dk, Dv] in a private buffer, and stores
// o and the final state.
//
// Backward: parallel over (sequence, key head), so that the key gradients of the Hv / Hk value
// heads sharing a key head are summed in one private buffer without atomics. Per value head the
// memory is O(L / C) states of Dk x Dv (saved every C = config.chunk_size tokens) plus C states
// for the chunk being reversed; never one state per token.
#include <omp.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <vector>

#include "cpu/canonical.h"
#include "cpu/paths.h"
#include "cpu/sequential_head.h"
#include "cpu/sequential_kernel.h"
#include "gdr/error.h"

namespace gdr::cpu {
namespace {

using std::int64_t;

int thread_count(const ExecConfig& config) {
  return config.num_threads > 0 ? config.num_threads : omp_get_max_threads();
}

// Keeps the first exception thrown inside an OpenMP loop; rethrown after the loop.
class FirstError {
 public:
  template <class F>
  void run(F&& f) {
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
};

template <class T>
std::vector<T> buffer(int64_t n) {
  return std::vector<T>(static_cast<std::size_t>(n));
}

template <class Real>
void forward_impl(const Problem& prob, const ForwardParams& p, const ExecConfig& config) {
  const int64_t N = prob.N, Hv = prob.Hv, Dk = prob.Dk, Dv = prob.Dv;
  std::vector<SequenceSpan> spans(static_cast<std::size_t>(N));
  for (int64_t n = 0; n < N; ++n) spans[n] = sequence_span(prob, p.in, n);

  FirstError error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(thread_count(config))
  for (int64_t item = 0; item < N * Hv; ++item) {
    error.run([&] {
      const int64_t n = item / Hv, hv = item % Hv;
      const SequenceSpan& seq = spans[n];
      auto S = buffer<Real>(Dk * Dv), o = buffer<Real>(seq.len * Dv);
      load_state<Real>(prob, p.in.h0, p.opts, n, hv, S.data());
      if (seq.len > 0) {
        forward_one_head<Real>(prob, p.in, p.opts, seq, hv, S.data(), o.data());
        store_output<Real>(prob, p.in, seq, hv, o.data(), p.o);
      }
      if (p.final_state.defined()) store_state<Real>(prob, p.opts, n, hv, S.data(), p.final_state);
    });
  }
  error.rethrow();
}

template <class Real>
void backward_impl(const Problem& prob, const BackwardParams& p, const ExecConfig& config) {
  const int64_t N = prob.N, Hk = prob.Hk, Hv = prob.Hv, Dk = prob.Dk, Dv = prob.Dv;
  const int64_t group = prob.group();
  const bool per_key = prob.gate == GateKind::per_key;
  const int64_t gw = per_key ? Dk : 1;
  const int64_t C = config.chunk_size;
  const bool gate_params = p.opts.gate_in_kernel;
  std::vector<SequenceSpan> spans(static_cast<std::size_t>(N));
  for (int64_t n = 0; n < N; ++n) spans[n] = sequence_span(prob, p.in, n);
  // Per-sequence contributions to dA_log [Hv] and ddt_bias [Hv, gw], summed after the loop.
  std::vector<double> dA_part(gate_params ? N * Hv : 0, 0.0);
  std::vector<double> ddt_part(gate_params ? N * Hv * gw : 0, 0.0);

  FirstError error;
#pragma omp parallel num_threads(thread_count(config))
  {
    seq::BackwardScratch<Real> scratch;  // per thread, reused across its heads
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < N * Hk; ++item) {
      error.run([&] {
        const int64_t n = item / Hk, hk = item % Hk;
        const SequenceSpan& seq = spans[n];
        const int64_t L = seq.len;
        auto q = buffer<Real>(L * Dk), k = buffer<Real>(L * Dk);
        std::vector<Real> dq(static_cast<std::size_t>(L * Dk), Real(0));
        std::vector<Real> dk(static_cast<std::size_t>(L * Dk), Real(0));
        auto v = buffer<Real>(L * Dv), g = buffer<Real>(L * gw), beta = buffer<Real>(L);
        auto dO = buffer<Real>(L * Dv), dv = buffer<Real>(L * Dv), dg = buffer<Real>(L * gw);
        auto dbeta = buffer<Real>(L), S0 = buffer<Real>(Dk * Dv), dS = buffer<Real>(Dk * Dv);
        if (L > 0) load_keys<Real>(prob, p.in, p.opts, seq, hk, q.data(), k.data());
        for (int64_t hv = hk * group; hv < (hk + 1) * group; ++hv) {
          load_state<Real>(prob, p.in.h0, p.opts, n, hv, S0.data());
          load_state<Real>(prob, p.dfinal_state, p.opts, n, hv, dS.data());
          if (L > 0) {
            load_values<Real>(prob, p.in, seq, hv, v.data());
            load_gates<Real>(prob, p.in, p.opts, seq, hv, g.data(), beta.data());
            load_dout<Real>(prob, p.in, seq, hv, p.dout, dO.data());
            const seq::Head<Real> h =
                head_view<Real>(prob, L, q.data(), k.data(), v.data(), g.data(), beta.data());
            seq::backward_head(h, S0.data(), dO.data(), C, dS.data(), dq.data(), dk.data(),
                               dv.data(), dg.data(), dbeta.data(), scratch);
            if (p.dv.defined()) store_value_grads<Real>(prob, p.in, seq, hv, dv.data(), p.dv);
            store_gate_grads<Real>(prob, p.in, p.opts, seq, hv, dg.data(), dbeta.data(), p.dg,
                                   p.dbeta, gate_params ? &dA_part[n * Hv + hv] : nullptr,
                                   gate_params ? &ddt_part[(n * Hv + hv) * gw] : nullptr);
          }
          if (p.dh0.defined()) store_state<Real>(prob, p.opts, n, hv, dS.data(), p.dh0);
        }
        if (L > 0)
          store_key_grads<Real>(prob, p.in, p.opts, seq, hk, dq.data(), dk.data(), p.dq, p.dk);
      });
    }
  }
  error.rethrow();

  if (gate_params) {
    std::vector<double> dA_sum(Hv, 0.0), ddt_sum(Hv * gw, 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t x = 0; x < Hv; ++x) {
        dA_sum[x] += dA_part[n * Hv + x];
        for (int64_t i = 0; i < gw; ++i) ddt_sum[x * gw + i] += ddt_part[(n * Hv + x) * gw + i];
      }
    store_gate_param_grads(prob, dA_sum.data(), ddt_sum.data(), p.dA_log, p.ddt_bias);
  }
}

}  // namespace

void sequential_forward(const Problem& prob, const ForwardParams& p, const ExecConfig& config) {
  if (prob.dtype == DType::f64)
    forward_impl<double>(prob, p, config);
  else
    forward_impl<float>(prob, p, config);
}

void sequential_backward(const Problem& prob, const BackwardParams& p, const ExecConfig& config) {
  if (prob.dtype == DType::f64)
    backward_impl<double>(prob, p, config);
  else
    backward_impl<float>(prob, p, config);
}

}  // namespace gdr::cpu
