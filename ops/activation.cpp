// relu, gelu, silu and softmax: validation, forward, saved state and backward.
#include "qgrad/ops/activation.h"

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/activation.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/transformer.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/straight_through.h"

namespace qgrad {

// Backward: dx = dy where x > 0, else 0. Saves the mask bits only.
Tensor relu(const Tensor& x) {
  constexpr const char* op = "relu";
  check::floating(x, op, "x");
  const bool grad = any_requires_grad({x});
  Tensor out = Tensor::empty(x.shape(), TensorOptions{}.with_dtype(x.dtype()).with_device(x.device()));
  Tensor mask;
  if (grad)
    mask = Tensor::empty({bitmask_words(x.numel())}, TensorOptions{}.with_dtype(DType::s32).with_device(x.device()));
  kernels::relu(x, out, mask);
  if (grad) detail::record_relu_backward(op, out, x, mask);
  return out;
}

void detail::record_relu_backward(const char* op, Tensor& out, const Tensor& x, const Tensor& mask) {
  record(
      op, out, {x},
      [mask](const Tensor& g) {
        Tensor dx = Tensor::empty(g.shape(), TensorOptions{}.with_dtype(g.dtype()).with_device(g.device()));
        kernels::relu_backward(g, mask, dx);
        return std::vector<Tensor>{dx};
      },
      mask.nbytes());
}

namespace {
TensorOptions like(const Tensor& t) { return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()); }
}  // namespace

// Backward: dy * gelu'(x) by PyTorch's formula of the same form. Saves x.
Tensor gelu(const Tensor& x, GeluApproximate approximate) {
  constexpr const char* op = "gelu";
  check::floating(x, op, "x");
  QGRAD_CHECK(approximate == GeluApproximate::none || approximate == GeluApproximate::tanh, op, "approximate",
              "expected none or tanh");
  const bool tanh = approximate == GeluApproximate::tanh;
  Tensor out = Tensor::empty(x.shape(), like(x));
  kernels::gelu(x, out, tanh);
  if (any_requires_grad({x}))
    record(
        op, out, {x},
        [sx = x.detach(), tanh](const Tensor& g) {
          Tensor dx = Tensor::empty(g.shape(), like(g));
          kernels::gelu_backward(g, sx, dx, tanh);
          return std::vector<Tensor>{dx};
        },
        x.nbytes());
  return out;
}

// Backward: dy * s * (1 + x (1 - s)), s = sigmoid(x). Saves x.
Tensor silu(const Tensor& x) {
  constexpr const char* op = "silu";
  check::floating(x, op, "x");
  Tensor out = Tensor::empty(x.shape(), like(x));
  kernels::silu(x, out);
  if (any_requires_grad({x}))
    record(
        op, out, {x},
        [sx = x.detach()](const Tensor& g) {
          Tensor dx = Tensor::empty(g.shape(), like(g));
          kernels::silu_backward(g, sx, dx);
          return std::vector<Tensor>{dx};
        },
        x.nbytes());
  return out;
}

// Backward: y * (dy - sum(dy * y)) along the axis. Saves the output y.
Tensor softmax(const Tensor& x, std::int64_t axis) {
  constexpr const char* op = "softmax";
  check::floating(x, op, "x");
  QGRAD_CHECK(x.dim() > 0, op, "axis", "a scalar has no axis");
  const std::int64_t ax = check::axis(axis, x.dim(), op);
  const kernels::AxisLayout v = kernels::AxisLayout::of(x.shape(), ax);
  Tensor out = Tensor::empty(x.shape(), like(x));
  if (x.numel() > 0) kernels::softmax(x, out, v);
  if (any_requires_grad({x}))
    record(
        op, out, {x},
        [y = out.detach(), v](const Tensor& g) {
          Tensor dx = Tensor::empty(g.shape(), like(g));
          if (g.numel() > 0) kernels::softmax_backward(y, g, dx, v);
          return std::vector<Tensor>{dx};
        },
        out.nbytes());
  return out;
}

}  // namespace qgrad
