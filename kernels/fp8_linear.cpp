#include "qgrad/kernels/fp8_linear.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

std::int64_t fp8_linear_ld(Device device, std::int64_t K) { return device.is_cuda() ? (K + 15) / 16 * 16 : K; }

void fp8_quantize_rows(const Tensor& x, std::int64_t K, const Tensor& scale, bool dynamic, const Tensor& q,
                       std::int64_t ld) {
  if (x.is_cuda()) QGRAD_ON_CUDA(cuda::fp8_quantize_rows(x, K, scale, dynamic, q, ld));
  else cpu::fp8_quantize_rows(x, K, scale, dynamic, q, ld);
}

void fp8_gemm(const Tensor& q, std::int64_t ld, std::int64_t K, const Tensor& w, const Tensor& sx, const Tensor& sw,
              const Tensor& bias, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::fp8_gemm(q, ld, K, w, sx, sw, bias, out));
  else cpu::fp8_gemm(q, ld, K, w, sx, sw, bias, out);
}

}  // namespace qgrad::kernels
