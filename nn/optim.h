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

  void step();
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

 protected:
  OptimizerHyper hyper_;

 private:
  const char* kind_;
  NamedTensors params_;
  std::vector<Tensor> buf1_, buf2_;
  std::vector<std::int64_t> param_steps_;
  std::int64_t steps_ = 0;
};

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
