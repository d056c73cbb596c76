// Transformer layers: LayerNorm, RMSNorm, Embedding, Dropout, GELU, with
// PyTorch's defaults and initialisations (torch.nn of 2.11).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <string>

#include "qgrad/nn/layers.h"
#include "qgrad/nn/module.h"
#include "qgrad/ops/activation.h"

namespace qgrad::nn {

// layer_norm over the last dims `normalized_shape`. With elementwise_affine,
// a weight (ones) and, with bias, a bias (zeros) of that shape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
                     TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LayerNorm"; }
  std::shared_ptr<Module> clone() const override;
  std::vector<Tensor> compute_cast_parameters() const override { return {weight_, bias_}; }
  const Shape& normalized_shape() const { return shape_; }
  double eps() const { return eps_; }
  Tensor weight() const { return weight_; }  // undefined without elementwise_affine
  Tensor bias() const { return bias_; }      // undefined without bias
  // weight and bias as forward uses them: cast to the compute dtype where one
  // is set (a cast stage_compute_casts staged, when there is one).
  std::pair<Tensor, Tensor> compute_affine() const { return {to_compute(weight_), to_compute(bias_)}; }

 private:
  Shape shape_;
  double eps_;
  Tensor weight_, bias_;
};

// rms_norm over the last dims; eps unset: the math type's machine epsilon
// (ops/transformer.h). With elementwise_affine a weight of ones.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt, bool elementwise_affine = true,
                   TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "RMSNorm"; }
  std::shared_ptr<Module> clone() const override;
  std::vector<Tensor> compute_cast_parameters() const override { return {weight_}; }
  Tensor weight() const { return weight_; }

 private:
  Shape shape_;
  std::optional<double> eps_;
  Tensor weight_;
};

// A lookup table [num_embeddings, embedding_dim], initialised N(0, 1) from
// `gen` with the padding_idx row (if any) zeroed, as torch.nn.Embedding.
// forward takes s32/s64 indices of any shape.
class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Generator& gen,
            std::optional<std::int64_t> padding_idx = std::nullopt, TensorOptions options = {});
  Tensor forward(const Tensor& indices) override;
  std::string type_name() const override { return "Embedding"; }
  std::shared_ptr<Module> clone() const override;
  Tensor weight() const { return weight_; }
  std::optional<std::int64_t> padding_idx() const { return padding_idx_; }

 private:
  std::optional<std::int64_t> padding_idx_;
  Tensor weight_;
};

// dropout(x, p, is_training(), gen): identity in eval mode. The generator is
// referenced, not copied (it must outlive the module), and advances with
// every training call.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  std::shared_ptr<Module> clone() const override;
  double p() const { return p_; }

 private:
  double p_;
  Generator* gen_;
};

class GELU : public Module {
 public:
  explicit GELU(GeluApproximate approximate = GeluApproximate::none) : approximate_(approximate) {}
  Tensor forward(const Tensor& x) override;
  GeluApproximate approximate() const { return approximate_; }
  std::string type_name() const override { return "GELU"; }
  std::shared_ptr<Module> clone() const override;

 private:
  GeluApproximate approximate_;
};

// Multi-head self-attention over x [B, L, embed_dim] (torch.nn.MultiheadAttention
// with batch_first=True and query = key = value = x):
//   qkv = in_proj(x) -> [B, L, 3, H, Dh] -> permute -> q, k, v [B, H, L, Dh]
//   o = scaled_dot_product_attention(q, k, v, mask, causal, 1/sqrt(Dh), dropout if training)
//   out = out_proj(o -> [B, L, embed_dim]).
// Without a mask or dropout the middle is packed_attention(in_proj(x), H,
// causal) (ops/attention.h): the same function without the head copies.
// in_proj and out_proj are Linear children (so QAT wraps them like any
// Linear): parameters "in_proj.weight" [3E, E], "in_proj.bias" [3E],
// "out_proj.weight" [E, E], "out_proj.bias" [E]. PyTorch names the first two
// "in_proj_weight" / "in_proj_bias" (same layout: rows q, then k, then v);
// the out_proj names match. Initialisation as PyTorch: in_proj weight
// xavier-uniform over [3E, E], both biases zero, out_proj weight uniform
// +-1/sqrt(E). num_heads must divide embed_dim. The generator is referenced
// for the attention dropout (it must outlive the module). forward runs the
// children "in_proj" and "out_proj" as they are at the time, so prepare_qat
// may replace them (nn/recipes.h); in_proj() / out_proj() return them as
// Linear, or null once replaced by another module type.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads, Generator& gen, double dropout = 0.0,
                     bool bias = true, TensorOptions options = {});
  Tensor forward(const Tensor& x) override { return forward(x, Tensor(), false); }
  // attn_mask: as scaled_dot_product_attention's, broadcast to [B, H, L, L].
  Tensor forward(const Tensor& x, const Tensor& attn_mask, bool causal);
  // forward from in_proj's output qkv [B, L, 3 * embed_dim] (a caller that
  // ran in_proj itself, fused with what precedes it: nn::EncoderBlock); with
  // a residual ([B, L, embed_dim]), that plus the residual, the add in
  // out_proj's forward_add.
  Tensor forward_qkv(const Tensor& qkv, const Tensor& attn_mask = Tensor(), bool causal = false,
                     const Tensor& residual = Tensor());
  std::string type_name() const override { return "MultiheadAttention"; }
  std::shared_ptr<Module> clone() const override;
  std::int64_t embed_dim() const { return embed_dim_; }
  std::int64_t num_heads() const { return num_heads_; }
  std::shared_ptr<Linear> in_proj() const;
  std::shared_ptr<Linear> out_proj() const;
  // The "in_proj" child whatever its type (a QAT linear after prepare_qat).
  Module& in_proj_module() const { return child(0); }

 private:
  std::int64_t embed_dim_, num_heads_;
  double dropout_;
  bool bias_;
  Generator* gen_;
};

}  // namespace qgrad::nn
