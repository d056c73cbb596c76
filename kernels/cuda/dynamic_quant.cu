// CUDA kernels of dynamic-range quantization.
//
// Rows (token scope, and quantized_linear's activations), one fused pass
// that reads x once. Two kernels:
//
// rows_reg_kernel (rows of up to 512 * ITEMS 16-byte vectors, the common
// case): a group of G threads (a power of two, 32..512) owns one row; a
// block holds 256 / G groups for short rows. Every thread issues all of its
// ITEMS loads before the first use (zero-filled past the row end: a zero
// changes no qparams, which widen the range to include 0 anyway), so a
// warp has ITEMS 16-byte loads in flight; the group reduces min/max (warp
// shuffle, then one shared-memory stage behind a single barrier, double
// buffered by row parity), then quantizes its registers and stores packed
// words. The persistent form (grid = resident blocks) loads the next row
// into a second register set before reducing the current one, so loads are
// in flight while the row is reduced and stored.
//
// rows_kernel (the original; the fallback for longer rows): one block per
// row (grid-stride), up to kItems vectors cached per thread, the remainder
// re-read. Each of its loads sits in its own `if (v < nvec)` branch with
// the range update that consumes it (SASS: @P BRA; LDG.E.128; ~60
// instructions using it; next branch), so a warp has one 16-byte load in
// flight at a time: f32 D 8192 = 256 threads, 80 registers, 3 blocks
// (24 warps) an SM, 24 x 512 B = 12 KB in flight an SM, which by Little's
// law caps it near 2 TB/s (measured 1880 GB/s, 62% of copy, on an H100).
//
// set_dynamic_quant_token_variant picks the row kernel (benchmark hook).
//
// Other layouts: per-slice (tensor, channel) reduce with one atomic min/max
// per block on order-preserving integer keys, a per-segment qparams kernel,
// then an elementwise quantize; grouped layouts use one thread per segment.
#include <climits>
#include <limits>

#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/dynamic_quant.h"
#include "qgrad/kernels/formulas/qlinear.h"

namespace qgrad::kernels::cuda {

namespace {

using formulas::QParams;
using formulas::quant_math_t;
using formulas::Range;

constexpr int kItems = 8;

// Row kernels selectable through set_dynamic_quant_token_variant:
//   0  rows_kernel (the original, and the fallback for rows too long for 1..4)
//   1  rows_reg_kernel, ITEMS 8 (f32 D 8192: 256 threads a row), one row group per block slot
//   2  rows_reg_kernel, ITEMS 4 (f32 D 8192: 512 threads a row)
//   3  as 1, persistent grid, next row prefetched into registers
//   4  as 2, persistent grid, next row prefetched into registers
//   5  as 1, LEAN (symmetric abs-max reduction, branch-free quantize clamp)
//   6  as 3, LEAN
constexpr int kDefaultTokenVariant = 1;

template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <class M>
__device__ Range<M> warp_reduce(Range<M> r) {
  for (int off = 16; off > 0; off >>= 1) {
    Range<M> o;
    o.lo = __shfl_xor_sync(0xffffffffu, r.lo, off);
    o.hi = __shfl_xor_sync(0xffffffffu, r.hi, off);
    r.merge(o);
  }
  return r;
}

// Block-wide min/max; every thread receives the result. Leaves `sh` reusable
// after the trailing __syncthreads.
template <class M>
__device__ Range<M> block_reduce(Range<M> r, Range<M>* sh) {
  r = warp_reduce(r);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  if (lane == 0) sh[warp] = r;
  __syncthreads();
  Range<M> t = Range<M>::empty();
  for (int w = 0; w < nwarps; ++w) t.merge(sh[w]);
  __syncthreads();
  return t;
}

template <class X, class Q, int VEC>
__global__ void __launch_bounds__(256) rows_kernel(const X* __restrict__ x, std::int64_t rows, std::int64_t D, Q* __restrict__ q,
                            std::int64_t ldq, quant_math_t<X>* __restrict__ scale, std::int32_t* __restrict__ zp,
                            bool symmetric, int qmin, int qmax) {
  using M = quant_math_t<X>;
  using XP = Pack<X, VEC>;
  using QP = Pack<Q, VEC>;
  __shared__ Range<M> sh[32];
  const std::int64_t nvec = D / VEC;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const XP* xr = reinterpret_cast<const XP*>(x + r * D);
    QP* qr = reinterpret_cast<QP*>(q + r * ldq);
    XP cache[kItems];
    Range<M> range = Range<M>::empty();
#pragma unroll
    for (int it = 0; it < kItems; ++it) {
      const std::int64_t v = static_cast<std::int64_t>(it) * nt + tid;
      if (v < nvec) {
        cache[it] = xr[v];
#pragma unroll
        for (int e = 0; e < VEC; ++e) range.add(M(cache[it].v[e]));
      }
    }
    for (std::int64_t v = static_cast<std::int64_t>(kItems) * nt + tid; v < nvec; v += nt) {
      const XP p = xr[v];
#pragma unroll
      for (int e = 0; e < VEC; ++e) range.add(M(p.v[e]));
    }
    range = block_reduce(range, sh);
    const QParams<M> p = formulas::qparams_from_range<M>(range, symmetric, qmin, qmax);
    if (tid == 0) {
      scale[r] = p.scale;
      if (zp) zp[r] = p.zero_point;
    }
    const M inv = formulas::inverse_scale<M>(p.scale);
#pragma unroll
    for (int it = 0; it < kItems; ++it) {
      const std::int64_t v = static_cast<std::int64_t>(it) * nt + tid;
      if (v < nvec) {
        QP out;
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          out.v[e] = static_cast<Q>(formulas::quantize_value<M>(M(cache[it].v[e]), inv, p.zero_point, qmin, qmax));
        qr[v] = out;
      }
    }
    for (std::int64_t v = static_cast<std::int64_t>(kItems) * nt + tid; v < nvec; v += nt) {
      const XP in = xr[v];
      QP out;
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        out.v[e] = static_cast<Q>(formulas::quantize_value<M>(M(in.v[e]), inv, p.zero_point, qmin, qmax));
      qr[v] = out;
    }
    Q* qs = q + r * ldq;
    for (std::int64_t j = D + tid; j < ldq; j += nt) qs[j] = Q(0);
  }
}

// Zero-filled past the row end (see the header comment).
template <int ITEMS, class XP>
__device__ __forceinline__ void load_row(XP (&c)[ITEMS], const XP* __restrict__ xr, bool valid, int nvec, int tx,
                                         int G) {
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int v = it * G + tx;
    if (valid && v < nvec) c[it] = xr[v];
    else c[it] = XP{};
  }
}

// LEAN (variants 5, 6): fewer instructions per element, same bits.
// Symmetric reduction: only max |x| over finite x matters (qparams use
// max(-min(lo, 0), max(hi, 0)), which is exactly that), so it tracks one
// abs-max (2 instructions an element instead of 7) and hands the exact
// Range {-m, m} to qparams_from_range. Quantize: formulas::quantize_value
// compiles to compare-and-branch; the min/max clamp below returns the same
// int for every input (NaN: fmax drops it -> qmin; +-inf -> qmax / qmin;
// in range r is integral, so the conversion is exact either way). If it
// wins, the clamp form belongs in formulas::quantize_value itself.
__device__ __forceinline__ float fmax_nn(float a, float b) { return fmaxf(a, b); }  // NaN-dropping max / min
__device__ __forceinline__ double fmax_nn(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float fmin_nn(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double fmin_nn(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ float fabs_of(float a) { return fabsf(a); }
__device__ __forceinline__ double fabs_of(double a) { return fabs(a); }

template <class M>
__device__ __forceinline__ int quantize_lean(M x, M inv_scale, int zero_point, int qmin, int qmax) {
  const M r = formulas::round_even(x * inv_scale) + M(zero_point);
  return static_cast<int>(fmin_nn(fmax_nn(r, M(qmin)), M(qmax)));  // fmax(NaN, qmin) = qmin
}

template <class X, class Q, int VEC, int ITEMS, bool PERSIST, bool LEAN>
__global__ void __launch_bounds__(512) rows_reg_kernel(const X* __restrict__ x, std::int64_t rows, std::int64_t D,
                                                       Q* __restrict__ q, std::int64_t ldq,
                                                       quant_math_t<X>* __restrict__ scale,
                                                       std::int32_t* __restrict__ zp, bool symmetric, int qmin,
                                                       int qmax) {
  using M = quant_math_t<X>;
  using XP = Pack<X, VEC>;
  using QP = Pack<Q, VEC>;
  __shared__ Range<M> sh[2][16];  // [row parity][warp of the block]
  const int G = static_cast<int>(blockDim.x), tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const int nvec = static_cast<int>(D / VEC);
  const int lane = tx & 31, gw = G >> 5, w0 = ty * gw;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.y;
  std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.y + ty;
  // Every group runs the same number of iterations (barriers): loop on the
  // block's first row, guard the group's own row with `valid`.
  std::int64_t r0 = static_cast<std::int64_t>(blockIdx.x) * blockDim.y;
  XP cur[ITEMS];
  load_row<ITEMS>(cur, reinterpret_cast<const XP*>(x + r * D), r < rows, nvec, tx, G);
  int parity = 0;
  for (; r0 < rows; r0 += step, r += step) {
    const bool valid = r < rows;
    XP nxt[ITEMS];
    if constexpr (PERSIST)
      load_row<ITEMS>(nxt, reinterpret_cast<const XP*>(x + (r + step) * D), r + step < rows, nvec, tx, G);
    Range<M> range = Range<M>::empty();
    if (LEAN && symmetric) {
      M m = M(0);
#pragma unroll
      for (int it = 0; it < ITEMS; ++it)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const M a = fabs_of(M(cur[it].v[e]));
          m = fmax_nn(m, a < std::numeric_limits<M>::infinity() ? a : M(0));  // NaN, inf: compare false
        }
      range = Range<M>{-m, m};
    } else {
#pragma unroll
      for (int it = 0; it < ITEMS; ++it)
#pragma unroll
        for (int e = 0; e < VEC; ++e) range.add(M(cur[it].v[e]));
    }
    range = warp_reduce(range);
    if (gw > 1) {
      if (lane == 0) sh[parity][w0 + (tx >> 5)] = range;
      __syncthreads();
      range = sh[parity][w0];
      for (int w = 1; w < gw; ++w) range.merge(sh[parity][w0 + w]);
      parity ^= 1;
    }
    const QParams<M> p = formulas::qparams_from_range<M>(range, symmetric, qmin, qmax);
    if (valid) {
      if (tx == 0) {
        scale[r] = p.scale;
        if (zp) zp[r] = p.zero_point;
      }
      const M inv = formulas::inverse_scale<M>(p.scale);
      QP* qr = reinterpret_cast<QP*>(q + r * ldq);
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const int v = it * G + tx;
        if (v < nvec) {
          QP out;
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            out.v[e] = static_cast<Q>(
                LEAN ? quantize_lean<M>(M(cur[it].v[e]), inv, p.zero_point, qmin, qmax)
                     : formulas::quantize_value<M>(M(cur[it].v[e]), inv, p.zero_point, qmin, qmax));
          qr[v] = out;
        }
      }
      Q* qs = q + r * ldq;
      for (std::int64_t j = D + tx; j < ldq; j += G) qs[j] = Q(0);
    }
    if constexpr (PERSIST) {
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) cur[it] = nxt[it];
    } else {
      if (r0 + step < rows)
        load_row<ITEMS>(cur, reinterpret_cast<const XP*>(x + (r + step) * D), r + step < rows, nvec, tx, G);
    }
  }
}

int g_token_variant = kDefaultTokenVariant;

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Launches rows_reg_kernel when a row fits in 512 * ITEMS vectors; false
// (nothing launched) otherwise. The persistent form of 16-bit inputs holds
// 4 vectors a set (8 spill: two sets of 64 widened floats).
template <class X, class Q, int VEC, int ITEMS_ASKED, bool PERSIST, bool LEAN = false>
bool launch_reg(const X* xp, std::int64_t rows, std::int64_t D, Q* qp, std::int64_t ldq, quant_math_t<X>* sp,
                std::int32_t* zp, const QuantSpec& spec, int dev) {
  constexpr int ITEMS = PERSIST && sizeof(X) == 2 && ITEMS_ASKED > 4 ? 4 : ITEMS_ASKED;
  const std::int64_t nvec = D / VEC;
  if (nvec > 512 * ITEMS) return false;
  unsigned G = 32;
  while (static_cast<std::int64_t>(G) * ITEMS < nvec) G <<= 1;
  const unsigned rb = G >= 256 ? 1 : 256 / G;
  auto kernel = rows_reg_kernel<X, Q, VEC, ITEMS, PERSIST, LEAN>;
  std::int64_t blocks = (rows + rb - 1) / rb;
  if constexpr (PERSIST) {
    // Resident blocks per SM, by log2 of the block size (32..512 threads).
    static int occupancy[16] = {};
    int& per_sm = occupancy[__builtin_ctz(G * rb)];
    if (per_sm == 0)
      QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(G * rb), 0));
    const std::int64_t resident = static_cast<std::int64_t>(::qgrad::cuda::fill_blocks(dev, 2048)) * std::max(per_sm, 1);
    blocks = std::min(blocks, resident);
  }
  blocks = std::min<std::int64_t>(blocks, INT_MAX);
  kernel<<<static_cast<unsigned>(blocks), dim3(G, rb), 0, ::qgrad::cuda::stream(dev)>>>(
      xp, rows, D, qp, ldq, sp, zp, spec.symmetric, spec.qmin, spec.qmax);
  QGRAD_LAUNCH_CHECK();
  return true;
}

template <class X, class Q, int VEC>
void rows_launch(const X* xp, std::int64_t rows, std::int64_t D, Q* qp, std::int64_t ldq, quant_math_t<X>* sp,
                 std::int32_t* zp, const QuantSpec& spec, int dev) {
  bool done = false;
  switch (g_token_variant) {
    case 1: done = launch_reg<X, Q, VEC, 8, false>(xp, rows, D, qp, ldq, sp, zp, spec, dev); break;
    case 2: done = launch_reg<X, Q, VEC, 4, false>(xp, rows, D, qp, ldq, sp, zp, spec, dev); break;
    case 3: done = launch_reg<X, Q, VEC, 8, true>(xp, rows, D, qp, ldq, sp, zp, spec, dev); break;
    case 4: done = launch_reg<X, Q, VEC, 4, true>(xp, rows, D, qp, ldq, sp, zp, spec, dev); break;
    case 5: done = launch_reg<X, Q, VEC, 8, false, true>(xp, rows, D, qp, ldq, sp, zp, spec, dev); break;
    case 6: done = launch_reg<X, Q, VEC, 8, true, true>(xp, rows, D, qp, ldq, sp, zp, spec, dev); break;
    default: break;
  }
  if (done) return;
  const std::int64_t nvec = D / VEC;
  unsigned threads = 32;
  while (threads < 256 && static_cast<std::int64_t>(threads) * kItems < nvec) threads <<= 1;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>(rows, INT_MAX));
  rows_kernel<X, Q, VEC><<<blocks, threads, 0, ::qgrad::cuda::stream(dev)>>>(xp, rows, D, qp, ldq, sp, zp,
                                                                           spec.symmetric, spec.qmin, spec.qmax);
  QGRAD_LAUNCH_CHECK();
}

template <class X, class Q>
void rows_impl(const Tensor& x, std::int64_t D, const QuantSpec& spec, const Tensor& q, std::int64_t ldq,
               const Tensor& scale, const Tensor& zero_point) {
  constexpr int V = 16 / sizeof(X);
  const std::int64_t rows = D > 0 ? x.numel() / D : 0;
  if (rows == 0) return;
  const bool vec = D % V == 0 && ldq % V == 0 && aligned16(x.data_ptr()) &&
                   (reinterpret_cast<std::uintptr_t>(q.data_ptr()) % V) == 0;
  const int dev = q.device().index;
  const X* xp = static_cast<const X*>(x.data_ptr());
  Q* qp = static_cast<Q*>(q.data_ptr());
  auto* sp = static_cast<quant_math_t<X>*>(scale.data_ptr());
  auto* zp = zero_point.defined() ? static_cast<std::int32_t*>(zero_point.data_ptr()) : nullptr;
  if (vec) rows_launch<X, Q, V>(xp, rows, D, qp, ldq, sp, zp, spec, dev);
  else rows_launch<X, Q, 1>(xp, rows, D, qp, ldq, sp, zp, spec, dev);
}

// ---- per-slice (tensor / channel) layouts ----

// Order-preserving integer keys of floating values (for atomicMin/Max).
template <class M> struct KeyOf;
template <> struct KeyOf<float> {
  using type = int;
  __device__ static int encode(float v) {
    const int b = __float_as_int(v);
    return b >= 0 ? b : b ^ 0x7fffffff;
  }
  __device__ static float decode(int k) { return __int_as_float(k >= 0 ? k : k ^ 0x7fffffff); }
};
template <> struct KeyOf<double> {
  using type = long long;
  __device__ static long long encode(double v) {
    const long long b = __double_as_longlong(v);
    return b >= 0 ? b : b ^ 0x7fffffffffffffffLL;
  }
  __device__ static double decode(long long k) { return __longlong_as_double(k >= 0 ? k : k ^ 0x7fffffffffffffffLL); }
};

template <class X>
__global__ void slice_reduce_kernel(const X* __restrict__ x, AxisLayout lay,
                                    typename KeyOf<quant_math_t<X>>::type* keys) {
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
  slice_reduce_kernel<X><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), threads, 0,
                           ::qgrad::cuda::stream(dev)>>>(static_cast<const X*>(x.data_ptr()), lay, keys);
  QGRAD_LAUNCH_CHECK();
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

int set_dynamic_quant_token_variant(int variant) {
  const int previous = g_token_variant;
  g_token_variant = variant < 0 || variant >= kDynamicQuantTokenVariants ? kDefaultTokenVariant : variant;
  return previous;
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
