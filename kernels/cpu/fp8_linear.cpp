// CPU FP8 linear: the activation quantization (bit-identical with CUDA: the
// shared formulas of formulas/fp8_linear.h) and the reference GEMM: each
// product of two fp8 values is exact in f32, the products are summed in f64
// (exact for K < 2^17: the products span at most 2^36 and f64 holds 53
// bits), rounded once to f32, and the epilogue applied as cuBLASLt does.
#include <algorithm>
#include <string>
#include <vector>

#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/formulas/fp8_linear.h"
#include "qgrad/kernels/fp8_linear.h"

namespace qgrad::kernels::cpu {

namespace {

template <class T>
std::uint32_t amax_bits(const T* x, std::int64_t n) {
  constexpr std::int64_t chunk = 32768;
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<std::uint32_t> part(static_cast<std::size_t>(chunks), 0u);
  parallel_for(
      chunks,
      [&](std::int64_t c) {
        std::uint32_t m = 0;
        const std::int64_t end = std::min(n, (c + 1) * chunk);
        for (std::int64_t i = c * chunk; i < end; ++i) m = std::max(m, formulas::fp8_abs_bits(static_cast<float>(x[i])));
        part[static_cast<std::size_t>(c)] = m;
      },
      2);
  std::uint32_t m = 0;
  for (std::uint32_t p : part) m = std::max(m, p);
  return m;
}

template <class T>
void quantize_impl(const Tensor& x, std::int64_t K, const Tensor& scale, bool dynamic, const Tensor& q,
                   std::int64_t ld) {
  const T* xp = static_cast<const T*>(x.data_ptr());
  const std::int64_t M = x.numel() / K;
  float* sp = static_cast<float*>(scale.data_ptr());
  if (dynamic) sp[0] = formulas::fp8_linear_scale(amax_bits(xp, x.numel()));
  const float s = sp[0];
  auto* qp = static_cast<float8_e4m3*>(q.data_ptr());
  parallel_for(
      M,
      [&](std::int64_t m) {
        for (std::int64_t k = 0; k < K; ++k) qp[m * ld + k] = formulas::fp8_quant<float8_e4m3>(static_cast<float>(xp[m * K + k]), s);
        for (std::int64_t k = K; k < ld; ++k) qp[m * ld + k] = float8_e4m3::from_bits(0);
      },
      std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(K, 1)));
}

// The fp8 values of rows [R, K] of stride ld, as floats (exact).
std::vector<float> decode(const Tensor& t, std::int64_t rows, std::int64_t ld, std::int64_t K) {
  const auto* p = static_cast<const std::uint8_t*>(t.data_ptr());
  float table[256];
  for (int b = 0; b < 256; ++b) table[b] = f8e4m3_bits_to_float(static_cast<std::uint8_t>(b));
  std::vector<float> out(static_cast<std::size_t>(rows * K));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < K; ++k) out[static_cast<std::size_t>(r * K + k)] = table[p[r * ld + k]];
  return out;
}

template <class T>
void gemm_impl(const Tensor& q, std::int64_t ld, std::int64_t K, const Tensor& w, const Tensor& sx, const Tensor& sw,
               const Tensor& bias, const Tensor& out) {
  const std::int64_t M = out.shape()[0], N = out.shape()[1];
  const std::vector<float> a = decode(q, M, ld, K), b = decode(w, N, K, K);
  const float sxv = static_cast<const float*>(sx.data_ptr())[0];
  const float swv = static_cast<const float*>(sw.data_ptr())[0];
  const bfloat16* bp = bias.defined() ? static_cast<const bfloat16*>(bias.data_ptr()) : nullptr;
  T* o = static_cast<T*>(out.data_ptr());
  // Tiles of 4 rows x 64 output channels (the weight rows stay in cache).
  constexpr std::int64_t TM = 4, TN = 64;
  const std::int64_t tiles_m = (M + TM - 1) / TM, tiles_n = (N + TN - 1) / TN;
  parallel_for(
      tiles_m * tiles_n,
      [&](std::int64_t t) {
        const std::int64_t m0 = (t / tiles_n) * TM, n0 = (t % tiles_n) * TN;
        const std::int64_t m1 = std::min(M, m0 + TM), n1 = std::min(N, n0 + TN);
        for (std::int64_t m = m0; m < m1; ++m) {
          const float* ar = a.data() + m * K;
          for (std::int64_t n = n0; n < n1; ++n) {
            const float* br = b.data() + n * K;
            double acc = 0;
            for (std::int64_t k = 0; k < K; ++k) acc += static_cast<double>(ar[k] * br[k]);
            const float bv = bp ? static_cast<float>(bp[n]) : 0.0f;
            o[m * N + n] = T(formulas::fp8_linear_epilogue(static_cast<float>(acc), sxv, swv, bv, bp != nullptr));
          }
        }
      },
      std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(TM * TN * K, 1)));
}

}  // namespace

void fp8_quantize_rows(const Tensor& x, std::int64_t K, const Tensor& scale, bool dynamic, const Tensor& q,
                       std::int64_t ld) {
  switch (x.dtype()) {
    case DType::f32: quantize_impl<float>(x, K, scale, dynamic, q, ld); break;
    case DType::bf16: quantize_impl<bfloat16>(x, K, scale, dynamic, q, ld); break;
    case DType::f16: quantize_impl<half>(x, K, scale, dynamic, q, ld); break;
    default: throw Error("fp8_linear", "x", std::string("unsupported dtype ") + dtype_name(x.dtype()));
  }
}

void fp8_gemm(const Tensor& q, std::int64_t ld, std::int64_t K, const Tensor& w, const Tensor& sx, const Tensor& sw,
              const Tensor& bias, const Tensor& out) {
  if (out.dtype() == DType::f32) gemm_impl<float>(q, ld, K, w, sx, sw, bias, out);
  else if (out.dtype() == DType::bf16) gemm_impl<bfloat16>(q, ld, K, w, sx, sw, bias, out);
  else throw Error("fp8_linear", "out_dtype", std::string("unsupported dtype ") + dtype_name(out.dtype()));
}

}  // namespace qgrad::kernels::cpu
