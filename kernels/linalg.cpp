#include "qgrad/kernels/linalg.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

PermuteIndex make_transpose_index(const Shape& shape, std::int64_t dim0, std::int64_t dim1) {
  PermuteIndex p;
  p.ndim = static_cast<int>(shape.size());
  std::int64_t in_strides[kMaxTransposeDims] = {};
  std::int64_t stride = 1;
  for (int d = p.ndim - 1; d >= 0; --d) {
    in_strides[d] = stride;
    stride *= shape[static_cast<std::size_t>(d)];
  }
  for (int d = 0; d < p.ndim; ++d) {
    const int src = d == dim0 ? static_cast<int>(dim1) : d == dim1 ? static_cast<int>(dim0) : d;
    p.sizes[d] = shape[static_cast<std::size_t>(src)];
    p.strides[d] = in_strides[src];
  }
  return p;
}

void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate) {
  if (c.is_cuda()) QGRAD_ON_CUDA(cuda::gemm(s, a, b, c, accumulate));
  else cpu::gemm(s, a, b, c, accumulate);
}
void fill_rows(const Tensor& row, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::fill_rows(row, out));
  else cpu::fill_rows(row, out);
}
void transpose(const Tensor& in, const Tensor& out, std::int64_t dim0, std::int64_t dim1) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::transpose(in, out, dim0, dim1));
  else cpu::transpose(in, out, dim0, dim1);
}

}  // namespace qgrad::kernels
