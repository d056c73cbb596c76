// Quantization-aware training of convolutions, after PyTorch's eager-mode
// modules torch.ao.nn.qat.Conv2d and torch.ao.nn.intrinsic.qat.{ConvReLU2d,
// ConvBn2d, ConvBnReLU2d} (torch/ao/nn/intrinsic/qat/modules/conv_fused.py).
//
// prepare_qat (nn/qat.h) fuses the patterns of a Sequential
//   Conv2d -> BatchNorm2d -> ReLU   into ConvBnReLU2d
//   Conv2d -> BatchNorm2d           into ConvBn2d
//   Conv2d -> ReLU                  into QATConv2d with relu (PyTorch's ConvReLU2d)
//   Conv2d                          into QATConv2d
// as torch.ao.quantization.fuse_modules + prepare_qat do: the fused module
// takes the conv's place and name, the BatchNorm2d and ReLU it absorbed are
// replaced by Identity (so every other name, and a checkpoint's keys, stay).
// The fused modules share the Conv2d's and BatchNorm2d's tensors; convert
// (nn/qat.h) turns them into QuantizedConv2d (below).
//
// ConvBn2d folds the batch norm into the weight before the weight fake
// quant, PyTorch's _forward_approximate:
//   running_std  = sqrt(bn.running_var + bn.eps)
//   scale_factor = bn.weight / running_std   [C]  (both as one op: batch_norm_scale_factor)
//   w_fq = weight_fake_quant(weight * scale_factor[:, None, None, None])
//   y    = conv2d(x, w_fq) / scale_factor[None, :, None, None] (+ bias[None, :, None, None])
//   out  = bn(y)   (training: batch statistics, running ones updated with
//                   momentum and the unbiased variance; frozen or eval:
//                   the running statistics)
// then relu (ConvBnReLU2d) and the output activation fake quant. The
// gradient flows to weight, bias, bn.weight (also through scale_factor) and
// bn.bias; running_var is a buffer (no gradient), as in PyTorch.
// freeze_bn_stats() switches the batch norm to its running statistics for
// good (model.train() does not undo it; update_bn_stats() does).
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "qgrad/nn/conv.h"
#include "qgrad/nn/layers.h"
#include "qgrad/nn/pool_norm.h"
#include "qgrad/nn/qat.h"

namespace qgrad::nn {

// Returns its input (torch.nn.Identity): the placeholder fusion leaves where
// a BatchNorm2d or ReLU was absorbed into the module before it.
class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "Identity"; }
};

// conv2d(x, weight_fake_quant(weight), bias) (then relu when `relu`: PyTorch's
// ConvReLU2d), then the output activation fake quant. The weight fake quant
// is the qconfig's weight one on axis 0 (per channel: one scale per output
// channel). Names: "weight", "bias", "weight_fake_quant.*",
// "activation_post_process.*".
class QATConv2d : public Module {
 public:
  QATConv2d(const Conv2d& conv, const QConfig& qconfig, bool relu = false);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return relu_ ? "ConvReLU2d" : "QATConv2d"; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  const Conv2dOptions& options() const { return conv_; }
  bool relu() const { return relu_; }
  const FakeQuantize& weight_fake_quant() const { return *weight_fq_; }
  FakeQuantize& weight_fake_quant() { return *weight_fq_; }
  const FakeQuantize& activation_fake_quant() const { return *act_fq_; }

 private:
  Conv2dOptions conv_;
  bool relu_;
  Tensor weight_, bias_;
  std::shared_ptr<FakeQuantize> weight_fq_, act_fq_;
};

// Conv2d + BatchNorm2d (+ ReLU) with the batch norm folded into the weight
// fake quant (see the top of this file). `bn` must be affine, track running
// statistics and have conv.out_channels() features. Names: "weight",
// "bias" (when the conv has one), "bn.*" (the BatchNorm2d itself),
// "weight_fake_quant.*", "activation_post_process.*".
class ConvBn2d : public Module {
 public:
  ConvBn2d(const Conv2d& conv, std::shared_ptr<BatchNorm2d> bn, const QConfig& qconfig, bool relu = false);
  Tensor forward(const Tensor& x) override;
  // Followed by a MaxPool2d: with relu the normalisation, relu, the
  // activation fake quant and the pooling as one op
  // (FakeQuantize::forward_batch_norm_relu_max_pool); without, the
  // activation fake quant and the pooling (FakeQuantize::forward_max_pool).
  std::optional<Tensor> forward_with_next(const Tensor& x, Module& next) override;
  std::string type_name() const override { return relu_ ? "ConvBnReLU2d" : "ConvBn2d"; }
  // PyTorch's freeze_bn_stats / update_bn_stats: the running statistics
  // stop (resume) moving and normalise in training too.
  void freeze_bn_stats() { freeze_bn_ = true; }
  void update_bn_stats() { freeze_bn_ = false; }
  bool bn_frozen() const { return freeze_bn_; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }  // undefined without bias
  const BatchNorm2d& bn() const { return *bn_; }
  const Conv2dOptions& options() const { return conv_; }
  bool relu() const { return relu_; }
  const FakeQuantize& weight_fake_quant() const { return *weight_fq_; }
  FakeQuantize& weight_fake_quant() { return *weight_fq_; }
  const FakeQuantize& activation_fake_quant() const { return *act_fq_; }
  // The folded weight weight * f[:, None, None, None] (and f) of the next
  // forward, computed now, recorded on the tape as the forward would: what
  // stage_weight_fake_quants fake-quantizes in its batch. The next forward
  // takes them (the same values: the running variance is read before that
  // forward updates it); a later call replaces them.
  Tensor stage_folded_weight();
  // The batch norm folded with its running statistics, for convert (not
  // recorded on the tape): with f = bn.weight / sqrt(running_var + eps),
  //   weight' = weight * f[:, None, None, None]   (what the weight fake quant sees)
  //   bias'   = bn.bias + (bias - running_mean) * f   (bias = 0 when absent)
  std::pair<Tensor, Tensor> folded_weight_bias() const;

 private:
  Tensor scale_factor() const;  // bn.weight / sqrt(running_var + eps), [C]
  Tensor normalized(const Tensor& x);  // the forward before the activation fake quant
  // The folded, weight-fake-quantized convolution z and the fold's factor f.
  std::pair<Tensor, Tensor> folded_conv(const Tensor& x);
  // The normalisation's arguments: channel_div_add_batch_norm's divisor f and
  // shift (the conv's bias), and the BatchNorm2d's (frozen: its running
  // statistics, none moving).
  BatchNormArgs bn_args(const Tensor& f) const;
  Conv2dOptions conv_;
  bool relu_;
  bool freeze_bn_ = false;
  Tensor staged_f_, staged_w_;  // stage_folded_weight's, until the next forward
  Tensor weight_, bias_;
  std::shared_ptr<BatchNorm2d> bn_;
  std::shared_ptr<FakeQuantize> weight_fq_, act_fq_;
};

// ConvBn2d with relu (PyTorch's ConvBnReLU2d).
class ConvBnReLU2d : public ConvBn2d {
 public:
  ConvBnReLU2d(const Conv2d& conv, std::shared_ptr<BatchNorm2d> bn, const QConfig& qconfig)
      : ConvBn2d(conv, std::move(bn), qconfig, /*relu=*/true) {}
};

// The int8 convolution of a converted model (from a QATConv2d, or a
// ConvBn2d with the batch norm folded in by its running statistics).
// Buffers: "weight" (s8 [O, C/groups, kh, kw]), "weight_scale" (f32 [O]),
// "bias" (f32 [O], when present), "input_scale" / "input_zero_point"
// (f32 [1] / s32 [1]) and "output_scale" / "output_zero_point".
//   y   = quantized_conv2d(x, weight, weight_scale, bias,
//                          ActivationQuant::fixed(input qparams, qmin, qmax), stride, padding, dilation, groups)
//   out = fake_quantize_per_tensor(relu ? relu(y) : y, output qparams, qmin, qmax)
// (PyTorch's quint8 output, dequantized), as QuantizedLinear.
class QuantizedConv2d : public QuantizedLayer {
 public:
  QuantizedConv2d(Tensor weight_q, Tensor weight_scale, Tensor bias, Tensor input_scale, Tensor input_zero_point,
                  Tensor output_scale, Tensor output_zero_point, std::int64_t qmin, std::int64_t qmax,
                  Conv2dOptions conv, bool relu);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return relu_ ? "QuantizedConvReLU2d" : "QuantizedConv2d"; }
  const Conv2dOptions& options() const { return conv_; }
  bool relu() const { return relu_; }

 private:
  Conv2dOptions conv_;
  bool relu_;
};

// Every ConvBn2d / ConvBnReLU2d in the tree (torch.ao.nn.intrinsic.qat.
// freeze_bn_stats / update_bn_stats, applied with model.apply).
void freeze_bn_stats(Module& model);
void update_bn_stats(Module& model);

namespace detail {
// prepare_qat's convolution part (nn/qat.cpp): finds the patterns above in
// `model`, checks them all (a BatchNorm2d that does not match its conv is
// an error naming it) and only then replaces them. Returns how many convs
// were fused. Throws qgrad::Error naming "prepare_qat".
std::size_t fuse_conv_qat(Sequential& model, const QConfig& qconfig);
// True for the QAT modules of this file (prepare_qat refuses to run twice).
bool is_qat_conv(const Module& m);
// convert's convolution part (nn/qat.cpp). convertible: a QAT conv module,
// or a layer that moves values of the int8 grid without making new ones
// (Identity, MaxPool2d, Flatten, Unflatten), which the int8 model keeps.
bool convertible(const Module& m);
// The int8 module for child `m` named `name` of a prepared model: a
// QuantizedConv2d for a QATConv2d / ConvBn2d (its input qparams from
// *prev, which then becomes its output fake quant), `m` itself for the
// layers it keeps. Throws qgrad::Error naming "convert" and `name`.
std::shared_ptr<Module> convert_conv(const std::shared_ptr<Module>& m, const FakeQuantize*& prev,
                                     const std::string& name);
}  // namespace detail

}  // namespace qgrad::nn
