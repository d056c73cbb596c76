// Quantization-aware training flow, after PyTorch's eager mode:
//   prepare_qat(model)  inserts an input fake quant ("quant", like a
//                       QuantStub) and swaps each Linear for a QATLinear;
//   ... train ...;
//   convert(model)      builds an int8 model of QuantizedLinear layers.
//
// Why the int8 model predicts what the fake-quant model predicts: each
// QuantizedLinear quantizes its input with exactly the qparams the
// fake-quant model used for that tensor (the scale/zero_point buffers of
// the preceding fake quant: "quant" for the first layer, the previous
// layer's output fake quant after that), with the same rounding
// (nearbyint(x * (1/scale)) + zp, clamped); ReLU commutes with that
// quantization (zp lies in [qmin, qmax], so relu(fq(y)) = fq(relu(y)));
// its int8 weights are quantize_per_channel with the weight fake quant's
// qparams, so w_q * w_scale equals fake_quant(w) exactly; and its float
// output is re-quantized by the next layer's static activation quant (and,
// for the last layer, by its own output qparams) exactly as the fake quant
// would. The one difference is the accumulation: int32 exact sums in the
// int8 layer versus float sums of the same products in the fake-quant
// matmul, a relative difference near float epsilon that can move a value
// across a rounding boundary only when it lies within that distance of it.
#pragma once

#include "qgrad/nn/layers.h"
#include "qgrad/nn/quant.h"

namespace qgrad::nn {

struct QConfig {
  ObserverOptions activation;
  ObserverOptions weight;
};
// PyTorch's default QAT qconfig for 'x86'/'fbgemm': activations quint8 per
// tensor affine, range [0, 255] reduced to [0, 127], moving average 0.01;
// weights qint8 per channel symmetric on axis 0, [-128, 127], moving average 0.01.
QConfig default_qat_qconfig();

// F.linear(x, weight_fake_quant(weight), bias) followed by the output
// activation fake quant. Shares weight and bias with the Linear it wraps.
// Names: "weight", "bias", "weight_fake_quant.*", "activation_post_process.*".
class QATLinear : public Module {
 public:
  QATLinear(const Linear& linear, const QConfig& qconfig);
  Tensor forward(const Tensor& x) override;
  // Followed by a ReLU: relu(forward(x)) with the relu inside the activation
  // fake quant (FakeQuantize::forward_relu: one pass and one backward pass
  // fewer; the same values and observer state).
  std::optional<Tensor> forward_with_next(const Tensor& x, Module& next) override;
  std::string type_name() const override { return "QATLinear"; }
  // The bias (the weight is cast after its fake quant).
  std::vector<Tensor> compute_cast_parameters() const override { return {bias_}; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  const FakeQuantize& weight_fake_quant() const { return *weight_fq_; }
  FakeQuantize& weight_fake_quant() { return *weight_fq_; }
  const FakeQuantize& activation_fake_quant() const { return *act_fq_; }

 private:
  Tensor weight_, bias_;
  std::shared_ptr<FakeQuantize> weight_fq_, act_fq_;
};

// The int8 linear layer of a converted model. Buffers: "weight" (s8
// [N, K]), "weight_scale" (f32 [N]), "bias" (f32 [N], when present),
// "input_scale" / "input_zero_point" (f32 [1] / s32 [1]) and
// "output_scale" / "output_zero_point".
//   y = quantized_linear(x, weight, weight_scale, bias, ActivationQuant::fixed(input qparams, qmin, qmax))
//   out = fake_quantize_per_tensor(y, output qparams, qmin, qmax)   (PyTorch's quint8 output, dequantized)
// What the int8 layers of a converted model hold (QuantizedLinear here,
// QuantizedConv2d in nn/qat_conv.h): the buffers below, checked by the
// constructor (the weight s8 of rank `weight_rank`, its scale f32 [N], the
// bias floating [N] or absent, the qparams f32 [1] / s32 [1], qmin < qmax).
class QuantizedLayer : public Module {
 public:
  Tensor weight() const { return weight_; }
  Tensor weight_scale() const { return weight_scale_; }
  Tensor bias() const { return bias_; }
  Tensor input_scale() const { return in_scale_; }
  Tensor input_zero_point() const { return in_zp_; }
  Tensor output_scale() const { return out_scale_; }
  Tensor output_zero_point() const { return out_zp_; }
  std::int64_t qmin() const { return qmin_; }  // the activations' quant range
  std::int64_t qmax() const { return qmax_; }

 protected:
  QuantizedLayer(const char* op, std::int64_t weight_rank, Tensor weight_q, Tensor weight_scale, Tensor bias,
                 Tensor input_scale, Tensor input_zero_point, Tensor output_scale, Tensor output_zero_point,
                 std::int64_t qmin, std::int64_t qmax);
  Tensor weight_, weight_scale_, bias_, in_scale_, in_zp_, out_scale_, out_zp_;
  std::int64_t qmin_, qmax_;
};

class QuantizedLinear : public QuantizedLayer {
 public:
  QuantizedLinear(Tensor weight_q, Tensor weight_scale, Tensor bias, Tensor input_scale, Tensor input_zero_point,
                  Tensor output_scale, Tensor output_zero_point, std::int64_t qmin, std::int64_t qmax);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "QuantizedLinear"; }
};

// In place: inserts "quant" (a FakeQuantize with the activation qconfig) at
// the front, replaces every Linear child with a QATLinear under the
// same name (parameter names are unchanged) and fuses Conv2d (-> BatchNorm2d)
// (-> ReLU) into ConvBn2d / ConvBnReLU2d / QATConv2d (nn/qat_conv.h).
// Throws if already prepared.
void prepare_qat(Sequential& model, const QConfig& qconfig = default_qat_qconfig());

// The weight observers + fake quants of every QATLinear, QATConv2d and
// ConvBn2d (its folded weight, ConvBn2d::stage_folded_weight) under root
// that would run observe_fake_quantize_per_channel in their forward
// (FakeQuantize::observe_per_channel_args: observer and fake quant on) as
// one observe_fake_quantize_per_channel_batch (on CUDA one launch for all of
// them, where each forward launched its own), each result staged for that
// layer's next forward (FakeQuantize::stage_output): the same values,
// observer state and gradients as the forwards computing their own. Call
// it once right before each forward, after the optimizer's step: it observes
// the weights as they are when called, and each call is an observer update
// (an output staged earlier and never taken is dropped, its update kept).
void stage_weight_fake_quants(Module& root);

// A new int8 Sequential from a prepared (and trained) model: "quant" is
// folded into the first QuantizedLinear; QATLinear -> QuantizedLinear
// (weights quantized with quantize_per_channel and the weight fake quant's
// current qparams); ReLU is kept; QATConv2d / ConvBn2d -> QuantizedConv2d
// (BN folded with its running statistics) and MaxPool2d, Flatten,
// Unflatten, Identity kept (nn/qat_conv.h). All qparams are copied, so further
// training of `model` does not change the result. Any other child type is
// an error (it would need its own quantized kernel).
std::shared_ptr<Sequential> convert(const Sequential& model);

}  // namespace qgrad::nn
