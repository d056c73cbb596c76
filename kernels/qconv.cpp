// The int8 convolution's kernels, one source for both devices (kernels/loop.h):
// the quantized im2col, and on CUDA the per-group int8 GEMM (cuBLASLt through
// kernels/cuda/qlinear.cu) with the epilogue below writing NCHW. The CPU GEMM
// and epilogue are quantized_linear's (kernels/cpu/qlinear.cpp). Both devices
// sum the same int8 products exactly in int32 and run the same float
// epilogue (formulas/qlinear.h), so their outputs are bit-identical.
#include "qgrad/kernels/qconv.h"

#include <type_traits>

#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/formulas/qlinear.h"
#include "qgrad/kernels/layout.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {

// n / d for 0 <= n: FastDiv's multiply and shift when every numerator of the
// kernel is below 2^31, the hardware division otherwise (same integers).
struct IDiv {
  std::int64_t d = 1;
  bool small = false;
  FastDiv f;
  IDiv() = default;
  IDiv(std::int64_t d_, bool small_) : d(d_), small(small_) {
    if (small) f = FastDiv(static_cast<std::uint32_t>(d));
  }
  QGRAD_HD std::int64_t div(std::int64_t n) const {
    return small ? static_cast<std::int64_t>(f.div(static_cast<std::uint32_t>(n))) : n / d;
  }
};

constexpr std::int64_t kSmall = std::int64_t(1) << 31;

// The activation scale and zero point as a kernel reads them: device
// pointers, or host values read by the host before the launch.
struct ActArg {
  const float* s_dev = nullptr;
  float s_host = 1.0f;
  const std::int32_t* z_dev = nullptr;
  std::int32_t z_host = 0;
  int qmin = -128, qmax = 127;

  static ActArg of(const StaticActQuant& a, Device dev) {
    ActArg r;
    r.qmin = a.qmin;
    r.qmax = a.qmax;
    const bool s_on_dev = dev.is_cuda() && a.scale.is_cuda(), z_on_dev = dev.is_cuda() && a.zero_point.is_cuda();
    if (s_on_dev) r.s_dev = static_cast<const float*>(a.scale.data_ptr());
    else r.s_host = static_cast<const float*>(a.scale.data_ptr())[0];
    if (z_on_dev) r.z_dev = static_cast<const std::int32_t*>(a.zero_point.data_ptr());
    else r.z_host = static_cast<const std::int32_t*>(a.zero_point.data_ptr())[0];
    return r;
  }
};

// col[g][m, k], V consecutive elements of one row per index (lda % V == 0;
// pad columns and padding 0): the row's image position and the first
// column's (c, i, j) take the divisions, the rest of the chunk steps (j, i,
// c) on; V = 16 writes one 16-byte store.
template <class X, int V>
struct QuantColumns {
  struct alignas(V) Chunk {
    std::int8_t v[V];
  };
  const X* x;
  std::int8_t* col;
  std::int64_t chunks_per_row, K, rows, P, Cg, KK;
  std::int64_t c, h, w, ow, kh, kw, sh, sw, ph, pw, dh, dw;
  IDiv by_chunks, by_rows, by_P, by_ow, by_KK, by_kw;
  ActArg act;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = formulas::quant_math_t<X>;
    const std::int64_t row = by_chunks.div(i), k0 = (i - row * chunks_per_row) * V;
    const std::int64_t g = by_rows.div(row), m = row - g * rows;
    const std::int64_t n = by_P.div(m), p = m - n * P;
    const std::int64_t oh = by_ow.div(p), oww = p - oh * ow;
    std::int64_t ch = by_KK.div(k0), t = k0 - ch * KK;
    std::int64_t ki = by_kw.div(t), kj = t - ki * kw;
    const X* xg = x + (n * c + g * Cg) * h * w;
    const std::int64_t ih0 = oh * sh - ph, iw0 = oww * sw - pw;
    const M inv = formulas::inverse_scale<M>(M(act.s_dev ? *act.s_dev : act.s_host));
    const int za = act.z_dev ? *act.z_dev : act.z_host;
    Chunk out;
    for (int e = 0; e < V; ++e) {
      std::int8_t v = 0;
      const std::int64_t ih = ih0 + ki * dh, iw = iw0 + kj * dw;
      if (k0 + e < K && ih >= 0 && ih < h && iw >= 0 && iw < w)
        v = formulas::quantize_shifted<M>(M(xg[(ch * h + ih) * w + iw]), inv, za, act.qmin, act.qmax);
      out.v[e] = v;
      if (++kj == kw) {
        kj = 0;
        if (++ki == kh) {
          ki = 0;
          ++ch;
        }
      }
    }
    *reinterpret_cast<Chunk*>(col + i * V) = out;
  }
};

// dst[r, k] = src[r, k] for k < K, 0 up to ld (the CUDA weight rows).
struct PadRows {
  const std::int8_t* src;
  std::int8_t* dst;
  std::int64_t K, ld;
  IDiv by_ld;
  QGRAD_HD void operator()(std::int64_t i) const {
    const std::int64_t r = by_ld.div(i), k = i - r * ld;
    dst[i] = k < K ? src[r * K + k] : std::int8_t(0);
  }
};

// out[n, o, p] from acc[o, n P + p] (the GEMM's transposed [O, ldc] int32
// output): reads along m, writes runs of P contiguous outputs.
template <class T>
struct ConvEpilogue {
  const std::int32_t* acc;
  T* out;
  std::int64_t ldc, rows, P, O;
  IDiv by_rows, by_P;
  const float* sa_dev;
  float sa_host;
  const float* sw;
  const op_math_t<T>* bias;
  QGRAD_HD void operator()(std::int64_t i) const {
    using Mt = op_math_t<T>;
    const std::int64_t o = by_rows.div(i), m = i - o * rows;
    const std::int64_t n = by_P.div(m), p = m - n * P;
    const Mt sa = Mt(sa_dev ? *sa_dev : sa_host);
    out[(n * O + o) * P + p] =
        T(formulas::qlinear_epilogue<Mt>(acc[o * ldc + m], sa, Mt(sw[o]), bias ? bias[o] : Mt(0), bias != nullptr));
  }
};

}  // namespace

std::int64_t qconv_lda(Device device, std::int64_t K) { return qlinear_lda(device, K); }

void qconv_columns(const Conv2dShape& s, const Tensor& x, const StaticActQuant& act, const Tensor& col,
                   std::int64_t lda) {
  const std::int64_t P = s.oh * s.ow, rows = s.n * P, K = s.patch(), KK = s.kh * s.kw;
  const bool small = col.numel() < kSmall;
  dispatch_floating(x.dtype(), "quantized_conv2d", [&](auto tag) {
    using X = typename decltype(tag)::type;
    auto run = [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      QuantColumns<X, V> body{static_cast<const X*>(x.data_ptr()),
                              static_cast<std::int8_t*>(col.data_ptr()),
                              lda / V, K, rows, P, s.c_per_group(), KK,
                              s.c, s.h, s.w, s.ow, s.kh, s.kw, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw,
                              IDiv(lda / V, small), IDiv(rows, small), IDiv(P, small), IDiv(s.ow, small),
                              IDiv(KK, small), IDiv(s.kw, small),
                              ActArg::of(act, col.device())};
      for_each_index(col.device(), col.numel() / V, body, "quantized_conv2d", cpu::kParallelGrain / V);
    };
    // CUDA rows are padded to a multiple of 16 (so are CPU rows of such K).
    if (lda % 16 == 0) run(std::integral_constant<int, 16>{});
    else run(std::integral_constant<int, 1>{});
  });
}

void qconv_gemm(const Conv2dShape& s, const Tensor& col, std::int64_t lda, const Tensor& w, const QLinearEpilogue& ep,
                const Tensor& out) {
  if (!out.is_cuda()) {
    cpu::qconv_gemm(s, col, lda, w, ep, out);
    return;
  }
#if QGRAD_WITH_CUDA
  const Device dev = out.device();
  const TensorOptions on = TensorOptions{}.with_device(dev);
  const std::int64_t G = s.groups, Og = s.o_per_group(), K = s.patch(), P = s.oh * s.ow, rows = s.n * P;
  // Weight rows padded to lda (a multiple of 16, 16-byte aligned), as the
  // cuBLASLt int8 layout wants.
  Tensor wpad = w;
  if (K != lda || (reinterpret_cast<std::uintptr_t>(w.data_ptr()) & 15u) != 0) {
    wpad = Tensor::empty({s.o, lda}, TensorOptions(on).with_dtype(DType::s8));
    for_each_index(dev, wpad.numel(),
                   PadRows{static_cast<const std::int8_t*>(w.data_ptr()), static_cast<std::int8_t*>(wpad.data_ptr()),
                           K, lda, IDiv(lda, wpad.numel() < kSmall)},
                   "quantized_conv2d");
  }
  // acc[o, m] = sum_k wpad[o, k] col[g][m, k]: the GEMM with the weight as
  // its left operand writes the transpose of quantized_linear's output, whose
  // rows are output channels: the NCHW planes of the epilogue.
  const std::int64_t ldc = (rows + 3) / 4 * 4;
  Tensor acc = Tensor::empty({s.o, ldc}, TensorOptions(on).with_dtype(DType::s32));
  const auto* wp = static_cast<const std::int8_t*>(wpad.data_ptr());
  const auto* cp = static_cast<const std::int8_t*>(col.data_ptr());
  auto* ap = static_cast<std::int32_t*>(acc.data_ptr());
  for (std::int64_t g = 0; g < G; ++g)
    cuda::int8_gemm(dev.index, wp + g * Og * lda, lda, cp + g * rows * lda, lda, ap + g * Og * ldc, ldc, Og, rows, lda);
  const float* sa_dev = ep.sa.is_cuda() ? static_cast<const float*>(ep.sa.data_ptr()) : nullptr;
  const float sa_host = ep.sa.is_cuda() ? 1.0f : static_cast<const float*>(ep.sa.data_ptr())[0];
  const bool small = out.numel() < kSmall && s.o * ldc < kSmall;
  dispatch_floating(out.dtype(), "quantized_conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Mt = op_math_t<T>;
    ConvEpilogue<T> body{ap, static_cast<T*>(out.data_ptr()), ldc, rows, P, s.o, IDiv(rows, small), IDiv(P, small),
                         sa_dev, sa_host, static_cast<const float*>(ep.sw.data_ptr()),
                         ep.bias.defined() ? static_cast<const Mt*>(ep.bias.data_ptr()) : nullptr};
    for_each_index(dev, s.o * rows, body, "quantized_conv2d");
  });
#else
  no_cuda_build("quantized_conv2d");  // no CUDA tensor exists in this build
#endif
}

}  // namespace qgrad::kernels
