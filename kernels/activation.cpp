#include "qgrad/kernels/activation.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

void relu(const Tensor& in, const Tensor& out, const Tensor& mask) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::relu(in, out, mask));
  else cpu::relu(in, out, mask);
}
void relu_backward(const Tensor& g, const Tensor& mask, const Tensor& dx) {
  if (dx.is_cuda()) QGRAD_ON_CUDA(cuda::relu_backward(g, mask, dx));
  else cpu::relu_backward(g, mask, dx);
}

}  // namespace qgrad::kernels
