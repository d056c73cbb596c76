#include "qgrad/ops/registry.h"

#include <cmath>
#include <stdexcept>

#include "qgrad/ops/ops.h"

namespace qgrad::registry {

const std::vector<OpEntry>& op_registry() {
  static const std::vector<OpEntry> entries = [] {
    std::vector<OpEntry> all;
    for (auto family : {arithmetic_entries, quantization_entries, lowbit_entries, lowbit_linear_entries,
                        state_entries, pool_norm_entries, transformer_entries, shape_entries, conv_entries,
                        quantized_conv_entries, fp8_linear_entries})
      for (OpEntry& e : family()) all.push_back(std::move(e));
    return all;
  }();
  return entries;
}

TensorOptions on(Device device, DType dtype) { return TensorOptions{}.with_dtype(dtype).with_device(device); }

Tensor some(const Shape& shape, Device device, DType dtype) {
  Generator g(2024);
  if (is_floating(dtype)) return randn(shape, g, on(device, dtype));
  if (dtype == DType::boolean) return randint(0, 2, shape, g, on(device, DType::s32)).to(dtype);
  return randint(1, 5, shape, g, on(device, dtype));
}

void extend_bad_inputs(std::vector<OpEntry>& entries, const std::string& name,
                       std::function<std::vector<BadInput>(Device)> more) {
  for (OpEntry& e : entries) {
    if (e.name != name) continue;
    auto first = e.bad_inputs;
    e.bad_inputs = [first, more](Device d) {
      std::vector<BadInput> all = first ? first(d) : std::vector<BadInput>{};
      for (BadInput& b : more(d)) all.push_back(std::move(b));
      return all;
    };
    return;
  }
  throw std::logic_error("extend_bad_inputs: no registry entry named '" + name + "'");
}

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
