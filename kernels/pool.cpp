// The 2-d poolings, one source for both devices (kernels/loop.h). Forward:
// one index per output, scanning its window in row-major order. Backward:
// one index per input element, gathering from the outputs whose window holds
// it in increasing (oh, ow) order, in op math; no atomics, so CPU and CUDA
// give the same bits. (Max pooling over windows that tile the input: one
// index per window, writing the values the gather would.)
#include "qgrad/kernels/pool.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "qgrad/kernels/cpu/fake_quant_run.h"
#include "qgrad/kernels/formulas/batch_norm.h"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/kernels/loop.h"
#include "qgrad/kernels/reduce.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels {

namespace {

using formulas::min_i64;

// The index arithmetic of the pooling bodies: an element's (plane, row,
// column) and the divisions by the strides. When every operand fits in 31
// bits (small_indices) they take FastDiv's multiply and shift (kernels/layout.h)
// instead of a hardware 64-bit division (on CUDA a long software routine);
// the results are the same integers either way.
struct PlaneDivs {
  bool small = false;
  std::int64_t rows = 1, cols = 1;  // the plane's (ih, iw) or (oh, ow)
  FastDiv by_plane, by_cols;
  PlaneDivs() = default;
  PlaneDivs(std::int64_t rows_, std::int64_t cols_, bool small_) : small(small_), rows(rows_), cols(cols_) {
    if (small) {
      by_plane = FastDiv(static_cast<std::uint32_t>(rows * cols));
      by_cols = FastDiv(static_cast<std::uint32_t>(cols));
    }
  }
  struct At {
    std::int64_t plane, r, row, col;  // r = row * cols + col
  };
  QGRAD_HD At at(std::int64_t i) const {
    const std::int64_t per_plane = rows * cols;
    std::int64_t plane, row;
    if (small) plane = by_plane.div(static_cast<std::uint32_t>(i));
    else plane = i / per_plane;
    const std::int64_t r = i - plane * per_plane;
    if (small) row = by_cols.div(static_cast<std::uint32_t>(r));
    else row = r / cols;
    return {plane, r, row, r - row * cols};
  }
};

struct StrideDivs {
  bool small = false;
  std::int64_t s = 1;
  FastDiv by_s;
  StrideDivs() = default;
  StrideDivs(std::int64_t s_, bool small_) : small(small_), s(s_) {
    if (small) by_s = FastDiv(static_cast<std::uint32_t>(s));
  }
  QGRAD_HD std::int64_t div(std::int64_t n) const {  // n >= 0
    return small ? static_cast<std::int64_t>(by_s.div(static_cast<std::uint32_t>(n))) : n / s;
  }
};

// Every index of a pooling between x and y fits in 31 bits (with room for
// the ceil divisions' s - 1).
bool small_indices(const Pool2dGeometry& g) {
  constexpr std::int64_t kLim = std::int64_t(1) << 30;
  return g.planes * g.ih * g.iw < kLim && g.planes * g.oh * g.ow < kLim && g.ih + g.ph < kLim &&
         g.iw + g.pw < kLim && g.sh < kLim && g.sw < kLim;
}

// The divisions of one pooling: input and output planes, strides.
struct PoolDivs {
  PlaneDivs in, out;
  StrideDivs sh, sw;
  static PoolDivs of(const Pool2dGeometry& g) {
    const bool small = small_indices(g);
    return {PlaneDivs(g.ih, g.iw, small), PlaneDivs(g.oh, g.ow, small), StrideDivs(g.sh, small),
            StrideDivs(g.sw, small)};
  }
};

// The scan of a max-pooling window: the largest value(r) over the window of
// output `a` in row-major order (NaN wins, ties keep the first), r the
// element's flat index in its plane; returns r, the value in `best`.
template <class M, class Value>
QGRAD_HD std::int64_t window_argmax(const PlaneDivs::At& a, const Pool2dGeometry& g, Value value, M& best) {
  const formulas::Span hs = formulas::max_pool_span(a.row, g.ih, g.kh, g.sh, g.ph, g.dh);
  const formulas::Span ws = formulas::max_pool_span(a.col, g.iw, g.kw, g.sw, g.pw, g.dw);
  best = formulas::pool_lowest<M>();
  std::int64_t arg = hs.lo * g.iw + ws.lo;
  for (std::int64_t h = hs.lo; h < hs.hi; h += g.dh)
    for (std::int64_t w = ws.lo; w < ws.hi; w += g.dw) {
      const M v = value(h * g.iw + w);
      if (v > best || formulas::pool_is_nan(v)) {
        best = v;
        arg = h * g.iw + w;
      }
    }
  return arg;
}

template <class T>
struct MaxPoolForward {
  const T* x;
  T* y;
  std::int64_t* idx;  // null: values only
  Pool2dGeometry g;
  PoolDivs dv;
  QGRAD_HD void operator()(std::int64_t o) const {
    using M = op_math_t<T>;
    const PlaneDivs::At a = dv.out.at(o);
    const T* p = x + a.plane * g.ih * g.iw;
    M best;
    const std::int64_t arg = window_argmax(a, g, [p](std::int64_t r) { return M(p[r]); }, best);
    y[o] = T(best);
    if (idx) idx[o] = arg;
  }
};

// The values a fused pooling scans: x's own (Plain), or relu(batch_norm(x))
// recomputed where read (BatchNormRelu; planes indexed as [N, C, 1]).
// at(c): the read of channel c's elements, its parameters loaded once; the
// read takes a Division (formulas/division.h) for batch norm's unscaling.
template <class T>
struct PlainRead {
  static constexpr bool kEvery = false;
  struct At {
    QGRAD_HD bool fast() const { return true; }
    template <class Division = formulas::ExactDivision>
    QGRAD_HD T operator()(T v, Division&& = {}) const {
      return v;
    }
  };
  QGRAD_HD std::int64_t channel(std::int64_t) const { return 0; }
  QGRAD_HD At at(std::int64_t) const { return {}; }
};
// kEvery: divisor, shift, weight and bias all given (the Conv-BN-ReLU
// blocks' case), known at compile time: the read without a test of each
// per element (kept in registers as bytes, ~8 instructions an element on CUDA).
template <class T, bool kEvery_ = false>
struct BatchNormReluRead {
  static constexpr bool kEvery = kEvery_;
  formulas::Unscale<T> in;
  formulas::Normalize<T> norm;
  ChannelIndexer planes;
  struct At {
    typename formulas::Unscale<T>::At in;
    typename formulas::Normalize<T>::At norm;
    QGRAD_HD bool fast() const { return in.fast(); }  // formulas::with_shared_division
    template <class Division = formulas::ExactDivision>
    QGRAD_HD T operator()(T v, Division&& division = {}) const {
      if constexpr (kEvery) {
        return formulas::normalize_relu<T>(norm.every(), in.every()(v, division));
      } else {
        return formulas::normalize_relu<T>(norm, in(v, division));
      }
    }
  };
  QGRAD_HD std::int64_t channel(std::int64_t plane) const { return planes.channel(plane); }
  QGRAD_HD At at(std::int64_t c) const { return {in.shared(c), norm.at(c)}; }
};

// 2 x 2 windows of stride 2 that tile the input (windows_tile_input, no
// dilation): the four flat indices r of output a's window in its plane, in
// row-major order.
bool windows_tile_2x2(const Pool2dGeometry& g) {
  return windows_tile_input(g) && g.kh == 2 && g.kw == 2 && g.dh == 1 && g.dw == 1;
}
QGRAD_HD void window_2x2(const PlaneDivs::At& a, std::int64_t iw, std::int64_t (&r)[4]) {
  r[0] = 2 * (a.row * iw + a.col);
  r[1] = r[0] + 1;
  r[2] = r[0] + iw;
  r[3] = r[0] + iw + 1;
}

// Two adjacent elements stored as one (2 x T aligned at p: on CUDA one
// store instruction instead of two, whole 8-byte pairs for f32).
template <class T>
bool pair_aligned(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (2 * sizeof(T)) == 0;
}
template <class T>
QGRAD_HD void store_pair(T* p, T a, T b) {
#if defined(__CUDA_ARCH__)
  struct alignas(2 * sizeof(T)) Pair {
    T a, b;
  };
  *reinterpret_cast<Pair*>(p) = Pair{a, b};
#else
  p[0] = a;
  p[1] = b;
#endif
}

// Four adjacent elements loaded as one (Vec4<T> aligned at p: on CUDA one
// 16-byte load for f32).
template <class T>
QGRAD_HD void load_four(const T* p, T (&v)[4]) {
#if defined(__CUDA_ARCH__)
  const Vec4<T> q = *reinterpret_cast<const Vec4<T>*>(p);
  QGRAD_UNROLL
  for (int k = 0; k < 4; ++k) v[k] = q.v[k];
#else
  for (int k = 0; k < 4; ++k) v[k] = p[k];
#endif
}

// max_pool2d of fake_quantize_per_tensor(read(x)): the window scan over the
// fake quantized values (formulas::FakeQuantOp, computed where read, never
// stored), y its max, code[o] the argmax's flat index r in the plane, or
// -1 - r where the argmax's fake-quant mask bit is 0.
// Tiling (kTiled2 and what it allows):
// - kGeneral: any geometry, window_argmax's scan.
// - kSingle: 2 x 2 windows of stride 2 that tile the input
//   (windows_tile_input, no dilation): the window's four elements read at
//   fixed offsets and scanned unrolled, in window_argmax's order with its
//   rule (the general scan's span arithmetic and loops were most of the
//   kernel's instructions).
// - kPairs (ow even, x aligned to 4 x T, y and code to 2): one index per pair
//   of outputs (2i, 2i + 1), a row's neighbours: their windows' two input
//   rows loaded four elements at a time, the index arithmetic and the
//   channel's parameters once for both, y and code stored in pairs.
// (Runs of up to 8 outputs of a row an index, the setup shared by more,
// measured slower on the H200: +6 to +30 us a CNN step, fewer threads to
// hide the loads' latency; docs/benchmarks.md, sixtieth session.)
enum class PoolTiling { kGeneral, kSingle, kPairs };

template <class T, class Read = PlainRead<T>, PoolTiling kTiling = PoolTiling::kGeneral>
struct FakeQuantMaxPoolForward {
  static constexpr bool kTiled2 = kTiling != PoolTiling::kGeneral;
  const T* x;
  T* y;
  std::int32_t* code;
  Pool2dGeometry g;
  PoolDivs dv;
  formulas::ParamSource src;
  std::int64_t qmin, qmax;
  Read read = {};

  // Outputs an index (the launch covers y.numel() / this).
  QGRAD_HD static constexpr std::int64_t outputs_per_index() { return kTiling == PoolTiling::kPairs ? 2 : 1; }

  struct Pooled {
    T value;
    std::int32_t code;
  };
  // The scan of a 2 x 2 window: its values v at flat indices r. kExact:
  // the fake quant's float form (float_form_exact, decided once an index).
  template <bool kExact, class ReadAt, class Division>
  QGRAD_HD static Pooled scan_2x2(const T (&v)[4], const std::int64_t (&r)[4], const ReadAt& rd,
                                  const formulas::ChannelParams& prm, const formulas::FakeQuantOp<T, false>& fq,
                                  Division& division) {
    using M = op_math_t<T>;
    using FQ = formulas::FakeQuantOp<T, false>;
    // The argmax's index and bit carried as scalars (indexing arrays of
    // them by the argmax put them in local memory on CUDA). The first
    // element is taken as window_argmax's start is: its value is at least
    // pool_lowest (-inf), the value that scan starts from.
    M best = formulas::pool_lowest<M>();
    std::int64_t arg = r[0];
    bool arg_bit = false;
    QGRAD_UNROLL
    for (int k = 0; k < 4; ++k) {
      bool bit;
      const T read_value = rd(v[k], division);
      M f;
      if constexpr (kExact && FQ::kHasFloatForm) f = M(fq.float_form(read_value, prm, bit));
      else f = M(fq(read_value, prm, false, bit));
      if (k == 0 || f > best || formulas::pool_is_nan(f)) {
        best = f;
        arg = r[k];
        arg_bit = bit;
      }
    }
    return {T(best), static_cast<std::int32_t>(arg_bit ? arg : -1 - arg)};
  }

  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const std::int64_t o = i * outputs_per_index();
    const PlaneDivs::At a = dv.out.at(o);
    const T* p = x + a.plane * g.ih * g.iw;
    const auto rd = read.at(read.channel(a.plane));
    const formulas::ChannelParams prm = src.get(0);
    const formulas::FakeQuantOp<T, false> fq{qmin, qmax};
    if constexpr (kTiled2) {
      std::int64_t r[4];
      window_2x2(a, g.iw, r);
      // The float form where it is exact (every integer format): the same
      // values and bits without the general form's int64 conversions, four
      // an output here; decided here, not per element. Under one Division
      // (formulas::with_shared_division): where the fast quotients do not
      // apply, the index's outputs are computed again.
      const auto scan = [&](auto exact_form) {
        constexpr bool kExact = decltype(exact_form)::value;
        formulas::with_shared_division(rd.fast(), [&](auto& division) {
          if constexpr (kTiling == PoolTiling::kPairs) {
            T top[4], bottom[4];
            load_four(p + r[0], top);
            load_four(p + r[2], bottom);
            const std::int64_t r1[4] = {r[0] + 2, r[1] + 2, r[2] + 2, r[3] + 2};
            const T v0[4] = {top[0], top[1], bottom[0], bottom[1]};
            const T v1[4] = {top[2], top[3], bottom[2], bottom[3]};
            const Pooled w0 = scan_2x2<kExact>(v0, r, rd, prm, fq, division);
            const Pooled w1 = scan_2x2<kExact>(v1, r1, rd, prm, fq, division);
            store_pair(y + o, w0.value, w1.value);
            store_pair(code + o, w0.code, w1.code);
          } else {
            T v[4];
            QGRAD_UNROLL
            for (int k = 0; k < 4; ++k) v[k] = p[r[k]];
            const Pooled w = scan_2x2<kExact>(v, r, rd, prm, fq, division);
            y[o] = w.value;
            code[o] = w.code;
          }
        });
      };
      if (fq.float_form_exact(prm)) scan(std::true_type{});
      else scan(std::false_type{});
    } else {
      M best;
      const std::int64_t arg = window_argmax(
          a, g,
          [&](std::int64_t r) {
            bool bit;
            return M(fq(rd(p[r]), prm, false, bit));
          },
          best);
      bool bit;
      fq(rd(p[arg]), prm, false, bit);
      y[o] = T(best);
      code[o] = static_cast<std::int32_t>(bit ? arg : -1 - arg);
    }
  }
};

// read()'s values of n consecutive elements of channel c, for the CPU's
// runs below: PlainRead copies; BatchNormReluRead runs its formula in a
// loop specialised on which optional tensors it has (each an invariant the
// per-element formula tests; non-null ones promised so), over a __restrict
// output, so that the channel's parameters stay in registers and the loop
// vectorises: the same formula, the same bits.
void read_run(const PlainRead<float>&, const float* in, float* out, std::int64_t n, std::int64_t) {
  std::copy(in, in + n, out);
}

template <bool kDivisor, bool kShift, bool kWeight, bool kBias>
void bn_relu_run(const BatchNormReluRead<float>& rd, const float* in, float* __restrict out, std::int64_t n,
                 std::int64_t c) {
  const formulas::Unscale<float> unscale{kDivisor ? rd.in.divisor : nullptr, kShift ? rd.in.shift : nullptr};
  const formulas::Normalize<float> norm{rd.norm.mean, rd.norm.invstd, kWeight ? rd.norm.weight : nullptr,
                                        kBias ? rd.norm.bias : nullptr};
  if ((kDivisor && !unscale.divisor) || (kShift && !unscale.shift) || (kWeight && !norm.weight) ||
      (kBias && !norm.bias))
    __builtin_unreachable();
  const auto u = unscale.at(c);
  const auto nm = norm.at(c);
  for (std::int64_t j = 0; j < n; ++j) out[j] = formulas::normalize_relu<float>(nm, u(in[j]));
}

using BnReluRun = void (*)(const BatchNormReluRead<float>&, const float*, float*, std::int64_t, std::int64_t);
template <std::size_t... K>
constexpr std::array<BnReluRun, sizeof...(K)> bn_relu_runs(std::index_sequence<K...>) {
  return {&bn_relu_run<(K & 8) != 0, (K & 4) != 0, (K & 2) != 0, (K & 1) != 0>...};
}

void read_run(const BatchNormReluRead<float>& rd, const float* in, float* out, std::int64_t n, std::int64_t c) {
  static constexpr auto kRuns = bn_relu_runs(std::make_index_sequence<16>{});
  // A shift without a divisor is never read (formulas::Unscale).
  const bool divisor = rd.in.divisor != nullptr, shift = divisor && rd.in.shift != nullptr;
  kRuns[(divisor ? 8u : 0u) | (shift ? 4u : 0u) | (rd.norm.weight ? 2u : 0u) | (rd.norm.bias ? 1u : 0u)](rd, in, out,
                                                                                                         n, c);
}

// FakeQuantMaxPoolForward<float, Read, kSingle> on the CPU: a task per output
// row of a plane reads its two input rows in runs of 64 columns, turns them
// into read()'s values (the batch norm and relu where fused), fake-quantizes
// the run with the vector form (cpu::fake_quant_block_run_f32: the same
// values and bits as formulas::FakeQuantOp) and scans each 2 x 2 window in
// window_2x2's order with the per-output kernel's rule. The index arithmetic
// and the fake quant's scalar integer path per element were most of the CNN
// step's CPU time. Returns false (nothing written) where the fake quant's
// range is past the vector form's bound.
template <class Read>
bool fake_quantize_max_pool_2x2_f32_cpu(const float* x, float* y, std::int32_t* code, const Pool2dGeometry& g,
                                        const formulas::ChannelParams& prm, std::int64_t qmin, std::int64_t qmax,
                                        const Read& read) {
  constexpr std::int64_t kRun = kBitmaskBlock / 2;  // columns of one input row a block holds
  if (!cpu::fake_quant_vector_exact(prm, qmin, qmax)) return false;
  cpu::parallel_for(
      g.planes * g.oh,
      [&](std::int64_t task) {
        const std::int64_t plane = task / g.oh, row = task % g.oh, c = read.channel(plane);
        const float* in = x + (plane * g.ih + 2 * row) * g.iw;
        for (std::int64_t c0 = 0; c0 < g.iw; c0 += kRun) {
          const std::int64_t n = std::min(kRun, g.iw - c0);  // even: windows pair columns 2j, 2j + 1
          float t[kBitmaskBlock], f[kBitmaskBlock];  // the two rows' runs at 0 and kRun
          read_run(read, in + c0, t, n, c);
          read_run(read, in + g.iw + c0, t + kRun, n, c);
          std::uint32_t w[kBitmaskWordsPerBlock] = {0, 0, 0, 0};
          cpu::fake_quant_block_run_f32(t, f, 0, n, prm, qmin, qmax, w);
          cpu::fake_quant_block_run_f32(t, f, kRun, kRun + n, prm, qmin, qmax, w);
          const std::int64_t o0 = (plane * g.oh + row) * g.ow + c0 / 2;
          for (std::int64_t j = 0; j < n / 2; ++j) {
            const std::int64_t k[4] = {2 * j, 2 * j + 1, kRun + 2 * j, kRun + 2 * j + 1};
            float best = formulas::pool_lowest<float>();
            int arg = 0;
            for (int q = 0; q < 4; ++q)
              if (f[k[q]] > best || formulas::pool_is_nan(f[k[q]])) {
                best = f[k[q]];
                arg = q;
              }
            const std::int64_t r0 = 2 * (row * g.iw + c0 / 2 + j);
            const std::int64_t r = r0 + (arg & 1) + (arg >> 1) * g.iw;
            const bool bit = ((w[k[arg] & 3] >> (k[arg] >> 2)) & 1u) != 0;
            y[o0 + j] = best;
            code[o0 + j] = static_cast<std::int32_t>(bit ? r : -1 - r);
          }
        }
      },
      std::max<std::int64_t>(1, cpu::kParallelGrain / std::max<std::int64_t>(1, 2 * g.iw)));
  return true;
}

// How a max-pooling backward reads its saved indices: max_pool2d's s64
// indices, or fake_quantize_max_pool2d's codes (the index, and the mask bit
// that the fake quant's backward multiplies the gradient by).
struct PlainIndices {
  static constexpr bool kMasked = false;
  const std::int64_t* idx;
  QGRAD_HD std::int64_t arg(std::int64_t o) const { return idx[o]; }
  QGRAD_HD bool bit(std::int64_t) const { return true; }
};
struct MaskedIndices {
  static constexpr bool kMasked = true;
  const std::int32_t* code;
  QGRAD_HD std::int64_t arg(std::int64_t o) const { return code[o] >= 0 ? code[o] : -1 - std::int64_t{code[o]}; }
  QGRAD_HD bool bit(std::int64_t o) const { return code[o] >= 0; }
};

// The gradient the gather wrote (T(sum)), through the fake quant's backward
// when the indices are masked (formulas::FakeQuantGradOp: dy * mask, -0.0
// kept).
template <class T, class Ix>
QGRAD_HD T pooled_grad(T g, bool bit) {
  if constexpr (Ix::kMasked) {
    bool unused = false;
    return formulas::FakeQuantGradOp<T>{0, 0}(g, formulas::ChannelParams{}, bit, unused);
  } else {
    (void)bit;
    return g;
  }
}

// The outputs along one axis whose window may hold input row `i`: those
// starting at most (k - 1) * d rows above it, [lo, hi] clipped to [0, out).
struct OutRange {
  std::int64_t lo, hi;  // inclusive; empty when lo > hi
};
QGRAD_HD OutRange out_range(std::int64_t i, std::int64_t out, std::int64_t span, const StrideDivs& s, std::int64_t p) {
  const std::int64_t first = i + p - span + 1;  // ceil(first / s), clipped at 0
  return {first <= 0 ? 0 : s.div(first + s.s - 1), min_i64(s.div(i + p), out - 1)};
}

template <class T, class Ix>
struct MaxPoolBackward {
  const T* dy;
  Ix ix;
  T* dx;
  Pool2dGeometry g;
  PoolDivs dv;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const PlaneDivs::At a = dv.in.at(i);
    const std::int64_t r = a.r;
    const OutRange hr = out_range(a.row, g.oh, (g.kh - 1) * g.dh + 1, dv.sh, g.ph);
    const OutRange wr = out_range(a.col, g.ow, (g.kw - 1) * g.dw + 1, dv.sw, g.pw);
    const std::int64_t base = a.plane * g.oh * g.ow;
    M acc = M(0);
    bool bit = true;  // element i's mask bit, from any output naming it (0 * either bit is +0)
    for (std::int64_t oh = hr.lo; oh <= hr.hi; ++oh)
      for (std::int64_t ow = wr.lo; ow <= wr.hi; ++ow) {
        const std::int64_t o = base + oh * g.ow + ow;
        if (ix.arg(o) == r) {
          acc += M(dy[o]);
          bit = ix.bit(o);
        }
      }
    dx[i] = pooled_grad<T, Ix>(T(acc), bit);
  }
};

// MaxPoolBackward when the windows tile the input (no padding, window span
// = stride, the input exactly oh x ow windows): one index per output, which
// writes its whole window, each element once. The gather's values: an
// element gets T(0 + dy[o]) where it is the window's argmax, else T(0).
// A warp writes whole row segments (coalesced) and reads each idx / dy once.
// kTiled2: 2 x 2 windows, their four elements written unrolled.
// kPairs (with kTiled2, dx aligned to 2 x T): each window row's two elements
// stored as one pair (store_pair; a row's first element has an even index).
template <class T, class Ix, bool kTiled2 = false, bool kPairs = false>
struct MaxPoolBackwardTiled {
  const T* dy;
  Ix ix;
  T* dx;
  Pool2dGeometry g;
  PlaneDivs out;
  QGRAD_HD void operator()(std::int64_t o) const {
    using M = op_math_t<T>;
    const PlaneDivs::At a = out.at(o);
    const std::int64_t arg = ix.arg(o);
    const T hit = pooled_grad<T, Ix>(T(M(0) + M(dy[o])), ix.bit(o)), miss = T(M(0));
    T* plane = dx + a.plane * g.ih * g.iw;
    if constexpr (kTiled2) {
      std::int64_t r[4];
      window_2x2(a, g.iw, r);
      if constexpr (kPairs) {
        store_pair(plane + r[0], r[0] == arg ? hit : miss, r[1] == arg ? hit : miss);
        store_pair(plane + r[2], r[2] == arg ? hit : miss, r[3] == arg ? hit : miss);
      } else {
        QGRAD_UNROLL
        for (int k = 0; k < 4; ++k) plane[r[k]] = r[k] == arg ? hit : miss;
      }
    } else {
      const std::int64_t h0 = a.row * g.sh, w0 = a.col * g.sw;
      for (std::int64_t h = h0; h < h0 + g.sh; ++h)
        for (std::int64_t w = w0; w < w0 + g.sw; ++w) {
          const std::int64_t r = h * g.iw + w;
          plane[r] = r == arg ? hit : miss;
        }
    }
  }
};

template <class T>
struct AvgPoolForward {
  const T* x;
  T* y;
  Pool2dGeometry g;
  PoolDivs dv;
  bool count_include_pad;
  QGRAD_HD void operator()(std::int64_t o) const {
    using M = op_math_t<T>;
    const PlaneDivs::At a = dv.out.at(o);
    const std::int64_t plane = a.plane;
    const formulas::AvgWindow win = formulas::avg_pool_window(g, a.row, a.col, count_include_pad);
    if (win.divisor == 0) {
      y[o] = T(M(0));
      return;
    }
    const T* p = x + plane * g.ih * g.iw;
    M acc = M(0);
    for (std::int64_t h = win.h0; h < win.h1; ++h)
      for (std::int64_t w = win.w0; w < win.w1; ++w) acc += M(p[h * g.iw + w]);
    y[o] = T(acc / M(win.divisor));
  }
};

template <class T>
struct AvgPoolBackward {
  const T* dy;
  T* dx;
  Pool2dGeometry g;
  PoolDivs dv;
  bool count_include_pad;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const PlaneDivs::At a = dv.in.at(i);
    const std::int64_t h = a.row, w = a.col;
    const OutRange hr = out_range(h, g.oh, g.kh, dv.sh, g.ph);
    const OutRange wr = out_range(w, g.ow, g.kw, dv.sw, g.pw);
    const std::int64_t base = a.plane * g.oh * g.ow;
    M acc = M(0);
    for (std::int64_t oh = hr.lo; oh <= hr.hi; ++oh)
      for (std::int64_t ow = wr.lo; ow <= wr.hi; ++ow) {
        const formulas::AvgWindow win = formulas::avg_pool_window(g, oh, ow, count_include_pad);
        if (h < win.h0 || h >= win.h1 || w < win.w0 || w >= win.w1) continue;
        acc += M(dy[base + oh * g.ow + ow]) / M(win.divisor);
      }
    dx[i] = T(acc);
  }
};

template <class T>
struct AdaptiveAvgForward {
  const T* x;
  T* y;
  Pool2dGeometry g;
  PoolDivs dv;
  QGRAD_HD void operator()(std::int64_t o) const {
    using M = op_math_t<T>;
    const PlaneDivs::At a = dv.out.at(o);
    const std::int64_t plane = a.plane, oh = a.row, ow = a.col;
    const std::int64_t h0 = formulas::adaptive_start(oh, g.ih, g.oh), h1 = formulas::adaptive_end(oh, g.ih, g.oh);
    const std::int64_t w0 = formulas::adaptive_start(ow, g.iw, g.ow), w1 = formulas::adaptive_end(ow, g.iw, g.ow);
    const T* p = x + plane * g.ih * g.iw;
    M acc = M(0);
    for (std::int64_t h = h0; h < h1; ++h)
      for (std::int64_t w = w0; w < w1; ++w) acc += M(p[h * g.iw + w]);
    y[o] = T(acc / M((h1 - h0) * (w1 - w0)));
  }
};

// Output o holds input row i exactly when
// floor(i * out / in) <= o < ceil((i + 1) * out / in).
template <class T>
struct AdaptiveAvgBackward {
  const T* dy;
  T* dx;
  Pool2dGeometry g;
  PoolDivs dv;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const PlaneDivs::At a = dv.in.at(i);
    const std::int64_t h = a.row, w = a.col, plane = a.plane;
    const std::int64_t oh0 = formulas::adaptive_start(h, g.oh, g.ih), oh1 = formulas::adaptive_end(h, g.oh, g.ih);
    const std::int64_t ow0 = formulas::adaptive_start(w, g.ow, g.iw), ow1 = formulas::adaptive_end(w, g.ow, g.iw);
    const std::int64_t base = plane * g.oh * g.ow;
    M acc = M(0);
    for (std::int64_t oh = oh0; oh < oh1; ++oh) {
      const std::int64_t kh = formulas::adaptive_end(oh, g.ih, g.oh) - formulas::adaptive_start(oh, g.ih, g.oh);
      for (std::int64_t ow = ow0; ow < ow1; ++ow) {
        const std::int64_t kw = formulas::adaptive_end(ow, g.iw, g.ow) - formulas::adaptive_start(ow, g.iw, g.ow);
        acc += M(dy[base + oh * g.ow + ow]) / M(kh * kw);
      }
    }
    dx[i] = T(acc);
  }
};

// s8 / u8 average pooling: the integer sum of the window, PyTorch's
// quantized rounding (formulas::quantized_avg).
template <class Q>
struct QuantAvgPoolForward {
  const Q* x;
  Q* y;
  Pool2dGeometry g;
  PoolDivs dv;
  bool count_include_pad;
  QGRAD_HD void operator()(std::int64_t o) const {
    const PlaneDivs::At a = dv.out.at(o);
    const formulas::AvgWindow win = formulas::avg_pool_window(g, a.row, a.col, count_include_pad);
    if (win.divisor == 0) {
      y[o] = Q(0);
      return;
    }
    const Q* p = x + a.plane * g.ih * g.iw;
    std::int64_t sum = 0;
    for (std::int64_t h = win.h0; h < win.h1; ++h)
      for (std::int64_t w = win.w0; w < win.w1; ++w) sum += p[h * g.iw + w];
    y[o] = formulas::quantized_avg<Q>(sum, win.divisor);
  }
};

template <class Q>
struct QuantAdaptiveAvgForward {
  const Q* x;
  Q* y;
  Pool2dGeometry g;
  PoolDivs dv;
  QGRAD_HD void operator()(std::int64_t o) const {
    const PlaneDivs::At a = dv.out.at(o);
    const std::int64_t h0 = formulas::adaptive_start(a.row, g.ih, g.oh), h1 = formulas::adaptive_end(a.row, g.ih, g.oh);
    const std::int64_t w0 = formulas::adaptive_start(a.col, g.iw, g.ow), w1 = formulas::adaptive_end(a.col, g.iw, g.ow);
    const Q* p = x + a.plane * g.ih * g.iw;
    std::int64_t sum = 0;
    for (std::int64_t h = h0; h < h1; ++h)
      for (std::int64_t w = w0; w < w1; ++w) sum += p[h * g.iw + w];
    y[o] = formulas::quantized_adaptive_avg<Q>(sum, h1 - h0, w1 - w0);
  }
};

// f(tag) for the floating dtypes and s8 / u8 (the forwards of the poolings).
template <class F>
void dispatch_pool(DType dt, const char* op, F&& f) {
  if (dt == DType::s8 || dt == DType::u8) dispatch_int8(dt, op, f);
  else dispatch_floating(dt, op, f);
}

// Global pooling's backward, the loop above with one window per plane:
// dx[i] = 0 + dy[plane] / (H W), the plane found as a "channel" of the
// layout [1, planes, H W] (FastDiv, no hardware division).
template <class T>
struct GlobalAvgBackward {
  const T* dy;
  T* dx;
  std::int64_t n;
  ChannelIndexer plane;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    dx[i] = T(M(0) + M(dy[plane.channel(i)]) / M(n));
  }
};

}  // namespace

void max_pool2d(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dGeometry& g) {
  dispatch_pool(y.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::int64_t* idx = indices.defined() ? static_cast<std::int64_t*>(indices.data_ptr()) : nullptr;
    for_each_index(y.device(), y.numel(),
                   MaxPoolForward<T>{static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), idx, g, PoolDivs::of(g)},
                   "max_pool2d");
  });
}

bool windows_tile_input(const Pool2dGeometry& g) {
  return g.ph == 0 && g.pw == 0 && (g.kh - 1) * g.dh + 1 == g.sh && (g.kw - 1) * g.dw + 1 == g.sw &&
         g.oh * g.sh == g.ih && g.ow * g.sw == g.iw;
}

namespace {

template <class T, class Ix>
void max_pool_backward(const Tensor& dy, Ix ix, const Tensor& dx, const Pool2dGeometry& g, const char* what) {
  const T* d = static_cast<const T*>(dy.data_ptr());
  T* out = static_cast<T*>(dx.data_ptr());
  const PoolDivs dv = PoolDivs::of(g);
  // 2 x 2 tiles: iw is even, and so is every plane's size and a window row's first index.
  const bool tiled2 = windows_tile_2x2(g);
  const bool pairs = pair_aligned(out);
  if (tiled2 && pairs)
    for_each_index(dy.device(), dy.numel(), MaxPoolBackwardTiled<T, Ix, true, true>{d, ix, out, g, dv.out}, what);
  else if (tiled2)
    for_each_index(dy.device(), dy.numel(), MaxPoolBackwardTiled<T, Ix, true>{d, ix, out, g, dv.out}, what);
  else if (windows_tile_input(g))
    for_each_index(dy.device(), dy.numel(), MaxPoolBackwardTiled<T, Ix>{d, ix, out, g, dv.out}, what);
  else for_each_index(dx.device(), dx.numel(), MaxPoolBackward<T, Ix>{d, ix, out, g, dv}, what);
}

}  // namespace

void max_pool2d_backward(const Tensor& dy, const Tensor& indices, const Tensor& dx, const Pool2dGeometry& g) {
  dispatch_floating(dx.dtype(), "max_pool2d_backward", [&](auto tag) {
    max_pool_backward<typename decltype(tag)::type>(
        dy, PlainIndices{static_cast<const std::int64_t*>(indices.data_ptr())}, dx, g, "max_pool2d_backward");
  });
}

void fake_quantize_max_pool2d(const Tensor& x, const Tensor& y, const Tensor& codes, const formulas::ParamSource& p,
                              std::int64_t qmin, std::int64_t qmax, const Pool2dGeometry& g,
                              const NormalizedInput* normalized) {
  dispatch_floating(y.dtype(), "fake_quantize_max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const bool tiled2 = windows_tile_2x2(g);
    const auto run = [&](auto read) {
      const auto launch = [&](auto body) {
        for_each_index(y.device(), y.numel() / body.outputs_per_index(), body, "fake_quantize_max_pool2d");
      };
      const T* xp = static_cast<const T*>(x.data_ptr());
      T* yp = static_cast<T*>(y.data_ptr());
      std::int32_t* cp = static_cast<std::int32_t*>(codes.data_ptr());
      if constexpr (std::is_same_v<T, float> && !decltype(read)::kEvery) {
        if (tiled2 && !y.is_cuda() &&
            fake_quantize_max_pool_2x2_f32_cpu(xp, yp, cp, g, p.get(0), qmin, qmax, read))
          return;
      }
      using Read = decltype(read);
      const PoolDivs dv = PoolDivs::of(g);
      // Output pairs: ow even keeps a pair in one row and both windows' rows
      // 4 x T aligned within the plane (iw = 2 ow, planes of 4 oh ow).
      const bool pairs = tiled2 && g.ow % 2 == 0 && vec4_aligned<T>(xp) && pair_aligned(yp) && pair_aligned(cp);
      if (pairs)
        launch(FakeQuantMaxPoolForward<T, Read, PoolTiling::kPairs>{xp, yp, cp, g, dv, p, qmin, qmax, read});
      else if (tiled2)
        launch(FakeQuantMaxPoolForward<T, Read, PoolTiling::kSingle>{xp, yp, cp, g, dv, p, qmin, qmax, read});
      else if constexpr (!Read::kEvery)
        launch(FakeQuantMaxPoolForward<T, Read>{xp, yp, cp, g, dv, p, qmin, qmax, read});
    };
    if (!normalized) {
      run(PlainRead<T>{});
      return;
    }
    const NormalizedInput& n = *normalized;
    const auto ptr = [](const Tensor& t) { return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr; };
    const BatchNormReluRead<T> read{{ptr(n.divisor), ptr(n.shift)},
                                    {static_cast<const M*>(n.mean.data_ptr()),
                                     static_cast<const M*>(n.invstd.data_ptr()), ptr(n.weight), ptr(n.bias)},
                                    ChannelIndexer(AxisLayout{g.planes / n.channels, n.channels, 1})};
    if (y.is_cuda() && tiled2 && read.in.divisor && read.in.shift && read.norm.weight && read.norm.bias)
      run(BatchNormReluRead<T, true>{read.in, read.norm, read.planes});
    else run(read);
  });
}

void fake_quantize_max_pool2d_backward(const Tensor& dy, const Tensor& codes, const Tensor& dx,
                                       const Pool2dGeometry& g) {
  dispatch_floating(dx.dtype(), "fake_quantize_max_pool2d_backward", [&](auto tag) {
    max_pool_backward<typename decltype(tag)::type>(dy, MaskedIndices{static_cast<const std::int32_t*>(codes.data_ptr())},
                                                    dx, g, "fake_quantize_max_pool2d_backward");
  });
}

void avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dGeometry& g, bool count_include_pad) {
  if (!is_floating(y.dtype())) {
    dispatch_int8(y.dtype(), "avg_pool2d", [&](auto tag) {
      using Q = typename decltype(tag)::type;
      for_each_index(y.device(), y.numel(),
                     QuantAvgPoolForward<Q>{static_cast<const Q*>(x.data_ptr()), static_cast<Q*>(y.data_ptr()), g,
                                            PoolDivs::of(g), count_include_pad},
                     "avg_pool2d");
    });
    return;
  }
  dispatch_floating(y.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(
        y.device(), y.numel(),
        AvgPoolForward<T>{static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), g, PoolDivs::of(g),
                          count_include_pad},
        "avg_pool2d");
  });
}

void avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g, bool count_include_pad) {
  dispatch_floating(dx.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dx.device(), dx.numel(),
                   AvgPoolBackward<T>{static_cast<const T*>(dy.data_ptr()), static_cast<T*>(dx.data_ptr()), g, PoolDivs::of(g),
                                      count_include_pad},
                   "avg_pool2d_backward");
  });
}

void adaptive_avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dGeometry& g) {
  if (!is_floating(y.dtype())) {
    dispatch_int8(y.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
      using Q = typename decltype(tag)::type;
      for_each_index(y.device(), y.numel(),
                     QuantAdaptiveAvgForward<Q>{static_cast<const Q*>(x.data_ptr()), static_cast<Q*>(y.data_ptr()), g,
                                                PoolDivs::of(g)},
                     "adaptive_avg_pool2d");
    });
    return;
  }
  if (g.oh == 1 && g.ow == 1) {
    // Global pooling: the mean of each plane, a row reduction (on CUDA a
    // block per plane once planes are long; kernels/cuda/reduce.cu). Same
    // formula as the loop below (sum in order, one division) on the CPU.
    sum_axis(x, y, AxisLayout{g.planes, g.ih * g.iw, 1}, true);
    return;
  }
  dispatch_floating(y.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), y.numel(),
                   AdaptiveAvgForward<T>{static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), g,
                                         PoolDivs::of(g)},
                   "adaptive_avg_pool2d");
  });
}

void adaptive_avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dGeometry& g) {
  dispatch_floating(dx.dtype(), "adaptive_avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (g.oh == 1 && g.ow == 1) {
      const AxisLayout v{1, g.planes, g.ih * g.iw};
      for_each_index(dx.device(), dx.numel(),
                     GlobalAvgBackward<T>{static_cast<const T*>(dy.data_ptr()), static_cast<T*>(dx.data_ptr()),
                                          v.inner, ChannelIndexer(v)},
                     "adaptive_avg_pool2d_backward");
      return;
    }
    for_each_index(dx.device(), dx.numel(),
                   AdaptiveAvgBackward<T>{static_cast<const T*>(dy.data_ptr()), static_cast<T*>(dx.data_ptr()), g,
                                          PoolDivs::of(g)},
                   "adaptive_avg_pool2d_backward");
  });
}

}  // namespace qgrad::kernels
