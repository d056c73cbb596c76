// Pooling and normalisation layers over the ops of ops/pool_norm.h:
// BatchNorm2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Flatten, Unflatten (PyTorch's
// nn modules of the same names and defaults).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "qgrad/nn/module.h"
#include "qgrad/ops/pool_norm.h"

namespace qgrad::nn {

// The batch norm (with relu: batch_norm_relu) that `a` describes:
// channel_div_add_batch_norm when a.divisor is defined, else batch_norm /
// batch_norm_relu.
Tensor normalize(const Tensor& x, const BatchNormArgs& a, bool relu);

// y = batch_norm(x, weight, bias, running_mean, running_var, ...) over
// x [N, C, H, W] with C = num_features. Parameters weight (ones) and bias
// (zeros) when affine; buffers running_mean (zeros), running_var (ones) and
// num_batches_tracked (s64 scalar, 0) when track_running_stats, so a
// checkpoint holds them. In training mode the batch statistics normalise
// and the running ones move by `momentum`; momentum = nullopt is PyTorch's
// cumulative average 1 / num_batches_tracked (which reads the count back to
// the host: a sync on CUDA). In eval mode the running statistics normalise
// (without tracking, the batch statistics always do).
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(std::int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)) as one op (batch_norm_relu), for the fused
  // Conv-BN-ReLU modules: the same values and gradients.
  Tensor forward_relu(const Tensor& x);
  // forward (relu: forward_relu) of channel_div_add(x, divisor, shift) as
  // one op (channel_div_add_batch_norm), for the fused Conv-BN modules'
  // unscaling: the same values and gradients.
  Tensor forward_div_add(const Tensor& x, const Tensor& divisor, const Tensor& shift, bool relu);
  // The arguments forward_div_add passes its op (the train / eval choice,
  // the momentum, the counter), for the ops that fuse the normalisation with
  // what follows it (FakeQuantize::forward_batch_norm_relu_max_pool).
  BatchNormArgs args(const Tensor& divisor = Tensor(), const Tensor& shift = Tensor()) const;
  std::string type_name() const override { return "BatchNorm2d"; }
  std::int64_t num_features() const { return num_features_; }
  double eps() const { return eps_; }
  std::optional<double> momentum() const { return momentum_; }
  Tensor weight() const { return weight_; }  // undefined unless affine
  Tensor bias() const { return bias_; }
  Tensor running_mean() const { return running_mean_; }  // undefined unless tracking
  Tensor running_var() const { return running_var_; }
  Tensor num_batches_tracked() const { return num_batches_tracked_; }

 private:
  Tensor run(const Tensor& x, bool relu, const Tensor& divisor = Tensor(), const Tensor& shift = Tensor());

  std::int64_t num_features_;
  double eps_;
  std::optional<double> momentum_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                     Size2 dilation = 1, bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MaxPool2d"; }
  Size2 kernel_size() const { return kernel_; }
  std::optional<Size2> stride() const { return stride_; }
  Size2 padding() const { return padding_; }
  Size2 dilation() const { return dilation_; }
  bool ceil_mode() const { return ceil_mode_; }

 private:
  Size2 kernel_, padding_, dilation_;
  std::optional<Size2> stride_;
  bool ceil_mode_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                     bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AvgPool2d"; }

 private:
  Size2 kernel_, padding_;
  std::optional<Size2> stride_;
  bool ceil_mode_, count_include_pad_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size) : output_size_(output_size) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }

 private:
  Size2 output_size_;
};

class Flatten : public Module {
 public:
  explicit Flatten(std::int64_t start_dim = 1, std::int64_t end_dim = -1) : start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Flatten"; }

 private:
  std::int64_t start_, end_;
};

// x with dim `dim` (negative counts from the end) split into `sizes`, whose
// product must equal that dim (torch.nn.Unflatten; a reshape, on the tape):
// Unflatten(1, {1, 28, 28}) turns [N, 784] images into [N, 1, 28, 28].
class Unflatten : public Module {
 public:
  Unflatten(std::int64_t dim, Shape sizes);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Unflatten"; }

 private:
  std::int64_t dim_;
  Shape sizes_;
};

}  // namespace qgrad::nn
