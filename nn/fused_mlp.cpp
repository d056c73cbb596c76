#include "qgrad/nn/fused_mlp.h"

#include <algorithm>
#include <vector>

#include "qgrad/autograd/node.h"
#include "qgrad/nn/qat.h"
#include "qgrad/ops/loss.h"
#include "qgrad/ops/qat_mlp.h"

namespace qgrad::nn {

namespace {

// The model's QATLinear layers (relu: followed by a ReLU), or the reason it is not that MLP.
struct MlpLayers {
  FakeQuantize* input = nullptr;
  std::vector<QATLinear*> linear;
  std::vector<bool> relu;
  std::string why;
};

std::string fake_quant_unsupported(const FakeQuantize& fq, bool per_channel, const char* what) {
  if (!fq.observer_enabled() || !fq.fake_quant_enabled()) return std::string(what) + ": observer or fake quant off";
  if (fq.observer().has_range_sync()) return std::string(what) + ": a range sync is installed";
  if (is_per_channel(fq.options().qscheme) != per_channel)
    return std::string(what) + (per_channel ? ": not per channel" : ": not per tensor");
  if (per_channel && fq.options().ch_axis != 0) return std::string(what) + ": channel axis is not 0";
  return {};
}

MlpLayers mlp_layers(const Sequential& model) {
  MlpLayers m;
  if (model.size() < 2 || model.name_at(0) != "quant" || model[0]->type_name() != "FakeQuantize") {
    m.why = "model: not prepared by prepare_qat (no leading \"quant\" fake quant)";
    return m;
  }
  m.input = static_cast<FakeQuantize*>(model[0].get());
  if (auto why = fake_quant_unsupported(*m.input, false, "quant"); !why.empty()) {
    m.why = "model: " + why;
    return m;
  }
  for (std::size_t i = 1; i < model.size(); ++i) {
    Module& c = *model[i];
    if (c.type_name() == "ReLU") {
      if (m.linear.empty() || m.relu.back()) {
        m.why = "model: a ReLU not right after a QATLinear (child " + std::to_string(i) + ")";
        return m;
      }
      m.relu.back() = true;
      continue;
    }
    auto* lin = c.type_name() == "QATLinear" ? static_cast<QATLinear*>(&c) : nullptr;
    if (!lin) {
      m.why = "model: child " + std::to_string(i) + " is a " + c.type_name() + ", not a QATLinear or ReLU";
      return m;
    }
    m.linear.push_back(lin);
    m.relu.push_back(false);
  }
  if (m.linear.empty() || m.linear.size() > kQatMlpMaxLayers)
    m.why = "model: " + std::to_string(m.linear.size()) + " QATLinear layers (the kernel takes 1 to " +
            std::to_string(kQatMlpMaxLayers) + ")";
  return m;
}

std::string param_unsupported(const Tensor& p, const Device& dev, const char* what) {
  if (p.dtype() != DType::f32 || p.device() != dev || !p.requires_grad())
    return std::string(what) + ": not an f32 parameter on x's device requiring grad";
  const Tensor g = p.grad();
  if (g.defined() && (g.dtype() != DType::f32 || g.shape() != p.shape()))
    return std::string(what) + ": its gradient is not f32 of its shape";
  return {};
}

// Why the op (qat_mlp_loss_backward_) cannot take this model and batch;
// multiply_adds: the step's forward multiply-adds.
std::string unsupported(const MlpLayers& m, const Tensor& x, const Tensor& labels, std::int64_t& multiply_adds) {
  if (!m.why.empty()) return m.why;
  if (!x.defined()) return "x: undefined";
  if (x.dtype() != DType::f32 || x.dim() != 2 || x.requires_grad())
    return "x: not an f32 [B, K] tensor without grad";
  if (!labels.defined() || labels.device() != x.device() || labels.shape() != Shape{x.size(0)} ||
      (labels.dtype() != DType::s64 && labels.dtype() != DType::s32))
    return "labels: not s64 or s32 [B] on x's device";
  if (!grad_enabled()) return "grad mode is off";
  const std::int64_t batch = x.size(0);
  if (batch < 1) return "x: empty batch";
  std::int64_t features = x.size(1);
  multiply_adds = 0;
  for (std::size_t i = 0; i < m.linear.size(); ++i) {
    const QATLinear& l = *m.linear[i];
    const std::string name = "layer " + std::to_string(i);
    if (l.compute_dtype().has_value()) return name + ": has a compute dtype";
    if (auto why = fake_quant_unsupported(l.weight_fake_quant(), true, "weight fake quant"); !why.empty())
      return name + " " + why;
    if (auto why = fake_quant_unsupported(l.activation_fake_quant(), false, "activation fake quant"); !why.empty())
      return name + " " + why;
    if (auto why = param_unsupported(l.weight(), x.device(), "weight"); !why.empty()) return name + " " + why;
    if (l.bias().defined())
      if (auto why = param_unsupported(l.bias(), x.device(), "bias"); !why.empty()) return name + " " + why;
    if (l.weight().dim() != 2 || l.weight().size(1) != features)
      return name + ": weight is not [N, " + std::to_string(features) + "]";
    multiply_adds += batch * l.weight().size(0) * features;
    features = l.weight().size(0);
    const std::int64_t widest = std::max(features, l.weight().size(1));
    if (batch * widest >= (std::int64_t{1} << 24) || features * l.weight().size(1) >= (std::int64_t{1} << 24))
      return name + ": too large for the fused kernel";
  }
  return {};
}

// Why the op would run the composed ops rather than its kernel.
std::string kernel_unsupported(const Tensor& x, std::int64_t multiply_adds) {
  if (!x.is_cuda()) return "x: not on a CUDA device";
  if (!qat_mlp_fused_available(x.device())) return "x: its device has no cooperative launch";
  if (multiply_adds > kQatMlpFusedMultiplyAdds)
    return "the step's " + std::to_string(multiply_adds) + " multiply-adds are more than the kernel takes (" +
           std::to_string(kQatMlpFusedMultiplyAdds) + ")";
  return {};
}

QatMlpQuant quant_of(const FakeQuantize& fq) {
  const ObserverUpdate u = fq.observer().update();
  QatMlpQuant q;
  q.run_min = u.run_min;
  q.run_max = u.run_max;
  q.scale = fq.scale();
  q.zero_point = fq.zero_point();
  q.averaging_constant = u.averaging_constant;
  q.symmetric = u.symmetric;
  q.symmetric_zero_point = u.symmetric_zero_point;
  q.qmin = fq.qmin();
  q.qmax = fq.qmax();
  return q;
}

}  // namespace

std::string qat_mlp_fused_unsupported(const Sequential& model, const Tensor& x, const Tensor& labels) {
  std::int64_t multiply_adds = 0;
  std::string why = unsupported(mlp_layers(model), x, labels, multiply_adds);
  return why.empty() ? kernel_unsupported(x, multiply_adds) : why;
}

Tensor qat_mlp_loss_backward(Sequential& model, const Tensor& x, const Tensor& labels) {
  const MlpLayers m = mlp_layers(model);
  std::int64_t multiply_adds = 0;
  if (!unsupported(m, x, labels, multiply_adds).empty()) {  // not the op's pattern: the model's own forward
    Tensor loss = cross_entropy(model.forward(x), labels);
    loss.backward();
    return loss.detach();
  }
  // A parameter without a gradient gets a new tensor the kernel writes.
  std::vector<std::pair<Tensor, Tensor>> new_grads;
  const auto grad_of = [&](const Tensor& p, bool& accumulate) {
    Tensor g = p.grad();
    accumulate = g.defined();
    if (!accumulate) new_grads.emplace_back(p, g = Tensor::empty(p.shape(), TensorOptions{}.with_device(p.device())));
    return g;
  };
  std::vector<QatMlpLayer> layers(m.linear.size());
  for (std::size_t i = 0; i < layers.size(); ++i) {
    QATLinear& l = *m.linear[i];
    QatMlpLayer& k = layers[i];
    k.weight = l.weight();
    k.weight_grad = grad_of(k.weight, k.accumulate_weight_grad);
    if (l.bias().defined()) {
      k.bias = l.bias();
      k.bias_grad = grad_of(k.bias, k.accumulate_bias_grad);
    }
    k.relu = m.relu[i];
    k.weight_quant = quant_of(l.weight_fake_quant());
    k.output_quant = quant_of(l.activation_fake_quant());
  }
  const Tensor loss = qat_mlp_loss_backward_(x.detach(), labels, quant_of(*m.input), layers);
  for (QATLinear* l : m.linear) l->weight_fake_quant().drop_staged_output();  // the kernel observed the weights
  for (auto& [p, g] : new_grads) const_cast<Tensor&>(p).set_grad(g);
  return loss;
}

}  // namespace qgrad::nn
