#include "qgrad/nn/qat_conv.h"

#include <functional>
#include <tuple>
#include <utility>
#include <vector>

#include "qgrad/autograd/node.h"
#include "qgrad/ops/activation.h"
#include "qgrad/ops/conv.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/pool_norm.h"
#include "qgrad/ops/quantize.h"
#include "qgrad/ops/quantized_conv.h"

namespace qgrad::nn {

namespace {

// The qconfig's weight fake quant for a conv with `out` output channels
// (per channel on axis 0), checked as QATLinear checks it.
ObserverOptions conv_weight_options(const QConfig& qconfig, std::int64_t out, const char* op) {
  QGRAD_CHECK(!is_per_channel(qconfig.activation.qscheme), op, "qconfig", "the activation fake quant must be per tensor");
  ObserverOptions w = qconfig.weight;
  if (is_per_channel(w.qscheme)) {
    QGRAD_CHECK(w.ch_axis == 0, op, "qconfig", "per-channel weight quantization must use axis 0, got ", w.ch_axis);
    w.channels = out;
  }
  return w;
}

}  // namespace

QATConv2d::QATConv2d(const Conv2d& conv, const QConfig& qconfig, bool relu) : conv_(conv.options()), relu_(relu) {
  const ObserverOptions w = conv_weight_options(qconfig, conv.out_channels(), "QATConv2d");
  weight_ = register_parameter("weight", conv.weight());
  if (conv.bias().defined()) bias_ = register_parameter("bias", conv.bias());
  weight_fq_ = register_module("weight_fake_quant", std::make_shared<FakeQuantize>(w));
  act_fq_ = register_module("activation_post_process", std::make_shared<FakeQuantize>(qconfig.activation));
  weight_fq_->to(weight_.device());
  act_fq_->to(weight_.device());
}

Tensor QATConv2d::forward(const Tensor& x) {
  Tensor y = ::qgrad::conv2d(x, weight_fq_->forward(weight_), bias_, conv_.stride, conv_.padding, conv_.dilation,
                             conv_.groups);
  return act_fq_->forward(relu_ ? ::qgrad::relu(y) : y);
}

ConvBn2d::ConvBn2d(const Conv2d& conv, std::shared_ptr<BatchNorm2d> bn, const QConfig& qconfig, bool relu)
    : conv_(conv.options()), relu_(relu), bn_(std::move(bn)) {
  const char* op = relu ? "ConvBnReLU2d" : "ConvBn2d";
  QGRAD_CHECK(bn_ != nullptr, op, "bn", "no BatchNorm2d given");
  QGRAD_CHECK(bn_->num_features() == conv.out_channels(), op, "bn", "has ", bn_->num_features(),
              " features but the conv has ", conv.out_channels(), " output channels");
  QGRAD_CHECK(bn_->weight().defined() && bn_->running_var().defined(), op, "bn",
              "must be affine and track running statistics (the fold needs weight and running_var)");
  QGRAD_CHECK(bn_->weight().device() == conv.weight().device() && bn_->weight().dtype() == conv.weight().dtype(),
              op, "bn", "must be on the conv's device with its dtype");
  const ObserverOptions w = conv_weight_options(qconfig, conv.out_channels(), op);
  weight_ = register_parameter("weight", conv.weight());
  if (conv.bias().defined()) bias_ = register_parameter("bias", conv.bias());
  register_module("bn", bn_);
  weight_fq_ = register_module("weight_fake_quant", std::make_shared<FakeQuantize>(w));
  act_fq_ = register_module("activation_post_process", std::make_shared<FakeQuantize>(qconfig.activation));
  weight_fq_->to(weight_.device());
  act_fq_->to(weight_.device());
}

Tensor ConvBn2d::scale_factor() const {
  return batch_norm_scale_factor(bn_->weight(), bn_->running_var(), bn_->eps());
}

Tensor ConvBn2d::forward(const Tensor& x) { return act_fq_->forward(normalized(x)); }

std::optional<Tensor> ConvBn2d::forward_with_next(const Tensor& x, Module& next) {
  auto* pool = dynamic_cast<MaxPool2d*>(&next);
  if (!pool) return std::nullopt;
  const MaxPool2dArgs p{pool->kernel_size(), pool->stride(), pool->padding(), pool->dilation(), pool->ceil_mode()};
  if (relu_) {
    // The normalisation, relu, the activation fake quant and the pooling as
    // one op (batch_norm_relu_fake_quantize_max_pool2d): the same values,
    // statistics and gradients.
    const auto [z, f] = folded_conv(x);
    return act_fq_->forward_batch_norm_relu_max_pool(z, bn_args(f), p);
  }
  // The activation fake quant and the pooling as one op
  // (fake_quantize_max_pool2d): the same values and gradients.
  return act_fq_->forward_max_pool(normalized(x), p.kernel_size, p.stride, p.padding, p.dilation, p.ceil_mode);
}

Tensor ConvBn2d::stage_folded_weight() {
  staged_f_ = scale_factor();
  // channel_mul, not mul by a reshaped view: its backward folds the batch
  // norm's gradient for the scale factor into the pass that sums the weight's
  // (one launch where mul, sum_to_shape and the engine's add took four).
  staged_w_ = channel_mul(weight_, staged_f_, 0);
  return staged_w_;
}

std::pair<Tensor, Tensor> ConvBn2d::folded_conv(const Tensor& x) {
  if (!staged_w_.defined()) stage_folded_weight();
  const Tensor f = std::exchange(staged_f_, Tensor());
  const Tensor w_fq = weight_fq_->forward(std::exchange(staged_w_, Tensor()));
  // PyTorch adds a zero bias here; conv2d without one gives the same values.
  return {::qgrad::conv2d(x, w_fq, Tensor(), conv_.stride, conv_.padding, conv_.dilation, conv_.groups), f};
}

BatchNormArgs ConvBn2d::bn_args(const Tensor& f) const {
  // Frozen: the running statistics normalise and stay (PyTorch sets
  // bn.training = False and keeps it there); otherwise the BatchNorm2d
  // module follows the model's train/eval mode.
  // (Not through BatchNorm2d::args: with a cumulative momentum it reads the
  // counter on the host, which a frozen step does not need.)
  if (freeze_bn_ && bn_->is_training())
    return {.divisor = f,
            .shift = bias_,
            .weight = bn_->weight(),
            .bias = bn_->bias(),
            .running_mean = bn_->running_mean(),
            .running_var = bn_->running_var(),
            .training = false,
            .momentum = 0.0,
            .eps = bn_->eps()};
  return bn_->args(f, bias_);
}

Tensor ConvBn2d::normalized(const Tensor& x) {
  const auto [z, f] = folded_conv(x);
  // Then conv / f + bias per channel and the batch norm (with relu: relu of
  // it) as one op, channel_div_add_batch_norm: the same bits as the
  // broadcast ops, without the unscaled tensor or its passes.
  return normalize(z, bn_args(f), relu_);
}

std::pair<Tensor, Tensor> ConvBn2d::folded_weight_bias() const {
  NoGradGuard no_grad;
  const Tensor f = scale_factor();
  Tensor w = channel_mul(weight_, f, 0);
  Tensor shift = bias_.defined() ? sub(bias_, bn_->running_mean()) : neg(bn_->running_mean());
  Tensor b = add(bn_->bias(), mul(shift, f));
  return {w.detach(), b.detach()};
}

QuantizedConv2d::QuantizedConv2d(Tensor weight_q, Tensor weight_scale, Tensor bias, Tensor input_scale,
                                 Tensor input_zero_point, Tensor output_scale, Tensor output_zero_point,
                                 std::int64_t qmin, std::int64_t qmax, Conv2dOptions conv, bool relu)
    : QuantizedLayer("QuantizedConv2d", 4, std::move(weight_q), std::move(weight_scale), std::move(bias),
                     std::move(input_scale), std::move(input_zero_point), std::move(output_scale),
                     std::move(output_zero_point), qmin, qmax),
      conv_(conv), relu_(relu) {}

Tensor QuantizedConv2d::forward(const Tensor& x) {
  Tensor y = ::qgrad::quantized_conv2d(x, weight_, weight_scale_, bias_,
                                        ActivationQuant::fixed(in_scale_, in_zp_, qmin_, qmax_), conv_.stride,
                                        conv_.padding, conv_.dilation, conv_.groups, DType::f32);
  return ::qgrad::fake_quantize_per_tensor(relu_ ? ::qgrad::relu(y) : y, out_scale_, out_zp_, qmin_, qmax_);
}

void freeze_bn_stats(Module& model) {
  for_each_module(model, [](Module& m) {
    if (auto* cb = dynamic_cast<ConvBn2d*>(&m)) cb->freeze_bn_stats();
  });
}

void update_bn_stats(Module& model) {
  for_each_module(model, [](Module& m) {
    if (auto* cb = dynamic_cast<ConvBn2d*>(&m)) cb->update_bn_stats();
  });
}

namespace detail {

bool is_qat_conv(const Module& m) {
  return dynamic_cast<const QATConv2d*>(&m) != nullptr || dynamic_cast<const ConvBn2d*>(&m) != nullptr;
}

std::size_t fuse_conv_qat(Sequential& model, const QConfig& qconfig) {
  const char* op = "prepare_qat";
  struct Pattern {
    std::size_t conv;
    std::shared_ptr<BatchNorm2d> bn;  // null: no batch norm
    bool relu;
  };
  std::vector<Pattern> found;
  for (std::size_t i = 0; i < model.size(); ++i) {
    const auto* conv = dynamic_cast<const Conv2d*>(model[i].get());
    if (!conv) continue;
    Pattern p{i, nullptr, false};
    std::size_t next = i + 1;
    if (next < model.size()) {
      if (auto bn = std::dynamic_pointer_cast<BatchNorm2d>(model[next])) {
        QGRAD_CHECK(bn->num_features() == conv->out_channels(), op, model.name_at(next), "BatchNorm2d with ",
                    bn->num_features(), " features after a Conv2d with ", conv->out_channels(), " output channels");
        QGRAD_CHECK(bn->weight().defined() && bn->running_var().defined(), op, model.name_at(next),
                    "a BatchNorm2d fused into a conv must be affine and track running statistics");
        p.bn = bn;
        ++next;
      }
    }
    if (next < model.size() && model[next]->type_name() == "ReLU") p.relu = true;
    // Every module the fused one will hold must accept the qconfig.
    conv_weight_options(qconfig, conv->out_channels(), op);
    found.push_back(p);
  }
  for (const Pattern& p : found) {
    const auto& conv = static_cast<const Conv2d&>(*model[p.conv]);
    std::shared_ptr<Module> fused;
    if (p.bn) fused = std::make_shared<ConvBn2d>(conv, p.bn, qconfig, p.relu);
    else fused = std::make_shared<QATConv2d>(conv, qconfig, p.relu);
    const std::size_t absorbed = (p.bn ? 1 : 0) + (p.relu ? 1 : 0);
    model.set(p.conv, fused);
    for (std::size_t k = 1; k <= absorbed; ++k) model.set(p.conv + k, std::make_shared<Identity>());
  }
  return found.size();
}

bool convertible(const Module& m) {
  const std::string t = m.type_name();
  return is_qat_conv(m) || t == "Identity" || t == "MaxPool2d" || t == "Flatten" || t == "Unflatten";
}

std::shared_ptr<Module> convert_conv(const std::shared_ptr<Module>& m, const FakeQuantize*& prev,
                                     const std::string& name) {
  const char* op = "convert";
  NoGradGuard no_grad;
  const FakeQuantize* wfq = nullptr;
  const FakeQuantize* afq = nullptr;
  Tensor w, b;
  Conv2dOptions conv;
  bool relu = false;
  if (const auto* q = dynamic_cast<const QATConv2d*>(m.get())) {
    wfq = &q->weight_fake_quant(), afq = &q->activation_fake_quant();
    w = q->weight().detach();
    if (q->bias().defined()) b = q->bias().detach().clone();
    conv = q->options(), relu = q->relu();
  } else if (const auto* cb = dynamic_cast<const ConvBn2d*>(m.get())) {
    wfq = &cb->weight_fake_quant(), afq = &cb->activation_fake_quant();
    std::tie(w, b) = cb->folded_weight_bias();
    conv = cb->options(), relu = cb->relu();
  } else {
    QGRAD_CHECK(convertible(*m), op, name, "cannot convert a ", m->type_name());
    return m;  // stateless: the int8 model shares it
  }
  QGRAD_CHECK(wfq->options().dtype == DType::s8 && is_per_channel(wfq->options().qscheme), op, name,
              "weights must be quantized per channel to s8");
  QGRAD_CHECK(prev->qmin() == afq->qmin() && prev->qmax() == afq->qmax(), op, name,
              "input and output activation ranges differ");
  // The weight fake quant's grid exactly: quantize_per_channel with its qparams.
  Tensor wq = quantize_per_channel(w, wfq->scale(), wfq->zero_point(), 0, DType::s8);
  auto out = std::make_shared<QuantizedConv2d>(wq, wfq->scale().clone(), b, prev->scale().clone(),
                                               prev->zero_point().clone(), afq->scale().clone(),
                                               afq->zero_point().clone(), afq->qmin(), afq->qmax(), conv, relu);
  prev = afq;
  return out;
}

}  // namespace detail

}  // namespace qgrad::nn
