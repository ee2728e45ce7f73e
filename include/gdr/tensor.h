// TensorView: a non-owning view of a strided tensor (pointer, dtype, device, shape, int64
// strides in elements). gdr never allocates or frees the memory a view points to.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

#include "gdr/types.h"

namespace gdr {

inline constexpr int kMaxRank = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  DeviceType device = DeviceType::cpu;
  int device_index = 0;
  int rank = 0;  // 0 means "not given" (optional tensors); every gdr tensor has rank >= 1
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> stride{};  // in elements, not bytes

  bool defined() const { return rank > 0; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }

  // A row-major contiguous view of `data` with the given shape.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               DeviceType device = DeviceType::cpu, int device_index = 0) {
    TensorView t;
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.device_index = device_index;
    t.rank = static_cast<int>(shape.size());
    int i = 0;
    for (std::int64_t s : shape) t.shape[i++] = s;
    std::int64_t step = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      t.stride[d] = step;
      step *= t.shape[d];
    }
    return t;
  }
};

}  // namespace gdr
