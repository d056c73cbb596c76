// Activations.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad {

// max(x, 0) elementwise (NaN propagates). Its backward keeps a bit-packed
// x > 0 mask (n / 8 bytes), not x.
Tensor relu(const Tensor& x);

// gelu's two forms, as torch.nn.functional.gelu's `approximate`.
enum class GeluApproximate { none, tanh };
// x * Phi(x) (none: 0.5 x (1 + erf(x / sqrt 2))) or its tanh approximation
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), PyTorch's formulas for
// the forward and backward. Its backward keeps x.
Tensor gelu(const Tensor& x, GeluApproximate approximate = GeluApproximate::none);
// x * sigmoid(x) = x / (1 + exp(-x)); backward (PyTorch's)
// dy * s * (1 + x (1 - s)), s = sigmoid(x). Its backward keeps x.
Tensor silu(const Tensor& x);
// exp(x - max) / sum(exp(x - max)) along `axis` (negative counts from the
// end). Its backward keeps the output.
Tensor softmax(const Tensor& x, std::int64_t axis = -1);

}  // namespace qgrad
