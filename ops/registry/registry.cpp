#include "qgrad/ops/registry.h"

#include <cmath>

#include "qgrad/ops/ops.h"

namespace qgrad::registry {

const std::vector<OpEntry>& op_registry() {
  static const std::vector<OpEntry> entries = [] {
    std::vector<OpEntry> all;
    for (auto family : {arithmetic_entries, quantization_entries, state_entries})
      for (OpEntry& e : family()) all.push_back(std::move(e));
    return all;
  }();
  return entries;
}

TensorOptions on(Device device, DType dtype) { return TensorOptions{}.with_dtype(dtype).with_device(device); }

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

Tensor normal(const Shape& shape, Generator& g, Device device, DType dtype, double stddev) {
  return leaf(randn(shape, g, on(device, dtype), 0.0, stddev));
}

Tensor quant_input(const Shape& shape, Generator& g, Device device, DType dtype, double scale,
                   std::int64_t zero_point, std::int64_t qmin, std::int64_t qmax) {
  const std::int64_t n = shape_numel(shape);
  const double lo = (static_cast<double>(qmin - zero_point) - 4) * scale;
  const double hi = (static_cast<double>(qmax - zero_point) + 4) * scale;
  // Random values over the range and a little beyond, drawn on the host in
  // f64 from the counter-based generator (the same on every device).
  std::vector<double> v = rand({n}, g, on(Device::cpu(), DType::f64), lo, hi).to_vector<double>();
  // Edges: ties halfway between grid points (round half to even), the clamp
  // bounds and one step beyond, signed zeros, huge values.
  const std::vector<double> edges = {(0.5) * scale,
                                     (1.5) * scale,
                                     (-0.5) * scale,
                                     (-2.5) * scale,
                                     static_cast<double>(qmin - zero_point) * scale,
                                     static_cast<double>(qmax - zero_point) * scale,
                                     static_cast<double>(qmin - zero_point - 1) * scale,
                                     static_cast<double>(qmax - zero_point + 1) * scale,
                                     0.0,
                                     -0.0,
                                     1e30,
                                     -1e30};
  for (std::size_t i = 0; i < edges.size() && i < v.size(); ++i) v[i * 7 % v.size()] = edges[i];
  Tensor t = Tensor::from_vector(v, shape).to(dtype).to(device);
  return leaf(t);
}

}  // namespace qgrad::registry
