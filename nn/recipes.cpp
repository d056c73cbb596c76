#include "qgrad/nn/recipes.h"

#include <limits>

#include "qgrad/autograd/node.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/fp8_linear.h"
#include "qgrad/ops/linalg.h"
#include "qgrad/ops/lowbit.h"
#include "qgrad/ops/lowbit_linear.h"
#include "qgrad/ops/quantize.h"

namespace qgrad::nn {

namespace {

template <class F>
void walk(Module& m, F&& f) {
  f(m);
  for (auto& [n, c] : m.named_children()) walk(*c, f);
}

bool is_recipe_qat(const Module& m) {
  return dynamic_cast<const Int8DynActInt4WeightQATLinear*>(&m) || dynamic_cast<const Float8QATLinear*>(&m);
}

}  // namespace

Recipe parse_recipe(const std::string& name) {
  if (name == "int8") return Recipe::int8;
  if (name == "8da4w") return Recipe::w8da4;
  if (name == "fp8") return Recipe::fp8;
  throw Error("parse_recipe", "recipe", "unknown recipe '" + name + "' (expected int8, 8da4w or fp8)");
}

const char* recipe_name(Recipe recipe) {
  switch (recipe) {
    case Recipe::int8: return "int8";
    case Recipe::w8da4: return "8da4w";
    case Recipe::fp8: return "fp8";
  }
  throw Error("recipe_name", "recipe", "unknown recipe " + std::to_string(static_cast<int>(recipe)));
}

// ---- fake quantizers ----

Tensor fake_quantize_8da4w_activation(const Tensor& x) {
  // torchao's _get_8da4w_activation_config: int8 per token, asymmetric, dynamic, eps = finfo(f32).eps.
  const AffineQparams q = choose_qparams_affine(x.detach(), QuantScope::per_token(), QuantMode::asymmetric, -128, 127,
                                                std::numeric_limits<float>::epsilon());
  return ::qgrad::fake_quantize(x, q.scale, q.zero_point, QuantScope::per_token(), -128, 127);
}

Tensor fake_quantize_8da4w_weight(const Tensor& w, std::int64_t group_size) {
  // torchao's _get_8da4w_weight_config: int4 per group, symmetric, dynamic, eps = finfo(dtype).smallest_normal.
  return fake_quantize_int4(w, group_size, QuantMode::symmetric, DType::s4);
}

Tensor fake_quantize_fp8_tensor(const Tensor& x) {
  return fake_quantize_fp8(x, QuantScope::per_tensor(), DType::f8e4m3);
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

Tensor Int8DynActInt4WeightQATLinear::forward(const Tensor& x) {
  if (!fake_quant_) return ::qgrad::linear(x, weight_, bias_);
  return ::qgrad::linear(fake_quantize_8da4w_activation(x), fake_quantize_8da4w_weight(weight_, group_size_), bias_);
}

Float8QATLinear::Float8QATLinear(const Linear& linear) {
  weight_ = register_parameter("weight", linear.weight());
  if (linear.bias().defined()) bias_ = register_parameter("bias", linear.bias());
}

Tensor Float8QATLinear::forward(const Tensor& x) {
  if (!fake_quant_) return ::qgrad::linear(x, weight_, bias_);
  return ::qgrad::linear(fake_quantize_fp8_tensor(x), fake_quantize_fp8_tensor(weight_), bias_);
}

void enable_recipe_fake_quant(Module& root, bool on) {
  enable_fake_quant(root, on);
  walk(root, [&](Module& m) {
    if (auto* a = dynamic_cast<Int8DynActInt4WeightQATLinear*>(&m)) a->enable_fake_quant(on);
    if (auto* b = dynamic_cast<Float8QATLinear*>(&m)) b->enable_fake_quant(on);
  });
}

// ---- prepare ----

void prepare_qat(Sequential& model, Recipe recipe, const RecipeOptions& options) {
  const char* op = "prepare_qat";
  if (recipe == Recipe::int8) return prepare_qat(model, options.int8);
  QGRAD_CHECK(recipe == Recipe::w8da4 || recipe == Recipe::fp8, op, "recipe", "unknown recipe ",
              static_cast<int>(recipe));
  QGRAD_CHECK(model.size() > 0, op, "model", "empty model");
  for (std::size_t i = 0; i < model.size(); ++i) {
    const Module& m = *model[i];
    QGRAD_CHECK(model.name_at(i) != "quant" && m.type_name() != "QATLinear" && !is_recipe_qat(m), op, "model",
                "model is already prepared");
  }
  if (recipe == Recipe::w8da4)
    QGRAD_CHECK(options.group_size > 0, op, "group_size", "must be > 0, got ", options.group_size);
  // Validate the whole model before changing it.
  std::size_t eligible = 0;
  for (std::size_t i = 0; i < model.size(); ++i) {
    const auto* lin = dynamic_cast<const Linear*>(model[i].get());
    if (!lin) continue;
    if (recipe == Recipe::w8da4 && lin->in_features() % options.group_size != 0) {
      QGRAD_CHECK(options.skip_indivisible, op, "group_size", "layer '", model.name_at(i), "': in_features ",
                  lin->in_features(), " is not a multiple of the group size ", options.group_size,
                  " (RecipeOptions::skip_indivisible keeps such layers in float)");
      continue;
    }
    ++eligible;
  }
  QGRAD_CHECK(eligible > 0, op, "model", "no Linear layer to prepare for recipe ", recipe_name(recipe));
  for (std::size_t i = 0; i < model.size(); ++i) {
    const auto* lin = dynamic_cast<const Linear*>(model[i].get());
    if (!lin) continue;
    if (recipe == Recipe::fp8) {
      model.set(i, std::make_shared<Float8QATLinear>(*lin));
    } else if (lin->in_features() % options.group_size == 0) {
      model.set(i, std::make_shared<Int8DynActInt4WeightQATLinear>(*lin, options.group_size));
    }
  }
}

std::vector<std::string> float_layers(const Sequential& model) {
  std::vector<std::string> names;
  bool prepared = false;
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (is_recipe_qat(*model[i]) || model[i]->type_name() == "QATLinear") prepared = true;
    if (model[i]->type_name() == "Linear") names.push_back(model.name_at(i));
  }
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

Tensor Float8Linear::forward(const Tensor& x) { return fp8_linear(x, weight_, weight_scale_, bias_, DType::f32); }

// ---- convert ----

std::shared_ptr<Sequential> convert(const Sequential& model, Recipe recipe) {
  const char* op = "convert";
  if (recipe == Recipe::int8) return convert(model);
  QGRAD_CHECK(recipe == Recipe::w8da4 || recipe == Recipe::fp8, op, "recipe", "unknown recipe ",
              static_cast<int>(recipe));
  const std::string qat = recipe == Recipe::w8da4 ? "Int8DynActInt4WeightQATLinear" : "Float8QATLinear";
  // Validate before building anything.
  bool any = false;
  for (std::size_t i = 0; i < model.size(); ++i) {
    const std::string t = model[i]->type_name();
    QGRAD_CHECK(t == qat || t == "ReLU" || t == "Linear", op, model.name_at(i), "cannot convert a ", t,
                " with recipe ", recipe_name(recipe), " (supported: ", qat, ", Linear, ReLU)");
    any = any || t == qat;
  }
  QGRAD_CHECK(any, op, "model", "not prepared for recipe ", recipe_name(recipe), " (no ", qat, ")");
  NoGradGuard no_grad;
  auto out = std::make_shared<Sequential>();
  for (std::size_t i = 0; i < model.size(); ++i) {
    const std::string& name = model.name_at(i);
    if (const auto* q = dynamic_cast<const Int8DynActInt4WeightQATLinear*>(model[i].get())) {
      const Tensor w = q->weight().detach();
      const Int4Qparams qp = choose_qparams_int4(w, q->group_size(), QuantMode::symmetric, DType::s4);
      Tensor wq = quantize_int4(w, qp.scale, qp.zero_point, q->group_size(), DType::s4);
      Tensor bias = q->bias().defined() ? q->bias().detach().clone() : Tensor();
      out->push_back(name, std::make_shared<Int8DynActInt4WeightLinear>(wq, qp.scale, bias, q->group_size()));
    } else if (const auto* f = dynamic_cast<const Float8QATLinear*>(model[i].get())) {
      const Tensor w = f->weight().detach();
      const Tensor scale = fp8_scale(w, QuantScope::per_tensor(), DType::f8e4m3).reshape({1});
      Tensor wq = quantize_fp8(w, scale, QuantScope::per_tensor(), DType::f8e4m3);
      Tensor bias = f->bias().defined() ? f->bias().detach().clone() : Tensor();
      out->push_back(name, std::make_shared<Float8Linear>(wq, scale, bias));
    } else if (const auto* l = dynamic_cast<const Linear*>(model[i].get())) {
      Generator unused(0);
      const Tensor w = l->weight().detach();
      auto copy = std::make_shared<Linear>(l->in_features(), l->out_features(), unused, l->bias().defined(),
                                           TensorOptions{}.with_dtype(w.dtype()).with_device(w.device()));
      NamedTensors state{{"weight", w.clone()}};
      if (l->bias().defined()) state.emplace_back("bias", l->bias().detach().clone());
      copy->load_state_dict(state);
      out->push_back(name, copy);
    } else {
      out->push_back(name, std::make_shared<ReLU>());
    }
  }
  out->eval();
  return out;
}

}  // namespace qgrad::nn
