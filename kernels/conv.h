// Kernels of conv2d: the convolution and its two gradients (CPU: im2col and
// the Eigen GEMM, kernels/cpu/conv.cpp; CUDA: cuDNN, kernels/cuda/conv.cu),
// and the per-channel bias add, written once over kernels/loop.h.
#pragma once

#include <array>
#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

// One convolution: x [n, c, h, w] (NCHW), weight [o, c / groups, kh, kw],
// y [n, o, oh, ow] with oh = (h + 2 ph - dh (kh - 1) - 1) / sh + 1 (ow
// alike). All tensors contiguous, one floating dtype, one device. The ops
// layer has checked every size (n may be 0; everything else >= 1).
struct Conv2dShape {
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // input
  std::int64_t o = 0, kh = 0, kw = 0;       // weight (its channels: c / groups)
  std::int64_t oh = 0, ow = 0;              // output
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  // f32 on CUDA may take TF32 tensor-core engines (qgrad::set_conv_allow_tf32);
  // ignored by every other dtype and by the CPU.
  bool allow_tf32 = false;

  std::int64_t c_per_group() const { return c / groups; }
  std::int64_t o_per_group() const { return o / groups; }
  // Rows of the im2col matrix of one group: (c / groups) · kh · kw.
  std::int64_t patch() const { return c_per_group() * kh * kw; }
  // True for a 1x1, stride 1, unpadded convolution: the input is its own
  // im2col matrix.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// The geometry of a convolution of x [N, C, H, W] with a weight [O, C /
// groups, kh, kw] (argument `w_arg` of `op`: conv2d's "weight",
// quantized_conv2d's "w_q"): every size, stride, padding, dilation and group
// count checked (qgrad::Error naming op and argument; sizes within cuDNN's
// int limits, for one limit on both devices), the output size computed. The
// ops check the tensors' ranks, dtypes and devices before calling it.
Conv2dShape conv2d_geometry(const Shape& x, const Shape& w, std::array<std::int64_t, 2> stride,
                            std::array<std::int64_t, 2> padding, std::array<std::int64_t, 2> dilation,
                            std::int64_t groups, const char* op, const char* w_arg);

// y = conv(x, weight), or with accumulate y += conv(x, weight) (the sum
// formed in op math and rounded once); every element of y written.
void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y,
                    bool accumulate = false);
// dx = the gradient of the input for upstream dy (every element written).
void conv2d_backward_input(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx);
// dweight = the gradient of the weight, summed over the batch (every element
// written; zeros when n == 0).
void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight);
// Channels-last staging (CUDA): cuDNN's tensor-core engines work in NHWC
// and convert NCHW operands on every pass (x in the forward and again in the
// weight gradient, dy in both gradients). conv2d instead converts x and the
// weight once in the forward and saves those copies, and dy once in the
// backward, and runs each pass on engines taking the staged operands and
// writing NCHW: H200, the CNN's 256x32x14x14 -> 64 TF32 convolution, the
// three passes 27.3 + 43.0 + 66.0 us NCHW, 23.0 + 33.1 + 51.7 us so
// (dev/cuda/cudnn_engines.cu), plus three copies; the TF32 CNN step's peak
// memory 232.6 -> 215.8 MB (docs/benchmarks.md).
//
// True where conv2d stages a convolution of dtype dt on `device` so: f32
// with TF32 allowed (the configuration measured), one group of at least 8
// input channels (fewer go to the direct kernels), channel counts that are
// multiples of 4, and graph-API engines that build for all three staged
// passes (tried once per shape, cached). False on the CPU.
bool conv2d_stages_channels_last(const Conv2dShape& s, DType dt, Device device);
// out [a, h, w, b] = in [a, b, h, w] (any dtype with an element type): the
// staged copies. CPU: kernels::permute; CUDA: a 32 x 32-tiled transpose
// (16 bytes a thread for 4-byte elements, h * w and b multiples of 4).
void to_channels_last(const Tensor& in, const Tensor& out);
// The three passes on staged operands (x_cl [n, h, w, c], w_cl [o, kh, kw,
// c], dy_cl [n, oh, ow, o]), y, dx and dweight NCHW, every element written;
// only where conv2d_stages_channels_last(s, ...) held.
void conv2d_forward_channels_last(const Conv2dShape& s, const Tensor& x_cl, const Tensor& w_cl, const Tensor& y);
void conv2d_backward_input_channels_last(const Conv2dShape& s, const Tensor& dy_cl, const Tensor& w_cl,
                                         const Tensor& dx);
void conv2d_backward_weight_channels_last(const Conv2dShape& s, const Tensor& x_cl, const Tensor& dy_cl,
                                          const Tensor& dweight);
// y[o, c, j] = bias[c] for y viewed as [outer, channels, inner] (the bias
// the convolution then accumulates onto).
void fill_channel_bias(const Tensor& y, const Tensor& bias, std::int64_t channels, std::int64_t inner);
// y[n, c, ...] += bias[c], rounded once to y's dtype (f32/f64: the same
// number as a convolution accumulated onto the filled bias).
void add_channel_bias(const Tensor& y, const Tensor& bias, std::int64_t channels, std::int64_t inner);
// dbias[c] = the sum of dy[:, c, :] for dy viewed as [outer, channels,
// inner], in op_math_t and in a fixed order: partial sums over fixed chunks
// of kBiasChunk elements of each (outer, channel) row, then, per channel,
// the partials in (outer, chunk) order; rounded once. The same loops on both
// devices, so CPU and CUDA agree bit for bit.
inline constexpr std::int64_t kBiasChunk = 256;
void channel_bias_grad(const Tensor& dy, const Tensor& dbias, std::int64_t channels, std::int64_t inner);

}  // namespace qgrad::kernels
