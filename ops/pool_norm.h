// Pooling and normalisation for convolutional networks, on NCHW tensors, with
// PyTorch's semantics: max_pool2d (saving the argmax indices, not the input),
// avg_pool2d, adaptive_avg_pool2d, batch_norm (training and evaluation, with
// the running statistics updated in place), and flatten.
#pragma once

#include <cstdint>
#include <optional>

#include "qgrad/core/tensor.h"

namespace qgrad {

struct ObserverUpdate;  // ops/quantize.h

// A pair of sizes (height, width); one value stands for both, as in PyTorch.
struct Size2 {
  std::int64_t h = 0, w = 0;
  constexpr Size2() = default;
  constexpr Size2(std::int64_t both) : h(both), w(both) {}  // NOLINT(google-explicit-constructor)
  constexpr Size2(std::int64_t h_, std::int64_t w_) : h(h_), w(w_) {}
  friend constexpr bool operator==(const Size2&, const Size2&) = default;
};

// max_pool2d's values and the argmax indices (s64, flat ih * W + iw within
// each input plane, as PyTorch's return_indices).
struct MaxPool2dResult {
  Tensor output, indices;
};

// Integer inputs (forward only): max_pool2d, max_pool2d_with_indices,
// avg_pool2d and adaptive_avg_pool2d also take s8 / u8 x, the quantized
// values of a tensor with zero point 0 (symmetric qint8, or quint8 after a
// ReLU), and return the same dtype (the output keeps the input's qparams).
// Max is exact; the averages round as PyTorch's quantized CPU kernels do,
// bit for bit: nearbyint(float(sum) * float(1.0 / divisor)) for avg_pool2d,
// nearbyint(float(sum) * ((1.0f / kh) / kw)) for adaptive_avg_pool2d, clamped
// to the dtype (kernels/formulas/pool.h). docs/ops.md "int8 pooling".

// x [N, C, H, W] floating or s8 / u8. y[n, c, oh, ow] = the largest x[n, c, ih, iw] in
// the window of rows oh * stride.h - padding.h + k * dilation.h (k <
// kernel.h), likewise for columns; padding <= kernel / 2; stride defaults to
// the kernel. Output size floor((H + 2p - d (k - 1) - 1) / s) + 1 (ceil with
// ceil_mode, less a last window starting in the right padding). NaN wins.
Tensor max_pool2d(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                  Size2 dilation = 1, bool ceil_mode = false);
MaxPool2dResult max_pool2d_with_indices(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                                        Size2 padding = 0, Size2 dilation = 1, bool ceil_mode = false);

// max_pool2d(fake_quantize_per_tensor(x, scale, zero_point, qmin, qmax), ...)
// as one op, bit for bit (values and the gradient of x), without the
// fake-quantized tensor: each window is scanned over the fake-quantized
// values, and the backward writes, per element, the max-pooling gradient
// times the fake quant's mask (straight-through). Saves 4 bytes per output
// (the argmax and its mask bit) instead of max_pool2d's 8 and the fake
// quant's bit per input element. scale f32 and zero_point s32 tensors of
// one element (values checked on the CPU, as fake_quantize_per_tensor does);
// floating x only; planes of fewer than 2^31 elements.
Tensor fake_quantize_max_pool2d(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t qmin,
                                std::int64_t qmax, Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                                Size2 padding = 0, Size2 dilation = 1, bool ceil_mode = false);

// The mean of each window (no dilation); divisor: the window clipped to the
// padded input with count_include_pad, else the elements inside the input.
Tensor avg_pool2d(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                  bool ceil_mode = false, bool count_include_pad = true);

// Output (oh, ow): the mean over rows [floor(i H / oh), ceil((i + 1) H / oh))
// and the like for columns. output_size (1, 1) is global average pooling.
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size);

// x [N, C, ...] (rank >= 2), normalised per channel (axis 1):
// y = (x - mean) / sqrt(var + eps) * weight + bias. training: the batch's
// mean and biased variance, and, when running_mean / running_var are given,
// r = (1 - momentum) r + momentum * batch in place (the unbiased variance for
// running_var; not recorded on the tape). Evaluation: the running
// statistics. weight, bias, running_mean, running_var are optional
// (undefined tensors); running statistics are required in evaluation.
// num_batches_tracked (optional, s64 with one element, with the running
// statistics): PyTorch's BatchNorm counter, incremented by one on its device
// in training (no host sync, no extra launch).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5,
                  const Tensor& num_batches_tracked = Tensor());

// relu(batch_norm(...)) as one op (the fused Conv-BN-ReLU's normalisation and
// activation): the same values and gradients, bit for bit, as the two ops,
// without relu's pass over the output, its mask or its backward pass (the
// mask is recomputed from x in batch_norm's backward passes).
Tensor batch_norm_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5,
                       const Tensor& num_batches_tracked = Tensor());

// Conv-BN folding's scale factor (torch.ao's ConvBn2d: bn.weight /
// sqrt(bn.running_var + bn.eps), what the conv's weight is multiplied by
// before its fake quant and its output divided by after): f = weight /
// sqrt(running_var + eps) elementwise, each step rounded as the ops
// div(weight, sqrt(add(running_var, eps))) round it, in one pass; the same
// values and weight gradient (g / sqrt(running_var + eps)) bit for bit. A
// running_var that requires grad (never a batch norm's buffer) takes those
// three ops, for their gradient too.
Tensor batch_norm_scale_factor(const Tensor& weight, const Tensor& running_var, double eps);

// x scaled per channel along `axis` (negative counts from the end) by scale
// [x.size(axis)]: y = x * scale[c], the bits of mul(x, scale.reshape(C, 1,
// ...)) (torch.ao's ConvBn2d: weight * scale_factor.reshape(-1, 1, 1, 1)).
// The backward writes dx = g * scale[c] and dscale[c] = sum of g * x over c's
// elements (mul's rule summed to scale's shape, the same bits) in one pass
// where a channel has fewer than 4096 elements, and folds in a gradient
// already pending for scale (autograd/node.h, FoldingBackwardFn).
Tensor channel_mul(const Tensor& x, const Tensor& scale, std::int64_t axis);

// x [N, C, ...] (rank >= 2) divided per channel (axis 1) by divisor [C], then
// bias [C] added (optional): y = x / divisor[c] + bias[c], rounded as the two
// broadcast ops it replaces (x / divisor.reshape(1, -1, 1, 1) + bias.reshape(
// 1, -1, 1, 1) in PyTorch: the unscaling of torch.ao's ConvBn2d after its
// folded, fake-quantized convolution). Its backward is one pass over dy and
// x (dx, and the per-channel sums of dy and dy * x for bias and divisor).
Tensor channel_div_add(const Tensor& x, const Tensor& divisor, const Tensor& bias = Tensor());

// batch_norm (relu: batch_norm_relu) of channel_div_add(x, divisor, shift)
// as one op (the unscaling and normalisation of torch.ao's ConvBn2d /
// ConvBnReLU2d): the same values, running statistics and gradients (for x,
// divisor, shift, weight and bias), bit for bit, as the two ops, without
// channel_div_add's output: its value is recomputed from x where the
// normalisation reads it, and its backward runs in batch_norm's last
// backward pass.
Tensor channel_div_add_batch_norm(const Tensor& x, const Tensor& divisor, const Tensor& shift, const Tensor& weight,
                                  const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                                  bool training, bool relu, double momentum = 0.1, double eps = 1e-5,
                                  const Tensor& num_batches_tracked = Tensor());

// batch_norm's arguments (with divisor: channel_div_add_batch_norm's) and
// max_pool2d's, gathered for the fused op below.
struct BatchNormArgs {
  Tensor divisor{}, shift{};  // channel_div_add's prologue (divisor undefined: none)
  Tensor weight{}, bias{}, running_mean{}, running_var{}, num_batches_tracked{};
  bool training = true;
  double momentum = 0.1, eps = 1e-5;
};
struct MaxPool2dArgs {
  Size2 kernel_size = 2;
  std::optional<Size2> stride = std::nullopt;
  Size2 padding = 0, dilation = 1;
  bool ceil_mode = false;
};

// The tail of a fused Conv-BN-ReLU block followed by max pooling, as one op:
//   y = channel_div_add_batch_norm(x, bn..., relu = true)  (batch_norm_relu
//       without bn.divisor);
//   observer given: observe_minmax_qparams_(y, *observer, -1, scale,
//       zero_point, qmin, qmax) (the FakeQuantize's observer update);
//   out = fake_quantize_max_pool2d(y, scale, zero_point, qmin, qmax, pool...).
// The same values, running statistics, counter, observer range, qparams and
// gradients (x, divisor, shift, weight, bias) as those ops, bit for bit,
// without y: the observer's range comes from the statistics' pass (each
// channel's input range mapped through the monotone normalisation and relu;
// in evaluation one pass over x), and the pooling reads relu(batch_norm(x))
// where it needs it. Saves what batch_norm_relu and fake_quantize_max_pool2d
// save (x and 4 bytes per output). The observer's range equals the
// composition's unless a divisor is 0 or a weight, bias or shift is
// infinite (kernels::ReluRange); NaN payloads may differ.
Tensor batch_norm_relu_fake_quantize_max_pool2d(const Tensor& x, const BatchNormArgs& bn, const Tensor& scale,
                                                const Tensor& zero_point, std::int64_t qmin, std::int64_t qmax,
                                                const MaxPool2dArgs& pool, const ObserverUpdate* observer = nullptr);

// x with dims start_dim..end_dim merged into one (a reshape; negative dims
// count from the end).
Tensor flatten(const Tensor& x, std::int64_t start_dim = 1, std::int64_t end_dim = -1);

}  // namespace qgrad
