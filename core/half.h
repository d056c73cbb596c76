// 16-bit float storage types (IEEE binary16 and bfloat16) with conversions
// written in integer arithmetic, so host and device round identically
// (round to nearest, ties to even). Arithmetic happens in float.
#pragma once

#include <cstdint>
#include <cstring>

#include "qgrad/core/macros.h"

namespace qgrad {

QGRAD_HD std::uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

QGRAD_HD float bits_to_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

QGRAD_HD std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = float_to_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t mant = x & 0x7fffffu;
  const int exp = static_cast<int>((x >> 23) & 0xffu);
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
  const int e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = sign | (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
  return static_cast<std::uint16_t>(h);
}

QGRAD_HD float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    // Subnormal: mant * 2^-24 is exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

QGRAD_HD std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

QGRAD_HD float bf16_bits_to_float(std::uint16_t b) { return bits_to_float(static_cast<std::uint32_t>(b) << 16); }

// A 16-bit floating value stored as bits; Format gives the conversions
// (round to nearest even; NaN stays NaN). Arithmetic goes through float.
template <class Format>
struct Float16 {
  std::uint16_t bits = 0;
  Float16() = default;
  QGRAD_HD explicit Float16(float f) : bits(Format::encode(f)) {}
  QGRAD_HD explicit Float16(double d) : bits(Format::encode(static_cast<float>(d))) {}
  QGRAD_HD operator float() const { return Format::decode(bits); }
  QGRAD_HD static Float16 from_bits(std::uint16_t b) {
    Float16 h;
    h.bits = b;
    return h;
  }
};
struct HalfFormat {  // IEEE binary16
  QGRAD_HD static std::uint16_t encode(float f) { return float_to_half_bits(f); }
  QGRAD_HD static float decode(std::uint16_t b) { return half_bits_to_float(b); }
};
struct BFloat16Format {  // the top half of a binary32
  QGRAD_HD static std::uint16_t encode(float f) { return float_to_bf16_bits(f); }
  QGRAD_HD static float decode(std::uint16_t b) { return bf16_bits_to_float(b); }
};
using half = Float16<HalfFormat>;
using bfloat16 = Float16<BFloat16Format>;

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

// The precision a kernel computes in for storage type T ("op math"):
// float for the 16-bit types, T itself otherwise.
template <class T> struct OpMath { using type = T; };
template <> struct OpMath<half> { using type = float; };
template <> struct OpMath<bfloat16> { using type = float; };
template <class T> using op_math_t = typename OpMath<T>::type;

}  // namespace qgrad
