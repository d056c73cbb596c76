#include "qgrad/nn/smoothquant.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "qgrad/autograd/node.h"
#include "qgrad/nn/layers.h"
#include "qgrad/nn/transformer.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/dynamic_quant.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/factory.h"
#include "qgrad/ops/observer.h"
#include "qgrad/ops/quantized_linear.h"

namespace qgrad::nn {

namespace {
constexpr double kSmoothFloor = 1e-5;

std::vector<double> host_values(const Tensor& t) { return t.detach().to(DType::f64).cpu().to_vector<double>(); }
}  // namespace

SmoothQuantCalibrator::SmoothQuantCalibrator(std::int64_t in_features, Device device) : in_features_(in_features) {
  QGRAD_CHECK(in_features >= 1, "SmoothQuantCalibrator", "in_features", "must be >= 1, got ", in_features);
  amax_ = zeros({in_features}, TensorOptions{}.with_device(device));
}

void SmoothQuantCalibrator::observe(const Tensor& x) {
  constexpr const char* op = "SmoothQuantCalibrator::observe";
  check::floating(x, op, "x");
  check::same_device(x, amax_, op, "x");
  QGRAD_CHECK(x.dim() >= 1 && x.size(-1) == in_features_, op, "x", "expected shape [..., ", in_features_, "], got ",
              shape_str(x.shape()));
  observe_absmax_(x, amax_);
  ++batches_;
}

Tensor smoothquant_factors(const Tensor& act_absmax, const Tensor& weight, double alpha) {
  constexpr const char* op = "smoothquant_factors";
  QGRAD_CHECK(std::isfinite(alpha) && alpha > 0 && alpha < 1, op, "alpha", "must be in (0, 1), got ", alpha);
  check::dtype_is(act_absmax, DType::f32, op, "act_absmax");
  check::rank_is(act_absmax, 1, op, "act_absmax");
  check::floating(weight, op, "weight");
  check::rank_is(weight, 2, op, "weight");
  const std::int64_t N = weight.size(0), K = weight.size(1);
  QGRAD_CHECK(act_absmax.size(0) == K, op, "act_absmax", "has ", act_absmax.size(0), " channels, weight has K = ", K);
  const std::vector<double> amax = host_values(act_absmax), w = host_values(weight);
  std::vector<float> s(static_cast<std::size_t>(K));
  for (std::int64_t j = 0; j < K; ++j) {
    double wmax = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const double v = std::fabs(w[static_cast<std::size_t>(n * K + j)]);
      if (std::isfinite(v)) wmax = std::max(wmax, v);
    }
    const double a = std::max(amax[static_cast<std::size_t>(j)], kSmoothFloor);
    s[static_cast<std::size_t>(j)] =
        static_cast<float>(std::pow(a, alpha) / std::pow(std::max(wmax, kSmoothFloor), 1.0 - alpha));
  }
  return Tensor::from_vector<float>(s, {K});
}

SmoothQuantLinear SmoothQuantLinear::from_float(const Tensor& weight, const Tensor& bias,
                                                const SmoothQuantCalibrator& calib, double alpha) {
  constexpr const char* op = "SmoothQuantLinear::from_float";
  check::floating(weight, op, "weight");
  check::rank_is(weight, 2, op, "weight");
  QGRAD_CHECK(weight.size(1) == calib.in_features(), op, "weight", "shape ", shape_str(weight.shape()),
              " does not match the calibrator's ", calib.in_features(), " input features");
  QGRAD_CHECK(calib.batches() > 0, op, "calib", "no batch was observed");
  QGRAD_CHECK(std::isfinite(alpha) && alpha > 0 && alpha < 1, op, "alpha", "must be in (0, 1), got ", alpha);
  const std::int64_t N = weight.size(0), K = weight.size(1);
  if (bias.defined()) {
    check::floating(bias, op, "bias");
    QGRAD_CHECK(bias.shape() == Shape{N}, op, "bias", "expected shape [", N, "], got ", shape_str(bias.shape()));
  }
  const Tensor s = smoothquant_factors(calib.act_absmax(), weight, alpha);
  const std::vector<float> sv = s.to_vector<float>();
  const std::vector<double> amax = host_values(calib.act_absmax());
  std::vector<double> w = host_values(weight);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t j = 0; j < K; ++j) w[static_cast<std::size_t>(n * K + j)] *= sv[static_cast<std::size_t>(j)];
  std::vector<float> wf(w.begin(), w.end());
  const DynamicQuantized wq = dynamic_range_quantize(Tensor::from_vector<float>(wf, {N, K}), QuantScope::per_token(),
                                                     QuantMode::symmetric, DType::s8, -127, 127);
  double xmax = 0;
  for (std::int64_t j = 0; j < K; ++j)
    xmax = std::max(xmax, amax[static_cast<std::size_t>(j)] / sv[static_cast<std::size_t>(j)]);
  const float sa = xmax > 0 ? static_cast<float>(xmax / 127.0) : 1.0f;
  const Device dev = weight.device();
  SmoothQuantLinear r;
  r.w_q = wq.q.to(dev);
  r.w_scale = wq.scale.to(dev);
  if (bias.defined()) r.bias = bias.detach().to(DType::f32).to(dev);
  r.divisor = s.to(dev);
  r.act_scale = Tensor::from_vector<float>({sa}, {1}, dev);
  r.act_zero_point = Tensor::from_vector<std::int32_t>({0}, {1}, dev);
  return r;
}

void SmoothQuantLinear::fold_divisor_into(Tensor& prev_weight, Tensor& prev_bias) {
  constexpr const char* op = "SmoothQuantLinear::fold_divisor_into";
  QGRAD_CHECK(divisor.defined(), op, "divisor", "already folded");
  check::floating(prev_weight, op, "prev_weight");
  check::rank_is(prev_weight, 2, op, "prev_weight");
  const std::int64_t K = divisor.numel();
  QGRAD_CHECK(prev_weight.size(0) == K, op, "prev_weight", "expected ", K, " output rows, got shape ",
              shape_str(prev_weight.shape()));
  if (prev_bias.defined()) {
    check::floating(prev_bias, op, "prev_bias");
    QGRAD_CHECK(prev_bias.shape() == Shape{K}, op, "prev_bias", "expected shape [", K, "]");
  }
  NoGradGuard guard;
  const Tensor s = divisor.to(prev_weight.dtype()).to(prev_weight.device());
  prev_weight.copy_(div(prev_weight.detach(), s.reshape({K, 1})));
  if (prev_bias.defined()) prev_bias.copy_(div(prev_bias.detach(), s.to(prev_bias.dtype()).to(prev_bias.device())));
  divisor = Tensor();
}

Tensor SmoothQuantLinear::forward(const Tensor& x, DType out_dtype) const {
  constexpr const char* op = "SmoothQuantLinear::forward";
  check::floating(x, op, "x");
  QGRAD_CHECK(x.dim() >= 1 && x.size(-1) == w_q.size(1), op, "x", "expected shape [..., ", w_q.size(1), "], got ",
              shape_str(x.shape()));
  check::same_device(x, w_q, op, "x");
  NoGradGuard guard;
  const Tensor xs = divisor.defined() ? div(x.detach(), divisor.to(x.dtype())) : x;
  return quantized_linear(xs, w_q, w_scale, bias, ActivationQuant::fixed(act_scale, act_zero_point, -127, 127),
                          out_dtype);
}

void smoothquant_fold(LayerNorm& ln, Linear& next, const Tensor& s) {
  constexpr const char* op = "smoothquant_fold";
  check::floating(s, op, "s");
  check::rank_is(s, 1, op, "s");
  const std::int64_t K = s.size(0);
  QGRAD_CHECK(ln.normalized_shape() == Shape{K}, op, "ln", "normalized_shape ", shape_str(ln.normalized_shape()),
              " is not [", K, "] (one factor per channel of s)");
  QGRAD_CHECK(ln.weight().defined(), op, "ln", "the LayerNorm has no elementwise weight to fold the factors into");
  QGRAD_CHECK(next.in_features() == K, op, "next", "in_features ", next.in_features(), " does not match s's ", K,
              " channels");
  const std::vector<double> sv = host_values(s);
  for (double v : sv)
    QGRAD_CHECK(std::isfinite(v) && v > 0, op, "s", "factors must be finite and > 0, got ", v);
  NoGradGuard guard;
  Tensor lw = ln.weight(), lb = ln.bias(), w = next.weight();
  lw.copy_(div(lw.detach(), s.to(lw.dtype()).to(lw.device())));
  if (lb.defined()) lb.copy_(div(lb.detach(), s.to(lb.dtype()).to(lb.device())));
  w.copy_(mul(w.detach(), s.to(w.dtype()).to(w.device()).reshape({1, K})));
}

}  // namespace qgrad::nn
