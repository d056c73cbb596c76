// The transformer ops beyond the activations: layer_norm, rms_norm,
// embedding and dropout (PyTorch 2.11 semantics; docs/ops.md, "Transformer ops").
#pragma once

#include <cstdint>
#include <optional>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/dynamic_quant.h"  // QuantMode

namespace qgrad {

// (x - mean) / sqrt(var + eps) * weight + bias over the last
// normalized_shape.size() dims of x (which must equal normalized_shape);
// var is the biased variance. weight and bias: undefined, or of shape
// normalized_shape, x's dtype and device. eps finite and > 0. Its backward
// keeps x, weight, and the per-row mean and 1/std (f32; f64 for f64 x).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// fake_quantize_dynamic(layer_norm(x, normalized_shape, weight, bias, eps),
// QuantScope::per_token(), mode, qmin, qmax, quant_eps) (ops/lowbit.h) as one
// op, the same values bit for bit on each device: a LayerNorm before a QAT
// linear with dynamic per-token int8 activations (the ViT's ln1 -> in_proj and
// ln2 -> fc1). Where normalized_shape is x's last dim of 128, 256, 384, 512,
// 768 or 1024 elements and x is a CUDA f32 / bf16 / f16 tensor, one kernel
// forward (the layer norm's output is never written); the backward is the
// composition's (the fake quant's mask, then layer_norm's backward), saving
// x, weight, the row statistics and the mask. Elsewhere the two ops. Errors:
// layer_norm's and fake_quantize_dynamic's (mode, qmin, qmax, quant_eps as
// its eps), under this op's name.
Tensor layer_norm_fake_quantize_dynamic(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                        const Tensor& bias, double eps, QuantMode mode, std::int64_t qmin,
                                        std::int64_t qmax, double quant_eps);
// x / sqrt(mean(x^2) + eps) * weight over the last dims, as layer_norm
// (no centring, no bias). eps defaults to the machine epsilon of the math
// type (float's for f32, f16, bf16; double's for f64), as PyTorch's rms_norm.
// Its backward keeps x, weight and the per-row 1/rms.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<double> eps = std::nullopt);
// weight[indices] : [indices.shape..., D] for weight [V, D] (floating) and
// indices s32 or s64 of any shape. Indices outside [0, V) throw on the CPU;
// on CUDA (checking would need a host sync) their output rows are NaN and
// they add nothing to the gradient. padding_idx (in [-V, V); negative counts
// from V): that row's gradient is zero. The gradient is dense, summed per
// row in the order of the indices (the same bits on CPU and CUDA).
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<std::int64_t> padding_idx = std::nullopt);
// training and 0 < p: x * mask / (1 - p), mask_i = [u_i >= p] with u_i the
// counter-based uniform of (generator seed, offset + i) (the same mask on
// CPU and CUDA); the generator advances by numel(x). p == 1 gives x * 0.
// Not training, or p == 0: returns x itself. p in [0, 1]. Its backward
// keeps the mask as bits (n / 8 bytes).
Tensor dropout(const Tensor& x, double p, bool training = true, Generator& generator = default_generator());

}  // namespace qgrad
