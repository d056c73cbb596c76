// A tiny Vision Transformer (Dosovitskiy et al., 2021) for single-channel
// images given as rows of pixels [B, H * W] (the Fashion-MNIST loader's
// layout), built from nn modules so the transformer QAT recipe (8da8w,
// nn/recipes.h) and the SmoothQuant fold reach every Linear:
//
//   embed   PatchEmbedding: the P x P patches, row-major, flattened to
//           [B, T, P*P] (T = (H/P) * (W/P)), a Linear "proj" to [B, T, D],
//           plus a learned position embedding "pos_embed" [1, T, D];
//   block0 ... block{depth-1}
//           EncoderBlock (pre-norm): x = x + attn(ln1(x));
//                                    x = x + fc2(gelu(fc1(ln2(x))));
//   norm    LayerNorm over D;
//   pool    TokenMeanPool: the mean over the T tokens, [B, D];
//   head    Linear(D, classes).
//
// make_vit returns it as a Sequential, so the QAT examples' training loop,
// prepare_qat / convert and checkpoints take it as they take the MLP.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "qgrad/nn/layers.h"
#include "qgrad/nn/smoothquant.h"
#include "qgrad/nn/transformer.h"

namespace qgrad::nn {

struct ViTOptions {
  std::int64_t image_size = 28;  // H = W
  std::int64_t patch = 4;        // P; must divide image_size
  std::int64_t dim = 128;        // D
  std::int64_t depth = 6;        // encoder blocks
  std::int64_t heads = 4;        // must divide dim
  std::int64_t mlp_ratio = 2;    // fc1: D -> mlp_ratio * D
  std::int64_t classes = 10;
  double dropout = 0.0;          // attention dropout (training only)
};

// [B, H*W] -> patches [B, T, P*P] -> proj -> + pos_embed. Children: "proj"
// (Linear P*P -> D); parameter "pos_embed" [1, T, D], N(0, 0.02^2) from gen
// (drawn after proj's weights). Mixed precision: the sum is in the compute
// dtype.
class PatchEmbedding : public Module {
 public:
  PatchEmbedding(std::int64_t image_size, std::int64_t patch, std::int64_t dim, Generator& gen,
                 TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "PatchEmbedding"; }
  std::shared_ptr<Module> clone() const override;
  std::vector<Tensor> compute_cast_parameters() const override { return {pos_}; }
  std::int64_t tokens() const { return (image_ / patch_) * (image_ / patch_); }
  Tensor pos_embed() const { return pos_; }

 private:
  std::int64_t image_, patch_, dim_;
  Tensor pos_;
};

// The pre-norm encoder block. Children, in order: "ln1" (LayerNorm D),
// "attn" (MultiheadAttention D, heads), "ln2" (LayerNorm D), "fc1" (Linear
// D -> mlp_ratio*D), "act" (GELU, erf form), "fc2" (Linear mlp_ratio*D ->
// D). forward runs the children as they are now (prepare_qat may have
// replaced the Linears). x [B, T, D].
class EncoderBlock : public Module {
 public:
  EncoderBlock(std::int64_t dim, std::int64_t heads, std::int64_t mlp_ratio, Generator& gen, double dropout = 0.0,
               TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "EncoderBlock"; }
  std::shared_ptr<Module> clone() const override;
  LayerNorm& ln1() const;
  LayerNorm& ln2() const;
  MultiheadAttention& attn() const;
  // The float fc1 (null once prepare_qat replaced it).
  std::shared_ptr<Linear> fc1() const;
  // SmoothQuant calibration: while set, forward also records the absolute
  // maxima of ln1's and ln2's outputs (the inputs of attn.in_proj and fc1).
  // Not copied by clone. nullptr: off.
  void set_calibrators(SmoothQuantCalibrator* ln1_out, SmoothQuantCalibrator* ln2_out) {
    calib1_ = ln1_out;
    calib2_ = ln2_out;
  }

 private:
  Tensor mlp_out(const Tensor& fc1_out, const Tensor& residual);
  Tensor fused_ln_linear(LayerNorm& ln, Module& linear, const Tensor& x);
  std::int64_t dim_, heads_, mlp_ratio_;
  double dropout_;
  Generator* gen_;
  SmoothQuantCalibrator* calib1_ = nullptr;
  SmoothQuantCalibrator* calib2_ = nullptr;
};

// [B, T, D] -> the mean over T, [B, D].
class TokenMeanPool : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "TokenMeanPool"; }
  std::shared_ptr<Module> clone() const override { return clone_into(std::make_shared<TokenMeanPool>()); }
};

// The model above, on options' device. Parameters are drawn from gen in
// order: embed, blocks, norm, head. Throws qgrad::Error naming "make_vit" and
// the option for a patch that does not divide image_size, heads that do not
// divide dim, or a non-positive size.
std::shared_ptr<Sequential> make_vit(const ViTOptions& options, Generator& gen, TensorOptions tensor_options = {});

// SmoothQuant before QAT on every EncoderBlock child of `model` (a float
// model, e.g. from make_vit): runs `batches` through it in eval mode without
// recording a graph, calibrating the per-channel absolute maxima of each
// block's ln1 and ln2 outputs, then folds
//   s = smoothquant_factors(amax(ln1 out), attn.in_proj.weight, alpha) into ln1 -> in_proj,
//   s = smoothquant_factors(amax(ln2 out), fc1.weight, alpha) into ln2 -> fc1
// (smoothquant_fold). Restores the model's train/eval mode. Returns the
// factors, two per block in that order (f32 [D], host). Throws when the
// model has no EncoderBlock (or one is already prepared), or batches is empty.
std::vector<Tensor> smoothquant_encoder_blocks(Sequential& model, const std::vector<Tensor>& batches,
                                               double alpha = 0.5);

}  // namespace qgrad::nn
