#include "qgrad/kernels/binary.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

void binary(formulas::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::binary(op, a, b, out));
  else cpu::binary(op, a, b, out);
}
void binary_scalar(formulas::BinaryOp op, const Tensor& a, double b, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::binary_scalar(op, a, b, out));
  else cpu::binary_scalar(op, a, b, out);
}
void sum_to_shape(const Tensor& in, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::sum_to_shape(in, out));
  else cpu::sum_to_shape(in, out);
}

}  // namespace qgrad::kernels
