#include "qgrad/nn/vit.h"

#include <cmath>
#include <string>

#include "qgrad/autograd/node.h"
#include "qgrad/nn/recipes.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/factory.h"
#include "qgrad/ops/reduce.h"
#include "qgrad/ops/shape.h"

namespace qgrad::nn {

namespace {

void check_positive(const char* op, const char* arg, std::int64_t v) {
  QGRAD_CHECK(v > 0, op, arg, "must be > 0, got ", v);
}

}  // namespace

PatchEmbedding::PatchEmbedding(std::int64_t image_size, std::int64_t patch, std::int64_t dim, Generator& gen,
                               TensorOptions options)
    : image_(image_size), patch_(patch), dim_(dim) {
  constexpr const char* m = "PatchEmbedding";
  check_positive(m, "image_size", image_size);
  check_positive(m, "patch", patch);
  check_positive(m, "dim", dim);
  QGRAD_CHECK(image_size % patch == 0, m, "patch", "patch ", patch, " does not divide the image size ", image_size);
  options.requires_grad = false;
  register_module("proj", std::make_shared<Linear>(patch * patch, dim, gen, true, options));
  pos_ = register_parameter("pos_embed", randn({1, tokens(), dim}, gen, options, 0.0, 0.02));
}

Tensor PatchEmbedding::forward(const Tensor& x) {
  constexpr const char* m = "PatchEmbedding";
  QGRAD_CHECK(x.defined(), m, "x", "undefined tensor");
  QGRAD_CHECK(x.dim() == 2 && x.size(1) == image_ * image_, m, "x", "expected shape [B, ", image_ * image_,
              "] (rows of pixels), got ", shape_str(x.shape()));
  const std::int64_t B = x.size(0), g = image_ / patch_;
  // [B, g, P, g, P] -> [B, g, g, P, P]: patch (i, j) holds rows i*P.. and columns j*P.. of the image.
  Tensor patches = permute(x.reshape({B, g, patch_, g, patch_}), {0, 1, 3, 2, 4}).reshape({B, g * g, patch_ * patch_});
  return add(child(0).forward(patches), to_compute(pos_));
}

std::shared_ptr<Module> PatchEmbedding::clone() const {
  Generator unused(0);  // the values are overwritten by the copy
  return clone_into(
      std::make_shared<PatchEmbedding>(image_, patch_, dim_, unused, TensorOptions{}.with_dtype(pos_.dtype())));
}

EncoderBlock::EncoderBlock(std::int64_t dim, std::int64_t heads, std::int64_t mlp_ratio, Generator& gen,
                           double dropout, TensorOptions options)
    : dim_(dim), heads_(heads), mlp_ratio_(mlp_ratio), dropout_(dropout), gen_(&gen) {
  constexpr const char* m = "EncoderBlock";
  check_positive(m, "dim", dim);
  check_positive(m, "heads", heads);
  check_positive(m, "mlp_ratio", mlp_ratio);
  QGRAD_CHECK(dim % heads == 0, m, "heads", "dim ", dim, " is not divisible by heads ", heads);
  options.requires_grad = false;
  register_module("ln1", std::make_shared<LayerNorm>(Shape{dim}, 1e-5, true, true, options));
  register_module("attn", std::make_shared<MultiheadAttention>(dim, heads, gen, dropout, true, options));
  register_module("ln2", std::make_shared<LayerNorm>(Shape{dim}, 1e-5, true, true, options));
  register_module("fc1", std::make_shared<Linear>(dim, mlp_ratio * dim, gen, true, options));
  register_module("act", std::make_shared<GELU>());
  register_module("fc2", std::make_shared<Linear>(mlp_ratio * dim, dim, gen, true, options));
}

Tensor EncoderBlock::forward(const Tensor& x) {
  constexpr const char* m = "EncoderBlock";
  QGRAD_CHECK(x.defined(), m, "x", "undefined tensor");
  QGRAD_CHECK(x.dim() == 3 && x.size(2) == dim_, m, "x", "expected shape [B, T, ", dim_, "], got ",
              shape_str(x.shape()));
  // The residual adds ride in out_proj's and fc2's GEMMs (forward_add).
  Tensor qkv = fused_ln_linear(ln1(), attn().in_proj_module(), x);
  if (!qkv.defined()) {
    Tensor a = child(0).forward(x);
    if (calib1_) calib1_->observe(a.detach());
    qkv = attn().in_proj_module().forward(a);
  }
  Tensor h = attn().forward_qkv(qkv, Tensor(), false, x);
  Tensor f = fused_ln_linear(ln2(), child(3), h);
  if (!f.defined()) {
    Tensor b = child(2).forward(h);
    if (calib2_) calib2_->observe(b.detach());
    f = child(3).forward(b);
  }
  return mlp_out(f, h);
}

// linear(ln(x)) with the layer norm and an 8da QAT linear's activation fake
// quant as one op (layer_norm_fake_quantize_dynamic, the same values);
// undefined where that does not apply (another linear, or a SmoothQuant
// calibration observing ln's output).
Tensor EncoderBlock::fused_ln_linear(LayerNorm& ln, Module& linear, const Tensor& x) {
  if (calib1_ != nullptr || calib2_ != nullptr) return Tensor();
  if (auto* q8 = dynamic_cast<Int8DynActInt8WeightQATLinear*>(&linear)) return q8->forward_layer_norm(x, ln);
  if (auto* q4 = dynamic_cast<Int8DynActInt4WeightQATLinear*>(&linear)) return q4->forward_layer_norm(x, ln);
  return Tensor();
}

// residual + fc2(act(f)); a GELU before an 8da QAT fc2 goes into its
// activation fake quant (one op, the same values: gelu_fake_quantize_dynamic).
Tensor EncoderBlock::mlp_out(const Tensor& f, const Tensor& residual) {
  if (const auto* act = dynamic_cast<const GELU*>(&child(4))) {
    if (auto* q8 = dynamic_cast<Int8DynActInt8WeightQATLinear*>(&child(5)))
      return q8->forward_gelu(f, act->approximate(), residual);
    if (auto* q4 = dynamic_cast<Int8DynActInt4WeightQATLinear*>(&child(5)))
      return q4->forward_gelu(f, act->approximate(), residual);
  }
  return child(5).forward_add(child(4).forward(f), residual);
}

std::shared_ptr<Module> EncoderBlock::clone() const {
  Generator unused(0);  // the values are overwritten by the copy
  auto copy = std::make_shared<EncoderBlock>(dim_, heads_, mlp_ratio_, unused, dropout_,
                                             TensorOptions{}.with_dtype(ln1().weight().dtype()));
  copy->gen_ = gen_;
  return clone_into(copy);
}

LayerNorm& EncoderBlock::ln1() const { return dynamic_cast<LayerNorm&>(child(0)); }
MultiheadAttention& EncoderBlock::attn() const { return dynamic_cast<MultiheadAttention&>(child(1)); }
LayerNorm& EncoderBlock::ln2() const { return dynamic_cast<LayerNorm&>(child(2)); }
std::shared_ptr<Linear> EncoderBlock::fc1() const { return std::dynamic_pointer_cast<Linear>(named_children()[3].second); }

Tensor TokenMeanPool::forward(const Tensor& x) {
  QGRAD_CHECK(x.defined() && x.dim() == 3, "TokenMeanPool", "x", "expected shape [B, T, D]");
  return mean(x, 1);
}

std::shared_ptr<Sequential> make_vit(const ViTOptions& o, Generator& gen, TensorOptions tensor_options) {
  constexpr const char* op = "make_vit";
  check_positive(op, "image_size", o.image_size);
  check_positive(op, "patch", o.patch);
  check_positive(op, "dim", o.dim);
  check_positive(op, "depth", o.depth);
  check_positive(op, "heads", o.heads);
  check_positive(op, "mlp_ratio", o.mlp_ratio);
  check_positive(op, "classes", o.classes);
  QGRAD_CHECK(o.image_size % o.patch == 0, op, "patch", "patch ", o.patch, " does not divide the image size ",
              o.image_size);
  QGRAD_CHECK(o.dim % o.heads == 0, op, "heads", "dim ", o.dim, " is not divisible by heads ", o.heads);
  QGRAD_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, op, "dropout", "probability must be in [0, 1), got ", o.dropout);
  auto m = std::make_shared<Sequential>();
  m->push_back("embed", std::make_shared<PatchEmbedding>(o.image_size, o.patch, o.dim, gen, tensor_options));
  for (std::int64_t i = 0; i < o.depth; ++i)
    m->push_back("block" + std::to_string(i),
                 std::make_shared<EncoderBlock>(o.dim, o.heads, o.mlp_ratio, gen, o.dropout, tensor_options));
  m->push_back("norm", std::make_shared<LayerNorm>(Shape{o.dim}, 1e-5, true, true, tensor_options));
  m->push_back("pool", std::make_shared<TokenMeanPool>());
  m->push_back("head", std::make_shared<Linear>(o.dim, o.classes, gen, true, tensor_options));
  return m;
}

std::vector<Tensor> smoothquant_encoder_blocks(Sequential& model, const std::vector<Tensor>& batches, double alpha) {
  constexpr const char* op = "smoothquant_encoder_blocks";
  QGRAD_CHECK(!batches.empty(), op, "batches", "no calibration batch");
  QGRAD_CHECK(std::isfinite(alpha) && alpha > 0 && alpha < 1, op, "alpha", "must be in (0, 1), got ", alpha);
  std::vector<EncoderBlock*> blocks;
  for (std::size_t i = 0; i < model.size(); ++i)
    if (auto* b = dynamic_cast<EncoderBlock*>(model[i].get())) {
      QGRAD_CHECK(b->attn().in_proj() && b->fc1(), op, "model", "block '", model.name_at(i),
                  "' is already prepared for QAT: SmoothQuant folds into the float model");
      blocks.push_back(b);
    }
  QGRAD_CHECK(!blocks.empty(), op, "model", "no EncoderBlock to smooth");
  const Device dev = blocks[0]->ln1().weight().device();
  std::vector<SmoothQuantCalibrator> calib;
  calib.reserve(2 * blocks.size());
  for (EncoderBlock* b : blocks) {
    calib.emplace_back(b->ln1().normalized_shape()[0], dev);
    calib.emplace_back(b->ln2().normalized_shape()[0], dev);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i]->set_calibrators(&calib[2 * i], &calib[2 * i + 1]);
  const bool was_training = model.is_training();
  model.eval();
  try {
    NoGradGuard no_grad;
    for (const Tensor& x : batches) model.forward(x);
  } catch (...) {
    for (EncoderBlock* b : blocks) b->set_calibrators(nullptr, nullptr);
    model.train(was_training);
    throw;
  }
  for (EncoderBlock* b : blocks) b->set_calibrators(nullptr, nullptr);
  model.train(was_training);
  std::vector<Tensor> factors;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EncoderBlock& b = *blocks[i];
    Linear& in_proj = *b.attn().in_proj();
    Linear& fc1 = *b.fc1();
    Tensor s1 = smoothquant_factors(calib[2 * i].act_absmax(), in_proj.weight(), alpha);
    Tensor s2 = smoothquant_factors(calib[2 * i + 1].act_absmax(), fc1.weight(), alpha);
    smoothquant_fold(b.ln1(), in_proj, s1);
    smoothquant_fold(b.ln2(), fc1, s2);
    factors.push_back(s1);
    factors.push_back(s2);
  }
  return factors;
}

}  // namespace qgrad::nn
