#include "qgrad/kernels/qlinear.h"

#include "qgrad/kernels/dispatch.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {
// One weight row per index; wraps modulo 2^32 like the GEMM's int32 sum.
struct WeightRowSum {
  const std::int8_t* w;
  std::int32_t* out;
  std::int64_t K;
  QGRAD_HD void operator()(std::int64_t n) const {
    std::uint32_t s = 0;
    for (std::int64_t k = 0; k < K; ++k) s += static_cast<std::uint32_t>(static_cast<std::int32_t>(w[n * K + k]));
    out[n] = static_cast<std::int32_t>(s);
  }
};
}  // namespace

void qlinear_weight_row_sums(const Tensor& w, const Tensor& wsum) {
  const std::int64_t N = w.shape()[0], K = w.shape()[1];
  for_each_index(w.device(), N,
                 WeightRowSum{static_cast<const std::int8_t*>(w.data_ptr()), static_cast<std::int32_t*>(wsum.data_ptr()), K},
                 "quantized_linear", 1);
}

std::int64_t qlinear_lda(Device device, std::int64_t K) { return device.is_cuda() ? (K + 15) / 16 * 16 : K; }

void qlinear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
             const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::qlinear(a, lda, K, w, ep, out));
  else cpu::qlinear(a, lda, K, w, ep, out);
}

}  // namespace qgrad::kernels
