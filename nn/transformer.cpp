#include "qgrad/nn/transformer.h"

#include <cmath>
#include <vector>

#include "qgrad/ops/factory.h"
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

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, shape_, weight_, bias_, eps_); }

RMSNorm::RMSNorm(Shape normalized_shape, std::optional<double> eps, bool elementwise_affine, TensorOptions options)
    : shape_(std::move(normalized_shape)), eps_(eps) {
  check_shape("RMSNorm", shape_);
  if (eps.has_value())
    QGRAD_CHECK(std::isfinite(*eps) && *eps > 0, "RMSNorm", "eps", "must be finite and > 0, got ", *eps);
  check_options("RMSNorm", options);
  options.requires_grad = false;
  if (elementwise_affine) weight_ = register_parameter("weight", ones(shape_, options));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, shape_, weight_, eps_); }

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

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight_, indices, padding_idx_); }

Dropout::Dropout(double p, Generator& gen) : p_(p), gen_(&gen) {
  QGRAD_CHECK(p >= 0.0 && p <= 1.0, "Dropout", "p", "probability must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), *gen_); }

Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate_); }

}  // namespace qgrad::nn
