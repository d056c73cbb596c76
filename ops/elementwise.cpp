// Broadcasting binary ops: forward, saved state and backward in one place.
#include "qgrad/ops/elementwise.h"

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/binary.h"
#include "qgrad/kernels/unary.h"
#include "qgrad/ops/check.h"

namespace qgrad {

using formulas::BinaryOp;

Shape check::broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  Shape out(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const std::int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    QGRAD_CHECK(da == db || da == 1 || db == 1, op, "b", "shapes ", shape_str(a), " and ", shape_str(b),
                " do not broadcast");
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

Tensor sum_to_shape(const Tensor& t, const Shape& shape) {
  const char* op = "sum_to_shape";
  check::floating(t, op, "t");
  // `shape` must broadcast to t's shape (each of its dims 1 or equal to t's,
  // aligned from the right); anything else would index out of bounds.
  const Shape& ts = t.shape();
  bool ok = shape.size() <= ts.size();
  for (std::size_t k = 0; ok && k < shape.size(); ++k) {
    const std::int64_t d = ts[ts.size() - shape.size() + k];
    ok = shape[k] == 1 || shape[k] == d;
  }
  QGRAD_CHECK(ok, op, "shape", shape_str(shape), " does not broadcast to ", shape_str(ts));
  if (ts == shape) return t;
  Tensor out = Tensor::empty(shape, TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()));
  kernels::sum_to_shape(t, out);
  return out;
}

namespace {

Tensor binary_forward(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check::floating(a, name, "a");
  check::floating(b, name, "b");
  check::same_dtype(b, a, name, "b");
  check::same_device(b, a, name, "b");
  const Shape out_shape = check::broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(out_shape, TensorOptions{}.with_dtype(a.dtype()).with_device(a.device()));
  kernels::binary(op, a, b, out);
  return out;
}

}  // namespace

// d(a+b) = (g, g); d(a-b) = (g, -g), each summed back to its input's shape.
Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("add", BinaryOp::add, a, b);
  if (any_requires_grad({a, b})) {
    record("add", out, {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
      return std::vector<Tensor>{sum_to_shape(g, sa), sum_to_shape(g, sb)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("sub", BinaryOp::sub, a, b);
  if (any_requires_grad({a, b})) {
    record("sub", out, {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
      return std::vector<Tensor>{sum_to_shape(g, sa), sum_to_shape(neg(g), sb)};
    });
  }
  return out;
}

// d(a*b) = (g*b, g*a): saves both inputs (detached).
Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("mul", BinaryOp::mul, a, b);
  if (any_requires_grad({a, b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    Tensor sa = need_b ? a.detach() : Tensor(), sb = need_a ? b.detach() : Tensor();
    record(
        "mul", out, {a, b},
        [sa, sb, shape_a = a.shape(), shape_b = b.shape()](const Tensor& g) {
          return std::vector<Tensor>{sb.defined() ? sum_to_shape(mul(g, sb), shape_a) : Tensor(),
                                     sa.defined() ? sum_to_shape(mul(g, sa), shape_b) : Tensor()};
        },
        (need_a ? b.nbytes() : 0) + (need_b ? a.nbytes() : 0));
  }
  return out;
}

// d(a/b) = (g/b, -g*a/b^2): saves a and b (detached).
Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("div", BinaryOp::div, a, b);
  if (any_requires_grad({a, b})) {
    const bool need_b = b.requires_grad();
    Tensor sa = need_b ? a.detach() : Tensor(), sb = b.detach();
    record(
        "div", out, {a, b},
        [sa, sb, shape_a = a.shape(), shape_b = b.shape()](const Tensor& g) {
          Tensor ga = div(g, sb);
          Tensor gb = sa.defined() ? sum_to_shape(neg(div(mul(ga, sa), sb)), shape_b) : Tensor();
          return std::vector<Tensor>{sum_to_shape(ga, shape_a), gb};
        },
        b.nbytes() + (need_b ? a.nbytes() : 0));
  }
  return out;
}

// d/da = g * share(a, b), d/db = g * share(b, a): share is 1, 1/2 on ties, 0
// where the other operand is larger (PyTorch's derivatives.yaml). Saves a
// and b (detached) and computes the shares in the backward.
Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("maximum", BinaryOp::maximum, a, b);
  if (any_requires_grad({a, b})) {
    record(
        "maximum", out, {a, b},
        [sa = a.detach(), sb = b.detach()](const Tensor& g) {
          Tensor share_a = binary_forward("maximum", BinaryOp::maximum_share, sa, sb);
          Tensor share_b = binary_forward("maximum", BinaryOp::maximum_share, sb, sa);
          return std::vector<Tensor>{sum_to_shape(mul(g, share_a), sa.shape()),
                                     sum_to_shape(mul(g, share_b), sb.shape())};
        },
        a.nbytes() + b.nbytes());
  }
  return out;
}

namespace {
// a (op) s for a host scalar: one kernel over a, with s rounded to a's
// dtype first, the values of the op with the scalar tensor full({}, s)
// (no scalar tensor, no fill, no broadcast index).
Tensor scalar_forward(const char* name, BinaryOp op, const Tensor& a, double s) {
  check::floating(a, name, "a");
  Tensor out = Tensor::empty(a.shape(), TensorOptions{}.with_dtype(a.dtype()).with_device(a.device()));
  kernels::binary_scalar(op, a, s, out);
  return out;
}
}  // namespace

// d(a+s) = g.
Tensor add(const Tensor& a, double b) {
  Tensor out = scalar_forward("add", BinaryOp::add, a, b);
  if (any_requires_grad({a})) record("add", out, {a}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}
// d(a*s) = g*s. Saves nothing.
Tensor mul(const Tensor& a, double b) {
  Tensor out = scalar_forward("mul", BinaryOp::mul, a, b);
  if (any_requires_grad({a}))
    record("mul", out, {a}, [b](const Tensor& g) { return std::vector<Tensor>{mul(g, b)}; });
  return out;
}
// d(-a) = -g.
Tensor neg(const Tensor& a) {
  Tensor out = scalar_forward("neg", BinaryOp::mul, a, -1.0);
  if (any_requires_grad({a})) record("neg", out, {a}, [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
  return out;
}

// d sqrt(x) = g / (2 sqrt(x)). Saves the output.
Tensor sqrt(const Tensor& x) {
  constexpr const char* op = "sqrt";
  check::floating(x, op, "x");
  Tensor out = Tensor::empty(x.shape(), TensorOptions{}.with_dtype(x.dtype()).with_device(x.device()));
  kernels::sqrt(x, out);
  if (any_requires_grad({x}))
    record(
        op, out, {x},
        [y = out.detach()](const Tensor& g) {
          Tensor dx = Tensor::empty(g.shape(), TensorOptions{}.with_dtype(g.dtype()).with_device(g.device()));
          kernels::sqrt_backward(g, y, dx);
          return std::vector<Tensor>{dx};
        },
        out.nbytes());
  return out;
}

}  // namespace qgrad
