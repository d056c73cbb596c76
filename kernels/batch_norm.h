// Kernels of batch_norm over x viewed as [N, C, inner] (AxisLayout around
// axis 1; inner = H * W, or 1 for [N, C]). Per-channel statistics live in
// op math (f32 for f16/bf16, else x's dtype): mean and invstd [C].
//
// The per-channel sums over N * inner elements run in a fixed three-level
// order that depends only on the shape: each chunk of kBatchNormChunk
// elements of a plane (n, c) is split into `lanes` interleaved partials (32,
// halved while a partial would hold fewer than kBatchNormPartialMin
// elements; lane l sums elements l, l + lanes, ... in order, so neighbouring
// CUDA threads read neighbouring elements); each (channel, lane)
// sums its partials over q = (n, chunk) in formulas::lane_sum's order (32
// interleaved runs, then a tree: for_each_column_sum); each channel sums its
// lanes in order. The statistics take one pass over x: each partial holds
// (count, mean, m2) of its elements and the upper levels merge them (Chan et
// al.) in the same order. All are loop bodies of kernels/loop.h, so CPU and
// CUDA give the same bits.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/layout.h"

namespace qgrad::kernels {

inline constexpr std::int64_t kBatchNormChunk = 2048;
inline constexpr std::int64_t kBatchNormPartialMin = 16;

// channel_div_add fused before the normalisation (ops'
// channel_div_add_batch_norm): with `divisor` defined, the functions below
// take x as channel_div_add's input and normalise its value
// T(T(x / divisor[c]) + shift[c]) (shift optional), recomputed where read,
// never stored. The backward then also runs channel_div_add's: dx is the
// gradient of that input, and ddivisor / dshift (each optional) are
// computed as channel_div_add_backward computes them: the same bits as the
// two ops.
struct DivAddPrologue {
  Tensor divisor, shift;
  Tensor ddivisor, dshift;  // backward only
};

// Training statistics: mean[c] = sum / n, var = sum (x - mean)^2 / n
// (biased; merged from the partials' means and m2, above), invstd[c] = 1 / sqrt(var + eps), n = N * inner >= 2. When
// the running statistics are defined (x's dtype, [C]) they move in place: r = (1 - momentum) * r + momentum * batch,
// with the unbiased variance sum (x - mean)^2 / (n - 1) for running_var; num_batches_tracked (s64, one element), when
// defined, is incremented by one in the same kernel.
//
// With `range`, the same launches also give the range of the relu output
// that batch_norm_apply(..., relu = true, pre) would write: range.range
// (f32 [2C]) gets each channel's min at [c] and max at [C + c], converted to
// float as the observers convert. They are the output's values at the ends
// of the channel's input range, each step from that input to the output
// being monotone: so the output's own extremes (the same bits; NaN payloads
// aside) whenever a NaN there also shows at an end of the range, which
// holds unless the divisor is 0 or a weight, bias or shift is infinite.
struct ReluRange {
  Tensor range;         // f32 [2C], written
  Tensor weight, bias;  // batch_norm_apply's (each optional)
};
void batch_norm_stats(const Tensor& x, const AxisLayout& v, double momentum, double eps, const Tensor& running_mean,
                      const Tensor& running_var, const Tensor& mean, const Tensor& invstd,
                      const Tensor& num_batches_tracked = Tensor(), const DivAddPrologue& pre = {},
                      const ReluRange* range = nullptr);
// The range alone, for given statistics (evaluation): one pass over x.
void batch_norm_relu_range(const Tensor& x, const AxisLayout& v, const Tensor& mean, const Tensor& invstd,
                           const ReluRange& range, const DivAddPrologue& pre = {});
// Evaluation statistics: mean = running_mean, invstd = 1 / sqrt(running_var + eps).
void batch_norm_eval_stats(const Tensor& running_mean, const Tensor& running_var, double eps, const Tensor& mean,
                           const Tensor& invstd);
// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c] (weight, bias optional),
// rounded to x's dtype; relu: then relu of that (batch_norm_relu).
void batch_norm_apply(const Tensor& x, const AxisLayout& v, const Tensor& mean, const Tensor& invstd,
                      const Tensor& weight, const Tensor& bias, const Tensor& y, bool relu = false,
                      const DivAddPrologue& pre = {});
// PyTorch's batch_norm backward: with s = sum dy and p = sum dy * (x - mean)
// per channel, dbias = s, dweight = p * invstd, and
//   training: dx = (dy - s / n - (x - mean) * invstd^2 * p / n) * invstd * w
//   eval:     dx = dy * invstd * w.
// dx, dweight, dbias may each be undefined (not computed). relu: dy is the
// gradient of relu(y) (batch_norm_relu); relu's backward, dy where y > 0 else
// 0, is applied to it on the fly, y recomputed from x exactly as
// batch_norm_apply computes it (so `bias` is needed then).
void batch_norm_backward(const Tensor& dy, const Tensor& x, const AxisLayout& v, const Tensor& mean,
                         const Tensor& invstd, const Tensor& weight, bool training, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias, bool relu = false, const Tensor& bias = Tensor(),
                         const DivAddPrologue& pre = {});

// batch_norm_scale_factor (ops/pool_norm.h): std = T(sqrt(T(running_var +
// T(eps)))) and f = T(weight / std) per element, each step rounded as the
// ops add, sqrt and div round it (std is what the backward divides by).
void batch_norm_scale_factor(const Tensor& weight, const Tensor& running_var, double eps, const Tensor& f,
                             const Tensor& std_dev);

// channel_div_add (the unscaling of a folded Conv-BN, ops/pool_norm.h):
// y = T(T(x / divisor[c]) + bias[c]) (bias optional: y = T(x / divisor[c])),
// x viewed as v (channels on axis 1), divisor and bias x's dtype.
void channel_div_add(const Tensor& x, const AxisLayout& v, const Tensor& divisor, const Tensor& bias,
                     const Tensor& y);
// Its backward for upstream dy: dx = dy / divisor[c]; dbias[c] = s and
// ddivisor[c] = -(p / (divisor[c] * divisor[c])) with s = sum dy and
// p = sum dy * x per channel, summed in the three-level order above (one
// pass over dy and x writes dx and the partials). dx, ddivisor, dbias may
// each be undefined (not computed); x is read only for ddivisor.
void channel_div_add_backward(const Tensor& dy, const Tensor& x, const AxisLayout& v, const Tensor& divisor,
                              const Tensor& dx, const Tensor& ddivisor, const Tensor& dbias);

}  // namespace qgrad::kernels
