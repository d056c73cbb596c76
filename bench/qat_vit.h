// The ViT of the QAT step benchmark (bench_train_step.cpp) and of the
// example qgrad-qat-vit: make_vit (nn/vit.h; 4x4 patches, width 128, 6
// pre-norm blocks, 4 heads, MLP ratio 2, mean pooling) on [B, 784] inputs,
// prepared with the transformer recipe 8da8w (every Linear: dynamic
// per-token asymmetric int8 activations, per-channel symmetric int8 weights,
// straight-through), AdamW (lr 1e-3, weight decay 0.05) with the gradients'
// global norm clipped to 1 on the device, fused into the AdamW kernel; the
// 8da8w weights fake-quantized by one nn::stage_8da8w_weights before each
// forward, as the example's loop does. compute: bf16 for mixed precision
// (Module::set_compute_dtype before prepare_qat, as the example's
// --precision bf16; the loss in f32).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "qat_mlp.h"

namespace qgrad::bench {

struct QatVit : QatStep {
  QatVit(Device device, Generator& gen, std::optional<DType> compute = std::nullopt) {
    nn::ViTOptions o;  // the example's defaults
    model = nn::make_vit(o, gen);
    if (compute.has_value()) model->set_compute_dtype(*compute);
    nn::prepare_qat(*model, nn::Recipe::w8da8);
    model->to(device);
    model->train();
    nn::AdamWOptions a;
    a.lr = 1e-3;
    a.weight_decay = 0.05;
    opt = std::make_unique<nn::AdamW>(model->named_parameters(), a);
    clip_grad_norm = 1.0;
    // QGRAD_BENCH_STAGE_8DA8W=0: each forward fake-quantizes its own weight (A/B runs).
    const char* stage = std::getenv("QGRAD_BENCH_STAGE_8DA8W");
    stage_8da8w = stage == nullptr || std::string(stage) != "0";
    // QGRAD_BENCH_FOLD=0: the engine adds the residual stream's gradients itself (A/B runs).
    const char* fold = std::getenv("QGRAD_BENCH_FOLD");
    set_gradient_folding(fold == nullptr || std::string(fold) != "0");
    // QGRAD_BENCH_DEFER=0: every parameter gradient's last pass runs where its rule calls it (A/B runs).
    const char* defer = std::getenv("QGRAD_BENCH_DEFER");
    set_gradient_deferral(defer == nullptr || std::string(defer) != "0");
  }
};

}  // namespace qgrad::bench
