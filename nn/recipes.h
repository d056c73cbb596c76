// QAT recipes beyond int8 (issue #14): one entry point per step for every
// recipe, after torchao's quantizers:
//   prepare_qat(model, recipe)  swaps each Linear for the recipe's QAT linear;
//   ... train ...;
//   convert(model, recipe)      builds the matching inference model.
//
// Recipes:
//   int8   today's flow (nn/qat.h): static per-tensor u8 activations with
//          observers, per-channel s8 weights; convert -> QuantizedLinear.
//   8da4w  torchao's Int8DynActInt4WeightQATQuantizer: activations fake
//          quantized dynamic per token, asymmetric int8 [-128, 127] (scale
//          and zero point from each row's min/max in the step itself, eps
//          FLT_EPSILON), weights fake quantized int4 symmetric per group of
//          G (default 32) along in_features; both straight-through.
//          convert -> Int8DynActInt4WeightLinear (linear_w4a8).
//   fp8    e4m3 weights and activations, each with a dynamic per-tensor
//          scale amax / 448 from the current values (torchao's
//          Float8FakeQuantizer with PerTensor granularity), straight-through.
//          convert -> Float8Linear (fp8_linear, dynamic activation scale).
//   8da8w  the transformer recipe (torchao's Int8DynamicActivationInt8Weight
//          numerics in QAT form, IntxFakeQuantizeConfig(int8, per_token,
//          is_symmetric=False) for activations and (int8, PerAxis(0),
//          is_symmetric=True) for weights): activations as 8da4w (dynamic per
//          token, asymmetric int8); weights int8 symmetric per output
//          channel, scale_n = max(max_k |W[n, k]| / 127.5, FLT_EPSILON), zero
//          point 0, q = clamp(nearbyint(W * (1/scale)), -128, 127); both
//          straight-through. prepare_qat recurses through nested modules
//          (MultiheadAttention's in_proj / out_proj, an MLP block's fc1 /
//          fc2, ...), replacing every Linear at any depth.
//          convert -> Int8DynActInt8WeightLinear (quantized_linear with
//          dynamic per-token asymmetric activations, s8 x s8 -> s32 on int8
//          tensor cores); everything else (norms, attention matmuls,
//          activations) stays floating point, copied by Module::clone.
//
// A Linear whose in_features the group size does not divide cannot take
// int4 groups: prepare_qat rejects it (qgrad::Error naming "group_size"),
// or, with RecipeOptions::skip_indivisible, leaves it in float as torchao's
// quantizer does (its filter with padding_allowed=False); convert then keeps
// it as a float Linear. docs/tutorial.md, "Recipes".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qgrad/nn/qat.h"
#include "qgrad/nn/transformer.h"  // LayerNorm
#include "qgrad/ops/activation.h"  // GeluApproximate

namespace qgrad::nn {

enum class Recipe { int8, w8da4, fp8, w8da8 };

// "int8", "8da4w", "fp8", "8da8w"; anything else: qgrad::Error("parse_recipe", "recipe").
Recipe parse_recipe(const std::string& name);
const char* recipe_name(Recipe recipe);

struct RecipeOptions {
  QConfig int8 = default_qat_qconfig();  // Recipe::int8
  std::int64_t group_size = 32;          // Recipe::w8da4: int4 weight group along in_features
  bool skip_indivisible = false;         // Recipe::w8da4: keep such a Linear in float instead of failing
};

// ---- the fake quantizers of the recipes (differentiable, straight-through) ----
// 8da4w activations: per token (rows of the last axis) asymmetric int8,
//   (scale, zp) = choose_qparams_affine(x, per_token(), asymmetric, -128, 127, FLT_EPSILON),
//   y = (clamp(nearbyint(x * (1/scale)) + zp, -128, 127) - zp) * scale; dx = dy * 1[in range].
Tensor fake_quantize_8da4w_activation(const Tensor& x);
// fake_quantize_8da4w_activation(gelu(x, approximate)) as one op
// (gelu_fake_quantize_dynamic, ops/lowbit.h): the same values.
Tensor gelu_fake_quantize_8da4w_activation(const Tensor& x, GeluApproximate approximate);
// 8da4w weights: fake_quantize_int4(w, group_size, symmetric, s4) (scale = absmax / 7.5 per group, zp 0).
Tensor fake_quantize_8da4w_weight(const Tensor& w, std::int64_t group_size);
// fp8: fake_quantize_fp8(x, per_tensor(), f8e4m3) (scale = max(amax, 1e-12) / 448); dx = dy.
Tensor fake_quantize_fp8_tensor(const Tensor& x);
// 8da8w weights [N, K]: (scale, zp) = choose_qparams_affine(w, per_channel(0), symmetric, -128, 127,
//   FLT_EPSILON) (scale [N] = max(amax_n / 127.5, FLT_EPSILON), zp 0), then
//   fake_quantize(w, scale, zp, per_channel(0), -128, 127); dw = dy * 1[in range].
//   Throws qgrad::Error("fake_quantize_8da8w_weight", "w") unless w is floating of rank 2.
Tensor fake_quantize_8da8w_weight(const Tensor& w);

// linear(fq_act(x), fq_weight(weight), bias). Shares weight and bias with
// the Linear it wraps. Names: "weight", "bias". No buffers: the qparams
// are recomputed each step.
class Int8DynActInt4WeightQATLinear : public Module {
 public:
  Int8DynActInt4WeightQATLinear(const Linear& linear, std::int64_t group_size = 32);
  Tensor forward(const Tensor& x) override;
  Tensor forward_add(const Tensor& x, const Tensor& residual) override;  // linear_add
  // forward(gelu(x, approximate)), the same values, the gelu inside the
  // activation's fake quant (one op: a GELU -> linear pair, the ViT's MLP);
  // with a residual, forward_add(gelu(x, approximate), residual).
  Tensor forward_gelu(const Tensor& x, GeluApproximate approximate, const Tensor& residual = Tensor());
  // forward(packed_attention(qkv, heads, causal)) (plus residual where
  // given), the same values, the attention and the activation's fake quant
  // one op (packed_attention_fake_quantize_dynamic): a MultiheadAttention's
  // out_proj.
  Tensor forward_packed_attention(const Tensor& qkv, std::int64_t heads, bool causal,
                                  const Tensor& residual = Tensor());
  // forward(ln.forward(x)), the same values, the layer norm and the
  // activation's fake quant one op (layer_norm_fake_quantize_dynamic) where
  // neither module casts to a compute dtype.
  Tensor forward_layer_norm(const Tensor& x, LayerNorm& ln);
  std::string type_name() const override { return "Int8DynActInt4WeightQATLinear"; }
  std::shared_ptr<Module> clone() const override;
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  std::int64_t group_size() const { return group_size_; }
  // Off: a plain linear (the float model of the same weights).
  void enable_fake_quant(bool on) { fake_quant_ = on; }
  bool fake_quant_enabled() const { return fake_quant_; }

 private:
  Tensor project(const Tensor& x, const Tensor& residual);  // forward, plus residual where defined
  Tensor weight_, bias_;
  std::int64_t group_size_;
  bool fake_quant_ = true;
};

// linear(fake_quantize_fp8_tensor(x), fake_quantize_fp8_tensor(weight), bias).
// Names: "weight", "bias".
class Float8QATLinear : public Module {
 public:
  explicit Float8QATLinear(const Linear& linear);
  Tensor forward(const Tensor& x) override;
  Tensor forward_add(const Tensor& x, const Tensor& residual) override;  // linear_add
  std::string type_name() const override { return "Float8QATLinear"; }
  std::shared_ptr<Module> clone() const override;
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  void enable_fake_quant(bool on) { fake_quant_ = on; }
  bool fake_quant_enabled() const { return fake_quant_; }

 private:
  Tensor project(const Tensor& x, const Tensor& residual);  // forward, plus residual where defined
  Tensor weight_, bias_;
  bool fake_quant_ = true;
};

// linear(fake_quantize_8da4w_activation(x), fake_quantize_8da8w_weight(weight), bias).
// Names: "weight", "bias" (shared with the Linear it wraps). No buffers.
// Mixed precision (Module::set_compute_dtype, carried over from the Linear):
// the weight is fake-quantized in its own dtype, then cast; the input is
// cast first, then fake-quantized in the compute dtype.
class Int8DynActInt8WeightQATLinear : public Module {
 public:
  explicit Int8DynActInt8WeightQATLinear(const Linear& linear);
  Tensor forward(const Tensor& x) override;
  Tensor forward_add(const Tensor& x, const Tensor& residual) override;  // linear_add
  // forward(gelu(x, approximate)), the same values, the gelu inside the
  // activation's fake quant where x is already in the compute dtype; with a
  // residual, forward_add(gelu(x, approximate), residual).
  Tensor forward_gelu(const Tensor& x, GeluApproximate approximate, const Tensor& residual = Tensor());
  // forward(packed_attention(qkv, heads, causal)) (plus residual where
  // given), as Int8DynActInt4WeightQATLinear's, where qkv is already in the
  // compute dtype.
  Tensor forward_packed_attention(const Tensor& qkv, std::int64_t heads, bool causal,
                                  const Tensor& residual = Tensor());
  // forward(ln.forward(x)), as Int8DynActInt4WeightQATLinear's.
  Tensor forward_layer_norm(const Tensor& x, LayerNorm& ln);
  std::string type_name() const override { return "Int8DynActInt8WeightQATLinear"; }
  std::shared_ptr<Module> clone() const override;
  // The bias; the weight is cast after its fake quant (stage_8da8w_weights
  // stages that cast too); without fake quant, the weight as well.
  std::vector<Tensor> compute_cast_parameters() const override {
    return fake_quant_ ? std::vector<Tensor>{bias_} : std::vector<Tensor>{weight_, bias_};
  }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  std::int64_t in_features() const { return weight_.size(1); }
  std::int64_t out_features() const { return weight_.size(0); }
  void enable_fake_quant(bool on) { fake_quant_ = on; }
  bool fake_quant_enabled() const { return fake_quant_; }
  // Hands the next forward (forward, forward_gelu or forward_layer_norm) its
  // fake-quantized weight, fake_quantize_8da8w_weight(weight()) computed
  // elsewhere (stage_8da8w_weights batches them): that forward uses it and
  // drops it. Throws qgrad::Error naming "w" unless it has weight()'s shape,
  // dtype and device.
  void stage_fake_quantized_weight(const Tensor& w);
  void drop_staged_weight() { staged_weight_ = Tensor(); }

 private:
  Tensor project(const Tensor& x, const Tensor& residual);  // forward, plus residual where defined
  // The staged weight (dropped here), or fake_quantize_8da8w_weight(weight_).
  Tensor take_fake_quantized_weight();
  Tensor weight_, bias_, staged_weight_;
  bool fake_quant_ = true;
};

// Fake-quantizes the weight of every Int8DynActInt8WeightQATLinear under
// root whose fake quant is on with one fake_quantize_dynamic_batch (one CUDA
// launch for all of them, where each forward launched its own) and stages
// each result for that linear's next forward: the same values and the same
// gradients as the forwards computing their own (a staged weight left from an
// earlier call is dropped first). Call it right before the forward, after the
// optimizer's step: it fake-quantizes the weights as they are when called.
// Linears with a compute dtype (mixed precision) get the fake-quantized
// weight cast to it, all of them as one to_batch (the cast their forward
// would run; stage_compute_casts stages the rest of the model's casts).
void stage_8da8w_weights(Module& root);

// Fake quant on or off in every recipe QAT linear and every FakeQuantize /
// LearnableFakeQuantize under root (nn::enable_fake_quant for the latter).
void enable_recipe_fake_quant(Module& root, bool on);

// In place. int8: prepare_qat(model, options.int8) (top-level Linear
// children). 8da4w, fp8, 8da8w: every Linear at any depth (children of
// children, through Module::replace_child: MultiheadAttention's in_proj /
// out_proj, an MLP block's fc1 / fc2, ...) becomes the recipe's QAT linear
// under the same name (parameter names unchanged); the whole tree is
// validated first. Throws if any module of the tree is already a QAT or
// quantized layer, there is no Linear to prepare, or (8da4w, without
// skip_indivisible) a Linear's in_features is not a multiple of group_size.
void prepare_qat(Sequential& model, Recipe recipe, const RecipeOptions& options = {});

// The paths ("blocks.0.attn.in_proj", "0", ...) of the Linears prepare_qat
// left in float (8da4w with skip_indivisible), at any depth; empty for a
// fully prepared model, or one not prepared.
std::vector<std::string> float_layers(const Sequential& model);

// ---- inference modules (convert) ----

// The 8da8w (W8A8) inference linear: y = quantized_linear(x, weight,
// weight_scale, bias, ActivationQuant::dynamic(asymmetric) with the weight's
// row sums precomputed, out = x's dtype) — per-token dynamic asymmetric int8
// activations over [-128, 127], s8 per-channel weights, int32 sums (int8
// tensor cores through cuBLASLt on CUDA); with a compute dtype (mixed
// precision, carried over by convert) x is cast to it first, as the QAT
// linear cast it. Buffers: "weight" (s8 [N, K]),
// "weight_scale" (f32 [N]), "weight_row_sums" (s32 [N], sum_k weight[n, k]),
// "bias" (f32 [N], when present).
class Int8DynActInt8WeightLinear : public Module {
 public:
  // weight_row_sums undefined: computed here (once, on the host).
  Int8DynActInt8WeightLinear(Tensor weight_q, Tensor weight_scale, Tensor bias, Tensor weight_row_sums = Tensor());
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Int8DynActInt8WeightLinear"; }
  std::shared_ptr<Module> clone() const override;
  Tensor weight() const { return weight_; }
  Tensor weight_scale() const { return weight_scale_; }
  Tensor weight_row_sums() const { return row_sums_; }
  Tensor bias() const { return bias_; }

 private:
  Tensor weight_, weight_scale_, row_sums_, bias_;
};

// The 8da4w inference linear: y = linear_w4a8(x, weight, weight_scale,
// group_size, bias, asymmetric, f32) — per-token dynamic asymmetric int8
// activations, symmetric int4 weights per group (ops/lowbit_linear.h).
// Buffers: "weight" (s4 [N, K], packed), "weight_scale" (f32 [N, K/G]),
// "bias" (f32 [N], when present).
class Int8DynActInt4WeightLinear : public Module {
 public:
  Int8DynActInt4WeightLinear(Tensor weight_q, Tensor weight_scale, Tensor bias, std::int64_t group_size);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Int8DynActInt4WeightLinear"; }
  std::shared_ptr<Module> clone() const override;
  Tensor weight() const { return weight_; }
  Tensor weight_scale() const { return weight_scale_; }
  Tensor bias() const { return bias_; }
  std::int64_t group_size() const { return group_size_; }

 private:
  Tensor weight_, weight_scale_, bias_;
  std::int64_t group_size_;
};

// The fp8 inference linear: y = fp8_linear(x, weight, weight_scale, bias,
// f32) — e4m3 weights with one scale, the activation scaled dynamically per
// tensor (ops/fp8_linear.h). Buffers: "weight" (f8e4m3 [N, K]),
// "weight_scale" (f32 [1]), "bias" (f32 [N], when present).
class Float8Linear : public Module {
 public:
  Float8Linear(Tensor weight_q, Tensor weight_scale, Tensor bias);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Float8Linear"; }
  std::shared_ptr<Module> clone() const override;
  Tensor weight() const { return weight_; }
  Tensor weight_scale() const { return weight_scale_; }
  Tensor bias() const { return bias_; }

 private:
  Tensor weight_, weight_scale_, bias_;
};

// A new inference Sequential from a model prepared with `recipe` (and
// trained). int8: convert(model) (nn/qat.h). 8da4w, fp8, 8da8w: a deep copy
// of the whole tree (Module::clone: every module of it must implement clone)
// in which each of the recipe's QAT linears, at any depth, becomes its
// inference layer with the weight quantized by the qparams its fake
// quantizer uses: 8da4w Int8DynActInt4WeightLinear (quantize_int4 with
// choose_qparams_int4, symmetric s4), fp8 Float8Linear (quantize_fp8 and
// fp8_scale), 8da8w Int8DynActInt8WeightLinear (quantize(w, scale, 0,
// per_channel(0), s8), so w_q * scale equals the fake-quantized weight
// exactly). A Linear left in float, norms, attention and activations are
// copied; further training of `model` does not change the result. An
// observer or QAT layer of another recipe anywhere in the tree is an error
// naming its path.
std::shared_ptr<Sequential> convert(const Sequential& model, Recipe recipe);

}  // namespace qgrad::nn
