#include "qgrad/kernels/qlinear.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

std::int64_t qlinear_lda(Device device, std::int64_t K) { return device.is_cuda() ? (K + 15) / 16 * 16 : K; }

void qlinear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
             const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::qlinear(a, lda, K, w, ep, out));
  else cpu::qlinear(a, lda, K, w, ep, out);
}

}  // namespace qgrad::kernels
