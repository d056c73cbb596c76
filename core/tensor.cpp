#include "qgrad/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "qgrad/core/autograd_meta.h"
#include "qgrad/core/memory.h"

namespace qgrad {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::int64_t shape_numel(const Shape& shape, const char* op) {
  // The product of the non-zero dims must fit int64 even when a zero dim
  // makes the count 0: every contiguous stride (a product of trailing
  // dims) then fits too.
  std::int64_t n = 1;
  bool empty = false;
  for (std::int64_t d : shape) {
    QGRAD_CHECK(d >= 0, op, "shape", "negative dimension in ", shape_str(shape));
    if (d == 0) {
      empty = true;
      continue;
    }
    QGRAD_CHECK(n <= std::numeric_limits<std::int64_t>::max() / d, op, "shape", "element count of ",
                shape_str(shape), " overflows int64");
    n *= d;
  }
  return empty ? 0 : n;
}

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::s8, DType::u8, DType::s32, DType::s64,
                  DType::boolean, DType::s4, DType::u4, DType::f8e4m3, DType::f8e5m2})
    if (name == dtype_name(t)) return t;
  throw Error("dtype_from_name", "name", "unknown dtype '" + name + "'");
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.find_first_not_of("0123456789", 5) == std::string::npos)
    return cuda(std::stoi(s.substr(5)));
  throw Error("Device::parse", "device", "expected 'cpu', 'cuda' or 'cuda:N', got '" + s + "'");
}

Storage::Storage(std::size_t nbytes, Device dev) : bytes(nbytes), device(dev) {
  if (dev.is_cuda()) {
    QGRAD_CHECK(dev.index >= 0 && dev.index < cuda_device_count(), "allocate", "device",
                cuda_device_count() == 0 ? std::string("no CUDA device is present")
                                         : "no CUDA device " + std::to_string(dev.index));
  }
  // No machine has more than 2^47 bytes of (user) address space: refuse
  // larger requests here, before the allocator's rounding could wrap.
  if (nbytes > (std::size_t{1} << 47))
    throw OutOfMemory("allocate", "bytes", detail::concat("cannot allocate ", nbytes, " bytes on ", dev.str()));
  data = memory::allocate(nbytes, dev);
}
Storage::~Storage() { memory::release(data, device); }

// ---- Tensor basics ----

void Tensor::check_defined(const char* what) const {
  QGRAD_CHECK(impl_ != nullptr, what, "tensor", "undefined tensor");
}
void Tensor::check_data_type(DType t) const {
  check_defined("Tensor::data");
  QGRAD_CHECK(impl_->dtype == t, "Tensor::data", "T", "tensor has dtype ", dtype_name(impl_->dtype),
              ", requested ", dtype_name(t));
}

Tensor Tensor::empty(const Shape& shape, TensorOptions options) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->numel = shape_numel(shape, "empty");
  impl->dtype = options.dtype;
  QGRAD_CHECK(static_cast<std::uint64_t>(impl->numel) <=
                  std::numeric_limits<std::size_t>::max() / dtype_size(options.dtype),
              "empty", "shape", "byte size of ", shape_str(shape), " overflows");
  impl->storage = std::make_shared<Storage>(dtype_bytes(options.dtype, static_cast<std::size_t>(impl->numel)),
                                            options.device);
  Tensor t(std::move(impl));
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

const Shape& Tensor::shape() const {
  check_defined("Tensor::shape");
  return impl_->shape;
}
std::int64_t Tensor::size(std::int64_t axis) const {
  const std::int64_t d = dim();
  QGRAD_CHECK(axis >= -d && axis < d, "Tensor::size", "axis", "axis ", axis, " out of range for rank ", d);
  return impl_->shape[static_cast<std::size_t>(axis < 0 ? axis + d : axis)];
}
std::int64_t Tensor::numel() const {
  check_defined("Tensor::numel");
  return impl_->numel;
}
DType Tensor::dtype() const {
  check_defined("Tensor::dtype");
  return impl_->dtype;
}
Device Tensor::device() const {
  check_defined("Tensor::device");
  return impl_->storage->device;
}
void* Tensor::data_ptr() const {
  check_defined("Tensor::data_ptr");
  // (A packed 4-bit tensor's offset is even: views share whole bytes.)
  return static_cast<char*>(impl_->storage->data) +
         static_cast<std::int64_t>(dtype_bytes(impl_->dtype, static_cast<std::size_t>(impl_->offset)));
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  const std::int64_t n = shape_numel(shape, "from_vector");
  QGRAD_CHECK(n == static_cast<std::int64_t>(values.size()), "from_vector", "values", values.size(),
              " values for shape ", shape_str(shape), " (", n, " elements)");
  Tensor t = empty(shape, TensorOptions{}.with_dtype(dtype_of<T>).with_device(device));
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<unsigned char> bytes(values.begin(), values.end());
    memory::copy(t.data_ptr(), device, bytes.data(), Device::cpu(), bytes.size());
  } else {
    memory::copy(t.data_ptr(), device, values.data(), Device::cpu(), values.size() * sizeof(T));
  }
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  check_data_type(dtype_of<T>);
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<unsigned char> bytes(static_cast<std::size_t>(numel()));
    memory::copy(bytes.data(), Device::cpu(), data_ptr(), device(), bytes.size());
    return std::vector<bool>(bytes.begin(), bytes.end());
  } else {
    std::vector<T> out(static_cast<std::size_t>(numel()));
    memory::copy(out.data(), Device::cpu(), data_ptr(), device(), out.size() * sizeof(T));
    return out;
  }
}

#define QGRAD_INSTANTIATE_HOST_IO(T)                                                      \
  template Tensor Tensor::from_vector<T>(const std::vector<T>&, const Shape&, Device); \
  template std::vector<T> Tensor::to_vector<T>() const;
QGRAD_INSTANTIATE_HOST_IO(float)
QGRAD_INSTANTIATE_HOST_IO(double)
QGRAD_INSTANTIATE_HOST_IO(half)
QGRAD_INSTANTIATE_HOST_IO(bfloat16)
QGRAD_INSTANTIATE_HOST_IO(std::int8_t)
QGRAD_INSTANTIATE_HOST_IO(std::uint8_t)
QGRAD_INSTANTIATE_HOST_IO(std::int32_t)
QGRAD_INSTANTIATE_HOST_IO(std::int64_t)
QGRAD_INSTANTIATE_HOST_IO(bool)
QGRAD_INSTANTIATE_HOST_IO(float8_e4m3)
QGRAD_INSTANTIATE_HOST_IO(float8_e5m2)
#undef QGRAD_INSTANTIATE_HOST_IO

double Tensor::item() const {
  QGRAD_CHECK(numel() == 1, "item", "tensor", "item() needs one element, tensor has shape ", shape_str(shape()));
  if (is_packed_int4(dtype())) {
    std::uint8_t byte = 0;
    memory::copy(&byte, Device::cpu(), data_ptr(), device(), 1);
    return static_cast<double>(nibble_get(&byte, 0, dtype() == DType::s4));
  }
  return dispatch_all(dtype(), "item", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T value;
    memory::copy(&value, Device::cpu(), data_ptr(), device(), sizeof(T));
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float8_e4m3> ||
                  std::is_same_v<T, float8_e5m2>)
      return static_cast<double>(static_cast<float>(value));
    else return static_cast<double>(value);
  });
}

void Tensor::copy_(const Tensor& src) {
  check_defined("copy_");
  QGRAD_CHECK(src.defined(), "copy_", "src", "undefined tensor");
  QGRAD_CHECK(src.shape() == shape(), "copy_", "src", "shape ", shape_str(src.shape()), " does not match ",
              shape_str(shape()));
  QGRAD_CHECK(src.dtype() == dtype(), "copy_", "src", "dtype ", dtype_name(src.dtype()), " does not match ",
              dtype_name(dtype()));
  memory::copy(data_ptr(), device(), src.data_ptr(), src.device(), nbytes());
}

// ---- autograd accessors ----

AutogradMeta& Tensor::autograd_meta() const {
  check_defined("autograd");
  if (!impl_->autograd) {
    impl_->autograd = std::make_shared<AutogradMeta>();
    impl_->autograd->meta = TensorMeta::of(*this);
  }
  return *impl_->autograd;
}

bool Tensor::requires_grad() const { return impl_ && impl_->autograd && impl_->autograd->requires_grad; }

Tensor& Tensor::set_requires_grad(bool enabled) {
  check_defined("set_requires_grad");
  QGRAD_CHECK(is_leaf(), "set_requires_grad", "tensor",
              "only leaf tensors can change requires_grad; use detach() for a non-leaf");
  QGRAD_CHECK(!enabled || is_floating(dtype()), "set_requires_grad", "tensor",
              "only floating tensors can require grad, got ", dtype_name(dtype()));
  autograd_meta().requires_grad = enabled;
  return *this;
}

Tensor& Tensor::set_parameter(const std::string& param_name) {
  set_requires_grad(true);
  autograd_meta().is_parameter = true;
  autograd_meta().name = param_name;
  return *this;
}

bool Tensor::is_leaf() const { return !impl_ || !impl_->autograd || !impl_->autograd->grad_fn; }
Tensor Tensor::grad() const { return impl_ && impl_->autograd ? impl_->autograd->grad : Tensor(); }
void Tensor::set_grad(const Tensor& g) {
  QGRAD_CHECK(!g.defined() || (g.shape() == shape() && g.device() == device()), "set_grad", "grad",
              "gradient must match the tensor's shape and device");
  autograd_meta().grad = g;
}
void Tensor::zero_grad() {
  if (impl_ && impl_->autograd) impl_->autograd->grad = Tensor();
}
std::shared_ptr<Node> Tensor::grad_fn() const { return impl_ && impl_->autograd ? impl_->autograd->grad_fn : nullptr; }
const std::string& Tensor::name() const {
  static const std::string none;
  return impl_ && impl_->autograd ? impl_->autograd->name : none;
}
Tensor& Tensor::set_name(const std::string& n) {
  autograd_meta().name = n;
  return *this;
}

Tensor Tensor::detach() const {
  check_defined("detach");
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->autograd = nullptr;
  return Tensor(std::move(impl));
}


Tensor empty_like(const Tensor& t) {
  return Tensor::empty(t.shape(), TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()));
}

Generator& default_generator() {
  static Generator g;
  return g;
}

}  // namespace qgrad
