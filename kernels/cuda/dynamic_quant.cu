// CUDA kernels of dynamic-range quantization.
//
// Rows (token scope, and quantized_linear's activations): one fused pass
// that reads x once, rows::rows_reg_kernel, or rows::rows_kernel for rows
// longer than it holds in registers (kernels/cuda/dynamic_quant_rows.cuh;
// the variants it was chosen from, with their benchmark, are in
// dev/cuda/dynamic_quant_token.cu).
//
// Other layouts: per-slice (tensor, channel) reduce with one atomic min/max
// per block on order-preserving integer keys, a per-segment qparams kernel,
// then an elementwise quantize; grouped layouts use one thread per segment.
#include <climits>
#include <limits>

#include "qgrad/kernels/cuda/dynamic_quant_rows.cuh"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/dynamic_quant.h"

namespace qgrad::kernels::cuda {

namespace {

using formulas::QParams;
using formulas::quant_math_t;
using formulas::Range;
using rows::block_reduce;

// Register-resident vectors a thread of rows_reg_kernel holds.
constexpr int kRowItems = 8;

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

template <class X, class Q, int VEC>
void rows_launch(const X* xp, std::int64_t nrows, std::int64_t D, Q* qp, std::int64_t ldq, quant_math_t<X>* sp,
                 std::int32_t* zp, const QuantSpec& spec, int dev) {
  const std::int64_t nvec = D / VEC;
  if (nvec <= 512 * kRowItems) {
    const rows::RowGroupShape g = rows::row_group_shape(nvec, kRowItems);
    const std::int64_t blocks = std::min<std::int64_t>((nrows + g.rb - 1) / g.rb, INT_MAX);
    ::qgrad::cuda::launch_kernel(dev, rows::rows_reg_kernel<X, Q, VEC, kRowItems>, static_cast<unsigned>(blocks),
                                 dim3(g.G, g.rb), 0, xp, nrows, D, qp, ldq, sp, zp, spec.symmetric, spec.qmin,
                                 spec.qmax);
  } else {
    unsigned threads = 32;
    while (threads < 256 && static_cast<std::int64_t>(threads) * rows::kItems < nvec) threads <<= 1;
    const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(nrows, INT_MAX));
    ::qgrad::cuda::launch_kernel(dev, rows::rows_kernel<X, Q, VEC>, blocks, threads, 0, xp, nrows, D, qp, ldq, sp, zp,
                                 spec.symmetric, spec.qmin, spec.qmax);
  }
}

template <class X, class Q>
void rows_impl(const Tensor& x, std::int64_t D, const QuantSpec& spec, const Tensor& q, std::int64_t ldq,
               const Tensor& scale, const Tensor& zero_point) {
  constexpr int V = 16 / sizeof(X);
  const std::int64_t nrows = D > 0 ? x.numel() / D : 0;
  if (nrows == 0) return;
  const bool vec = D % V == 0 && ldq % V == 0 && aligned16(x.data_ptr()) &&
                   (reinterpret_cast<std::uintptr_t>(q.data_ptr()) % V) == 0;
  const int dev = q.device().index;
  const X* xp = static_cast<const X*>(x.data_ptr());
  Q* qp = static_cast<Q*>(q.data_ptr());
  auto* sp = static_cast<quant_math_t<X>*>(scale.data_ptr());
  auto* zp = zero_point.defined() ? static_cast<std::int32_t*>(zero_point.data_ptr()) : nullptr;
  if (vec) rows_launch<X, Q, V>(xp, nrows, D, qp, ldq, sp, zp, spec, dev);
  else rows_launch<X, Q, 1>(xp, nrows, D, qp, ldq, sp, zp, spec, dev);
}

// ---- per-slice (tensor / channel) layouts ----

template <class X>
__global__ void slice_reduce_kernel(const X* __restrict__ x, AxisLayout lay,
                                    typename KeyOf<quant_math_t<X>>::type* keys) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = quant_math_t<X>;
  using K = KeyOf<M>;
  __shared__ Range<M> sh[32];
  const std::int64_t per_slice = lay.outer * lay.inner;
  for (std::int64_t l = blockIdx.y; l < lay.channels; l += gridDim.y) {
    Range<M> r = Range<M>::empty();
    for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < per_slice;
         e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      const std::int64_t o = e / lay.inner, i = e % lay.inner;
      r.add(M(x[(o * lay.channels + l) * lay.inner + i]));
    }
    r = block_reduce(r, sh);
    if (threadIdx.x == 0 && r.lo <= r.hi) {
      atomicMin(&keys[2 * l], K::encode(r.lo));
      atomicMax(&keys[2 * l + 1], K::encode(r.hi));
    }
  }
}

template <class X, class Q>
void slice_impl(const Tensor& x, const AxisLayout& lay, const QuantSpec& spec, const Tensor& q,
                const Tensor& scale, const Tensor& zero_point) {
  using M = quant_math_t<X>;
  using K = KeyOf<M>;
  using KT = typename K::type;
  const int dev = q.device().index;
  const std::int64_t nseg = lay.channels;
  Tensor keys_t = Tensor::empty({2 * nseg}, TensorOptions{}
                                                .with_dtype(sizeof(KT) == 4 ? DType::s32 : DType::s64)
                                                .with_device(q.device()));
  KT* keys = static_cast<KT*>(keys_t.data_ptr());
  launch_elementwise(dev, 2 * nseg, [=] __device__(std::int64_t i) {
    const M inf = Range<M>::empty().lo;
    keys[i] = K::encode(i % 2 == 0 ? inf : -inf);
  });
  const std::int64_t per_slice = lay.outer * lay.inner;
  constexpr unsigned threads = 256;
  const unsigned fill = ::qgrad::cuda::fill_blocks(dev, threads);
  const std::int64_t gy = std::min<std::int64_t>(nseg, 65535);
  const std::int64_t gx = std::max<std::int64_t>(
      1, std::min<std::int64_t>((per_slice + threads - 1) / threads, std::max<std::int64_t>(1, 4 * fill / gy)));
  ::qgrad::cuda::launch_kernel(dev, slice_reduce_kernel<X>, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)),
                               threads, 0, static_cast<const X*>(x.data_ptr()), lay, keys);
  M* sp = static_cast<M*>(scale.data_ptr());
  std::int32_t* zp = static_cast<std::int32_t*>(zero_point.data_ptr());
  const QuantSpec sp_spec = spec;
  launch_elementwise(dev, nseg, [=] __device__(std::int64_t s) {
    Range<M> r{K::decode(keys[2 * s]), K::decode(keys[2 * s + 1])};
    const QParams<M> p = formulas::qparams_from_range<M>(r, sp_spec.symmetric, sp_spec.qmin, sp_spec.qmax);
    sp[s] = p.scale;
    zp[s] = p.zero_point;
  });
  const X* xp = static_cast<const X*>(x.data_ptr());
  Q* qp = static_cast<Q*>(q.data_ptr());
  const AxisLayout l2 = lay;
  launch_elementwise(dev, x.numel(), [=] __device__(std::int64_t i) {
    const std::int64_t s = segment_of(l2, 0, i);
    const M inv = formulas::inverse_scale<M>(sp[s]);
    qp[i] = static_cast<Q>(formulas::quantize_value<M>(M(xp[i]), inv, zp[s], sp_spec.qmin, sp_spec.qmax));
  });
}

// ---- grouped layouts: one thread per segment, reduce then quantize ----
template <class X, class Q>
void group_impl(const Tensor& x, const AxisLayout& lay, std::int64_t group, const QuantSpec& spec, const Tensor& q,
                const Tensor& scale, const Tensor& zero_point) {
  using M = quant_math_t<X>;
  const X* xp = static_cast<const X*>(x.data_ptr());
  Q* qp = static_cast<Q*>(q.data_ptr());
  M* sp = static_cast<M*>(scale.data_ptr());
  std::int32_t* zp = static_cast<std::int32_t*>(zero_point.data_ptr());
  const AxisLayout l = lay;
  const QuantSpec qs = spec;
  launch_elementwise(q.device().index, segment_count(lay, group), [=] __device__(std::int64_t s) {
    const std::int64_t base = segment_base(l, group, s);
    Range<M> r = Range<M>::empty();
    for (std::int64_t j = 0; j < group; ++j) r.add(M(xp[base + j * l.inner]));
    const QParams<M> p = formulas::qparams_from_range<M>(r, qs.symmetric, qs.qmin, qs.qmax);
    sp[s] = p.scale;
    zp[s] = p.zero_point;
    const M inv = formulas::inverse_scale<M>(p.scale);
    for (std::int64_t j = 0; j < group; ++j) {
      const std::int64_t e = base + j * l.inner;
      qp[e] = static_cast<Q>(formulas::quantize_value<M>(M(xp[e]), inv, p.zero_point, qs.qmin, qs.qmax));
    }
  });
}

template <class X>
void rows_static_impl(const Tensor& x, std::int64_t D, const Tensor& scale, const Tensor& zero_point, int qmin,
                      int qmax, const Tensor& q, std::int64_t ldq) {
  using M = quant_math_t<X>;
  // Host-resident qparams are read here (host scalars); device-resident
  // ones only by the kernel (no sync).
  const float* s_dev = scale.is_cuda() ? static_cast<const float*>(scale.data_ptr()) : nullptr;
  const float s_host = scale.is_cuda() ? 1.0f : static_cast<const float*>(scale.data_ptr())[0];
  const std::int32_t* z_dev = zero_point.is_cuda() ? static_cast<const std::int32_t*>(zero_point.data_ptr()) : nullptr;
  const std::int32_t z_host = zero_point.is_cuda() ? 0 : static_cast<const std::int32_t*>(zero_point.data_ptr())[0];
  const X* xp = static_cast<const X*>(x.data_ptr());
  std::int8_t* qp = static_cast<std::int8_t*>(q.data_ptr());
  const std::int64_t rows = D > 0 ? x.numel() / D : 0;
  launch_elementwise(q.device().index, rows * ldq, [=] __device__(std::int64_t i) {
    const std::int64_t r = i / ldq, j = i % ldq;
    if (j >= D) {
      qp[i] = 0;
      return;
    }
    const M inv = formulas::inverse_scale<M>(M(s_dev ? *s_dev : s_host));
    const int za = z_dev ? *z_dev : z_host;
    qp[i] = formulas::quantize_shifted<M>(M(xp[r * D + j]), inv, za, qmin, qmax);
  });
}

template <class X>
void absmax_impl(const Tensor& x, std::int64_t D, const Tensor& amax) {
  const X* xp = static_cast<const X*>(x.data_ptr());
  float* a = static_cast<float*>(amax.data_ptr());
  const std::int64_t rows = D > 0 ? x.numel() / D : 0;
  launch_elementwise(amax.device().index, D, [=] __device__(std::int64_t j) {
    float m = a[j];
    for (std::int64_t r = 0; r < rows; ++r) m = formulas::absmax_update<float>(m, static_cast<float>(xp[r * D + j]));
    a[j] = m;
  });
}

template <class F>
void dispatch_x_q(DType xt, DType qt, const char* op, F&& f) {
  dispatch_floating(xt, op, [&](auto xtag) { dispatch_int8(qt, op, [&](auto qtag) { f(xtag, qtag); }); });
}

}  // namespace

void dynamic_quantize(const Tensor& x, const AxisLayout& layout, std::int64_t group, const QuantSpec& spec,
                      const Tensor& q, const Tensor& scale, const Tensor& zero_point) {
  dispatch_x_q(x.dtype(), q.dtype(), "dynamic_range_quantize", [&](auto xt, auto qt) {
    using X = typename decltype(xt)::type;
    using Q = typename decltype(qt)::type;
    if (group == 0) slice_impl<X, Q>(x, layout, spec, q, scale, zero_point);
    else group_impl<X, Q>(x, layout, group, spec, q, scale, zero_point);
  });
}

void quantize_rows_dynamic(const Tensor& x, std::int64_t D, const QuantSpec& spec, const Tensor& q, std::int64_t ldq,
                           const Tensor& scale, const Tensor& zero_point) {
  dispatch_x_q(x.dtype(), q.dtype(), "quantize_rows_dynamic", [&](auto xt, auto qt) {
    rows_impl<typename decltype(xt)::type, typename decltype(qt)::type>(x, D, spec, q, ldq, scale, zero_point);
  });
}

void quantize_rows_static(const Tensor& x, std::int64_t D, const Tensor& scale, const Tensor& zero_point, int qmin,
                          int qmax, const Tensor& q, std::int64_t ldq) {
  dispatch_floating(x.dtype(), "quantize_rows_static", [&](auto xt) {
    rows_static_impl<typename decltype(xt)::type>(x, D, scale, zero_point, qmin, qmax, q, ldq);
  });
}

void column_absmax_update(const Tensor& x, std::int64_t D, const Tensor& amax) {
  dispatch_floating(x.dtype(), "SmoothQuantCalibrator",
                    [&](auto xt) { absmax_impl<typename decltype(xt)::type>(x, D, amax); });
}

}  // namespace qgrad::kernels::cuda
