#include "qgrad/kernels/qlinear.h"

#include <algorithm>

#include "qgrad/kernels/dynamic_quant.h"
#include "qgrad/kernels/formulas/qlinear.h"
#include "qgrad/kernels/qconv.h"

namespace qgrad::kernels::cpu {

namespace {

// Exact int32 dot product of two int8 rows. Products are at most 2^14, so
// K < 2^17 cannot overflow; beyond that the sum wraps modulo 2^32 (computed
// in unsigned arithmetic: defined behaviour), as the GPU's int32 does.
inline std::int32_t dot_s8(const std::int8_t* a, const std::int8_t* w, std::int64_t K) {
  std::uint32_t acc = 0;
  for (std::int64_t k = 0; k < K; ++k)
    acc += static_cast<std::uint32_t>(static_cast<std::int32_t>(a[k]) * static_cast<std::int32_t>(w[k]));
  return static_cast<std::int32_t>(acc);
}

template <class T>
void qlinear_impl(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
                  const Tensor& out) {
  using M = op_math_t<T>;
  const std::int64_t rows = out.shape()[0], cols = out.shape()[1];
  const std::int8_t* ap = static_cast<const std::int8_t*>(a.data_ptr());
  const std::int8_t* wp = static_cast<const std::int8_t*>(w.data_ptr());
  const float* sw = static_cast<const float*>(ep.sw.data_ptr());
  const M* bias = ep.bias.defined() ? static_cast<const M*>(ep.bias.data_ptr()) : nullptr;
  const bool sa64 = ep.sa.dtype() == DType::f64;
  const void* sap = ep.sa.data_ptr();
  const std::int64_t sa_stride = ep.per_row ? 1 : 0;
  const std::int32_t* za = ep.za.defined() ? static_cast<const std::int32_t*>(ep.za.data_ptr()) : nullptr;
  const std::int32_t* wsum = za ? static_cast<const std::int32_t*>(ep.wsum.data_ptr()) : nullptr;
  T* o = static_cast<T*>(out.data_ptr());
  // Tiles of 4 rows x 64 output channels: the 64 weight rows stay in cache
  // while the 4 activation rows stream through them.
  constexpr std::int64_t TM = 4, TN = 64;
  const std::int64_t tiles_m = (rows + TM - 1) / TM, tiles_n = (cols + TN - 1) / TN;
  parallel_rows(tiles_m * tiles_n, TM * TN * K, [&](std::int64_t t) {
    const std::int64_t m0 = (t / tiles_n) * TM, n0 = (t % tiles_n) * TN;
    const std::int64_t m1 = std::min(rows, m0 + TM), n1 = std::min(cols, n0 + TN);
    for (std::int64_t m = m0; m < m1; ++m) {
      const M sa = sa64 ? M(static_cast<const double*>(sap)[m * sa_stride])
                        : M(static_cast<const float*>(sap)[m * sa_stride]);
      for (std::int64_t n = n0; n < n1; ++n) {
        const std::int32_t acc = dot_s8(ap + m * lda, wp + n * K, K);
        const M b = bias ? bias[n] : M(0);
        o[m * cols + n] = za ? T(formulas::qlinear_epilogue_zp<M>(acc, za[m], wsum[n], sa, M(sw[n]), b, bias != nullptr))
                             : T(formulas::qlinear_epilogue<M>(acc, sa, M(sw[n]), b, bias != nullptr));
      }
    }
  });
}

// The int8 convolution (kernels/qconv.h): the same dot products and tiles
// per group, rows m = n P + p of the column matrix, the epilogue writing
// out[n, g Og + o, p]. The activation scale is a host scalar.
template <class T>
void qconv_impl(const Conv2dShape& s, const Tensor& col, std::int64_t lda, const Tensor& w, const QLinearEpilogue& ep,
                const Tensor& out) {
  using M = op_math_t<T>;
  const std::int64_t Og = s.o_per_group(), K = s.patch(), P = s.oh * s.ow, rows = s.n * P;
  const std::int8_t* cp = static_cast<const std::int8_t*>(col.data_ptr());
  const std::int8_t* wp = static_cast<const std::int8_t*>(w.data_ptr());
  const float* sw = static_cast<const float*>(ep.sw.data_ptr());
  const M* bias = ep.bias.defined() ? static_cast<const M*>(ep.bias.data_ptr()) : nullptr;
  const M sa = M(static_cast<const float*>(ep.sa.data_ptr())[0]);
  T* o = static_cast<T*>(out.data_ptr());
  constexpr std::int64_t TM = 4, TN = 64;
  const std::int64_t tiles_m = (rows + TM - 1) / TM, tiles_n = (Og + TN - 1) / TN;
  parallel_rows(s.groups * tiles_m * tiles_n, TM * TN * K, [&](std::int64_t t) {
    const std::int64_t g = t / (tiles_m * tiles_n), r = t % (tiles_m * tiles_n);
    const std::int64_t m0 = (r / tiles_n) * TM, n0 = (r % tiles_n) * TN;
    const std::int64_t m1 = std::min(rows, m0 + TM), n1 = std::min(Og, n0 + TN);
    for (std::int64_t m = m0; m < m1; ++m) {
      const std::int64_t img = m / P, p = m % P;
      const std::int8_t* arow = cp + (g * rows + m) * lda;
      for (std::int64_t n = n0; n < n1; ++n) {
        const std::int64_t oc = g * Og + n;
        const std::int32_t acc = dot_s8(arow, wp + oc * K, K);
        o[(img * s.o + oc) * P + p] =
            T(formulas::qlinear_epilogue<M>(acc, sa, M(sw[oc]), bias ? bias[oc] : M(0), bias != nullptr));
      }
    }
  });
}

}  // namespace

void qconv_gemm(const Conv2dShape& s, const Tensor& col, std::int64_t lda, const Tensor& w, const QLinearEpilogue& ep,
                const Tensor& out) {
  dispatch_floating(out.dtype(), "quantized_conv2d",
                    [&](auto tag) { qconv_impl<typename decltype(tag)::type>(s, col, lda, w, ep, out); });
}

void qlinear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
             const Tensor& out) {
  dispatch_floating(out.dtype(), "quantized_linear",
                    [&](auto tag) { qlinear_impl<typename decltype(tag)::type>(a, lda, K, w, ep, out); });
}

}  // namespace qgrad::kernels::cpu
