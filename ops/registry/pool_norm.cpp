// Registry entries: pooling (max, average, adaptive average), batch_norm,
// batch_norm_relu, channel_div_add, channel_div_add_batch_norm and flatten
// (ops/pool_norm.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};
using Tensors = std::vector<Tensor>;

// Global average pooling of planes longer than 128 elements takes the CUDA
// block reduction (kernels/cuda/reduce.cu): the tolerances of sum.
Promise summation_order(const char* what) { return Promise::within(1e-12, 1e-5, 1e-2, 1e-2, what); }

// Distinct values (k - n / 2) / 32 in a seeded random order: exact in every
// floating dtype (n <= 512), 1/32 apart, so max_pool2d has no ties and its
// finite differences (and the lower-precision sweep) see one argmax.
Tensor distinct(const Shape& shape, Generator& g, Device d, DType dt) {
  const std::int64_t n = shape_numel(shape);
  const std::vector<double> keys = rand({n}, g, on(Device::cpu(), DType::f64)).to_vector<double>();
  std::vector<std::size_t> order(keys.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  std::vector<double> v(keys.size());
  for (std::size_t j = 0; j < order.size(); ++j) v[order[j]] = (static_cast<double>(j) - static_cast<double>(n / 2)) / 32;
  return leaf(Tensor::from_vector(v, shape).to(dt).to(d));
}

Tensor plain(const Shape& shape, Generator& g, Device d, DType dt, double lo, double hi) {
  return rand(shape, g, on(d, dt), lo, hi);
}

// The other device, when a GPU is present (mismatched-device cases).
bool has_other(Device d) { return cuda_device_count() > 0 || d.is_cuda(); }
Device other(Device d) { return d.is_cuda() ? Device::cpu() : Device::cuda(0); }

// The argument errors of max_pool2d, max_pool2d_with_indices and avg_pool2d
// (f(x, kernel, stride, padding, dilation)).
using PoolFn = std::function<void(const Tensor&, Size2, std::optional<Size2>, Size2, Size2)>;
std::vector<BadInput> pool_errors(const char* op, Device d, PoolFn f, bool dilation) {
  const Tensor x = some({2, 3, 7, 8}, d);
  std::vector<BadInput> c{
      {op, "x", [=] { f(Tensor(), 2, std::nullopt, 0, 1); }},
      {op, "x", [=] { f(some({2, 3, 7, 8}, d, DType::s32), 2, std::nullopt, 0, 1); }},
      {op, "x", [=] { f(some({3, 7, 8}, d), 2, std::nullopt, 0, 1); }},        // rank 3
      {op, "x", [=] { f(some({1, 2, 3, 7, 8}, d), 2, std::nullopt, 0, 1); }},  // rank 5
      {op, "x", [=] { f(some({0, 3, 7, 8}, d), 2, std::nullopt, 0, 1); }},     // empty
      {op, "kernel_size", [=] { f(x, 0, std::nullopt, 0, 1); }},
      {op, "kernel_size", [=] { f(x, {2, -1}, std::nullopt, 0, 1); }},
      {op, "stride", [=] { f(x, 2, Size2{0}, 0, 1); }},
      {op, "stride", [=] { f(x, 2, Size2{1, -2}, 0, 1); }},
      {op, "padding", [=] { f(x, 3, std::nullopt, 2, 1); }},  // > kernel / 2
      {op, "padding", [=] { f(x, {3, 4}, std::nullopt, {1, 3}, 1); }},
      {op, "padding", [=] { f(x, 3, std::nullopt, -1, 1); }},
      {op, "kernel_size", [=] { f(x, {8, 2}, std::nullopt, 0, 1); }},            // 8 rows > 7
      {op, "kernel_size", [=] { f(some({1, 1, 2, 2}, d), 5, 1, 1, 1); }},        // 5 > 2 + 2 * 1
      {op, "kernel_size", [=] { f(some({1, 1, 2, 2}, d), {3, 7}, 1, 1, 1); }},   // 7 > 2 + 2 * 1
      {op, "stride", [=] { f(x, 2, Size2{std::int64_t(1) << 40}, 0, 1); }},
  };
  if (dilation) {
    c.push_back({op, "dilation", [=] { f(x, 2, std::nullopt, 0, 0); }});
    c.push_back({op, "dilation", [=] { f(x, 2, std::nullopt, 0, {1, -1}); }});
    c.push_back({op, "kernel_size", [=] { f(some({1, 1, 3, 3}, d), 2, 1, 0, 4); }});  // spans 5 > 3
  }
  return c;
}

using BatchNormFn = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double,
                               double, const Tensor&);

// The bad inputs of batch_norm and batch_norm_relu (`fn`, named `op`).
std::vector<BadInput> norm_errors(Device d, const char* op, BatchNormFn fn) {
  // fn with batch_norm's defaults for momentum and eps.
  const auto bn = [](BatchNormFn f, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm,
                     const Tensor& rv, bool training, double momentum = 0.1, double eps = 1e-5,
                     const Tensor& count = Tensor()) { return f(x, w, b, rm, rv, training, momentum, eps, count); };
  const auto counter = [](Device dev, DType dt, std::int64_t n) {
    return zeros({n}, TensorOptions{}.with_dtype(dt).with_device(dev));
  };
  const Tensor x = some({4, 3, 2, 2}, d), w = some({3}, d), b = some({3}, d);
  const Tensor rm = some({3}, d), rv = full({3}, 1.0, on(d)), u;
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  std::vector<BadInput> c{
      {op, "x", [=] { bn(fn, u, w, b, rm, rv, true); }},
      {op, "x", [=] { bn(fn, some({4, 3}, d, DType::s32), u, u, u, u, true); }},
      {op, "x", [=] { bn(fn, some({3}, d), u, u, u, u, true); }},  // rank 1
      {op, "x", [=] { bn(fn, some({0, 3, 2}, d), u, u, u, u, true); }},  // empty
      {op, "x", [=] { bn(fn, some({1, 3}, d), w, b, rm, rv, true); }},  // one value per channel
      {op, "weight", [=] { bn(fn, x, some({4}, d), b, rm, rv, true); }},
      {op, "weight", [=] { bn(fn, x, some({3, 1}, d), b, rm, rv, true); }},
      {op, "weight", [=] { bn(fn, x, some({3}, d, DType::f64), b, rm, rv, true); }},
      {op, "weight", [=] { bn(fn, x, some({3}, d, DType::s32), b, rm, rv, true); }},
      {op, "bias", [=] { bn(fn, x, w, some({2}, d), rm, rv, true); }},
      {op, "bias", [=] { bn(fn, x, w, some({3}, d, DType::f16), rm, rv, false); }},
      {op, "running_mean", [=] { bn(fn, x, w, b, some({4}, d), rv, true); }},
      {op, "running_mean", [=] { bn(fn, x, w, b, some({3}, d, DType::s32), rv, true); }},
      {op, "running_var", [=] { bn(fn, x, w, b, rm, some({2}, d), true); }},
      {op, "running_var", [=] { bn(fn, x, w, b, rm, some({3}, d, DType::f64), false); }},
      {op, "running_var", [=] { bn(fn, x, w, b, rm, u, true); }},
      {op, "running_mean", [=] { bn(fn, x, w, b, u, rv, true); }},
      {op, "running_mean", [=] { bn(fn, x, w, b, u, u, false); }},  // evaluation needs them
      {op, "running_mean", [=] { bn(fn, x, w, b, leaf(some({3}, d)), rv, true); }},
      {op, "running_var", [=] { bn(fn, x, w, b, rm, leaf(full({3}, 1.0, on(d))), true); }},
      {op, "momentum", [=] { bn(fn, x, w, b, rm, rv, true, -0.1); }},
      {op, "momentum", [=] { bn(fn, x, w, b, rm, rv, true, 1.5); }},
      {op, "momentum", [=] { bn(fn, x, w, b, rm, rv, true, kNaN); }},
      {op, "eps", [=] { bn(fn, x, w, b, rm, rv, true, 0.1, 0.0); }},
      {op, "eps", [=] { bn(fn, x, w, b, rm, rv, false, 0.1, -1e-5); }},
      {op, "eps", [=] { bn(fn, x, w, b, rm, rv, true, 0.1, kNaN); }},
      {op, "num_batches_tracked", [=] { bn(fn, x, w, b, rm, rv, true, 0.1, 1e-5, counter(d, DType::s32, 1)); }},
      {op, "num_batches_tracked", [=] { bn(fn, x, w, b, rm, rv, true, 0.1, 1e-5, counter(d, DType::s64, 2)); }},
      {op, "num_batches_tracked", [=] { bn(fn, x, w, b, u, u, true, 0.1, 1e-5, counter(d, DType::s64, 1)); }},
  };
  if (has_other(d)) {
    const Device o = other(d);
    c.push_back({op, "weight", [=] { bn(fn, x, some({3}, o), b, rm, rv, true); }});
    c.push_back({op, "bias", [=] { bn(fn, x, w, some({3}, o), rm, rv, true); }});
    c.push_back({op, "running_mean", [=] { bn(fn, x, w, b, some({3}, o), rv, true); }});
    c.push_back({op, "running_var", [=] { bn(fn, x, w, b, rm, full({3}, 1.0, on(o)), false); }});
    c.push_back(
        {op, "num_batches_tracked", [=] { bn(fn, x, w, b, rm, rv, true, 0.1, 1e-5, counter(o, DType::s64, 1)); }});
  }
  return c;
}

std::vector<BadInput> batch_norm_errors(Device d) { return norm_errors(d, "batch_norm", batch_norm); }

// channel_div_add_batch_norm with relu and a valid divisor of 1.5 (x's
// channels, dtype and device where x has them): batch_norm's bad inputs.
Tensor div_add_batch_norm_relu(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm, const Tensor& rv,
                               bool training, double momentum, double eps, const Tensor& count) {
  const bool usable = x.defined() && x.dim() >= 2 && is_floating(x.dtype());
  const Tensor divisor = full({usable ? x.size(1) : 3}, 1.5,
                              TensorOptions{}
                                  .with_dtype(usable ? x.dtype() : DType::f32)
                                  .with_device(x.defined() ? x.device() : Device::cpu()));
  return channel_div_add_batch_norm(x, divisor, Tensor(), w, b, rm, rv, training, true, momentum, eps, count);
}

std::vector<BadInput> div_add_batch_norm_errors(Device d) {
  constexpr const char* op = "channel_div_add_batch_norm";
  std::vector<BadInput> c = norm_errors(d, op, div_add_batch_norm_relu);
  const Tensor x = some({4, 3, 2, 2}, d), c3 = full({3}, 1.5, on(d)), rm = some({3}, d), rv = full({3}, 1.0, on(d));
  const auto f = [=](const Tensor& divisor, const Tensor& shift) {
    channel_div_add_batch_norm(x, divisor, shift, Tensor(), Tensor(), rm, rv, true, false);
  };
  c.push_back({op, "divisor", [=] { f(Tensor(), Tensor()); }});
  c.push_back({op, "divisor", [=] { f(full({4}, 1.5, on(d)), Tensor()); }});
  c.push_back({op, "divisor", [=] { f(full({3}, 1.5, on(d, DType::f64)), Tensor()); }});
  c.push_back({op, "shift", [=] { f(c3, full({3, 1}, 1.0, on(d))); }});
  c.push_back({op, "shift", [=] { f(c3, some({3}, d, DType::s32)); }});
  if (has_other(d)) {
    c.push_back({op, "divisor", [=] { f(full({3}, 1.5, on(other(d))), Tensor()); }});
    c.push_back({op, "shift", [=] { f(c3, full({3}, 1.0, on(other(d)))); }});
  }
  return c;
}
// fake_quantize_max_pool2d: the pooling's argument errors (with valid
// qparams) and the per-tensor qparams' (with a valid pooling).
std::vector<BadInput> fq_max_pool_errors(Device d) {
  constexpr const char* op = "fake_quantize_max_pool2d";
  const Tensor s1 = full({1}, 0.125, on(d)), z1 = full({1}, 3.0, on(d, DType::s32));
  std::vector<BadInput> c = pool_errors(
      op, d,
      [=](const Tensor& x, Size2 k, std::optional<Size2> s, Size2 p, Size2 dl) {
        fake_quantize_max_pool2d(x, s1, z1, -128, 127, k, s, p, dl);
      },
      true);
  const Tensor x = some({2, 3, 4, 4}, d);
  const auto f = [=](const Tensor& s, const Tensor& z, std::int64_t qmin, std::int64_t qmax) {
    fake_quantize_max_pool2d(x, s, z, qmin, qmax, 2);
  };
  c.push_back({op, "scale", [=] { f(Tensor(), z1, -128, 127); }});
  c.push_back({op, "scale", [=] { f(s1.to(DType::f64), z1, -128, 127); }});
  c.push_back({op, "scale", [=] { f(full({2}, 0.125, on(d)), z1, -128, 127); }});
  c.push_back({op, "zero_point", [=] { f(s1, z1.to(DType::s64), -128, 127); }});
  c.push_back({op, "zero_point", [=] { f(s1, full({2}, 3.0, on(d, DType::s32)), -128, 127); }});
  c.push_back({op, "qmax", [=] { f(s1, z1, 5, 5); }});
  c.push_back({op, "qmin", [=] { f(s1, z1, -(std::int64_t{1} << 40), 127); }});
  c.push_back({op, "scale", [=] { f(full({1}, 0.0, on(d)), z1, -128, 127); }, true});
  c.push_back({op, "scale", [=] { f(full({1}, NAN, on(d)), z1, -128, 127); }, true});
  c.push_back({op, "zero_point", [=] { f(s1, full({1}, 300.0, on(d, DType::s32)), -128, 127); }, true});
  if (has_other(d)) {
    c.push_back({op, "scale", [=] { f(full({1}, 0.125, on(other(d))), z1, -128, 127); }});
    c.push_back({op, "zero_point", [=] { f(s1, full({1}, 3.0, on(other(d), DType::s32)), -128, 127); }});
  }
  return c;
}

std::vector<BadInput> batch_norm_relu_errors(Device d) { return norm_errors(d, "batch_norm_relu", batch_norm_relu); }

// batch_norm_relu_fake_quantize_max_pool2d with a valid divisor of 1.5,
// qparams and 2 x 2 pooling, no observer: batch_norm's bad inputs.
Tensor bn_fq_pool_as_bn(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm, const Tensor& rv,
                        bool training, double momentum, double eps, const Tensor& count) {
  const bool usable = x.defined() && x.dim() >= 2 && is_floating(x.dtype());
  const Device dev = x.defined() ? x.device() : Device::cpu();
  const BatchNormArgs a{.divisor = full({usable ? x.size(1) : 3}, 1.5, on(dev, usable ? x.dtype() : DType::f32)),
                        .weight = w,
                        .bias = b,
                        .running_mean = rm,
                        .running_var = rv,
                        .num_batches_tracked = count,
                        .training = training,
                        .momentum = momentum,
                        .eps = eps};
  return batch_norm_relu_fake_quantize_max_pool2d(x, a, full({1}, 0.125, on(dev)), full({1}, 3.0, on(dev, DType::s32)),
                                                  0, 255, MaxPool2dArgs{});
}

// Its bad inputs: batch_norm's, the divisor's and shift's, the pooling's,
// the qparams' and the observer's.
std::vector<BadInput> bn_fq_pool_errors(Device d) {
  constexpr const char* op = "batch_norm_relu_fake_quantize_max_pool2d";
  std::vector<BadInput> c = norm_errors(d, op, bn_fq_pool_as_bn);
  const Tensor rm = some({3}, d), rv = full({3}, 1.0, on(d)), c3 = full({3}, 1.5, on(d));
  const Tensor s1 = full({1}, 0.125, on(d)), z1 = full({1}, 3.0, on(d, DType::s32));
  const auto args = [=](const Tensor& divisor, const Tensor& shift) {
    return BatchNormArgs{.divisor = divisor, .shift = shift, .running_mean = rm, .running_var = rv};
  };
  const auto f = [=](const Tensor& x, const BatchNormArgs& a, const Tensor& s, const Tensor& z, std::int64_t qmin,
                     std::int64_t qmax, const MaxPool2dArgs& p, const ObserverUpdate* obs) {
    batch_norm_relu_fake_quantize_max_pool2d(x, a, s, z, qmin, qmax, p, obs);
  };
  const Tensor x = some({2, 3, 4, 4}, d);
  const BatchNormArgs plain_args = args(c3, Tensor());
  c.push_back({op, "divisor", [=] { f(x, args(full({4}, 1.5, on(d)), Tensor()), s1, z1, 0, 255, {}, nullptr); }});
  c.push_back({op, "divisor", [=] { f(x, args(full({3}, 1.5, on(d, DType::f64)), Tensor()), s1, z1, 0, 255, {}, nullptr); }});
  c.push_back({op, "shift", [=] { f(x, args(c3, full({3, 1}, 1.0, on(d))), s1, z1, 0, 255, {}, nullptr); }});
  c.push_back({op, "shift", [=] { f(x, args(c3, some({3}, d, DType::s32)), s1, z1, 0, 255, {}, nullptr); }});
  // The pooling (x of rank 3 passes batch_norm's checks, not the pooling's).
  c.push_back({op, "x", [=] { f(some({2, 3, 4}, d), plain_args, s1, z1, 0, 255, {}, nullptr); }});
  c.push_back({op, "kernel_size", [=] { f(x, plain_args, s1, z1, 0, 255, MaxPool2dArgs{0}, nullptr); }});
  c.push_back({op, "kernel_size", [=] { f(x, plain_args, s1, z1, 0, 255, MaxPool2dArgs{5}, nullptr); }});
  c.push_back({op, "stride", [=] { f(x, plain_args, s1, z1, 0, 255, MaxPool2dArgs{2, Size2{0}}, nullptr); }});
  c.push_back({op, "padding", [=] { f(x, plain_args, s1, z1, 0, 255, MaxPool2dArgs{2, std::nullopt, 2}, nullptr); }});
  c.push_back(
      {op, "dilation", [=] { f(x, plain_args, s1, z1, 0, 255, MaxPool2dArgs{2, std::nullopt, 0, 0}, nullptr); }});
  // The qparams.
  c.push_back({op, "scale", [=] { f(x, plain_args, Tensor(), z1, 0, 255, {}, nullptr); }});
  c.push_back({op, "scale", [=] { f(x, plain_args, s1.to(DType::f64), z1, 0, 255, {}, nullptr); }});
  c.push_back({op, "scale", [=] { f(x, plain_args, full({2}, 0.125, on(d)), z1, 0, 255, {}, nullptr); }});
  c.push_back({op, "zero_point", [=] { f(x, plain_args, s1, z1.to(DType::s64), 0, 255, {}, nullptr); }});
  c.push_back({op, "qmax", [=] { f(x, plain_args, s1, z1, 5, 5, {}, nullptr); }});
  c.push_back({op, "scale", [=] { f(x, plain_args, full({1}, 0.0, on(d)), z1, 0, 255, {}, nullptr); }, true});
  c.push_back({op, "zero_point", [=] { f(x, plain_args, s1, full({1}, 300.0, on(d, DType::s32)), 0, 255, {}, nullptr); },
               true});
  // The observer's range.
  const auto observer = [=](const Tensor& lo, const Tensor& hi, double c_avg) {
    return ObserverUpdate{lo, hi, c_avg, false, 0};
  };
  const Tensor lo = full({1}, INFINITY, on(d)), hi = full({1}, -INFINITY, on(d));
  const auto g = [=](const ObserverUpdate& u) { f(x, plain_args, s1, z1, 0, 255, {}, &u); };
  c.push_back({op, "run_min", [=] { g(observer(lo.to(DType::f64), hi, 0.01)); }});
  c.push_back({op, "run_min", [=] { g(observer(full({3}, INFINITY, on(d)), hi, 0.01)); }});
  c.push_back({op, "run_max", [=] { g(observer(lo, Tensor(), 0.01)); }});
  c.push_back({op, "averaging_constant", [=] { g(observer(lo, hi, 1.5)); }});
  c.push_back({op, "averaging_constant", [=] { g(observer(lo, hi, std::numeric_limits<double>::quiet_NaN())); }});
  if (has_other(d)) {
    const Device o = other(d);
    c.push_back({op, "divisor", [=] { f(x, args(full({3}, 1.5, on(o)), Tensor()), s1, z1, 0, 255, {}, nullptr); }});
    c.push_back({op, "scale", [=] { f(x, plain_args, full({1}, 0.125, on(o)), z1, 0, 255, {}, nullptr); }});
    c.push_back({op, "run_min", [=] { g(observer(full({1}, INFINITY, on(o)), hi, 0.01)); }});
  }
  return c;
}

}  // namespace

std::vector<OpEntry> pool_norm_entries() {
  std::vector<OpEntry> e;
  const PoolFn max_fn = [](const Tensor& x, Size2 k, std::optional<Size2> s, Size2 p, Size2 dl) {
    max_pool2d(x, k, s, p, dl);
  };
  const PoolFn max_idx_fn = [](const Tensor& x, Size2 k, std::optional<Size2> s, Size2 p, Size2 dl) {
    max_pool2d_with_indices(x, k, s, p, dl);
  };
  const PoolFn avg_fn = [](const Tensor& x, Size2 k, std::optional<Size2> s, Size2 p, Size2) {
    avg_pool2d(x, k, s, p);
  };

  // Overlapping windows (kernel 3 x 2, stride 2 x 1, padding 1), ceil_mode;
  // both functions, the indices compared across devices too.
  e.push_back({"max_pool2d", {"max_pool2d", "max_pool2d_with_indices"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{distinct({2, 3, 7, 8}, g, d, dt)}; },
               [](const Tensors& v) {
                 const MaxPool2dResult r = max_pool2d_with_indices(v[0], {3, 2}, Size2{2, 1}, {1, 1}, 1, true);
                 return Tensors{add(max_pool2d(v[0], {3, 2}, Size2{2, 1}, {1, 1}, 1, true), r.output), r.indices};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {},
               [max_fn, max_idx_fn](Device d) {
                 std::vector<BadInput> c = pool_errors("max_pool2d", d, max_fn, true);
                 for (BadInput& b : pool_errors("max_pool2d_with_indices", d, max_idx_fn, true)) c.push_back(b);
                 return c;
               }});
  // fake_quantize_max_pool2d: tiled 2x2 windows (one index per window in
  // the backward), and overlapping 3x3 windows with stride 2, padding 1 and
  // ceil_mode (the gather); values on the quantization grid and beyond it
  // (ties after rounding, clamped ranges: the mask), scale 1/8, zero point
  // 3. The gradient: the composition's, max_pool2d of
  // fake_quantize_per_tensor, on the CPU in f64.
  const auto fq_pool_entry = [](const char* name, Shape shape, Size2 k, std::optional<Size2> s, Size2 p, bool ceil) {
    const auto call = [=](const Tensor& x, const Tensor& sc, const Tensor& zp, bool fused) {
      return fused ? fake_quantize_max_pool2d(x, sc, zp, -128, 127, k, s, p, 1, ceil)
                   : max_pool2d(fake_quantize_per_tensor(x, sc, zp, -128, 127), k, s, p, 1, ceil);
    };
    return OpEntry{name,
                   {"fake_quantize_max_pool2d"},
                   kFloat,
                   [shape](Device d, DType dt, Generator& g) {
                     return Tensors{quant_input(shape, g, d, dt, 0.125, 3, -128, 127), full({1}, 0.125, on(d)),
                                    full({1}, 3.0, on(d, DType::s32))};
                   },
                   [call](const Tensors& v) { return Tensors{call(v[0], v[1], v[2], true)}; },
                   Promise::bit_identical(),
                   GradMethod::host_reference,
                   [call](const Tensors& v, const Tensor& dy) {
                     Tensor x = leaf(v[0].detach().cpu().to(DType::f64));
                     call(x, v[1].cpu(), v[2].cpu(), false).backward(dy.detach().cpu().to(DType::f64));
                     return std::vector<std::vector<double>>{x.grad().to_vector<double>()};
                   },
                   {},
                   fq_max_pool_errors};
  };
  e.push_back(fq_pool_entry("fake_quantize_max_pool2d (tiled windows)", {2, 3, 6, 8}, 2, std::nullopt, 0, false));
  e.push_back(fq_pool_entry("fake_quantize_max_pool2d (overlapping windows)", {1, 4, 7, 9}, 3, Size2{2}, 1, true));
  // Dilation 2, stride 1 x 3, padding only along the rows, no ceil_mode.
  e.push_back({"max_pool2d (dilation)", {"max_pool2d", "max_pool2d_with_indices"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{distinct({1, 2, 9, 10}, g, d, dt)}; },
               [](const Tensors& v) {
                 const MaxPool2dResult r = max_pool2d_with_indices(v[0], 3, Size2{1, 3}, {1, 0}, 2, false);
                 return Tensors{r.output, r.indices};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, nullptr});
  // NaN, +-inf, +-0 and ties: values and indices across devices (no gradient:
  // ties make finite differences meaningless).
  e.push_back({"max_pool2d (NaN, inf, ties)", {"max_pool2d_with_indices"}, kFloat,
               [](Device d, DType dt, Generator&) {
                 const double inf = INFINITY, nan = NAN;
                 std::vector<double> v = {
                     1,    1,   0.5, -0.0, 0.0,  2,    // plane 0: ties and signed zeros
                     1,    1,   -0.0, 0.0, 2,    2,    //
                     -inf, -inf, 3,   3,   -1,   -1,   //
                     -inf, -inf, 3,   3,   -1,   -2,   //
                     nan,  1,   inf,  nan, -inf, 0,    // plane 1: NaN (twice in a window), +-inf
                     2,    nan, inf,  inf, 5,    -inf, //
                     -inf, -inf, -inf, 1,  nan,  7,    //
                     -inf, -inf, -inf, 2,  3,    nan};
                 return Tensors{Tensor::from_vector(v, {1, 2, 4, 6}).to(dt).to(d)};
               },
               [](const Tensors& v) {
                 const MaxPool2dResult a = max_pool2d_with_indices(v[0], 2);
                 const MaxPool2dResult b = max_pool2d_with_indices(v[0], 3, Size2{2}, 1, 1, true);
                 return Tensors{a.output, a.indices, b.output, b.indices};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, nullptr});

  // count_include_pad on and off, ceil_mode with a last window clipped to
  // the padded input (divisor 3 x 2, not 3 x 3).
  e.push_back({"avg_pool2d", {"avg_pool2d"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({2, 3, 7, 8}, g, d, dt)}; },
               [](const Tensors& v) {
                 return Tensors{add(avg_pool2d(v[0], 3, Size2{2}, 1, true, true),
                                    avg_pool2d(v[0], 3, Size2{2}, 1, true, false))};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {},
               [avg_fn](Device d) { return pool_errors("avg_pool2d", d, avg_fn, false); }});
  e.push_back({"avg_pool2d (2 x 3, stride 1 x 2)", {"avg_pool2d"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({1, 2, 5, 7}, g, d, dt)}; },
               [](const Tensors& v) { return Tensors{avg_pool2d(v[0], {2, 3}, Size2{1, 2}, {1, 0}, false, false)}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, nullptr});

  const auto adaptive_errors = [](Device d) {
    constexpr const char* op = "adaptive_avg_pool2d";
    const Tensor x = some({2, 3, 5, 5}, d);
    std::vector<BadInput> c{{op, "x", [] { adaptive_avg_pool2d(Tensor(), 1); }},
                            {op, "x", [=] { adaptive_avg_pool2d(some({3, 5, 5}, d), 1); }},
                            {op, "x", [=] { adaptive_avg_pool2d(some({2, 3, 5, 5}, d, DType::s32), 1); }},
                            {op, "x", [=] { adaptive_avg_pool2d(some({2, 0, 5, 5}, d), 1); }},
                            {op, "output_size", [=] { adaptive_avg_pool2d(x, 0); }},
                            {op, "output_size", [=] { adaptive_avg_pool2d(x, {2, -1}); }}};
    return c;
  };
  // Windows of uneven sizes that overlap (7 -> 3, 9 -> 4), and more outputs
  // than inputs (3 -> 5).
  e.push_back({"adaptive_avg_pool2d", {"adaptive_avg_pool2d"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({2, 3, 7, 9}, g, d, dt)}; },
               [](const Tensors& v) { return Tensors{adaptive_avg_pool2d(v[0], {3, 4})}; }, Promise::bit_identical(),
               GradMethod::finite_differences, {}, {}, adaptive_errors});
  e.push_back({"adaptive_avg_pool2d (upsampling)", {"adaptive_avg_pool2d"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({1, 2, 3, 4}, g, d, dt)}; },
               [](const Tensors& v) { return Tensors{adaptive_avg_pool2d(v[0], {5, 6})}; }, Promise::bit_identical(),
               GradMethod::finite_differences, {}, {}, nullptr});
  // Global: planes of 156 elements take the CUDA block reduction.
  e.push_back({"adaptive_avg_pool2d (global)", {"adaptive_avg_pool2d"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({2, 3, 12, 13}, g, d, dt)}; },
               [](const Tensors& v) { return Tensors{adaptive_avg_pool2d(v[0], 1)}; },
               summation_order("block reduction of planes > 128 elements on CUDA"), GradMethod::finite_differences,
               {}, {}, nullptr});

  // s8 / u8 (forward only): the full range of the dtype, ties (few distinct
  // values), max with indices; averages with PyTorch's quantized rounding
  // (half to even at exact halves: 2 x 2 windows), count_include_pad on and
  // off, ceil_mode, uneven adaptive windows and global pooling.
  const auto int8_values = [](const Shape& shape, Generator& g, Device d, DType dt) {
    return dt == DType::s8 ? randint(-128, 128, shape, g, on(d, dt)) : randint(0, 256, shape, g, on(d, dt));
  };
  e.push_back({"max_pool2d (s8, u8)", {"max_pool2d", "max_pool2d_with_indices"}, {DType::s8, DType::u8},
               [int8_values](Device d, DType dt, Generator& g) {
                 return Tensors{int8_values({2, 3, 7, 8}, g, d, dt),
                                randint(0, 3, {1, 2, 6, 6}, g, on(d, dt))};  // ties
               },
               [](const Tensors& v) {
                 const MaxPool2dResult r = max_pool2d_with_indices(v[0], {3, 2}, Size2{2, 1}, {1, 1}, 1, true);
                 const MaxPool2dResult t = max_pool2d_with_indices(v[1], 3, Size2{1, 2}, 1, 2, false);
                 return Tensors{max_pool2d(v[0], 2), r.output, r.indices, t.output, t.indices};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, nullptr});
  e.push_back({"avg_pool2d (s8, u8)", {"avg_pool2d"}, {DType::s8, DType::u8},
               [int8_values](Device d, DType dt, Generator& g) { return Tensors{int8_values({2, 3, 7, 8}, g, d, dt)}; },
               [](const Tensors& v) {
                 return Tensors{avg_pool2d(v[0], 3, Size2{2}, 1, true, true), avg_pool2d(v[0], 3, Size2{2}, 1, true, false),
                                avg_pool2d(v[0], 2), avg_pool2d(v[0], {2, 3}, Size2{1, 2}, {1, 0}, false, false)};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, nullptr});
  e.push_back({"adaptive_avg_pool2d (s8, u8)", {"adaptive_avg_pool2d"}, {DType::s8, DType::u8},
               [int8_values](Device d, DType dt, Generator& g) { return Tensors{int8_values({2, 3, 7, 9}, g, d, dt)}; },
               [](const Tensors& v) {
                 return Tensors{adaptive_avg_pool2d(v[0], {3, 4}), adaptive_avg_pool2d(v[0], 1),
                                adaptive_avg_pool2d(v[0], {5, 11})};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, nullptr});

  // Training: batch statistics, running statistics updated (compared across
  // devices too), the full backward through the statistics.
  e.push_back({"batch_norm (training)", {"batch_norm"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 Tensor x = leaf(add(mul(randn({4, 3, 5, 6}, g, on(d, dt)), 2.0), 0.5).detach());
                 return Tensors{x, normal({3}, g, d, dt), normal({3}, g, d, dt), plain({3}, g, d, dt, -1, 1),
                                plain({3}, g, d, dt, 0.5, 2)};
               },
               [](const Tensors& v) {
                 // The batch counter too (7 -> 8), compared across devices.
                 Tensor count = full({}, 7.0, TensorOptions{}.with_dtype(DType::s64).with_device(v[0].device()));
                 Tensor y = batch_norm(v[0], v[1], v[2], v[3], v[4], true, 0.1, 1e-5, count);
                 return Tensors{y, v[3], v[4], count};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, batch_norm_errors});
  // [N, C] without affine parameters or running statistics.
  e.push_back({"batch_norm (training, [N, C])", {"batch_norm"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({6, 5}, g, d, dt)}; },
               [](const Tensors& v) { return Tensors{batch_norm(v[0], Tensor(), Tensor(), Tensor(), Tensor(), true)}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, nullptr});
  // Evaluation: the running statistics, the affine backward.
  e.push_back({"batch_norm (eval)", {"batch_norm"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({3, 4, 2, 5}, g, d, dt), normal({4}, g, d, dt), normal({4}, g, d, dt),
                                plain({4}, g, d, dt, -1, 1), plain({4}, g, d, dt, 0.5, 2)};
               },
               [](const Tensors& v) { return Tensors{batch_norm(v[0], v[1], v[2], v[3], v[4], false, 0.1, 1e-3)}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, nullptr});
  // batch_norm_relu: about half the outputs cut by the relu (bias near 0), the
  // gradients through the relu's recomputed mask; training and evaluation.
  e.push_back({"batch_norm_relu (training)",
               {"batch_norm_relu"},
               kFloat,
               [](Device d, DType dt, Generator& g) {
                 Tensor x = leaf(add(mul(randn({4, 3, 5, 6}, g, on(d, dt)), 2.0), 0.5).detach());
                 return Tensors{x, normal({3}, g, d, dt), plain({3}, g, d, dt, -0.5, 0.5), plain({3}, g, d, dt, -1, 1),
                                plain({3}, g, d, dt, 0.5, 2)};
               },
               [](const Tensors& v) {
                 Tensor y = batch_norm_relu(v[0], v[1], v[2], v[3], v[4], true, 0.1, 1e-5);
                 return Tensors{y, v[3], v[4]};
               },
               Promise::bit_identical(),
               GradMethod::finite_differences,
               {},
               {},
               batch_norm_relu_errors});
  e.push_back(
      {"batch_norm_relu (eval)",
       {"batch_norm_relu"},
       kFloat,
       [](Device d, DType dt, Generator& g) {
         return Tensors{normal({3, 4, 2, 5}, g, d, dt), normal({4}, g, d, dt), plain({4}, g, d, dt, -0.5, 0.5),
                        plain({4}, g, d, dt, -1, 1), plain({4}, g, d, dt, 0.5, 2)};
       },
       [](const Tensors& v) { return Tensors{batch_norm_relu(v[0], v[1], v[2], v[3], v[4], false, 0.1, 1e-3)}; },
       Promise::bit_identical(),
       GradMethod::finite_differences,
       {},
       {},
       nullptr});
  // A constant channel (variance 0: invstd = 1 / sqrt(eps)), momentum 1 then 0.
  e.push_back({"batch_norm (constant channel, momentum 0 and 1)", {"batch_norm"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 std::vector<double> x = randn({4, 2, 3}, g, on(Device::cpu(), DType::f64)).to_vector<double>();
                 for (std::size_t i = 0; i < x.size(); ++i)
                   if ((i / 3) % 2 == 0) x[i] = 2.5;
                 return Tensors{Tensor::from_vector(x, {4, 2, 3}).to(dt).to(d), plain({2}, g, d, dt, -1, 1),
                                plain({2}, g, d, dt, 0.5, 2)};
               },
               [](const Tensors& v) {
                 Tensor a = batch_norm(v[0], Tensor(), Tensor(), v[1], v[2], true, 1.0, 1e-5);
                 Tensor rm1 = v[1].clone(), rv1 = v[2].clone();
                 Tensor b = batch_norm(v[0], Tensor(), Tensor(), v[1], v[2], true, 0.0, 1e-5);
                 return Tensors{a, b, rm1, rv1, v[1], v[2]};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, nullptr});

  // batch_norm_scale_factor: a batch norm's weight (a leaf) and running
  // variance (a buffer: plain), two eps; then a running variance that
  // requires grad (the composed ops' path, gradients to both).
  const auto scale_factor_errors = [](Device d) {
    constexpr const char* op = "batch_norm_scale_factor";
    const Tensor w = some({4}, d), v = full({4}, 0.5, on(d));
    std::vector<BadInput> c{
        {op, "weight", [=] { batch_norm_scale_factor(Tensor(), v, 1e-5); }},
        {op, "weight", [=] { batch_norm_scale_factor(some({4}, d, DType::s32), v, 1e-5); }},
        {op, "running_var", [=] { batch_norm_scale_factor(w, Tensor(), 1e-5); }},
        {op, "running_var", [=] { batch_norm_scale_factor(w, some({4}, d, DType::s32), 1e-5); }},
        {op, "running_var", [=] { batch_norm_scale_factor(w, full({4}, 0.5, on(d, DType::f64)), 1e-5); }},
        {op, "running_var", [=] { batch_norm_scale_factor(w, full({5}, 0.5, on(d)), 1e-5); }},
        {op, "running_var", [=] { batch_norm_scale_factor(w, full({4, 1}, 0.5, on(d)), 1e-5); }},
        {op, "eps", [=] { batch_norm_scale_factor(w, v, -1e-5); }},
        {op, "eps", [=] { batch_norm_scale_factor(w, v, std::numeric_limits<double>::infinity()); }},
        {op, "eps", [=] { batch_norm_scale_factor(w, v, std::numeric_limits<double>::quiet_NaN()); }},
    };
    if (has_other(d)) c.push_back({op, "running_var", [=] { batch_norm_scale_factor(w, full({4}, 0.5, on(other(d))), 1e-5); }});
    return c;
  };
  e.push_back({"batch_norm_scale_factor", {"batch_norm_scale_factor"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({37}, g, d, dt), plain({37}, g, d, dt, 0.01, 3)};
               },
               [](const Tensors& v) {
                 return Tensors{batch_norm_scale_factor(v[0], v[1], 1e-5), batch_norm_scale_factor(v[0], v[1], 0.25)};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, scale_factor_errors});
  e.push_back({"batch_norm_scale_factor (running_var requires grad)", {"batch_norm_scale_factor"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({6}, g, d, dt), leaf(rand({6}, g, on(d, dt), 0.5, 2.0))};
               },
               [](const Tensors& v) { return Tensors{batch_norm_scale_factor(v[0], v[1], 1e-3)}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, nullptr});

  // channel_mul: a conv weight along axis 0 scaled twice by a scale factor
  // (a node's output, as ConvBn2d's: the outer product's gradient for it is
  // pending when the inner one's rule runs, which folds it in), [N, C, H, W]
  // along axis 1 then -1, and channels of more than 4096 elements (the
  // composed passes).
  const auto channel_mul_errors = [](Device d) {
    constexpr const char* op = "channel_mul";
    const Tensor x = some({4, 3, 2}, d), s4 = full({4}, 1.5, on(d));
    std::vector<BadInput> c{
        {op, "x", [=] { channel_mul(Tensor(), s4, 0); }},
        {op, "x", [=] { channel_mul(some({4, 3}, d, DType::s32), s4, 0); }},
        {op, "x", [=] { channel_mul(full({}, 1.0, on(d)), s4, 0); }},
        {op, "axis", [=] { channel_mul(x, s4, 3); }},
        {op, "axis", [=] { channel_mul(x, s4, -4); }},
        {op, "scale", [=] { channel_mul(x, Tensor(), 0); }},
        {op, "scale", [=] { channel_mul(x, full({3}, 1.5, on(d)), 0); }},
        {op, "scale", [=] { channel_mul(x, full({4, 1}, 1.5, on(d)), 0); }},
        {op, "scale", [=] { channel_mul(x, full({4}, 1.5, on(d, DType::f64)), 0); }},
        {op, "scale", [=] { channel_mul(x, some({4}, d, DType::s32), 0); }},
    };
    if (has_other(d)) c.push_back({op, "scale", [=] { channel_mul(x, full({4}, 1.5, on(other(d))), 0); }});
    return c;
  };
  e.push_back({"channel_mul (conv weight, scale shared)", {"channel_mul"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({6, 3, 3, 3}, g, d, dt), normal({6}, g, d, dt), plain({6}, g, d, dt, 0.5, 2)};
               },
               [](const Tensors& v) {
                 const Tensor f = batch_norm_scale_factor(v[1], v[2], 1e-5);
                 return Tensors{channel_mul(channel_mul(v[0], f, 0), f, 0)};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, channel_mul_errors});
  e.push_back({"channel_mul ([N, C, H, W], axis 1 then -1)", {"channel_mul"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({3, 4, 5, 7}, g, d, dt), normal({4}, g, d, dt), normal({7}, g, d, dt)};
               },
               [](const Tensors& v) { return Tensors{channel_mul(channel_mul(v[0], v[1], 1), v[2], -1)}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, nullptr});
  e.push_back({"channel_mul (4100 elements a channel)", {"channel_mul"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({2, 2, 2050}, g, d, dt), normal({2}, g, d, dt)};
               },
               [](const Tensors& v) { return Tensors{channel_mul(v[0], v[1], 1)}; },
               summation_order("sum_to_shape's axis passes for channels of 4096 elements or more"),
               GradMethod::finite_differences, {}, {}, nullptr});

  // channel_div_add: [N, C, H, W] with bias (plane of 33 elements: two
  // chunk lanes partly filled), and [N, C] without; divisors away from 0.
  const auto div_add_errors = [](Device d) {
    constexpr const char* op = "channel_div_add";
    const Tensor x = some({2, 3, 4, 5}, d), c3 = full({3}, 1.5, on(d));
    std::vector<BadInput> c{
        {op, "x", [=] { channel_div_add(Tensor(), c3); }},
        {op, "x", [=] { channel_div_add(some({2, 3}, d, DType::s32), c3); }},
        {op, "x", [=] { channel_div_add(some({3}, d), c3); }},           // rank 1
        {op, "x", [=] { channel_div_add(some({0, 3, 2}, d), c3); }},     // empty
        {op, "divisor", [=] { channel_div_add(x, Tensor()); }},
        {op, "divisor", [=] { channel_div_add(x, full({4}, 1.5, on(d))); }},
        {op, "divisor", [=] { channel_div_add(x, full({3, 1}, 1.5, on(d))); }},
        {op, "divisor", [=] { channel_div_add(x, full({3}, 1.5, on(d, DType::f64))); }},
        {op, "bias", [=] { channel_div_add(x, c3, full({2}, 1.0, on(d))); }},
        {op, "bias", [=] { channel_div_add(x, c3, some({3}, d, DType::s32)); }},
    };
    if (has_other(d)) {
      c.push_back({op, "divisor", [=] { channel_div_add(x, full({3}, 1.5, on(other(d)))); }});
      c.push_back({op, "bias", [=] { channel_div_add(x, c3, full({3}, 1.0, on(other(d)))); }});
    }
    return c;
  };
  e.push_back({"channel_div_add", {"channel_div_add"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({3, 4, 3, 11}, g, d, dt), plain({4}, g, d, dt, 0.5, 2),
                                normal({4}, g, d, dt)};
               },
               [](const Tensors& v) {
                 return Tensors{channel_div_add(v[0], v[1], v[2]), channel_div_add(v[0], neg(v[1]))};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, div_add_errors});
  e.push_back({"channel_div_add ([N, C])", {"channel_div_add"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({7, 5}, g, d, dt), plain({5}, g, d, dt, 0.5, 2), normal({5}, g, d, dt)};
               },
               [](const Tensors& v) { return Tensors{channel_div_add(v[0], v[1], v[2])}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, nullptr});
  // Planes longer than one chunk of the three-level sums (kBatchNormChunk).
  e.push_back({"channel_div_add (two chunks per plane)", {"channel_div_add"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({1, 2, 2080}, g, d, dt), plain({2}, g, d, dt, 0.5, 2), normal({2}, g, d, dt)};
               },
               [](const Tensors& v) { return Tensors{channel_div_add(v[0], v[1], v[2])}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, nullptr});

  // channel_div_add_batch_norm: training with relu, the running statistics
  // and the counter (about half the outputs cut), and evaluation without
  // relu or shift; planes of 30 elements and of 2080 (two chunks).
  // x, divisor, weight, bias, running mean and variance, and a shift last.
  const auto div_add_bn_inputs = [](const Shape& shape, bool with_shift) {
    return [shape, with_shift](Device d, DType dt, Generator& g) {
      const std::int64_t c = shape[1];
      Tensor x = leaf(add(mul(randn(shape, g, on(d, dt)), 2.0), 0.5).detach());
      Tensors v{x,
                plain({c}, g, d, dt, 0.5, 2),
                normal({c}, g, d, dt),
                plain({c}, g, d, dt, -0.5, 0.5),
                plain({c}, g, d, dt, -1, 1),
                plain({c}, g, d, dt, 0.5, 2)};
      if (with_shift) v.push_back(normal({c}, g, d, dt));
      return v;
    };
  };
  e.push_back({"channel_div_add_batch_norm (training, relu)",
               {"channel_div_add_batch_norm"},
               kFloat,
               div_add_bn_inputs({4, 3, 5, 6}, true),
               [](const Tensors& v) {
                 Tensor count = full({}, 3.0, TensorOptions{}.with_dtype(DType::s64).with_device(v[0].device()));
                 Tensor y =
                     channel_div_add_batch_norm(v[0], v[1], v[6], v[2], v[3], v[4], v[5], true, true, 0.1, 1e-5, count);
                 return Tensors{y, v[4], v[5], count};
               },
               Promise::bit_identical(),
               GradMethod::finite_differences,
               {},
               {},
               div_add_batch_norm_errors});
  e.push_back({"channel_div_add_batch_norm (eval, two chunks per plane)",
               {"channel_div_add_batch_norm"},
               kFloat,
               div_add_bn_inputs({1, 2, 2080}, false),
               [](const Tensors& v) {
                 return Tensors{
                     channel_div_add_batch_norm(v[0], v[1], Tensor(), v[2], v[3], v[4], v[5], false, false, 0.1, 1e-3)};
               },
               Promise::bit_identical(),
               GradMethod::finite_differences,
               {},
               {},
               nullptr});

  // batch_norm_relu_fake_quantize_max_pool2d: training with the
  // channel_div_add prologue (a negative divisor and a negative weight:
  // channels whose output falls as x rises), a never-observed min/max
  // observer and tiled 2 x 2 windows; evaluation without the prologue, a
  // moving-average observer and overlapping 3 x 3 windows (stride 2,
  // padding 1, ceil_mode). Every output compared across devices: the pooled
  // values, running statistics, counter, observer range and qparams. The
  // gradients (x, divisor, weight, bias, shift) against the composition
  // (channel_div_add_batch_norm, then fake_quantize_max_pool2d with the
  // qparams the call wrote), on the CPU in f64.
  const auto bn_fq_pool_entry = [](const char* name, Shape shape, bool training, bool prologue, MaxPool2dArgs pool,
                                   double averaging) {
    // x, divisor, weight, bias, running mean, running var, shift, scale,
    // zero point, observer min, observer max.
    const auto inputs = [=](Device d, DType dt, Generator& g) {
      const std::int64_t c = shape[1];
      std::vector<double> dv = rand({c}, g, on(Device::cpu(), DType::f64), 0.5, 2).to_vector<double>();
      std::vector<double> wv = rand({c}, g, on(Device::cpu(), DType::f64), 0.5, 1.5).to_vector<double>();
      dv[1] = -dv[1];
      wv[c - 1] = -wv[c - 1];
      const bool moving = averaging >= 0;
      // divisor and shift are leaves only where the call uses them.
      const auto used = [=](const Tensor& t) { return prologue ? leaf(t.detach()) : t.detach(); };
      return Tensors{leaf(add(mul(randn(shape, g, on(d, dt)), 2.0), 0.5).detach()),
                     used(Tensor::from_vector(dv, {c}).to(dt).to(d)),
                     leaf(Tensor::from_vector(wv, {c}).to(dt).to(d)),
                     leaf(plain({c}, g, d, dt, -0.5, 0.5)),
                     plain({c}, g, d, dt, -1, 1),
                     plain({c}, g, d, dt, 0.5, 2),
                     used(normal({c}, g, d, dt)),
                     full({1}, 1.0, on(d)),
                     full({1}, 0.0, on(d, DType::s32)),
                     full({1}, moving ? -0.25 : INFINITY, on(d)),
                     full({1}, moving ? 1.5 : -INFINITY, on(d))};
    };
    const auto args = [=](const Tensors& v, const Tensor& rm, const Tensor& rv, const Tensor& count) {
      return BatchNormArgs{.divisor = prologue ? v[1] : Tensor(),
                           .shift = prologue ? v[6] : Tensor(),
                           .weight = v[2],
                           .bias = v[3],
                           .running_mean = rm,
                           .running_var = rv,
                           .num_batches_tracked = count,
                           .training = training};
    };
    return OpEntry{
        name,
        {"batch_norm_relu_fake_quantize_max_pool2d"},
        kFloat,
        inputs,
        [=](const Tensors& v) {
          Tensor count = full({}, 3.0, TensorOptions{}.with_dtype(DType::s64).with_device(v[0].device()));
          const ObserverUpdate u{v[9], v[10], averaging, false, 0};
          Tensor out = batch_norm_relu_fake_quantize_max_pool2d(v[0], args(v, v[4], v[5], training ? count : Tensor()),
                                                                 v[7], v[8], 0, 255, pool, &u);
          return Tensors{out, v[4], v[5], count, v[9], v[10], v[7], v[8]};
        },
        Promise::bit_identical(),
        GradMethod::host_reference,
        [=](const Tensors& v, const Tensor& dy) {
          Tensors h;
          for (const Tensor& t : v) h.push_back(t.detach().cpu());
          for (int i : {0, 1, 2, 3, 6}) h[i] = leaf(h[i].to(DType::f64).clone());
          for (int i : {4, 5}) h[i] = h[i].to(DType::f64).clone();  // the reference's own running statistics
          const BatchNormArgs a = args(h, h[4], h[5], Tensor());
          const Tensor y = prologue ? channel_div_add_batch_norm(h[0], a.divisor, a.shift, a.weight, a.bias,
                                                                 a.running_mean, a.running_var, training, true)
                                    : batch_norm_relu(h[0], a.weight, a.bias, a.running_mean, a.running_var, training);
          fake_quantize_max_pool2d(y, h[7], h[8], 0, 255, pool.kernel_size, pool.stride, pool.padding, pool.dilation,
                                   pool.ceil_mode)
              .backward(dy.detach().cpu().to(DType::f64));
          std::vector<std::vector<double>> grads;
          for (int i : prologue ? std::vector<int>{0, 1, 2, 3, 6} : std::vector<int>{0, 2, 3})
            grads.push_back(h[i].grad().to_vector<double>());
          return grads;
        },
        {},
        bn_fq_pool_errors};
  };
  e.push_back(bn_fq_pool_entry("batch_norm_relu_fake_quantize_max_pool2d (training, tiled)", {4, 3, 6, 8}, true, true,
                               MaxPool2dArgs{2}, -1.0));
  e.push_back(bn_fq_pool_entry("batch_norm_relu_fake_quantize_max_pool2d (eval, overlapping)", {2, 4, 7, 9}, false,
                               false, MaxPool2dArgs{3, Size2{2}, 1, 1, true}, 0.5));

  e.push_back({"flatten", {"flatten"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({2, 3, 4, 5}, g, d, dt)}; },
               [](const Tensors& v) { return Tensors{flatten(v[0], 1, 2), flatten(v[0]), flatten(v[0], 0, -1)}; },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 constexpr const char* op = "flatten";
                 const Tensor x = some({2, 3, 4, 5}, d);
                 return std::vector<BadInput>{{op, "x", [] { flatten(Tensor()); }},
                                              {op, "start_dim", [=] { flatten(x, 4); }},
                                              {op, "start_dim", [=] { flatten(x, -5); }},
                                              {op, "end_dim", [=] { flatten(x, 0, 4); }},
                                              {op, "end_dim", [=] { flatten(x, 1, -6); }},
                                              {op, "start_dim", [=] { flatten(x, 2, 1); }},
                                              {op, "start_dim", [=] { flatten(Tensor::scalar(1.5f, d), 1); }}};
               }});
  return e;
}

}  // namespace qgrad::registry
