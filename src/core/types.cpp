#include "gdr/types.h"

namespace gdr {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::boolean: return "bool";
  }
  return "unknown dtype";
}

std::string_view to_string(DeviceType device) {
  switch (device) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::cuda: return "cuda";
  }
  return "unknown device";
}

std::string_view to_string(GateKind gate) {
  switch (gate) {
    case GateKind::scalar: return "scalar";
    case GateKind::per_key: return "per_key";
  }
  return "unknown gate";
}

std::string_view to_string(StateLayout layout) {
  switch (layout) {
    case StateLayout::k_first: return "k_first";
    case StateLayout::v_first: return "v_first";
  }
  return "unknown layout";
}

std::string_view to_string(Path path) {
  switch (path) {
    case Path::automatic: return "automatic";
    case Path::reference: return "reference";
    case Path::sequential: return "sequential";
    case Path::chunkwise: return "chunkwise";
  }
  return "unknown path";
}

int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
  }
  return 0;
}

}  // namespace gdr
