#include "qgrad/kernels/softmax.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

void log_softmax(const Tensor& x, const Tensor& y, const AxisView& v) {
  if (y.is_cuda()) QGRAD_ON_CUDA(cuda::log_softmax(x, y, v));
  else cpu::log_softmax(x, y, v);
}
void log_softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, const AxisView& v) {
  if (dx.is_cuda()) QGRAD_ON_CUDA(cuda::log_softmax_backward(y, dy, dx, v));
  else cpu::log_softmax_backward(y, dy, dx, v);
}
void cross_entropy_forward(const Tensor& logits, const Tensor& labels, const Tensor& probs, const Tensor& row_loss) {
  if (row_loss.is_cuda()) QGRAD_ON_CUDA(cuda::cross_entropy_forward(logits, labels, probs, row_loss));
  else cpu::cross_entropy_forward(logits, labels, probs, row_loss);
}
void cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& g, const Tensor& dlogits) {
  if (dlogits.is_cuda()) QGRAD_ON_CUDA(cuda::cross_entropy_backward(probs, labels, g, dlogits));
  else cpu::cross_entropy_backward(probs, labels, g, dlogits);
}

void nll_forward(const Tensor& logp, const Tensor& labels, const Tensor& row_loss) {
  if (row_loss.is_cuda()) QGRAD_ON_CUDA(cuda::nll_forward(logp, labels, row_loss));
  else cpu::nll_forward(logp, labels, row_loss);
}
void nll_backward(const Tensor& labels, const Tensor& g, const Tensor& dlogp) {
  if (dlogp.is_cuda()) QGRAD_ON_CUDA(cuda::nll_backward(labels, g, dlogp));
  else cpu::nll_backward(labels, g, dlogp);
}

}  // namespace qgrad::kernels
