// log_softmax and cross_entropy: validation, forward, saved state and backward.
#include "ops/loss.h"

#include "autograd/node.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"
#include "ops/check.h"

namespace qgrad {

namespace {
TensorOptions like(const Tensor& t) { return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()); }
}  // namespace

// Backward: dx = dy - exp(y) · sum(dy) along the axis. Saves y (detached).
Tensor log_softmax(const Tensor& x, std::int64_t axis) {
  constexpr const char* op = "log_softmax";
  check::floating(x, op, "x");
  const std::int64_t ax = check::axis(axis, x.dim(), op);
  const kernels::AxisView v = kernels::axis_view(x.shape(), ax);
  Tensor out = Tensor::empty(x.shape(), like(x));
  if (x.numel() > 0) kernels::log_softmax(x, out, v);
  if (any_requires_grad({x})) {
    Tensor y = out.detach();
    record(
        op, out, {x},
        [y, v](const Tensor& g) {
          Tensor dx = Tensor::empty(g.shape(), like(g));
          if (g.numel() > 0) kernels::log_softmax_backward(y, g, dx, v);
          return std::vector<Tensor>{dx};
        },
        out.nbytes());
  }
  return out;
}

// Backward: dlogits = (softmax(logits) - onehot(labels)) · g / B. Saves the
// softmax probabilities [B, C] (logits' dtype) and the labels (detached).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  constexpr const char* op = "cross_entropy";
  check::floating(logits, op, "logits");
  check::rank_is(logits, 2, op, "logits");
  check::non_empty(logits, op, "logits");
  check::defined(labels, op, "labels");
  QGRAD_CHECK(labels.dtype() == DType::s64 || labels.dtype() == DType::s32, op, "labels",
              "expected dtype s64 or s32, got ", dtype_name(labels.dtype()));
  check::same_device(labels, logits, op, "labels");
  QGRAD_CHECK(labels.dim() == 1 && labels.size(0) == logits.size(0), op, "labels", "expected shape [",
              logits.size(0), "], got ", shape_str(labels.shape()));
  const std::int64_t B = logits.size(0), C = logits.size(1);
  if (labels.device().is_cpu()) {
    kernels::dispatch_label(labels.dtype(), [&](auto tag) {
      using L = typename decltype(tag)::type;
      const L* lab = static_cast<const L*>(labels.data_ptr());
      for (std::int64_t b = 0; b < B; ++b)
        QGRAD_CHECK(lab[b] >= 0 && static_cast<std::int64_t>(lab[b]) < C, op, "labels", "label ",
                    static_cast<std::int64_t>(lab[b]), " at index ", b, " is outside [0, ", C, ")");
    });
  }
  const bool grad = any_requires_grad({logits});
  const DType math = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor probs = grad ? Tensor::empty({B, C}, like(logits)) : Tensor();
  Tensor rows = Tensor::empty({B}, TensorOptions{}.with_dtype(math).with_device(logits.device()));
  kernels::cross_entropy_forward(logits, labels, probs, rows);
  Tensor loss = Tensor::empty({}, TensorOptions{}.with_dtype(math).with_device(logits.device()));
  kernels::sum_axis(rows, loss, kernels::AxisView{1, B, 1}, true);
  Tensor out = loss.to(logits.dtype());
  if (grad) {
    record(
        op, out, {logits, labels},
        [probs, lab = labels.detach()](const Tensor& g) {
          Tensor d = Tensor::empty(probs.shape(), like(probs));
          kernels::cross_entropy_backward(probs, lab, g, d);
          return std::vector<Tensor>{d, Tensor()};
        },
        probs.nbytes() + labels.nbytes());
  }
  return out;
}

}  // namespace qgrad
