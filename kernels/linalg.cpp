// The linalg kernels: the GEMM (Eigen on the CPU, cuBLAS on CUDA) and the
// bias broadcast and transpose copy, written once over kernels/loop.h.
#include "qgrad/kernels/linalg.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "qgrad/kernels/binary.h"
#include "qgrad/kernels/cpu/gemm.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/dispatch.h"
#include "qgrad/kernels/loop.h"
#include "qgrad/kernels/vec4.h"

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

// I: the index type of the modulo (32 bits where the count fits). A 64-bit
// modulo and a 4-byte store per element left the bias fill of a [4096, 1024]
// f32 output at 10.5 us, under half the bandwidth (H200, ncu); fill_rows
// copies 16-byte units where it can.
template <class U, class I = std::int64_t>
struct FillRows {
  const U* r;
  U* o;
  I len;
  QGRAD_HD void operator()(std::int64_t i) const { o[i] = r[static_cast<I>(i) % len]; }
};

template <class U>
struct Transpose {
  const U* x;
  U* y;
  PermuteIndex p;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = x[p.offset(i)]; }
};

// linear_add's two adds in one pass: o = add(add(o, r), b along rows), the
// add op's formula twice, each rounded to T: the bits of the two binary
// calls it replaces (the ViT's bf16 out_proj and fc2, whose cuBLASLt
// epilogue rounds once: 4.6 + 9.8 us became one launch). One index per
// element (CUDA), per row (CPU, ResidualBiasRows) or per four elements
// (ResidualBiasFour: CUDA, rows a multiple of 4, aligned pointers).
template <class T>
struct ResidualBias {
  const T* r;
  const T* b;
  T* o;
  std::int64_t n;  // row length
  QGRAD_HD static T at(T ov, T rv, T bv) {
    using M = op_math_t<T>;
    const T with_residual = T(formulas::binary_apply<M>(formulas::BinaryOp::add, M(ov), M(rv)));
    return T(formulas::binary_apply<M>(formulas::BinaryOp::add, M(with_residual), M(bv)));
  }
  QGRAD_HD void operator()(std::int64_t i) const { o[i] = at(o[i], r[i], b[i % n]); }
};
template <class T>
struct ResidualBiasRows {
  ResidualBias<T> e;
  QGRAD_HD void operator()(std::int64_t row) const {
    const std::int64_t base = row * e.n;
    for (std::int64_t j = 0; j < e.n; ++j) e.o[base + j] = ResidualBias<T>::at(e.o[base + j], e.r[base + j], e.b[j]);
  }
};
template <class T>
struct ResidualBiasFour {
  ResidualBias<T> e;
  QGRAD_HD void operator()(std::int64_t q) const {
    const Vec4<T> ov = reinterpret_cast<const Vec4<T>*>(e.o)[q], rv = reinterpret_cast<const Vec4<T>*>(e.r)[q];
    const std::int64_t col = 4 * q % e.n;
    Vec4<T> out;
    for (int k = 0; k < 4; ++k) out.v[k] = ResidualBias<T>::at(ov.v[k], rv.v[k], e.b[col + k]);
    reinterpret_cast<Vec4<T>*>(e.o)[q] = out;
  }
};

// out = add(add(out, residual), bias along rows) in one pass.
void add_residual_bias(const Tensor& out, const Tensor& residual, const Tensor& bias) {
  const std::int64_t n = bias.numel(), total = out.numel();
  if (n == 0 || total == 0) return;
  dispatch_floating(out.dtype(), "linear_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ResidualBias<T> e{static_cast<const T*>(residual.data_ptr()), static_cast<const T*>(bias.data_ptr()),
                            static_cast<T*>(out.data_ptr()), n};
    if (!out.is_cuda()) {
      for_each_index(out.device(), total / n, ResidualBiasRows<T>{e}, "linear_add",
                     std::max<std::int64_t>(1, cpu::kParallelGrain / n));
    } else if (n % 4 == 0 && vec4_aligned<T>(e.o) && vec4_aligned<T>(e.r)) {
      for_each_index(out.device(), total / 4, ResidualBiasFour<T>{e}, "linear_add");
    } else {
      for_each_index(out.device(), total, e, "linear_add");
    }
  });
}

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
  // Rows of whole 16-byte units copy as those (one 128-bit load and store an index).
  const std::size_t unit = row.nbytes() % 16 == 0 && reinterpret_cast<std::uintptr_t>(row.data_ptr()) % 16 == 0 &&
                                   reinterpret_cast<std::uintptr_t>(out.data_ptr()) % 16 == 0
                               ? 16
                               : dtype_size(out.dtype());
  const std::int64_t n = out.nbytes() / unit, per_row = row.nbytes() / unit;
  dispatch_size(unit, [&](auto tag) {
    using U = typename decltype(tag)::type;
    const auto* r = static_cast<const U*>(row.data_ptr());
    auto* o = static_cast<U*>(out.data_ptr());
    auto run = [&](auto f) {
      if constexpr (std::is_same_v<U, Bytes16>) for_each_index_once(out.device(), n, f, "fill_rows");
      else for_each_index(out.device(), n, f, "fill_rows");
    };
    if (n <= std::numeric_limits<std::uint32_t>::max())
      run(FillRows<U, std::uint32_t>{r, o, static_cast<std::uint32_t>(per_row)});
    else
      run(FillRows<U>{r, o, per_row});
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
  if (bias.defined()) add_residual_bias(out, residual, bias);
  else binary(formulas::BinaryOp::add, out, residual, out);
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
