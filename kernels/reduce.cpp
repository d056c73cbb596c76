#include "qgrad/kernels/reduce.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

AxisView axis_view(const Shape& shape, std::int64_t axis) {
  AxisView v;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const auto di = static_cast<std::int64_t>(d);
    if (di < axis) v.outer *= shape[d];
    else if (di == axis) v.n = shape[d];
    else v.inner *= shape[d];
  }
  return v;
}

void sum_axis(const Tensor& in, const Tensor& out, const AxisView& v, bool mean) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::sum_axis(in, out, v, mean));
  else cpu::sum_axis(in, out, v, mean);
}
void expand_axis(const Tensor& in, const Tensor& out, const AxisView& v, double scale) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::expand_axis(in, out, v, scale));
  else cpu::expand_axis(in, out, v, scale);
}
void argmax_axis(const Tensor& in, const Tensor& out, const AxisView& v) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::argmax_axis(in, out, v));
  else cpu::argmax_axis(in, out, v);
}

}  // namespace qgrad::kernels
