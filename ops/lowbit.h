// Int4 and FP8 quantization ops (issue #14): fake quantize, quantize and
// dequantize to packed int4 per group along the last (input) axis, and to
// FP8 (e4m3 / e5m2) per tensor, channel, token or block. Every op is
// differentiable on the tape. Formulas, limits and saved bytes: docs/ops.md,
// "Int4 and FP8"; scalar math: kernels/formulas/lowbit.h.
//
// Qparams are tensors on the op's device (f32 scale, s32 zero point), or
// computed there from the current values (dynamic): nothing waits on the
// host. Given qparams are value-checked when they live on the CPU.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/activation.h"     // GeluApproximate
#include "qgrad/ops/dynamic_quant.h"  // QuantMode
#include "qgrad/ops/quantize.h"       // QuantScope

namespace qgrad {

// ---- int4 per group (torchao's choose_qparams_affine / fake_quantize_affine) ----
// x [..., D] floating, groups of G consecutive elements along the last axis
// (G > 0 divides D); qparams [..., D/G] (QuantScope::per_group(-1, G)).
// Range: s4 [-8, 7] or u4 [0, 15] (qtype).
struct Int4Qparams {
  Tensor scale;       // f32 [..., D/G]
  Tensor zero_point;  // s32 [..., D/G]
};
// From each group's min/max, in f32 on x's device:
//   symmetric:  scale = max(-min(min, 0), max(max, 0)) / ((qmax - qmin) / 2), zp = (qmax + qmin + 1) / 2;
//   asymmetric: scale = (max(max, 0) - min(min, 0)) / (qmax - qmin), zp = clamp(qmin - round(min_neg / scale));
//   scale floored at eps = the smallest normal of x's dtype (f32's for f64). Not differentiable.
Int4Qparams choose_qparams_int4(const Tensor& x, std::int64_t group_size, QuantMode mode = QuantMode::symmetric,
                                DType qtype = DType::s4);
// y = (clamp(nearbyint(x * (1/scale)) + zp, qmin, qmax) - zp) * scale; dx = dy * 1[qmin <= q <= qmax].
// Dynamic: the qparams of choose_qparams_int4 (the 8da4w weight fake quantizer); or given.
Tensor fake_quantize_int4(const Tensor& x, std::int64_t group_size, QuantMode mode = QuantMode::symmetric,
                          DType qtype = DType::s4);
Tensor fake_quantize_int4(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t group_size,
                          DType qtype = DType::s4);
// q (s4 / u4, packed, x's shape; D even) = clamp(nearbyint(x * (1/scale)) + zp, qmin, qmax);
// dx = dy / scale * 1[qmin <= q <= qmax].
Tensor quantize_int4(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t group_size,
                     DType qtype = DType::s4);
// y = (q - zp) * scale; dq = dy * scale; dscale = sum over the group of dy * (q - zp) when scale requires grad.
Tensor dequantize_int4(const Tensor& q, const Tensor& scale, const Tensor& zero_point, std::int64_t group_size,
                       DType out_dtype = DType::f32);

// ---- FP8 (torchao's _choose_scale_float8 / _quantize_affine_float8) ----
// Scopes: per_tensor(), per_channel(axis), per_token(), per_group(-1, G)
// (G = 128: the 1x128 blocks of DeepSeek-style block scaling); the scale
// has the scope's qparams shape (docs/ops.md, "Quantization vocabulary").
// fp8: f8e4m3 (max 448) or f8e5m2 (max 57344).
// scale = max(amax, 1e-12) / fp8_max per block, on x's device. Not differentiable.
Tensor fp8_scale(const Tensor& x, QuantScope scope, DType fp8 = DType::f8e4m3);
// y = float(fp8(clamp(x / scale, -max, max))) * scale; dx = dy (straight through, saturated values included).
Tensor fake_quantize_fp8(const Tensor& x, QuantScope scope, DType fp8 = DType::f8e4m3);
Tensor fake_quantize_fp8(const Tensor& x, const Tensor& scale, QuantScope scope, DType fp8 = DType::f8e4m3);
// q (fp8, x's shape) = fp8(clamp(x / scale, -max, max)); dx = dy / scale.
Tensor quantize_fp8(const Tensor& x, const Tensor& scale, QuantScope scope, DType fp8 = DType::f8e4m3);
// y = float(q) * scale; dq = dy * scale; dscale = sum over the block of dy * q when scale requires grad.
Tensor dequantize_fp8(const Tensor& q, const Tensor& scale, QuantScope scope, DType out_dtype = DType::f32);

// ---- affine qparams with an explicit range and eps (torchao's choose_qparams_affine) ----
// The qparams of torchao's choose_qparams_affine (MappingType.SYMMETRIC /
// ASYMMETRIC, integer zero point) over any scope (QuantScope; per group along
// the last axis), for an integer range [qmin, qmax] and an explicit eps, in
// f32 on x's device; the formulas of choose_qparams_int4 with scale floored at
// eps. The 8da4w activation fake quantizer is choose_qparams_affine(x,
// per_token(), asymmetric, -128, 127, FLT_EPSILON) followed by fake_quantize
// (ops/quantize.h) with the same scope. Not differentiable.
struct AffineQparams {
  Tensor scale;       // f32, the scope's qparams shape (per tensor: [])
  Tensor zero_point;  // s32, same shape
};
AffineQparams choose_qparams_affine(const Tensor& x, QuantScope scope, QuantMode mode, std::int64_t qmin,
                                    std::int64_t qmax, double eps);

// Dynamic affine fake quantize: choose_qparams_affine(x.detach(), scope, mode,
// qmin, qmax, eps) then fake_quantize(x, scale, zero_point, scope, qmin, qmax)
// (ops/quantize.h), the same values bit for bit; the qparams are not returned
// and take no gradient; dx = dy · 1[qmin <= q <= qmax] (a saved bit mask).
// The 8da4w / 8da8w activations are (per_token(), asymmetric, -128, 127,
// FLT_EPSILON), the 8da8w weights (per_channel(0), symmetric, ...). On CUDA,
// per-token rows and axis-0 channels of 128, 256, 384, 512, 768 or 1024
// elements (f32, bf16, f16) run as one kernel, a warp per row; everything
// else runs the two ops. Errors: those of the two ops.
Tensor fake_quantize_dynamic(const Tensor& x, QuantScope scope, QuantMode mode, std::int64_t qmin, std::int64_t qmax,
                             double eps);

// fake_quantize_dynamic(xs[i], scope, mode, qmin, qmax, eps) for every i,
// the same values bit for bit and the same gradients (each output its own
// autograd node and saved mask), with one CUDA launch for all the tensors its
// row kernel takes that share a device, dtype and row length (a model's
// weights per channel: what a step spent a launch per weight on). Errors:
// "xs" empty; "xs[i]" where fake_quantize_dynamic would name "x"; mode, qmin,
// qmax, eps as fake_quantize_dynamic's; all checked before anything runs.
// With out_dtype (floating): to_batch(the results, *out_dtype) as one op,
// the same values bit for bit; where the row kernel took a tensor and its
// gradient casts back exactly (a 16-bit output of an f32 or f64 tensor, an
// f32 output of an f64 one), its node's backward is one pass,
// dx = cast(dy) * bit (a mixed-precision step's weights: the cast's pass and
// the mask's pass as one, deferred for a leaf); the same gradients bit for
// bit. Errors also: "out_dtype" not floating.
std::vector<Tensor> fake_quantize_dynamic_batch(const std::vector<Tensor>& xs, QuantScope scope, QuantMode mode,
                                                std::int64_t qmin, std::int64_t qmax, double eps,
                                                std::optional<DType> out_dtype = std::nullopt);

// fake_quantize_dynamic(gelu(x, approximate), scope, mode, qmin, qmax, eps)
// as one op, the same values bit for bit on each device: the input of a QAT
// linear after a GELU (the ViT's fc2). Where fake_quantize_dynamic runs its
// CUDA row kernel, one kernel forward (gelu applied to the rows as they are
// loaded; gelu(x) is never written) and one backward,
// dx = gelu'(x) · dy · 1[qmin <= q <= qmax] (x and the bit mask saved);
// elsewhere the two ops. Errors: gelu's and fake_quantize_dynamic's.
Tensor gelu_fake_quantize_dynamic(const Tensor& x, GeluApproximate approximate, QuantScope scope, QuantMode mode,
                                  std::int64_t qmin, std::int64_t qmax, double eps);

}  // namespace qgrad
