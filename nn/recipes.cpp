#include "qgrad/nn/recipes.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "qgrad/autograd/node.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/fp8_linear.h"
#include "qgrad/ops/activation.h"
#include "qgrad/ops/attention.h"
#include "qgrad/ops/linalg.h"
#include "qgrad/ops/lowbit.h"
#include "qgrad/ops/transformer.h"
#include "qgrad/ops/lowbit_linear.h"
#include "qgrad/ops/quantize.h"
#include "qgrad/ops/quantized_linear.h"

namespace qgrad::nn {

namespace {

bool is_recipe_qat(const Module& m) {
  return dynamic_cast<const Int8DynActInt4WeightQATLinear*>(&m) || dynamic_cast<const Float8QATLinear*>(&m) ||
         dynamic_cast<const Int8DynActInt8WeightQATLinear*>(&m);
}

// Calls f(path, parent, index of the child in parent) for every child at any
// depth, parents before their children ("" + name, joined with dots).
template <class F>
void walk_children(const Module& m, const std::string& prefix, F&& f) {
  const auto& children = m.named_children();
  for (std::size_t i = 0; i < children.size(); ++i) {
    const std::string path = prefix + children[i].first;
    f(path, m, i);
    walk_children(*children[i].second, path + ".", f);
  }
}

// What no model entering the 8da8w prepare / convert may hold besides its own modules.
bool is_quant_module(const Module& m) {
  const std::string t = m.type_name();
  return is_recipe_qat(m) || t == "QATLinear" || t == "QATConv2d" || t == "ConvBn2d" || t == "ConvBnReLU2d" ||
         t == "FakeQuantize" || t == "LearnableFakeQuantize" || t == "Observer" || t == "QuantizedLinear" ||
         t == "QuantizedConv2d" || t == "Int8DynActInt4WeightLinear" || t == "Float8Linear" ||
         t == "Int8DynActInt8WeightLinear";
}

}  // namespace

Recipe parse_recipe(const std::string& name) {
  if (name == "int8") return Recipe::int8;
  if (name == "8da4w") return Recipe::w8da4;
  if (name == "fp8") return Recipe::fp8;
  if (name == "8da8w") return Recipe::w8da8;
  throw Error("parse_recipe", "recipe", "unknown recipe '" + name + "' (expected int8, 8da4w, fp8 or 8da8w)");
}

const char* recipe_name(Recipe recipe) {
  switch (recipe) {
    case Recipe::int8: return "int8";
    case Recipe::w8da4: return "8da4w";
    case Recipe::fp8: return "fp8";
    case Recipe::w8da8: return "8da8w";
  }
  throw Error("recipe_name", "recipe", "unknown recipe " + std::to_string(static_cast<int>(recipe)));
}

// ---- fake quantizers ----

Tensor fake_quantize_8da4w_activation(const Tensor& x) {
  // torchao's _get_8da4w_activation_config: int8 per token, asymmetric, dynamic, eps = finfo(f32).eps.
  // choose_qparams_affine + fake_quantize in one op (one kernel per call on CUDA).
  return fake_quantize_dynamic(x, QuantScope::per_token(), QuantMode::asymmetric, -128, 127,
                               std::numeric_limits<float>::epsilon());
}

Tensor gelu_fake_quantize_8da4w_activation(const Tensor& x, GeluApproximate approximate) {
  return gelu_fake_quantize_dynamic(x, approximate, QuantScope::per_token(), QuantMode::asymmetric, -128, 127,
                                    std::numeric_limits<float>::epsilon());
}

namespace {
// layer_norm then the 8da activation fake quant in one op (ln's forward has no cast then).
Tensor layer_norm_8da4w_activation(const Tensor& x, const LayerNorm& ln) {
  return layer_norm_fake_quantize_dynamic(x, ln.normalized_shape(), ln.weight(), ln.bias(), ln.eps(),
                                          QuantMode::asymmetric, -128, 127, std::numeric_limits<float>::epsilon());
}

// The same under mixed precision: x already in the compute dtype, the norm's
// weight and bias cast to it (ln.forward's operands), one op.
Tensor layer_norm_8da4w_activation_compute(const Tensor& x, const LayerNorm& ln) {
  const auto [w, b] = ln.compute_affine();
  return layer_norm_fake_quantize_dynamic(x, ln.normalized_shape(), w, b, ln.eps(), QuantMode::asymmetric, -128, 127,
                                          std::numeric_limits<float>::epsilon());
}

// The 8da activation fake quant of the attention's output, one op with it.
Tensor packed_attention_8da4w_activation(const Tensor& qkv, std::int64_t heads, bool causal) {
  return packed_attention_fake_quantize_dynamic(qkv, heads, causal, QuantMode::asymmetric, -128, 127,
                                                std::numeric_limits<float>::epsilon());
}

// linear(x, w, bias), plus residual where one is given: linear_add (the add
// inside the GEMM, before the bias: the values of an add after the linear,
// to rounding).
Tensor linear_plus(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual) {
  return residual.defined() ? linear_add(x, w, bias, residual) : ::qgrad::linear(x, w, bias);
}

void check_residual(const char* module, const Tensor& residual) {
  QGRAD_CHECK(residual.defined(), module, "residual", "undefined tensor");
}
}  // namespace

Tensor fake_quantize_8da4w_weight(const Tensor& w, std::int64_t group_size) {
  // torchao's _get_8da4w_weight_config: int4 per group, symmetric, dynamic, eps = finfo(dtype).smallest_normal.
  return fake_quantize_int4(w, group_size, QuantMode::symmetric, DType::s4);
}

Tensor fake_quantize_fp8_tensor(const Tensor& x) {
  return fake_quantize_fp8(x, QuantScope::per_tensor(), DType::f8e4m3);
}

namespace {

// The 8da8w weight's qparams, shared by the fake quant and convert (so the
// converted W_q * scale is the fake-quantized weight bit for bit): torchao's
// IntxFakeQuantizeConfig(torch.int8, PerAxis(0), is_symmetric=True), eps =
// finfo(f32).eps.
AffineQparams weight_8da8w_qparams(const Tensor& w) {
  return choose_qparams_affine(w.detach(), QuantScope::per_channel(0), QuantMode::symmetric, -128, 127,
                               std::numeric_limits<float>::epsilon());
}

}  // namespace

Tensor fake_quantize_8da8w_weight(const Tensor& w) {
  constexpr const char* op = "fake_quantize_8da8w_weight";
  check::floating(w, op, "w");
  check::rank_is(w, 2, op, "w");
  // weight_8da8w_qparams + fake_quantize in one op (one kernel per call on CUDA).
  return fake_quantize_dynamic(w, QuantScope::per_channel(0), QuantMode::symmetric, -128, 127,
                               std::numeric_limits<float>::epsilon());
}

// ---- QAT modules ----

Int8DynActInt4WeightQATLinear::Int8DynActInt4WeightQATLinear(const Linear& linear, std::int64_t group_size)
    : group_size_(group_size) {
  const char* op = "Int8DynActInt4WeightQATLinear";
  QGRAD_CHECK(group_size > 0, op, "group_size", "must be > 0, got ", group_size);
  QGRAD_CHECK(linear.in_features() % group_size == 0, op, "group_size", "in_features ", linear.in_features(),
              " is not a multiple of the group size ", group_size);
  weight_ = register_parameter("weight", linear.weight());
  if (linear.bias().defined()) bias_ = register_parameter("bias", linear.bias());
}

std::shared_ptr<Module> Int8DynActInt4WeightQATLinear::clone() const {
  Generator unused(0);  // the values are overwritten by the copy
  const Linear shape(weight_.size(1), weight_.size(0), unused, bias_.defined(),
                     TensorOptions{}.with_dtype(weight_.dtype()));
  auto copy = std::make_shared<Int8DynActInt4WeightQATLinear>(shape, group_size_);
  copy->fake_quant_ = fake_quant_;
  return clone_into(copy);
}

Tensor Int8DynActInt4WeightQATLinear::forward(const Tensor& x) { return project(x, Tensor()); }

Tensor Int8DynActInt4WeightQATLinear::forward_add(const Tensor& x, const Tensor& residual) {
  check_residual("Int8DynActInt4WeightQATLinear::forward_add", residual);
  return project(x, residual);
}

Tensor Int8DynActInt4WeightQATLinear::project(const Tensor& x, const Tensor& residual) {
  if (!fake_quant_) return linear_plus(x, weight_, bias_, residual);
  return linear_plus(fake_quantize_8da4w_activation(x), fake_quantize_8da4w_weight(weight_, group_size_), bias_,
                     residual);
}

Tensor Int8DynActInt4WeightQATLinear::forward_layer_norm(const Tensor& x, LayerNorm& ln) {
  if (!fake_quant_ || ln.compute_dtype()) return forward(ln.forward(x));
  return ::qgrad::linear(layer_norm_8da4w_activation(x, ln), fake_quantize_8da4w_weight(weight_, group_size_), bias_);
}

Tensor Int8DynActInt4WeightQATLinear::forward_gelu(const Tensor& x, GeluApproximate approximate,
                                                   const Tensor& residual) {
  if (!fake_quant_) return project(gelu(x, approximate), residual);
  return linear_plus(gelu_fake_quantize_8da4w_activation(x, approximate),
                     fake_quantize_8da4w_weight(weight_, group_size_), bias_, residual);
}

Tensor Int8DynActInt4WeightQATLinear::forward_packed_attention(const Tensor& qkv, std::int64_t heads, bool causal,
                                                               const Tensor& residual) {
  if (!fake_quant_) return project(packed_attention(qkv, heads, causal), residual);
  return linear_plus(packed_attention_8da4w_activation(qkv, heads, causal),
                     fake_quantize_8da4w_weight(weight_, group_size_), bias_, residual);
}

Float8QATLinear::Float8QATLinear(const Linear& linear) {
  weight_ = register_parameter("weight", linear.weight());
  if (linear.bias().defined()) bias_ = register_parameter("bias", linear.bias());
}

std::shared_ptr<Module> Float8QATLinear::clone() const {
  Generator unused(0);  // the values are overwritten by the copy
  const Linear shape(weight_.size(1), weight_.size(0), unused, bias_.defined(),
                     TensorOptions{}.with_dtype(weight_.dtype()));
  auto copy = std::make_shared<Float8QATLinear>(shape);
  copy->fake_quant_ = fake_quant_;
  return clone_into(copy);
}

Tensor Float8QATLinear::forward(const Tensor& x) { return project(x, Tensor()); }

Tensor Float8QATLinear::forward_add(const Tensor& x, const Tensor& residual) {
  check_residual("Float8QATLinear::forward_add", residual);
  return project(x, residual);
}

Tensor Float8QATLinear::project(const Tensor& x, const Tensor& residual) {
  if (!fake_quant_) return linear_plus(x, weight_, bias_, residual);
  return linear_plus(fake_quantize_fp8_tensor(x), fake_quantize_fp8_tensor(weight_), bias_, residual);
}

Int8DynActInt8WeightQATLinear::Int8DynActInt8WeightQATLinear(const Linear& linear) {
  weight_ = register_parameter("weight", linear.weight());
  if (linear.bias().defined()) bias_ = register_parameter("bias", linear.bias());
  set_compute_dtype(linear.compute_dtype());
}

void Int8DynActInt8WeightQATLinear::stage_fake_quantized_weight(const Tensor& w) {
  const char* op = "Int8DynActInt8WeightQATLinear::stage_fake_quantized_weight";
  check::defined(w, op, "w");
  const bool dtype_ok = w.dtype() == weight_.dtype() || (compute_dtype() && w.dtype() == *compute_dtype());
  QGRAD_CHECK(w.shape() == weight_.shape() && dtype_ok && w.device() == weight_.device(), op, "w",
              "expected the weight's shape ", shape_str(weight_.shape()), ", dtype (or compute dtype) and device, got ",
              shape_str(w.shape()), " ", dtype_name(w.dtype()), " on ", w.device().str());
  staged_weight_ = w;
}

Tensor Int8DynActInt8WeightQATLinear::take_fake_quantized_weight() {
  if (!staged_weight_.defined()) return fake_quantize_8da8w_weight(weight_);
  Tensor w = staged_weight_;
  staged_weight_ = Tensor();
  return w;
}

Tensor Int8DynActInt8WeightQATLinear::forward(const Tensor& x) { return project(x, Tensor()); }

Tensor Int8DynActInt8WeightQATLinear::forward_add(const Tensor& x, const Tensor& residual) {
  check_residual("Int8DynActInt8WeightQATLinear::forward_add", residual);
  return project(x, residual);
}

Tensor Int8DynActInt8WeightQATLinear::project(const Tensor& x, const Tensor& residual) {
  if (!fake_quant_) return linear_plus(to_compute(x), to_compute(weight_), to_compute(bias_), residual);
  return linear_plus(fake_quantize_8da4w_activation(to_compute(x)), to_compute(take_fake_quantized_weight()),
                     to_compute(bias_), residual);
}

Tensor Int8DynActInt8WeightQATLinear::forward_layer_norm(const Tensor& x, LayerNorm& ln) {
  if (!fake_quant_) return forward(ln.forward(x));
  if (ln.compute_dtype() || compute_dtype()) {
    // Mixed precision: fused where ln.forward would not cast x (x already in
    // the one compute dtype of both), as forward(ln.forward(x)) computes it.
    if (ln.compute_dtype() != compute_dtype() || x.dtype() != *compute_dtype()) return forward(ln.forward(x));
    return ::qgrad::linear(layer_norm_8da4w_activation_compute(x, ln), to_compute(take_fake_quantized_weight()),
                           to_compute(bias_));
  }
  return ::qgrad::linear(layer_norm_8da4w_activation(x, ln), take_fake_quantized_weight(), bias_);
}

Tensor Int8DynActInt8WeightQATLinear::forward_gelu(const Tensor& x, GeluApproximate approximate,
                                                   const Tensor& residual) {
  // forward casts its input first: gelu then the cast is gelu in x's dtype, fused only where the cast is none.
  const bool cast = compute_dtype() && x.defined() && is_floating(x.dtype()) && x.dtype() != *compute_dtype();
  if (!fake_quant_ || cast) return project(gelu(x, approximate), residual);
  return linear_plus(gelu_fake_quantize_8da4w_activation(x, approximate), to_compute(take_fake_quantized_weight()),
                     to_compute(bias_), residual);
}

Tensor Int8DynActInt8WeightQATLinear::forward_packed_attention(const Tensor& qkv, std::int64_t heads, bool causal,
                                                               const Tensor& residual) {
  const bool cast = compute_dtype() && qkv.defined() && is_floating(qkv.dtype()) && qkv.dtype() != *compute_dtype();
  if (!fake_quant_ || cast) return project(packed_attention(qkv, heads, causal), residual);
  return linear_plus(packed_attention_8da4w_activation(qkv, heads, causal), to_compute(take_fake_quantized_weight()),
                     to_compute(bias_), residual);
}

std::shared_ptr<Module> Int8DynActInt8WeightQATLinear::clone() const {
  Generator unused(0);  // the values are overwritten by the copy
  const Linear shape(in_features(), out_features(), unused, bias_.defined(),
                     TensorOptions{}.with_dtype(weight_.dtype()));
  auto copy = std::make_shared<Int8DynActInt8WeightQATLinear>(shape);
  copy->fake_quant_ = fake_quant_;
  return clone_into(copy);
}

void stage_8da8w_weights(Module& root) {
  std::vector<Int8DynActInt8WeightQATLinear*> linears;
  std::vector<Tensor> weights;
  for_each_module(root, [&](Module& m) {
    auto* q = dynamic_cast<Int8DynActInt8WeightQATLinear*>(&m);
    if (q == nullptr) return;
    q->drop_staged_weight();  // one left from an earlier staging its forward never took
    if (!q->fake_quant_enabled()) return;
    linears.push_back(q);
    weights.push_back(q->weight());
  });
  if (linears.empty()) return;
  // Mixed precision: the forward's casts of the fake-quantized weights. A
  // model has one compute dtype: then the batch casts its outputs itself (each
  // weight's gradient cast back in its mask's pass); a linear with another
  // dtype casts its own, the others go through one to_batch.
  std::optional<DType> dt;
  for (const auto* q : linears)
    if (!dt) dt = q->compute_dtype();
  const bool one_dtype =
      dt && std::all_of(linears.begin(), linears.end(), [&](const auto* q) { return q->compute_dtype() == dt; });
  // fake_quantize_8da8w_weight's arguments.
  std::vector<Tensor> staged =
      fake_quantize_dynamic_batch(weights, QuantScope::per_channel(0), QuantMode::symmetric, -128, 127,
                                  std::numeric_limits<float>::epsilon(), one_dtype ? dt : std::nullopt);
  std::vector<std::size_t> cast;
  std::vector<Tensor> to_cast;
  for (std::size_t i = 0; dt && i < linears.size(); ++i)
    if (linears[i]->compute_dtype() == dt && staged[i].dtype() != *dt) cast.push_back(i), to_cast.push_back(staged[i]);
  if (!to_cast.empty()) {
    const std::vector<Tensor> casts = to_batch(to_cast, *dt);
    for (std::size_t k = 0; k < cast.size(); ++k) staged[cast[k]] = casts[k];
  }
  for (std::size_t i = 0; i < linears.size(); ++i) linears[i]->stage_fake_quantized_weight(staged[i]);
}

void enable_recipe_fake_quant(Module& root, bool on) {
  enable_fake_quant(root, on);
  for_each_module(root, [&](Module& m) {
    if (auto* a = dynamic_cast<Int8DynActInt4WeightQATLinear*>(&m)) a->enable_fake_quant(on);
    if (auto* b = dynamic_cast<Float8QATLinear*>(&m)) b->enable_fake_quant(on);
    if (auto* c = dynamic_cast<Int8DynActInt8WeightQATLinear*>(&m)) c->enable_fake_quant(on);
  });
}

// ---- prepare ----

namespace {

// 8da4w, fp8, 8da8w: every Linear at any depth -> the recipe's QAT linear
// (MultiheadAttention's in_proj / out_proj, an MLP block's fc1 / fc2, ...).
// 8da4w: a Linear whose in_features the group size does not divide stays
// float with options.skip_indivisible, else an error naming "group_size".
// The whole tree is validated before anything changes.
void prepare_tree(Module& model, Recipe recipe, const RecipeOptions& options) {
  const char* op = "prepare_qat";
  const bool int4 = recipe == Recipe::w8da4;
  if (int4) QGRAD_CHECK(options.group_size > 0, op, "group_size", "must be > 0, got ", options.group_size);
  QGRAD_CHECK(!is_quant_module(model), op, "model", "model is already prepared (a ", model.type_name(), ")");
  const auto keeps_float = [&](const Linear& lin) { return int4 && lin.in_features() % options.group_size != 0; };
  std::size_t eligible = 0;
  walk_children(model, "", [&](const std::string& path, const Module& parent, std::size_t i) {
    const Module& c = *parent.named_children()[i].second;
    QGRAD_CHECK(!is_quant_module(c), op, "model", "model is already prepared: '", path, "' is a ", c.type_name());
    const auto* lin = dynamic_cast<const Linear*>(&c);
    if (!lin) return;
    if (keeps_float(*lin)) {
      QGRAD_CHECK(options.skip_indivisible, op, "group_size", "layer '", path, "': in_features ", lin->in_features(),
                  " is not a multiple of the group size ", options.group_size,
                  " (RecipeOptions::skip_indivisible keeps such layers in float)");
      return;
    }
    ++eligible;
  });
  QGRAD_CHECK(eligible > 0, op, "model", "no Linear layer to prepare for recipe ", recipe_name(recipe));
  // Parents first: a replaced child is a leaf (its own children are not visited again).
  for_each_module(model, [&](Module& m) {
    const auto& children = m.named_children();
    for (std::size_t i = 0; i < children.size(); ++i) {
      const auto* lin = dynamic_cast<const Linear*>(children[i].second.get());
      if (!lin || keeps_float(*lin)) continue;
      std::shared_ptr<Module> q;
      if (recipe == Recipe::w8da8) q = std::make_shared<Int8DynActInt8WeightQATLinear>(*lin);
      else if (recipe == Recipe::fp8) q = std::make_shared<Float8QATLinear>(*lin);
      else q = std::make_shared<Int8DynActInt4WeightQATLinear>(*lin, options.group_size);
      m.replace_child(i, q);
    }
  });
}

}  // namespace

void prepare_qat(Sequential& model, Recipe recipe, const RecipeOptions& options) {
  if (recipe == Recipe::int8) return prepare_qat(model, options.int8);
  QGRAD_CHECK(recipe == Recipe::w8da4 || recipe == Recipe::fp8 || recipe == Recipe::w8da8, "prepare_qat", "recipe",
              "unknown recipe ", static_cast<int>(recipe));
  prepare_tree(model, recipe, options);
}

std::vector<std::string> float_layers(const Sequential& model) {
  std::vector<std::string> names;
  bool prepared = false;
  walk_children(model, "", [&](const std::string& path, const Module& parent, std::size_t i) {
    const Module& c = *parent.named_children()[i].second;
    if (is_recipe_qat(c) || c.type_name() == "QATLinear") prepared = true;
    if (c.type_name() == "Linear") names.push_back(path);
  });
  return prepared ? names : std::vector<std::string>{};
}

// ---- inference modules ----

namespace {

void check_bias(const Tensor& bias, std::int64_t n, const char* op) {
  QGRAD_CHECK(!bias.defined() || (bias.dtype() == DType::f32 && bias.shape() == Shape{n}), op, "bias",
              "expected f32 [", n, "]");
}

}  // namespace

Int8DynActInt4WeightLinear::Int8DynActInt4WeightLinear(Tensor weight_q, Tensor weight_scale, Tensor bias,
                                                       std::int64_t group_size)
    : group_size_(group_size) {
  const char* op = "Int8DynActInt4WeightLinear";
  QGRAD_CHECK(weight_q.defined() && weight_q.dtype() == DType::s4 && weight_q.dim() == 2, op, "weight",
              "expected s4 [N, K]");
  const std::int64_t n = weight_q.size(0), k = weight_q.size(1);
  QGRAD_CHECK(group_size > 0 && k % group_size == 0, op, "group_size", "must be > 0 and divide K = ", k, ", got ",
              group_size);
  const Shape scale_shape{n, k / group_size};
  QGRAD_CHECK(weight_scale.defined() && weight_scale.dtype() == DType::f32 && weight_scale.shape() == scale_shape,
              op, "weight_scale", "expected f32 [", n, ", ", k / group_size, "]");
  check_bias(bias, n, op);
  weight_ = register_buffer("weight", weight_q);
  weight_scale_ = register_buffer("weight_scale", weight_scale);
  if (bias.defined()) bias_ = register_buffer("bias", bias);
}

std::shared_ptr<Module> Int8DynActInt4WeightLinear::clone() const {
  NoGradGuard no_grad;
  return clone_into(std::make_shared<Int8DynActInt4WeightLinear>(
      weight_.clone(), weight_scale_.clone(), bias_.defined() ? bias_.clone() : Tensor(), group_size_));
}

Tensor Int8DynActInt4WeightLinear::forward(const Tensor& x) {
  return linear_w4a8(x, weight_, weight_scale_, group_size_, bias_, QuantMode::asymmetric, DType::f32);
}

Float8Linear::Float8Linear(Tensor weight_q, Tensor weight_scale, Tensor bias) {
  const char* op = "Float8Linear";
  QGRAD_CHECK(weight_q.defined() && weight_q.dtype() == DType::f8e4m3 && weight_q.dim() == 2, op, "weight",
              "expected f8e4m3 [N, K]");
  QGRAD_CHECK(weight_scale.defined() && weight_scale.dtype() == DType::f32 && weight_scale.shape() == Shape{1}, op,
              "weight_scale", "expected f32 [1]");
  check_bias(bias, weight_q.size(0), op);
  weight_ = register_buffer("weight", weight_q);
  weight_scale_ = register_buffer("weight_scale", weight_scale);
  if (bias.defined()) bias_ = register_buffer("bias", bias);
}

std::shared_ptr<Module> Float8Linear::clone() const {
  NoGradGuard no_grad;
  return clone_into(std::make_shared<Float8Linear>(weight_.clone(), weight_scale_.clone(),
                                                   bias_.defined() ? bias_.clone() : Tensor()));
}

Tensor Float8Linear::forward(const Tensor& x) { return fp8_linear(x, weight_, weight_scale_, bias_, DType::f32); }

Int8DynActInt8WeightLinear::Int8DynActInt8WeightLinear(Tensor weight_q, Tensor weight_scale, Tensor bias,
                                                       Tensor weight_row_sums) {
  const char* op = "Int8DynActInt8WeightLinear";
  QGRAD_CHECK(weight_q.defined() && weight_q.dtype() == DType::s8 && weight_q.dim() == 2, op, "weight",
              "expected s8 [N, K]");
  const std::int64_t n = weight_q.size(0), k = weight_q.size(1);
  QGRAD_CHECK(weight_scale.defined() && weight_scale.dtype() == DType::f32 && weight_scale.shape() == Shape{n}, op,
              "weight_scale", "expected f32 [", n, "]");
  check_bias(bias, n, op);
  if (weight_row_sums.defined()) {
    QGRAD_CHECK(weight_row_sums.dtype() == DType::s32 && weight_row_sums.shape() == Shape{n}, op, "weight_row_sums",
                "expected s32 [", n, "]");
  } else {  // once, offline: sum_k w_q[n, k] (exact in int32: |sum| <= 128 K)
    const std::vector<std::int8_t> w = weight_q.cpu().to_vector<std::int8_t>();
    std::vector<std::int32_t> sums(static_cast<std::size_t>(n), 0);
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t c = 0; c < k; ++c) sums[static_cast<std::size_t>(r)] += w[static_cast<std::size_t>(r * k + c)];
    weight_row_sums = Tensor::from_vector<std::int32_t>(sums, {n}, weight_q.device());
  }
  for (const Tensor* t : {&weight_scale, &weight_row_sums, &bias})
    QGRAD_CHECK(!t->defined() || t->device() == weight_q.device(), op, "weight_scale",
                "weight, weight_scale, weight_row_sums and bias must be on one device");
  weight_ = register_buffer("weight", weight_q);
  weight_scale_ = register_buffer("weight_scale", weight_scale);
  row_sums_ = register_buffer("weight_row_sums", weight_row_sums);
  if (bias.defined()) bias_ = register_buffer("bias", bias);
}

Tensor Int8DynActInt8WeightLinear::forward(const Tensor& x) {
  const char* op = "Int8DynActInt8WeightLinear";
  QGRAD_CHECK(x.defined() && is_floating(x.dtype()), op, "x", "expected a floating tensor");
  ActivationQuant act = ActivationQuant::dynamic(QuantMode::asymmetric);
  act.weight_row_sums = row_sums_;
  // In the compute dtype where one is set (carried over from the QAT linear),
  // as that linear ran: a model's first layer gets f32 images.
  const Tensor xc = to_compute(x);
  return quantized_linear(xc, weight_, weight_scale_, bias_, act, xc.dtype());
}

std::shared_ptr<Module> Int8DynActInt8WeightLinear::clone() const {
  NoGradGuard no_grad;
  return clone_into(std::make_shared<Int8DynActInt8WeightLinear>(
      weight_.clone(), weight_scale_.clone(), bias_.defined() ? bias_.clone() : Tensor(), row_sums_.clone()));
}

// ---- convert ----

namespace {

// The inference layer of one recipe QAT linear, with its weight quantized by
// the qparams its fake quantizer uses (so the dequantized weight equals the
// fake-quantized one).
std::shared_ptr<Module> converted_layer(const Module& qat) {
  if (const auto* q = dynamic_cast<const Int8DynActInt8WeightQATLinear*>(&qat)) {
    const Tensor w = q->weight().detach();
    const AffineQparams qp = weight_8da8w_qparams(w);
    Tensor wq = quantize(w, qp.scale, qp.zero_point, QuantScope::per_channel(0), DType::s8);
    Tensor bias = q->bias().defined() ? q->bias().detach().to(DType::f32).clone() : Tensor();
    auto lin = std::make_shared<Int8DynActInt8WeightLinear>(wq, qp.scale, bias);
    lin->set_compute_dtype(q->compute_dtype());
    return lin;
  }
  if (const auto* q = dynamic_cast<const Int8DynActInt4WeightQATLinear*>(&qat)) {
    const Tensor w = q->weight().detach();
    const Int4Qparams qp = choose_qparams_int4(w, q->group_size(), QuantMode::symmetric, DType::s4);
    Tensor wq = quantize_int4(w, qp.scale, qp.zero_point, q->group_size(), DType::s4);
    Tensor bias = q->bias().defined() ? q->bias().detach().clone() : Tensor();
    return std::make_shared<Int8DynActInt4WeightLinear>(wq, qp.scale, bias, q->group_size());
  }
  const auto& f = dynamic_cast<const Float8QATLinear&>(qat);
  const Tensor w = f.weight().detach();
  const Tensor scale = fp8_scale(w, QuantScope::per_tensor(), DType::f8e4m3).reshape({1});
  Tensor wq = quantize_fp8(w, scale, QuantScope::per_tensor(), DType::f8e4m3);
  Tensor bias = f.bias().defined() ? f.bias().detach().clone() : Tensor();
  return std::make_shared<Float8Linear>(wq, scale, bias);
}

bool is_qat_of(const Module& m, Recipe recipe) {
  switch (recipe) {
    case Recipe::w8da4: return dynamic_cast<const Int8DynActInt4WeightQATLinear*>(&m) != nullptr;
    case Recipe::fp8: return dynamic_cast<const Float8QATLinear*>(&m) != nullptr;
    case Recipe::w8da8: return dynamic_cast<const Int8DynActInt8WeightQATLinear*>(&m) != nullptr;
    default: return false;
  }
}

const char* qat_type_of(Recipe recipe) {
  return recipe == Recipe::w8da4 ? "Int8DynActInt4WeightQATLinear"
         : recipe == Recipe::fp8 ? "Float8QATLinear"
                                 : "Int8DynActInt8WeightQATLinear";
}

// 8da4w, fp8, 8da8w: a deep copy of the tree with each of the recipe's QAT
// linears, at any depth, replaced by its inference layer.
std::shared_ptr<Sequential> convert_tree(const Sequential& model, Recipe recipe) {
  const char* op = "convert";
  // Validate before building anything.
  std::size_t qat = 0;
  walk_children(model, "", [&](const std::string& path, const Module& parent, std::size_t i) {
    const Module& c = *parent.named_children()[i].second;
    if (is_qat_of(c, recipe)) {
      ++qat;
      return;
    }
    QGRAD_CHECK(!is_quant_module(c), op, path, "cannot convert a ", c.type_name(), " with recipe ",
                recipe_name(recipe));
  });
  QGRAD_CHECK(qat > 0, op, "model", "not prepared for recipe ", recipe_name(recipe), " (no ", qat_type_of(recipe),
              ")");
  NoGradGuard no_grad;
  auto out = std::dynamic_pointer_cast<Sequential>(model.clone());
  for_each_module(*out, [&](Module& m) {
    const auto& children = m.named_children();
    for (std::size_t i = 0; i < children.size(); ++i)
      if (is_qat_of(*children[i].second, recipe)) m.replace_child(i, converted_layer(*children[i].second));
  });
  out->eval();
  return out;
}

}  // namespace

std::shared_ptr<Sequential> convert(const Sequential& model, Recipe recipe) {
  if (recipe == Recipe::int8) return convert(model);
  QGRAD_CHECK(recipe == Recipe::w8da4 || recipe == Recipe::fp8 || recipe == Recipe::w8da8, "convert", "recipe",
              "unknown recipe ", static_cast<int>(recipe));
  return convert_tree(model, recipe);
}

}  // namespace qgrad::nn
