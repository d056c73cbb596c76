// Broadcasting arithmetic: add, sub, mul, div (tensor-tensor and
// tensor-scalar), and sqrt. Floating dtypes, both operands on one device and dtype.
#pragma once

#include <vector>

#include "qgrad/core/tensor.h"

namespace qgrad {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// Elementwise max with broadcasting (torch.maximum): NaN when either is NaN.
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor neg(const Tensor& a);
// sqrt(x) elementwise (torch.sqrt): correctly rounded, so bit-identical on
// both devices; x < 0 gives NaN, -0 gives -0. Backward dx = dy / (2 y),
// saving the output y.
Tensor sqrt(const Tensor& x);

// xs[i].to(dtype) for every i (Tensor::to's values and gradients, each
// output its own autograd node), with one CUDA launch per device for every
// floating tensor that converts (kernels::DeferredPasses' cast passes):
// mixed precision's parameter casts, one launch a step where each was one
// (nn::stage_compute_casts). A tensor already in `dtype` comes back as is,
// one that is not floating (or dtype not floating) through Tensor::to.
// Errors: "xs[i]" undefined, naming "to_batch".
std::vector<Tensor> to_batch(const std::vector<Tensor>& xs, DType dtype);

// Sums `t` down to `shape` (the shape it was broadcast from); the backward
// of every broadcasting op uses it. Not recorded on the tape.
Tensor sum_to_shape(const Tensor& t, const Shape& shape);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }

}  // namespace qgrad
