// CPU kernels of the int4 linear layers (kernels/lowbit_linear.h).
//   W4A16: the weight dequantized row by row to f32 (each value T((q - zp) * s)
//   widened exactly), x widened to f32, one Eigen GEMM (cpu::gemm_raw), then
//   bias and one rounding to T.
//   W4A8: exact int32 group sums over the widened s8 weight, the f32 group
//   terms added in increasing g (formulas::w4a8_group_term), as on CUDA.
#include <algorithm>
#include <vector>

#include "qgrad/kernels/basic.h"
#include "qgrad/kernels/cpu/gemm.h"
#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/formulas/lowbit_linear.h"
#include "qgrad/kernels/lowbit_linear.h"

namespace qgrad::kernels::cpu {

namespace {

using I64 = std::int64_t;

// f32, f16, bf16 (the ops reject f64).
template <class F>
void dispatch_linear_dtype(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(TypeTag<float>{}); return;
    case DType::f16: f(TypeTag<half>{}); return;
    case DType::bf16: f(TypeTag<bfloat16>{}); return;
    default: break;
  }
  throw Error(op, "dtype", std::string("expected f32, f16 or bf16, got ") + dtype_name(t));
}

template <class T>
void w4a16_impl(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, I64 G, const Tensor& bias,
                const Tensor& out) {
  const I64 N = out.shape()[1], M = out.shape()[0], K = w.shape()[1];
  const I64 groups = K / G;
  const bool is_signed = w.dtype() == DType::s4;
  const auto* wp = static_cast<const std::uint8_t*>(w.data_ptr());
  // f32 scales, or x's dtype T (widened exactly).
  Tensor scale32 = scale;
  if (scale.dtype() != DType::f32) {
    scale32 = Tensor::empty(scale.shape(), TensorOptions{}.with_dtype(DType::f32));
    ::qgrad::kernels::cast(scale, scale32);
  }
  const float* sp = static_cast<const float*>(scale32.data_ptr());
  const std::int32_t* zpp = zp.defined() ? static_cast<const std::int32_t*>(zp.data_ptr()) : nullptr;
  std::vector<float> wf(static_cast<std::size_t>(N * K)), xf(static_cast<std::size_t>(M * K)),
      c(static_cast<std::size_t>(M * N));
  parallel_for(N, [&](I64 n) {
    for (I64 k = 0; k < K; ++k) {
      const I64 i = n * K + k, g = n * groups + k / G;
      const int q = nibble_get(wp, i, is_signed) - (zpp ? zpp[g] : 0);
      wf[static_cast<std::size_t>(i)] = static_cast<float>(formulas::w4a16_weight<T>(q, sp[g]));
    }
  }, 64);
  const T* xp = static_cast<const T*>(x.data_ptr());
  for (I64 i = 0; i < M * K; ++i) xf[static_cast<std::size_t>(i)] = static_cast<float>(xp[i]);
  GemmShape s;
  s.m = M;
  s.n = N;
  s.k = K;
  s.trans_b = true;
  gemm_raw(s, xf.data(), wf.data(), c.data(), false);
  const T* bp = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
  T* o = static_cast<T*>(out.data_ptr());
  for (I64 m = 0; m < M; ++m)
    for (I64 n = 0; n < N; ++n) {
      const float v = c[static_cast<std::size_t>(m * N + n)];
      o[m * N + n] = T(bp ? v + static_cast<float>(bp[n]) : v);
    }
}

// Exact int32 sum of (a[k] - za) * w[k], in unsigned arithmetic (wraps as
// the GPU's int32 does; never reached for K < 2^20).
inline std::int32_t group_dot(const std::int8_t* a, const std::int8_t* w, I64 G, std::int32_t za) {
  std::uint32_t acc = 0;
  for (I64 k = 0; k < G; ++k)
    acc += static_cast<std::uint32_t>((static_cast<std::int32_t>(a[k]) - za) * static_cast<std::int32_t>(w[k]));
  return static_cast<std::int32_t>(acc);
}

template <class T>
void w4a8_impl(const Tensor& a, I64 lda, I64 K, const Tensor& sa, const Tensor& za, const Tensor& w, const Tensor& sw,
               I64 G, const Tensor& bias, const Tensor& out) {
  const I64 M = out.shape()[0], N = out.shape()[1], groups = K / G;
  Tensor w8 = Tensor::empty({N, K}, TensorOptions{}.with_dtype(DType::s8));
  int4_widen(w, w8);
  const auto* ap = static_cast<const std::int8_t*>(a.data_ptr());
  const auto* wp = static_cast<const std::int8_t*>(w8.data_ptr());
  const float* sap = static_cast<const float*>(sa.data_ptr());
  const std::int32_t* zap = za.defined() ? static_cast<const std::int32_t*>(za.data_ptr()) : nullptr;
  const float* swp = static_cast<const float*>(sw.data_ptr());
  const float* bp = bias.defined() ? static_cast<const float*>(bias.data_ptr()) : nullptr;
  T* o = static_cast<T*>(out.data_ptr());
  // Tiles of 4 rows x 64 output channels (the weight rows stay in cache).
  constexpr I64 TM = 4, TN = 64;
  const I64 tiles_m = (M + TM - 1) / TM, tiles_n = (N + TN - 1) / TN;
  parallel_for(tiles_m * tiles_n, [&](I64 t) {
    const I64 m0 = (t / tiles_n) * TM, n0 = (t % tiles_n) * TN;
    const I64 m1 = std::min(M, m0 + TM), n1 = std::min(N, n0 + TN);
    for (I64 m = m0; m < m1; ++m) {
      const float s_a = sap[m];
      const std::int32_t z = zap ? zap[m] : 0;
      for (I64 n = n0; n < n1; ++n) {
        float y = 0;
        for (I64 g = 0; g < groups; ++g) {
          const std::int32_t acc = group_dot(ap + m * lda + g * G, wp + n * K + g * G, G, z);
          const float term = formulas::w4a8_group_term(acc, s_a, swp[n * groups + g]);
          y = g == 0 ? term : y + term;
        }
        o[m * N + n] = T(bp ? y + bp[n] : y);
      }
    }
  }, std::max<I64>(1, 32768 / std::max<I64>(1, TM * TN * K)));
}

}  // namespace

void w4a16_linear(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, std::int64_t group,
                  const Tensor& bias, const Tensor& out) {
  dispatch_linear_dtype(x.dtype(), "linear_w4a16",
                        [&](auto tag) { w4a16_impl<typename decltype(tag)::type>(x, w, scale, zp, group, bias, out); });
}

// The fragment order chunk by chunk (formulas::w4a16_frag_gather / _scatter, as on CUDA).
void w4a16_frag_pack(const Tensor& w, const Tensor& frag) {
  const I64 N = w.shape()[0], K = w.shape()[1];
  const auto* src = static_cast<const std::uint8_t*>(w.data_ptr());
  auto* dst = static_cast<std::uint32_t*>(frag.data_ptr());
  parallel_for(formulas::w4a16_frag_bytes(N, K) / 16, [&](I64 c) {
    std::uint32_t word[4];
    formulas::w4a16_frag_gather(src, N, K, c, word);
    std::copy(word, word + 4, dst + c * 4);
  });
}

void w4a16_frag_unpack(const Tensor& frag, const Tensor& w) {
  const I64 N = w.shape()[0], K = w.shape()[1];
  const auto* src = static_cast<const std::uint32_t*>(frag.data_ptr());
  auto* dst = static_cast<std::uint8_t*>(w.data_ptr());
  parallel_for(formulas::w4a16_frag_bytes(N, K) / 16, [&](I64 c) {
    const std::uint32_t word[4] = {src[c * 4], src[c * 4 + 1], src[c * 4 + 2], src[c * 4 + 3]};
    formulas::w4a16_frag_scatter(word, N, K, c, dst);
  });
}

void w4a8_linear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& sa, const Tensor& za,
                 const Tensor& w, const Tensor& sw, std::int64_t group, const Tensor& bias, const Tensor& out) {
  dispatch_linear_dtype(out.dtype(), "linear_w4a8", [&](auto tag) {
    w4a8_impl<typename decltype(tag)::type>(a, lda, K, sa, za, w, sw, group, bias, out);
  });
}

void int4_widen(const Tensor& w, const Tensor& w8) {
  const auto* src = static_cast<const std::uint8_t*>(w.data_ptr());
  auto* dst = static_cast<std::int8_t*>(w8.data_ptr());
  const bool is_signed = w.dtype() == DType::s4;
  const I64 n = w.numel();
  parallel_for(n, [&](I64 i) { dst[i] = static_cast<std::int8_t>(nibble_get(src, i, is_signed)); });
}

}  // namespace qgrad::kernels::cpu
