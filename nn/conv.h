// Convolution layers: Conv2d.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "qgrad/nn/module.h"

namespace qgrad::nn {

// The hyper-parameters of a Conv2d beyond its channels and kernel size
// (torch.nn.Conv2d's keyword arguments).
struct Conv2dOptions {
  std::array<std::int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  std::int64_t groups = 1;
  bool bias = true;
};

// y = conv2d(x, W, b, stride, padding, dilation, groups) (docs/ops.md
// "conv2d"), W: [out, in / groups, kh, kw], b: [out]. Initialised like
// PyTorch's nn.Conv2d (kaiming_uniform with a = sqrt(5)): W and b uniform in
// [-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = (in / groups) · kh · kw,
// drawn from `gen` (weight first, then bias).
class Conv2d : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::array<std::int64_t, 2> kernel_size, Generator& gen,
         Conv2dOptions conv = {}, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  std::vector<Tensor> compute_cast_parameters() const override { return {weight_, bias_}; }
  std::int64_t in_channels() const { return in_; }
  std::int64_t out_channels() const { return out_; }
  std::array<std::int64_t, 2> kernel_size() const { return kernel_; }
  const Conv2dOptions& options() const { return conv_; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }  // undefined without bias

 private:
  std::int64_t in_, out_;
  std::array<std::int64_t, 2> kernel_;
  Conv2dOptions conv_;
  Tensor weight_, bias_;
};

}  // namespace qgrad::nn
