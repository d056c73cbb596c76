// The model of the QAT step benchmark (bench_train_step.cpp) and of its
// capture test (tests/test_train_step_graph.cpp): a 784-H-H-10 MLP,
// nn::Sequential of Linear/ReLU, prepared with prepare_qat and the default
// QAT qconfig, on `device`, with SGD (momentum 0.9, fixed lr) over its
// parameters; step() is one training step with gradients set to none.
#pragma once

#include <memory>

#include "qgrad/qgrad.h"

namespace qgrad::bench {

// A model prepared with prepare_qat and the default QAT qconfig, moved to
// `device`, in training mode, with SGD (momentum 0.9, fixed lr: a captured
// step bakes it in); step() is one training step with gradients set to none.
struct QatStep {
  std::shared_ptr<nn::Sequential> model = std::make_shared<nn::Sequential>();
  std::unique_ptr<nn::Optimizer> opt;  // SGD here; AdamW for the ViT (qat_vit.h)
  double clip_grad_norm = 0;  // > 0: nn::clip_grad_norm(*opt, it) fused into the step
  bool stage_8da8w = false;   // nn::stage_8da8w_weights before the forward (the ViT)
  // The forward, loss and backward through nn::qat_mlp_loss_backward (one
  // fused kernel on CUDA for an MLP; the composed ops elsewhere).
  bool fused = false;

  void prepare(Device device, double lr) {
    nn::prepare_qat(*model, nn::default_qat_qconfig());
    model->to(device);
    model->train();
    nn::SGDOptions o;
    o.lr = lr;
    o.momentum = 0.9;
    opt = std::make_unique<nn::SGD>(model->named_parameters(), o);
  }

  void step(const Tensor& x, const Tensor& y) {
    opt->zero_grad();  // set to none
    if (fused) {
      nn::qat_mlp_loss_backward(*model, x, y);
      if (clip_grad_norm > 0) nn::clip_grad_norm(*opt, clip_grad_norm, 2.0, true);
      opt->step();
      return;
    }
    if (stage_8da8w) nn::stage_8da8w_weights(*model);
    nn::stage_weight_fake_quants(*model);  // the int8 weights' observers + fake quants in one launch
    nn::stage_compute_casts(*model);  // mixed precision: the parameters' casts in one launch
    Tensor logits = model->forward(x);
    if (logits.dtype() != DType::f32) logits = logits.to(DType::f32);  // mixed precision: the loss in f32
    Tensor loss = cross_entropy(logits, y);
    loss.backward();
    if (clip_grad_norm > 0) nn::clip_grad_norm(*opt, clip_grad_norm, 2.0, true);
    opt->step();
  }
};

struct QatMlp : QatStep {
  QatMlp(Device device, std::int64_t hidden, Generator& gen, double lr = 0.01, bool fused_step = false) {
    fused = fused_step;
    model->emplace_back<nn::Linear>(784, hidden, gen);
    model->emplace_back<nn::ReLU>();
    model->emplace_back<nn::Linear>(hidden, hidden, gen);
    model->emplace_back<nn::ReLU>();
    model->emplace_back<nn::Linear>(hidden, 10, gen);
    prepare(device, lr);
  }
};

}  // namespace qgrad::bench
