// Kernels behind the Tensor core: fill, dtype conversion, random draws.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

void fill(const Tensor& out, double value);
void cast(const Tensor& in, const Tensor& out);  // same numel, any dtypes, same device
void rand_uniform(const Tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high);
void arange(const Tensor& out, double start, double step);

}  // namespace qgrad::kernels
