#include "qgrad/kernels/dynamic_quant.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

void dynamic_quantize(const Tensor& x, const AxisLayout& layout, std::int64_t group, const QuantSpec& spec,
                      const Tensor& q, const Tensor& scale, const Tensor& zero_point) {
  if (q.is_cuda()) QGRAD_ON_CUDA(cuda::dynamic_quantize(x, layout, group, spec, q, scale, zero_point));
  else cpu::dynamic_quantize(x, layout, group, spec, q, scale, zero_point);
}

void quantize_rows_dynamic(const Tensor& x, std::int64_t D, const QuantSpec& spec, const Tensor& q, std::int64_t ldq,
                           const Tensor& scale, const Tensor& zero_point) {
  if (q.is_cuda()) QGRAD_ON_CUDA(cuda::quantize_rows_dynamic(x, D, spec, q, ldq, scale, zero_point));
  else cpu::quantize_rows_dynamic(x, D, spec, q, ldq, scale, zero_point);
}

void quantize_rows_static(const Tensor& x, std::int64_t D, const Tensor& scale, const Tensor& zero_point, int qmin,
                          int qmax, const Tensor& q, std::int64_t ldq) {
  if (q.is_cuda()) QGRAD_ON_CUDA(cuda::quantize_rows_static(x, D, scale, zero_point, qmin, qmax, q, ldq));
  else cpu::quantize_rows_static(x, D, scale, zero_point, qmin, qmax, q, ldq);
}

void column_absmax_update(const Tensor& x, std::int64_t D, const Tensor& amax) {
  if (amax.is_cuda()) QGRAD_ON_CUDA(cuda::column_absmax_update(x, D, amax));
  else cpu::column_absmax_update(x, D, amax);
}

}  // namespace qgrad::kernels
