// Factories: tensors filled with a value, a range or random draws. They run
// kernels, so they belong to the ops layer (defined in ops/tensor_ops.cpp).
#pragma once

#include "qgrad/core/tensor.h"

namespace qgrad {

// ---- factories ----
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
// [start, end) in steps; values computed in double, then cast.
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);

// Uniform in [low, high).
Tensor rand(const Shape& shape, Generator& gen, TensorOptions options = {}, double low = 0.0, double high = 1.0);
// Standard normal (Box-Muller in double), times stddev plus mean.
Tensor randn(const Shape& shape, Generator& gen, TensorOptions options = {}, double mean = 0.0, double stddev = 1.0);
// Integers uniform in [low, high).
Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, Generator& gen, TensorOptions options = {});

}  // namespace qgrad
