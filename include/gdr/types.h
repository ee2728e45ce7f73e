// Basic enumerations shared by every layer of gdr.
#pragma once

#include <cstdint>
#include <string_view>

namespace gdr {

// Element types of the tensors gdr reads and writes. f64 is accepted by the CPU paths only
// (float64 checks and gradcheck); the CUDA paths take f32, f16 and bf16.
enum class DType : std::uint8_t { f32, f16, bf16, f64, i32, i64, boolean };

enum class DeviceType : std::uint8_t { cpu, cuda };

// Scalar gate: g is [B, T, Hv] (Gated DeltaNet). Per-key gate: g is [B, T, Hv, Dk] (KDA).
enum class GateKind : std::uint8_t { scalar, per_key };

// k-first stores the state S as [.., Dk, Dv]; v-first stores S^T as [.., Dv, Dk].
enum class StateLayout : std::uint8_t { k_first, v_first };

// Which algorithm computes a call. `automatic` lets the dispatcher pick the fastest path that
// covers the call; the others force one path (tests and benchmarks).
//   reference  - float64 sequential recurrence on the CPU (docs/operator.md §2), the oracle
//   sequential - per-token loop in the working precision (CPU fp32 loop, CUDA recurrent kernel)
//   chunkwise  - chunkwise-parallel form (docs/operator.md §3-4)
enum class Path : std::uint8_t { automatic, reference, sequential, chunkwise };

std::string_view to_string(DType);
std::string_view to_string(DeviceType);
std::string_view to_string(GateKind);
std::string_view to_string(StateLayout);
std::string_view to_string(Path);

// Size in bytes of one element of `dtype`.
int dtype_size(DType dtype);

}  // namespace gdr
