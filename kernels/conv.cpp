// conv2d's kernels: the convolution and its gradients go to the CPU code
// (im2col + Eigen GEMM, kernels/cpu/conv.cpp) or to cuDNN
// (kernels/cuda/conv.cu); the bias fill and the bias gradient are written
// once here over kernels/loop.h (the bias gradient agrees bit for bit
// across devices).
#include "qgrad/kernels/conv.h"

#include "qgrad/kernels/cpu/conv.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {

template <class T>
struct FillChannelBias {
  const T* b;
  T* y;
  std::int64_t channels, inner;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = b[(i / inner) % channels]; }
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

void fill_channel_bias(const Tensor& y, const Tensor& bias, std::int64_t channels, std::int64_t inner) {
  dispatch_floating(y.dtype(), "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), y.numel(),
                   FillChannelBias<T>{static_cast<const T*>(bias.data_ptr()), static_cast<T*>(y.data_ptr()), channels,
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
