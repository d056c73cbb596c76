// Int4-weight linear layers for inference (issue #14 item 4): W4A16
// (weight-only int4, GPTQ/AWQ style) and W4A8 (torchao's 8da4w: dynamic
// per-token int8 activations, symmetric int4 per-group weights). Not
// differentiable. Formulas, limits and precision: docs/ops.md, "Int4 linear
// layers"; scalar math: kernels/formulas/lowbit_linear.h.
//
// Weights are packed int4 [N, K] (nn.Linear layout, core/dtype.h's nibble
// order: element 2k in the low nibble of byte k, ONNX's and torchao's), with
// one f32 scale (and, for u4, one s32 zero point) per group of G consecutive
// input channels: w_scale [N, K / G], as choose_qparams_int4 /
// quantize_int4 (ops/lowbit.h) produce them for the weight.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/dynamic_quant.h"  // QuantMode

namespace qgrad {

// W4A16: y = x · W^T + bias with W[n, k] = T((q[n, k] - zp[n, k / G]) * scale[n, k / G])
// (the f32 product rounded once to x's dtype T: dequantize_int4's output in
// T), the dot products accumulated in f32 and rounded once to T, bias (in T)
// added in f32 before that rounding.
// x f32 / bf16 / f16 [..., K] (M = numel / K >= 0); w_q s4 (symmetric: the
// zero point must be undefined) or u4 (w_zero_point s32 [N, K / G], values in
// [0, 15]) packed [N, K], K even; w_scale [N, K / G] (finite, > 0), f32 or
// x's 16-bit dtype T (as torchao's and GPTQ's int4 weights keep them: the
// same formula with s = float(scale); on CUDA the decode-size kernel then
// dequantizes with packed T arithmetic, which gives the same bits because
// (q - zp) * s is exact in f32 for a T scale); G > 0
// divides K (32, 64, 128, 256 in practice); bias undefined or floating [N]
// (rounded to T). Out: x's dtype, [..., N].
Tensor linear_w4a16(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& w_zero_point,
                    std::int64_t group_size, const Tensor& bias = Tensor());

// W4A8 (8da4w inference): a_q, sa, za = per-token dynamic int8 quantization
// of x viewed [M, K] (dynamic_range_quantize's formulas: act_mode symmetric:
// [-128, 127], za = 0, sa = max|x| / 127; asymmetric: sa = (max(hi, 0) -
// min(lo, 0)) / 255, za = clamp(-128 - round(min(lo, 0) / sa), -128, 127)),
// then
//   y[m, n] = sum_g sa[m] * sw[n, g] * (sum_{k in g} (a_q[m, k] - za[m]) * w_q[n, k]) + bias[n]
// with each group sum exact in int32, each group term float(acc) * (sa * sw)
// in f32, the terms added in increasing g, then bias (f32), rounded once to
// out_dtype: CPU and CUDA bit-identical (and, for G = K, bit-identical with
// quantized_linear on the widened weight).
// x f32 / bf16 / f16 [..., K]; w_q s4 packed [N, K], K even; w_scale f32
// [N, K / G] (finite, > 0); bias undefined or floating [N]; out_dtype f32,
// bf16 or f16. CUDA, G = K and symmetric: the weight is widened to s8 (a
// scratch buffer per call) and runs the int8 tensor-core GEMM of
// quantized_linear (cuBLASLt); otherwise a grouped dp4a kernel.
// w_s8 (optional cache): w_q's values widened to s8 [N, K] on
// x's device (w_q.to(DType::s8), kept by the caller: N K more bytes). When
// given, the per-channel symmetric path uses it and skips the per-call
// widening (same bits); other paths ignore it. Checked for dtype, shape and
// device; on the host also for equal values (on CUDA its values are the
// caller's promise: a stale cache gives the product with the cached values).
Tensor linear_w4a8(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, std::int64_t group_size,
                   const Tensor& bias = Tensor(), QuantMode act_mode = QuantMode::asymmetric,
                   DType out_dtype = DType::f32, const Tensor& w_s8 = Tensor());

}  // namespace qgrad
