// `gdr demo --device cuda`: the seed layer's training step (forward + backward of one layer) on
// the GPU, as the torch layer runs it, for each T:
//   inputs made on the host (demo_layer.h) and copied to the device once; then per timed step
//   (the fastest of `repeats`, after one untimed warm-up): the saved-for-backward tensor is
//   allocated from the stream's memory pool (as a caching allocator would), forward
//   (Path::automatic with `saved`: the chunked forward) writes it, backward reads it.
//   time:   CUDA events around the forward and around the backward;
//   memory: the pool's high-water mark over the step (cudaMemPoolAttrUsedMemHigh, reset before):
//           the saved tensor plus gdr's scratch, i.e. the memory the step needs beyond its
//           inputs, outputs and gradients (which are cudaMalloc'ed outside the pool);
//   error:  o and every gradient against the CPU sequential path (the fp32 per-token loop of
//           docs/operator.md §2 on the same rounded inputs), for T <= --max-check-T.
// While the CUDA backward is not available in this build (gdr::backward_available), the forward
// alone is timed and the gradient columns say so.
#include "demo_layer.h"

#if GDR_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gdr::tools::demo {
namespace {

using json = nlohmann::json;

void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw RuntimeFailure(std::string("gdr demo: ") + what + ": " + cudaGetErrorString(err));
}

// Device copies of a layer's buffers (cudaMalloc, outside the stream's pool).
class DeviceLayer {
 public:
  explicit DeviceLayer(Layer& host) : host_(host) {
    const std::vector<Buffer*> all = {&host.q,    &host.k,    &host.v,  &host.g,
                                      &host.beta, &host.dout, &host.o,  &host.dq,
                                      &host.dk,   &host.dv,   &host.dg, &host.dbeta};
    for (Buffer* b : all) {
      void* p = nullptr;
      cuda_ok(cudaMalloc(&p, b->bytes()), "cudaMalloc");
      ptrs_.push_back(p);
      cuda_ok(cudaMemcpy(p, b->data(), b->bytes(), cudaMemcpyHostToDevice), "copy to the device");
    }
  }
  ~DeviceLayer() {
    for (void* p : ptrs_) cudaFree(p);
  }
  DeviceLayer(const DeviceLayer&) = delete;
  DeviceLayer& operator=(const DeviceLayer&) = delete;

  ForwardParams forward_params() const { return on_device(demo::forward_params(host_)); }
  BackwardParams backward_params() const {
    BackwardParams bp = demo::backward_params(host_);
    bp.in = forward_params().in;
    bp.dout = moved(bp.dout), bp.dq = moved(bp.dq), bp.dk = moved(bp.dk);
    bp.dv = moved(bp.dv), bp.dg = moved(bp.dg), bp.dbeta = moved(bp.dbeta);
    return bp;
  }
  // The outputs back into the host layer.
  void copy_outputs_back() {
    const std::vector<Buffer*> outs = host_.outputs();
    for (Buffer* b : outs)
      cuda_ok(cudaMemcpy(b->data(), device_of(b->data()), b->bytes(), cudaMemcpyDeviceToHost),
              "copy to the host");
  }

 private:
  ForwardParams on_device(ForwardParams fp) const {
    fp.in.q = moved(fp.in.q), fp.in.k = moved(fp.in.k), fp.in.v = moved(fp.in.v);
    fp.in.g = moved(fp.in.g), fp.in.beta = moved(fp.in.beta), fp.o = moved(fp.o);
    return fp;
  }
  // The device twin of a host view of one of the layer's buffers.
  TensorView moved(TensorView t) const {
    t.data = device_of(t.data);
    t.device = DeviceType::cuda;
    t.device_index = 0;
    return t;
  }
  void* device_of(const void* host_ptr) const {
    const std::vector<const void*> hosts = {host_.q.data(),  host_.k.data(),    host_.v.data(),
                                            host_.g.data(),  host_.beta.data(), host_.dout.data(),
                                            host_.o.data(),  host_.dq.data(),   host_.dk.data(),
                                            host_.dv.data(), host_.dg.data(),   host_.dbeta.data()};
    for (std::size_t i = 0; i < hosts.size(); ++i)
      if (hosts[i] == host_ptr) return ptrs_[i];
    throw RuntimeFailure("gdr demo: a buffer that is not the layer's");
  }
  Layer& host_;
  std::vector<void*> ptrs_;
};

struct Timed {
  double fwd_s = 1e300, bwd_s = 1e300, pool_peak_bytes = 0;
};

Timed time_steps(const DeviceLayer& dev, bool with_backward, int repeats, cudaStream_t stream) {
  ForwardParams fp = dev.forward_params();
  BackwardParams bp = dev.backward_params();
  ExecConfig cfg;
  cfg.stream = stream;
  cudaMemPool_t pool;
  cuda_ok(cudaDeviceGetMemPool(&pool, 0), "cudaDeviceGetMemPool");
  cudaEvent_t e0, e1, e2;
  cuda_ok(cudaEventCreate(&e0), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&e1), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&e2), "cudaEventCreate");
  const SavedShape shape = saved_shape(validate_forward(fp));
  Timed t;
  for (int r = 0; r <= std::max(1, repeats); ++r) {  // r = 0: warm-up, not timed
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    std::uint64_t zero = 0;
    cuda_ok(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero), "pool reset");
    cuda_ok(cudaEventRecord(e0, stream), "cudaEventRecord");
    void* saved = nullptr;
    cuda_ok(cudaMallocAsync(&saved, static_cast<std::size_t>(shape.bytes()), stream),
            "cudaMallocAsync(saved)");
    fp.saved = bp.saved = shape.view(saved);
    fp.saved.device = bp.saved.device = DeviceType::cuda;
    forward(fp, cfg);
    cuda_ok(cudaEventRecord(e1, stream), "cudaEventRecord");
    if (with_backward) backward(bp, cfg);
    cuda_ok(cudaEventRecord(e2, stream), "cudaEventRecord");
    cuda_ok(cudaFreeAsync(saved, stream), "cudaFreeAsync");
    cuda_ok(cudaStreamSynchronize(stream), "the step");
    float f_ms = 0, b_ms = 0;
    cuda_ok(cudaEventElapsedTime(&f_ms, e0, e1), "cudaEventElapsedTime");
    cuda_ok(cudaEventElapsedTime(&b_ms, e1, e2), "cudaEventElapsedTime");
    std::uint64_t high = 0;
    cuda_ok(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high), "pool high");
    if (r == 0) continue;
    t.fwd_s = std::min(t.fwd_s, f_ms / 1e3);
    t.bwd_s = std::min(t.bwd_s, b_ms / 1e3);
    t.pool_peak_bytes = std::max(t.pool_peak_bytes, static_cast<double>(high));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
  return t;
}

}  // namespace

int run_demo_cuda(const Options& d) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw InvalidArgument("gdr demo: --device cuda but no CUDA device is visible");
  if (d.heads.size() != 2) throw InvalidArgument("gdr demo: --heads takes Hk,Hv (two numbers)");
  const DType dt = parse_dtype(d.dtype);
  const bool with_backward = backward_available(DeviceType::cuda);
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const std::int64_t Hk = d.heads[0], Hv = d.heads[1];
  std::printf("gdr demo on %s: one layer, B=%lld Hk=%lld Hv=%lld Dk=%lld Dv=%lld, %s, %s\n",
              prop.name, (long long)d.batch, (long long)Hk, (long long)Hv, (long long)d.Dk,
              (long long)d.Dv, d.dtype.c_str(),
              with_backward ? "forward + backward"
                            : "forward only (the CUDA backward is not in this build yet)");
  std::printf(
      "  time: the fastest of %d steps (CUDA events); GB: the step's device memory beyond its\n"
      "  inputs, outputs and gradients (saved chunk states + scratch); err: relative error of o\n"
      "  and of the worst gradient against the CPU sequential path (fp32 per-token loop, same\n"
      "  inputs), for T <= %lld\n\n",
      d.repeats, (long long)d.max_check_T);
  std::printf("%6s | %9s %9s %9s | %8s | %8s %8s\n", "T", "fwd ms", "bwd ms", "total ms", "GB",
              "err o", "err grad");
  std::printf("%s\n", std::string(72, '-').c_str());
  std::fflush(stdout);

  json rows = json::array();
  for (const std::int64_t T : d.T) {
    Layer layer =
        make_layer({d.batch, T, Hk, Hv, d.Dk, d.Dv}, dt, d.seed + static_cast<std::uint64_t>(T));
    Timed t;
    {
      DeviceLayer dev(layer);
      t = time_steps(dev, with_backward, d.repeats, stream);
      dev.copy_outputs_back();
    }
    json err = json::object();
    double eo = NAN, eg = NAN;
    if (T <= d.max_check_T) {
      std::vector<std::vector<float>> got;
      for (Buffer* b : layer.outputs()) got.push_back(b->to_floats());
      ForwardParams fp = forward_params(layer);
      BackwardParams bp = backward_params(layer);
      ExecConfig cpu;
      cpu.path = Path::sequential;
      forward(fp, cpu);
      if (with_backward) backward(bp, cpu);
      const std::vector<Buffer*> ref = layer.outputs();
      for (std::size_t i = 0; i < ref.size(); ++i) {
        if (i > 0 && !with_backward) break;
        const double e = rel_error(got[i], ref[i]->to_floats());
        err[kOutputNames[i]] = e;
        if (i == 0)
          eo = e;
        else
          eg = std::isnan(eg) ? e : std::max(eg, e);
      }
    }
    const double total = t.fwd_s + (with_backward ? t.bwd_s : 0.0);
    char bwd[32] = "n/a";
    if (with_backward) std::snprintf(bwd, sizeof bwd, "%.3f", t.bwd_s * 1e3);
    // Errors not measured (T above the CPU check's limit) print as "-" (a measured NaN as nan).
    const bool checked = T <= d.max_check_T;
    auto error_cell = [checked](double e, char(&cell)[16]) {
      if (!checked)
        std::snprintf(cell, sizeof cell, "%8s", "-");
      else
        std::snprintf(cell, sizeof cell, "%8.1e", e);
      return cell;
    };
    char eo_cell[16], eg_cell[16];
    std::printf("%6lld | %9.3f %9s %9.3f | %8.3f | %s %s\n", (long long)T, t.fwd_s * 1e3, bwd,
                total * 1e3, t.pool_peak_bytes / 1e9, error_cell(eo, eo_cell),
                error_cell(eg, eg_cell));
    std::fflush(stdout);
    json row = {{"T", T},
                {"forward_s", t.fwd_s},
                {"step_device_bytes", t.pool_peak_bytes},
                {"rel_error_vs_cpu_sequential", err}};
    if (with_backward) row["backward_s"] = t.bwd_s;
    rows.push_back(row);
  }
  cudaStreamDestroy(stream);
  if (!d.json_path.empty()) {
    json doc = {{"command", "gdr demo --device cuda"},
                {"device", prop.name},
                {"shape", {{"B", d.batch}, {"Hk", Hk}, {"Hv", Hv}, {"Dk", d.Dk}, {"Dv", d.Dv}}},
                {"dtype", d.dtype},
                {"repeats", d.repeats},
                {"seed", d.seed},
                {"backward", with_backward},
                {"memory",
                 "high-water mark of the stream's memory pool over one step: the saved chunk "
                 "states and gdr's scratch (inputs, outputs and gradients excluded)"},
                {"rows", rows}};
    std::ofstream f(d.json_path);
    f << doc.dump(2) << "\n";
    if (!f) throw RuntimeFailure("gdr demo: cannot write " + d.json_path);
    std::printf("wrote %s\n", d.json_path.c_str());
  }
  return 0;
}

}  // namespace gdr::tools::demo

#else  // no CUDA in this build

namespace gdr::tools::demo {

int run_demo_cuda(const Options&) {
  throw InvalidArgument(
      "gdr demo: --device cuda but this build of gdr has no CUDA paths (rebuild with nvcc)");
}

}  // namespace gdr::tools::demo

#endif
