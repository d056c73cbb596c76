// Scalar formulas of the int4 and FP8 quantization ops (ops/lowbit.h),
// shared by the CPU and CUDA kernels (kernels/lowbit.cpp). Every product
// and quotient rounds once, identically on both devices (no FMA
// contraction in this build).
//
// Int4 per group follows torchao (pytorch/ao, torchao/quantization/
// quant_primitives.py): qparams as `_choose_qparams_affine` computes them in
// f32, values as `_fake_quantize_affine` (`_quantize_affine_no_dtype_cast`
// then `_dequantize_affine_no_dtype_check`): q = clamp(round(x * (1 / s)) + zp,
// qmin, qmax), y = (q - zp) * s in f32 (formulas::FakeQuantOp<T, false>).
//
// FP8 follows torchao's `_choose_scale_float8`, `_quantize_affine_float8`
// and `_dequantize_affine_float8`: s = amax / fp8_max, q = fp8(clamp(float(x)
// / s, -fp8_max, fp8_max)) (a true division), y = float(q) * s.
#pragma once

#include <cstdint>
#include <type_traits>

#include "qgrad/core/float8.h"
#include "qgrad/kernels/formulas/observer.h"
#include "qgrad/kernels/formulas/quantize.h"

namespace qgrad::formulas {

// ---- int4 qparams (torchao _choose_qparams_affine, f32) ----
// min_neg = min(min, 0), max_pos = max(max, 0) (NaN propagates);
//   symmetric:  s = max(-min_neg, max_pos) / ((qmax - qmin) / 2), zp = (qmax + qmin + 1) / 2 (int);
//   asymmetric: s = (max_pos - min_neg) / (qmax - qmin),
//               zp = clamp(qmin - round_half_even(min_neg / s), qmin, qmax);
//   s = max(s, eps) (torch.clamp(min = eps): NaN stays NaN).
// A NaN scale gives zp = qmin (asymmetric); the values are then NaN.
QGRAD_HD void int4_qparams(float min_v, float max_v, int qmin, int qmax, bool symmetric, float eps, float& scale,
                           std::int32_t& zp) {
  const float min_neg = min_v != min_v ? min_v : (min_v < 0.0f ? min_v : 0.0f);
  const float max_pos = max_v != max_v ? max_v : (max_v > 0.0f ? max_v : 0.0f);
  float s;
  if (symmetric) {
    const float m = (min_neg != min_neg || max_pos != max_pos) ? (min_neg != min_neg ? min_neg : max_pos)
                                                               : (-min_neg > max_pos ? -min_neg : max_pos);
    s = m / (static_cast<float>(qmax - qmin) / 2.0f);
  } else {
    s = (max_pos - min_neg) / static_cast<float>(qmax - qmin);
  }
  scale = (s != s || s > eps) ? s : eps;
  if (symmetric) {
    zp = static_cast<std::int32_t>((qmax + qmin + 1) / 2);  // Python int() truncates toward zero, as C++ does
    return;
  }
  const float r = round_half_even(min_neg / scale);
  if (r != r) {
    zp = qmin;
    return;
  }
  const std::int64_t z = static_cast<std::int64_t>(qmin) - to_clamped_int(r);
  zp = static_cast<std::int32_t>(clamp_i64(z, qmin, qmax));
}

// ---- FP8 ----
template <class F8>
QGRAD_HD float fp8_max() {
  if constexpr (std::is_same_v<F8, float8_e4m3>) return 448.0f;
  else return 57344.0f;
}

// The smallest amax a dynamic scale is taken from (torchao.float8's EPS in
// amax_to_scale): an all-zero block gets a finite scale, not 0/0.
inline constexpr float kFp8AmaxEps = 1e-12f;

// amax of a block from its min and max (NaN propagates), floored at eps.
QGRAD_HD float fp8_amax(float min_v, float max_v) {
  if (min_v != min_v) return min_v;
  if (max_v != max_v) return max_v;
  const float a = -min_v > max_v ? -min_v : max_v;
  return a > kFp8AmaxEps ? a : kFp8AmaxEps;
}

// q = fp8(clamp(x / s, -max, max)): the value's fp8 bits (NaN stays NaN).
template <class F8>
QGRAD_HD F8 fp8_quant(float x, float scale) {
  const float m = fp8_max<F8>();
  float v = x / scale;
  v = v < -m ? -m : (v > m ? m : v);  // NaN compares false: stays NaN
  return F8(v);
}

// y = float(q) * s, rounded once to T (f64: the exact product).
template <class T, class F8>
QGRAD_HD T fp8_dequant(F8 q, float scale) {
  if constexpr (std::is_same_v<T, double>) return static_cast<double>(static_cast<float>(q)) * static_cast<double>(scale);
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(q) * scale;
  else return T(static_cast<float>(q) * scale);
}

}  // namespace qgrad::formulas
