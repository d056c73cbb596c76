// The forward, cross-entropy loss and backward of a small QAT MLP as one
// persistent CUDA kernel (nn/fused_mlp.h decides when it runs; elsewhere
// the composed ops run). Plain pointers: the caller validated every tensor.
//
// The model (prepare_qat's form): an input fake quant, then layers
// z_l = act_{l-1} · fq_w(W_l)ᵀ + b_l, act_l = fq_l(z_l) (relu(fq_l(z_l)) for
// a layer followed by a ReLU), logits = act_L, loss = mean cross_entropy.
// Every fake quant observes what it quantizes first (per-tensor activation
// observers, per-channel weight observers on axis 0), with the formulas of
// the unfused ops (kernels/formulas/observer.h, quantize.h, softmax.h).
#pragma once

#include <cstdint>

namespace qgrad::kernels {

inline constexpr int kQatMlpMaxLayers = 6;

// An observer + fake quant: running range, the qparams it writes, its options.
struct QatMlpQuant {
  float* run_min = nullptr;  // f32 [C]
  float* run_max = nullptr;
  float* scale = nullptr;             // f32 [C], written
  std::int32_t* zero_point = nullptr;  // s32 [C], written
  float averaging_constant = 0.01f;
  bool moving = true;  // moving average (else running min/max)
  bool symmetric = false;
  std::int32_t symmetric_zero_point = 0;
  int qmin = 0, qmax = 255;
};

struct QatMlpLayer {
  int in_features = 0, out_features = 0;
  const float* weight = nullptr;  // [out, in]
  const float* bias = nullptr;    // [out] or null
  float* weight_grad = nullptr;   // [out, in], written (or accumulated into)
  float* bias_grad = nullptr;     // [out] (null without a bias)
  bool accumulate_weight_grad = false, accumulate_bias_grad = false;
  bool relu = false;     // followed by a ReLU (inside its output fake quant)
  QatMlpQuant weight_quant;  // per channel, C = out_features
  QatMlpQuant output_quant;  // per tensor
  // Blocks of a cluster that split K of a tile of the forward product and of
  // the two backward ones (the weight gradient, the input gradient): 1, 2,
  // 4 or 8; set by qat_mlp_plan.
  int split_forward = 1, split_weight_grad = 1, split_input_grad = 1;
};

// Where each buffer lies in the workspace (offsets in floats).
struct QatMlpWorkspace {
  std::int64_t wq[kQatMlpMaxLayers] = {}, z[kQatMlpMaxLayers] = {}, dz[kQatMlpMaxLayers] = {};
  std::int64_t loss_parts = 0, total = 0;
};

struct QatMlpArgs {
  int device = 0;
  int batch = 0;
  const float* x = nullptr;       // [batch, layers[0].in_features]
  const void* labels = nullptr;   // [batch], s64 or s32
  bool labels_s64 = true;
  QatMlpQuant input_quant;        // per tensor
  QatMlpLayer layers[kQatMlpMaxLayers];
  int num_layers = 0;
  float* loss = nullptr;          // one f32
  float* workspace = nullptr;     // qat_mlp_workspace_floats(args) floats, any contents
  // Set by qat_mlp_plan:
  int grid = 0;                        // blocks, in whole clusters of the kernel's
  std::uint32_t* counters = nullptr;   // kBlockCounters zeroed words (block_counters), left zeroed
  QatMlpWorkspace offsets;
  std::uint64_t* phase_clock = nullptr;  // profiling (qat_mlp_record_phases)
};

// Whether the kernel runs on CUDA device `device` (false in a build without
// CUDA, or without cooperative launch there).
bool qat_mlp_available(int device);
// Sets the grid, the split-K parts and the workspace offsets for `a`'s
// shapes on its device (a.offsets.total: the workspace size in floats).
// False, nothing set, where the kernel cannot run: a build without CUDA, a
// device without cooperative launch.
bool qat_mlp_plan(QatMlpArgs& a);
// One launch on the device's stream (a planned by qat_mlp_plan): the
// forward, the loss, every parameter gradient, the observers' running
// ranges and the qparams.
void qat_mlp_forward_backward(const QatMlpArgs& a);

}  // namespace qgrad::kernels
