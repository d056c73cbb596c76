#include "qgrad/kernels/qlinear.h"

#include <algorithm>

#include "qgrad/kernels/dynamic_quant.h"
#include "qgrad/kernels/formulas/qlinear.h"

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
        o[m * cols + n] = T(formulas::qlinear_epilogue<M>(acc, sa, M(sw[n]), bias ? bias[n] : M(0), bias != nullptr));
      }
    }
  });
}

}  // namespace

void qlinear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
             const Tensor& out) {
  dispatch_floating(out.dtype(), "quantized_linear",
                    [&](auto tag) { qlinear_impl<typename decltype(tag)::type>(a, lda, K, w, ep, out); });
}

}  // namespace qgrad::kernels::cpu
