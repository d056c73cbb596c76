// The linalg kernels: the GEMM (Eigen on the CPU, cuBLAS on CUDA) and the
// bias broadcast and transpose copy, written once over kernels/loop.h.
#include "qgrad/kernels/linalg.h"

#include <cstring>

#include "qgrad/kernels/binary.h"
#include "qgrad/kernels/cpu/gemm.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/loop.h"

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

namespace {

template <class U>
struct FillRows {
  const U* r;
  U* o;
  std::int64_t len;
  QGRAD_HD void operator()(std::int64_t i) const { o[i] = r[i % len]; }
};

template <class U>
struct Transpose {
  const U* x;
  U* y;
  PermuteIndex p;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = x[p.offset(i)]; }
};

}  // namespace

void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate) {
  if (c.is_cuda()) QGRAD_ON_CUDA(cuda::gemm(s, a, b, c, accumulate));
  else cpu::gemm(s, a, b, c, accumulate);
}

void fill_rows(const Tensor& row, const Tensor& out) {
  const std::int64_t len = row.numel();
  if (len == 0) return;
  if (!out.is_cuda()) {
    // Whole rows by memcpy: on the host faster than an index per element.
    const std::size_t bytes = row.nbytes();
    const auto* src = static_cast<const unsigned char*>(row.data_ptr());
    auto* dst = static_cast<unsigned char*>(out.data_ptr());
    const std::int64_t rows = out.numel() / len;
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(dst + static_cast<std::size_t>(r) * bytes, src, bytes);
    return;
  }
  dispatch_size(dtype_size(out.dtype()), [&](auto tag) {
    using U = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(),
                   FillRows<U>{static_cast<const U*>(row.data_ptr()), static_cast<U*>(out.data_ptr()), len},
                   "fill_rows");
  });
}

void linear_bias(const GemmShape& s, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  if (out.is_cuda()) {
    bool done = false;
    QGRAD_ON_CUDA(done = cuda::linear_bias_lt(s, x, w, bias, out));
    if (done) return;
  }
  fill_rows(bias, out);
  gemm(s, x, w, out, /*accumulate=*/true);
}

void linear_bias_add(const GemmShape& s, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual,
                     const Tensor& out) {
  if (out.is_cuda() && bias.defined()) {
    bool done = false;
    QGRAD_ON_CUDA(done = cuda::linear_bias_lt(s, x, w, bias, out, residual));
    if (done) return;
  }
  gemm(s, x, w, out);
  // Elementwise (the bias broadcast along rows), so in place is safe.
  binary(formulas::BinaryOp::add, out, residual, out);
  if (bias.defined()) binary(formulas::BinaryOp::add, out, bias, out);
}

void transpose(const Tensor& in, const Tensor& out, std::int64_t dim0, std::int64_t dim1) {
  const PermuteIndex p = make_transpose_index(in.shape(), dim0, dim1);
  dispatch_size(dtype_size(in.dtype()), [&](auto tag) {
    using U = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(),
                   Transpose<U>{static_cast<const U*>(in.data_ptr()), static_cast<U*>(out.data_ptr()), p}, "transpose");
  });
}

}  // namespace qgrad::kernels
