// 8-bit floating storage types (OCP FP8: E4M3FN and E5M2) and the packed
// 4-bit integer nibble helpers, with conversions written once for host and
// device (like core/half.h), so the CPU and CUDA round identically.
//
// The float -> fp8 conversions transcribe PyTorch 2.11's
// c10/util/Float8_e4m3fn.h (fp8e4m3fn_from_fp32_value) and
// c10/util/Float8_e5m2.h (fp8e5m2_from_fp32_value), which `.to(torch.float8_*)`
// runs on the CPU: round to nearest, ties to even; NaN -> NaN; -0 kept;
// subnormals rounded by one float addition (exact in IEEE float on both
// devices: no FMA, no flush to zero in this build). Not saturating:
//   e4m3fn: |x| >= 480 (the midpoint above 448, the largest finite) -> NaN
//           (0x7f | sign), infinities too (E4M3FN has no infinity);
//   e5m2:   |x| >= 61440 (the midpoint above 57344) -> +-inf (0x7c | sign),
//           NaN -> 0x7f | sign.
// The fp8 -> float conversions are exact (every fp8 value is a float).
#pragma once

#include <cstdint>

#include "qgrad/core/half.h"

namespace qgrad {

// ---- E4M3FN: s eeee mmm, bias 7, no infinities, NaN = s.1111.111, max 448 ----
QGRAD_HD float f8e4m3_bits_to_float(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t exp = (b >> 3) & 0xfu;
  const std::uint32_t mant = b & 0x7u;
  // NaN: the bits PyTorch's fp8e4m3fn_to_fp32_value gives (exponent and
  // mantissa shifted into place, exponent forced to 0xff): 0x7ff00000.
  if (exp == 0xfu && mant == 0x7u) return bits_to_float(sign | 0x7ff00000u);
  if (exp == 0) {
    // Subnormal (or zero): mant * 2^-9, exact in float.
    const float v = static_cast<float>(mant) * 0.001953125f;
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 120u) << 23) | (mant << 20));
}

QGRAD_HD std::uint8_t float_to_f8e4m3_bits(float f) {
  constexpr std::uint32_t fp8_max = 1087u << 20;      // 480.0f: first value that rounds past 448
  constexpr std::uint32_t denorm_mask = 141u << 23;   // 2^14: ((127 - 7) + (23 - 3) + 1)
  std::uint32_t f_bits = float_to_bits(f);
  const std::uint32_t sign = f_bits & 0x80000000u;
  f_bits ^= sign;
  std::uint8_t result;
  if (f_bits >= fp8_max) {
    result = 0x7f;  // NaN (also for +-inf and |x| >= 480)
  } else if (f_bits < (121u << 23)) {
    // Below 2^-6, the smallest normal: the float addition rounds (ties to even)
    // at the subnormal step 2^-9, and the low bits are the fp8 code.
    f_bits = float_to_bits(bits_to_float(f_bits) + bits_to_float(denorm_mask));
    result = static_cast<std::uint8_t>(f_bits - denorm_mask);
  } else {
    const std::uint32_t mant_odd = (f_bits >> 20) & 1u;
    f_bits += ((7u - 127u) << 23) + 0x7ffffu;  // rebias the exponent; round half up ...
    f_bits += mant_odd;                        // ... or half to even
    result = static_cast<std::uint8_t>(f_bits >> 20);
  }
  return static_cast<std::uint8_t>(result | (sign >> 24));
}

// ---- E5M2: s eeeee mm, bias 15, IEEE-like (inf, NaN), max 57344: the top byte of a binary16 ----
// NaN comes out quiet (bit 22 set), as PyTorch's fp16_ieee_to_fp32_value
// leaves it (its float multiplication quiets a signaling NaN).
QGRAD_HD float f8e5m2_bits_to_float(std::uint8_t b) {
  if ((b & 0x7fu) > 0x7cu) return bits_to_float((static_cast<std::uint32_t>(b & 0x80u) << 24) | 0x7fc00000u |
                                                (static_cast<std::uint32_t>(b & 0x3u) << 21));
  return half_bits_to_float(static_cast<std::uint16_t>(static_cast<std::uint16_t>(b) << 8));
}

QGRAD_HD std::uint8_t float_to_f8e5m2_bits(float f) {
  constexpr std::uint32_t fp32_inf = 255u << 23;
  constexpr std::uint32_t fp8_max = 143u << 23;      // 65536.0f
  constexpr std::uint32_t denorm_mask = 134u << 23;  // 2^7: ((127 - 15) + (23 - 2) + 1)
  std::uint32_t f_bits = float_to_bits(f);
  const std::uint32_t sign = f_bits & 0x80000000u;
  f_bits ^= sign;
  std::uint8_t result;
  if (f_bits >= fp8_max) {
    result = f_bits > fp32_inf ? 0x7f : 0x7c;  // NaN, or inf for inf and |x| >= 65536
  } else if (f_bits < (113u << 23)) {
    // Below 2^-14, the smallest normal (subnormal step 2^-16).
    f_bits = float_to_bits(bits_to_float(f_bits) + bits_to_float(denorm_mask));
    result = static_cast<std::uint8_t>(f_bits - denorm_mask);
  } else {
    const std::uint32_t mant_odd = (f_bits >> 21) & 1u;
    f_bits += ((15u - 127u) << 23) + 0xfffffu;
    f_bits += mant_odd;
    result = static_cast<std::uint8_t>(f_bits >> 21);  // 61440 <= |x| < 65536 carries into 0x7c (inf)
  }
  return static_cast<std::uint8_t>(result | (sign >> 24));
}

// An 8-bit floating value stored as bits; Format gives the conversions.
// Arithmetic goes through float.
template <class Format>
struct Float8 {
  std::uint8_t bits = 0;
  Float8() = default;
  QGRAD_HD explicit Float8(float f) : bits(Format::encode(f)) {}
  // From double through float (PyTorch's c10 types have a float constructor
  // only, so a double is rounded to float first: two roundings).
  QGRAD_HD explicit Float8(double d) : bits(Format::encode(static_cast<float>(d))) {}
  QGRAD_HD operator float() const { return Format::decode(bits); }
  QGRAD_HD static Float8 from_bits(std::uint8_t b) {
    Float8 h;
    h.bits = b;
    return h;
  }
};
struct F8E4M3Format {
  static constexpr float max = 448.0f;
  QGRAD_HD static std::uint8_t encode(float f) { return float_to_f8e4m3_bits(f); }
  QGRAD_HD static float decode(std::uint8_t b) { return f8e4m3_bits_to_float(b); }
};
struct F8E5M2Format {
  static constexpr float max = 57344.0f;
  QGRAD_HD static std::uint8_t encode(float f) { return float_to_f8e5m2_bits(f); }
  QGRAD_HD static float decode(std::uint8_t b) { return f8e5m2_bits_to_float(b); }
};
using float8_e4m3 = Float8<F8E4M3Format>;  // torch.float8_e4m3fn
using float8_e5m2 = Float8<F8E5M2Format>;  // torch.float8_e5m2
static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);

template <> struct OpMath<float8_e4m3> { using type = float; };
template <> struct OpMath<float8_e5m2> { using type = float; };

// ---- packed 4-bit integers (s4 [-8, 7], u4 [0, 15]) ----
// Element 2k sits in the low nibble of byte k, element 2k + 1 in its high
// nibble (ONNX INT4/UINT4, docs/docsgen/source/technical/int4.md: "the first
// element is stored in the 4 LSB"); an odd count leaves the last high
// nibble 0.
QGRAD_HD int nibble_get(const std::uint8_t* bytes, std::int64_t i, bool is_signed) {
  const unsigned v = (bytes[i >> 1] >> ((i & 1) * 4)) & 0xfu;
  return is_signed ? static_cast<int>(v ^ 8u) - 8 : static_cast<int>(v);
}
QGRAD_HD std::uint8_t nibble_pack(int lo, int hi) {
  return static_cast<std::uint8_t>((static_cast<unsigned>(lo) & 0xfu) | ((static_cast<unsigned>(hi) & 0xfu) << 4));
}

}  // namespace qgrad
