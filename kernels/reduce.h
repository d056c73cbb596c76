// Kernels of the reductions over one axis. A tensor reduced over an axis is
// viewed as [outer, n, inner] (n the axis length); a full reduction is
// outer = inner = 1.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace qgrad::kernels {

struct AxisView {
  std::int64_t outer = 1, n = 1, inner = 1;
};
// The [outer, n, inner] view of `shape` around `axis` (already normalised).
AxisView axis_view(const Shape& shape, std::int64_t axis);

// out[o, j] = sum_r in[o, r, j] (divided by n when mean), accumulated in
// op_math_t<T> in a fixed order (deterministic). in and out share a floating
// dtype and a device; out has outer * inner elements.
void sum_axis(const Tensor& in, const Tensor& out, const AxisView& v, bool mean);
// out[o, r, j] = in[o, j] * scale (the backward of sum / mean).
void expand_axis(const Tensor& in, const Tensor& out, const AxisView& v, double scale);
// out[o, j] = the first r where in[o, r, j] is largest (NaN counts as
// largest); out is s64. n >= 1.
void argmax_axis(const Tensor& in, const Tensor& out, const AxisView& v);

namespace cpu {
void sum_axis(const Tensor& in, const Tensor& out, const AxisView& v, bool mean);
void expand_axis(const Tensor& in, const Tensor& out, const AxisView& v, double scale);
void argmax_axis(const Tensor& in, const Tensor& out, const AxisView& v);
}  // namespace cpu
namespace cuda {
void sum_axis(const Tensor& in, const Tensor& out, const AxisView& v, bool mean);
void expand_axis(const Tensor& in, const Tensor& out, const AxisView& v, double scale);
void argmax_axis(const Tensor& in, const Tensor& out, const AxisView& v);
}  // namespace cuda

}  // namespace qgrad::kernels
