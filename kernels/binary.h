// Kernels of the broadcasting binary ops and of the broadcast reduction
// their backward rules need.
#pragma once

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/formulas/binary.h"

namespace qgrad::kernels {

// out = a (op) b with broadcasting; a, b, out share a floating dtype and device.
void binary(formulas::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
// out = a (op) b for a host scalar b, first rounded to a's dtype (as
// full({}, b) stores it), so the values equal binary() with that scalar
// tensor; out has a's shape, dtype and device.
void binary_scalar(formulas::BinaryOp op, const Tensor& a, double b, const Tensor& out);
// out[j] = sum of in over the dims that broadcasting added or stretched.
// Reductions of at least 4096 elements per output take sum_to_shape_by_axes.
void sum_to_shape(const Tensor& in, const Tensor& out);
// sum_to_shape as passes of sum_axis over runs of adjacent reduced dims
// (any device; tests compare it with the one-loop form on the CPU).
void sum_to_shape_by_axes(const Tensor& in, const Tensor& out);

// sum_to_shape sums outputs of fewer terms than this in one loop
// (formulas::lane_sum's order, CPU = CUDA); longer ones by sum_to_shape_by_axes.
inline constexpr std::int64_t kAxisPassesMinReduction = 4096;

// channel_mul's backward (ops/pool_norm.h) in one pass, for channels of
// fewer than kAxisPassesMinReduction elements along `axis` (0 <= axis <
// rank): dscale[c] = sum of dy * x over channel c's elements (plus pending[c]
// where pending is defined) and dx = dy * scale[c] (where defined): the bits
// of sum_to_shape(mul(dy, x), s's shape), the engine's add of pending, and
// mul(dy, s), for s = scale reshaped to [C, 1, ...].
void channel_mul_backward(const Tensor& dy, const Tensor& x, const Tensor& scale, std::int64_t axis,
                          const Tensor& pending, const Tensor& dx, const Tensor& dscale);

}  // namespace qgrad::kernels
