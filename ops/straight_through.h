// The straight-through backward the fake quant ops share (ops/quantize.cpp,
// ops/lowbit.cpp): the forward saves a bit mask of the elements inside the
// clamp range (kernels/bitmask.h), the backward writes dx = dy * bit.
// Internal to ops/: not part of qgrad.h.
#pragma once

#include <cstdint>

#include "qgrad/core/tensor.h"
#include "qgrad/ops/quantize.h"

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
// Records relu's backward over `mask` (saved): dx = bit ? dy : +0, in dy's
// dtype (ops/activation.cpp; relu and the fake quant ops' relu forms).
void record_relu_backward(const char* op, Tensor& out, const Tensor& x, const Tensor& mask);

// fake_quantize(x, scale, zero_point, scope, qmin, qmax) for qparams the
// library has just computed from x (the dynamic fake quants' composition):
// their shapes, dtypes and device checked as fake_quantize checks them, their
// values not. A row holding NaN or an infinity gives a NaN or infinite
// scale, which fake_quantize's CPU check of a user's scale rejected; the CUDA
// kernels never read it back, so both devices now give the formula's values
// (docs/ops.md, fake_quantize_dynamic). Errors name `op`.
Tensor fake_quantize_computed_qparams(const char* op, const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                      QuantScope scope, std::int64_t qmin, std::int64_t qmax);

}  // namespace qgrad::detail
