// Activations.
#pragma once

#include "qgrad/core/tensor.h"

namespace qgrad {

// max(x, 0) elementwise (NaN propagates). Its backward keeps a bit-packed
// x > 0 mask (n / 8 bytes), not x.
Tensor relu(const Tensor& x);

}  // namespace qgrad
