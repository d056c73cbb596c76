#include "qgrad/nn/qat.h"

#include "qgrad/nn/qat_conv.h"

#include <utility>
#include <vector>

#include "qgrad/autograd/node.h"
#include "qgrad/ops/linalg.h"
#include "qgrad/ops/quantize.h"
#include "qgrad/ops/quantized_linear.h"

namespace qgrad::nn {

QConfig default_qat_qconfig() {
  QConfig q;
  q.activation.dtype = DType::u8;
  q.activation.qscheme = QScheme::per_tensor_affine;
  q.activation.quant_range = {{0, 255}};
  q.activation.reduce_range = true;
  q.activation.averaging_constant = 0.01;
  q.weight.dtype = DType::s8;
  q.weight.qscheme = QScheme::per_channel_symmetric;
  q.weight.quant_range = {{-128, 127}};
  q.weight.averaging_constant = 0.01;
  q.weight.ch_axis = 0;
  return q;
}

QATLinear::QATLinear(const Linear& linear, const QConfig& qconfig) {
  QGRAD_CHECK(!is_per_channel(qconfig.activation.qscheme), "QATLinear", "qconfig",
              "the activation fake quant must be per tensor");
  ObserverOptions w = qconfig.weight;
  if (is_per_channel(w.qscheme)) {
    QGRAD_CHECK(w.ch_axis == 0, "QATLinear", "qconfig", "per-channel weight quantization must use axis 0, got ",
                w.ch_axis);
    w.channels = linear.out_features();
  }
  weight_ = register_parameter("weight", linear.weight());
  if (linear.bias().defined()) bias_ = register_parameter("bias", linear.bias());
  weight_fq_ = register_module("weight_fake_quant", std::make_shared<FakeQuantize>(w));
  act_fq_ = register_module("activation_post_process", std::make_shared<FakeQuantize>(qconfig.activation));
  const Device dev = weight_.device();
  weight_fq_->to(dev);
  act_fq_->to(dev);
  set_compute_dtype(linear.compute_dtype());
}

Tensor QATLinear::forward(const Tensor& x) {
  // Mixed precision: the weight is fake-quantized in its own dtype (the
  // observer and qparams see the f32 master), then cast.
  return act_fq_->forward(::qgrad::linear(to_compute(x), to_compute(weight_fq_->forward(weight_)), to_compute(bias_)));
}

std::optional<Tensor> QATLinear::forward_with_next(const Tensor& x, Module& next) {
  if (next.type_name() != "ReLU") return std::nullopt;
  return act_fq_->forward_relu(
      ::qgrad::linear(to_compute(x), to_compute(weight_fq_->forward(weight_)), to_compute(bias_)));
}

QuantizedLayer::QuantizedLayer(const char* op, std::int64_t weight_rank, Tensor weight_q, Tensor weight_scale,
                               Tensor bias, Tensor input_scale, Tensor input_zero_point, Tensor output_scale,
                               Tensor output_zero_point, std::int64_t qmin, std::int64_t qmax)
    : qmin_(qmin), qmax_(qmax) {
  QGRAD_CHECK(weight_q.defined() && weight_q.dtype() == DType::s8 && weight_q.dim() == weight_rank, op, "weight",
              "expected s8 of rank ", weight_rank);
  const std::int64_t n = weight_q.size(0);
  QGRAD_CHECK(weight_scale.defined() && weight_scale.dtype() == DType::f32 && weight_scale.shape() == Shape{n}, op,
              "weight_scale", "expected f32 [", n, "]");
  QGRAD_CHECK(!bias.defined() || (is_floating(bias.dtype()) && bias.shape() == Shape{n}), op, "bias",
              "expected floating [", n, "]");
  for (const Tensor* s : {&input_scale, &output_scale})
    QGRAD_CHECK(s->defined() && s->dtype() == DType::f32 && s->numel() == 1, op, "scale", "expected f32 [1]");
  for (const Tensor* z : {&input_zero_point, &output_zero_point})
    QGRAD_CHECK(z->defined() && z->dtype() == DType::s32 && z->numel() == 1, op, "zero_point", "expected s32 [1]");
  QGRAD_CHECK(qmin < qmax, op, "qmin", "qmin ", qmin, " must be < qmax ", qmax);
  weight_ = register_buffer("weight", weight_q);
  weight_scale_ = register_buffer("weight_scale", weight_scale);
  if (bias.defined()) bias_ = register_buffer("bias", bias);
  in_scale_ = register_buffer("input_scale", input_scale);
  in_zp_ = register_buffer("input_zero_point", input_zero_point);
  out_scale_ = register_buffer("output_scale", output_scale);
  out_zp_ = register_buffer("output_zero_point", output_zero_point);
}

QuantizedLinear::QuantizedLinear(Tensor weight_q, Tensor weight_scale, Tensor bias, Tensor input_scale,
                                 Tensor input_zero_point, Tensor output_scale, Tensor output_zero_point,
                                 std::int64_t qmin, std::int64_t qmax)
    : QuantizedLayer("QuantizedLinear", 2, std::move(weight_q), std::move(weight_scale), std::move(bias),
                     std::move(input_scale), std::move(input_zero_point), std::move(output_scale),
                     std::move(output_zero_point), qmin, qmax) {}

Tensor QuantizedLinear::forward(const Tensor& x) {
  Tensor y = ::qgrad::quantized_linear(x, weight_, weight_scale_, bias_,
                                        ActivationQuant::fixed(in_scale_, in_zp_, qmin_, qmax_), DType::f32);
  return ::qgrad::fake_quantize_per_tensor(y, out_scale_, out_zp_, qmin_, qmax_);
}

void stage_weight_fake_quants(Module& root) {
  std::vector<FakeQuantize*> fake_quants;
  std::vector<ChannelObserveArgs> args;
  const auto take = [&](FakeQuantize& fq, const Tensor& weight) {
    fq.drop_staged_output();  // one left from an earlier staging its forward never took
    if (auto a = fq.observe_per_channel_args(weight)) fake_quants.push_back(&fq), args.push_back(std::move(*a));
  };
  for_each_module(root, [&](Module& m) {
    if (auto* lin = dynamic_cast<QATLinear*>(&m)) take(lin->weight_fake_quant(), lin->weight());
    if (auto* conv = dynamic_cast<QATConv2d*>(&m)) take(conv->weight_fake_quant(), conv->weight());
    if (auto* cb = dynamic_cast<ConvBn2d*>(&m)) take(cb->weight_fake_quant(), cb->stage_folded_weight());
  });
  if (args.empty()) return;
  const std::vector<Tensor> ys = observe_fake_quantize_per_channel_batch(args);
  for (std::size_t i = 0; i < ys.size(); ++i) fake_quants[i]->stage_output(args[i].x, ys[i]);
}

void prepare_qat(Sequential& model, const QConfig& qconfig) {
  const char* op = "prepare_qat";
  for (std::size_t i = 0; i < model.size(); ++i) {
    QGRAD_CHECK(model.name_at(i) != "quant" && model[i]->type_name() != "QATLinear" && !detail::is_qat_conv(*model[i]),
                op, "model", "model is already prepared");
  }
  QGRAD_CHECK(model.size() > 0, op, "model", "empty model");
  QGRAD_CHECK(!is_per_channel(qconfig.activation.qscheme), op, "qconfig", "activation must be per tensor");
  // Validate the whole model before changing it.
  Device dev = Device::cpu();
  bool any = false;
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (auto* lin = dynamic_cast<Linear*>(model[i].get())) {
      dev = lin->weight().device();
      any = true;
    } else if (auto* conv = dynamic_cast<Conv2d*>(model[i].get())) {
      dev = conv->weight().device();
      any = true;
    }
  }
  QGRAD_CHECK(any, op, "model", "no Linear or Conv2d layer to prepare");
  // Conv2d (-> BatchNorm2d) (-> ReLU) into the fused QAT modules (nn/qat_conv.h);
  // it checks every pattern before it changes the model.
  detail::fuse_conv_qat(model, qconfig);
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (auto* lin = dynamic_cast<Linear*>(model[i].get())) model.set(i, std::make_shared<QATLinear>(*lin, qconfig));
  }
  auto stub = std::make_shared<FakeQuantize>(qconfig.activation);
  stub->to(dev);
  model.insert(0, "quant", stub);
}

std::shared_ptr<Sequential> convert(const Sequential& model) {
  const char* op = "convert";
  QGRAD_CHECK(model.size() > 0 && model.name_at(0) == "quant" && dynamic_cast<FakeQuantize*>(model[0].get()), op,
              "model", "not a prepared model (prepare_qat adds an input fake quant named 'quant' first)");
  NoGradGuard no_grad;
  // Validate before building anything.
  for (std::size_t i = 1; i < model.size(); ++i) {
    const std::string t = model[i]->type_name();
    QGRAD_CHECK(t == "QATLinear" || t == "ReLU" || detail::convertible(*model[i]), op, model.name_at(i),
                "cannot convert a ", t,
                " (supported: QATLinear, ReLU and nn/qat_conv.h's QAT convs, Identity, MaxPool2d, Flatten, Unflatten)");
  }
  auto out = std::make_shared<Sequential>();
  const FakeQuantize* prev = static_cast<const FakeQuantize*>(model[0].get());
  for (std::size_t i = 1; i < model.size(); ++i) {
    if (auto* q = dynamic_cast<QATLinear*>(model[i].get())) {
      const FakeQuantize& wfq = q->weight_fake_quant();
      const FakeQuantize& afq = q->activation_fake_quant();
      QGRAD_CHECK(wfq.options().dtype == DType::s8 && is_per_channel(wfq.options().qscheme), op, model.name_at(i),
                  "weights must be quantized per channel to s8");
      QGRAD_CHECK(prev->qmin() == afq.qmin() && prev->qmax() == afq.qmax(), op, model.name_at(i),
                  "input and output activation ranges differ");
      Tensor wq = ::qgrad::quantize_per_channel(q->weight().detach(), wfq.scale(), wfq.zero_point(), 0, DType::s8);
      Tensor bias = q->bias().defined() ? q->bias().detach().clone() : Tensor();
      out->push_back(model.name_at(i),
                     std::make_shared<QuantizedLinear>(wq, wfq.scale().clone(), bias, prev->scale().clone(),
                                                       prev->zero_point().clone(), afq.scale().clone(),
                                                       afq.zero_point().clone(), afq.qmin(), afq.qmax()));
      prev = &afq;
    } else if (model[i]->type_name() == "ReLU") {
      out->push_back(model.name_at(i), std::make_shared<ReLU>());
    } else {
      out->push_back(model.name_at(i), detail::convert_conv(model[i], prev, model.name_at(i)));
    }
  }
  out->eval();
  return out;
}

}  // namespace qgrad::nn
