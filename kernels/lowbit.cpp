// int4 and FP8 quantization kernels, one source for both devices
// (kernels/loop.h); formulas in kernels/formulas/lowbit.h.
#include "qgrad/kernels/lowbit.h"

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/formulas/lowbit.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {

struct Int4Qparams {
  const float *mn, *mx;
  float* scale;
  std::int32_t* zp;
  int qmin, qmax;
  bool symmetric;
  float eps;
  QGRAD_HD void operator()(std::int64_t c) const {
    formulas::int4_qparams(mn[c], mx[c], qmin, qmax, symmetric, eps, scale[c], zp[c]);
  }
};

// One 128-element block per call: its 64 bytes of q and, with a mask, its
// 4 mask words, so no two calls write the same byte or word.
template <class T>
struct Int4Quantize {
  const T* x;
  std::uint8_t* q;
  const float* scale;
  const std::int32_t* zp;
  std::uint32_t* mask;
  std::int64_t n, group;
  int qmin, qmax;
  QGRAD_HD void quant(std::int64_t i, int& v, bool& bit) const {
    const std::int64_t g = i / group;
    formulas::ChannelParams p;
    p.scale = scale[g];
    p.inv_scale = formulas::inv_scale_of(p.scale);
    p.zp = zp[g];
    std::int64_t qc;
    v = formulas::clamped_quant(x[i], p, qmin, qmax, qc, bit) ? static_cast<int>(qc) : qmin;
  }
  QGRAD_HD void operator()(std::int64_t b) const {
    const std::int64_t first = b * kBitmaskBlock;
    const std::int64_t last = first + kBitmaskBlock < n ? first + kBitmaskBlock : n;
    std::uint32_t words[kBitmaskWordsPerBlock] = {0u, 0u, 0u, 0u};
    for (std::int64_t i = first; i < last; i += 2) {
      int lo = 0, hi = 0;
      bool blo = false, bhi = false;
      quant(i, lo, blo);
      if (i + 1 < last) quant(i + 1, hi, bhi);
      q[i >> 1] = nibble_pack(lo, hi);
      const std::int64_t k = i - first;  // element first + k: bit k / 4 of word k % 4
      words[k & 3] |= static_cast<std::uint32_t>(blo) << static_cast<unsigned>(k >> 2);
      words[(k + 1) & 3] |= static_cast<std::uint32_t>(bhi) << static_cast<unsigned>((k + 1) >> 2);
    }
    if (mask)
      for (int w = 0; w < kBitmaskWordsPerBlock; ++w) mask[b * kBitmaskWordsPerBlock + w] = words[w];
  }
};

template <class T>
struct Int4Dequantize {
  const std::uint8_t* q;
  T* y;
  const float* scale;
  const std::int32_t* zp;
  std::int64_t group;
  bool is_signed;
  QGRAD_HD void operator()(std::int64_t i) const {
    const std::int64_t g = i / group;
    y[i] = formulas::dequant_value<T, std::is_same_v<T, double>>(nibble_get(q, i, is_signed), zp[g], scale[g]);
  }
};

template <class F8>
struct Fp8Scale {
  const float *mn, *mx;
  float* scale;
  QGRAD_HD void operator()(std::int64_t c) const { scale[c] = formulas::fp8_amax(mn[c], mx[c]) / formulas::fp8_max<F8>(); }
};

template <class T, class F8>
struct Fp8FakeQuantize {
  const T* x;
  T* y;
  const float* scale;
  AxisLayout layout;
  QGRAD_HD void operator()(std::int64_t i) const {
    const float s = scale[layout.channel(i)];
    const F8 q = formulas::fp8_quant<F8>(static_cast<float>(x[i]), s);
    y[i] = formulas::fp8_dequant<T>(q, s);
  }
};

template <class T, class F8>
struct Fp8Quantize {
  const T* x;
  F8* q;
  const float* scale;
  AxisLayout layout;
  QGRAD_HD void operator()(std::int64_t i) const {
    q[i] = formulas::fp8_quant<F8>(static_cast<float>(x[i]), scale[layout.channel(i)]);
  }
};

template <class F8, class T>
struct Fp8Dequantize {
  const F8* q;
  T* y;
  const float* scale;
  AxisLayout layout;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = formulas::fp8_dequant<T>(q[i], scale[layout.channel(i)]); }
};

template <class T>
struct ScaleGrad {
  const T* dy;
  T* dx;
  const float* scale;
  AxisLayout layout;
  bool divide;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const M s = static_cast<M>(scale[layout.channel(i)]);
    const M g = static_cast<M>(dy[i]);
    dx[i] = T(divide ? g / s : g * s);
  }
};

const float* f32(const Tensor& t) { return static_cast<const float*>(t.data_ptr()); }

}  // namespace

void int4_qparams(const Tensor& min, const Tensor& max, const Tensor& scale, const Tensor& zp, int qmin, int qmax,
                  bool symmetric, float eps) {
  for_each_index(scale.device(), scale.numel(),
                 Int4Qparams{f32(min), f32(max), static_cast<float*>(scale.data_ptr()),
                             static_cast<std::int32_t*>(zp.data_ptr()), qmin, qmax, symmetric, eps},
                 "int4_qparams");
}

bool fake_quantize_dynamic_rows([[maybe_unused]] const Tensor& x, [[maybe_unused]] const Tensor& y,
                                [[maybe_unused]] std::uint32_t* mask, [[maybe_unused]] std::int64_t row_len,
                                [[maybe_unused]] int qmin, [[maybe_unused]] int qmax, [[maybe_unused]] bool symmetric,
                                [[maybe_unused]] float eps, [[maybe_unused]] RowPrologue prologue) {
  // Only a CUDA kernel: in a build without CUDA no tensor is on a GPU.
#if QGRAD_WITH_CUDA
  if (x.is_cuda()) return cuda::fake_quantize_dynamic_rows(x, y, mask, row_len, qmin, qmax, symmetric, eps, prologue);
#endif
  return false;
}

bool fake_quantize_dynamic_rows_batch([[maybe_unused]] const std::vector<RowsBatchItem>& items,
                                      [[maybe_unused]] std::int64_t row_len, [[maybe_unused]] int qmin,
                                      [[maybe_unused]] int qmax, [[maybe_unused]] bool symmetric,
                                      [[maybe_unused]] float eps) {
#if QGRAD_WITH_CUDA
  if (!items.empty() && items[0].x.is_cuda())
    return cuda::fake_quantize_dynamic_rows_batch(items, row_len, qmin, qmax, symmetric, eps);
#endif
  return false;
}

bool layer_norm_fake_quantize_dynamic_rows([[maybe_unused]] const Tensor& x, [[maybe_unused]] const Tensor& w,
                                           [[maybe_unused]] const Tensor& b, [[maybe_unused]] const Tensor& y,
                                           [[maybe_unused]] const Tensor& mean, [[maybe_unused]] const Tensor& rstd,
                                           [[maybe_unused]] std::uint32_t* mask, [[maybe_unused]] const NormQuantRows& a) {
#if QGRAD_WITH_CUDA
  if (x.is_cuda()) return cuda::layer_norm_fake_quantize_dynamic_rows(x, w, b, y, mean, rstd, mask, a);
#endif
  return false;
}

void int4_quantize(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& zp, std::int64_t group,
                   std::uint32_t* mask) {
  const bool is_signed = q.dtype() == DType::s4;
  const int qmin = is_signed ? -8 : 0, qmax = is_signed ? 7 : 15;
  dispatch_floating(x.dtype(), "int4_quantize", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(x.device(), bitmask_blocks(x.numel()),
                   Int4Quantize<T>{static_cast<const T*>(x.data_ptr()), static_cast<std::uint8_t*>(q.data_ptr()),
                                   f32(scale), static_cast<const std::int32_t*>(zp.data_ptr()), mask, x.numel(), group,
                                   qmin, qmax},
                   "int4_quantize");
  });
}

void int4_dequantize(const Tensor& q, const Tensor& y, const Tensor& scale, const Tensor& zp, std::int64_t group) {
  dispatch_floating(y.dtype(), "int4_dequantize", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), y.numel(),
                   Int4Dequantize<T>{static_cast<const std::uint8_t*>(q.data_ptr()), static_cast<T*>(y.data_ptr()),
                                     f32(scale), static_cast<const std::int32_t*>(zp.data_ptr()), group,
                                     q.dtype() == DType::s4},
                   "int4_dequantize");
  });
}

void fp8_scale(const Tensor& min, const Tensor& max, const Tensor& scale, DType fp8) {
  dispatch_fp8(fp8, "fp8_scale", [&](auto tag) {
    using F8 = typename decltype(tag)::type;
    for_each_index(scale.device(), scale.numel(),
                   Fp8Scale<F8>{f32(min), f32(max), static_cast<float*>(scale.data_ptr())}, "fp8_scale");
  });
}

void fp8_fake_quantize(const Tensor& x, const Tensor& y, const Tensor& scale, const AxisLayout& layout, DType fp8) {
  dispatch_floating(x.dtype(), "fp8_fake_quantize", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_fp8(fp8, "fp8_fake_quantize", [&](auto ftag) {
      using F8 = typename decltype(ftag)::type;
      for_each_index(x.device(), x.numel(),
                     Fp8FakeQuantize<T, F8>{static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()),
                                            f32(scale), layout},
                     "fp8_fake_quantize");
    });
  });
}

void fp8_quantize(const Tensor& x, const Tensor& q, const Tensor& scale, const AxisLayout& layout) {
  dispatch_floating(x.dtype(), "fp8_quantize", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_fp8(q.dtype(), "fp8_quantize", [&](auto ftag) {
      using F8 = typename decltype(ftag)::type;
      for_each_index(x.device(), x.numel(),
                     Fp8Quantize<T, F8>{static_cast<const T*>(x.data_ptr()), static_cast<F8*>(q.data_ptr()), f32(scale),
                                        layout},
                     "fp8_quantize");
    });
  });
}

void fp8_dequantize(const Tensor& q, const Tensor& y, const Tensor& scale, const AxisLayout& layout) {
  dispatch_floating(y.dtype(), "fp8_dequantize", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_fp8(q.dtype(), "fp8_dequantize", [&](auto ftag) {
      using F8 = typename decltype(ftag)::type;
      for_each_index(y.device(), y.numel(),
                     Fp8Dequantize<F8, T>{static_cast<const F8*>(q.data_ptr()), static_cast<T*>(y.data_ptr()),
                                          f32(scale), layout},
                     "fp8_dequantize");
    });
  });
}

void fp8_scale_grad(const Tensor& dy, const Tensor& dx, const Tensor& scale, const AxisLayout& layout, bool divide) {
  dispatch_floating(dy.dtype(), "fp8_scale_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dy.device(), dy.numel(),
                   ScaleGrad<T>{static_cast<const T*>(dy.data_ptr()), static_cast<T*>(dx.data_ptr()), f32(scale), layout,
                                divide},
                   "fp8_scale_grad");
  });
}

}  // namespace qgrad::kernels
