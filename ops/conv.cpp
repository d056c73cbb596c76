// conv2d: validation, forward, saved state and backward.
#include "qgrad/ops/conv.h"

#include <atomic>
#include <optional>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/conv.h"
#include "qgrad/ops/check.h"

namespace qgrad {

namespace {

std::atomic<bool> g_conv_allow_tf32{false};

TensorOptions like(const Tensor& t) { return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()); }

// Every argument of conv2d, checked before anything is allocated; the shape
// of the convolution.
kernels::Conv2dShape conv2d_shape(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                  std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> padding,
                                  std::array<std::int64_t, 2> dilation, std::int64_t groups) {
  constexpr const char* op = "conv2d";
  check::floating(x, op, "x");
  QGRAD_CHECK(x.dim() == 4, op, "x", "expected rank 4 [N, C, H, W], got shape ", shape_str(x.shape()));
  check::floating(weight, op, "weight");
  check::same_dtype(weight, x, op, "weight");
  check::same_device(weight, x, op, "weight");
  QGRAD_CHECK(weight.dim() == 4, op, "weight", "expected rank 4 [O, C / groups, kh, kw], got shape ",
              shape_str(weight.shape()));
  if (bias.defined()) {
    check::floating(bias, op, "bias");
    check::same_dtype(bias, x, op, "bias");
    check::same_device(bias, x, op, "bias");
    QGRAD_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, "bias", "expected shape [", weight.size(0),
                "] (the weight's out channels), got ", shape_str(bias.shape()));
  }
  return kernels::conv2d_geometry(x.shape(), weight.shape(), stride, padding, dilation, groups, op, "weight");
}

}  // namespace

void set_conv_allow_tf32(bool allow) { g_conv_allow_tf32.store(allow, std::memory_order_relaxed); }
bool conv_allow_tf32() { return g_conv_allow_tf32.load(std::memory_order_relaxed); }

// Backward: dx = conv2d's transpose applied to dy (cuDNN backward data / the
// GEMM W_gᵀ · dy then col2im), dW = Σ_n dy[n] ⋆ x[n] (cuDNN backward filter /
// col · dyᵀ per image), db[o] = Σ_{n, oh, ow} dy[n, o, oh, ow]. Saves the
// weight when x needs grad and x when the weight needs grad (detached, or
// their channels-last copies where staged: the same bytes); nothing for the
// bias.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::array<std::int64_t, 2> stride,
              std::array<std::int64_t, 2> padding, std::array<std::int64_t, 2> dilation, std::int64_t groups) {
  kernels::Conv2dShape s = conv2d_shape(x, weight, bias, stride, padding, dilation, groups);
  s.allow_tf32 = conv_allow_tf32();  // saved in the backward's copy of s
  Tensor out = Tensor::empty({s.n, s.o, s.oh, s.ow}, like(x));
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  // Channels-last staging (kernels/conv.h) where the backward will run: x
  // and the weight copied once here, the copies saved.
  const bool staged = any_requires_grad({x, weight}) && kernels::conv2d_stages_channels_last(s, x.dtype(), x.device());
  Tensor x_cl, w_cl;
  // The bias. On CUDA added after the convolution, in every dtype, as
  // PyTorch's _convolution does after cuDNN (output.add_(bias)): 16-bit
  // outputs round as PyTorch's do (the convolution's rounding, then the
  // add's), and every pass runs on cuDNN's graph engines at beta = 0 (the
  // legacy beta = 1 engines measured 3-10% slower in f32 and 1.25x PyTorch's
  // time in bf16). On the CPU filled first and the convolution accumulated
  // onto it: 16-bit outputs round once.
  if (staged) {
    x_cl = Tensor::empty({s.n, s.h, s.w, s.c}, like(x));
    w_cl = Tensor::empty({s.o, s.kh, s.kw, s.c}, like(x));
    kernels::to_channels_last(x, x_cl);
    kernels::to_channels_last(weight, w_cl);
    kernels::conv2d_forward_channels_last(s, x_cl, w_cl, out);
    if (bias.defined()) kernels::add_channel_bias(out, bias, s.o, s.oh * s.ow);
  } else if (bias.defined() && x.is_cuda()) {
    kernels::conv2d_forward(s, x, weight, out, false);
    kernels::add_channel_bias(out, bias, s.o, s.oh * s.ow);
  } else {
    if (bias.defined()) kernels::fill_channel_bias(out, bias, s.o, s.oh * s.ow);
    kernels::conv2d_forward(s, x, weight, out, bias.defined());
  }
  if (any_requires_grad({x, weight, bias})) {
    const bool need_b = bias.defined() && bias.requires_grad();
    Tensor sx = need_w ? (staged ? x_cl : x.detach()) : Tensor();
    Tensor sw = need_x ? (staged ? w_cl : weight.detach()) : Tensor();
    // The weight and bias gradients on the side stream (core/device.h), as
    // linear's: only dx leads on to the layers before; dW and db wait for the
    // optimizer, so they run beside dx and the layers' backward before it.
    const bool side = x.is_cuda() && (need_w || need_b) && cuda_side_stream();
    record(
        "conv2d", out, {x, weight, bias},
        [sx, sw, s, need_b, staged, side, shape_x = x.shape(), shape_w = weight.shape()](const Tensor& dy) {
          Tensor gx, gw, gb;
          Tensor dy_cl;  // staged: dy copied channels-last once, for both gradients
          if (staged && (sw.defined() || sx.defined())) {
            dy_cl = Tensor::empty({s.n, s.oh, s.ow, s.o}, like(dy));
            kernels::to_channels_last(dy, dy_cl);
          }
          SideStreamScope parameters(dy.device(), side);  // the fork: once dy (and its copy) is queued
          if (sx.defined()) {
            gw = Tensor::empty(shape_w, like(dy));
            if (staged) kernels::conv2d_backward_weight_channels_last(s, sx, dy_cl, gw);
            else kernels::conv2d_backward_weight(s, sx, dy, gw);
          }
          if (need_b) {
            gb = Tensor::empty({s.o}, like(dy));
            kernels::channel_bias_grad(dy, gb, s.o, s.oh * s.ow);
          }
          if (sw.defined()) {
            // dx on the main stream beside them; where this node itself runs
            // on the side stream (dy was made there), dx stays there after dy.
            std::optional<MainStreamScope> main;
            if (parameters.switched()) main.emplace();
            gx = Tensor::empty(shape_x, like(dy));
            if (staged) kernels::conv2d_backward_input_channels_last(s, dy_cl, sw, gx);
            else kernels::conv2d_backward_input(s, dy, sw, gx);
          }
          return std::vector<Tensor>{gx, gw, gb};
        },
        (need_x ? weight.nbytes() : 0) + (need_w ? x.nbytes() : 0));
    if (side) out.grad_fn()->side_inputs = 0b0110u;  // weight, bias
  }
  return out;
}

}  // namespace qgrad
