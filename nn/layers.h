// Basic layers: Linear, ReLU, Sequential.
#pragma once

#include <memory>
#include <string>

#include "qgrad/nn/module.h"

namespace qgrad::nn {

// y = x W^T + b, W: [out, in], b: [out]. Initialised like PyTorch's
// nn.Linear (kaiming_uniform with a = sqrt(5)): W and b uniform in
// [-1/sqrt(in), 1/sqrt(in)), drawn from `gen` (weight first, then bias).
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, Generator& gen, bool bias = true,
         TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  Tensor forward_add(const Tensor& x, const Tensor& residual) override;  // linear_add
  std::string type_name() const override { return "Linear"; }
  std::shared_ptr<Module> clone() const override;
  std::vector<Tensor> compute_cast_parameters() const override { return {weight_, bias_}; }
  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }  // undefined without bias

 private:
  std::int64_t in_, out_;
  Tensor weight_, bias_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ReLU"; }
  std::shared_ptr<Module> clone() const override { return clone_into(std::make_shared<ReLU>()); }
};

// Runs its children in order. Children are named "0", "1", ... unless a
// name is given.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential& push_back(std::shared_ptr<Module> m);
  Sequential& push_back(const std::string& name, std::shared_ptr<Module> m);
  template <class M, class... Args>
  std::shared_ptr<M> emplace_back(Args&&... args) {
    auto m = std::make_shared<M>(std::forward<Args>(args)...);
    push_back(m);
    return m;
  }
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  std::shared_ptr<Module> clone() const override;
  std::size_t size() const { return named_children().size(); }
  const std::shared_ptr<Module>& operator[](std::size_t i) const { return named_children().at(i).second; }
  const std::string& name_at(std::size_t i) const { return named_children().at(i).first; }
  // Replaces child i (same name) / inserts a named child before index i.
  void set(std::size_t i, std::shared_ptr<Module> m) { replace_child(i, std::move(m)); }
  void insert(std::size_t i, const std::string& name, std::shared_ptr<Module> m) {
    insert_child(i, name, std::move(m));
  }
};

}  // namespace qgrad::nn
