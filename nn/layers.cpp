#include "qgrad/nn/layers.h"

#include <cmath>

#include "qgrad/ops/activation.h"
#include "qgrad/ops/factory.h"
#include "qgrad/ops/linalg.h"

namespace qgrad::nn {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, Generator& gen, bool bias, TensorOptions options)
    : in_(in_features), out_(out_features) {
  QGRAD_CHECK(in_features > 0, "Linear", "in_features", "must be > 0, got ", in_features);
  QGRAD_CHECK(out_features > 0, "Linear", "out_features", "must be > 0, got ", out_features);
  QGRAD_CHECK(is_floating(options.dtype), "Linear", "options", "dtype must be floating, got ",
              dtype_name(options.dtype));
  options.requires_grad = false;
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight_ = register_parameter("weight", rand({out_features, in_features}, gen, options, -bound, bound));
  if (bias) bias_ = register_parameter("bias", rand({out_features}, gen, options, -bound, bound));
}

Tensor Linear::forward(const Tensor& x) {
  return ::qgrad::linear(to_compute(x), to_compute(weight_), to_compute(bias_));
}

Tensor Linear::forward_add(const Tensor& x, const Tensor& residual) {
  return linear_add(to_compute(x), to_compute(weight_), to_compute(bias_), residual);
}

std::shared_ptr<Module> Linear::clone() const {
  Generator unused(0);  // the values are overwritten by the copy
  return clone_into(std::make_shared<Linear>(in_, out_, unused, bias_.defined(),
                                             TensorOptions{}.with_dtype(weight_.dtype())));
}

Tensor ReLU::forward(const Tensor& x) { return ::qgrad::relu(x); }

Sequential& Sequential::push_back(std::shared_ptr<Module> m) {
  return push_back(std::to_string(size()), std::move(m));
}

Sequential& Sequential::push_back(const std::string& name, std::shared_ptr<Module> m) {
  add_child(name, std::move(m));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  const auto& c = named_children();
  for (std::size_t i = 0; i < c.size(); ++i) {
    // The next child that computes something: prepare_qat leaves Identity
    // modules where it fused a BatchNorm2d and a ReLU into a conv.
    std::size_t j = i + 1;
    while (j < c.size() && c[j].second->type_name() == "Identity") ++j;
    if (j < c.size()) {
      if (std::optional<Tensor> fused = c[i].second->forward_with_next(h, *c[j].second)) {
        h = std::move(*fused);
        i = j;
        continue;
      }
    }
    h = c[i].second->forward(h);
  }
  return h;
}

std::shared_ptr<Module> Sequential::clone() const {
  auto copy = std::make_shared<Sequential>();
  for (const auto& [n, c] : named_children()) copy->push_back(n, c);  // replaced by clones in clone_into
  return clone_into(copy);
}

}  // namespace qgrad::nn
