// qgrad::nn: modules with named parameters and buffers.
//
// A Module owns parameters (leaf tensors requiring grad), buffers (state
// that is saved but not trained: observer ranges, qparams) and child
// modules, each under a name; named_parameters() walks the tree and joins
// names with dots ("0.weight", "2.weight_fake_quant.scale"), in
// registration order. Tensors are handles: the module and an optimizer
// share them, and to(Device) moves each one in place (its storage is
// swapped), so an optimizer built before the move still sees the model.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qgrad/core/tensor.h"

namespace qgrad::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  // next.forward(forward(x)) as one fused computation, the same values and
  // gradients, when this module has one for that kind of `next` (a fused
  // Conv-BN-ReLU followed by a MaxPool2d: its activation fake quant and the
  // pooling as one op); std::nullopt otherwise, having run nothing.
  // Sequential::forward asks each child about the next child that is not
  // an Identity (the placeholders prepare_qat leaves).
  virtual std::optional<Tensor> forward_with_next(const Tensor& x, Module& next);
  // add(forward(x), residual): a residual connection's add. The linears
  // (Linear and the recipes' QAT linears) override it to run the add inside
  // their GEMM (linear_add: the residual added before the bias, the GEMM
  // epilogue's order, so the same values to rounding; the same gradients).
  virtual Tensor forward_add(const Tensor& x, const Tensor& residual);
  // A short type name ("Linear", "ReLU", ...), used by convert and errors.
  virtual std::string type_name() const = 0;

  NamedTensors named_parameters() const;  // recursive, "child.name"
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;     // recursive
  // Parameters then buffers: what a checkpoint of the model holds.
  NamedTensors state_dict() const;
  // Copies `state` into this model's tensors; every name must exist here
  // with the same shape and dtype (strict: no name may be missing or
  // extra). Throws qgrad::Error naming the entry.
  void load_state_dict(const NamedTensors& state, bool strict = true);
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  // Replaces child `index` (same name). Every module's forward reaches its
  // children through this list (never through a pointer of its own that the
  // replacement would leave stale), so the new child takes effect: this is
  // how prepare_qat swaps Linears nested at any depth (nn/recipes.h).
  void replace_child(std::size_t index, std::shared_ptr<Module> m);

  // A deep copy: a new module of the same type and configuration holding
  // copies of every parameter and buffer (same shapes, dtypes, devices; new
  // leaves, no gradients), each child cloned (so a replaced child is copied
  // as it is now), the same train/eval mode and compute dtype. Nothing is
  // shared with this module. The modules of layers.h, transformer.h,
  // recipes.h (8da8w) and vit.h implement it; any other module throws
  // qgrad::Error naming "Module::clone" and its type.
  virtual std::shared_ptr<Module> clone() const;

  // Moves every parameter and buffer to `device` in place (gradients drop).
  void to(Device device);
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();

  // Mixed precision (docs/design.md "Mixed precision"): with a compute dtype
  // set (e.g. DType::bf16), the modules that run matmuls (Linear,
  // QATLinear, Conv2d) and the norms (LayerNorm, RMSNorm) cast their input,
  // weight and bias to it for the forward, so their outputs, and the
  // activations after them, are in that dtype; the parameters stay in their
  // own dtype (f32 master weights, and so the optimizer state) and their
  // gradients flow back through the cast (Tensor::to's backward casts the
  // gradient to the parameter's dtype). Set on this module and every child
  // it has now (prepare_qat carries it from a Linear to its QATLinear);
  // std::nullopt turns it off. A floating dtype only.
  void set_compute_dtype(std::optional<DType> dtype);
  std::optional<DType> compute_dtype() const { return compute_dtype_; }
  // The parameters this module's forward casts to its compute dtype as they
  // are (to_compute(weight), ...): what stage_compute_casts casts ahead.
  // None by default; the modules that cast override it.
  virtual std::vector<Tensor> compute_cast_parameters() const { return {}; }

 protected:
  // Register and return the (shared) handle. Names must be unique and
  // contain no dot.
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  // Child `index`, as forward should reach it (see replace_child).
  Module& child(std::size_t index) const;
  // clone()'s second half: `copy` is a freshly constructed module of this
  // type and configuration (same parameter, buffer and child names); its
  // children become clones of this module's, its parameters and buffers
  // copies of this module's values (moved to their devices first), and it
  // takes this module's mode and compute dtype. Returns `copy`.
  template <class M>
  std::shared_ptr<M> clone_into(std::shared_ptr<M> copy) const {
    copy_state_to(*copy);
    return copy;
  }
  void insert_child(std::size_t index, const std::string& name, std::shared_ptr<Module> m);
  virtual void on_train(bool /*on*/) {}
  // t cast to the compute dtype (differentiable), when one is set and t is
  // defined and floating; t otherwise. A cast of t staged by
  // stage_compute_casts is handed out instead (once, then dropped).
  Tensor to_compute(const Tensor& t) const;

 private:
  void check_new_name(const std::string& name) const;
  void copy_state_to(Module& copy) const;
  void collect(const std::string& prefix, bool params, NamedTensors& out) const;
  NamedTensors params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  std::optional<DType> compute_dtype_;
  // stage_compute_casts' casts: (the parameter's tensor, its cast), each
  // handed out once by to_compute; dropped by the next staging, train(),
  // to(device) and set_compute_dtype.
  mutable std::vector<std::pair<const TensorImpl*, Tensor>> staged_casts_;
  friend void stage_compute_casts(Module& root);
};

// Mixed precision: every cast of a parameter to its module's compute dtype
// that the next forward runs (Module::compute_cast_parameters of each module
// of root's tree with a compute dtype) as one to_batch, one CUDA launch per
// device instead of a launch per parameter; each module's to_compute hands
// its cast out, once. The same values and gradients as the forward casting
// them itself (the gradients' casts back run in the backward's batch of
// parameter passes). Call it right before the forward, after the
// optimizer's step (it casts the parameters as they are when called); casts
// staged earlier and never taken are dropped first, and by train()/eval(),
// to(device) and set_compute_dtype.
void stage_compute_casts(Module& root);

// f(m) for root and every module below it, each parent before its children.
void for_each_module(Module& root, const std::function<void(Module&)>& f);

// Moves a tensor's data to `device` in place: every handle sharing it sees
// the move. Drops its gradient.
void move_in_place(Tensor& t, Device device);

}  // namespace qgrad::nn
