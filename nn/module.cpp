#include "qgrad/nn/module.h"

#include <map>

#include "qgrad/autograd/node.h"
#include "qgrad/ops/elementwise.h"

namespace qgrad::nn {

void Module::check_new_name(const std::string& name) const {
  QGRAD_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module::register", "name",
              "name must be non-empty and contain no '.', got '", name, "'");
  auto taken = [&](const auto& list) {
    for (const auto& [n, v] : list)
      if (n == name) return true;
    return false;
  };
  QGRAD_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), "Module::register", "name", "name '", name,
              "' already registered in ", type_name());
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(name);
  QGRAD_CHECK(t.defined(), "Module::register_parameter", name, "undefined tensor");
  if (!t.requires_grad()) t.set_parameter(name);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name);
  QGRAD_CHECK(t.defined(), "Module::register_buffer", name, "undefined tensor");
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  QGRAD_CHECK(m != nullptr, "Module::register_module", name, "null module");
  children_.emplace_back(name, std::move(m));
}

void Module::replace_child(std::size_t index, std::shared_ptr<Module> m) {
  QGRAD_CHECK(index < children_.size() && m != nullptr, "Module::replace_child", "index", "no child ", index);
  children_[index].second = std::move(m);
}

Module& Module::child(std::size_t index) const {
  QGRAD_CHECK(index < children_.size(), "Module::child", "index", "no child ", index, " in ", type_name());
  return *children_[index].second;
}

std::optional<Tensor> Module::forward_with_next(const Tensor&, Module&) { return std::nullopt; }

Tensor Module::forward_add(const Tensor& x, const Tensor& residual) { return add(forward(x), residual); }

std::shared_ptr<Module> Module::clone() const {
  throw Error("Module::clone", type_name(), "a " + type_name() + " cannot be copied (it does not implement clone)");
}

void Module::copy_state_to(Module& copy) const {
  const char* op = "Module::clone";
  const auto same_names = [](const auto& a, const auto& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i].first != b[i].first) return false;
    return true;
  };
  QGRAD_CHECK(same_names(params_, copy.params_) && same_names(buffers_, copy.buffers_) &&
                  same_names(children_, copy.children_),
              op, type_name(), "the copy's parameters, buffers or children differ from the original's");
  for (std::size_t i = 0; i < children_.size(); ++i) copy.children_[i].second = children_[i].second->clone();
  NoGradGuard no_grad;
  const auto copy_values = [&](const NamedTensors& from, NamedTensors& to) {
    for (std::size_t i = 0; i < from.size(); ++i) {
      const Tensor& src = from[i].second;
      Tensor& dst = to[i].second;
      QGRAD_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), op, from[i].first,
                  "the copy's tensor is ", dtype_name(dst.dtype()), " ", shape_str(dst.shape()), ", the original's ",
                  dtype_name(src.dtype()), " ", shape_str(src.shape()));
      move_in_place(dst, src.device());
      dst.copy_(src);
    }
  };
  copy_values(params_, copy.params_);
  copy_values(buffers_, copy.buffers_);
  copy.training_ = training_;
  copy.compute_dtype_ = compute_dtype_;
}

void Module::insert_child(std::size_t index, const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  QGRAD_CHECK(index <= children_.size() && m != nullptr, "Module::insert_child", "index", "bad index ", index);
  children_.insert(children_.begin() + static_cast<std::ptrdiff_t>(index), {name, std::move(m)});
}

void Module::collect(const std::string& prefix, bool params, NamedTensors& out) const {
  for (const auto& [n, t] : params ? params_ : buffers_) out.emplace_back(prefix + n, t);
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", params, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out = named_parameters();
  for (auto& nb : named_buffers()) out.push_back(nb);
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  const char* op = "Module::load_state_dict";
  const NamedTensors mine = state_dict();
  std::map<std::string, Tensor> given;
  for (const auto& [n, t] : state) {
    QGRAD_CHECK(given.emplace(n, t).second, op, n, "duplicate entry");
  }
  // Validate everything before writing anything.
  for (const auto& [n, t] : mine) {
    auto it = given.find(n);
    if (it == given.end()) {
      QGRAD_CHECK(!strict, op, n, "missing from the state (model ", type_name(), ")");
      continue;
    }
    QGRAD_CHECK(it->second.defined(), op, n, "undefined tensor");
    QGRAD_CHECK(it->second.shape() == t.shape(), op, n, "shape ", shape_str(it->second.shape()),
                " does not match the model's ", shape_str(t.shape()));
    QGRAD_CHECK(it->second.dtype() == t.dtype(), op, n, "dtype ", dtype_name(it->second.dtype()),
                " does not match the model's ", dtype_name(t.dtype()));
  }
  if (strict) {
    for (const auto& [n, t] : state) {
      bool found = false;
      for (const auto& m : mine) found = found || m.first == n;
      QGRAD_CHECK(found, op, n, "unexpected entry: the model has no tensor of that name");
    }
  }
  for (const auto& [n, t] : mine) {
    auto it = given.find(n);
    if (it != given.end()) const_cast<Tensor&>(t).copy_(it->second);
  }
}

void move_in_place(Tensor& t, Device device) {
  if (!t.defined() || t.device() == device) return;
  Tensor moved = t.detach().to(device);
  TensorImpl* impl = t.impl();
  impl->storage = moved.impl()->storage;
  impl->offset = moved.impl()->offset;
  if (impl->autograd) {
    impl->autograd->grad = Tensor();
    impl->autograd->meta.device = device;
  }
}

void Module::to(Device device) {
  staged_casts_.clear();  // on the old device
  for (auto& [n, t] : params_) move_in_place(t, device);
  for (auto& [n, t] : buffers_) move_in_place(t, device);
  for (auto& [n, c] : children_) c->to(device);
}

void Module::train(bool on) {
  training_ = on;
  staged_casts_.clear();
  on_train(on);
  for (auto& [n, c] : children_) c->train(on);
}

void Module::set_compute_dtype(std::optional<DType> dtype) {
  QGRAD_CHECK(!dtype || is_floating(*dtype), "Module::set_compute_dtype", "dtype", "expected a floating dtype, got ",
              dtype_name(*dtype));
  compute_dtype_ = dtype;
  staged_casts_.clear();  // casts to the old compute dtype
  for (auto& [n, c] : children_) c->set_compute_dtype(dtype);
}

Tensor Module::to_compute(const Tensor& t) const {
  if (!compute_dtype_ || !t.defined() || !is_floating(t.dtype())) return t;
  for (auto it = staged_casts_.begin(); it != staged_casts_.end(); ++it)
    if (it->first == t.impl()) {
      Tensor cast = std::move(it->second);
      staged_casts_.erase(it);
      return cast;
    }
  return t.to(*compute_dtype_);
}

void stage_compute_casts(Module& root) {
  // Per compute dtype (a model has one): the parameters and their modules.
  struct Group {
    std::vector<Module*> owners;
    std::vector<Tensor> params;
  };
  std::map<DType, Group> groups;
  const auto visit = [&](auto&& self, Module& m) -> void {
    m.staged_casts_.clear();
    if (m.compute_dtype_)
      for (const Tensor& p : m.compute_cast_parameters())
        if (p.defined() && is_floating(p.dtype()) && p.dtype() != *m.compute_dtype_) {
          Group& g = groups[*m.compute_dtype_];
          g.owners.push_back(&m);
          g.params.push_back(p);
        }
    for (auto& [n, c] : m.children_) self(self, *c);
  };
  visit(visit, root);
  for (const auto& [dtype, g] : groups) {
    const std::vector<Tensor> casts = to_batch(g.params, dtype);
    for (std::size_t k = 0; k < casts.size(); ++k) g.owners[k]->staged_casts_.emplace_back(g.params[k].impl(), casts[k]);
  }
}

void Module::zero_grad() {
  for (auto& [n, t] : params_) t.zero_grad();
  for (auto& [n, c] : children_) c->zero_grad();
}

void for_each_module(Module& root, const std::function<void(Module&)>& f) {
  f(root);
  for (const auto& [name, child] : root.named_children()) for_each_module(*child, f);
}

}  // namespace qgrad::nn
