#include "qgrad/nn/quant.h"

#include <cmath>
#include <map>

#include "qgrad/autograd/node.h"
#include "qgrad/nn/pool_norm.h"
#include "qgrad/ops/activation.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/factory.h"
#include "qgrad/ops/observer.h"
#include "qgrad/ops/pool_norm.h"
#include "qgrad/ops/quantize.h"

namespace qgrad::nn {

std::pair<std::int64_t, std::int64_t> quant_min_max(const ObserverOptions& o) {
  const char* op = "Observer";
  QGRAD_CHECK(o.dtype == DType::u8 || o.dtype == DType::s8, op, "dtype",
              "expected u8 (quint8) or s8 (qint8), got ", dtype_name(o.dtype));
  if (o.quant_range) {
    auto [lo, hi] = *o.quant_range;
    const std::int64_t dmin = o.dtype == DType::u8 ? 0 : -128, dmax = o.dtype == DType::u8 ? 255 : 127;
    QGRAD_CHECK(lo <= 0 && 0 <= hi, op, "quant_range", "must include 0, got [", lo, ", ", hi, "]");
    QGRAD_CHECK(lo >= dmin && hi <= dmax && lo < hi, op, "quant_range", "[", lo, ", ", hi,
                "] is not a range inside ", dtype_name(o.dtype), "'s [", dmin, ", ", dmax, "]");
    if (o.reduce_range) {
      auto floor_half = [](std::int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };
      lo = floor_half(lo);
      hi = floor_half(hi);
    }
    return {lo, hi};
  }
  if (o.dtype == DType::s8) return o.reduce_range ? std::pair<std::int64_t, std::int64_t>{-64, 63}
                                                  : std::pair<std::int64_t, std::int64_t>{-128, 127};
  return o.reduce_range ? std::pair<std::int64_t, std::int64_t>{0, 127} : std::pair<std::int64_t, std::int64_t>{0, 255};
}

Observer::Observer(const ObserverOptions& options) : options_(options) {
  const char* op = "Observer";
  std::tie(qmin_, qmax_) = quant_min_max(options);
  QGRAD_CHECK(std::isfinite(options.averaging_constant) && options.averaging_constant <= 1.0, op,
              "averaging_constant", "must be < 0 (min/max) or in [0, 1], got ", options.averaging_constant);
  if (is_per_channel(options.qscheme)) {
    QGRAD_CHECK(options.channels > 0 && options.channels <= 65535, op, "channels", "must be in [1, 65535], got ",
                options.channels);
    QGRAD_CHECK(options.ch_axis >= 0, op, "ch_axis", "must be >= 0, got ", options.ch_axis);
  }
  // Symmetric quint8: 128, or the middle of a customized range (PyTorch).
  sym_zp_ = options.dtype == DType::u8
                ? static_cast<std::int32_t>(options.quant_range ? (qmin_ + qmax_) / 2 : 128)
                : 0;
  const std::int64_t c = channels();
  min_val_ = register_buffer("min_val", full({c}, INFINITY));
  max_val_ = register_buffer("max_val", full({c}, -INFINITY));
}

void Observer::reset() {
  min_val_.copy_(full({channels()}, INFINITY, TensorOptions{}.with_device(min_val_.device())));
  max_val_.copy_(full({channels()}, -INFINITY, TensorOptions{}.with_device(max_val_.device())));
}

std::int64_t Observer::check_x(const Tensor& x) const {
  const char* op = "Observer::forward";
  QGRAD_CHECK(x.defined() && is_floating(x.dtype()), op, "x", "expected a defined floating tensor");
  QGRAD_CHECK(x.device() == min_val_.device(), op, "x", "x is on ", x.device().str(), " but the observer on ",
              min_val_.device().str());
  std::int64_t axis = -1;
  if (is_per_channel(options_.qscheme)) {
    axis = options_.ch_axis;
    QGRAD_CHECK(axis < x.dim(), op, "x", "ch_axis ", axis, " out of range for shape ", shape_str(x.shape()));
    QGRAD_CHECK(x.size(axis) == options_.channels, op, "x", "expected ", options_.channels,
                " channels on axis ", axis, ", got shape ", shape_str(x.shape()));
  }
  return axis;
}

ObserverUpdate Observer::update() const {
  return {min_val_, max_val_, options_.averaging_constant, is_symmetric(options_.qscheme), sym_zp_};
}

Tensor Observer::forward(const Tensor& x) {
  const std::int64_t axis = check_x(x);
  observe_minmax_(x, update(), axis);
  if (range_sync_) range_sync_(min_val_, max_val_);
  return x;
}

void Observer::check_qparams(const Tensor& scale, const Tensor& zero_point) const {
  const char* op = "Observer::calculate_qparams";
  const Shape s{channels()};
  QGRAD_CHECK(scale.defined() && scale.dtype() == DType::f32 && scale.shape() == s, op, "scale",
              "expected f32 ", shape_str(s));
  QGRAD_CHECK(zero_point.defined() && zero_point.dtype() == DType::s32 && zero_point.shape() == s, op,
              "zero_point", "expected s32 ", shape_str(s));
  QGRAD_CHECK(scale.device() == min_val_.device() && zero_point.device() == min_val_.device(), op, "scale",
              "qparams must be on the observer's device ", min_val_.device().str());
}

void Observer::calculate_qparams(const Tensor& scale, const Tensor& zero_point) const {
  check_qparams(scale, zero_point);
  observer_qparams_(update(), scale, zero_point, qmin_, qmax_);
}

void Observer::observe_and_calculate_qparams(const Tensor& x, const Tensor& scale, const Tensor& zero_point) {
  const std::int64_t axis = check_x(x);
  check_qparams(scale, zero_point);
  if (range_sync_) {
    forward(x);
    observer_qparams_(update(), scale, zero_point, qmin_, qmax_);
    return;
  }
  observe_minmax_qparams_(x, update(), axis, scale, zero_point, qmin_, qmax_);
}

Tensor Observer::observe_and_fake_quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                           bool relu) {
  const std::int64_t axis = check_x(x);  // the op checks scale and zero_point
  QGRAD_CHECK(!relu || axis < 0, "Observer::observe_and_fake_quantize", "relu", "per-tensor qparams only");
  if (relu) {
    if (range_sync_) {
      observe_and_calculate_qparams(x.detach(), scale, zero_point);
      return ::qgrad::fake_quantize_relu_per_tensor(x, scale, zero_point, qmin_, qmax_);
    }
    return observe_fake_quantize_relu_per_tensor(x, scale, zero_point, qmin_, qmax_, update());
  }
  if (range_sync_) {
    observe_and_calculate_qparams(x.detach(), scale, zero_point);
    if (axis >= 0) return ::qgrad::fake_quantize_per_channel(x, scale, zero_point, axis, qmin_, qmax_);
    return ::qgrad::fake_quantize_per_tensor(x, scale, zero_point, qmin_, qmax_);
  }
  if (axis >= 0) return observe_fake_quantize_per_channel(x, scale, zero_point, axis, qmin_, qmax_, update());
  return observe_fake_quantize_per_tensor(x, scale, zero_point, qmin_, qmax_, update());
}

std::pair<Tensor, Tensor> Observer::calculate_qparams() const {
  Tensor s = Tensor::empty({channels()}, TensorOptions{}.with_device(min_val_.device()));
  Tensor z = Tensor::empty({channels()}, TensorOptions{}.with_dtype(DType::s32).with_device(min_val_.device()));
  calculate_qparams(s, z);
  return {s, z};
}

namespace {
ObserverOptions make_options(DType dtype, QScheme qscheme, bool reduce_range, double c, std::int64_t channels = 1,
                             std::int64_t axis = 0) {
  ObserverOptions o;
  o.dtype = dtype;
  o.qscheme = qscheme;
  o.reduce_range = reduce_range;
  o.averaging_constant = c;
  o.channels = channels;
  o.ch_axis = axis;
  return o;
}
void check_scheme(QScheme q, bool per_channel, const char* who) {
  QGRAD_CHECK(is_per_channel(q) == per_channel, who, "qscheme",
              per_channel ? "expected a per-channel qscheme" : "expected a per-tensor qscheme");
}
}  // namespace

MinMaxObserver::MinMaxObserver(DType dtype, QScheme qscheme, bool reduce_range)
    : Observer((check_scheme(qscheme, false, "MinMaxObserver"), make_options(dtype, qscheme, reduce_range, -1.0))) {}
MovingAverageMinMaxObserver::MovingAverageMinMaxObserver(double c, DType dtype, QScheme qscheme, bool reduce_range)
    : Observer((check_scheme(qscheme, false, "MovingAverageMinMaxObserver"),
                make_options(dtype, qscheme, reduce_range, c))) {
  QGRAD_CHECK(c >= 0.0, "MovingAverageMinMaxObserver", "averaging_constant", "must be in [0, 1], got ", c);
}
PerChannelMinMaxObserver::PerChannelMinMaxObserver(std::int64_t channels, std::int64_t axis, DType dtype,
                                                   QScheme qscheme, bool reduce_range)
    : Observer((check_scheme(qscheme, true, "PerChannelMinMaxObserver"),
                make_options(dtype, qscheme, reduce_range, -1.0, channels, axis))) {}
MovingAveragePerChannelMinMaxObserver::MovingAveragePerChannelMinMaxObserver(std::int64_t channels, std::int64_t axis,
                                                                             double c, DType dtype, QScheme qscheme,
                                                                             bool reduce_range)
    : Observer((check_scheme(qscheme, true, "MovingAveragePerChannelMinMaxObserver"),
                make_options(dtype, qscheme, reduce_range, c, channels, axis))) {
  QGRAD_CHECK(c >= 0.0, "MovingAveragePerChannelMinMaxObserver", "averaging_constant", "must be in [0, 1], got ", c);
}

// ---- FakeQuantize ----

FakeQuantize::FakeQuantize(const ObserverOptions& options) {
  observer_ = register_module("activation_post_process", std::make_shared<Observer>(options));
  const std::int64_t c = observer_->channels();
  scale_ = register_buffer("scale", ones({c}));
  zero_point_ = register_buffer("zero_point", zeros({c}, TensorOptions{}.with_dtype(DType::s32)));
}

std::optional<ChannelObserveArgs> FakeQuantize::observe_per_channel_args(const Tensor& x) const {
  const ObserverOptions& o = observer_->options();
  if (!observer_enabled_ || !fake_quant_enabled_ || !is_per_channel(o.qscheme) || observer_->has_range_sync())
    return std::nullopt;
  return ChannelObserveArgs{x, scale_, zero_point_, o.ch_axis, qmin(), qmax(), observer_->update()};
}

void FakeQuantize::stage_output(const Tensor& input, const Tensor& output) {
  const char* op = "FakeQuantize::stage_output";
  check::defined(input, op, "input");
  QGRAD_CHECK(output.defined() && output.shape() == input.shape() && output.dtype() == input.dtype() &&
                  output.device() == input.device(),
              op, "output", "expected input's shape, dtype and device");
  staged_input_ = input;
  staged_output_ = output;
}

Tensor FakeQuantize::forward(const Tensor& x) {
  if (staged_output_.defined()) {
    QGRAD_CHECK(x.impl() == staged_input_.impl(), "FakeQuantize::forward", "x",
                "an output was staged for another tensor (stage_output), whose observer update has already run");
    Tensor y = staged_output_;
    drop_staged_output();
    return y;
  }
  if (observer_enabled_ && fake_quant_enabled_) return observer_->observe_and_fake_quantize(x, scale_, zero_point_);
  if (observer_enabled_) observer_->observe_and_calculate_qparams(x.detach(), scale_, zero_point_);
  if (!fake_quant_enabled_) return x;
  const ObserverOptions& o = observer_->options();
  if (is_per_channel(o.qscheme))
    return ::qgrad::fake_quantize_per_channel(x, scale_, zero_point_, o.ch_axis, qmin(), qmax());
  return ::qgrad::fake_quantize_per_tensor(x, scale_, zero_point_, qmin(), qmax());
}

Tensor FakeQuantize::forward_relu(const Tensor& x) {
  const ObserverOptions& o = observer_->options();
  if (!fake_quant_enabled_ || is_per_channel(o.qscheme)) return ::qgrad::relu(forward(x));
  if (observer_enabled_) return observer_->observe_and_fake_quantize(x, scale_, zero_point_, true);
  return ::qgrad::fake_quantize_relu_per_tensor(x, scale_, zero_point_, qmin(), qmax());
}

Tensor FakeQuantize::forward_max_pool(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride, Size2 padding,
                                      Size2 dilation, bool ceil_mode) {
  const ObserverOptions& o = observer_->options();
  if (!fake_quant_enabled_ || is_per_channel(o.qscheme))
    return ::qgrad::max_pool2d(forward(x), kernel_size, stride, padding, dilation, ceil_mode);
  // The observer update forward() runs (observe_and_fake_quantize's minmax
  // and qparams; the same kernels and values), then the fused op.
  if (observer_enabled_) observer_->observe_and_calculate_qparams(x.detach(), scale_, zero_point_);
  return ::qgrad::fake_quantize_max_pool2d(x, scale_, zero_point_, qmin(), qmax(), kernel_size, stride, padding,
                                           dilation, ceil_mode);
}

Tensor FakeQuantize::forward_batch_norm_relu_max_pool(const Tensor& x, const BatchNormArgs& bn,
                                                      const MaxPool2dArgs& pool) {
  const ObserverOptions& o = observer_->options();
  if (!fake_quant_enabled_ || is_per_channel(o.qscheme) || observer_->has_range_sync()) {
    return forward_max_pool(normalize(x, bn, true), pool.kernel_size, pool.stride, pool.padding, pool.dilation,
                            pool.ceil_mode);
  }
  const ObserverUpdate u = observer_->update();
  return ::qgrad::batch_norm_relu_fake_quantize_max_pool2d(x, bn, scale_, zero_point_, qmin(), qmax(), pool,
                                                           observer_enabled_ ? &u : nullptr);
}

// ---- LearnableFakeQuantize ----

LearnableFakeQuantize::LearnableFakeQuantize(const ObserverOptions& options, bool use_grad_scaling)
    : use_grad_scaling_(use_grad_scaling) {
  observer_ = register_module("activation_post_process", std::make_shared<Observer>(options));
  const std::int64_t c = observer_->channels();
  scale_ = register_parameter("scale", ones({c}));
  zero_point_ = register_parameter("zero_point", zeros({c}));
}

double LearnableFakeQuantize::grad_factor(std::int64_t numel) const {
  return use_grad_scaling_ ? 1.0 / std::sqrt(static_cast<double>(numel) * static_cast<double>(qmax())) : 1.0;
}

void LearnableFakeQuantize::enable_param_learning() {
  observer_enabled_ = false;
  fake_quant_enabled_ = true;
  scale_.set_requires_grad(true);
  zero_point_.set_requires_grad(true);
}

void LearnableFakeQuantize::enable_static_estimate() {
  observer_enabled_ = true;
  fake_quant_enabled_ = true;
  scale_.set_requires_grad(false);
  zero_point_.set_requires_grad(false);
}

Tensor LearnableFakeQuantize::forward(const Tensor& x) {
  if (observer_enabled_) {
    observer_->forward(x.detach());
    auto [s, z] = observer_->calculate_qparams();
    scale_.copy_(s);
    zero_point_.copy_(z.to(DType::f32));
  }
  if (!fake_quant_enabled_) return x;
  const ObserverOptions& o = observer_->options();
  const double g = grad_factor(x.numel());
  if (is_per_channel(o.qscheme))
    return ::qgrad::fake_quantize_learnable_per_channel(x, scale_, zero_point_, o.ch_axis, qmin(), qmax(), g);
  return ::qgrad::fake_quantize_learnable_per_tensor(x, scale_, zero_point_, qmin(), qmax(), g);
}

void enable_observer(Module& root, bool on) {
  for_each_module(root, [&](Module& m) {
    if (auto* fq = dynamic_cast<FakeQuantize*>(&m)) fq->enable_observer(on);
    if (auto* lfq = dynamic_cast<LearnableFakeQuantize*>(&m)) lfq->enable_observer(on);
  });
}

void enable_fake_quant(Module& root, bool on) {
  for_each_module(root, [&](Module& m) {
    if (auto* fq = dynamic_cast<FakeQuantize*>(&m)) fq->enable_fake_quant(on);
    if (auto* lfq = dynamic_cast<LearnableFakeQuantize*>(&m)) lfq->enable_fake_quant(on);
  });
}

namespace {
// Visits every fake quant under m with its dotted path prefix ("" or "a.b.").
template <class F>
void for_each_fake_quant(Module& m, const std::string& prefix, F&& f) {
  if (dynamic_cast<FakeQuantize*>(&m) || dynamic_cast<LearnableFakeQuantize*>(&m)) f(m, prefix);
  for (auto& [n, c] : m.named_children()) for_each_fake_quant(*c, prefix + n + ".", f);
}
bool observer_on(Module& m) {
  if (auto* fq = dynamic_cast<FakeQuantize*>(&m)) return fq->observer_enabled();
  return dynamic_cast<LearnableFakeQuantize&>(m).observer_enabled();
}
bool fake_quant_on(Module& m) {
  if (auto* fq = dynamic_cast<FakeQuantize*>(&m)) return fq->fake_quant_enabled();
  return dynamic_cast<LearnableFakeQuantize&>(m).fake_quant_enabled();
}
}  // namespace

NamedTensors quant_flags(const Module& root) {
  NamedTensors out;
  // The walk only reads; Module's child accessors are shared handles.
  for_each_fake_quant(const_cast<Module&>(root), "", [&](Module& m, const std::string& p) {
    out.emplace_back(p + "observer_enabled", Tensor::scalar<std::uint8_t>(observer_on(m) ? 1 : 0));
    out.emplace_back(p + "fake_quant_enabled", Tensor::scalar<std::uint8_t>(fake_quant_on(m) ? 1 : 0));
  });
  return out;
}

void load_quant_flags(Module& root, const NamedTensors& flags) {
  const char* op = "load_quant_flags";
  std::map<std::string, bool> given;
  for (const auto& [n, t] : flags) {
    QGRAD_CHECK(t.defined() && t.numel() == 1 && t.dtype() == DType::u8, op, n, "expected one u8 value");
    const double v = t.item();
    QGRAD_CHECK(v == 0 || v == 1, op, n, "expected 0 or 1, got ", v);
    QGRAD_CHECK(given.emplace(n, v == 1).second, op, n, "duplicate entry");
  }
  std::vector<std::pair<Module*, std::string>> targets;
  for_each_fake_quant(root, "", [&](Module& m, const std::string& p) {
    for (const char* k : {"observer_enabled", "fake_quant_enabled"})
      QGRAD_CHECK(given.count(p + k), op, p + k, "missing from the flags");
    targets.emplace_back(&m, p);
  });
  QGRAD_CHECK(given.size() == 2 * targets.size(), op, "flags", given.size() - 2 * targets.size(),
              " entries name no fake quant of this model");
  for (auto& [m, p] : targets) {
    const bool obs = given.at(p + "observer_enabled"), fq = given.at(p + "fake_quant_enabled");
    if (auto* f = dynamic_cast<FakeQuantize*>(m)) {
      f->enable_observer(obs);
      f->enable_fake_quant(fq);
    } else {
      auto& l = dynamic_cast<LearnableFakeQuantize&>(*m);
      l.enable_observer(obs);
      l.enable_fake_quant(fq);
    }
  }
}

}  // namespace qgrad::nn
