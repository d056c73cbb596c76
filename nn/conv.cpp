#include "qgrad/nn/conv.h"

#include <cmath>

#include "qgrad/ops/ops.h"

namespace qgrad::nn {

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::array<std::int64_t, 2> kernel_size,
               Generator& gen, Conv2dOptions conv, TensorOptions options)
    : in_(in_channels), out_(out_channels), kernel_(kernel_size), conv_(conv) {
  QGRAD_CHECK(in_channels > 0, "Conv2d", "in_channels", "must be > 0, got ", in_channels);
  QGRAD_CHECK(out_channels > 0, "Conv2d", "out_channels", "must be > 0, got ", out_channels);
  QGRAD_CHECK(kernel_size[0] > 0 && kernel_size[1] > 0, "Conv2d", "kernel_size", "must be > 0, got (",
              kernel_size[0], ", ", kernel_size[1], ")");
  QGRAD_CHECK(conv.groups > 0 && in_channels % conv.groups == 0 && out_channels % conv.groups == 0, "Conv2d",
              "groups", "must be > 0 and divide in_channels (", in_channels, ") and out_channels (", out_channels,
              "), got ", conv.groups);
  QGRAD_CHECK(conv.stride[0] > 0 && conv.stride[1] > 0, "Conv2d", "stride", "must be > 0");
  QGRAD_CHECK(conv.dilation[0] > 0 && conv.dilation[1] > 0, "Conv2d", "dilation", "must be > 0");
  QGRAD_CHECK(conv.padding[0] >= 0 && conv.padding[1] >= 0, "Conv2d", "padding", "must be >= 0");
  QGRAD_CHECK(is_floating(options.dtype), "Conv2d", "options", "dtype must be floating, got ",
              dtype_name(options.dtype));
  options.requires_grad = false;
  const std::int64_t fan_in = in_channels / conv.groups * kernel_size[0] * kernel_size[1];
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight_ = register_parameter(
      "weight", rand({out_channels, in_channels / conv.groups, kernel_size[0], kernel_size[1]}, gen, options, -bound,
                     bound));
  if (conv.bias) bias_ = register_parameter("bias", rand({out_channels}, gen, options, -bound, bound));
}

Tensor Conv2d::forward(const Tensor& x) {
  return ::qgrad::conv2d(to_compute(x), to_compute(weight_), to_compute(bias_), conv_.stride, conv_.padding, conv_.dilation, conv_.groups);
}

}  // namespace qgrad::nn
