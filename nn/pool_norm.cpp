#include "qgrad/nn/pool_norm.h"

#include <cmath>
#include <utility>

#include "qgrad/autograd/node.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/factory.h"

namespace qgrad::nn {

BatchNorm2d::BatchNorm2d(std::int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats, TensorOptions options)
    : num_features_(num_features), eps_(eps), momentum_(momentum) {
  QGRAD_CHECK(num_features > 0, "BatchNorm2d", "num_features", "must be > 0, got ", num_features);
  QGRAD_CHECK(std::isfinite(eps) && eps > 0, "BatchNorm2d", "eps", "must be finite and > 0, got ", eps);
  QGRAD_CHECK(!momentum || (std::isfinite(*momentum) && *momentum >= 0 && *momentum <= 1), "BatchNorm2d", "momentum",
              "must be in [0, 1] (or nullopt: a cumulative average), got ", momentum.value_or(0.0));
  QGRAD_CHECK(is_floating(options.dtype), "BatchNorm2d", "options", "dtype must be floating, got ",
              dtype_name(options.dtype));
  options.requires_grad = false;
  if (affine) {
    weight_ = register_parameter("weight", ones({num_features}, options));
    bias_ = register_parameter("bias", zeros({num_features}, options));
  }
  if (track_running_stats) {
    running_mean_ = register_buffer("running_mean", zeros({num_features}, options));
    running_var_ = register_buffer("running_var", ones({num_features}, options));
    num_batches_tracked_ =
        register_buffer("num_batches_tracked", zeros({}, TensorOptions{}.with_dtype(DType::s64).with_device(options.device)));
  }
}

Tensor BatchNorm2d::forward(const Tensor& x) { return run(x, false); }
Tensor BatchNorm2d::forward_relu(const Tensor& x) { return run(x, true); }

Tensor BatchNorm2d::forward_div_add(const Tensor& x, const Tensor& divisor, const Tensor& shift, bool relu) {
  QGRAD_CHECK(divisor.defined(), "BatchNorm2d", "divisor", "is required");
  return run(x, relu, divisor, shift);
}

Tensor normalize(const Tensor& x, const BatchNormArgs& a, bool relu) {
  if (a.divisor.defined())
    return channel_div_add_batch_norm(x, a.divisor, a.shift, a.weight, a.bias, a.running_mean, a.running_var,
                                      a.training, relu, a.momentum, a.eps, a.num_batches_tracked);
  return (relu ? batch_norm_relu : batch_norm)(x, a.weight, a.bias, a.running_mean, a.running_var, a.training,
                                               a.momentum, a.eps, a.num_batches_tracked);
}

BatchNormArgs BatchNorm2d::args(const Tensor& divisor, const Tensor& shift) const {
  const bool tracking = running_mean_.defined();
  const bool count = is_training() && tracking;
  // Cumulative average: momentum 1 / (batches so far, this one included);
  // reading the count is a host sync on CUDA.
  const double momentum = momentum_ ? *momentum_ : count ? 1.0 / (num_batches_tracked_.item() + 1.0) : 0.0;
  // Training, or no running statistics: batch statistics (the running ones
  // updated when tracked). Evaluation with tracking: the running ones.
  // When counting, batch_norm increments num_batches_tracked on its device
  // (after validating its arguments; no host sync, not on the tape).
  return {.divisor = divisor,
          .shift = shift,
          .weight = weight_,
          .bias = bias_,
          .running_mean = running_mean_,
          .running_var = running_var_,
          .num_batches_tracked = count ? num_batches_tracked_ : Tensor(),
          .training = is_training() || !tracking,
          .momentum = momentum,
          .eps = eps_};
}

Tensor BatchNorm2d::run(const Tensor& x, bool relu, const Tensor& divisor, const Tensor& shift) {
  QGRAD_CHECK(x.defined() && x.dim() == 4, "BatchNorm2d", "x", "expected [N, C, H, W], got shape ",
              x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  return normalize(x, args(divisor, shift), relu);
}

MaxPool2d::MaxPool2d(Size2 kernel_size, std::optional<Size2> stride, Size2 padding, Size2 dilation, bool ceil_mode)
    : kernel_(kernel_size), padding_(padding), dilation_(dilation), stride_(stride), ceil_mode_(ceil_mode) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return ::qgrad::max_pool2d(x, kernel_, stride_, padding_, dilation_, ceil_mode_);
}

AvgPool2d::AvgPool2d(Size2 kernel_size, std::optional<Size2> stride, Size2 padding, bool ceil_mode,
                     bool count_include_pad)
    : kernel_(kernel_size), padding_(padding), stride_(stride), ceil_mode_(ceil_mode),
      count_include_pad_(count_include_pad) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return ::qgrad::avg_pool2d(x, kernel_, stride_, padding_, ceil_mode_, count_include_pad_);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return ::qgrad::adaptive_avg_pool2d(x, output_size_); }

Tensor Flatten::forward(const Tensor& x) { return ::qgrad::flatten(x, start_, end_); }

Unflatten::Unflatten(std::int64_t dim, Shape sizes) : dim_(dim), sizes_(std::move(sizes)) {
  QGRAD_CHECK(!sizes_.empty(), "Unflatten", "sizes", "must not be empty");
  for (std::int64_t s : sizes_) QGRAD_CHECK(s > 0, "Unflatten", "sizes", "must be > 0, got ", shape_str(sizes_));
}

Tensor Unflatten::forward(const Tensor& x) {
  QGRAD_CHECK(x.defined(), "Unflatten", "x", "undefined tensor");
  const std::int64_t d = dim_ < 0 ? dim_ + x.dim() : dim_;
  QGRAD_CHECK(d >= 0 && d < x.dim(), "Unflatten", "dim", "dim ", dim_, " out of range for shape ", shape_str(x.shape()));
  std::int64_t n = 1;
  for (std::int64_t s : sizes_) n *= s;
  QGRAD_CHECK(n == x.size(d), "Unflatten", "sizes", shape_str(sizes_), " does not hold dim ", dim_, " of shape ",
              shape_str(x.shape()));
  Shape shape(x.shape().begin(), x.shape().begin() + d);
  shape.insert(shape.end(), sizes_.begin(), sizes_.end());
  shape.insert(shape.end(), x.shape().begin() + d + 1, x.shape().end());
  return x.reshape(shape);
}

}  // namespace qgrad::nn
