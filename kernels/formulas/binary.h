// Scalar formulas of the broadcasting binary ops, shared by CPU and CUDA.
#pragma once

#include "qgrad/core/half.h"

namespace qgrad::formulas {

enum class BinaryOp : unsigned char { add, sub, mul, div };

template <class M>
QGRAD_HD M binary_apply(BinaryOp op, M a, M b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
  }
  return a;
}

}  // namespace qgrad::formulas
