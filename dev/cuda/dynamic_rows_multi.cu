// dev/cuda/dynamic_rows_multi.cu: fake_quantize_dynamic's row kernel with
// several rows a warp (issue #13 item 5, the bf16 ViT step). The library's
// kernel (kernels/cuda/quantize.cu, fake_quantize_dynamic_rows_kernel) gives
// each warp one row: at the ViT's 12544 rows of 128 that is 1568 blocks of 8
// warps, 1.5 waves of an H200, and each warp's work is one short chain (load,
// ten shuffles for the min / max, qparams, quantize, store): the twenty-third
// session's profile has it at 15.4 us (x 13 a step) where its bytes need
// about 3 us, and the GELU-prologue form (fc2's input, rows of 256) at 21.5 us
// (x 6). Here a warp takes kRows rows: all their loads issued first, the rows'
// shuffles interleaved, so a warp has kRows independent chains in flight and
// the grid fits one wave. The lanes hold the same elements as the library's
// kernel (lane l: elements 4l .. 4l + 3 of each 128-element block) and the
// min / max are exact and order-free, so every output and mask bit is the
// library's.
//
// The same for the norms' fused fake quant (layer_norm_fake_quantize_rows_kernel,
// kernels/cuda/norm_rows.cu: 12 x 16.5 us a step), each row keeping its lane
// layout and warp_lane_sum tree, so its outputs, statistics and mask too.
//
// Written in a session without GPU time left; not run yet:
//   build-gpu/dev/dev_dynamic_rows_multi
// checks each variant's y and mask bytes against the library's kernel (f32
// and bf16; rows of 128 and 256; with and without the GELU prologue; row
// counts that leave a partial warp), then times them at the ViT's shapes.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "../../bench/bench_common.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#include "qgrad/kernels/formulas/lowbit.h"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/lowbit.h"
#include "qgrad/kernels/vec4.h"

using namespace qgrad;
using qgrad::kernels::RowPrologue;

namespace qgrad::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // the library's kDynamicRowsThreads

template <RowPrologue kPrologue, class T>
__device__ __forceinline__ T prologue(T v) {
  if constexpr (kPrologue == RowPrologue::gelu) return T(formulas::gelu_erf(op_math_t<T>(v)));
  else if constexpr (kPrologue == RowPrologue::gelu_tanh) return T(formulas::gelu_tanh(op_math_t<T>(v)));
  else return v;
}

// warp_minmax (kernels/cuda/minmax.cuh) of kRows rows, their shuffles interleaved.
template <int kRows>
__device__ __forceinline__ void warp_minmax_rows(float (&lo)[kRows], float (&hi)[kRows]) {
  for (int s = 16; s > 0; s /= 2)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      lo[r] = formulas::min_combine(lo[r], __shfl_xor_sync(0xffffffffu, lo[r], s));
      hi[r] = formulas::max_combine(hi[r], __shfl_xor_sync(0xffffffffu, hi[r], s));
    }
}

// kRows rows a warp: rows kRows * warp ... ; a row past `rows` is computed
// on zeros and not stored (the warp's shuffles and ballots stay uniform).
template <class T, int kChunks, int kRows, RowPrologue kPrologue>
__global__ void __launch_bounds__(kThreads)
    rows_multi_kernel(const T* __restrict__ x, T* __restrict__ y, std::uint32_t* __restrict__ mask, std::int64_t rows,
                      int qmin, int qmax, bool symmetric, float eps) {
  const std::int64_t warp = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  const unsigned lane = threadIdx.x & 31u;
  const std::int64_t first = warp * kRows;
  if (first >= rows) return;  // whole warps leave together
  constexpr std::int64_t kRowLen = std::int64_t{kChunks} * kBitmaskBlock;
  T v[kRows][kChunks][4];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const std::int64_t row = first + r;
      if (row < rows) {
        const Vec4<T> w = *reinterpret_cast<const Vec4<T>*>(x + row * kRowLen + c * kBitmaskBlock + 4 * lane);
#pragma unroll
        for (int k = 0; k < 4; ++k) v[r][c][k] = w.v[k];
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) v[r][c][k] = T(0.0f);
      }
    }
  float lo[kRows], hi[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    lo[r] = INFINITY;
    hi[r] = -INFINITY;
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[r][c][k] = prologue<kPrologue>(v[r][c][k]);
        const float f = formulas::cast_value<float>(v[r][c][k]);
        lo[r] = formulas::min_combine(lo[r], f);
        hi[r] = formulas::max_combine(hi[r], f);
      }
  }
  warp_minmax_rows(lo, hi);
  const formulas::FakeQuantOp<T, true> op{qmin, qmax};
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t row = first + r;
    formulas::ChannelParams p;
    formulas::int4_qparams(lo[r], hi[r], qmin, qmax, symmetric, eps, p.scale, p.zp);
    p.inv_scale = formulas::inv_scale_of(p.scale);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      T o[4];
      bool bit[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) o[k] = op(v[r][c][k], p, false, bit[k]);
      if (row >= rows) continue;  // uniform across the warp
      Vec4<T> w;
#pragma unroll
      for (int k = 0; k < 4; ++k) w.v[k] = o[k];
      *reinterpret_cast<Vec4<T>*>(y + row * kRowLen + c * kBitmaskBlock + 4 * lane) = w;
      if (mask) store_mask_block(mask, row * kChunks + c, bit, lane);
    }
  }
}

template <class T, int kChunks, int kRows, RowPrologue kPrologue>
void launch_multi(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t rows, int qmin, int qmax,
                  bool symmetric, float eps) {
  constexpr int rows_per_block = kThreads / 32 * kRows;
  const auto blocks = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  ::qgrad::cuda::launch_kernel(y.device().index, rows_multi_kernel<T, kChunks, kRows, kPrologue>, blocks, kThreads, 0,
                               static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), mask, rows, qmin,
                               qmax, symmetric, eps);
}

// layer_norm then the per-token fake quant (the library's
// layer_norm_fake_quantize_rows_kernel, kernels/cuda/norm_rows.cu) with kRows
// rows a warp: each row's lane layout (lane l: elements l, l + 32, ...), sums
// (warp_lane_sum's tree) and formulas as the library's, the rows' loads
// issued first and their reductions interleaved: the same bits.
template <class T, int kPer, int kRows>
__global__ void __launch_bounds__(kThreads)
    norm_rows_multi_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                           T* __restrict__ y, op_math_t<T>* mean, op_math_t<T>* rstd, std::uint32_t* mask,
                           std::int64_t rows, NormQuantRows a) {
  using M = op_math_t<T>;
  constexpr int d = 32 * kPer;
  const std::int64_t first = ((std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5) * kRows;
  if (first >= rows) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x & 31u);
  M xv[kRows][kPer];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kPer; ++t) xv[r][t] = first + r < rows ? M(x[(first + r) * d + lane + 32 * t]) : M(0);
  M mu[kRows], rs[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    M s = M(0);
#pragma unroll
    for (int t = 0; t < kPer; ++t) s += xv[r][t];
    mu[r] = warp_lane_sum(s) / M(d);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    M s2 = M(0);
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const M c = xv[r][t] - mu[r];
      s2 += c * c;
    }
    const M var = warp_lane_sum(s2) / M(d);
    rs[r] = M(1) / formulas::sqrt_m(var + M(a.eps));
  }
  T v[kRows][kPer];
  float lo[kRows], hi[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    lo[r] = INFINITY;
    hi[r] = -INFINITY;
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int j = lane + 32 * t;
      M u = (xv[r][t] - mu[r]) * rs[r];
      if (w != nullptr) u = u * M(w[j]);
      if (b != nullptr) u = u + M(b[j]);
      v[r][t] = T(u);
      const float f = formulas::cast_value<float>(v[r][t]);
      lo[r] = formulas::min_combine(lo[r], f);
      hi[r] = formulas::max_combine(hi[r], f);
    }
  }
  warp_minmax_rows(lo, hi);
  const formulas::FakeQuantOp<T, true> op{a.qmin, a.qmax};
  const std::int64_t n = rows * d;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t row = first + r;
    formulas::ChannelParams q;
    formulas::int4_qparams(lo[r], hi[r], a.qmin, a.qmax, a.symmetric, a.quant_eps, q.scale, q.zp);
    q.inv_scale = formulas::inv_scale_of(q.scale);
    if (row >= rows) continue;  // uniform across the warp
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      bool bit;
      const std::int64_t i = row * d + lane + 32 * t;
      y[i] = op(v[r][t], q, false, bit);
      if (mask != nullptr) bitmask_ballot_store(mask, i, n, bit);
    }
    if (lane == 0) {
      mean[row] = mu[r];
      rstd[row] = rs[r];
    }
  }
}

template <class T, int kPer, int kRows>
void launch_norm_multi(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                       const Tensor& rstd, std::uint32_t* mask, const NormQuantRows& a) {
  using M = op_math_t<T>;
  const std::int64_t rows = x.numel() / a.d;
  constexpr int rows_per_block = kThreads / 32 * kRows;
  const auto blocks = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  ::qgrad::cuda::launch_kernel(y.device().index, norm_rows_multi_kernel<T, kPer, kRows>, blocks, kThreads, 0,
                               static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()),
                               static_cast<const T*>(b.data_ptr()), static_cast<T*>(y.data_ptr()),
                               static_cast<M*>(mean.data_ptr()), static_cast<M*>(rstd.data_ptr()), mask, rows, a);
}

}  // namespace
}  // namespace qgrad::kernels::cuda

namespace {

using Launch = std::function<void(const Tensor&, const Tensor&, std::uint32_t*)>;

struct Variant {
  const char* name;
  Launch run;
};

template <class T, int kChunks, RowPrologue kPrologue>
std::vector<Variant> variants(std::int64_t rows, bool symmetric) {
  const int qmin = -128, qmax = 127;
  const float eps = 1.1920929e-07f;
  const std::int64_t row_len = std::int64_t{kChunks} * 128;
  return {
      {"library", [=](const Tensor& x, const Tensor& y, std::uint32_t* m) {
         kernels::fake_quantize_dynamic_rows(x, y, m, row_len, qmin, qmax, symmetric, eps, kPrologue);
       }},
      {"rows2", [=](const Tensor& x, const Tensor& y, std::uint32_t* m) {
         kernels::cuda::launch_multi<T, kChunks, 2, kPrologue>(x, y, m, rows, qmin, qmax, symmetric, eps);
       }},
      {"rows4", [=](const Tensor& x, const Tensor& y, std::uint32_t* m) {
         kernels::cuda::launch_multi<T, kChunks, 4, kPrologue>(x, y, m, rows, qmin, qmax, symmetric, eps);
       }},
  };
}

std::vector<unsigned char> bytes(const Tensor& t) {
  const Tensor h = t.cpu();
  const auto* p = static_cast<const unsigned char*>(h.data_ptr());
  return std::vector<unsigned char>(p, p + h.nbytes());
}

// Every variant against the library on the same input (y and mask poisoned
// first), then the timing: us a call, median of 50 runs of 10 calls.
template <class T, int kChunks, RowPrologue kPrologue>
bool run_case(DType dt, std::int64_t rows, bool symmetric, bool time_it) {
  const std::int64_t row_len = std::int64_t{kChunks} * 128;
  const TensorOptions on = TensorOptions{}.with_dtype(dt).with_device(Device::cuda());
  Generator g(rows + row_len);
  const Tensor x = mul(randn({rows, row_len}, g, on), 3.0);
  const std::int64_t words = bitmask_words(rows * row_len);
  const TensorOptions wo = TensorOptions{}.with_dtype(DType::s32).with_device(Device::cuda());
  std::vector<Variant> vs = variants<T, kChunks, kPrologue>(rows, symmetric);
  std::vector<unsigned char> want_y, want_m;
  bool ok = true;
  std::vector<double> us;
  for (std::size_t i = 0; i < vs.size(); ++i) {
    Tensor y = full({rows, row_len}, std::nan(""), on), m = full({words}, -1.0, wo);
    vs[i].run(x, y, static_cast<std::uint32_t*>(m.data_ptr()));
    if (i == 0) {
      want_y = bytes(y);
      want_m = bytes(m);
    } else {
      const bool same = bytes(y) == want_y && bytes(m) == want_m;
      ok = ok && same;
      std::printf("%-4s rows %6lld x %4lld %s %-9s %-7s: %s\n", dtype_name(dt), static_cast<long long>(rows),
                  static_cast<long long>(row_len), kPrologue == RowPrologue::none ? "plain" : "gelu ",
                  symmetric ? "sym" : "asym", vs[i].name, same ? "same bytes" : "DIFFERENT");
    }
    if (time_it)
      us.push_back(bench::time_cuda([&](int) {
                     for (int k = 0; k < 10; ++k) vs[i].run(x, y, static_cast<std::uint32_t*>(m.data_ptr()));
                   }).median_ms * 100.0);
  }
  if (time_it) {
    std::printf("%-4s rows %6lld x %4lld %s: us a call:", dtype_name(dt), static_cast<long long>(rows),
                static_cast<long long>(row_len), kPrologue == RowPrologue::none ? "plain" : "gelu ");
    for (std::size_t i = 0; i < vs.size(); ++i) std::printf("  %s %.2f", vs[i].name, us[i]);
    std::printf("\n");
  }
  return ok;
}

// layer_norm + fake quant, rows of 128 (the ViT's norms), weight and bias
// present: every output, statistic and mask byte against the library's.
template <class T>
bool run_norm_case(DType dt, std::int64_t rows, bool time_it) {
  using kernels::NormQuantRows;
  const std::int64_t d = 128;
  const TensorOptions on = TensorOptions{}.with_dtype(dt).with_device(Device::cuda());
  const TensorOptions stat = TensorOptions{}.with_dtype(DType::f32).with_device(Device::cuda());
  const TensorOptions wo = TensorOptions{}.with_dtype(DType::s32).with_device(Device::cuda());
  Generator g(rows + 5);
  const Tensor x = add(mul(randn({rows, d}, g, on), 2.0), 0.5), w = randn({d}, g, on), b = randn({d}, g, on);
  NormQuantRows a;
  a.d = d;
  a.quant_eps = 1.1920929e-07f;
  using Run = std::function<void(const Tensor&, const Tensor&, const Tensor&, std::uint32_t*)>;
  const std::vector<std::pair<const char*, Run>> vs = {
      {"library",
       [&](const Tensor& y, const Tensor& m, const Tensor& r, std::uint32_t* k) {
         kernels::layer_norm_fake_quantize_dynamic_rows(x, w, b, y, m, r, k, a);
       }},
      {"rows2", [&](const Tensor& y, const Tensor& m, const Tensor& r,
                    std::uint32_t* k) { kernels::cuda::launch_norm_multi<T, 4, 2>(x, w, b, y, m, r, k, a); }},
      {"rows4", [&](const Tensor& y, const Tensor& m, const Tensor& r,
                    std::uint32_t* k) { kernels::cuda::launch_norm_multi<T, 4, 4>(x, w, b, y, m, r, k, a); }}};
  std::vector<unsigned char> want;
  bool ok = true;
  std::vector<double> us;
  for (std::size_t i = 0; i < vs.size(); ++i) {
    Tensor y = full({rows, d}, std::nan(""), on), m = full({rows}, std::nan(""), stat), r = full({rows}, std::nan(""), stat);
    Tensor k = full({bitmask_words(rows * d)}, -1.0, wo);
    vs[i].second(y, m, r, static_cast<std::uint32_t*>(k.data_ptr()));
    std::vector<unsigned char> got = bytes(y);
    for (const Tensor* t : {&m, &r, &k}) {
      const std::vector<unsigned char> more = bytes(*t);
      got.insert(got.end(), more.begin(), more.end());
    }
    if (i == 0) {
      want = got;
    } else {
      ok = ok && got == want;
      std::printf("%-4s rows %6lld x %4lld layer_norm+fq %-7s: %s\n", dtype_name(dt), static_cast<long long>(rows),
                  static_cast<long long>(d), vs[i].first, got == want ? "same bytes" : "DIFFERENT");
    }
    if (time_it)
      us.push_back(bench::time_cuda([&](int) {
                     for (int c = 0; c < 10; ++c) vs[i].second(y, m, r, static_cast<std::uint32_t*>(k.data_ptr()));
                   }).median_ms * 100.0);
  }
  if (time_it) {
    std::printf("%-4s rows %6lld x %4lld layer_norm+fq: us a call:", dtype_name(dt), static_cast<long long>(rows),
                static_cast<long long>(d));
    for (std::size_t i = 0; i < vs.size(); ++i) std::printf("  %s %.2f", vs[i].first, us[i]);
    std::printf("\n");
  }
  return ok;
}

}  // namespace

int main() {
  if (cuda_device_count() == 0) {
    std::printf("dev_dynamic_rows_multi: no CUDA device\n");
    return 0;
  }
  bool ok = true;
  // Checks: row counts that leave partial warps of 2 and 4 rows and a partial block.
  for (const std::int64_t rows : {std::int64_t{1}, std::int64_t{7}, std::int64_t{37}, std::int64_t{1003}})
    for (const bool sym : {false, true}) {
      ok = run_case<float, 1, RowPrologue::none>(DType::f32, rows, sym, false) && ok;
      ok = run_case<bfloat16, 1, RowPrologue::none>(DType::bf16, rows, sym, false) && ok;
      ok = run_case<bfloat16, 2, RowPrologue::gelu>(DType::bf16, rows, sym, false) && ok;
      ok = run_case<float, 2, RowPrologue::gelu>(DType::f32, rows, sym, false) && ok;
    }
  for (const std::int64_t rows : {std::int64_t{1}, std::int64_t{7}, std::int64_t{37}, std::int64_t{1003}}) {
    ok = run_norm_case<float>(DType::f32, rows, false) && ok;
    ok = run_norm_case<bfloat16>(DType::bf16, rows, false) && ok;
  }
  // The ViT step's shapes (B = 256, 49 tokens): the per-token fake quants of rows of 128 (after the
  // attention; asymmetric) and the GELU prologue's rows of 256 (fc2's input), bf16 and f32; two rounds.
  for (int round = 0; round < 2; ++round) {
    ok = run_case<bfloat16, 1, RowPrologue::none>(DType::bf16, 12544, false, true) && ok;
    ok = run_case<bfloat16, 2, RowPrologue::gelu>(DType::bf16, 12544, false, true) && ok;
    ok = run_case<float, 1, RowPrologue::none>(DType::f32, 12544, false, true) && ok;
    ok = run_case<float, 2, RowPrologue::gelu>(DType::f32, 12544, false, true) && ok;
    ok = run_norm_case<bfloat16>(DType::bf16, 12544, true) && ok;
    ok = run_norm_case<float>(DType::f32, 12544, true) && ok;
  }
  std::printf("%s\n", ok ? "every variant gives the library's bytes" : "SOME VARIANTS DIFFER");
  return ok ? 0 : 1;
}
