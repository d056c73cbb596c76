// Optimizers (SGD, AdamW) with PyTorch's update formulas, run by one fused
// kernel launch per step (the op optimizer_step_, ops/optim.h), and learning-rate schedules.
//
// step() never waits for the device: hyper-parameters (lr from a schedule,
// AdamW's bias corrections from the host-side step count) travel as kernel
// arguments. Parameters without a gradient are skipped, as in PyTorch.
#pragma once

#include <string>
#include <vector>

#include "qgrad/ops/optim.h"
#include "qgrad/nn/module.h"

namespace qgrad::nn {

class Optimizer {
 public:
  // Named parameters (e.g. model.named_parameters()): the names key the
  // state dict. All must be floating leaves requiring grad, on one device.
  Optimizer(NamedTensors params, OptimizerHyper hyper, const char* kind);
  virtual ~Optimizer() = default;

  // Runs the fused update; a pending clip coefficient (clip_grad_norm on
  // this optimizer) multiplies every gradient inside that same kernel and
  // is consumed. While the non-finite flag is set, the step writes nothing.
  void step();
  // Drops the gradients and any pending clip coefficient.
  void zero_grad();
  double lr() const { return hyper_.lr; }
  void set_lr(double lr);
  // Number of step() calls made.
  std::int64_t step_count() const { return steps_; }
  const OptimizerHyper& hyper() const { return hyper_; }
  const NamedTensors& params() const { return params_; }
  const char* kind() const { return kind_; }

  // "step" (s64 scalar), then per parameter "<name>.step" (s64 scalar) and
  // its buffers "<name>.momentum_buffer" (SGD, once created) or
  // "<name>.exp_avg" / "<name>.exp_avg_sq" (AdamW). Buffers are shared
  // handles, not copies.
  NamedTensors state_dict() const;
  // Validates every entry (names, shapes, dtypes) before changing anything.
  void load_state_dict(const NamedTensors& state);

  // The clip coefficient the next step() applies (a one-element device
  // tensor of the parameters' dtype; clip_grad_norm sets it). Throws if one
  // is already pending: clip once per step.
  void set_grad_scale(const Tensor& scale);
  const Tensor& grad_scale() const { return grad_scale_; }  // undefined when none is pending
  // clip_grad_norm(..., error_if_nonfinite = true)'s sticky flag: an s32
  // one-element tensor on the parameters' device, created (0) on first use,
  // set to 1 on the device when a clipped total norm is NaN or infinite.
  // While it is set, step() skips its update (on the device: the parameters
  // and buffers keep their last finite values; the host-side step counts
  // still advance).
  Tensor nonfinite_flag();
  // The error of error_if_nonfinite, at a point the caller chooses: waits
  // for the device, and when the flag is set, clears it and throws
  // qgrad::Error (op "clip_grad_norm", argument "error_if_nonfinite").
  void check_finite();

 protected:
  OptimizerHyper hyper_;

 private:
  const char* kind_;
  NamedTensors params_;
  std::vector<Tensor> buf1_, buf2_;
  std::vector<std::int64_t> param_steps_;
  std::int64_t steps_ = 0;
  Tensor grad_scale_, nonfinite_;
};

// torch.nn.utils.clip_grad_norm_ by the global norm of the gradients (the
// parameters with a gradient), on the device and without a host sync
// (ops/optim.h grad_norm: one multi-tensor reduction in a fixed order, the
// same bits on every run and on CPU and CUDA):
//   total_norm = norm_p of the per-parameter norm_p's (norm_type 1, 2 or inf),
//   clip_coef  = min(max_norm / (total_norm + 1e-6), 1),  grads *= clip_coef.
// Returns total_norm, a scalar device tensor of the gradients' dtype (read
// it, e.g. for logging, at a point where a sync is fine). All gradients must
// share one dtype. No gradient at all: a zero, nothing clipped.
//
// On an Optimizer: the gradients are NOT modified; the coefficient is
// applied inside the optimizer's next step() (the fused kernel reads it
// from the device: no extra pass over the gradients). error_if_nonfinite:
// PyTorch syncs to raise here; we do not. A non-finite total sets
// opt.nonfinite_flag() on the device, the steps skip their update while it
// is set, and opt.check_finite() throws where the caller chooses to sync
// (e.g. at the end of an epoch or when logging).
Tensor clip_grad_norm(Optimizer& opt, double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false);
// On parameters: PyTorch's semantics, the gradients are scaled in place (one
// multi-tensor launch). error_if_nonfinite here syncs (as PyTorch does) and
// throws before any gradient is modified.
Tensor clip_grad_norm(const NamedTensors& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(NamedTensors params, const SGDOptions& options);
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW : public Optimizer {
 public:
  AdamW(NamedTensors params, const AdamWOptions& options);
};

// ---- learning-rate schedules: lr as a pure function of the step ----

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  virtual double lr_at(std::int64_t step) const = 0;
  // Sets opt's lr for its next step (step index = opt.step_count()).
  void apply(Optimizer& opt) const { opt.set_lr(lr_at(opt.step_count())); }
};

// Linear warmup over `warmup_steps` (lr = base*(step+1)/warmup), then
// cosine from base to min_lr over the remaining steps (PyTorch's
// CosineAnnealingLR closed form); min_lr after total_steps.
class CosineSchedule : public LRSchedule {
 public:
  CosineSchedule(double base_lr, std::int64_t total_steps, std::int64_t warmup_steps = 0, double min_lr = 0.0);
  double lr_at(std::int64_t step) const override;

 private:
  double base_, min_;
  std::int64_t total_, warmup_;
};

// lr = base * gamma^(step / step_size) (PyTorch's StepLR).
class StepSchedule : public LRSchedule {
 public:
  StepSchedule(double base_lr, std::int64_t step_size, double gamma = 0.1);
  double lr_at(std::int64_t step) const override;

 private:
  double base_, gamma_;
  std::int64_t step_size_;
};

}  // namespace qgrad::nn
