#include "qgrad/kernels/softmax.h"

#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/formulas/softmax.h"

namespace qgrad::kernels::cpu {

void log_softmax(const Tensor& x, const Tensor& y, const AxisView& v) {
  dispatch_floating(y.dtype(), "log_softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x.data_ptr());
    T* out = static_cast<T*>(y.data_ptr());
    parallel_for(v.outer * v.inner, [&](std::int64_t row) {
      formulas::log_softmax_row(in + v.base(row), out + v.base(row), v.n, v.inner);
    });
  });
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisView& v) {
  dispatch_floating(dx.dtype(), "log_softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* py = static_cast<const T*>(y.data_ptr());
    const T* pg = static_cast<const T*>(dy.data_ptr());
    T* out = static_cast<T*>(dx.data_ptr());
    parallel_for(v.outer * v.inner, [&](std::int64_t row) {
      const std::int64_t b = v.base(row);
      formulas::log_softmax_backward_row(py + b, pg + b, out + b, v.n, v.inner);
    });
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs, const Tensor& row_loss) {
  dispatch_floating_label(logits.dtype(), labels.dtype(), "cross_entropy", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    using L = typename decltype(ltag)::type;
    const std::int64_t B = logits.size(0), C = logits.size(1);
    const T* x = static_cast<const T*>(logits.data_ptr());
    const L* lab = static_cast<const L*>(labels.data_ptr());
    T* p = probs.defined() ? static_cast<T*>(probs.data_ptr()) : nullptr;
    M* loss = static_cast<M*>(row_loss.data_ptr());
    parallel_for(B, [&](std::int64_t b) {
      loss[b] = formulas::cross_entropy_row(x + b * C, static_cast<std::int64_t>(lab[b]), C, p ? p + b * C : nullptr);
    });
  });
}

void cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& g, const Tensor& dlogits) {
  dispatch_floating_label(probs.dtype(), labels.dtype(), "cross_entropy_backward", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    using L = typename decltype(ltag)::type;
    const std::int64_t B = probs.size(0), C = probs.size(1);
    const T* p = static_cast<const T*>(probs.data_ptr());
    const L* lab = static_cast<const L*>(labels.data_ptr());
    const M gb = M(static_cast<const T*>(g.data_ptr())[0]) / M(B);
    T* d = static_cast<T*>(dlogits.data_ptr());
    parallel_for(B * C, [&](std::int64_t i) {
      d[i] = formulas::cross_entropy_grad_at(p, static_cast<std::int64_t>(lab[i / C]), i, C, gb);
    });
  });
}

void nll_forward(const Tensor& logp, const Tensor& labels, const Tensor& row_loss) {
  dispatch_floating_label(logp.dtype(), labels.dtype(), "nll_loss", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    using L = typename decltype(ltag)::type;
    const std::int64_t B = logp.size(0), C = logp.size(1);
    const T* x = static_cast<const T*>(logp.data_ptr());
    const L* lab = static_cast<const L*>(labels.data_ptr());
    M* loss = static_cast<M*>(row_loss.data_ptr());
    parallel_for(B, [&](std::int64_t b) { loss[b] = formulas::nll_row(x + b * C, static_cast<std::int64_t>(lab[b]), C); });
  });
}

void nll_backward(const Tensor& labels, const Tensor& g, const Tensor& dlogp) {
  dispatch_floating_label(dlogp.dtype(), labels.dtype(), "nll_loss_backward", [&](auto tag, auto ltag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    using L = typename decltype(ltag)::type;
    const std::int64_t B = dlogp.size(0), C = dlogp.size(1);
    const L* lab = static_cast<const L*>(labels.data_ptr());
    const M gb = M(static_cast<const T*>(g.data_ptr())[0]) / M(B);
    T* d = static_cast<T*>(dlogp.data_ptr());
    parallel_for(B * C, [&](std::int64_t i) {
      d[i] = formulas::nll_grad_at<T>(static_cast<std::int64_t>(lab[i / C]), i, C, gb);
    });
  });
}

}  // namespace qgrad::kernels::cpu
