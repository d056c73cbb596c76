// lerp: validation, forward, saved state and backward in one place.
// Formulas: kernels/formulas/lerp.h.
#include "qgrad/ops/lerp.h"

#include <cmath>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/lerp.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/elementwise.h"

namespace qgrad {

namespace {

TensorOptions like(const Tensor& t) { return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()); }

Tensor maybe_empty(bool need, const Tensor& ref) { return need ? Tensor::empty(ref.shape(), like(ref)) : Tensor(); }

// Backward: da = dy (1 - w), db = dy w, dw = dy (b - a), each summed to its
// input's shape. Saves only what the needed gradients read (detached).
Tensor lerp_impl(const Tensor& a, const Tensor& b, const Tensor& w, double w_scalar) {
  const char* op = "lerp";
  check::floating(a, op, "a");
  check::floating(b, op, "b");
  check::same_dtype(b, a, op, "b");
  check::same_device(b, a, op, "b");
  Shape out_shape = check::broadcast_shapes(a.shape(), b.shape(), op);
  if (w.defined()) {
    check::floating(w, op, "weight");
    check::same_dtype(w, a, op, "weight");
    check::same_device(w, a, op, "weight");
    out_shape = check::broadcast_shapes(out_shape, w.shape(), op);
  } else {
    QGRAD_CHECK(std::isfinite(w_scalar), op, "weight", "must be finite, got ", w_scalar);
  }
  QGRAD_CHECK(out_shape.size() <= static_cast<std::size_t>(kernels::kMaxDims), op, "a", "rank exceeds ",
              kernels::kMaxDims);
  Tensor out = Tensor::empty(out_shape, like(a));
  kernels::LerpArgs args{a.detach(), b.detach(), w.defined() ? w.detach() : Tensor(), w_scalar};
  kernels::lerp_forward(args, out);
  if (any_requires_grad({a, b, w})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad(), need_w = w.defined() && w.requires_grad();
    kernels::LerpArgs saved{need_w ? args.a : Tensor(), need_w ? args.b : Tensor(),
                            (need_a || need_b) ? args.w : Tensor(), w_scalar};
    // Placeholders keep make_lerp_elems/index valid when a, b are not saved.
    const std::size_t bytes = (need_w ? a.nbytes() + b.nbytes() : 0) + ((need_a || need_b) && w.defined() ? w.nbytes() : 0);
    record(
        "lerp", out, {a, b, w},
        [saved, need_a, need_b, need_w, sa = a.shape(), sb = b.shape(), sw = w.defined() ? w.shape() : Shape{}](
            const Tensor& g) {
          kernels::LerpArgs args2 = saved;
          // Unsaved operands are never read: stand g in for their pointers and shapes.
          if (!args2.a.defined()) args2.a = g;
          if (!args2.b.defined()) args2.b = g;
          if (!args2.w.defined() && need_w) args2.w = g;
          Tensor da = maybe_empty(need_a, g), db = maybe_empty(need_b, g), dw = maybe_empty(need_w, g);
          kernels::lerp_backward(args2, g, da, db, dw);
          return std::vector<Tensor>{da.defined() ? sum_to_shape(da, sa) : Tensor(),
                                     db.defined() ? sum_to_shape(db, sb) : Tensor(),
                                     dw.defined() ? sum_to_shape(dw, sw) : Tensor()};
        },
        bytes);
  }
  return out;
}

}  // namespace

Tensor lerp(const Tensor& a, const Tensor& b, double weight) { return lerp_impl(a, b, Tensor(), weight); }

Tensor lerp(const Tensor& a, const Tensor& b, const Tensor& weight) {
  check::defined(weight, "lerp", "weight");
  return lerp_impl(a, b, weight, 0.0);
}

}  // namespace qgrad
