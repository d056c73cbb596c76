// qgrad::Tensor: a handle to contiguous row-major storage under shared
// ownership, plus the autograd record that makes it part of a graph.
//
// Copies of a Tensor share data, like std::shared_ptr. Views (reshape,
// flatten) share storage and differ only in shape. All tensors are
// contiguous; ops that permute data (transpose) produce a new tensor.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "qgrad/core/device.h"
#include "qgrad/core/dtype.h"

namespace qgrad {

using Shape = std::vector<std::int64_t>;
std::string shape_str(const Shape& shape);
// Element count; throws qgrad::Error (naming `op`) when a dim is negative or
// the product overflows int64.
std::int64_t shape_numel(const Shape& shape, const char* op = "shape");

struct Storage {
  void* data = nullptr;
  std::size_t bytes = 0;
  Device device;
  Storage(std::size_t nbytes, Device dev);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

struct AutogradMeta;  // core/autograd_meta.h
struct Node;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::int64_t offset = 0;  // in elements (even for s4 / u4)
  Shape shape;
  std::int64_t numel = 0;
  DType dtype = DType::f32;
  std::shared_ptr<AutogradMeta> autograd;  // null: no grad, not part of a graph
};

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
  TensorOptions& with_dtype(DType d) { dtype = d; return *this; }
  TensorOptions& with_device(Device d) { device = d; return *this; }
};

class Tensor {
 public:
  Tensor() = default;  // undefined
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialised tensor (contents unspecified).
  static Tensor empty(const Shape& shape, TensorOptions options = {});

  // Host data in, host data out.
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu());
  template <class T>
  static Tensor scalar(T value, Device device = Device::cpu()) {
    return from_vector(std::vector<T>{value}, Shape{}, device);
  }
  template <class T>
  std::vector<T> to_vector() const;  // dtype must match T; copies to the host
  double item() const;               // one element, converted to double (host sync on CUDA)

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  std::int64_t dim() const { return static_cast<std::int64_t>(shape().size()); }
  std::int64_t size(std::int64_t axis) const;  // negative axes count from the end
  std::int64_t numel() const;
  DType dtype() const;
  Device device() const;
  bool is_cuda() const { return device().is_cuda(); }
  // Bytes of storage: numel * dtype_size, ceil(numel / 2) for s4 / u4.
  std::size_t nbytes() const { return dtype_bytes(dtype(), static_cast<std::size_t>(numel())); }

  void* data_ptr() const;
  template <class T>
  T* data() const {
    check_data_type(dtype_of<T>);
    return static_cast<T*>(data_ptr());
  }

  // Conversions (differentiable for floating dtypes). Return *this when
  // nothing changes. These four members and reshape run kernels and record
  // on the tape, so they are defined in the ops layer (ops/tensor_ops.cpp);
  // core's own sources never call them (the build's layer check links core
  // alone and would fail).
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }
  Tensor clone() const;  // a copy of the data, recorded on the tape
  // In-place copy of `src`'s values into this tensor's storage (same shape
  // and dtype; any devices). Not recorded on the tape.
  void copy_(const Tensor& src);
  // Shares storage; -1 in one position is inferred. Differentiable.
  Tensor reshape(const Shape& shape) const;
  Tensor flatten() const { return reshape({numel()}); }

  // ---- autograd ----
  bool requires_grad() const;
  // Marks a leaf as requiring grad (throws for non-leaves).
  Tensor& set_requires_grad(bool enabled = true);
  // A parameter is a leaf that requires grad and is drawn as such by to_dot.
  Tensor& set_parameter(const std::string& name);
  bool is_leaf() const;
  Tensor grad() const;  // undefined until a backward pass reaches it
  void set_grad(const Tensor& g);
  void zero_grad();     // drops the gradient (set to undefined)
  std::shared_ptr<Node> grad_fn() const;
  const std::string& name() const;
  Tensor& set_name(const std::string& name);
  // A tensor sharing data with this one but outside any graph.
  Tensor detach() const;
  // Runs the backward pass from this tensor. `grad` defaults to ones (a
  // scalar loss). The graph's saved state is freed unless retain_graph.
  // Defined in the autograd layer (autograd/engine.cpp).
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  AutogradMeta& autograd_meta() const;  // creates the record on first use

 private:
  void check_defined(const char* what) const;
  void check_data_type(DType t) const;
  std::shared_ptr<TensorImpl> impl_;
};

Tensor empty_like(const Tensor& t);

// A counter-based random generator: draw k of a seed is a pure function of
// (seed, element index), so CPU and CUDA produce the same values.
class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0x5eed) : seed_(seed) {}
  std::uint64_t seed() const { return seed_; }
  // Reserves n consecutive counters and returns the first.
  std::uint64_t advance(std::uint64_t n) {
    const std::uint64_t first = offset_;
    offset_ += n;
    return first;
  }
  void manual_seed(std::uint64_t seed) { seed_ = seed; offset_ = 0; }
  // The whole state is (seed, offset): the next draw uses counter offset().
  // set_state(g.seed(), g.offset()) makes another generator continue g's
  // sequence bit for bit (training resume: nn::generator_state).
  std::uint64_t offset() const { return offset_; }
  void set_state(std::uint64_t seed, std::uint64_t offset) { seed_ = seed; offset_ = offset; }

 private:
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};
Generator& default_generator();

}  // namespace qgrad
