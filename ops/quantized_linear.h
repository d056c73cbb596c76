// quantized_linear: the W8A8 linear layer (inference; not differentiable).
//
// Formula: a_q = activation quantization of x (viewed [M, K]), then
//   y[m, n] = (sum_k a_q[m, k] * w_q[n, k]) * (sa[m] * sw[n]) + bias[n]
// with the sum exact in int32 and the epilogue in f32 (f64 for an f64
// output), the same operations on both devices (kernels/formulas/qlinear.h).
// Activation quantization (kernels/formulas/dynamic_quant.h):
//   dynamic_per_token: per-row symmetric, sa[m] = max|x[m, :]| / qmax,
//     a_q = clamp(nearbyint(x * (1/sa)), qmin, qmax) (default [-128, 127]);
//     computed in f32 (f64 for an f64 x, whose scale is then rounded to the
//     epilogue type).
//     With mode asymmetric: per-row scale and zero point of
//     dynamic_range_quantize's asymmetric mode over [qmin, qmax] (within s8),
//     and the zero point leaves the GEMM as one exact correction:
//       y[m, n] = (acc[m, n] - za[m] * wsum[n]) * (sa[m] * sw[n]) + bias[n],
//     wsum[n] = sum_k w_q[n, k] (act.weight_row_sums when given, s32 [N] on
//     x's device: precompute it once per weight; otherwise computed per call).
//   static_per_tensor: a_q = clamp(nearbyint(x * (1/sa)) + za, qmin, qmax) - za,
//     one f32 scale and one s32 zero point (host or x's device: a device
//     scale is read only by the kernels, never by the host). qmax - qmin <= 255
//     and the shifted range [qmin - za, qmax - za] must fit s8; with a host
//     zero point this is checked, with a device zero point values outside s8
//     saturate (pass the zero point on the host to have it checked).
//     The QAT flow's quint8 reduce_range activations ([0, 127], any za) fit.
// Dtypes: x f32, f64, f16, bf16; w_q s8 [N, K] (nn.Linear layout); w_scale
// f32 [N]; bias undefined or floating [N]; out f32, f64, f16, bf16.
// Shapes: x [..., K] (any M = numel / K >= 0, including 1), out [..., N];
// any K, N >= 1 (CUDA pads K to a multiple of 16 internally).
// CUDA: int8 tensor cores through cuBLASLt (s8 x s8 -> s32, algorithm cached
// per shape), then one epilogue kernel; see kernels/cuda/lt_gemm.cuh.
// Precision: CPU and CUDA outputs are bit-identical.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/dynamic_quant.h"  // QuantMode

namespace qgrad {

struct ActivationQuant {
  enum Kind { dynamic_per_token, static_per_tensor } kind = dynamic_per_token;
  Tensor scale;       // f32, 1 element (static)
  Tensor zero_point;  // s32, 1 element (static)
  std::int64_t qmin = -128, qmax = 127;
  QuantMode mode = QuantMode::symmetric;  // dynamic_per_token only
  Tensor weight_row_sums;                 // s32 [N], optional (dynamic asymmetric)

  static ActivationQuant dynamic(QuantMode mode = QuantMode::symmetric);
  static ActivationQuant fixed(Tensor scale, Tensor zero_point, std::int64_t qmin, std::int64_t qmax);
};

Tensor quantized_linear(const Tensor& x, const Tensor& w_q, const Tensor& w_scale /*f32 [N]*/,
                        const Tensor& bias /*undefined or float [N]*/, const ActivationQuant& act,
                        DType out_dtype = DType::f32);

}  // namespace qgrad
