// Scalar formulas of the broadcasting binary ops, shared by CPU and CUDA.
#pragma once

#include <limits>

#include "qgrad/core/half.h"

namespace qgrad::formulas {

enum class BinaryOp : unsigned char { add, sub, mul, div, maximum, maximum_share };

template <class M>
QGRAD_HD M binary_apply(BinaryOp op, M a, M b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    // torch.maximum: a quiet NaN if either is NaN (one constant, so CPU and
    // CUDA agree on its bits), else std::max(a, b) (a on ties: max(+0, -0) = +0).
    case BinaryOp::maximum: return (a != a || b != b) ? std::numeric_limits<M>::quiet_NaN() : (a < b ? b : a);
    // The share of maximum's gradient that a receives (derivatives.yaml:
    // where(a == b, g / 2, g).masked_fill_(a < b, 0)): 1/2 on ties, 0 where
    // a < b, else 1 (NaN compares false: 1).
    case BinaryOp::maximum_share: return a == b ? M(0.5) : (a < b ? M(0) : M(1));
  }
  return a;
}

}  // namespace qgrad::formulas
