// Scalar formulas of the W8A8 quantized linear, shared by the CPU and CUDA
// kernels: the int32 accumulation is exact on both devices, and the float
// epilogue below is the same sequence of operations on both, so outputs are
// bit-identical.
//
//   y[m, n] = M(acc[m, n]) * (sa[m] * sw[n]) + bias[n]
// (asymmetric per-token activations: acc - za[m] * wsum[n] in place of acc)
//
// M (the epilogue math type) is double when the output is f64, float
// otherwise; sa, sw and bias are converted to M first (exactly, as they are
// f32, or f64 for an f64 activation scale). The output is then rounded once
// to its dtype.
#pragma once

#include <cstdint>

#include "qgrad/kernels/formulas/dynamic_quant.h"

namespace qgrad::formulas {

template <class M>
QGRAD_HD M qlinear_epilogue(std::int32_t acc, M sa, M sw, M bias, bool has_bias) {
  const M v = static_cast<M>(acc) * (sa * sw);
  return has_bias ? v + bias : v;
}

// Asymmetric per-token activations (a = q - za[m]): the zero point leaves
// the integer GEMM as one correction, sum_k (q - za) w = acc - za * wsum[n]
// with wsum[n] = sum_k w[n, k], exact in 64 bits, then the same epilogue:
//   y[m, n] = M(acc - za[m] * wsum[n]) * (sa[m] * sw[n]) + bias[n]
template <class M>
QGRAD_HD M qlinear_epilogue_zp(std::int32_t acc, std::int32_t za, std::int32_t wsum, M sa, M sw, M bias,
                               bool has_bias) {
  const std::int64_t c = static_cast<std::int64_t>(acc) - static_cast<std::int64_t>(za) * wsum;
  const M v = static_cast<M>(c) * (sa * sw);
  return has_bias ? v + bias : v;
}

// Static per-tensor activation quantization with a zero point, shifted so
// the stored value fits s8: a = clamp(nearbyint(x * inv_sa) + za, qmin, qmax) - za,
// saturated to [-128, 127] (reached only for a device-resident zero point
// that the host could not check).
template <class M>
QGRAD_HD std::int8_t quantize_shifted(M x, M inv_sa, int za, int qmin, int qmax) {
  int v = quantize_value<M>(x, inv_sa, za, qmin, qmax) - za;
  v = v < -128 ? -128 : (v > 127 ? 127 : v);
  return static_cast<std::int8_t>(v);
}

}  // namespace qgrad::formulas
