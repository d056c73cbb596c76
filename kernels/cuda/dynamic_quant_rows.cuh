// The row (token) kernels of dynamic-range quantization, and the pieces
// they are built from: kernels/cuda/dynamic_quant.cu launches them, and
// dev/cuda/dynamic_quant_token.cu builds its experimental variants from the
// same pieces (so both quantize with the same formulas, bit for bit).
//
// rows_reg_kernel (rows of up to 512 * ITEMS 16-byte vectors, the common
// case): a group of G threads (a power of two, 32..512) owns one row; a
// block holds 256 / G groups for short rows. Every thread issues all of its
// ITEMS loads before the first use (zero-filled past the row end: a zero
// changes no qparams, which widen the range to include 0 anyway), so a
// warp has ITEMS 16-byte loads in flight; the group reduces min/max (warp
// shuffle, then one shared-memory stage behind a single barrier, double
// buffered by row parity), then quantizes its registers and stores packed
// words (float math: formulas::quantize_byte, no float-to-int conversion;
// symmetric 16-bit rows reduce |v| in integers, two values an instruction).
//
// rows_kernel (the fallback for longer rows): one block per row
// (grid-stride), up to kItems vectors cached per thread, the remainder
// re-read. Each of its loads sits in its own `if (v < nvec)` branch with
// the range update that consumes it, so a warp has one 16-byte load in
// flight at a time (measured 1880 GB/s, 62% of copy, on an H100 for f32
// D 8192; rows_reg_kernel is faster: docs/benchmarks.md).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/formulas/qlinear.h"

namespace qgrad::kernels::cuda::rows {

using formulas::QParams;
using formulas::quant_math_t;
using formulas::Range;

constexpr int kItems = 8;

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
__global__ void __launch_bounds__(256)
    rows_kernel(const X* __restrict__ x, std::int64_t rows, std::int64_t D, Q* __restrict__ q, std::int64_t ldq,
                quant_math_t<X>* __restrict__ scale, std::int32_t* __restrict__ zp, bool symmetric, int qmin,
                int qmax) {
  ::qgrad::cuda::wait_for_prior_kernels();
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

// Threads a row (G, a power of two >= 32) and rows a block (rb) for a row
// of nvec vectors held ITEMS a thread.
struct RowGroupShape {
  unsigned G = 32, rb = 8;
};
inline RowGroupShape row_group_shape(std::int64_t nvec, int items) {
  RowGroupShape s;
  while (static_cast<std::int64_t>(s.G) * items < nvec) s.G <<= 1;
  s.rb = s.G >= 256 ? 1 : 256 / s.G;
  return s;
}

// The thread's place in a launch of blockDim (G, rb): thread tx of the
// group of block row ty; the group's warps are w0 .. w0 + gw - 1 of the
// block; row r is the group's first row, r0 the block's (every group runs
// the block's iterations, for the barriers), step the grid's rows an
// iteration.
struct RowGroup {
  int G, tx, lane, gw, w0;
  std::int64_t r, r0, step;
};
__device__ __forceinline__ RowGroup row_group() {
  RowGroup g;
  g.G = static_cast<int>(blockDim.x);
  g.tx = static_cast<int>(threadIdx.x);
  g.lane = g.tx & 31;
  g.gw = g.G >> 5;
  g.w0 = static_cast<int>(threadIdx.y) * g.gw;
  g.step = static_cast<std::int64_t>(gridDim.x) * blockDim.y;
  g.r0 = static_cast<std::int64_t>(blockIdx.x) * blockDim.y;
  g.r = g.r0 + threadIdx.y;
  return g;
}

// f16 bits to float by the hardware conversion: exact for every finite
// value (subnormals included), as half_bits_to_float; NaN and inf leave the
// range and quantize to qmin / the ends either way.
__device__ __forceinline__ float f16_bits_to_float(unsigned short bits) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
  return f;
}

// One vector of a row (VEC elements of X, 16 bytes or one element) held as
// it was loaded. 16-bit X stays in its four 32-bit words and is unpacked
// element by element where used, so a thread's ITEMS loads all issue before
// the first unpack waits on one: held as Pack<bfloat16, 8>, each vector was
// split into eight registers as it arrived, each load waited for the one
// before, and bf16 rows quantized at 1.4 TB/s (docs/benchmarks.md,
// thirtieth session). 32- and 64-bit X stay a Pack (their registers are the
// words themselves).
template <class X, int VEC>
struct Vec {
  using M = quant_math_t<X>;
  static constexpr bool kWords = sizeof(X) == 2 && VEC * sizeof(X) == 16;
  using Raw = std::conditional_t<kWords, uint4, Pack<X, VEC>>;
  Raw raw;
  __device__ __forceinline__ M get(int e) const {
    if constexpr (!kWords) {
      return M(raw.v[e]);
    } else {
      const unsigned word = (&raw.x)[e / 2];
      if constexpr (std::is_same_v<X, bfloat16>) {
        return __uint_as_float(e % 2 ? word & 0xffff0000u : word << 16);  // exact: bf16 is binary32's top half
      } else {
        static_assert(std::is_same_v<X, half>);
        return f16_bits_to_float(static_cast<unsigned short>(e % 2 ? word >> 16 : word & 0xffffu));
      }
    }
  }
};

// Loads the group's share of row xr (zero-filled past the row end, and
// for an invalid row).
template <int ITEMS, class V>
__device__ __forceinline__ void load_row(V (&c)[ITEMS], const V* __restrict__ xr, bool valid, int nvec, int tx,
                                         int G) {
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int v = it * G + tx;
    if (valid && v < nvec) c[it] = xr[v];
    else c[it] = V{};
  }
}

// min/max over the registers of a row.
template <class M, int ITEMS, class X, int VEC>
__device__ __forceinline__ Range<M> register_range(const Vec<X, VEC> (&c)[ITEMS]) {
  Range<M> range = Range<M>::empty();
#pragma unroll
  for (int it = 0; it < ITEMS; ++it)
#pragma unroll
    for (int e = 0; e < VEC; ++e) range.add(c[it].get(e));
  return range;
}

// The group's range: warp shuffles, then (groups of several warps) one
// shared-memory stage, double buffered by `parity`.
template <class M>
__device__ __forceinline__ Range<M> group_reduce(Range<M> range, Range<M> (&sh)[2][16], int& parity,
                                                 const RowGroup& g) {
  range = warp_reduce(range);
  if (g.gw > 1) {
    if (g.lane == 0) sh[parity][g.w0 + (g.tx >> 5)] = range;
    __syncthreads();
    range = sh[parity][g.w0];
    for (int w = 1; w < g.gw; ++w) range.merge(sh[parity][g.w0 + w]);
    parity ^= 1;
  }
  return range;
}

// Signed 16-bit lane-wise max of two words (one instruction on sm_90).
__device__ __forceinline__ unsigned max_s16x2(unsigned a, unsigned b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned d;
  asm("max.s16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return __vmaxs2(a, b);
#endif
}

// Symmetric qparams need only max |v| over the finite values: the range
// {-m, m} gives qparams_from_range the same amax (hence the same bits) as the
// row's true min/max. 16-bit rows held as words reduce two values an
// instruction in integers: |v|'s bits (sign cleared) order as the values do,
// and adding kBias to them keeps every finite value below 0x8000 while inf
// and NaN reach 0x8000 and above, negative as s16, so a signed max passes
// them over (bf16: largest finite 0x7F7F, inf 0x7F80, bias 0x80; f16:
// 0x7BFF, 0x7C00, 0x400). Exact, as max is.
template <class M, int ITEMS, class X, int VEC>
__device__ __forceinline__ Range<M> register_absmax(const Vec<X, VEC> (&c)[ITEMS]) {
  if constexpr (Vec<X, VEC>::kWords) {
    constexpr unsigned kBias = std::is_same_v<X, bfloat16> ? 0x0080u : 0x0400u;
    constexpr unsigned kBias2 = kBias * 0x10001u;
    unsigned m = kBias2;  // |v| = 0 in both lanes
#pragma unroll
    for (int it = 0; it < ITEMS; ++it)
#pragma unroll
      for (int w = 0; w < 4; ++w) m = max_s16x2(m, ((&c[it].raw.x)[w] & 0x7fff7fffu) + kBias2);
    const unsigned bits = max(m & 0xffffu, m >> 16) - kBias;
    const M a = std::is_same_v<X, bfloat16> ? __uint_as_float(bits << 16)
                                             : f16_bits_to_float(static_cast<unsigned short>(bits));
    return Range<M>{-a, a};
  } else {
    M m = M(0);
#pragma unroll
    for (int it = 0; it < ITEMS; ++it)
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const M a = fabs(c[it].get(e));
        m = a < std::numeric_limits<M>::infinity() && a > m ? a : m;  // NaN and inf compare false
      }
    return Range<M>{-m, m};
  }
}

// Row r's qparams, by the group's thread 0.
template <class M>
__device__ __forceinline__ void write_qparams(const QParams<M>& p, std::int64_t r, M* __restrict__ scale,
                                              std::int32_t* __restrict__ zp, const RowGroup& g) {
  if (g.tx == 0) {
    scale[r] = p.scale;
    if (zp) zp[r] = p.zero_point;
  }
}

// Writes row r's qparams and its quantized registers,
// quant(x, inv_scale, zero_point) each, then the pad columns [D, ldq).
template <class Q, int ITEMS, class X, int VEC, class M, class Quant>
__device__ __forceinline__ void store_row(const Vec<X, VEC> (&c)[ITEMS], const QParams<M>& p, std::int64_t r, std::int64_t D,
                                          int nvec, Q* __restrict__ q, std::int64_t ldq, M* __restrict__ scale,
                                          std::int32_t* __restrict__ zp, const RowGroup& g, Quant quant) {
  using QP = Pack<Q, VEC>;
  write_qparams(p, r, scale, zp, g);
  const M inv = formulas::inverse_scale<M>(p.scale);
  QP* qr = reinterpret_cast<QP*>(q + r * ldq);
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int v = it * g.G + g.tx;
    if (v < nvec) {
      QP out;
#pragma unroll
      for (int e = 0; e < VEC; ++e) out.v[e] = static_cast<Q>(quant(c[it].get(e), inv, p.zero_point));
      qr[v] = out;
    }
  }
  Q* qs = q + r * ldq;
  for (std::int64_t j = D + g.tx; j < ldq; j += g.G) qs[j] = Q(0);
}

// store_row for float math and 8-bit codes, by formulas::quantize_byte (no
// float-to-int conversion; the same codes as quantize_value), four codes
// packed into a word by byte permutes. kZeroPoint: the row's zero point is
// not 0 (decided once a row).
template <bool kZeroPoint, class Q, int ITEMS, class X, int VEC>
__device__ __forceinline__ void store_row_bytes(const Vec<X, VEC> (&c)[ITEMS], const QParams<float>& p,
                                                std::int64_t r, std::int64_t D, int nvec, Q* __restrict__ q,
                                                std::int64_t ldq, float* __restrict__ scale,
                                                std::int32_t* __restrict__ zp, const RowGroup& g, int qmin, int qmax) {
  static_assert(sizeof(Q) == 1 && (VEC == 1 || VEC % 4 == 0));
  write_qparams(p, r, scale, zp, g);
  const float inv = formulas::inverse_scale<float>(p.scale);
  const float lo = static_cast<float>(qmin - p.zero_point), hi = static_cast<float>(qmax - p.zero_point);
  const std::uint32_t z = static_cast<std::uint32_t>(p.zero_point);
  auto code = [&](float v) {
    const std::uint32_t b = formulas::quantize_byte(v, inv, lo, hi);
    return kZeroPoint ? b + z : b;
  };
  Q* qr = q + r * ldq;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int v = it * g.G + g.tx;
    if (v < nvec) {
      if constexpr (VEC == 1) {
        qr[v] = static_cast<Q>(code(c[it].get(0)));
      } else {
        Pack<std::uint32_t, VEC / 4> out;
#pragma unroll
        for (int w = 0; w < VEC / 4; ++w) {
          const std::uint32_t lo2 = __byte_perm(code(c[it].get(4 * w)), code(c[it].get(4 * w + 1)), 0x0040);
          const std::uint32_t hi2 = __byte_perm(code(c[it].get(4 * w + 2)), code(c[it].get(4 * w + 3)), 0x0040);
          out.v[w] = __byte_perm(lo2, hi2, 0x5410);
        }
        reinterpret_cast<Pack<std::uint32_t, VEC / 4>*>(qr)[v] = out;
      }
    }
  }
  for (std::int64_t j = D + g.tx; j < ldq; j += g.G) qr[j] = Q(0);
}

// The library's row kernel (launched with blockDim (G, rb) from
// row_group_shape(nvec, ITEMS)).
template <class X, class Q, int VEC, int ITEMS>
__global__ void __launch_bounds__(512)
    rows_reg_kernel(const X* __restrict__ x, std::int64_t rows, std::int64_t D, Q* __restrict__ q, std::int64_t ldq,
                    quant_math_t<X>* __restrict__ scale, std::int32_t* __restrict__ zp, bool symmetric, int qmin,
                    int qmax) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = quant_math_t<X>;
  using XV = Vec<X, VEC>;
  __shared__ Range<M> sh[2][16];  // [row parity][warp of the block]
  RowGroup g = row_group();
  const int nvec = static_cast<int>(D / VEC);
  XV cur[ITEMS];
  load_row<ITEMS>(cur, reinterpret_cast<const XV*>(x + g.r * D), g.r < rows, nvec, g.tx, g.G);
  int parity = 0;
  for (; g.r0 < rows; g.r0 += g.step, g.r += g.step) {
    const Range<M> mine = symmetric ? register_absmax<M>(cur) : register_range<M>(cur);
    const Range<M> range = group_reduce(mine, sh, parity, g);
    const QParams<M> p = formulas::qparams_from_range<M>(range, symmetric, qmin, qmax);
    if (g.r < rows) {
      if constexpr (std::is_same_v<M, float>) {
        if (p.zero_point == 0) store_row_bytes<false>(cur, p, g.r, D, nvec, q, ldq, scale, zp, g, qmin, qmax);
        else store_row_bytes<true>(cur, p, g.r, D, nvec, q, ldq, scale, zp, g, qmin, qmax);
      } else {
        auto quant = [=](M v, M inv, int z) { return formulas::quantize_value<M>(v, inv, z, qmin, qmax); };
        store_row<Q>(cur, p, g.r, D, nvec, q, ldq, scale, zp, g, quant);
      }
    }
    if (g.r0 + g.step < rows)
      load_row<ITEMS>(cur, reinterpret_cast<const XV*>(x + (g.r + g.step) * D), g.r + g.step < rows, nvec, g.tx,
                      g.G);
  }
}

}  // namespace qgrad::kernels::cuda::rows
