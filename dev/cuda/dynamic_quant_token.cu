// dev/cuda/dynamic_quant_token.cu: the per-token dynamic-quantization row
// kernels the library's one was chosen from (llm.c style: every variant,
// its host reference check and its benchmark in one file; not part of the
// library). Built as the bench target dev_dynamic_quant_token when CUDA is
// on; run on the GPU machine:
//
//   build/dev/dev_dynamic_quant_token            check every variant, then time them
//
// Variants (all give the same bits; the library launches variant 1, and
// variant 0 for rows longer than 512 * 8 vectors):
//   0  rows::rows_kernel: one block a row, one 16-byte load in flight a warp
//   1  rows::rows_reg_kernel, ITEMS 8: a group of G threads a row, all loads issued first
//   2  as 1, ITEMS 4 (f32 D 8192: 512 threads a row)
//   3  as 1, persistent grid, next row prefetched into a second register set
//      (16-bit inputs hold 4 vectors a set: 8 spill)
//   4  as 2, persistent grid, next row prefetched
//   5  as 1, LEAN: symmetric abs-max reduction, branch-free quantize clamp
//   6  as 3, LEAN
// (Since the thirtieth session the library's kernel, variant 1, also takes
// the abs-max reduction for symmetric rows, and quantize_value is
// branch-free: 1 and 5 differ only in the clamp's instructions.)
// Measured on an H100 (docs/benchmarks.md, f32 16384 x 8192): variant 1 the
// fastest or within noise of the fastest; 0 at 62% of copy bandwidth.
//
// Output: one line per check, then JSON lines
// {"bench":"dev_dynamic_quant_token","case":"dynquant_token_<N>x<D>","impl":"v<i>",...}
// in the format of bench_w8a8's rows (scripts/bench_table.py reads them).
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../../bench/bench_common.h"
#include "qgrad/kernels/cuda/dynamic_quant_rows.cuh"

using namespace qgrad;
using namespace qgrad::kernels::cuda;
using formulas::QParams;
using formulas::quant_math_t;
using formulas::Range;

namespace {

constexpr int kVariants = 7;

struct Spec {
  bool symmetric;
  int qmin, qmax;
};

// ---- LEAN (variants 5, 6): fewer instructions per element, same bits ----
// Symmetric reduction: only max |x| over finite x matters (qparams use
// max(-min(lo, 0), max(hi, 0)), which is exactly that), so it tracks one
// abs-max (2 instructions an element instead of 7) and hands the exact
// Range {-m, m} to qparams_from_range. Quantize: formulas::quantize_value
// compiles to compare-and-branch; the min/max clamp below returns the same
// int for every input (NaN: fmax drops it -> qmin; +-inf -> qmax / qmin;
// in range r is integral, so the conversion is exact either way).
__device__ __forceinline__ float fmax_nn(float a, float b) { return fmaxf(a, b); }  // NaN-dropping max / min
__device__ __forceinline__ double fmax_nn(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float fmin_nn(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double fmin_nn(double a, double b) { return fmin(a, b); }

template <class M>
__device__ __forceinline__ int quantize_lean(M x, M inv_scale, int zero_point, int qmin, int qmax) {
  const M r = formulas::round_even(x * inv_scale) + M(zero_point);
  return static_cast<int>(fmin_nn(fmax_nn(r, M(qmin)), M(qmax)));  // fmax(NaN, qmin) = qmin
}

// Variants 3..6: rows_reg_kernel with a persistent grid (PERSIST: the next
// row loads into `nxt` before the current one is reduced) and / or LEAN.
template <class X, class Q, int VEC, int ITEMS, bool PERSIST, bool LEAN>
__global__ void __launch_bounds__(512)
    rows_reg_x_kernel(const X* __restrict__ x, std::int64_t nrows, std::int64_t D, Q* __restrict__ q,
                      std::int64_t ldq, quant_math_t<X>* __restrict__ scale, std::int32_t* __restrict__ zp,
                      bool symmetric, int qmin, int qmax) {
  using M = quant_math_t<X>;
  using XV = rows::Vec<X, VEC>;
  __shared__ Range<M> sh[2][16];
  rows::RowGroup g = rows::row_group();
  const int nvec = static_cast<int>(D / VEC);
  auto quant = [=](M v, M inv, int z) {
    return LEAN ? quantize_lean<M>(v, inv, z, qmin, qmax) : formulas::quantize_value<M>(v, inv, z, qmin, qmax);
  };
  auto row = [&](std::int64_t r) { return reinterpret_cast<const XV*>(x + r * D); };
  XV cur[ITEMS];
  rows::load_row<ITEMS>(cur, row(g.r), g.r < nrows, nvec, g.tx, g.G);
  int parity = 0;
  for (; g.r0 < nrows; g.r0 += g.step, g.r += g.step) {
    XV nxt[ITEMS];
    if constexpr (PERSIST) rows::load_row<ITEMS>(nxt, row(g.r + g.step), g.r + g.step < nrows, nvec, g.tx, g.G);
    const Range<M> mine = LEAN && symmetric ? rows::register_absmax<M>(cur) : rows::register_range<M>(cur);
    const QParams<M> p = formulas::qparams_from_range<M>(rows::group_reduce(mine, sh, parity, g), symmetric, qmin,
                                                         qmax);
    if (g.r < nrows) rows::store_row<Q>(cur, p, g.r, D, nvec, q, ldq, scale, zp, g, quant);
    if constexpr (PERSIST) {
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) cur[it] = nxt[it];
    } else if (g.r0 + g.step < nrows) {
      rows::load_row<ITEMS>(cur, row(g.r + g.step), g.r + g.step < nrows, nvec, g.tx, g.G);
    }
  }
}

// Launches a register-resident variant; false (nothing launched) when the
// row does not fit 512 * ITEMS vectors.
template <class X, class Q, int VEC, int ITEMS_ASKED, bool PERSIST, bool LEAN>
bool launch_reg(const X* xp, std::int64_t nrows, std::int64_t D, Q* qp, std::int64_t ldq, quant_math_t<X>* sp,
                std::int32_t* zp, const Spec& spec) {
  constexpr int ITEMS = PERSIST && sizeof(X) == 2 && ITEMS_ASKED > 4 ? 4 : ITEMS_ASKED;
  const std::int64_t nvec = D / VEC;
  if (nvec > 512 * ITEMS) return false;
  const rows::RowGroupShape s = rows::row_group_shape(nvec, ITEMS);
  std::int64_t blocks = (nrows + s.rb - 1) / s.rb;
  cudaStream_t stream = qgrad::cuda::stream(0);
  if constexpr (!PERSIST && !LEAN) {
    rows::rows_reg_kernel<X, Q, VEC, ITEMS><<<static_cast<unsigned>(std::min<std::int64_t>(blocks, INT_MAX)),
                                             dim3(s.G, s.rb), 0, stream>>>(xp, nrows, D, qp, ldq, sp, zp,
                                                                           spec.symmetric, spec.qmin, spec.qmax);
  } else {
    auto kernel = rows_reg_x_kernel<X, Q, VEC, ITEMS, PERSIST, LEAN>;
    if constexpr (PERSIST) {  // grid = resident blocks
      int per_sm = 0, sms = 0;
      QGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(s.G * s.rb), 0));
      QGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      blocks = std::min<std::int64_t>(blocks, static_cast<std::int64_t>(sms) * std::max(per_sm, 1));
    }
    kernel<<<static_cast<unsigned>(std::min<std::int64_t>(blocks, INT_MAX)), dim3(s.G, s.rb), 0, stream>>>(
        xp, nrows, D, qp, ldq, sp, zp, spec.symmetric, spec.qmin, spec.qmax);
  }
  QGRAD_CUDA_CHECK(cudaGetLastError());
  return true;
}

// Variant v on device pointers; rows too long for it take variant 0.
template <class X, class Q, int VEC>
void launch_variant(int v, const X* xp, std::int64_t nrows, std::int64_t D, Q* qp, std::int64_t ldq,
                    quant_math_t<X>* sp, std::int32_t* zp, const Spec& spec) {
  bool done = false;
  switch (v) {
    case 1: done = launch_reg<X, Q, VEC, 8, false, false>(xp, nrows, D, qp, ldq, sp, zp, spec); break;
    case 2: done = launch_reg<X, Q, VEC, 4, false, false>(xp, nrows, D, qp, ldq, sp, zp, spec); break;
    case 3: done = launch_reg<X, Q, VEC, 8, true, false>(xp, nrows, D, qp, ldq, sp, zp, spec); break;
    case 4: done = launch_reg<X, Q, VEC, 4, true, false>(xp, nrows, D, qp, ldq, sp, zp, spec); break;
    case 5: done = launch_reg<X, Q, VEC, 8, false, true>(xp, nrows, D, qp, ldq, sp, zp, spec); break;
    case 6: done = launch_reg<X, Q, VEC, 8, true, true>(xp, nrows, D, qp, ldq, sp, zp, spec); break;
    default: break;
  }
  if (done) return;
  unsigned threads = 32;
  while (threads < 256 && static_cast<std::int64_t>(threads) * rows::kItems < D / VEC) threads <<= 1;
  rows::rows_kernel<X, Q, VEC><<<static_cast<unsigned>(std::min<std::int64_t>(nrows, INT_MAX)), threads, 0,
                                 qgrad::cuda::stream(0)>>>(xp, nrows, D, qp, ldq, sp, zp, spec.symmetric, spec.qmin,
                                                           spec.qmax);
  QGRAD_CUDA_CHECK(cudaGetLastError());
}

// The device buffers of one problem: x [nrows, D] -> q [nrows, ldq], scale, zp [nrows].
struct Problem {
  std::int64_t nrows, D, ldq;
  Tensor x, q, scale, zp;
};

template <class X, class Q>
void run_variant(int v, Problem& p, const Spec& spec) {
  constexpr int V = 16 / sizeof(X);
  const X* xp = static_cast<const X*>(p.x.data_ptr());
  Q* qp = static_cast<Q*>(p.q.data_ptr());
  auto* sp = static_cast<quant_math_t<X>*>(p.scale.data_ptr());
  auto* zp = static_cast<std::int32_t*>(p.zp.data_ptr());
  if (p.D % V == 0 && p.ldq % V == 0) launch_variant<X, Q, V>(v, xp, p.nrows, p.D, qp, p.ldq, sp, zp, spec);
  else launch_variant<X, Q, 1>(v, xp, p.nrows, p.D, qp, p.ldq, sp, zp, spec);
}

// Host reference: per row the range of the finite values, the qparams and
// the quantized values (pad columns 0), from the scalar formulas.
template <class X, class Q>
bool check_against_host(Problem& p, const Spec& spec) {
  using M = quant_math_t<X>;
  const std::vector<X> x = p.x.cpu().to_vector<X>();
  const std::vector<Q> q = p.q.cpu().to_vector<Q>();
  const std::vector<M> s = p.scale.cpu().to_vector<M>();
  const std::vector<std::int32_t> z = p.zp.cpu().to_vector<std::int32_t>();
  for (std::int64_t r = 0; r < p.nrows; ++r) {
    Range<M> range = Range<M>::empty();
    for (std::int64_t j = 0; j < p.D; ++j) range.add(M(x[static_cast<std::size_t>(r * p.D + j)]));
    const QParams<M> want = formulas::qparams_from_range<M>(range, spec.symmetric, spec.qmin, spec.qmax);
    const auto ri = static_cast<std::size_t>(r);
    if (std::memcmp(&want.scale, &s[ri], sizeof(M)) != 0 || want.zero_point != z[ri]) return false;
    const M inv = formulas::inverse_scale<M>(want.scale);
    for (std::int64_t j = 0; j < p.ldq; ++j) {
      const int w = j < p.D ? formulas::quantize_value<M>(M(x[static_cast<std::size_t>(r * p.D + j)]), inv,
                                                          want.zero_point, spec.qmin, spec.qmax)
                            : 0;
      if (static_cast<int>(q[static_cast<std::size_t>(r * p.ldq + j)]) != w) return false;
    }
  }
  return true;
}

template <class X, class Q>
Problem make_problem(std::int64_t nrows, std::int64_t D, std::int64_t ldq, std::uint64_t seed) {
  Generator g(seed);
  Tensor xf = randn({nrows, D}, g, TensorOptions{}, 0.5, 3.0);
  float* v = xf.data<float>();
  if (nrows > 1) {  // specials in row 0, an all-zero last row
    for (std::int64_t j = 0; j < D; ++j) v[(nrows - 1) * D + j] = 0.0f;
    v[0] = INFINITY;
    if (D > 2) {
      v[1] = -INFINITY;
      v[2] = NAN;
    }
  }
  const TensorOptions on = TensorOptions{}.with_device(Device::cuda());
  return {nrows,
          D,
          ldq,
          xf.to(dtype_of<X>).cuda(),
          Tensor::empty({nrows, ldq}, TensorOptions(on).with_dtype(dtype_of<Q>)),
          Tensor::empty({nrows}, TensorOptions(on).with_dtype(dtype_of<quant_math_t<X>>)),
          Tensor::empty({nrows}, TensorOptions(on).with_dtype(DType::s32))};
}

// Every variant against the host reference on shapes from one column to
// rows longer than any register-resident variant holds; returns failures.
template <class X>
int check_all(const char* dtype) {
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{70000, 1}, {5, 7},     {33, 64},  {257, 1000},
                                                          {65, 8192}, {3, 8193}, {2, 16384}, {1000, 24}};
  int failures = 0;
  for (auto [nrows, D] : shapes) {
    for (const Spec spec : {Spec{true, -128, 127}, Spec{false, 0, 255}}) {
      for (std::int64_t ldq : {D, (D + 15) / 16 * 16 + 16}) {
        for (int v = 0; v < kVariants; ++v) {
          bool ok = false;
          if (spec.qmin < 0) {
            Problem p = make_problem<X, std::int8_t>(nrows, D, ldq, static_cast<std::uint64_t>(nrows * 131 + D));
            run_variant<X, std::int8_t>(v, p, spec);
            ok = check_against_host<X, std::int8_t>(p, spec);
          } else {
            Problem p = make_problem<X, std::uint8_t>(nrows, D, ldq, static_cast<std::uint64_t>(nrows * 131 + D));
            run_variant<X, std::uint8_t>(v, p, spec);
            ok = check_against_host<X, std::uint8_t>(p, spec);
          }
          if (!ok) {
            ++failures;
            std::printf("MISMATCH %s rows %lld D %lld ldq %lld %s variant %d\n", dtype, static_cast<long long>(nrows),
                        static_cast<long long>(D), static_cast<long long>(ldq),
                        spec.symmetric ? "symmetric s8" : "asymmetric u8", v);
          }
        }
      }
    }
  }
  return failures;
}

void bench_variants(std::int64_t N, std::int64_t D, double copy_gbs) {
  Problem p = make_problem<float, std::int8_t>(N, D, D, 1);
  const Spec spec{true, -128, 127};
  const double bytes = static_cast<double>(N * D) * (4 + 1) + static_cast<double>(N) * 8;
  auto emit_row = [&](const std::string& impl, const bench::Timing& t) {
    const double gbs = bytes / (t.median_ms * 1e-3) / 1e9;
    char line[512];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"dev_dynamic_quant_token\",\"case\":\"dynquant_token_%lldx%lld\",\"impl\":\"%s\","
                  "\"ms\":%.4f,\"min_ms\":%.4f,\"gbs\":%.1f,\"copy_gbs\":%.1f,\"copy_fraction\":%.3f}",
                  static_cast<long long>(N), static_cast<long long>(D), impl.c_str(), t.median_ms, t.min_ms, gbs,
                  copy_gbs, gbs / copy_gbs);
    bench::emit(line);
  };
  for (int v = 0; v < kVariants; ++v)
    emit_row("qgrad_v" + std::to_string(v),
             bench::time_cuda([&](int) { run_variant<float, std::int8_t>(v, p, spec); }, 30, 3));
  emit_row("qgrad", bench::time_cuda([&](int) { (void)dynamic_range_quantize(p.x, QuantScope::per_token()); }, 30, 3));
}

}  // namespace

int main() {
  if (!cuda_available()) {
    std::printf("dev_dynamic_quant_token: no CUDA device\n");
    return 0;
  }
  const int failures = check_all<float>("f32") + check_all<double>("f64") + check_all<half>("f16") +
                       check_all<bfloat16>("bf16");
  std::printf("dev_dynamic_quant_token: %d variants checked against the host reference: %d mismatches\n", kVariants,
              failures);
  if (failures != 0) return 1;
  bench_variants(16384, 8192, bench::copy_bandwidth_gbs(std::size_t(1) << 30));
  return 0;
}
