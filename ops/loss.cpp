// log_softmax and cross_entropy: validation, forward, saved state and backward.
#include "qgrad/ops/loss.h"

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/reduce.h"
#include "qgrad/kernels/softmax.h"
#include "qgrad/ops/check.h"

namespace qgrad {

namespace {
TensorOptions like(const Tensor& t) { return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()); }
}  // namespace

// Backward: dx = dy - exp(y) · sum(dy) along the axis. Saves y (detached).
Tensor log_softmax(const Tensor& x, std::int64_t axis) {
  constexpr const char* op = "log_softmax";
  check::floating(x, op, "x");
  const std::int64_t ax = check::axis(axis, x.dim(), op);
  const kernels::AxisLayout v = kernels::AxisLayout::of(x.shape(), ax);
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

namespace {

// Checks a [B, C] score matrix and its [B] labels (s64 or s32, same device);
// on the CPU also that every label lies in [0, C).
void check_scores_and_labels(const Tensor& scores, const Tensor& labels, const char* op, const char* arg) {
  check::floating(scores, op, arg);
  check::rank_is(scores, 2, op, arg);
  check::non_empty(scores, op, arg);
  check::defined(labels, op, "labels");
  QGRAD_CHECK(labels.dtype() == DType::s64 || labels.dtype() == DType::s32, op, "labels",
              "expected dtype s64 or s32, got ", dtype_name(labels.dtype()));
  check::same_device(labels, scores, op, "labels");
  QGRAD_CHECK(labels.dim() == 1 && labels.size(0) == scores.size(0), op, "labels", "expected shape [",
              scores.size(0), "], got ", shape_str(labels.shape()));
  if (!labels.device().is_cpu()) return;  // CUDA: bad labels give NaN (see ops/loss.h)
  const std::int64_t C = scores.size(1);
  kernels::dispatch_label(labels.dtype(), [&](auto tag) {
    using L = typename decltype(tag)::type;
    const L* lab = static_cast<const L*>(labels.data_ptr());
    for (std::int64_t b = 0; b < labels.numel(); ++b)
      QGRAD_CHECK(lab[b] >= 0 && static_cast<std::int64_t>(lab[b]) < C, op, "labels", "label ",
                  static_cast<std::int64_t>(lab[b]), " at index ", b, " is outside [0, ", C, ")");
  });
}

// The batch mean of per-row losses (f32, or f64), in the scores' dtype.
Tensor batch_mean(const Tensor& rows, DType dtype) {
  Tensor loss = Tensor::empty({}, TensorOptions{}.with_dtype(rows.dtype()).with_device(rows.device()));
  kernels::sum_axis(rows, loss, kernels::AxisLayout{1, rows.numel(), 1}, true);
  return loss.to(dtype);
}

// The row losses' dtype: f32, or f64 for f64 scores.
TensorOptions loss_math(const Tensor& scores) {
  const DType math = scores.dtype() == DType::f64 ? DType::f64 : DType::f32;
  return TensorOptions{}.with_dtype(math).with_device(scores.device());
}

Tensor row_losses(const Tensor& scores) { return Tensor::empty({scores.size(0)}, loss_math(scores)); }

}  // namespace

// Backward: dlogits = (softmax(logits) - onehot(labels)) · g / B. Saves the
// softmax probabilities [B, C] (logits' dtype) and the labels (detached).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  constexpr const char* op = "cross_entropy";
  check_scores_and_labels(logits, labels, op, "logits");
  const bool grad = any_requires_grad({logits});
  Tensor probs = grad ? Tensor::empty(logits.shape(), like(logits)) : Tensor();
  const Tensor mean = Tensor::empty({}, loss_math(logits));
  if (!kernels::cross_entropy_mean(logits, labels, probs, mean)) {  // one launch where the device has it
    const Tensor rows = row_losses(logits);
    kernels::cross_entropy_forward(logits, labels, probs, rows);
    kernels::sum_axis(rows, mean, kernels::AxisLayout{1, rows.numel(), 1}, true);
  }
  Tensor out = mean.to(logits.dtype());
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

// Backward: dlogp[b, c] = -g / B at c == labels[b], else 0. Saves the labels.
Tensor nll_loss(const Tensor& logp, const Tensor& labels) {
  constexpr const char* op = "nll_loss";
  check_scores_and_labels(logp, labels, op, "logp");
  Tensor rows = row_losses(logp);
  kernels::nll_forward(logp, labels, rows);
  Tensor out = batch_mean(rows, logp.dtype());
  if (any_requires_grad({logp})) {
    record(
        op, out, {logp, labels},
        [lab = labels.detach(), shape = logp.shape()](const Tensor& g) {
          Tensor d = Tensor::empty(shape, like(g));
          kernels::nll_backward(lab, g, d);
          return std::vector<Tensor>{d, Tensor()};
        },
        labels.nbytes());
  }
  return out;
}

}  // namespace qgrad
