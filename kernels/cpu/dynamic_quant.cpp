#include "qgrad/kernels/dynamic_quant.h"

#include <vector>

#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/formulas/qlinear.h"

namespace qgrad::kernels::cpu {

namespace {

using formulas::QParams;
using formulas::quant_math_t;
using formulas::Range;

template <class Q, class F>
void dispatch_x_q(DType xt, DType qt, const char* op, F&& f) {
  dispatch_floating(xt, op, [&](auto xtag) {
    dispatch_int8(qt, op, [&](auto qtag) { f(xtag, qtag); });
  });
}

template <class M>
void store_qparams(const Tensor& scale, const Tensor& zero_point, std::int64_t s, const QParams<M>& p) {
  static_cast<M*>(scale.data_ptr())[s] = p.scale;
  if (zero_point.defined()) static_cast<std::int32_t*>(zero_point.data_ptr())[s] = p.zero_point;
}

template <class X, class Q>
void dynamic_impl(const Tensor& x, const AxisLayout& lay, std::int64_t group, const QuantSpec& spec, const Tensor& q,
                  const Tensor& scale, const Tensor& zero_point) {
  using M = quant_math_t<X>;
  const X* xp = static_cast<const X*>(x.data_ptr());
  Q* qp = static_cast<Q*>(q.data_ptr());
  const std::int64_t nseg = segment_count(lay, group);
  std::vector<Range<M>> ranges(static_cast<std::size_t>(nseg), Range<M>::empty());
  if (group == 0) {
    parallel_for(lay.channels, [&](std::int64_t c) {
      Range<M> r = Range<M>::empty();
      for (std::int64_t o = 0; o < lay.outer; ++o) {
        const X* row = xp + (o * lay.channels + c) * lay.inner;
        for (std::int64_t i = 0; i < lay.inner; ++i) r.add(M(row[i]));
      }
      ranges[static_cast<std::size_t>(c)] = r;
    });
  } else {
    parallel_for(nseg, [&](std::int64_t s) {
      const X* base = xp + segment_base(lay, group, s);
      Range<M> r = Range<M>::empty();
      for (std::int64_t j = 0; j < group; ++j) r.add(M(base[j * lay.inner]));
      ranges[static_cast<std::size_t>(s)] = r;
    });
  }
  std::vector<QParams<M>> params(static_cast<std::size_t>(nseg));
  for (std::int64_t s = 0; s < nseg; ++s) {
    params[static_cast<std::size_t>(s)] =
        formulas::qparams_from_range<M>(ranges[static_cast<std::size_t>(s)], spec.symmetric, spec.qmin, spec.qmax);
    store_qparams<M>(scale, zero_point, s, params[static_cast<std::size_t>(s)]);
  }
  std::vector<M> inv(static_cast<std::size_t>(nseg));
  for (std::int64_t s = 0; s < nseg; ++s)
    inv[static_cast<std::size_t>(s)] = formulas::inverse_scale<M>(params[static_cast<std::size_t>(s)].scale);
  parallel_for(x.numel(), [&](std::int64_t i) {
    const auto s = static_cast<std::size_t>(segment_of(lay, group, i));
    qp[i] = static_cast<Q>(formulas::quantize_value<M>(M(xp[i]), inv[s], params[s].zero_point, spec.qmin, spec.qmax));
  });
}

template <class X, class Q>
void rows_dynamic_impl(const Tensor& x, std::int64_t D, const QuantSpec& spec, const Tensor& q, std::int64_t ldq,
                       const Tensor& scale, const Tensor& zero_point) {
  using M = quant_math_t<X>;
  const X* xp = static_cast<const X*>(x.data_ptr());
  Q* qp = static_cast<Q*>(q.data_ptr());
  const std::int64_t rows = D > 0 ? x.numel() / D : 0;
  parallel_rows(rows, D, [&](std::int64_t r) {
    const X* xr = xp + r * D;
    Q* qr = qp + r * ldq;
    Range<M> range = Range<M>::empty();
    for (std::int64_t j = 0; j < D; ++j) range.add(M(xr[j]));
    const QParams<M> p = formulas::qparams_from_range<M>(range, spec.symmetric, spec.qmin, spec.qmax);
    store_qparams<M>(scale, zero_point, r, p);
    const M inv = formulas::inverse_scale<M>(p.scale);
    for (std::int64_t j = 0; j < D; ++j)
      qr[j] = static_cast<Q>(formulas::quantize_value<M>(M(xr[j]), inv, p.zero_point, spec.qmin, spec.qmax));
    for (std::int64_t j = D; j < ldq; ++j) qr[j] = Q(0);
  });
}

template <class X>
void rows_static_impl(const Tensor& x, std::int64_t D, const Tensor& scale, const Tensor& zero_point, int qmin,
                      int qmax, const Tensor& q, std::int64_t ldq) {
  using M = quant_math_t<X>;
  const X* xp = static_cast<const X*>(x.data_ptr());
  std::int8_t* qp = static_cast<std::int8_t*>(q.data_ptr());
  const M inv = formulas::inverse_scale<M>(M(static_cast<const float*>(scale.data_ptr())[0]));
  const int za = static_cast<const std::int32_t*>(zero_point.data_ptr())[0];
  const std::int64_t rows = D > 0 ? x.numel() / D : 0;
  parallel_for(rows * ldq, [&](std::int64_t i) {
    const std::int64_t r = i / ldq, j = i % ldq;
    qp[i] = j < D ? formulas::quantize_shifted<M>(M(xp[r * D + j]), inv, za, qmin, qmax) : std::int8_t(0);
  });
}

}  // namespace

void dynamic_quantize(const Tensor& x, const AxisLayout& layout, std::int64_t group, const QuantSpec& spec,
                      const Tensor& q, const Tensor& scale, const Tensor& zero_point) {
  dispatch_x_q<void>(x.dtype(), q.dtype(), "dynamic_range_quantize", [&](auto xt, auto qt) {
    dynamic_impl<typename decltype(xt)::type, typename decltype(qt)::type>(x, layout, group, spec, q, scale,
                                                                           zero_point);
  });
}

void quantize_rows_dynamic(const Tensor& x, std::int64_t D, const QuantSpec& spec, const Tensor& q, std::int64_t ldq,
                           const Tensor& scale, const Tensor& zero_point) {
  dispatch_x_q<void>(x.dtype(), q.dtype(), "quantize_rows_dynamic", [&](auto xt, auto qt) {
    rows_dynamic_impl<typename decltype(xt)::type, typename decltype(qt)::type>(x, D, spec, q, ldq, scale, zero_point);
  });
}

void quantize_rows_static(const Tensor& x, std::int64_t D, const Tensor& scale, const Tensor& zero_point, int qmin,
                          int qmax, const Tensor& q, std::int64_t ldq) {
  dispatch_floating(x.dtype(), "quantize_rows_static", [&](auto xt) {
    rows_static_impl<typename decltype(xt)::type>(x, D, scale, zero_point, qmin, qmax, q, ldq);
  });
}

void column_absmax_update(const Tensor& x, std::int64_t D, const Tensor& amax) {
  dispatch_floating(x.dtype(), "SmoothQuantCalibrator", [&](auto xt) {
    using X = typename decltype(xt)::type;
    const X* xp = static_cast<const X*>(x.data_ptr());
    float* a = static_cast<float*>(amax.data_ptr());
    const std::int64_t rows = D > 0 ? x.numel() / D : 0;
    parallel_for(D, [&](std::int64_t j) {
      float m = a[j];
      for (std::int64_t r = 0; r < rows; ++r) m = formulas::absmax_update<float>(m, static_cast<float>(xp[r * D + j]));
      a[j] = m;
    });
  });
}

}  // namespace qgrad::kernels::cpu
