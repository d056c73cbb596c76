// dev/cuda/row_fq_forms.cu: where the per-token row fake quants spend their
// time (issue #13 item 5, the bf16 ViT step). The library's row kernels
// (kernels/cuda/quantize_rows.cu fake_quantize_dynamic_rows_kernel, norm_rows.cu
// layer_norm_fake_quantize_rows_kernel) take 10-21 us at the ViT's 12544
// rows where their bytes need about 3 us, and several rows a warp made them
// slower (dev/cuda/dynamic_rows_multi.cu, 2026-11-27), so they are not short
// of work in flight: they look instruction-bound. Two instruction-heavy
// parts, each with an exact cheaper form:
// - the min/max: formulas::min_combine / max_combine cost about seven
//   instructions a pair (NaN first, -0 below +0); min.NaN / max.NaN
//   (fast_min / fast_max, kernels/cuda/minmax.cuh) give the same value for
//   every pair without NaN, and a NaN anywhere in the row makes every lane's
//   result NaN, so the warp can redo that row with the combines;
// - the fake quant: FakeQuantOp's general int64 form (a 64-bit conversion,
//   64-bit clamps and compares) against its float form (q and the clamp in
//   f32, exact inside +-2^24; kernels/formulas/quantize.h).
// Measured on an H200 (2026-11-27, both forms giving the library's bytes on
// normal and special rows), us a call at 12544 rows (library / fast min/max /
// float fq / both / loads and stores only):
//   bf16 fq rows of 128        9.46 / 6.55 / 8.58 / 5.84 / 2.15
//   bf16 gelu + fq rows of 256 18.58 / 14.67 / 17.32 / 13.13 / 2.92
//   bf16 layer_norm + fq, 128  14.78 / 12.29 / 13.74 / 10.58 / 2.16
//   f32 fq rows of 128         8.68 / 6.00 / 8.05 / 5.01 / 2.85
//   f32 layer_norm + fq, 128   13.46 / 10.81 / 12.68 / 9.68 / 2.84
// ncu: the library's bf16 rows of 128 at 3.05 instructions a cycle, issue
// slots 65% busy, memory 7%. The library took both forms.
// Each variant is checked byte for byte (values and mask words) against the
// library's form on seeded normal rows and on rows of special values (NaN,
// +-inf, +-0, ties, huge), then timed: 50 launches captured in a CUDA graph,
// median of 21 replays, against a kernel that only loads and stores the
// same bytes. Standalone (headers only), so it can be compiled anywhere:
//   nvcc -O3 -std=c++20 -arch=sm_90 --expt-relaxed-constexpr --fmad=false
//     -Ibuild/include/kernels -Ibuild/include/core dev/cuda/row_fq_forms.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "graph_timing.cuh"
#include "qgrad/core/half.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/formulas/lowbit.h"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/vec4.h"

namespace {

using namespace qgrad;
namespace f = qgrad::formulas;
using qgrad::kernels::cuda::store_mask_block;
using qgrad::kernels::Vec4;

// FakeQuantOp's general (int64) form, as the library had it before the float form.
template <class T>
__device__ __forceinline__ T fq_int64(T x, const f::ChannelParams& p, std::int64_t qmin, std::int64_t qmax, bool& bit) {
  std::int64_t qc;
  return f::clamped_quant(x, p, qmin, qmax, qc, bit) ? f::dequant_value<T, true>(qc, p.zp, p.scale) : x;
}

template <int kFq, class T>
__device__ __forceinline__ T fq(T x, const f::ChannelParams& p, int qmin, int qmax, bool& bit) {
  if constexpr (kFq == 0) return fq_int64(x, p, qmin, qmax, bit);
  else {
    const f::FakeQuantOp<T, true> op{qmin, qmax};
    return op.row_value(x, p, op.float_form_exact(p), bit);
  }
}

// The row's min/max: kMinmax 0 the combines (the library's form before),
// 1 the library's warp_minmax_values (fast_min / fast_max, a row holding a
// NaN redone with the combines).
template <int kMinmax, int N>
__device__ __forceinline__ void row_minmax(const float (&v)[N], float& lo, float& hi) {
  if constexpr (kMinmax == 1) {
    qgrad::kernels::cuda::warp_minmax_values(v, lo, hi);
  } else {
    lo = INFINITY;
    hi = -INFINITY;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      lo = f::min_combine(lo, v[k]);
      hi = f::max_combine(hi, v[k]);
    }
    qgrad::kernels::cuda::warp_minmax(lo, hi);
  }
}

template <class T, int kChunks, bool kGelu, int kMinmax, int kFq>
__global__ void __launch_bounds__(256)
    fq_rows_kernel(const T* __restrict__ x, T* __restrict__ y, std::uint32_t* __restrict__ mask, std::int64_t rows,
                   int qmin, int qmax, float eps) {
  const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;
  const unsigned lane = threadIdx.x & 31u;
  T v[kChunks][4];
  float fv[kChunks * 4];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const Vec4<T> w = *reinterpret_cast<const Vec4<T>*>(x + (row * kChunks + c) * kBitmaskBlock + 4 * lane);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[c][k] = kGelu ? T(f::gelu_erf(op_math_t<T>(w.v[k]))) : w.v[k];
      fv[4 * c + k] = f::cast_value<float>(v[c][k]);
    }
  }
  float lo, hi;
  row_minmax<kMinmax>(fv, lo, hi);
  f::ChannelParams p;
  f::int4_qparams(lo, hi, qmin, qmax, false, eps, p.scale, p.zp);
  p.inv_scale = f::inv_scale_of(p.scale);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const std::int64_t b = row * kChunks + c;
    Vec4<T> o;
    bool bit[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) o.v[k] = fq<kFq>(v[c][k], p, qmin, qmax, bit[k]);
    *reinterpret_cast<Vec4<T>*>(y + b * kBitmaskBlock + 4 * lane) = o;
    store_mask_block(mask, b, bit, lane);
  }
}

// layer_norm_fake_quantize_rows_kernel (weight and bias, asymmetric, d = 32 kPer).
template <class T, int kPer, int kMinmax, int kFq>
__global__ void __launch_bounds__(256)
    ln_fq_rows_kernel(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bs, T* __restrict__ y,
                      float* __restrict__ mean, float* __restrict__ rstd, std::uint32_t* __restrict__ mask,
                      std::int64_t rows, int qmin, int qmax, float eps) {
  using M = op_math_t<T>;
  constexpr int d = 32 * kPer;
  const std::int64_t r = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (r >= rows) return;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const T* xr = x + r * d;
  M xv[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) xv[t] = M(xr[lane + 32 * t]);
  M s = M(0);
#pragma unroll
  for (int t = 0; t < kPer; ++t) s += xv[t];
  const M mu = qgrad::kernels::cuda::warp_lane_sum(s) / M(d);
  M s2 = M(0);
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const M c = xv[t] - mu;
    s2 += c * c;
  }
  const M var = qgrad::kernels::cuda::warp_lane_sum(s2) / M(d);
  const M rs = M(1) / f::sqrt_m(var + M(1e-5f));
  T v[kPer];
  float fv[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int j = lane + 32 * t;
    M u = (xv[t] - mu) * rs;
    u = u * M(wt[j]);
    u = u + M(bs[j]);
    v[t] = T(u);
    fv[t] = f::cast_value<float>(v[t]);
  }
  float lo, hi;
  row_minmax<kMinmax>(fv, lo, hi);
  f::ChannelParams q;
  f::int4_qparams(lo, hi, qmin, qmax, false, eps, q.scale, q.zp);
  q.inv_scale = f::inv_scale_of(q.scale);
  const std::int64_t n = rows * d;
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    bool bit;
    const std::int64_t i = r * d + lane + 32 * t;
    y[i] = fq<kFq>(v[t], q, qmin, qmax, bit);
    bitmask_ballot_store(mask, i, n, bit);
  }
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// The bytes' floor: load the row and store it (and a mask word a block).
template <class T, int kChunks>
__global__ void __launch_bounds__(256)
    copy_rows_kernel(const T* __restrict__ x, T* __restrict__ y, std::uint32_t* __restrict__ mask, std::int64_t rows) {
  const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;
  const unsigned lane = threadIdx.x & 31u;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const std::int64_t b = row * kChunks + c;
    const Vec4<T> w = *reinterpret_cast<const Vec4<T>*>(x + b * kBitmaskBlock + 4 * lane);
    *reinterpret_cast<Vec4<T>*>(y + b * kBitmaskBlock + 4 * lane) = w;
    if (lane < 4) mask[b * kBitmaskWordsPerBlock + lane] = static_cast<std::uint32_t>(b);
  }
}

template <class T>
std::vector<T> host_values(std::int64_t n, bool special, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<T> h(static_cast<std::size_t>(n));
  const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 0.5f, -0.5f, 1.5f, 2.5f, 1e30f, -1e30f, 3.0f, -3.0f};
  for (std::int64_t i = 0; i < n; ++i) {
    float v = nd(gen);
    // Special rows: every third row takes special values at a few places (rows with and without NaN).
    if (special && (i / 128) % 3 == 0 && gen() % 16 == 0) v = specials[gen() % (sizeof(specials) / sizeof(float))];
    if (special && (i / 128) % 3 == 1 && gen() % 32 == 0) v = specials[1 + gen() % 12];
    h[static_cast<std::size_t>(i)] = T(v);
  }
  return h;
}

int failures = 0;

template <class T>
struct Buffers {
  std::int64_t rows, d;
  T *x, *y, *wt, *bs;
  float *mean, *rstd;
  std::uint32_t* mask;
  Buffers(std::int64_t r, std::int64_t dd) : rows(r), d(dd) {
    const std::size_t n = static_cast<std::size_t>(r * dd);
    DEV_CHECK_CUDA(cudaMalloc(&x, n * sizeof(T)));
    DEV_CHECK_CUDA(cudaMalloc(&y, n * sizeof(T)));
    DEV_CHECK_CUDA(cudaMalloc(&wt, static_cast<std::size_t>(dd) * sizeof(T)));
    DEV_CHECK_CUDA(cudaMalloc(&bs, static_cast<std::size_t>(dd) * sizeof(T)));
    DEV_CHECK_CUDA(cudaMalloc(&mean, static_cast<std::size_t>(r) * sizeof(float)));
    DEV_CHECK_CUDA(cudaMalloc(&rstd, static_cast<std::size_t>(r) * sizeof(float)));
    DEV_CHECK_CUDA(cudaMalloc(&mask, n / 8));
  }
  void fill(bool special, std::uint32_t seed) {
    const auto h = host_values<T>(rows * d, special, seed);
    DEV_CHECK_CUDA(cudaMemcpy(x, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    const auto hw = host_values<T>(d, false, seed + 1), hb = host_values<T>(d, false, seed + 2);
    DEV_CHECK_CUDA(cudaMemcpy(wt, hw.data(), hw.size() * sizeof(T), cudaMemcpyHostToDevice));
    DEV_CHECK_CUDA(cudaMemcpy(bs, hb.data(), hb.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<unsigned char> out() const {
    const std::size_t n = static_cast<std::size_t>(rows * d);
    std::vector<unsigned char> h(n * sizeof(T) + n / 8 + 2 * static_cast<std::size_t>(rows) * sizeof(float));
    DEV_CHECK_CUDA(cudaDeviceSynchronize());
    DEV_CHECK_CUDA(cudaMemcpy(h.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost));
    DEV_CHECK_CUDA(cudaMemcpy(h.data() + n * sizeof(T), mask, n / 8, cudaMemcpyDeviceToHost));
    DEV_CHECK_CUDA(cudaMemcpy(h.data() + n * sizeof(T) + n / 8, mean, static_cast<std::size_t>(rows) * sizeof(float),
                          cudaMemcpyDeviceToHost));
    DEV_CHECK_CUDA(cudaMemcpy(h.data() + n * sizeof(T) + n / 8 + static_cast<std::size_t>(rows) * sizeof(float), rstd,
                          static_cast<std::size_t>(rows) * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() {
    const std::size_t n = static_cast<std::size_t>(rows * d);
    DEV_CHECK_CUDA(cudaMemset(y, 0x7f, n * sizeof(T)));
    DEV_CHECK_CUDA(cudaMemset(mask, 0x5a, n / 8));
    DEV_CHECK_CUDA(cudaMemset(mean, 0x7f, static_cast<std::size_t>(rows) * sizeof(float)));
    DEV_CHECK_CUDA(cudaMemset(rstd, 0x7f, static_cast<std::size_t>(rows) * sizeof(float)));
  }
};

// One shape: the variants' bytes against variant (0, 0) on normal and special
// rows, then their times.
template <class T, int kChunks, bool kGelu, bool kNorm>
void run_case(const char* name, std::int64_t rows) {
  constexpr std::int64_t d = 128 * kChunks;
  Buffers<T> buf(rows, d);
  const unsigned blocks = static_cast<unsigned>((rows * 32 + 255) / 256);
  using Launch = std::function<void(cudaStream_t)>;
  auto launcher = [&](auto minmax, auto form) -> Launch {
    constexpr int kM = decltype(minmax)::value, kF = decltype(form)::value;
    return [&, blocks](cudaStream_t s) {
      if constexpr (kNorm)
        ln_fq_rows_kernel<T, 4 * kChunks, kM, kF><<<blocks, 256, 0, s>>>(buf.x, buf.wt, buf.bs, buf.y, buf.mean,
                                                                       buf.rstd, buf.mask, rows, -128, 127, 1.1920929e-07f);
      else
        fq_rows_kernel<T, kChunks, kGelu, kM, kF><<<blocks, 256, 0, s>>>(buf.x, buf.y, buf.mask, rows, -128, 127,
                                                                       1.1920929e-07f);
    };
  };
  using I0 = std::integral_constant<int, 0>;
  using I1 = std::integral_constant<int, 1>;
  const Launch l00 = launcher(I0{}, I0{}), l10 = launcher(I1{}, I0{}), l01 = launcher(I0{}, I1{}),
               l11 = launcher(I1{}, I1{});
  for (const bool special : {false, true}) {
    buf.fill(special, special ? 7u : 3u);
    buf.poison();
    l00(nullptr);
    const auto want = buf.out();
    const char* names[] = {"fast minmax", "float fq", "both"};
    int k = 0;
    for (const Launch* l : {&l10, &l01, &l11}) {
      buf.poison();
      (*l)(nullptr);
      const bool same = buf.out() == want;
      if (!same) ++failures;
      std::printf("%-28s %s rows: %-12s %s\n", name, special ? "special" : "normal ", names[k++],
                  same ? "same bytes" : "DIFFERENT BYTES");
    }
  }
  buf.fill(false, 3u);
  for (int round = 0; round < 2; ++round) {
    const double copy = graph_us([&](cudaStream_t s) {
      copy_rows_kernel<T, kChunks><<<blocks, 256, 0, s>>>(buf.x, buf.y, buf.mask, rows);
    });
    std::printf("%-28s us a call: library %.2f  fast minmax %.2f  float fq %.2f  both %.2f  (load+store only %.2f)\n",
                name, graph_us(l00), graph_us(l10), graph_us(l01), graph_us(l11), copy);
  }
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("dev_row_fq_forms: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  DEV_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s\n", prop.name);
  const std::int64_t rows = 12544;  // the ViT's b256 x 49 tokens
  run_case<Float16<BFloat16Format>, 1, false, false>("bf16 fq rows x128", rows);
  run_case<Float16<BFloat16Format>, 2, true, false>("bf16 gelu+fq rows x256", rows);
  run_case<Float16<BFloat16Format>, 1, false, true>("bf16 layer_norm+fq x128", rows);
  run_case<float, 1, false, false>("f32 fq rows x128", rows);
  run_case<float, 1, false, true>("f32 layer_norm+fq x128", rows);
  run_case<Float16<BFloat16Format>, 1, false, false>("bf16 fq rows x128 (1003)", 1003);
  std::printf(failures == 0 ? "every variant gives the library's bytes\n" : "VARIANTS DIFFER\n");
  return failures == 0 ? 0 : 1;
}
