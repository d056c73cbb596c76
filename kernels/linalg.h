// Kernels of matmul, linear and transpose.
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"
#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

// c[i] = op(a[i]) · op(b[i]) for i < batch, all row-major and contiguous:
// c[i] is [m, n]; a[i] is [m, k] ([k, m] when trans_a); b[i] is [k, n]
// ([n, k] when trans_b). With accumulate, c[i] += instead of =. a, b, c share
// a floating dtype and a device; m, n, k fit in int. k == 0 gives zeros.
// broadcast_a / broadcast_b: that operand is one matrix used by every batch
// (batch stride 0). f32_math: how f32 products run on CUDA (core/dtype.h
// Float32Matmul; qgrad::set_float32_matmul); no effect on the CPU or other
// dtypes. tf32x3 applies from kTf32x3MinMacs multiply-adds on; smaller f32
// products stay ieee (the split passes cost more than they save there).
struct GemmShape {
  std::int64_t batch = 1, m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool broadcast_a = false, broadcast_b = false;
  Float32Matmul f32_math = Float32Matmul::ieee;
};
inline constexpr double kTf32x3MinMacs = 134217728.0;  // 2^27
// Whether an f32 GEMM of shape s runs as tf32x3 (its setting, and large enough).
inline bool tf32x3_applies(const GemmShape& s) {
  return s.f32_math == Float32Matmul::tf32x3 && static_cast<double>(s.batch) * static_cast<double>(s.m) *
                                                        static_cast<double>(s.n) * static_cast<double>(s.k) >=
                                                    kTf32x3MinMacs;
}
void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate = false);
// out[r, :] = row for every row r of out ([rows, row.numel()]); same dtype.
void fill_rows(const Tensor& row, const Tensor& out);
// The linear's forward GEMM with its bias: out [m, n] = x [m, k] · w [n, k]ᵀ
// + bias [n] on every row (s: batch 1, trans_b, not trans_a; one floating
// dtype). Each element is the f32 (f64 for f64) dot product plus the bias,
// rounded once. CUDA f32/bf16/f16 GEMMs of at least 2^27 multiply-adds:
// cuBLASLt with the bias in its epilogue (no fill pass) where it has an
// algorithm for the shape; otherwise, and on the CPU, fill_rows then the
// GEMM accumulating onto it.
void linear_bias(const GemmShape& s, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);
// linear_add's forward: out = ((x · wᵀ) + residual) + bias: the GEMM's
// product in out's dtype, then add's formula with residual ([m, n], out's
// dtype), then with the bias along every row (cuBLASLt's epilogue order: C
// before the bias). CUDA: one cuBLASLt GEMM reading the residual as C (beta
// 1) where that plan was checked to give exactly those bits
// (kernels/cuda/lt_gemm.cuh); otherwise, and on the CPU, the three steps
// (the adds in place on out).
void linear_bias_add(const GemmShape& s, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual,
                     const Tensor& out);

// A permutation of dims as index arithmetic: out element i reads input
// offset offset(i). sizes are out's sizes, strides the input's strides of
// the dims that land at each position.
inline constexpr int kMaxTransposeDims = 8;
struct PermuteIndex {
  int ndim = 0;
  std::int64_t sizes[kMaxTransposeDims] = {};
  std::int64_t strides[kMaxTransposeDims] = {};
  // In index type I: std::uint32_t where every index and offset fits (a
  // 64-bit division is a long instruction sequence on CUDA).
  template <class I = std::int64_t>
  QGRAD_HD I offset(I i) const {
    I off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const auto size = static_cast<I>(sizes[d]);
      off += (i % size) * static_cast<I>(strides[d]);
      i /= size;
    }
    return off;
  }
};
// The index that swaps dim0 and dim1 of `shape` (rank <= kMaxTransposeDims).
PermuteIndex make_transpose_index(const Shape& shape, std::int64_t dim0, std::int64_t dim1);
// out = in with dims dim0 and dim1 swapped (any dtype; copies elements).
void transpose(const Tensor& in, const Tensor& out, std::int64_t dim0, std::int64_t dim1);

// 16 bytes copied as one (a 128-bit load and store on CUDA when aligned).
struct alignas(16) Bytes16 {
  std::uint32_t w[4];
};

// Calls f(TypeTag<U>{}) with U an unsigned integer of `size` bytes (1, 2, 4
// or 8) or Bytes16 (16, for copies that group elements): element copies
// only need the element size.
template <class F>
void dispatch_size(std::size_t size, F&& f) {
  switch (size) {
    case 1: f(TypeTag<std::uint8_t>{}); break;
    case 2: f(TypeTag<std::uint16_t>{}); break;
    case 4: f(TypeTag<std::uint32_t>{}); break;
    case 16: f(TypeTag<Bytes16>{}); break;
    default: f(TypeTag<std::uint64_t>{}); break;
  }
}

}  // namespace qgrad::kernels
