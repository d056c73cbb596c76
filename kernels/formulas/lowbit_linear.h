// Scalar formulas of the int4 linear layers (ops/lowbit_linear.h), shared by
// the CPU and CUDA kernels (kernels/cpu/lowbit_linear.cpp,
// kernels/cuda/lowbit_linear.cu). The build has no FMA contraction, so every
// product and sum below rounds once, identically on both devices.
#pragma once

#include <cstdint>

#include "qgrad/core/float8.h"  // nibble_get
#include "qgrad/core/half.h"

namespace qgrad::formulas {

// The integer value of nibble u (0..15) of an s4 (two's complement) or u4 weight.
QGRAD_HD int int4_value(unsigned u, bool is_signed) {
  return is_signed ? static_cast<int>(u ^ 8u) - 8 : static_cast<int>(u);
}

// W4A16's dequantized weight: T((q - zp) * s), the f32 product rounded once
// to the activation dtype T (dequantize_int4's value for a T output).
template <class T>
QGRAD_HD T w4a16_weight(int q_minus_zp, float scale) {
  return T(static_cast<float>(q_minus_zp) * scale);
}

// W4A8: one group's term, float(acc) * (sa * sw), in f32 (quantized_linear's
// epilogue, formulas::qlinear_epilogue<float>, for one group). The output is
// term(g = 0) + term(1) + ... in increasing g (the first term is not added
// to a zero, so a lone group gives qlinear_epilogue's bits), then + bias.
QGRAD_HD float w4a8_group_term(std::int32_t acc, float sa, float sw) { return static_cast<float>(acc) * (sa * sw); }

}  // namespace qgrad::formulas
