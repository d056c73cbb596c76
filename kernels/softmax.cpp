// log_softmax, cross-entropy and nll, one source for both devices
// (kernels/loop.h): one index per row running the row formulas of
// kernels/formulas/softmax.h, or per element for the gradients. Wide
// contiguous rows on CUDA take the warp-per-row kernels of
// kernels/cuda/softmax.cu.
#include "qgrad/kernels/softmax.h"

#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/formulas/softmax.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {

// One row of log_softmax (y from x) or of its backward (dx from y and dy).
template <class T, bool kBackward>
struct LogSoftmaxRow {
  const T* in;  // x, or y for the backward
  const T* dy;  // backward only
  T* out;
  AxisLayout v;
  QGRAD_HD void operator()(std::int64_t row) const {
    const std::int64_t b = v.base(row);
    if constexpr (kBackward) formulas::log_softmax_backward_row(in + b, dy + b, out + b, v.channels, v.inner);
    else formulas::log_softmax_row(in + b, out + b, v.channels, v.inner);
  }
};

template <class T, class L>
struct CrossEntropyRow {
  const T* x;
  const L* lab;
  T* p;  // null: probabilities not kept
  op_math_t<T>* loss;
  std::int64_t C;
  QGRAD_HD void operator()(std::int64_t b) const {
    loss[b] = formulas::cross_entropy_row(x + b * C, static_cast<std::int64_t>(lab[b]), C, p ? p + b * C : nullptr);
  }
};

template <class T, class L>
struct NllRow {
  const T* x;
  const L* lab;
  op_math_t<T>* loss;
  std::int64_t C;
  QGRAD_HD void operator()(std::int64_t b) const {
    loss[b] = formulas::nll_row(x + b * C, static_cast<std::int64_t>(lab[b]), C);
  }
};

// The gradient of cross-entropy (from the softmax probabilities p) or of nll
// (p unused). The upstream gradient g is a scalar tensor on the device: each
// index reads it (no host sync on CUDA).
template <class T, class L, bool kCrossEntropy>
struct LabelLossGrad {
  const T* p;
  const L* lab;
  const T* pg;
  T* d;
  std::int64_t B, C;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const M gb = M(pg[0]) / M(B);
    const auto label = static_cast<std::int64_t>(lab[i / C]);
    if constexpr (kCrossEntropy) d[i] = formulas::cross_entropy_grad_at(p, label, i, C, gb);
    else d[i] = formulas::nll_grad_at<T>(label, i, C, gb);
  }
};

template <class T>
const T* cdata(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <class T>
T* mdata(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

void log_softmax(const Tensor& x, const Tensor& y, const AxisLayout& v) {
  if (y.is_cuda() && cuda::use_warp_rows(v)) {
    QGRAD_ON_CUDA(cuda::log_softmax_warp_rows(x, y, v));
    return;
  }
  dispatch_floating(y.dtype(), "log_softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), v.outer * v.inner, LogSoftmaxRow<T, false>{cdata<T>(x), nullptr, mdata<T>(y), v},
                   "log_softmax");
  });
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisLayout& v) {
  if (dx.is_cuda() && cuda::use_warp_rows(v)) {
    QGRAD_ON_CUDA(cuda::log_softmax_backward_warp_rows(y, dy, dx, v));
    return;
  }
  dispatch_floating(dx.dtype(), "log_softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dx.device(), v.outer * v.inner,
                   LogSoftmaxRow<T, true>{cdata<T>(y), cdata<T>(dy), mdata<T>(dx), v}, "log_softmax_backward");
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs, const Tensor& row_loss) {
  const std::int64_t B = logits.size(0), C = logits.size(1);
  if (row_loss.is_cuda() && cuda::use_warp_rows(AxisLayout{B, C, 1})) {
    QGRAD_ON_CUDA(cuda::cross_entropy_forward_warp_rows(logits, labels, probs, row_loss));
    return;
  }
  dispatch_floating_label(logits.dtype(), labels.dtype(), "cross_entropy", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using L = typename decltype(ltag)::type;
    T* p = probs.defined() ? mdata<T>(probs) : nullptr;
    for_each_index(row_loss.device(), B,
                   CrossEntropyRow<T, L>{cdata<T>(logits), cdata<L>(labels), p, mdata<op_math_t<T>>(row_loss), C},
                   "cross_entropy");
  });
}

bool cross_entropy_mean(const Tensor& logits, [[maybe_unused]] const Tensor& labels,  // used on CUDA only
                        [[maybe_unused]] const Tensor& probs, const Tensor& mean) {
  const std::int64_t B = logits.size(0), C = logits.size(1);
  if (!mean.is_cuda() || B < 1 || B > std::int64_t{cuda::kSumBlockThreads} || cuda::use_warp_rows(AxisLayout{B, C, 1}))
    return false;
  QGRAD_ON_CUDA(cuda::cross_entropy_mean_one_block(logits, labels, probs, mean));
  return true;
}

void cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& g, const Tensor& dlogits) {
  dispatch_floating_label(probs.dtype(), labels.dtype(), "cross_entropy_backward", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using L = typename decltype(ltag)::type;
    const std::int64_t B = probs.size(0), C = probs.size(1);
    for_each_index(dlogits.device(), B * C,
                   LabelLossGrad<T, L, true>{cdata<T>(probs), cdata<L>(labels), cdata<T>(g), mdata<T>(dlogits), B, C},
                   "cross_entropy_backward");
  });
}

void nll_forward(const Tensor& logp, const Tensor& labels, const Tensor& row_loss) {
  dispatch_floating_label(logp.dtype(), labels.dtype(), "nll_loss", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using L = typename decltype(ltag)::type;
    for_each_index(row_loss.device(), logp.size(0),
                   NllRow<T, L>{cdata<T>(logp), cdata<L>(labels), mdata<op_math_t<T>>(row_loss), logp.size(1)},
                   "nll_loss");
  });
}

void nll_backward(const Tensor& labels, const Tensor& g, const Tensor& dlogp) {
  dispatch_floating_label(dlogp.dtype(), labels.dtype(), "nll_loss_backward", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using L = typename decltype(ltag)::type;
    const std::int64_t B = dlogp.size(0), C = dlogp.size(1);
    for_each_index(dlogp.device(), B * C,
                   LabelLossGrad<T, L, false>{nullptr, cdata<L>(labels), cdata<T>(g), mdata<T>(dlogp), B, C},
                   "nll_loss_backward");
  });
}

}  // namespace qgrad::kernels
