// Scalar conversion between dtypes, shared by the CPU and CUDA kernels.
//
// Float -> integer truncates toward zero and saturates at the integer
// type's range; NaN becomes 0 (C++ leaves these cases undefined; we pin
// them down so both devices agree). 16-bit floats convert through float.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "qgrad/core/half.h"

namespace qgrad::formulas {

template <class T> inline constexpr bool is_half_type = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// Widen any storage type to double/float/int for conversion.
template <class From>
QGRAD_HD auto widen(From v) {
  if constexpr (is_half_type<From>) return static_cast<float>(v);
  else return v;
}

template <class To, class From>
QGRAD_HD To cast_value(From v_in) {
  const auto v = widen(v_in);
  using W = decltype(v);
  if constexpr (std::is_same_v<To, bool>) {
    return v != W(0);
  } else if constexpr (is_half_type<To>) {
    if constexpr (std::is_same_v<W, double>) return To(static_cast<float>(v));
    else return To(static_cast<float>(v));
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(v);
  } else if constexpr (std::is_floating_point_v<W>) {  // float -> integer
    if (!(v == v)) return To(0);
    const double d = static_cast<double>(v);
    constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
    constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
    if (d <= lo) return std::numeric_limits<To>::min();
    if (d >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else {  // integer -> integer: two's-complement wrap, as in C++
    return static_cast<To>(v);
  }
}

}  // namespace qgrad::formulas
