#include "qgrad/kernels/basic.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

void fill(const Tensor& out, double value) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::fill(out, value));
  else cpu::fill(out, value);
}
void cast(const Tensor& in, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::cast(in, out));
  else cpu::cast(in, out);
}
void rand_uniform(const Tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::rand_uniform(out, seed, offset, low, high));
  else cpu::rand_uniform(out, seed, offset, low, high);
}
void arange(const Tensor& out, double start, double step) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::arange(out, start, step));
  else cpu::arange(out, start, step);
}

}  // namespace qgrad::kernels
