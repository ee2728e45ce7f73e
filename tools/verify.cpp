// `gdr verify`: every path of this build against the float64 reference (docs/operator.md §7) on
// fresh random cases covering both gates, mask, varlen (with zero-length sequences), GQA, both
// state layouts, the fused options and the input dtypes: forward and backward of the CPU
// per-token loop and chunkwise form, the chunkwise training step as the torch layer runs it
// (the forward saves the chunk-boundary states, the backward reads them) and, for short cases,
// the decode step; on a CUDA build with a GPU present, also the CUDA forward (the recurrent
// kernel, the chunked kernels), the CUDA chunked backward and, for the decode cases, the CUDA
// decode step (the kernel the launch rule picks).
// Relative Frobenius error per output; the bound is fp32 1e-5 / 1e-4 (o and state /
// gradients), bf16 and fp16 inputs 5e-3 / 1e-2. Output buffers are poisoned with NaN before
// each call. Exit code 1 when any row fails.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "gdr/gdr.h"
#include "support.h"
#if GDR_WITH_CUDA
#include "gpu_support.h"
#endif

namespace gdr::tools {
namespace {

using test::Case;

struct NamedCase {
  std::string name;
  Case c;
  bool decode = false;  // also run the decode step (T <= 16, no varlen)
};

std::vector<NamedCase> verify_cases() {
  std::vector<NamedCase> out;
  auto add = [&](std::string name, auto&& edit, bool decode = false) {
    Case c;
    c.B = 1;
    c.Hk = 2;
    c.Hv = 2;
    c.Dk = 64;
    c.Dv = 64;
    edit(c);
    out.push_back({std::move(name), c, decode});
  };
  add(
      "T1 scalar B3",
      [](Case& c) {
        c.T = 1;
        c.B = 3;
      },
      true);
  add("T63 per_key gqa", [](Case& c) {
    c.T = 63;
    c.Hk = 1;
    c.Hv = 4;
    c.gate = GateKind::per_key;
  });
  add("T64 scalar gqa", [](Case& c) {
    c.T = 64;
    c.Hk = 1;
    c.Hv = 4;
  });
  add("T65 scalar mask", [](Case& c) {
    c.T = 65;
    c.B = 2;
    c.mask = true;
  });
  add("T200 per_key strong", [](Case& c) {
    c.T = 200;
    c.gate = GateKind::per_key;
    c.decay = test::Decay::strong;
  });
  add("T200 scalar extreme v_first", [](Case& c) {
    c.T = 200;
    c.decay = test::Decay::extreme;
    c.layout = StateLayout::v_first;
  });
  add("T130 per_key extreme", [](Case& c) {
    c.T = 130;
    c.gate = GateKind::per_key;
    c.decay = test::Decay::extreme;
  });
  add("varlen scalar 0,37,64,1,0,99", [](Case& c) { c.seqlens = {0, 37, 64, 1, 0, 99}; });
  add("varlen per_key mask gqa", [](Case& c) {
    c.seqlens = {70, 0, 5, 130};
    c.gate = GateKind::per_key;
    c.mask = true;
    c.Hk = 1;
    c.Hv = 4;
    c.cu_seqlens_i64 = true;
  });
  add("fused scalar", [](Case& c) {
    c.T = 100;
    c.gate_in_kernel = c.beta_sigmoid = c.qk_l2norm = true;
  });
  add("fused per_key v_first mask", [](Case& c) {
    c.T = 90;
    c.gate = GateKind::per_key;
    c.gate_in_kernel = c.beta_sigmoid = c.qk_l2norm = true;
    c.layout = StateLayout::v_first;
    c.mask = true;
  });
  add("no h0 no final_state", [](Case& c) {
    c.T = 80;
    c.h0 = false;
    c.final_state = false;
  });
  add("Dk128 Dv64 gqa", [](Case& c) {
    c.T = 100;
    c.Dk = 128;
    c.Hk = 1;
    c.Hv = 2;
  });
  add("Dk48 Dv40 (non power of 2)", [](Case& c) {
    c.T = 97;
    c.Dk = 48;
    c.Dv = 40;
    c.gate = GateKind::per_key;
  });
  add("T1000 scalar", [](Case& c) {
    c.T = 1000;
    c.Hk = 1;
    c.Hv = 1;
  });
  add("T0 empty", [](Case& c) {
    c.T = 0;
    c.B = 2;
  });
  add("strided scale", [](Case& c) {
    c.T = 70;
    c.strided = true;
    c.scale = 0.3f;
  });
  add("bf16 scalar", [](Case& c) {
    c.T = 130;
    c.dtype = DType::bf16;
  });
  add("f16 per_key gates_in_dtype", [](Case& c) {
    c.T = 70;
    c.dtype = DType::f16;
    c.gates_in_dtype = true;
    c.gate = GateKind::per_key;
  });
  add("bf16 fused varlen", [](Case& c) {
    c.seqlens = {33, 0, 64};
    c.dtype = DType::bf16;
    c.gate_in_kernel = c.beta_sigmoid = c.qk_l2norm = true;
  });
  add(
      "decode T1 B4 gqa",
      [](Case& c) {
        c.T = 1;
        c.B = 4;
        c.Hk = 1;
        c.Hv = 4;
      },
      true);
  add(
      "decode T16 per_key mask v_first",
      [](Case& c) {
        c.T = 16;
        c.B = 3;
        c.gate = GateKind::per_key;
        c.mask = true;
        c.layout = StateLayout::v_first;
      },
      true);
  add(
      "decode T4 fused bf16",
      [](Case& c) {
        c.T = 4;
        c.B = 2;
        c.dtype = DType::bf16;
        c.gate_in_kernel = c.beta_sigmoid = c.qk_l2norm = true;
      },
      true);
  // Shapes that the rules (src/cuda/decode/tuning.h) give the chunk kernel on a GPU of up to 192
  // SMs (k-first fp32 state, Dk = 128, scalar gate, 24 heads >= T x SMs): the CUDA forward and
  // decode rows of these two cases run it.
  auto chunk_kernel_shape = [](Case& c, std::int64_t T, std::int64_t B) {
    c.T = T;
    c.B = B;
    c.Hk = 16;
    c.Hv = 32;
    c.Dk = 128;
    c.Dv = 128;
  };
  add(
      "decode T8 Dk128 Hv32 mask gqa",
      [&](Case& c) {
        chunk_kernel_shape(c, 8, 3);
        c.mask = true;
      },
      true);
  add(
      "decode T16 Dk128 Hv32 fused bf16",
      [&](Case& c) {
        chunk_kernel_shape(c, 16, 4);
        c.dtype = DType::bf16;
        c.gate_in_kernel = c.beta_sigmoid = c.qk_l2norm = true;
      },
      true);
  add(
      "decode T1 bf16 pool",
      [](Case& c) {
        c.T = 1;
        c.B = 4;
        c.bf16_state = true;
      },
      true);
  add(
      "decode T4 bf16 pool v-first",
      [](Case& c) {
        c.T = 4;
        c.B = 3;
        c.bf16_state = true;
        c.layout = StateLayout::v_first;
      },
      true);
  // A k-first bf16 pool that the rules give the chunk kernel on the GPU (tuning.h,
  // recurrent_chunk_preferred_bf16: 24 heads >= 8 x SMs up to 288 SMs).
  add(
      "decode T8 Dk128 Hv32 bf16 pool",
      [&](Case& c) {
        chunk_kernel_shape(c, 8, 3);
        c.dtype = DType::bf16;
        c.bf16_state = true;
      },
      true);
  return out;
}

struct Row {
  std::string case_name, description, path, direction, status, worst, message;
  double max_error = 0, bound = 0;
  std::vector<std::pair<std::string, double>> errors;
};

bool not_implemented(const std::exception& e) {
  return std::string(e.what()).find("not implemented") != std::string::npos;
}

// Fills errors / worst / status of `row` from named (got, ref) fields.
void grade(Row& row, const std::vector<test::Field>& fields) {
  row.max_error = 0;
  for (const test::Field& f : fields) {
    if (f.ref->empty() && f.got->empty()) continue;
    const double e = test::rel_error(*f.got, *f.ref);
    row.errors.emplace_back(f.name, e);
    if (!(e <= row.max_error)) {  // NaN-safe: inf / NaN always become the worst
      row.max_error = e;
      row.worst = f.name;
    }
  }
  if (row.worst.empty() && !row.errors.empty()) row.worst = row.errors.front().first;
  row.status = row.max_error < row.bound ? "PASS" : "FAIL";
}

// Runs `body`, classifying exceptions: "not implemented" -> unavailable, InvalidArgument (a
// path refusing a combination) -> unsupported, anything else -> FAIL.
template <class F>
void guarded(Row& row, F&& body) {
  try {
    body();
  } catch (const InvalidArgument& e) {
    row.status = "unsupported";
    row.message = e.what();
  } catch (const std::exception& e) {
    row.status = not_implemented(e) ? "unavailable" : "FAIL";
    row.message = e.what();
  }
}

std::string fmt_error(double e) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", e);
  return buf;
}

int run_verify(std::uint64_t seed_arg, const std::string& json_path, const std::string& filter,
               bool verbose) {
  const std::uint64_t base = seed_arg ? seed_arg : test::fresh_seed();
#if GDR_WITH_CUDA
  const bool gpu = test::have_gpu();
#else
  const bool gpu = false;
#endif
  std::printf(
      "gdr verify: seed %llu, paths sequential, chunkwise, chunkwise with saved chunk "
      "states, decode%s vs reference (float64)\n",
      static_cast<unsigned long long>(base),
      gpu ? ", cuda (recurrent kernel), cuda chunked (fwd, bwd), cuda decode"
          : (cuda_available() ? " (CUDA build, no GPU: cuda paths not run)" : ""));
  std::printf("%-32s %-11s %-4s %-12s %-9s %-9s %s\n", "case", "path", "dir", "worst", "error",
              "bound", "status");
  std::vector<Row> rows;
  const std::vector<NamedCase> cases = verify_cases();
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const NamedCase& nc = cases[ci];
    if (!filter.empty() && nc.name.find(filter) == std::string::npos) continue;
    Case c = nc.c;
    c.seed = base + 0x9E3779B97F4A7C15ULL * (ci + 1);
    auto emit = [&](Row row) {
      std::printf("%-32s %-11s %-4s %-12s %-9s %-9s %s\n", row.case_name.c_str(), row.path.c_str(),
                  row.direction.c_str(), row.worst.c_str(),
                  row.errors.empty() ? "-" : fmt_error(row.max_error).c_str(),
                  fmt_error(row.bound).c_str(), row.status.c_str());
      if (!row.message.empty() && (verbose || row.status == "FAIL"))
        std::printf("    %s\n", row.message.c_str());
      std::fflush(stdout);
      rows.push_back(std::move(row));
    };
    auto make_row = [&](const char* path, const char* dir, double bound) {
      Row r;
      r.case_name = nc.name;
      r.description = test::describe(c, c.seed);
      r.path = path;
      r.direction = dir;
      r.bound = bound;
      return r;
    };

    test::TestData d = test::make_problem(c);
    test::ForwardResult fref;
    test::BackwardResult bref;
    Row ref_row = make_row("reference", "fwd", test::forward_tolerance(c));
    bool ref_ok = false;
    guarded(ref_row, [&] {
      fref = test::reference_forward(d);
      bref = test::reference_backward(d);
      ref_ok = true;
    });
    if (!ref_ok) {
      ref_row.status = "FAIL";
      emit(ref_row);
      continue;
    }
    for (Path path : {Path::sequential, Path::chunkwise}) {
      const std::string pname(to_string(path));
      Row f = make_row(pname.c_str(), "fwd", test::forward_tolerance(c));
      guarded(f, [&] {
        const test::ForwardResult got = test::run_forward(d, path);
        grade(f, test::fields(got, fref));
      });
      emit(f);
      Row b = make_row(pname.c_str(), "bwd", test::backward_tolerance(c));
      guarded(b, [&] {
        const test::BackwardResult got = test::run_backward(d, path);
        grade(b, test::fields(got, bref));
      });
      emit(b);
    }
    // The CPU training step of the torch layer: the forward saves the chunk-boundary states
    // (docs/operator.md §3), the backward reads them and recomputes the chunks' matrices.
    // One forward fills the states (NaN first), the backward row reads them.
    {
      std::optional<test::HostTensor> saved;
      Row f = make_row("chunk+saved", "fwd", test::forward_tolerance(c));
      guarded(f, [&] {
        saved.emplace(test::make_saved(d, 64, gdr::SavedContent::chunk_states));
        grade(f, test::fields(test::run_forward(d, Path::chunkwise, {}, saved->view()), fref));
      });
      emit(f);
      Row b = make_row("chunk+saved", "bwd", test::backward_tolerance(c));
      guarded(b, [&] {
        if (!saved) throw std::runtime_error("no saved chunk states: the forward failed");
        grade(b, test::fields(test::run_backward(d, Path::chunkwise, {}, saved->view()), bref));
      });
      emit(b);
    }
    // One decode step on a fresh pool (with indices and unused rows) through `run`, against the
    // reference step (a bf16 pool: the bound adds its rounding, 2^-9 relative per element).
    auto decode_row = [&](const char* path, auto run) {
      Row r = make_row(path, "step", test::state_tolerance(c));
      guarded(r, [&] {
        test::DecodeData dd = test::make_decode_problem(c, c.B + 3, true);
        const test::ForwardResult want = test::decode_reference(dd);
        grade(r, test::fields(run(dd), want));
      });
      emit(r);
    };
    if (nc.decode) decode_row("decode", [](test::DecodeData& dd) { return test::run_decode(dd); });
#if GDR_WITH_CUDA
    if (gpu) {
      Row f = make_row("cuda", "fwd", test::forward_tolerance(c));
      guarded(f, [&] { grade(f, test::fields(test::run_forward_cuda(d), fref)); });
      emit(f);
      Row fc = make_row("cuda chunked", "fwd", test::forward_tolerance(c));
      guarded(fc, [&] {
        grade(fc, test::fields(test::run_forward_cuda(d, nullptr, Path::chunkwise), fref));
      });
      emit(fc);
      Row bc = make_row("cuda chunked", "bwd", test::backward_tolerance(c));
      guarded(bc, [&] { grade(bc, test::fields(test::run_backward_cuda(d), bref)); });
      emit(bc);
      if (nc.decode)
        decode_row("cuda decode", [](test::DecodeData& dd) { return test::run_decode_cuda(dd); });
    }
#endif
  }

  int pass = 0, fail = 0, other = 0;
  for (const Row& r : rows) (r.status == "PASS" ? pass : r.status == "FAIL" ? fail : other)++;
  std::printf("\n%d PASS, %d FAIL, %d unavailable/unsupported (seed %llu)\n", pass, fail, other,
              static_cast<unsigned long long>(base));

  if (!json_path.empty()) {
    nlohmann::json j;
    j["seed"] = base;
    j["passed"] = fail == 0;
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json e;
      e["case"] = r.case_name;
      e["description"] = r.description;
      e["path"] = r.path;
      e["direction"] = r.direction;
      e["status"] = r.status;
      e["worst"] = r.worst;
      e["max_error"] = r.max_error;  // inf / NaN are written as null
      e["bound"] = r.bound;
      e["errors"] = nlohmann::json::object();
      for (const auto& [name, err] : r.errors) e["errors"][name] = err;
      if (!r.message.empty()) e["message"] = r.message;
      j["rows"].push_back(std::move(e));
    }
    std::ofstream os(json_path);
    if (!os) {
      std::fprintf(stderr, "gdr verify: cannot write %s\n", json_path.c_str());
      return 1;
    }
    os << j.dump(2) << "\n";
  }
  return fail == 0 ? 0 : 1;
}

}  // namespace

void add_verify_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Check every path against the float64 reference on random cases (the CUDA paths too on a "
      "CUDA build with a GPU)");
  struct Opts {
    std::uint64_t seed = 0;
    std::string json, filter;
    bool verbose = false;
  };
  auto opts = std::make_shared<Opts>();
  cmd->add_option("--seed", opts->seed, "Random seed (0: a fresh one, printed)");
  cmd->add_option("--json", opts->json, "Also write the rows to this JSON file");
  cmd->add_option("--filter", opts->filter, "Only cases whose name contains this text");
  cmd->add_flag("-v,--verbose", opts->verbose, "Print why a path is unavailable/unsupported");
  cmd->callback([opts] {
    const int rc = run_verify(opts->seed, opts->json, opts->filter, opts->verbose);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace gdr::tools
