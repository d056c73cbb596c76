#include "qgrad/nn/transformer.h"

#include <cmath>
#include <vector>

#include "qgrad/nn/recipes.h"
#include "qgrad/ops/attention.h"
#include "qgrad/ops/factory.h"
#include "qgrad/ops/shape.h"
#include "qgrad/ops/transformer.h"

namespace qgrad::nn {

namespace {
void check_shape(const char* module, const Shape& s) {
  QGRAD_CHECK(!s.empty(), module, "normalized_shape", "must name at least one dim");
  for (std::int64_t d : s) QGRAD_CHECK(d > 0, module, "normalized_shape", "dims must be > 0, got ", shape_str(s));
}
void check_options(const char* module, const TensorOptions& o) {
  QGRAD_CHECK(is_floating(o.dtype), module, "options", "dtype must be floating, got ", dtype_name(o.dtype));
}
}  // namespace

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias, TensorOptions options)
    : shape_(std::move(normalized_shape)), eps_(eps) {
  check_shape("LayerNorm", shape_);
  QGRAD_CHECK(std::isfinite(eps) && eps > 0, "LayerNorm", "eps", "must be finite and > 0, got ", eps);
  check_options("LayerNorm", options);
  options.requires_grad = false;
  if (elementwise_affine) {
    weight_ = register_parameter("weight", ones(shape_, options));
    if (bias) bias_ = register_parameter("bias", zeros(shape_, options));
  }
}

std::shared_ptr<Module> LayerNorm::clone() const {
  return clone_into(std::make_shared<LayerNorm>(shape_, eps_, weight_.defined(), bias_.defined(),
                                                TensorOptions{}.with_dtype(weight_.defined() ? weight_.dtype()
                                                                                             : DType::f32)));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(to_compute(x), shape_, to_compute(weight_), to_compute(bias_), eps_);
}

RMSNorm::RMSNorm(Shape normalized_shape, std::optional<double> eps, bool elementwise_affine, TensorOptions options)
    : shape_(std::move(normalized_shape)), eps_(eps) {
  check_shape("RMSNorm", shape_);
  if (eps.has_value())
    QGRAD_CHECK(std::isfinite(*eps) && *eps > 0, "RMSNorm", "eps", "must be finite and > 0, got ", *eps);
  check_options("RMSNorm", options);
  options.requires_grad = false;
  if (elementwise_affine) weight_ = register_parameter("weight", ones(shape_, options));
}

std::shared_ptr<Module> RMSNorm::clone() const {
  return clone_into(std::make_shared<RMSNorm>(
      shape_, eps_, weight_.defined(), TensorOptions{}.with_dtype(weight_.defined() ? weight_.dtype() : DType::f32)));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(to_compute(x), shape_, to_compute(weight_), eps_); }

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Generator& gen,
                     std::optional<std::int64_t> padding_idx, TensorOptions options) {
  QGRAD_CHECK(num_embeddings > 0, "Embedding", "num_embeddings", "must be > 0, got ", num_embeddings);
  QGRAD_CHECK(embedding_dim > 0, "Embedding", "embedding_dim", "must be > 0, got ", embedding_dim);
  check_options("Embedding", options);
  if (padding_idx.has_value()) {
    QGRAD_CHECK(*padding_idx >= -num_embeddings && *padding_idx < num_embeddings, "Embedding", "padding_idx",
                "padding_idx ", *padding_idx, " out of range for ", num_embeddings, " rows");
    padding_idx_ = *padding_idx < 0 ? *padding_idx + num_embeddings : *padding_idx;
  }
  options.requires_grad = false;
  // N(0, 1) drawn in f64 on the host (the counter-based draw is the same on
  // every device), the padding row zeroed, then cast and moved.
  std::vector<double> w =
      randn({num_embeddings, embedding_dim}, gen, TensorOptions{}.with_dtype(DType::f64)).to_vector<double>();
  if (padding_idx_.has_value())
    for (std::int64_t j = 0; j < embedding_dim; ++j) w[static_cast<std::size_t>(*padding_idx_ * embedding_dim + j)] = 0.0;
  weight_ = register_parameter(
      "weight", Tensor::from_vector(w, {num_embeddings, embedding_dim}).to(options.dtype).to(options.device));
}

std::shared_ptr<Module> Embedding::clone() const {
  Generator unused(0);  // the values are overwritten by the copy
  return clone_into(std::make_shared<Embedding>(weight_.size(0), weight_.size(1), unused, padding_idx_,
                                                TensorOptions{}.with_dtype(weight_.dtype())));
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight_, indices, padding_idx_); }

Dropout::Dropout(double p, Generator& gen) : p_(p), gen_(&gen) {
  QGRAD_CHECK(p >= 0.0 && p <= 1.0, "Dropout", "p", "probability must be in [0, 1], got ", p);
}

std::shared_ptr<Module> Dropout::clone() const { return clone_into(std::make_shared<Dropout>(p_, *gen_)); }

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), *gen_); }

Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate_); }

std::shared_ptr<Module> GELU::clone() const { return clone_into(std::make_shared<GELU>(approximate_)); }

MultiheadAttention::MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads, Generator& gen, double dropout,
                                       bool bias, TensorOptions options)
    : embed_dim_(embed_dim), num_heads_(num_heads), dropout_(dropout), bias_(bias), gen_(&gen) {
  constexpr const char* m = "MultiheadAttention";
  QGRAD_CHECK(embed_dim > 0, m, "embed_dim", "must be > 0, got ", embed_dim);
  QGRAD_CHECK(num_heads > 0, m, "num_heads", "must be > 0, got ", num_heads);
  QGRAD_CHECK(embed_dim % num_heads == 0, m, "num_heads", "embed_dim ", embed_dim, " is not divisible by num_heads ",
              num_heads);
  QGRAD_CHECK(dropout >= 0.0 && dropout <= 1.0, m, "dropout", "probability must be in [0, 1], got ", dropout);
  check_options(m, options);
  options.requires_grad = false;
  auto in_proj = register_module("in_proj", std::make_shared<Linear>(embed_dim, 3 * embed_dim, gen, bias, options));
  auto out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, gen, bias, options));
  // PyTorch's _reset_parameters: xavier_uniform_ on in_proj_weight, zero biases.
  const double bound = std::sqrt(6.0 / static_cast<double>(embed_dim + 3 * embed_dim));
  in_proj->weight().copy_(rand({3 * embed_dim, embed_dim}, gen, options, -bound, bound));
  if (bias) {
    in_proj->bias().copy_(zeros({3 * embed_dim}, options));
    out_proj->bias().copy_(zeros({embed_dim}, options));
  }
}

std::shared_ptr<Linear> MultiheadAttention::in_proj() const {
  return std::dynamic_pointer_cast<Linear>(named_children()[0].second);
}

std::shared_ptr<Linear> MultiheadAttention::out_proj() const {
  return std::dynamic_pointer_cast<Linear>(named_children()[1].second);
}

std::shared_ptr<Module> MultiheadAttention::clone() const {
  Generator unused(0);  // the values are overwritten by the copy; the copy draws its dropout from gen_
  const DType dt = in_proj() ? in_proj()->weight().dtype() : DType::f32;
  auto copy = std::make_shared<MultiheadAttention>(embed_dim_, num_heads_, unused, dropout_, bias_,
                                                   TensorOptions{}.with_dtype(dt));
  copy->gen_ = gen_;
  return clone_into(copy);
}

Tensor MultiheadAttention::forward(const Tensor& x, const Tensor& attn_mask, bool causal) {
  constexpr const char* m = "MultiheadAttention";
  QGRAD_CHECK(x.defined(), m, "x", "undefined tensor");
  QGRAD_CHECK(x.dim() == 3 && x.size(2) == embed_dim_, m, "x", "expected shape [B, L, ", embed_dim_, "], got ",
              shape_str(x.shape()));
  return forward_qkv(child(0).forward(x), attn_mask, causal);
}

Tensor MultiheadAttention::forward_qkv(const Tensor& qkv_in, const Tensor& attn_mask, bool causal,
                                       const Tensor& residual) {
  constexpr const char* m = "MultiheadAttention";
  QGRAD_CHECK(qkv_in.defined(), m, "qkv", "undefined tensor");
  QGRAD_CHECK(qkv_in.dim() == 3 && qkv_in.size(2) == 3 * embed_dim_, m, "qkv", "expected shape [B, L, ",
              3 * embed_dim_, "], got ", shape_str(qkv_in.shape()));
  const std::int64_t B = qkv_in.size(0), L = qkv_in.size(1), H = num_heads_, Dh = embed_dim_ / num_heads_;
  const double p = is_training() ? dropout_ : 0.0;
  auto project = [&](const Tensor& o) {
    return residual.defined() ? child(1).forward_add(o, residual) : child(1).forward(o);
  };
  // Without a mask or dropout the heads need not be split out and merged
  // back; an 8da QAT out_proj takes the attention into its activation's fake quant.
  if (!attn_mask.defined() && p == 0.0) {
    if (auto* q8 = dynamic_cast<Int8DynActInt8WeightQATLinear*>(&child(1)))
      return q8->forward_packed_attention(qkv_in, H, causal, residual);
    if (auto* q4 = dynamic_cast<Int8DynActInt4WeightQATLinear*>(&child(1)))
      return q4->forward_packed_attention(qkv_in, H, causal, residual);
    return project(packed_attention(qkv_in, H, causal));
  }
  Tensor qkv = permute(qkv_in.reshape({B, L, 3, H, Dh}), {2, 0, 3, 1, 4});  // [3, B, H, L, Dh]
  std::vector<Tensor> parts = chunk(qkv, 3, 0);
  Tensor o = scaled_dot_product_attention(parts[0].reshape({B, H, L, Dh}), parts[1].reshape({B, H, L, Dh}),
                                          parts[2].reshape({B, H, L, Dh}), attn_mask, causal, std::nullopt, p, *gen_);
  return project(permute(o, {0, 2, 1, 3}).reshape({B, L, embed_dim_}));
}

}  // namespace qgrad::nn
