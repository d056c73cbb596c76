// Quantization ops: fake quantize (per tensor, per channel, learnable/LSQ),
// quantize / dequantize (per tensor, channel, token, group) to and from s8/u8.
// Every op is differentiable on the tape; the STE ops save a bit-packed
// in-range mask (1 bit per element). Formulas, limits and saved bytes:
// docs/ops.md. Scalar math: kernels/formulas/quantize.h.
//
// Qparams come either as host scalars (value-checked) or as tensors on the
// op's device (f32 scale, s32 zero point): CPU-resident tensors are
// value-checked, CUDA-resident ones are not (that would need a host sync);
// the kernels stay in bounds whatever their values.
#pragma once

#include <cstdint>
#include <vector>

#include "qgrad/core/tensor.h"

namespace qgrad {

// Which elements share one scale and zero point (docs/ops.md, "Quantization
// vocabulary"), and the shape the qparams take for x:
//   per_tensor():         all elements; one element (any shape of numel 1);
//   per_channel(axis):    each index of `axis`; [x.size(axis)];
//   per_token():          each row of the last axis; x.shape[:-1];
//   per_group(axis, G):   G consecutive indices of `axis`; x.shape with
//                         size(axis) / G at axis.
// dynamic_range_quantize (ops/dynamic_quant.h) returns qparams in these
// shapes, so its result dequantizes with the same scope.
struct QuantScope {
  enum Kind : int { tensor, channel, token, group } kind = tensor;  // fixed type: any int is a valid value to reject
  std::int64_t axis = 0;
  std::int64_t group_size = 0;
  static QuantScope per_tensor() { return {tensor, 0, 0}; }
  static QuantScope per_channel(std::int64_t axis) { return {channel, axis, 0}; }
  static QuantScope per_token() { return {token, -1, 0}; }
  static QuantScope per_group(std::int64_t axis, std::int64_t group_size) { return {group, axis, group_size}; }
};

// The three ops over any scope, with qparams as tensors on x's device (f32
// scale, s32 zero point; dequantize also takes any floating scale, with
// a gradient, as dequantize_per_channel does). Same values, masks and
// gradients as the per-scope functions below; the group scope runs along
// the last axis (per_group(-1, G) or per_group(rank - 1, G)).
//   quantize:      q = clamp(nearbyint(x * (1/scale)) + zp, dtype range)
//   dequantize:    y = (q - zp) * scale
//   fake_quantize: y = (clamp(nearbyint(x * (1/scale)) + zp, qmin, qmax) - zp) * scale
Tensor quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point, QuantScope scope,
                DType dtype /*s8|u8*/);
Tensor dequantize(const Tensor& q, const Tensor& scale, const Tensor& zero_point, QuantScope scope,
                  DType out_dtype = DType::f32);
Tensor fake_quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point, QuantScope scope,
                     std::int64_t qmin, std::int64_t qmax);

// y = (clamp(nearbyint(x * (1/scale)) + zp, qmin, qmax) - zp) * scale; dx = dy * 1[qmin <= q <= qmax].
Tensor fake_quantize_per_tensor(const Tensor& x, double scale, std::int64_t zero_point, std::int64_t qmin,
                                std::int64_t qmax);
Tensor fake_quantize_per_tensor(const Tensor& x, const Tensor& scale /*f32, 1 element*/,
                                const Tensor& zero_point /*s32, 1 element*/, std::int64_t qmin, std::int64_t qmax);
Tensor fake_quantize_per_channel(const Tensor& x, const Tensor& scale /*f32 [C]*/, const Tensor& zero_point /*s32 [C]*/,
                                 std::int64_t axis, std::int64_t qmin, std::int64_t qmax);
// relu(fake_quantize_per_tensor(x, scale, zero_point, qmin, qmax)) in one pass
// (the activation fake quant of a QAT linear followed by a ReLU): the
// composition's values; dx = dy where qmin <= q <= qmax and y > 0, else +0
// (relu's select: where q > qmax the composition gives dy * 0 instead, -0
// for a negative dy and NaN for a non-finite one). Saves one bit mask.
Tensor fake_quantize_relu_per_tensor(const Tensor& x, const Tensor& scale /*f32, 1 element*/,
                                     const Tensor& zero_point /*s32, 1 element*/, std::int64_t qmin,
                                     std::int64_t qmax);

// The observer update nn::FakeQuantize runs before its fake quantize: the
// running range run_min / run_max (f32 [C]; C = 1 per tensor) moves to x's
// min/max (averaging_constant < 0: running min/max, else moving average;
// nn::Observer), scale / zero_point are written from it (PyTorch's
// calculate_qparams; symmetric: zero point symmetric_zero_point), then x is
// fake quantized with them (one or two launches on CUDA). The qparams come
// from the observer, so their values are not checked: scale >= eps, or NaN
// when x holds NaN (then the output is NaN with zero gradient, as on CUDA).
struct ObserverUpdate {
  Tensor run_min, run_max;
  double averaging_constant = -1.0;
  bool symmetric = false;
  std::int32_t symmetric_zero_point = 0;
};
Tensor observe_fake_quantize_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                        std::int64_t qmin, std::int64_t qmax, const ObserverUpdate& observer);
Tensor observe_fake_quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                         std::int64_t axis, std::int64_t qmin, std::int64_t qmax,
                                         const ObserverUpdate& observer);
// observe_fake_quantize_per_tensor, then relu, in the same launch:
// fake_quantize_relu_per_tensor's values, mask and gradient with the qparams
// the observer writes (the observer sees x, before the relu).
Tensor observe_fake_quantize_relu_per_tensor(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                             std::int64_t qmin, std::int64_t qmax, const ObserverUpdate& observer);

// observe_fake_quantize_per_channel of several tensors, each with its own
// observer: ys[i] = observe_fake_quantize_per_channel(items[i].x, ...) for
// every i, the same values, observer state and gradients bit for bit, each
// output its own autograd node with its own saved mask. On CUDA the axis-0
// weights the one-launch row kernel takes share one launch (per device,
// dtype, range and averaging constant): a training step's weights do not
// depend on its batch (nn::stage_weight_fake_quants calls this before the
// forward). No two items may share observer state (run_min, run_max, scale,
// zero_point overlapping in memory): one after another they would see each
// other's updates.
struct ChannelObserveArgs {
  Tensor x, scale, zero_point;
  std::int64_t axis = 0, qmin = -128, qmax = 127;
  ObserverUpdate observer;
};
std::vector<Tensor> observe_fake_quantize_per_channel_batch(const std::vector<ChannelObserveArgs>& items);

// LSQ: gradients for x, scale and zero point with PyTorch's formulas.
Tensor fake_quantize_learnable_per_tensor(const Tensor& x, const Tensor& scale /*float, 1 element*/,
                                          const Tensor& zero_point /*float, 1 element*/, std::int64_t qmin,
                                          std::int64_t qmax, double grad_factor = 1.0);
Tensor fake_quantize_learnable_per_channel(const Tensor& x, const Tensor& scale /*float [C]*/,
                                           const Tensor& zero_point /*float [C]*/, std::int64_t axis,
                                           std::int64_t qmin, std::int64_t qmax, double grad_factor = 1.0);

// quantize: q = clamp(nearbyint(x * (1/scale)) + zp, dtype range); dx = dy / scale * mask.
// dequantize: y = (q - zp) * scale; dq = dy * scale.
Tensor quantize_per_tensor(const Tensor& x, double scale, std::int64_t zero_point, DType dtype /*s8|u8*/);
Tensor quantize_per_tensor(const Tensor& x, const Tensor& scale /*f32, 1 element*/,
                           const Tensor& zero_point /*s32, 1 element*/, DType dtype);
Tensor dequantize_per_tensor(const Tensor& q, double scale, std::int64_t zero_point, DType out_dtype = DType::f32);
Tensor dequantize_per_tensor(const Tensor& q, const Tensor& scale, const Tensor& zero_point,
                             DType out_dtype = DType::f32);
Tensor quantize_per_channel(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                            DType dtype);
Tensor dequantize_per_channel(const Tensor& q, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                              DType out_dtype = DType::f32);
Tensor quantize_per_token(const Tensor& x /*[N, D]*/, const Tensor& scale /*[N]*/, const Tensor& zero_point /*[N]*/,
                          DType dtype);
Tensor dequantize_per_token(const Tensor& q, const Tensor& scale, const Tensor& zero_point,
                            DType out_dtype = DType::f32);
Tensor quantize_per_group(const Tensor& x /*[..., D]*/, const Tensor& scale /*[..., D/G]*/, const Tensor& zero_point,
                          std::int64_t group_size, DType dtype);
Tensor dequantize_per_group(const Tensor& q, const Tensor& scale, const Tensor& zero_point, std::int64_t group_size,
                            DType out_dtype = DType::f32);

// The integer range of s8 ([-128, 127]) or u8 ([0, 255]).
std::int64_t quant_min_of(DType dtype);
std::int64_t quant_max_of(DType dtype);

}  // namespace qgrad
