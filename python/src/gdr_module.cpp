// gdr._C: the Python binding of the gdr core (nanobind). It only converts: DLPack tensors
// (torch, numpy, ...; CPU or CUDA) become gdr::TensorView (pointer, dtype, device, shape, int64
// strides in elements), keyword options become gdr::Options / gdr::ExecConfig, and the core runs
// with the GIL released. Output tensors are allocated by the caller (python/gdr/_ops.py).
// The core validates every shape, dtype, device and value; this module validates only what it
// converts (DLPack dtypes and devices, the state_layout and path strings), in the core's
// message style. Every message of a call starts with its `op` argument (the public Python
// function its caller called, e.g. gdr.chunk_gated_delta_rule; ExecConfig::op_name in the
// core). gdr::InvalidArgument reaches Python as ValueError and gdr::RuntimeFailure as
// RuntimeError, with the message unchanged.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gdr/decode_overrides.h"
#include "gdr/gdr.h"

namespace nb = nanobind;

namespace {

// Inputs may be read-only (numpy); outputs must be writable.
using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;
using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw gdr::InvalidArgument(std::string(op) + ": " + what);
}

std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  const char* kind = "code";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
    default: break;
  }
  std::string s = std::string(kind) + std::to_string(dt.bits);
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

gdr::DType to_dtype(nb::dlpack::dtype dt, const char* op, const char* name) {
  using C = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    switch (static_cast<C>(dt.code)) {
      case C::Float:
        if (dt.bits == 32) return gdr::DType::f32;
        if (dt.bits == 16) return gdr::DType::f16;
        if (dt.bits == 64) return gdr::DType::f64;
        break;
      case C::Bfloat:
        if (dt.bits == 16) return gdr::DType::bf16;
        break;
      case C::Int:
        if (dt.bits == 32) return gdr::DType::i32;
        if (dt.bits == 64) return gdr::DType::i64;
        break;
      case C::Bool:
        if (dt.bits == 8) return gdr::DType::boolean;
        break;
      default: break;
    }
  }
  refuse(op, std::string(name) + " has dtype " + dlpack_dtype_name(dt) +
                 "; gdr takes float32, float16, bfloat16, float64 (CPU), int32, int64 or bool");
}

// A TensorView of a DLPack tensor. Rank must be 1..kMaxRank (rank 0 means "not given" in the core,
// so a 0-d tensor is refused here rather than silently ignored).
template <typename Array>
gdr::TensorView to_view(const Array& a, const char* op, const char* name) {
  gdr::TensorView t;
  const std::size_t rank = a.ndim();
  if (rank == 0) refuse(op, std::string(name) + " is a 0-d tensor; gdr tensors have rank 1 to 4");
  if (rank > static_cast<std::size_t>(gdr::kMaxRank))
    refuse(op, std::string(name) + " has rank " + std::to_string(rank) + "; at most " +
                   std::to_string(gdr::kMaxRank) + " is allowed");
  switch (a.device_type()) {
    case nb::device::cpu::value: t.device = gdr::DeviceType::cpu; break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value: t.device = gdr::DeviceType::cuda; break;
    default:
      refuse(op, std::string(name) + " is on DLPack device type " +
                     std::to_string(a.device_type()) + "; gdr takes cpu or cuda tensors");
  }
  t.device_index = a.device_id();
  t.dtype = to_dtype(a.dtype(), op, name);
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.rank = static_cast<int>(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    t.shape[i] = static_cast<std::int64_t>(a.shape(i));
    t.stride[i] = a.stride(i);
  }
  return t;
}

template <typename Array>
gdr::TensorView to_view(const std::optional<Array>& a, const char* op, const char* name) {
  return a ? to_view(*a, op, name) : gdr::TensorView{};
}

gdr::StateLayout to_layout(const std::string& s, const char* op) {
  if (s == "k_first") return gdr::StateLayout::k_first;
  if (s == "v_first") return gdr::StateLayout::v_first;
  refuse(op, "state_layout is '" + s + "'; allowed: 'k_first', 'v_first'");
}

gdr::DeviceType to_device(const std::string& s, const char* op) {
  if (s == "cpu") return gdr::DeviceType::cpu;
  if (s == "cuda") return gdr::DeviceType::cuda;
  refuse(op, "device is '" + s + "'; allowed: 'cpu', 'cuda'");
}

gdr::Path to_path(const std::string& s, const char* op) {
  if (s == "auto" || s == "automatic") return gdr::Path::automatic;
  if (s == "reference") return gdr::Path::reference;
  if (s == "sequential") return gdr::Path::sequential;
  if (s == "chunkwise") return gdr::Path::chunkwise;
  refuse(op, "path is '" + s + "'; allowed: 'auto', 'reference', 'sequential', 'chunkwise'");
}

gdr::Options to_options(double scale, const std::string& state_layout, bool gate_in_kernel,
                        bool beta_sigmoid, bool qk_l2norm, double l2norm_eps, const char* op) {
  gdr::Options o;
  o.scale = static_cast<float>(scale);
  o.state_layout = to_layout(state_layout, op);
  o.gate_in_kernel = gate_in_kernel;
  o.beta_sigmoid = beta_sigmoid;
  o.qk_l2norm = qk_l2norm;
  o.l2norm_eps = static_cast<float>(l2norm_eps);
  return o;
}

// GDR_OVERRIDES (gdr/decode_overrides.h parse_decode_overrides): forced kernel choices for
// benchmarks through torch, e.g. GDR_OVERRIDES=chunked_state_pass=3; read on the first call (a
// bad value raises ValueError, "<op>: GDR_OVERRIDES: ...", on every call); unset or empty: the
// rules.
const gdr::DecodeOverrides* env_overrides(const char* op) {
  static const std::optional<gdr::DecodeOverrides> forced =
      [op]() -> std::optional<gdr::DecodeOverrides> {
    const char* spec = std::getenv("GDR_OVERRIDES");
    if (spec == nullptr || *spec == '\0') return std::nullopt;
    return gdr::parse_decode_overrides(spec, (std::string(op) + ": GDR_OVERRIDES").c_str());
  }();
  return forced ? &*forced : nullptr;
}

// `op` must outlive the call (it is the caller's std::string).
gdr::ExecConfig to_config(const std::string& path, int chunk_size, int num_threads,
                          std::uintptr_t stream, bool check_values, const char* op) {
  gdr::ExecConfig c;
  c.path = to_path(path, op);
  c.chunk_size = chunk_size;
  c.num_threads = num_threads;
  c.stream = reinterpret_cast<void*>(stream);
  c.check_values = check_values;
  c.op_name = op;
  c.decode_overrides = env_overrides(op);
  return c;
}

// ExecConfig::scratch over a Python callable `allocate(nbytes) -> tensor` (a 1-d uint8 tensor on
// the call's CUDA device, e.g. torch.empty(nbytes, dtype=torch.uint8, device=...)): the core's
// temporary memory then comes from the framework's allocator and shows in its accounting. The
// tensors are kept alive until the core releases them (after queueing its last kernel on the
// stream; a stream-ordered caching allocator such as torch's reuses them only in stream order).
// Called with the GIL released around the core, so each callback takes it.
class PyScratch {
 public:
  PyScratch(nb::object allocate, const char* op) : allocate_(std::move(allocate)), op_(op) {
    hooks_.context = this;
    hooks_.allocate = [](void* self, std::size_t bytes, void*) {
      return static_cast<PyScratch*>(self)->take(bytes);
    };
    hooks_.release = [](void* self, void* ptr, void*) {
      static_cast<PyScratch*>(self)->give_back(ptr);
    };
  }
  ~PyScratch() {
    nb::gil_scoped_acquire gil;
    held_.clear();
  }
  const gdr::ScratchAllocator* hooks() const { return &hooks_; }

 private:
  void* take(std::size_t bytes) {
    nb::gil_scoped_acquire gil;
    nb::object t = allocate_(bytes);
    Out arr;
    if (!nb::try_cast(t, arr) || arr.device_type() != nb::device::cuda::value ||
        arr.dtype() != nb::dtype<std::uint8_t>() || arr.ndim() != 1 || arr.shape(0) < bytes)
      throw gdr::RuntimeFailure(std::string(op_) +
                                ": the scratch callable must return a 1-d uint8 "
                                "CUDA tensor of at least " +
                                std::to_string(bytes) + " bytes");
    held_.emplace_back(arr.data(), std::move(t));
    return arr.data();
  }
  void give_back(void* ptr) noexcept {
    nb::gil_scoped_acquire gil;
    for (auto it = held_.begin(); it != held_.end(); ++it)
      if (it->first == ptr) {
        held_.erase(it);
        return;
      }
  }

  nb::object allocate_;
  const char* op_;
  gdr::ScratchAllocator hooks_;
  std::vector<std::pair<void*, nb::object>> held_;
};

gdr::Inputs to_inputs(const In& q, const In& k, const In& v, const In& g, const In& beta,
                      const OptIn& A_log, const OptIn& dt_bias, const OptIn& h0, const OptIn& mask,
                      const OptIn& cu_seqlens, const char* op) {
  gdr::Inputs in;
  in.q = to_view(q, op, "q");
  in.k = to_view(k, op, "k");
  in.v = to_view(v, op, "v");
  in.g = to_view(g, op, "g");
  in.beta = to_view(beta, op, "beta");
  in.A_log = to_view(A_log, op, "A_log");
  in.dt_bias = to_view(dt_bias, op, "dt_bias");
  in.h0 = to_view(h0, op, "h0");
  in.mask = to_view(mask, op, "mask");
  in.cu_seqlens = to_view(cu_seqlens, op, "cu_seqlens");
  return in;
}

void forward(const In& q, const In& k, const In& v, const In& g, const In& beta, const OptIn& A_log,
             const OptIn& dt_bias, const OptIn& initial_state, const OptIn& mask,
             const OptIn& cu_seqlens, Out o, OptOut final_state, double scale,
             const std::string& state_layout, bool gate_in_kernel, bool beta_sigmoid,
             bool qk_l2norm, double l2norm_eps, const std::string& path, int chunk_size,
             int num_threads, std::uintptr_t stream, OptOut saved, bool check_values,
             const std::string& op_name, nb::object scratch) {
  const char* op = op_name.c_str();
  gdr::ForwardParams p;
  p.in = to_inputs(q, k, v, g, beta, A_log, dt_bias, initial_state, mask, cu_seqlens, op);
  p.o = to_view(o, op, "o");
  p.final_state = to_view(final_state, op, "final_state");
  p.saved = to_view(saved, op, "saved");
  p.opts = to_options(scale, state_layout, gate_in_kernel, beta_sigmoid, qk_l2norm, l2norm_eps, op);
  gdr::ExecConfig config = to_config(path, chunk_size, num_threads, stream, check_values, op);
  std::optional<PyScratch> py_scratch;
  if (!scratch.is_none()) config.scratch = py_scratch.emplace(std::move(scratch), op).hooks();
  nb::gil_scoped_release release;
  gdr::forward(p, config);
}

void backward(const In& q, const In& k, const In& v, const In& g, const In& beta,
              const OptIn& A_log, const OptIn& dt_bias, const OptIn& initial_state,
              const OptIn& mask, const OptIn& cu_seqlens, const In& dout, const OptIn& dfinal_state,
              OptOut dq, OptOut dk, OptOut dv, OptOut dg, OptOut dbeta, OptOut dA_log,
              OptOut ddt_bias, OptOut dh0, double scale, const std::string& state_layout,
              bool gate_in_kernel, bool beta_sigmoid, bool qk_l2norm, double l2norm_eps,
              const std::string& path, int chunk_size, int num_threads, std::uintptr_t stream,
              const OptIn& saved, bool check_values, const std::string& op_name,
              nb::object scratch) {
  const char* op = op_name.c_str();
  gdr::BackwardParams p;
  p.in = to_inputs(q, k, v, g, beta, A_log, dt_bias, initial_state, mask, cu_seqlens, op);
  p.dout = to_view(dout, op, "dout");
  p.dfinal_state = to_view(dfinal_state, op, "dfinal_state");
  p.dq = to_view(dq, op, "dq");
  p.dk = to_view(dk, op, "dk");
  p.dv = to_view(dv, op, "dv");
  p.dg = to_view(dg, op, "dg");
  p.dbeta = to_view(dbeta, op, "dbeta");
  p.dA_log = to_view(dA_log, op, "dA_log");
  p.ddt_bias = to_view(ddt_bias, op, "ddt_bias");
  p.dh0 = to_view(dh0, op, "dh0");
  p.saved = to_view(saved, op, "saved");
  p.opts = to_options(scale, state_layout, gate_in_kernel, beta_sigmoid, qk_l2norm, l2norm_eps, op);
  gdr::ExecConfig config = to_config(path, chunk_size, num_threads, stream, check_values, op);
  std::optional<PyScratch> py_scratch;
  if (!scratch.is_none()) config.scratch = py_scratch.emplace(std::move(scratch), op).hooks();
  nb::gil_scoped_release release;
  gdr::backward(p, config);
}

void decode(const In& q, const In& k, const In& v, const In& g, const In& beta, const OptIn& A_log,
            const OptIn& dt_bias, const OptIn& mask, Out state, const OptIn& state_indices, Out o,
            double scale, const std::string& state_layout, bool gate_in_kernel, bool beta_sigmoid,
            bool qk_l2norm, double l2norm_eps, const std::string& path, int num_threads,
            std::uintptr_t stream, bool check_values, const std::string& op_name) {
  const char* op = op_name.c_str();
  gdr::DecodeParams p;
  p.q = to_view(q, op, "q");
  p.k = to_view(k, op, "k");
  p.v = to_view(v, op, "v");
  p.g = to_view(g, op, "g");
  p.beta = to_view(beta, op, "beta");
  p.A_log = to_view(A_log, op, "A_log");
  p.dt_bias = to_view(dt_bias, op, "dt_bias");
  p.mask = to_view(mask, op, "mask");
  p.state = to_view(state, op, "state");
  p.state_indices = to_view(state_indices, op, "state_indices");
  p.o = to_view(o, op, "o");
  p.opts = to_options(scale, state_layout, gate_in_kernel, beta_sigmoid, qk_l2norm, l2norm_eps, op);
  const gdr::ExecConfig config = to_config(path, 64, num_threads, stream, check_values, op);
  nb::gil_scoped_release release;
  gdr::decode(p, config);
}

// gdr::saved_shape for a call of these sizes: (chunk_rows, Hv, record).
nb::tuple saved_shape(std::int64_t B, std::int64_t T, std::int64_t N, bool varlen, std::int64_t Hv,
                      std::int64_t Dk, std::int64_t Dv, int chunk_size, bool f64,
                      bool intermediates, const std::string& op) {
  gdr::Problem prob;
  prob.B = B;
  prob.T = T;
  prob.N = N;
  prob.varlen = varlen;
  prob.Hv = Hv;
  prob.Dk = Dk;
  prob.Dv = Dv;
  prob.dtype = f64 ? gdr::DType::f64 : gdr::DType::f32;
  const gdr::SavedShape s = gdr::saved_shape(
      prob, chunk_size,
      intermediates ? gdr::SavedContent::chunk_intermediates : gdr::SavedContent::chunk_states,
      op.c_str());
  return nb::make_tuple(s.chunk_rows, s.Hv, s.record);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "gdr core bindings: gated delta rule forward, backward and decode on DLPack tensors";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const gdr::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const gdr::RuntimeFailure& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.attr("__version__") = GDR_VERSION_STRING;
  m.def("cuda_available", &gdr::cuda_available,
        "True when this build of gdr has the CUDA paths compiled in.");

  // Keyword names shared by forward and backward.
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
        nb::arg("beta"), nb::arg("A_log").none(), nb::arg("dt_bias").none(),
        nb::arg("initial_state").none(), nb::arg("mask").none(), nb::arg("cu_seqlens").none(),
        nb::arg("o"), nb::arg("final_state").none(), nb::kw_only(), nb::arg("scale") = 0.0,
        nb::arg("state_layout") = "k_first", nb::arg("gate_in_kernel") = false,
        nb::arg("beta_sigmoid") = false, nb::arg("qk_l2norm") = false, nb::arg("l2norm_eps") = 1e-6,
        nb::arg("path") = "auto", nb::arg("chunk_size") = 64, nb::arg("num_threads") = 0,
        nb::arg("stream") = 0, nb::arg("saved").none() = nb::none(),
        nb::arg("check_values") = false, nb::arg("op") = "gdr.forward",
        nb::arg("scratch").none() = nb::none(),
        "Writes o [B,T,Hv,Dv] and, when given, final_state and the saved-for-backward tensor; "
        "see include/gdr/params.h. Every error message starts with `op`. scratch: a callable "
        "nbytes -> 1-d uint8 CUDA tensor for the call's temporary device memory (else "
        "cudaMallocAsync).");

  m.def("backward", &backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"),
        nb::arg("beta"), nb::arg("A_log").none(), nb::arg("dt_bias").none(),
        nb::arg("initial_state").none(), nb::arg("mask").none(), nb::arg("cu_seqlens").none(),
        nb::arg("dout"), nb::arg("dfinal_state").none(), nb::arg("dq").none(), nb::arg("dk").none(),
        nb::arg("dv").none(), nb::arg("dg").none(), nb::arg("dbeta").none(),
        nb::arg("dA_log").none(), nb::arg("ddt_bias").none(), nb::arg("dh0").none(), nb::kw_only(),
        nb::arg("scale") = 0.0, nb::arg("state_layout") = "k_first",
        nb::arg("gate_in_kernel") = false, nb::arg("beta_sigmoid") = false,
        nb::arg("qk_l2norm") = false, nb::arg("l2norm_eps") = 1e-6, nb::arg("path") = "auto",
        nb::arg("chunk_size") = 64, nb::arg("num_threads") = 0, nb::arg("stream") = 0,
        nb::arg("saved").none() = nb::none(), nb::arg("check_values") = false,
        nb::arg("op") = "gdr.backward", nb::arg("scratch").none() = nb::none(),
        "Writes the given gradients (each optional), reading the forward's saved tensor when "
        "given; see include/gdr/params.h. Every error message starts with `op`. scratch: as "
        "forward's.");

  m.def("decode", &decode, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
        nb::arg("A_log").none(), nb::arg("dt_bias").none(), nb::arg("mask").none(),
        nb::arg("state"), nb::arg("state_indices").none(), nb::arg("o"), nb::kw_only(),
        nb::arg("scale") = 0.0, nb::arg("state_layout") = "k_first",
        nb::arg("gate_in_kernel") = false, nb::arg("beta_sigmoid") = false,
        nb::arg("qk_l2norm") = false, nb::arg("l2norm_eps") = 1e-6, nb::arg("path") = "auto",
        nb::arg("num_threads") = 0, nb::arg("stream") = 0, nb::arg("check_values") = false,
        nb::arg("op") = "gdr.decode",
        "Runs T = 1..16 tokens per sequence, updating state in place and writing o. Every "
        "error message starts with `op`.");

  m.def("saved_shape", &saved_shape, nb::arg("B"), nb::arg("T"), nb::arg("N"), nb::arg("varlen"),
        nb::arg("Hv"), nb::arg("Dk"), nb::arg("Dv"), nb::arg("chunk_size"), nb::arg("f64"),
        nb::arg("intermediates") = false, nb::arg("op") = "gdr.saved_shape",
        "(chunk_rows, Hv, record) of the saved-for-backward tensor (gdr::saved_shape): the chunk "
        "states, or with intermediates=True the chunk intermediates too.");

  m.def(
      "backward_available",
      [](const std::string& device) {
        return gdr::backward_available(to_device(device, "gdr.backward_available"));
      },
      nb::arg("device"),
      "True when gdr.backward runs for tensors on `device` ('cpu' or 'cuda') in this build.");
}
