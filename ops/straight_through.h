// The straight-through backward the fake quant ops share (ops/quantize.cpp,
// ops/lowbit.cpp): the forward saves a bit mask of the elements inside the
// clamp range (kernels/bitmask.h), the backward writes dx = dy * bit.
// Internal to ops/: not part of qgrad.h.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"

namespace qgrad::detail {

// An unwritten mask for x's elements (s32 words, x's device).
Tensor new_mask(const Tensor& x);
// The mask's words, or null for an undefined mask.
std::uint32_t* mask_words(const Tensor& mask);
// Records op's straight-through backward over `mask` (saved): dx = dy * bit,
// dx in x's dtype (out's, or one that holds out's values exactly: the cast
// back then goes in the same pass, kernels::masked_gradient_exact_cast).
// Where x is a leaf (a weight; gradient_deferrable), the pass is deferred to
// the backward's batch of parameter passes (autograd/node.h
// deferred_gradient_passes), and the node reads its gradient only there.
void record_masked_backward(const char* op, Tensor& out, const Tensor& x, const Tensor& mask);

}  // namespace qgrad::detail
