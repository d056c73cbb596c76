// quantized_conv2d: the int8 convolution (inference; not differentiable).
//
// Formula: a_q = the static per-tensor activation quantization of x (the
// input's qparams from QAT; exactly ActivationQuant::static_per_tensor's
// formula of quantized_linear, kernels/formulas/qlinear.h quantize_shifted):
//   a_q - za = clamp(nearbyint(x * (1/sa)) + za, qmin, qmax) - za,
// then, for each output channel o of group g = o / (O / groups),
//   y[n, o, oh, ow] = (sum over c < C/groups, i < kh, j < kw, exact in int32, of
//                      (a_q - za)[n, g C/groups + c, oh sh - ph + i dh, ow sw - pw + j dw] * w_q[o, c, i, j])
//                     * (sa * sw[o]) + bias[o]
// where a position in the zero padding contributes a_q - za = 0 (PyTorch's
// quantized conv pads with the zero point). The epilogue is quantized_linear's
// (f32 math, f64 for an f64 output), rounded once to out_dtype.
// Dtypes: x f32, f64, f16, bf16 (NCHW); w_q s8 [O, C/groups, kh, kw]
// (per-channel symmetric, axis 0); w_scale f32 [O]; bias undefined or
// floating [O]; out f32, f64, f16, bf16. act: static_per_tensor only.
// Shapes: as conv2d (N may be 0; the dilated kernel fits the padded input).
// CPU: quantize + im2col in one pass into an s8 column matrix, then
// quantized_linear's int8 dot products; CUDA: the same column pass, then per
// group cuBLASLt's s8 x s8 -> s32 GEMM (tensor cores) and one epilogue pass
// writing NCHW. Precision: CPU and CUDA outputs are bit-identical.
// docs/ops.md "quantized_conv2d".
#pragma once

#include <array>
#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/quantized_linear.h"

namespace qgrad {

Tensor quantized_conv2d(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& bias,
                        const ActivationQuant& act, std::array<std::int64_t, 2> stride = {1, 1},
                        std::array<std::int64_t, 2> padding = {0, 0}, std::array<std::int64_t, 2> dilation = {1, 1},
                        std::int64_t groups = 1, DType out_dtype = DType::f32);

}  // namespace qgrad
