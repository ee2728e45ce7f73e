// The layer that `gdr demo` runs (the seed layer: one gated delta rule layer, forward + backward)
// on the CPU (demo.cpp) and on CUDA (demo_cuda.cpp): its options, inputs and outputs in
// contiguous host buffers of the demo's dtype, generated from a seed:
//   q ~ N(0, 1), k rows ~ N(0, 1) L2-normalised, v ~ N(0, 1), g = -0.2 U(0, 1) (mild decay),
//   beta ~ U(0, 1), dout ~ N(0, 1); g and beta in float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gdr/gdr.h"

namespace gdr::tools::demo {

struct Options {
  std::string device = "cpu";  // cpu | cuda
  std::vector<std::int64_t> T{512, 1024, 2048, 4096};
  std::vector<std::int64_t> heads{16, 32};  // Hk, Hv
  std::int64_t Dk = 128, Dv = 128;
  std::string dtype = "f32";
  int threads = 0;
  std::int64_t batch = 1;
  int repeats = 2;  // timed runs per (path, T); the fastest is reported
  double max_sequential_s = 60.0;
  std::int64_t max_check_T = 8192;  // cuda: compare with the CPU sequential path up to this T
  std::uint64_t seed = 20261129;
  std::string json_path;
};

DType parse_dtype(const std::string& s);

// A contiguous host buffer of one dtype (f32, f64, bf16, f16).
class Buffer {
 public:
  Buffer(DType dtype, std::vector<std::int64_t> shape);
  std::int64_t size() const { return n_; }
  std::size_t bytes() const { return bytes_.size(); }
  DType dtype() const { return dtype_; }
  void* data() { return bytes_.data(); }
  void set(std::int64_t i, double x);
  float get(std::int64_t i) const;
  std::vector<float> to_floats() const;
  TensorView view();  // contiguous, on the CPU

 private:
  DType dtype_;
  std::vector<std::int64_t> shape_;
  std::int64_t n_ = 0;
  std::vector<unsigned char> bytes_;
};

struct LayerShape {
  std::int64_t B = 1, T = 512, Hk = 16, Hv = 32, Dk = 128, Dv = 128;
};

// Inputs, the gradient seed and zero-filled outputs of one layer call.
struct Layer {
  Buffer q, k, v, g, beta, dout;
  Buffer o, dq, dk, dv, dg, dbeta;
  // The outputs in the order of output_names().
  std::vector<Buffer*> outputs() { return {&o, &dq, &dk, &dv, &dg, &dbeta}; }
};
inline constexpr const char* kOutputNames[] = {"o", "dq", "dk", "dv", "dg", "dbeta"};

Layer make_layer(const LayerShape& s, DType dtype, std::uint64_t seed);

// forward / backward params over a layer's buffers as they are (host memory).
ForwardParams forward_params(Layer& l);
BackwardParams backward_params(Layer& l);

// ||a - ref|| / ||ref|| (NaN when the sizes differ or ref is empty).
double rel_error(const std::vector<float>& a, const std::vector<float>& ref);

// `gdr demo --device cuda` (demo_cuda.cpp; on a build without CUDA it refuses).
int run_demo_cuda(const Options& d);

}  // namespace gdr::tools::demo
