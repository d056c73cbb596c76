// Scalar conversion between dtypes, shared by the CPU and CUDA kernels.
//
// Float -> integer truncates toward zero and saturates at the integer
// type's range; NaN becomes 0 (C++ leaves these cases undefined; we pin
// them down so both devices agree). 16-bit and 8-bit floats convert through
// float (f64 -> fp8 rounds twice, as PyTorch's cast does).
//
// Packed 4-bit integers (s4 / u4) have no element type; int4_from converts
// one value to them: round half to even, saturate at [-8, 7] / [0, 15],
// NaN -> 0 (ONNX's Cast to INT4/UINT4; integers saturate).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "qgrad/core/float8.h"
#include "qgrad/core/half.h"

namespace qgrad::formulas {

// The storage types converted through float: the 16-bit floats and the fp8
// types (core/float8.h; PyTorch converts every type to float8 through float).
template <class T> inline constexpr bool is_half_type = std::is_same_v<T, half> || std::is_same_v<T, bfloat16> ||
                                                        std::is_same_v<T, float8_e4m3> || std::is_same_v<T, float8_e5m2>;

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

template <class From>
QGRAD_HD int int4_from(From v_in, bool is_signed) {
  const int lo = is_signed ? -8 : 0, hi = is_signed ? 7 : 15;
  const auto v = widen(v_in);
  using W = decltype(v);
  if constexpr (std::is_floating_point_v<W>) {
    if (!(v == v)) return 0;
    if (v <= W(lo)) return lo;
    if (v >= W(hi)) return hi;
#if defined(__CUDA_ARCH__)
    return static_cast<int>(rint(static_cast<double>(v)));
#else
    return static_cast<int>(std::nearbyint(static_cast<double>(v)));
#endif
  } else if constexpr (std::is_same_v<W, bool>) {
    return v ? 1 : 0;
  } else {
    const auto lw = static_cast<long long>(v);
    return lw <= lo ? lo : (lw >= hi ? hi : static_cast<int>(lw));
  }
}

// tf32x3's operand split (core/dtype.h Float32Matmul): a = big + small
// exactly, big a TF32 value (a rounded to 10 mantissa bits, ties away from
// zero) and small = a - big (exact: both lie in a's binade or the next, and
// |small| <= 2^-11 |a|). Where rounding would overflow, big is a truncated
// (rounded toward zero). A non-finite a is big with small 0 (not inf - inf):
// its products are non-finite, though NaN where f32's could be inf (inf
// times another operand's remainder of 0).
QGRAD_HD void tf32_split(float a, float& big, float& small) {
  const std::uint32_t bits = float_to_bits(a);
  if ((bits & 0x7f800000u) == 0x7f800000u) {
    big = a;
    small = 0.0f;
    return;
  }
  std::uint32_t rounded = (bits + 0x1000u) & 0xffffe000u;
  if ((rounded & 0x7f800000u) == 0x7f800000u) rounded = bits & 0xffffe000u;
  big = bits_to_float(rounded);
  small = a - big;
}

}  // namespace qgrad::formulas
