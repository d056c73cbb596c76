// Scalar formulas of the activations, shared by CPU and CUDA.
#pragma once

#include "qgrad/core/half.h"

namespace qgrad::formulas {

// relu(x) = max(x, 0); NaN propagates (as in PyTorch).
template <class M>
QGRAD_HD M relu(M x) {
  return (x > M(0) || x != x) ? x : M(0);
}

// The bit the backward keeps: d relu / dx = 1 where x > 0, else 0.
template <class M>
QGRAD_HD bool relu_mask(M x) {
  return x > M(0);
}

}  // namespace qgrad::formulas
