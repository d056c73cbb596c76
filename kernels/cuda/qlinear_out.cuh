// The W8A8 linear's output as its CUDA kernels apply it to an exact int32 sum
// (formulas/qlinear.h), shared by qlinear.cu (the epilogue pass over
// cuBLASLt's int32 matrix, the decode-size GEMV) and qlinear_sm90a.cu (the
// Hopper GEMM with the epilogue fused): one formula, one argument pack.
#pragma once

#include <cstdint>

#include "qgrad/core/half.h"
#include "qgrad/core/tensor.h"
#include "qgrad/kernels/formulas/qlinear.h"
#include "qgrad/kernels/qlinear.h"

namespace qgrad::kernels::cuda {

// The activation scale as the kernel sees it: a device pointer (f32 or
// f64; stride 1 per row, 0 for a device scalar) or a host value.
struct ScaleArg {
  const float* f32 = nullptr;
  const double* f64 = nullptr;
  double host = 0;
  bool host_is_f64 = false;
  std::int64_t stride = 0;

  template <class M>
  __device__ M at(std::int64_t m) const {
    if (f32) return M(f32[m * stride]);
    if (f64) return M(f64[m * stride]);
    return host_is_f64 ? M(host) : M(static_cast<float>(host));
  }
};

// y[m, n] from acc = sum_k a[m, k] w[n, k]: row(m) and col(n) read a row's
// and a column's terms, at(row, col, acc) applies the formula. A kernel that
// stores between its reads (the Hopper GEMM's epilogue) reads the terms first:
// out may alias them as far as the compiler knows, so a read after a store
// waits for the store's turn.
template <class T>
struct QLinearOut {
  using Mt = op_math_t<T>;
  struct Row {
    Mt sa;
    std::int32_t za;
  };
  struct Col {
    Mt sw, bias;
    std::int32_t wsum;
  };
  ScaleArg sa;
  const float* sw = nullptr;
  const Mt* bias = nullptr;
  const std::int32_t* za = nullptr;    // asymmetric activations: per-row zero points
  const std::int32_t* wsum = nullptr;  // and the weight's row sums
  T* out = nullptr;

  __device__ Row row(std::int64_t m) const { return Row{sa.at<Mt>(m), za ? za[m] : 0}; }
  __device__ Col col(std::int64_t n) const { return Col{Mt(sw[n]), bias ? bias[n] : Mt(0), za ? wsum[n] : 0}; }
  // The value before its rounding to T; kZeroPoint: za != nullptr, decided
  // once by the caller rather than per element.
  template <bool kZeroPoint>
  __device__ Mt value(const Row& r, const Col& c, std::int32_t acc) const {
    if constexpr (kZeroPoint) return formulas::qlinear_epilogue_zp<Mt>(acc, r.za, c.wsum, r.sa, c.sw, c.bias, bias != nullptr);
    else return formulas::qlinear_epilogue<Mt>(acc, r.sa, c.sw, c.bias, bias != nullptr);
  }
  __device__ T at(const Row& r, const Col& c, std::int32_t acc) const {
    return za ? T(value<true>(r, c, acc)) : T(value<false>(r, c, acc));
  }
  __device__ T at(const Row& r, std::int32_t acc, std::int64_t n) const { return at(r, col(n), acc); }
};

inline ScaleArg scale_arg(const QLinearEpilogue& ep) {
  ScaleArg sa;
  if (ep.sa.is_cuda()) {
    if (ep.sa.dtype() == DType::f64) sa.f64 = static_cast<const double*>(ep.sa.data_ptr());
    else sa.f32 = static_cast<const float*>(ep.sa.data_ptr());
  } else {  // a host scalar (static scale kept on the host): read here, no sync
    sa.host_is_f64 = ep.sa.dtype() == DType::f64;
    sa.host = sa.host_is_f64 ? static_cast<const double*>(ep.sa.data_ptr())[0]
                             : static_cast<const float*>(ep.sa.data_ptr())[0];
  }
  sa.stride = ep.per_row ? 1 : 0;
  return sa;
}

template <class T>
QLinearOut<T> qlinear_out(const QLinearEpilogue& ep, const Tensor& out) {
  QLinearOut<T> o;
  o.sa = scale_arg(ep);
  o.sw = static_cast<const float*>(ep.sw.data_ptr());
  o.bias = ep.bias.defined() ? static_cast<const op_math_t<T>*>(ep.bias.data_ptr()) : nullptr;
  o.za = ep.za.defined() ? static_cast<const std::int32_t*>(ep.za.data_ptr()) : nullptr;
  o.wsum = o.za ? static_cast<const std::int32_t*>(ep.wsum.data_ptr()) : nullptr;
  o.out = static_cast<T*>(out.data_ptr());
  return o;
}

// The Hopper W8A8 GEMM with this epilogue fused (qlinear_sm90a.cu; built
// where the CUDA architectures include 90, as sm_90a). Returns false,
// launching nothing, where it does not apply: no sm_90a build, a device other
// than compute capability 9.0, or a shape it does not take (see the source).
// a: s8 [M, lda], w: s8 [N, ldw] (16-byte aligned rows; columns K..ld ignored).
// w_ready: the kernel launched just before on the stream does not write w
// (see QLinearEpilogue::w_untouched_by_prior_kernel), so the GEMM may load
// its first weight stages before waiting for that kernel.
template <class T>
bool qlinear_sm90a(int device, const std::int8_t* a, std::int64_t lda, const std::int8_t* w, std::int64_t ldw,
                   std::int64_t M, std::int64_t N, std::int64_t K, const QLinearOut<T>& out, bool w_ready);

}  // namespace qgrad::kernels::cuda
