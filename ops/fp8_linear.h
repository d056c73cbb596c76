// fp8_linear: the FP8 (e4m3) linear layer for inference on FP8 tensor cores
// (not differentiable; docs/ops.md, "fp8_linear").
//
// Formula: with x viewed [M, K],
//   y = (fp8(x / sx) . w_q^T) * (sx * sw) + bias,
//   fp8(v) = e4m3(clamp(v, -448, 448)) (quantize_fp8's formula),
//   sx = max(amax(x), 1e-12) / 448 (fp8_scale's per-tensor formula) computed
//   on x's device with no host sync, or the given x_scale;
// the sum of the fp8 products in f32 (CUDA: cuBLASLt, fast accumulation
// off; CPU: each product exact in f32, summed in f64, rounded once to f32),
// then y = acc * (sx * sw) + bias in f32, rounded to out_dtype.
// Dtypes: x f32, bf16 or f16 [..., K]; w_q f8e4m3 [N, K] (nn.Linear
// layout); w_scale f32, one element (per tensor); bias undefined or bf16 /
// f32 [N], entering the epilogue as bf16 (the bias type of cuBLASLt's FP8
// kernels: an f32 bias is rounded to bf16 on both devices); x_scale
// undefined (dynamic) or f32, one element; out_dtype bf16 or f32. out
// [..., N]. Any M >= 0, K >= 1, N >= 1 (CUDA pads K and N to multiples of
// 16 internally). Scales on x's device or on the host; host values must be
// finite and > 0 (device values are not read: that would need a sync).
// CUDA: compute capability >= 8.9 (FP8 tensor cores), else qgrad::Error.
// Precision: x's quantized bytes and sx are bit-identical across devices;
// y within the tolerance of docs/ops.md (cuBLASLt's accumulation order).
#pragma once

#include "qgrad/core/tensor.h"

namespace qgrad {

Tensor fp8_linear(const Tensor& x, const Tensor& w_q, const Tensor& w_scale, const Tensor& bias = Tensor(),
                  DType out_dtype = DType::bf16, const Tensor& x_scale = Tensor() /*undefined: dynamic*/);

}  // namespace qgrad
