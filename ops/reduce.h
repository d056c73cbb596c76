// Reductions: sum and mean (over all elements or one axis), argmax.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad {

// Over all elements: a scalar (shape []).
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
// Over one axis (negative counts from the end); keepdim keeps it as size 1.
Tensor sum(const Tensor& x, std::int64_t axis, bool keepdim = false);
Tensor mean(const Tensor& x, std::int64_t axis, bool keepdim = false);
// Index (s64) of the largest element along `axis` (the first one on ties;
// NaN counts as largest). The axis is removed. Not differentiable.
Tensor argmax(const Tensor& x, std::int64_t axis = -1);

}  // namespace qgrad
