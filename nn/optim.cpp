#include "qgrad/nn/optim.h"

#include <cmath>
#include <map>
#include <numbers>

#include "qgrad/autograd/node.h"
#include "qgrad/ops/factory.h"

namespace qgrad::nn {


namespace {
void check_hyper(double v, const char* op, const char* arg, double lo, double hi) {
  QGRAD_CHECK(std::isfinite(v) && v >= lo && v <= hi, op, arg, "must be in [", lo, ", ", hi, "], got ", v);
}
}  // namespace

Optimizer::Optimizer(NamedTensors params, OptimizerHyper hyper, const char* kind)
    : hyper_(hyper), kind_(kind), params_(std::move(params)) {
  QGRAD_CHECK(!params_.empty(), kind_, "params", "no parameters to optimize");
  check_hyper(hyper.lr, kind_, "lr", 0.0, 1e30);
  check_hyper(hyper.weight_decay, kind_, "weight_decay", 0.0, 1e30);
  std::map<std::string, int> seen;
  for (const auto& [n, p] : params_) {
    QGRAD_CHECK(p.defined(), kind_, "params", "parameter '", n, "' is undefined");
    QGRAD_CHECK(seen.emplace(n, 0).second, kind_, "params", "parameter name '", n, "' appears twice");
    QGRAD_CHECK(is_floating(p.dtype()) && p.requires_grad() && p.is_leaf(), kind_, "params", "parameter '", n,
                "' must be a floating leaf that requires grad");
    QGRAD_CHECK(p.device() == params_.front().second.device(), kind_, "params", "parameter '", n, "' is on ",
                p.device().str(), ", the first on ", params_.front().second.device().str());
  }
  const auto count = params_.size();
  buf1_.resize(count);
  buf2_.resize(count);
  param_steps_.assign(count, 0);
  if (hyper_.kind == OptimizerKind::adamw) {
    for (std::size_t i = 0; i < count; ++i) {
      const Tensor& p = params_[i].second;
      buf1_[i] = zeros(p.shape(), TensorOptions{}.with_dtype(p.dtype()).with_device(p.device()));
      buf2_[i] = zeros(p.shape(), TensorOptions{}.with_dtype(p.dtype()).with_device(p.device()));
    }
  }
}

void Optimizer::set_lr(double lr) {
  check_hyper(lr, kind_, "lr", 0.0, 1e30);
  hyper_.lr = lr;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  // Group by dtype: one fused launch (or a few, on CUDA) per dtype.
  std::map<DType, std::vector<OptimizerSlot>> groups;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].second;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    QGRAD_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(), kind_, "grad",
                "gradient of '", params_[i].first, "' does not match its parameter (", shape_str(g.shape()), " ",
                dtype_name(g.dtype()), ")");
    QGRAD_CHECK(p.device() == params_.front().second.device(), kind_, "params", "parameter '", params_[i].first,
                "' moved to ", p.device().str());
    OptimizerSlot slot;
    slot.param = p.detach();
    slot.grad = g;
    // State follows its parameter after Module::to (a one-time copy).
    move_in_place(buf1_[i], p.device());
    move_in_place(buf2_[i], p.device());
    if (hyper_.kind == OptimizerKind::sgd && hyper_.momentum != 0.0) {
      if (!buf1_[i].defined()) {
        // Zeros, not empty: the first step overwrites the buffer with the
        // gradient, but the kernel reads it before choosing (initcheck-clean).
        buf1_[i] = zeros(p.shape(), TensorOptions{}.with_dtype(p.dtype()).with_device(p.device()));
        slot.first = true;
      }
    }
    slot.buf1 = buf1_[i];
    slot.buf2 = buf2_[i];
    slot.step = param_steps_[i] + 1;
    groups[p.dtype()].push_back(slot);
  }
  if (grad_scale_.defined()) move_in_place(grad_scale_, params_.front().second.device());
  if (nonfinite_.defined()) move_in_place(nonfinite_, params_.front().second.device());
  for (auto& [dt, slots] : groups) optimizer_step_(hyper_, slots, grad_scale_, nonfinite_);
  grad_scale_ = Tensor();
  // Host-side bookkeeping only after every launch was queued.
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].second.grad().defined()) ++param_steps_[i];
  ++steps_;
}

void Optimizer::zero_grad() {
  for (auto& [n, p] : params_) const_cast<Tensor&>(p).zero_grad();
  grad_scale_ = Tensor();
}

void Optimizer::set_grad_scale(const Tensor& scale) {
  QGRAD_CHECK(!grad_scale_.defined(), kind_, "grad_scale",
              "a clip coefficient is already pending for the next step (clip once per step)");
  const Tensor& p = params_.front().second;
  QGRAD_CHECK(scale.defined() && scale.numel() == 1 && scale.dtype() == p.dtype() && scale.device() == p.device(),
              kind_, "grad_scale", "expected one ", dtype_name(p.dtype()), " element on ", p.device().str());
  grad_scale_ = scale;
}

Tensor Optimizer::nonfinite_flag() {
  const Device dev = params_.front().second.device();
  if (!nonfinite_.defined()) nonfinite_ = zeros({1}, TensorOptions{}.with_dtype(DType::s32).with_device(dev));
  move_in_place(nonfinite_, dev);
  return nonfinite_;
}

void Optimizer::check_finite() {
  if (!nonfinite_.defined() || nonfinite_.item() == 0.0) return;
  nonfinite_.copy_(zeros({1}, TensorOptions{}.with_dtype(DType::s32)));
  QGRAD_CHECK(false, "clip_grad_norm", "error_if_nonfinite",
              "the total norm of the gradients was NaN or infinite at a clip since the last check, so they could "
              "not be clipped; the steps that followed skipped their update. Set error_if_nonfinite = false to "
              "scale the gradients by the non-finite norm anyway");
}

namespace {

std::vector<Tensor> defined_grads(const NamedTensors& params) {
  std::vector<Tensor> grads;
  for (const auto& [n, p] : params)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

Tensor zero_norm(const NamedTensors& params) {
  if (params.empty() || !params.front().second.defined()) return zeros({});
  const Tensor& p = params.front().second;
  return zeros({}, TensorOptions{}.with_dtype(p.dtype()).with_device(p.device()));
}

}  // namespace

Tensor clip_grad_norm(Optimizer& opt, double max_norm, double norm_type, bool error_if_nonfinite) {
  NoGradGuard no_grad;
  QGRAD_CHECK(!opt.grad_scale().defined(), "clip_grad_norm", "opt",
              "a clip coefficient is already pending for the next step (clip once per step)");
  const std::vector<Tensor> grads = defined_grads(opt.params());
  if (grads.empty()) return zero_norm(opt.params());
  GradNorm n = grad_norm(grads, max_norm, norm_type, error_if_nonfinite ? opt.nonfinite_flag() : Tensor());
  opt.set_grad_scale(n.clip_coef);
  return n.total_norm;
}

Tensor clip_grad_norm(const NamedTensors& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = defined_grads(params);
  if (grads.empty()) return zero_norm(params);
  GradNorm n = grad_norm(grads, max_norm, norm_type);
  if (error_if_nonfinite) {
    const double t = n.total_norm.item();  // a host sync, as in PyTorch
    QGRAD_CHECK(std::isfinite(t), "clip_grad_norm", "error_if_nonfinite", "the total norm of order ", norm_type,
                " of the gradients is ", t,
                ", so they cannot be clipped. Set error_if_nonfinite = false to scale them by it anyway");
  }
  grad_scale_(grads, n.clip_coef);
  return n.total_norm;
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  out.emplace_back("step", Tensor::scalar<std::int64_t>(steps_));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string& n = params_[i].first;
    out.emplace_back(n + ".step", Tensor::scalar<std::int64_t>(param_steps_[i]));
    if (hyper_.kind == OptimizerKind::sgd) {
      if (buf1_[i].defined()) out.emplace_back(n + ".momentum_buffer", buf1_[i]);
    } else {
      out.emplace_back(n + ".exp_avg", buf1_[i]);
      out.emplace_back(n + ".exp_avg_sq", buf2_[i]);
    }
  }
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& state) {
  const char* op = "Optimizer::load_state_dict";
  std::map<std::string, Tensor> given;
  for (const auto& [n, t] : state) QGRAD_CHECK(given.emplace(n, t).second, op, n, "duplicate entry");
  auto scalar_s64 = [&](const std::string& n) -> std::int64_t {
    auto it = given.find(n);
    QGRAD_CHECK(it != given.end(), op, n, "missing from the state");
    QGRAD_CHECK(it->second.dtype() == DType::s64 && it->second.numel() == 1, op, n, "expected one s64 value");
    const std::int64_t v = static_cast<std::int64_t>(it->second.item());
    QGRAD_CHECK(v >= 0, op, n, "negative step count ", v);
    return v;
  };
  auto check_buf = [&](const std::string& n, const Tensor& p) -> const Tensor* {
    auto it = given.find(n);
    if (it == given.end()) return nullptr;
    QGRAD_CHECK(it->second.shape() == p.shape() && it->second.dtype() == p.dtype(), op, n, "expected ",
                shape_str(p.shape()), " ", dtype_name(p.dtype()), ", got ", shape_str(it->second.shape()), " ",
                dtype_name(it->second.dtype()));
    return &it->second;
  };
  std::size_t used = 1;
  const std::int64_t steps = scalar_s64("step");
  std::vector<std::int64_t> psteps(params_.size());
  std::vector<const Tensor*> b1(params_.size(), nullptr), b2(params_.size(), nullptr);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string& n = params_[i].first;
    const Tensor& p = params_[i].second;
    psteps[i] = scalar_s64(n + ".step");
    ++used;
    if (hyper_.kind == OptimizerKind::sgd) {
      b1[i] = check_buf(n + ".momentum_buffer", p);
      used += b1[i] ? 1 : 0;
    } else {
      b1[i] = check_buf(n + ".exp_avg", p);
      b2[i] = check_buf(n + ".exp_avg_sq", p);
      QGRAD_CHECK(b1[i] && b2[i], op, n, "AdamW state needs exp_avg and exp_avg_sq");
      used += 2;
    }
  }
  QGRAD_CHECK(used == given.size(), op, "state", given.size() - used, " entries do not belong to this ", kind_,
              " optimizer's parameters");
  steps_ = steps;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].second;
    param_steps_[i] = psteps[i];
    const auto opts = TensorOptions{}.with_dtype(p.dtype()).with_device(p.device());
    if (b1[i]) {
      if (!buf1_[i].defined()) buf1_[i] = Tensor::empty(p.shape(), opts);
      buf1_[i].copy_(*b1[i]);
    } else if (hyper_.kind == OptimizerKind::sgd) {
      buf1_[i] = Tensor();
    }
    if (b2[i]) buf2_[i].copy_(*b2[i]);
  }
}

SGD::SGD(NamedTensors params, const SGDOptions& o)
    : Optimizer(std::move(params),
                OptimizerHyper{OptimizerKind::sgd, o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov},
                "SGD") {
  check_hyper(o.momentum, "SGD", "momentum", 0.0, 1e30);
  check_hyper(o.dampening, "SGD", "dampening", -1e30, 1e30);
  QGRAD_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD", "nesterov",
              "Nesterov momentum requires a momentum and zero dampening");
}

AdamW::AdamW(NamedTensors params, const AdamWOptions& o)
    : Optimizer(std::move(params), [&] {
        OptimizerHyper h;
        h.kind = OptimizerKind::adamw;
        h.lr = o.lr;
        h.weight_decay = o.weight_decay;
        h.beta1 = o.beta1;
        h.beta2 = o.beta2;
        h.eps = o.eps;
        return h;
      }(), "AdamW") {
  check_hyper(o.beta1, "AdamW", "beta1", 0.0, 0.999999999999);
  check_hyper(o.beta2, "AdamW", "beta2", 0.0, 0.999999999999);
  check_hyper(o.eps, "AdamW", "eps", 0.0, 1e30);
}

CosineSchedule::CosineSchedule(double base_lr, std::int64_t total_steps, std::int64_t warmup_steps, double min_lr)
    : base_(base_lr), min_(min_lr), total_(total_steps), warmup_(warmup_steps) {
  QGRAD_CHECK(std::isfinite(base_lr) && base_lr >= 0, "CosineSchedule", "base_lr", "must be >= 0, got ", base_lr);
  QGRAD_CHECK(std::isfinite(min_lr) && min_lr >= 0, "CosineSchedule", "min_lr", "must be >= 0, got ", min_lr);
  QGRAD_CHECK(total_steps > 0, "CosineSchedule", "total_steps", "must be > 0, got ", total_steps);
  QGRAD_CHECK(warmup_steps >= 0 && warmup_steps < total_steps, "CosineSchedule", "warmup_steps",
              "must be in [0, total_steps), got ", warmup_steps);
}

double CosineSchedule::lr_at(std::int64_t step) const {
  if (step < warmup_) return base_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step >= total_) return min_;
  const double t = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  return min_ + (base_ - min_) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
}

StepSchedule::StepSchedule(double base_lr, std::int64_t step_size, double gamma)
    : base_(base_lr), gamma_(gamma), step_size_(step_size) {
  QGRAD_CHECK(std::isfinite(base_lr) && base_lr >= 0, "StepSchedule", "base_lr", "must be >= 0, got ", base_lr);
  QGRAD_CHECK(step_size > 0, "StepSchedule", "step_size", "must be > 0, got ", step_size);
  QGRAD_CHECK(std::isfinite(gamma) && gamma > 0, "StepSchedule", "gamma", "must be > 0, got ", gamma);
}

double StepSchedule::lr_at(std::int64_t step) const {
  return base_ * std::pow(gamma_, static_cast<double>(step / step_size_));
}

}  // namespace qgrad::nn
