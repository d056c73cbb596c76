// The Tensor members that run kernels or record on the tape (conversions,
// clone, reshape) and the factories: declared with Tensor in core/, defined
// here in the ops layer, the lowest layer that may do both.
#include <algorithm>
#include <cmath>

#include "qgrad/autograd/node.h"
#include "qgrad/core/memory.h"
#include "qgrad/kernels/basic.h"
#include "qgrad/kernels/deferred.h"
#include "qgrad/core/random.h"
#include "qgrad/ops/elementwise.h"
#include "qgrad/ops/factory.h"

namespace qgrad {

// ---- conversions and views ----

Tensor Tensor::to(Device dev) const {
  check_defined("to");
  if (dev == device()) return *this;
  Tensor out = empty(shape(), TensorOptions{}.with_dtype(dtype()).with_device(dev));
  memory::copy(out.data_ptr(), dev, data_ptr(), device(), nbytes());
  if (any_requires_grad({*this})) {
    const Device src = device();
    record("to_device", out, {*this}, [src](const Tensor& g) { return std::vector<Tensor>{g.to(src)}; });
  }
  return out;
}

namespace {

// The dtype conversion's backward: the gradient converted back to x's dtype;
// for a leaf (a mixed-precision parameter) the pass joins the backward's
// batch of parameter passes (autograd/node.h deferred_gradient_passes).
void record_cast_backward(Tensor& out, const Tensor& x) {
  const bool deferrable = gradient_deferrable(x);
  record("to_dtype", out, {x}, [src = x.dtype(), deferrable](const Tensor& g) {
    Tensor dx = Tensor::empty(g.shape(), TensorOptions{}.with_dtype(src).with_device(g.device()));
    kernels::cast_gradient(g, dx, deferrable ? deferred_gradient_passes() : nullptr);
    return std::vector<Tensor>{dx};
  });
  // Into a leaf (or a cast of one): g is read only by the queued cast, so a
  // rule above may leave g's last pass queued too (a mixed-precision bias's
  // column-sum finish, a norm's parameter gradients).
  out.grad_fn()->reads_gradient_deferred = deferrable;
}

}  // namespace

Tensor Tensor::to(DType dt) const {
  check_defined("to");
  if (dt == dtype()) return *this;
  Tensor out = empty(shape(), TensorOptions{}.with_dtype(dt).with_device(device()));
  kernels::cast(*this, out);
  if (is_floating(dtype()) && is_floating(dt) && any_requires_grad({*this})) record_cast_backward(out, *this);
  return out;
}

std::vector<Tensor> to_batch(const std::vector<Tensor>& xs, DType dtype) {
  const char* op = "to_batch";
  for (std::size_t i = 0; i < xs.size(); ++i)
    QGRAD_CHECK(xs[i].defined(), op, ("xs[" + std::to_string(i) + "]").c_str(), "undefined tensor");
  std::vector<Tensor> out(xs.size());
  std::vector<std::size_t> queued;  // the floating conversions, recorded once they ran
  kernels::DeferredPasses casts;    // the forward's own queue: one launch per device
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    if (x.dtype() == dtype || !is_floating(x.dtype()) || !is_floating(dtype)) {
      out[i] = x.to(dtype);  // as is, or the conversion with no gradient
    } else {
      out[i] = Tensor::empty(x.shape(), TensorOptions{}.with_dtype(dtype).with_device(x.device()));
      casts.cast(x, out[i]);
      queued.push_back(i);
    }
  }
  casts.flush();
  for (const std::size_t i : queued)
    if (any_requires_grad({xs[i]})) record_cast_backward(out[i], xs[i]);
  return out;
}

Tensor Tensor::clone() const {
  check_defined("clone");
  Tensor out = empty(shape(), TensorOptions{}.with_dtype(dtype()).with_device(device()));
  memory::copy(out.data_ptr(), device(), data_ptr(), device(), nbytes());
  if (any_requires_grad({*this}))
    record("clone", out, {*this}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}


Tensor Tensor::reshape(const Shape& new_shape_in) const {
  check_defined("reshape");
  Shape new_shape = new_shape_in;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < new_shape.size(); ++i) {
    if (new_shape[i] == -1) {
      QGRAD_CHECK(infer < 0, "reshape", "shape", "only one dimension may be -1 in ", shape_str(new_shape_in));
      infer = static_cast<int>(i);
    } else {
      QGRAD_CHECK(new_shape[i] >= 0, "reshape", "shape", "negative dimension in ", shape_str(new_shape_in));
      known = shape_numel({known, new_shape[i]}, "reshape");
    }
  }
  if (infer >= 0) {
    QGRAD_CHECK(known != 0 && numel() % known == 0, "reshape", "shape", "cannot infer -1 in ",
                shape_str(new_shape_in), " for ", numel(), " elements");
    new_shape[static_cast<std::size_t>(infer)] = numel() / known;
  }
  QGRAD_CHECK(shape_numel(new_shape, "reshape") == numel(), "reshape", "shape", "shape ",
              shape_str(new_shape_in), " does not hold ", numel(), " elements of ", shape_str(shape()));
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->shape = new_shape;
  impl->autograd = nullptr;
  Tensor out(std::move(impl));
  if (any_requires_grad({*this})) {
    const Shape old = shape();
    record("reshape", out, {*this}, [old](const Tensor& g) { return std::vector<Tensor>{g.reshape(old)}; });
  }
  return out;
}

// ---- factories ----

Tensor full(const Shape& shape, double value, TensorOptions options) {
  const bool rg = options.requires_grad;
  options.requires_grad = false;
  Tensor t = Tensor::empty(shape, options);
  kernels::fill(t, value);
  if (rg) t.set_requires_grad(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), TensorOptions{}.with_dtype(t.dtype()).with_device(t.device())); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), TensorOptions{}.with_dtype(t.dtype()).with_device(t.device())); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  QGRAD_CHECK(step != 0 && std::isfinite(step), "arange", "step", "step must be finite and non-zero");
  QGRAD_CHECK(std::isfinite(start) && std::isfinite(end), "arange", "start", "bounds must be finite");
  const double count = std::ceil((end - start) / step);
  // (A count beyond int64 cannot be converted; one beyond 2^62 cannot be allocated anyway.)
  QGRAD_CHECK(!(count > 0x1p62), "arange", "end", "[", start, ", ", end, ") in steps of ", step,
              " has too many elements");
  const auto n = static_cast<std::int64_t>(count > 0 ? count : 0);
  Tensor t = Tensor::empty({n}, options);
  kernels::arange(t, start, step);
  return t;
}


Tensor rand(const Shape& shape, Generator& gen, TensorOptions options, double low, double high) {
  QGRAD_CHECK(std::isfinite(low) && std::isfinite(high) && low < high, "rand", "low", "need finite low < high");
  const bool rg = options.requires_grad;
  options.requires_grad = false;
  Tensor t = Tensor::empty(shape, options);
  kernels::rand_uniform(t, gen.seed(), gen.advance(static_cast<std::uint64_t>(t.numel())), low, high);
  if (rg) t.set_requires_grad(true);
  return t;
}

Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, Generator& gen, TensorOptions options) {
  QGRAD_CHECK(low < high, "randint", "high", "need low < high");
  // The host buffer first: a shape too large fails here with qgrad::Error.
  Tensor host = Tensor::empty(shape, TensorOptions{}.with_dtype(DType::s64));
  const std::int64_t n = host.numel();
  const std::uint64_t first = gen.advance(static_cast<std::uint64_t>(n));
  // high - low in uint64 (it may exceed int64); a draw rounded up to the
  // span is clamped back into [low, high).
  const std::uint64_t span = static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low);
  std::int64_t* v = host.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const double u = formulas::random_uniform(gen.seed(), first + static_cast<std::uint64_t>(i));
    const std::uint64_t r = std::min(static_cast<std::uint64_t>(std::floor(static_cast<double>(span) * u)), span - 1);
    v[i] = static_cast<std::int64_t>(static_cast<std::uint64_t>(low) + r);
  }
  return host.to(options.dtype).to(options.device);
}

// Box-Muller on the host in double: device math libraries are not bitwise
// equal to glibc's log/cos, so normals are drawn here and copied, which
// keeps CPU and CUDA values identical.
Tensor randn(const Shape& shape, Generator& gen, TensorOptions options, double mean, double stddev) {
  QGRAD_CHECK(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0, "randn", "stddev",
              "need finite mean and stddev >= 0");
  // The host buffer first: a shape too large fails here with qgrad::Error.
  Tensor host = Tensor::empty(shape, TensorOptions{}.with_dtype(DType::f64));
  const std::int64_t n = host.numel();
  const std::uint64_t first = gen.advance(2 * ((static_cast<std::uint64_t>(n) + 1) / 2));
  double* v = host.data<double>();
  for (std::int64_t i = 0; i < n; i += 2) {
    const std::uint64_t c = first + static_cast<std::uint64_t>(i);
    const double u1 = 1.0 - formulas::random_uniform(gen.seed(), c);  // (0, 1]
    const double u2 = formulas::random_uniform(gen.seed(), c + 1);
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 6.283185307179586 * u2;
    v[i] = mean + stddev * r * std::cos(theta);
    if (i + 1 < n) v[i + 1] = mean + stddev * r * std::sin(theta);
  }
  const bool rg = options.requires_grad;
  Tensor out = Tensor::empty(shape, TensorOptions{}.with_dtype(options.dtype).with_device(Device::cpu()));
  kernels::cast(host, out);
  out = out.to(options.device);
  if (rg) out.set_requires_grad(true);
  return out;
}

}  // namespace qgrad
