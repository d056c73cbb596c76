#include "qgrad/ops/qat_mlp.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/qat_mlp.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/linalg.h"
#include "qgrad/ops/loss.h"
#include "qgrad/ops/quantize.h"

namespace qgrad {

namespace {

constexpr const char* kOp = "qat_mlp_loss_backward_";
static_assert(kQatMlpMaxLayers == static_cast<std::size_t>(kernels::kQatMlpMaxLayers));
constexpr std::int64_t kLimit = std::int64_t{1} << 24;

// Grad mode on for the scope (the composed path records its tape even when
// the caller's mode is off).
struct GradOn {
  bool before = grad_enabled();
  GradOn() { set_grad_enabled(true); }
  GradOn(const GradOn&) = delete;
  GradOn& operator=(const GradOn&) = delete;
  ~GradOn() { set_grad_enabled(before); }
};

void check_f32(const Tensor& t, const Shape& shape, const Device& dev, const char* arg) {
  QGRAD_CHECK(t.defined() && t.dtype() == DType::f32 && t.shape() == shape && t.device() == dev, kOp, arg,
              "expected f32 ", shape_str(shape), " on ", dev.str());
}

void check_quant(const QatMlpQuant& q, std::int64_t channels, const Device& dev, const char* arg) {
  check_f32(q.run_min, {channels}, dev, arg);
  check_f32(q.run_max, {channels}, dev, arg);
  check_f32(q.scale, {channels}, dev, arg);
  QGRAD_CHECK(q.zero_point.defined() && q.zero_point.dtype() == DType::s32 && q.zero_point.shape() == Shape{channels} &&
                  q.zero_point.device() == dev,
              kOp, arg, "zero_point: expected s32 [", channels, "] on ", dev.str());
  QGRAD_CHECK(q.qmin < q.qmax && q.qmin > -kLimit && q.qmax < kLimit, kOp, arg, "bad quant range [", q.qmin, ", ",
              q.qmax, "]");
  QGRAD_CHECK(q.symmetric_zero_point >= q.qmin && q.symmetric_zero_point <= q.qmax, kOp, arg,
              "symmetric_zero_point outside the quant range");
  QGRAD_CHECK(std::isfinite(q.averaging_constant), kOp, arg, "averaging_constant is not finite");
}

kernels::QatMlpQuant quant_args(const QatMlpQuant& q) {
  kernels::QatMlpQuant k;
  k.run_min = q.run_min.data<float>();
  k.run_max = q.run_max.data<float>();
  k.scale = q.scale.data<float>();
  k.zero_point = q.zero_point.data<std::int32_t>();
  k.moving = q.averaging_constant >= 0.0;
  k.averaging_constant = static_cast<float>(q.averaging_constant);
  k.symmetric = q.symmetric;
  k.symmetric_zero_point = q.symmetric_zero_point;
  k.qmin = static_cast<int>(q.qmin);
  k.qmax = static_cast<int>(q.qmax);
  return k;
}

ObserverUpdate update_of(const QatMlpQuant& q) {
  ObserverUpdate u;
  u.run_min = q.run_min;
  u.run_max = q.run_max;
  u.averaging_constant = q.averaging_constant;
  u.symmetric = q.symmetric;
  u.symmetric_zero_point = q.symmetric_zero_point;
  return u;
}

// The composed ops (where the kernel does not run): the forward of
// prepare_qat's model (nn/qat.h), cross_entropy and backward, then the
// gradients copied (or added) into the given tensors.
Tensor composed(const Tensor& x, const Tensor& labels, const QatMlpQuant& input_quant,
                const std::vector<QatMlpLayer>& layers) {
  const GradOn grad_on;
  Tensor act = observe_fake_quantize_per_tensor(x.detach(), input_quant.scale, input_quant.zero_point, input_quant.qmin,
                                                input_quant.qmax, update_of(input_quant));
  std::vector<Tensor> weights, biases;
  for (const QatMlpLayer& l : layers) {
    weights.push_back(l.weight.detach().set_requires_grad(true));
    biases.push_back(l.bias.defined() ? l.bias.detach().set_requires_grad(true) : Tensor());
    const QatMlpQuant& wq = l.weight_quant;
    const Tensor w = observe_fake_quantize_per_channel(weights.back(), wq.scale, wq.zero_point, 0, wq.qmin, wq.qmax,
                                                       update_of(wq));
    const Tensor z = linear(act, w, biases.back());
    const QatMlpQuant& oq = l.output_quant;
    act = l.relu ? observe_fake_quantize_relu_per_tensor(z, oq.scale, oq.zero_point, oq.qmin, oq.qmax, update_of(oq))
                 : observe_fake_quantize_per_tensor(z, oq.scale, oq.zero_point, oq.qmin, oq.qmax, update_of(oq));
  }
  Tensor loss = cross_entropy(act, labels);
  loss.backward();
  NoGradGuard no_grad;
  const auto store = [](const Tensor& into, const Tensor& g, bool accumulate) {
    const_cast<Tensor&>(into).copy_(accumulate ? into + g : g);
  };
  for (std::size_t i = 0; i < layers.size(); ++i) {
    store(layers[i].weight_grad, weights[i].grad(), layers[i].accumulate_weight_grad);
    if (biases[i].defined()) store(layers[i].bias_grad, biases[i].grad(), layers[i].accumulate_bias_grad);
  }
  return loss.detach();
}

}  // namespace

bool qat_mlp_fused_available(const Device& device) {
  return device.is_cuda() && kernels::qat_mlp_available(device.index);
}

Tensor qat_mlp_loss_backward_(const Tensor& x, const Tensor& labels, const QatMlpQuant& input_quant,
                              const std::vector<QatMlpLayer>& layers) {
  QGRAD_CHECK(x.defined() && x.dtype() == DType::f32 && x.dim() == 2 && x.size(0) > 0, kOp, "x",
              "expected f32 [B, K] with B > 0");
  const Device dev = x.device();
  QGRAD_CHECK(!x.requires_grad(), kOp, "x", "no input gradient is computed: x must not require grad");
  const std::int64_t batch = x.size(0);
  QGRAD_CHECK(labels.defined() && (labels.dtype() == DType::s64 || labels.dtype() == DType::s32) &&
                  labels.shape() == Shape{batch} && labels.device() == dev,
              kOp, "labels", "expected s64 or s32 [", batch, "] on ", dev.str());
  QGRAD_CHECK(!layers.empty() && layers.size() <= kQatMlpMaxLayers, kOp, "layers", "expected 1 to ",
              kQatMlpMaxLayers, " layers, got ", layers.size());
  check_quant(input_quant, 1, dev, "input_quant");
  std::int64_t features = x.size(1), multiply_adds = 0;
  for (const QatMlpLayer& l : layers) {
    QGRAD_CHECK(l.weight.defined() && l.weight.dim() == 2 && l.weight.size(1) == features, kOp, "weight",
                "expected [N, ", features, "]");
    const std::int64_t n = l.weight.size(0);
    QGRAD_CHECK(n > 0 && batch * std::max(n, features) < kLimit && n * features < kLimit, kOp, "weight",
                "too large for the fused kernel");
    check_f32(l.weight, {n, features}, dev, "weight");
    check_f32(l.weight_grad, {n, features}, dev, "weight_grad");
    if (l.bias.defined()) {
      check_f32(l.bias, {n}, dev, "bias");
      check_f32(l.bias_grad, {n}, dev, "bias_grad");
    }
    check_quant(l.weight_quant, n, dev, "weight_quant");
    check_quant(l.output_quant, 1, dev, "output_quant");
    multiply_adds += batch * n * features;
    features = n;
  }
  // On the CPU the labels are read before anything is written (cross_entropy
  // would throw only after the observers had moved); on CUDA, as there, a
  // label outside [0, C) gives a NaN loss and NaN gradient rows.
  if (dev.is_cpu()) {
    const Tensor lab = labels.to(DType::s64);
    const auto* l = lab.data<std::int64_t>();
    for (std::int64_t b = 0; b < batch; ++b)
      QGRAD_CHECK(l[b] >= 0 && l[b] < features, kOp, "labels", "label ", l[b], " at ", b, " outside [0, ", features,
                  ")");
  }
  // The kernel where it pays: its phases are latency-bound tiles on FFMA,
  // so larger steps run faster as the composed ops (cuBLAS).
  if (!qat_mlp_fused_available(dev) || multiply_adds > kQatMlpFusedMultiplyAdds) return composed(x, labels, input_quant, layers);
  kernels::QatMlpArgs a;
  a.device = dev.index;
  a.batch = static_cast<int>(batch);
  a.num_layers = static_cast<int>(layers.size());
  for (int i = 0; i < a.num_layers; ++i) {
    a.layers[i].in_features = static_cast<int>(layers[i].weight.size(1));
    a.layers[i].out_features = static_cast<int>(layers[i].weight.size(0));
  }
  if (!kernels::qat_mlp_plan(a)) return composed(x, labels, input_quant, layers);
  const TensorOptions f32 = TensorOptions{}.with_device(dev);
  const Tensor workspace = Tensor::empty({std::max<std::int64_t>(a.offsets.total, 1)}, f32);
  const Tensor loss = Tensor::empty({}, f32);
  a.x = x.data<float>();
  a.labels = labels.data_ptr();
  a.labels_s64 = labels.dtype() == DType::s64;
  a.input_quant = quant_args(input_quant);
  for (int i = 0; i < a.num_layers; ++i) {
    const QatMlpLayer& l = layers[i];
    kernels::QatMlpLayer& k = a.layers[i];
    k.weight = l.weight.data<float>();
    k.weight_grad = l.weight_grad.data<float>();
    k.accumulate_weight_grad = l.accumulate_weight_grad;
    if (l.bias.defined()) {
      k.bias = l.bias.data<float>();
      k.bias_grad = l.bias_grad.data<float>();
      k.accumulate_bias_grad = l.accumulate_bias_grad;
    }
    k.relu = l.relu;
    k.weight_quant = quant_args(l.weight_quant);
    k.output_quant = quant_args(l.output_quant);
  }
  a.loss = loss.data<float>();
  a.workspace = workspace.data<float>();
  kernels::qat_mlp_forward_backward(a);
  return loss;
}

}  // namespace qgrad
