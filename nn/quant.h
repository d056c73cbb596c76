// Quantization toolkit: observers, FakeQuantize, LearnableFakeQuantize
// (torch/ao/quantization/{observer,fake_quantize,_learnable_fake_quantize}.py).
//
// Everything stays on the device: an observer's forward is one fused
// min/max + running-update reduction (the op observe_minmax_, ops/observer.h); in FakeQuantize
// the kernel that finishes it also writes the f32 scale and s32 zero_point
// tensors the fake-quant ops read. The enable switches are host booleans,
// and a never-observed range is recognised on the device (+-inf), so a
// training step never waits for the device and, once warmed up, takes the
// same host path every step: it can be captured in a CudaGraph (PyTorch
// keeps the switches in device tensors and reads them back every call).
#pragma once

#include <functional>
#include <optional>
#include <utility>

#include "qgrad/nn/module.h"
#include "qgrad/ops/pool_norm.h"
#include "qgrad/ops/quantize.h"

namespace qgrad::nn {

enum class QScheme : unsigned char { per_tensor_affine, per_tensor_symmetric, per_channel_affine, per_channel_symmetric };

inline bool is_per_channel(QScheme q) { return q == QScheme::per_channel_affine || q == QScheme::per_channel_symmetric; }
inline bool is_symmetric(QScheme q) { return q == QScheme::per_tensor_symmetric || q == QScheme::per_channel_symmetric; }

struct ObserverOptions {
  DType dtype = DType::u8;  // u8 = torch.quint8, s8 = torch.qint8
  QScheme qscheme = QScheme::per_tensor_affine;
  bool reduce_range = false;
  // < 0: MinMaxObserver (running min/max); otherwise moving average with
  // this constant (PyTorch's default 0.01).
  double averaging_constant = -1.0;
  std::int64_t ch_axis = 0;   // per-channel only
  std::int64_t channels = 1;  // per-channel only: size of x along ch_axis
  // A customized [quant_min, quant_max] (PyTorch's quant_min/quant_max
  // arguments); reduce_range then halves both (floor division).
  std::optional<std::pair<std::int64_t, std::int64_t>> quant_range;
};

// PyTorch's _calculate_qmin_qmax. Throws qgrad::Error for a bad dtype or range.
std::pair<std::int64_t, std::int64_t> quant_min_max(const ObserverOptions& o);

// Records the running min/max of what it sees (buffers "min_val",
// "max_val": f32 [C], starting at +inf / -inf) and turns them into qparams.
class Observer : public Module {
 public:
  explicit Observer(const ObserverOptions& options);
  // Observes x (never recorded on the tape) and returns x unchanged.
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Observer"; }
  // Writes scale (f32 [C]) and zero_point (s32 [C]) on the observer's
  // device with formulas::observer_qparams; never-observed channels get
  // scale 1, zero point 0.
  void calculate_qparams(const Tensor& scale, const Tensor& zero_point) const;
  std::pair<Tensor, Tensor> calculate_qparams() const;
  // forward(x) then calculate_qparams(scale, zero_point), fused: on CUDA the
  // qparams are written by the kernel that finishes the min/max reduction.
  void observe_and_calculate_qparams(const Tensor& x, const Tensor& scale, const Tensor& zero_point);
  // observe_and_calculate_qparams(x, scale, zero_point), then the fake
  // quantize of x with them (per tensor, or per channel on ch_axis), in one
  // op: observe_fake_quantize_per_{tensor,channel} (one launch on CUDA).
  // With relu (per tensor only): relu of that, in the same op
  // (observe_fake_quantize_relu_per_tensor).
  Tensor observe_and_fake_quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                   bool relu = false);
  const ObserverOptions& options() const { return options_; }
  ObserverUpdate update() const;  // the running range, as the observer ops take it
  std::int64_t qmin() const { return qmin_; }
  std::int64_t qmax() const { return qmax_; }
  std::int64_t channels() const { return is_per_channel(options_.qscheme) ? options_.channels : 1; }
  Tensor min_val() const { return min_val_; }
  Tensor max_val() const { return max_val_; }
  // Back to the never-observed state.
  void reset();
  // A reduction of the running range across processes, run after every
  // update of min_val/max_val and before qparams are computed from them
  // (DistributedDataParallel installs an all-reduce: min of min_val, max of
  // max_val, so every rank fake-quantizes with the same qparams). With one
  // installed, the observe-and-quantize calls run unfused: observe, sync,
  // qparams, fake quantize. An empty function removes it.
  using RangeSync = std::function<void(const Tensor& min_val, const Tensor& max_val)>;
  void set_range_sync(RangeSync sync) { range_sync_ = std::move(sync); }
  bool has_range_sync() const { return static_cast<bool>(range_sync_); }

 private:
  std::int64_t check_x(const Tensor& x) const;  // returns the channel axis (-1: per tensor)
  void check_qparams(const Tensor& scale, const Tensor& zero_point) const;
  ObserverOptions options_;
  std::int64_t qmin_, qmax_;
  std::int32_t sym_zp_;
  Tensor min_val_, max_val_;
  RangeSync range_sync_;
};

// The observers PyTorch names, as constructors of Observer.
struct MinMaxObserver : Observer {
  explicit MinMaxObserver(DType dtype = DType::u8, QScheme qscheme = QScheme::per_tensor_affine,
                          bool reduce_range = false);
};
struct MovingAverageMinMaxObserver : Observer {
  explicit MovingAverageMinMaxObserver(double averaging_constant = 0.01, DType dtype = DType::u8,
                                       QScheme qscheme = QScheme::per_tensor_affine, bool reduce_range = false);
};
struct PerChannelMinMaxObserver : Observer {
  PerChannelMinMaxObserver(std::int64_t channels, std::int64_t ch_axis = 0, DType dtype = DType::u8,
                           QScheme qscheme = QScheme::per_channel_affine, bool reduce_range = false);
};
struct MovingAveragePerChannelMinMaxObserver : Observer {
  MovingAveragePerChannelMinMaxObserver(std::int64_t channels, std::int64_t ch_axis = 0,
                                        double averaging_constant = 0.01, DType dtype = DType::u8,
                                        QScheme qscheme = QScheme::per_channel_affine, bool reduce_range = false);
};

// Observer + fake quantization. Buffers "scale" (f32 [C], 1) and
// "zero_point" (s32 [C], 0); child "activation_post_process" (observer).
//   forward: if observer enabled: observe x, recompute scale/zero_point;
//            if fake quant enabled: fake_quantize_per_{tensor,channel}(x, scale, zero_point, qmin, qmax);
//            both: Observer::observe_and_fake_quantize (one op, one CUDA launch).
class FakeQuantize : public Module {
 public:
  explicit FakeQuantize(const ObserverOptions& options);
  Tensor forward(const Tensor& x) override;
  // max_pool2d(forward(x), ...), the same values, observer state and
  // gradients: with fake quant on and per-tensor qparams, the observer
  // update and then fake_quantize_max_pool2d (no fake-quantized tensor).
  Tensor forward_max_pool(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride, Size2 padding,
                          Size2 dilation, bool ceil_mode);
  // forward_max_pool of relu(batch_norm(x)) (channel_div_add_batch_norm with
  // bn.divisor, batch_norm_relu without), the same values, statistics,
  // observer state and gradients: with fake quant on, per-tensor qparams and
  // no range sync, one op (batch_norm_relu_fake_quantize_max_pool2d: no
  // normalised tensor, no observer pass over it).
  Tensor forward_batch_norm_relu_max_pool(const Tensor& x, const BatchNormArgs& bn, const MaxPool2dArgs& pool);
  // relu(forward(x)), the same values and observer state: with fake quant on
  // and per-tensor qparams, one op (observe_fake_quantize_relu_per_tensor, or
  // fake_quantize_relu_per_tensor with the observer off; relu's pass and its
  // backward pass folded into the fake quant's). Its gradient differs from
  // the composition's only where q > qmax: +0 there, where the composition
  // gives dy * 0 (ops/quantize.h).
  Tensor forward_relu(const Tensor& x);
  // The arguments of the observe_fake_quantize_per_channel that forward(x)
  // runs, when it runs that op (observer and fake quant on, per-channel
  // qparams, no range sync); nullopt otherwise.
  std::optional<ChannelObserveArgs> observe_per_channel_args(const Tensor& x) const;
  // Hands the next forward its output for `input`, computed elsewhere with
  // observe_per_channel_args(input) (stage_weight_fake_quants batches the
  // weights'): that forward must get `input` itself (the same tensor; its
  // observer has already seen it, so another one is an error naming "x"),
  // returns `output` and drops it.
  void stage_output(const Tensor& input, const Tensor& output);
  void drop_staged_output() { staged_input_ = staged_output_ = Tensor(); }
  std::string type_name() const override { return "FakeQuantize"; }
  void enable_observer(bool on = true) { observer_enabled_ = on; }
  void enable_fake_quant(bool on = true) { fake_quant_enabled_ = on; }
  bool observer_enabled() const { return observer_enabled_; }
  bool fake_quant_enabled() const { return fake_quant_enabled_; }
  Tensor scale() const { return scale_; }
  Tensor zero_point() const { return zero_point_; }
  std::int64_t qmin() const { return observer_->qmin(); }
  std::int64_t qmax() const { return observer_->qmax(); }
  const Observer& observer() const { return *observer_; }
  const ObserverOptions& options() const { return observer_->options(); }

 private:
  std::shared_ptr<Observer> observer_;
  Tensor scale_, zero_point_;
  Tensor staged_input_, staged_output_;  // stage_output's
  bool observer_enabled_ = true, fake_quant_enabled_ = true;
};

// LSQ (PyTorch's _LearnableFakeQuantize): parameters "scale" and
// "zero_point" (f32 [C]). While the observer ("static estimate") is on,
// each forward overwrites them with the observer's qparams; fake quant
// uses fake_quantize_learnable_per_{tensor,channel} with grad_factor =
// 1/sqrt(numel(x) * qmax) when use_grad_scaling, else 1. Unlike PyTorch it
// does not clamp the scale to eps while the observer is off.
class LearnableFakeQuantize : public Module {
 public:
  LearnableFakeQuantize(const ObserverOptions& options, bool use_grad_scaling = false);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LearnableFakeQuantize"; }
  void enable_observer(bool on = true) { observer_enabled_ = on; }
  void enable_fake_quant(bool on = true) { fake_quant_enabled_ = on; }
  bool observer_enabled() const { return observer_enabled_; }
  bool fake_quant_enabled() const { return fake_quant_enabled_; }
  // PyTorch's enable_param_learning: observer off, fake quant on, scale and
  // zero point require grad.
  void enable_param_learning();
  // PyTorch's enable_static_estimate: observer on, no learning.
  void enable_static_estimate();
  double grad_factor(std::int64_t numel) const;
  Tensor scale() const { return scale_; }
  Tensor zero_point() const { return zero_point_; }
  std::int64_t qmin() const { return observer_->qmin(); }
  std::int64_t qmax() const { return observer_->qmax(); }

 private:
  std::shared_ptr<Observer> observer_;
  Tensor scale_, zero_point_;
  bool use_grad_scaling_;
  bool observer_enabled_ = true, fake_quant_enabled_ = true;
};

// Recursive switches over every (Learnable)FakeQuantize under `root`.
void enable_observer(Module& root, bool on = true);
void enable_fake_quant(Module& root, bool on = true);

// The enabled flags of every FakeQuantize and LearnableFakeQuantize under
// root, which are members, not buffers (so model.state_dict() and the
// checkpoints built from it do not hold them): "<path>.observer_enabled"
// and "<path>.fake_quant_enabled", u8 scalars (0 or 1), <path> the module's
// dotted name as in named_buffers(). Training checkpoints save them
// (nn::save_train_state) so a resumed run observes and fake-quantizes
// exactly as the interrupted one did.
NamedTensors quant_flags(const Module& root);
// Sets the flags from quant_flags' output; every fake quant under root must
// be named exactly once (no missing or extra entries, values 0 or 1),
// checked before any flag changes. Throws qgrad::Error naming the entry.
void load_quant_flags(Module& root, const NamedTensors& flags);

}  // namespace qgrad::nn
