// Four consecutive elements as one aligned unit: one 16-byte access for f32
// (8 for f16 / bf16, 32 for f64), for the elementwise kernels that move four
// elements a thread (binary.cpp, loop.h's maps, cuda/lerp.cu,
// cuda/quantize.cu).
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"

namespace qgrad::kernels {

template <class T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

// p may be read or written as Vec4<T>s.
template <class T>
QGRAD_HD bool vec4_aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % sizeof(Vec4<T>) == 0;
}

}  // namespace qgrad::kernels
