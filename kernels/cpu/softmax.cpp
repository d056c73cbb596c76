#include "kernels/softmax.h"

#include "kernels/cpu/parallel.h"
#include "kernels/formulas/softmax.h"

namespace qgrad::kernels::cpu {

using formulas::exp_m;
using formulas::log_m;
using formulas::max_nan;

void log_softmax(const Tensor& x, const Tensor& y, const AxisView& v) {
  dispatch_floating(y.dtype(), "log_softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* in = static_cast<const T*>(x.data_ptr());
    T* out = static_cast<T*>(y.data_ptr());
    parallel_for(v.outer * v.inner, [&](std::int64_t row) {
      const std::int64_t base = (row / v.inner) * v.n * v.inner + row % v.inner;
      M mx = M(in[base]);
      for (std::int64_t r = 1; r < v.n; ++r) mx = max_nan(mx, M(in[base + r * v.inner]));
      M sum = M(0);
      for (std::int64_t r = 0; r < v.n; ++r) sum += exp_m(M(in[base + r * v.inner]) - mx);
      const M lse = log_m(sum);
      for (std::int64_t r = 0; r < v.n; ++r) out[base + r * v.inner] = T((M(in[base + r * v.inner]) - mx) - lse);
    });
  });
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisView& v) {
  dispatch_floating(dx.dtype(), "log_softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* py = static_cast<const T*>(y.data_ptr());
    const T* pg = static_cast<const T*>(dy.data_ptr());
    T* out = static_cast<T*>(dx.data_ptr());
    parallel_for(v.outer * v.inner, [&](std::int64_t row) {
      const std::int64_t base = (row / v.inner) * v.n * v.inner + row % v.inner;
      M sum = M(0);
      for (std::int64_t r = 0; r < v.n; ++r) sum += M(pg[base + r * v.inner]);
      for (std::int64_t r = 0; r < v.n; ++r) {
        const std::int64_t i = base + r * v.inner;
        out[i] = T(formulas::log_softmax_grad(M(pg[i]), M(py[i]), sum));
      }
    });
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs, const Tensor& row_loss) {
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    dispatch_label(labels.dtype(), [&](auto ltag) {
      using L = typename decltype(ltag)::type;
      const std::int64_t B = logits.size(0), C = logits.size(1);
      const T* x = static_cast<const T*>(logits.data_ptr());
      const L* lab = static_cast<const L*>(labels.data_ptr());
      T* p = probs.defined() ? static_cast<T*>(probs.data_ptr()) : nullptr;
      M* loss = static_cast<M*>(row_loss.data_ptr());
      parallel_for(B, [&](std::int64_t b) {
        const T* row = x + b * C;
        M mx = M(row[0]);
        for (std::int64_t c = 1; c < C; ++c) mx = max_nan(mx, M(row[c]));
        M sum = M(0);
        for (std::int64_t c = 0; c < C; ++c) sum += exp_m(M(row[c]) - mx);
        const std::int64_t label = static_cast<std::int64_t>(lab[b]);
        loss[b] = (label >= 0 && label < C) ? log_m(sum) - (M(row[label]) - mx) : formulas::quiet_nan<M>();
        if (p)
          for (std::int64_t c = 0; c < C; ++c) p[b * C + c] = T(exp_m(M(row[c]) - mx) / sum);
      });
    });
  });
}

void cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& g, const Tensor& dlogits) {
  dispatch_floating(probs.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    dispatch_label(labels.dtype(), [&](auto ltag) {
      using L = typename decltype(ltag)::type;
      const std::int64_t B = probs.size(0), C = probs.size(1);
      const T* p = static_cast<const T*>(probs.data_ptr());
      const L* lab = static_cast<const L*>(labels.data_ptr());
      const M gb = M(static_cast<const T*>(g.data_ptr())[0]) / M(B);
      T* d = static_cast<T*>(dlogits.data_ptr());
      parallel_for(B * C, [&](std::int64_t i) {
        const std::int64_t label = static_cast<std::int64_t>(lab[i / C]);
        const bool valid = label >= 0 && label < C;
        d[i] = T(valid ? formulas::cross_entropy_grad(M(p[i]), label == i % C, gb) : formulas::quiet_nan<M>());
      });
    });
  });
}

}  // namespace qgrad::kernels::cpu
