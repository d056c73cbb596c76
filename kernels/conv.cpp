// conv2d's kernels: the convolution and its gradients go to the CPU code
// (im2col + Eigen GEMM, kernels/cpu/conv.cpp) or to cuDNN
// (kernels/cuda/conv.cu); the bias fill and the bias gradient are written
// once here over kernels/loop.h (the bias gradient agrees bit for bit
// across devices).
#include "qgrad/kernels/conv.h"

#include <climits>

#include "qgrad/kernels/cpu/conv.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/loop.h"
#include "qgrad/kernels/shape.h"

namespace qgrad::kernels {

namespace {

template <class T>
struct FillChannelBias {
  const T* b;
  T* y;
  std::int64_t channels, inner;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = b[(i / inner) % channels]; }
};

template <class T>
struct AddChannelBias {
  const T* b;
  T* y;
  std::int64_t channels, inner;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    y[i] = T(static_cast<M>(y[i]) + static_cast<M>(b[(i / inner) % channels]));
  }
};

// partial[(o * channels + c) * chunks + k] = sum of dy[o, c, k * kBiasChunk ...].
template <class T>
struct BiasPartial {
  const T* dy;
  op_math_t<T>* partial;
  std::int64_t inner, chunks;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const std::int64_t row = i / chunks, k = i - row * chunks;
    const std::int64_t begin = k * kBiasChunk;
    const std::int64_t end = begin + kBiasChunk < inner ? begin + kBiasChunk : inner;
    const T* p = dy + row * inner;
    M acc = M(0);
    for (std::int64_t j = begin; j < end; ++j) acc += M(p[j]);
    partial[i] = acc;
  }
};

// db[c] = sum over o, k of partial[(o * channels + c) * chunks + k].
template <class T>
struct BiasCombine {
  const op_math_t<T>* partial;
  T* db;
  std::int64_t outer, channels, chunks;
  QGRAD_HD void operator()(std::int64_t c) const {
    using M = op_math_t<T>;
    M acc = M(0);
    for (std::int64_t o = 0; o < outer; ++o) {
      const op_math_t<T>* p = partial + (o * channels + c) * chunks;
      for (std::int64_t k = 0; k < chunks; ++k) acc += p[k];
    }
    db[c] = T(acc);
  }
};

}  // namespace

Conv2dShape conv2d_geometry(const Shape& x, const Shape& w, std::array<std::int64_t, 2> stride,
                            std::array<std::int64_t, 2> padding, std::array<std::int64_t, 2> dilation,
                            std::int64_t groups, const char* op, const char* w_arg) {
  // cuDNN takes every size as an int: so does the CPU path, for one limit.
  const char* names[] = {"height", "width"};
  for (int d = 0; d < 2; ++d) {
    QGRAD_CHECK(stride[d] >= 1 && stride[d] <= INT_MAX, op, "stride", names[d], " stride must be in [1, ", INT_MAX,
                "], got ", stride[d]);
    QGRAD_CHECK(padding[d] >= 0 && padding[d] <= INT_MAX / 4, op, "padding", names[d], " padding must be in [0, ",
                INT_MAX / 4, "], got ", padding[d]);
    QGRAD_CHECK(dilation[d] >= 1 && dilation[d] <= INT_MAX, op, "dilation", names[d], " dilation must be in [1, ",
                INT_MAX, "], got ", dilation[d]);
  }
  QGRAD_CHECK(groups >= 1, op, "groups", "must be >= 1, got ", groups);
  for (std::int64_t v : x)
    QGRAD_CHECK(v <= INT_MAX / 4, op, "x", "dimension ", v, " exceeds the limit ", INT_MAX / 4, " (shape ",
                shape_str(x), ")");
  for (std::int64_t v : w)
    QGRAD_CHECK(v <= INT_MAX / 4, op, w_arg, "dimension ", v, " exceeds the limit ", INT_MAX / 4, " (shape ",
                shape_str(w), ")");
  Conv2dShape s;
  s.n = x[0], s.c = x[1], s.h = x[2], s.w = x[3];
  s.o = w[0], s.kh = w[2], s.kw = w[3];
  s.sh = stride[0], s.sw = stride[1], s.ph = padding[0], s.pw = padding[1], s.dh = dilation[0], s.dw = dilation[1];
  s.groups = groups;
  QGRAD_CHECK(s.c >= 1 && s.h >= 1 && s.w >= 1, op, "x", "channels, height and width must be >= 1, got shape ",
              shape_str(x));
  QGRAD_CHECK(s.o >= 1 && w[1] >= 1 && s.kh >= 1 && s.kw >= 1, op, w_arg, "every dimension must be >= 1, got shape ",
              shape_str(w));
  QGRAD_CHECK(s.c % groups == 0, op, "groups", "x's ", s.c, " channels are not divisible by groups = ", groups);
  QGRAD_CHECK(s.o % groups == 0, op, "groups", w_arg, "'s ", s.o, " out channels are not divisible by groups = ",
              groups);
  QGRAD_CHECK(w[1] == s.c / groups, op, w_arg, "expected ", s.c / groups, " in channels per group (x has ", s.c,
              " channels, groups = ", groups, "), got ", w_arg, " shape ", shape_str(w));
  // The dilated kernel must fit in the padded input (else the output is empty).
  const std::int64_t ekh = s.dh * (s.kh - 1) + 1, ekw = s.dw * (s.kw - 1) + 1;
  const std::int64_t ph2 = s.h + 2 * s.ph, pw2 = s.w + 2 * s.pw;
  QGRAD_CHECK(ekh <= ph2 && ekw <= pw2, op, w_arg, "kernel ", s.kh, "x", s.kw, " with dilation (", s.dh, ", ",
              s.dw, ") spans ", ekh, "x", ekw, ", larger than the padded input ", ph2, "x", pw2,
              ": the output would be empty");
  s.oh = (ph2 - ekh) / s.sh + 1;
  s.ow = (pw2 - ekw) / s.sw + 1;
  shape_numel({s.n, s.o, s.oh, s.ow}, op);
  return s;
}

void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y, bool accumulate) {
  if (y.is_cuda()) QGRAD_ON_CUDA(cuda::conv2d_forward(s, x, weight, y, accumulate));
  else cpu::conv2d_forward(s, x, weight, y, accumulate);
}

void conv2d_backward_input(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx) {
  if (dx.is_cuda()) QGRAD_ON_CUDA(cuda::conv2d_backward_input(s, dy, weight, dx));
  else cpu::conv2d_backward_input(s, dy, weight, dx);
}

void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight) {
  if (dweight.is_cuda()) QGRAD_ON_CUDA(cuda::conv2d_backward_weight(s, x, dy, dweight));
  else cpu::conv2d_backward_weight(s, x, dy, dweight);
}

bool conv2d_stages_channels_last([[maybe_unused]] const Conv2dShape& s, [[maybe_unused]] DType dt, Device device) {
  if (!device.is_cuda()) return false;
  bool staged = false;
  QGRAD_ON_CUDA(staged = cuda::conv2d_stages_channels_last(s, dt, device.index));
  return staged;
}

void to_channels_last(const Tensor& in, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::to_channels_last(in, out));
  else permute(in, out, {0, 2, 3, 1});
}

// The staged passes exist on CUDA only (conv2d_stages_channels_last is false
// on the CPU, so conv2d never calls them there).
void conv2d_forward_channels_last([[maybe_unused]] const Conv2dShape& s, [[maybe_unused]] const Tensor& x_cl,
                                  [[maybe_unused]] const Tensor& w_cl, const Tensor& y) {
  QGRAD_CHECK(y.is_cuda(), "conv2d", "x", "channels-last staging is CUDA only");
  QGRAD_ON_CUDA(cuda::conv2d_forward_channels_last(s, x_cl, w_cl, y));
}

void conv2d_backward_input_channels_last([[maybe_unused]] const Conv2dShape& s, [[maybe_unused]] const Tensor& dy_cl,
                                         [[maybe_unused]] const Tensor& w_cl, const Tensor& dx) {
  QGRAD_CHECK(dx.is_cuda(), "conv2d", "x", "channels-last staging is CUDA only");
  QGRAD_ON_CUDA(cuda::conv2d_backward_input_channels_last(s, dy_cl, w_cl, dx));
}

void conv2d_backward_weight_channels_last([[maybe_unused]] const Conv2dShape& s, [[maybe_unused]] const Tensor& x_cl,
                                          [[maybe_unused]] const Tensor& dy_cl, const Tensor& dweight) {
  QGRAD_CHECK(dweight.is_cuda(), "conv2d", "x", "channels-last staging is CUDA only");
  QGRAD_ON_CUDA(cuda::conv2d_backward_weight_channels_last(s, x_cl, dy_cl, dweight));
}

void fill_channel_bias(const Tensor& y, const Tensor& bias, std::int64_t channels, std::int64_t inner) {
  dispatch_floating(y.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), y.numel(),
                   FillChannelBias<T>{static_cast<const T*>(bias.data_ptr()), static_cast<T*>(y.data_ptr()), channels,
                                     inner},
                   "conv2d");
  });
}

void add_channel_bias(const Tensor& y, const Tensor& bias, std::int64_t channels, std::int64_t inner) {
  dispatch_floating(y.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), y.numel(),
                   AddChannelBias<T>{static_cast<const T*>(bias.data_ptr()), static_cast<T*>(y.data_ptr()), channels,
                                     inner},
                   "conv2d");
  });
}

void channel_bias_grad(const Tensor& dy, const Tensor& dbias, std::int64_t channels, std::int64_t inner) {
  dispatch_floating(dy.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const std::int64_t outer = channels * inner == 0 ? 0 : dy.numel() / (channels * inner);
    const std::int64_t chunks = (inner + kBiasChunk - 1) / kBiasChunk;
    const DType math = sizeof(M) == 8 ? DType::f64 : DType::f32;
    Tensor partial = Tensor::empty({outer * channels * chunks},
                                   TensorOptions{}.with_dtype(math).with_device(dy.device()));
    for_each_index(dy.device(), partial.numel(),
                   BiasPartial<T>{static_cast<const T*>(dy.data_ptr()), static_cast<M*>(partial.data_ptr()), inner,
                                  chunks},
                   "conv2d");
    for_each_index(dbias.device(), channels,
                   BiasCombine<T>{static_cast<const M*>(partial.data_ptr()), static_cast<T*>(dbias.data_ptr()), outer,
                                  channels, chunks},
                   "conv2d");
  });
}

}  // namespace qgrad::kernels
