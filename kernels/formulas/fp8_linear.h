// Scalar formulas of the FP8 linear (ops/fp8_linear.h), shared by the CPU
// and CUDA kernels so that x's quantized bytes and its scale agree bit for
// bit across devices (the GEMM's sum cannot: cuBLASLt's order is its own).
#pragma once

#include <cstdint>

#include "qgrad/core/float8.h"
#include "qgrad/kernels/formulas/lowbit.h"

namespace qgrad::formulas {

// |x| as bits that order like the values: the max over them is max |x|,
// with a NaN winning over everything (its bits exceed +inf's) and -0 as +0.
// An unsigned max is order-free, so the CPU loop and the CUDA atomics agree.
QGRAD_HD std::uint32_t fp8_abs_bits(float x) { return float_to_bits(x) & 0x7fffffffu; }

// The dynamic per-tensor scale from max |x| (as fp8_abs_bits): the
// fp8_scale formula, max(amax, 1e-12) / 448 (NaN propagates).
QGRAD_HD float fp8_linear_scale(std::uint32_t amax_bits) {
  const float a = bits_to_float(amax_bits);
  return fp8_amax(-a, a) / fp8_max<float8_e4m3>();
}

// The epilogue as cuBLASLt applies it to the f32 accumulator:
//   y = acc * (sx * sw) + bias (bias: the bf16 value widened), in f32.
QGRAD_HD float fp8_linear_epilogue(float acc, float sx, float sw, float bias, bool has_bias) {
  const float y = acc * (sx * sw);
  return has_bias ? y + bias : y;
}

}  // namespace qgrad::formulas
