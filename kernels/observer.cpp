#include "qgrad/kernels/observer.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

void observer_minmax(const Tensor& x, const Tensor& run_min, const Tensor& run_max, std::int64_t axis,
                     double averaging_constant, const ObserverQparams* q) {
  if (x.numel() == 0) {  // PyTorch's observers return early on empty input
    if (q) observer_qparams(run_min, run_max, q->scale, q->zero_point, q->qmin, q->qmax, q->symmetric,
                            q->symmetric_zero_point);
    return;
  }
  if (x.is_cuda()) QGRAD_ON_CUDA(cuda::observer_minmax(x, run_min, run_max, axis, averaging_constant, q));
  else cpu::observer_minmax(x, run_min, run_max, axis, averaging_constant, q);
}

void observer_qparams(const Tensor& run_min, const Tensor& run_max, const Tensor& scale, const Tensor& zero_point,
                      std::int64_t qmin, std::int64_t qmax, bool symmetric, std::int32_t symmetric_zero_point) {
  if (scale.is_cuda())
    QGRAD_ON_CUDA(cuda::observer_qparams(run_min, run_max, scale, zero_point, qmin, qmax, symmetric,
                                         symmetric_zero_point));
  else cpu::observer_qparams(run_min, run_max, scale, zero_point, qmin, qmax, symmetric, symmetric_zero_point);
}

}  // namespace qgrad::kernels
