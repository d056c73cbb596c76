// batch_norm, one source for both devices (kernels/loop.h). The per-channel
// sums take the fixed three-level order of kernels/batch_norm.h, so CPU and
// CUDA agree bitwise.
#include "qgrad/kernels/batch_norm.h"

#include <cmath>
#include <type_traits>

#include "qgrad/kernels/formulas/activation.h"
#include "qgrad/kernels/formulas/batch_norm.h"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/formulas/observer.h"
#include "qgrad/kernels/loop.h"
#include "qgrad/kernels/reduce.h"

namespace qgrad::kernels {

namespace {

template <class M>
QGRAD_HD M sqrt_m(M x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(M) == 4) return ::sqrtf(x);
  else return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// The three levels of a per-channel sum over the N * inner elements of a
// channel, each a loop body, in an order fixed by the shape alone:
//   1. partial (c, q, lane), q = n * chunks + k: the elements
//      j = k * kBatchNormChunk + lane + i * lanes (i = 0, 1, ...) of chunk k of
//      plane (n, c), in order (consecutive lanes read consecutive elements:
//      coalesced on CUDA);
//   2. lane sum (c, lane): the partials of q = 0, 1, ..., Q - 1 in order;
//   3. channel c: its lane sums in lane order.
// lanes: 32, halved while a partial would hold fewer than
// kBatchNormPartialMin elements (so at most 64 elements a partial; a [N, C]
// input has one lane). A partial's fixed costs (its index, its channel's
// parameters, its stores) dominated at 32 lanes of 6-7 elements: the CNN's
// 14 x 14 planes take 8 lanes of 24-25.
struct Partials {
  AxisLayout v;
  std::int64_t chunks, lanes;
  std::int64_t per_channel() const { return v.outer * chunks; }  // Q
  std::int64_t count() const { return v.channels * per_channel() * lanes; }
  static Partials of(const AxisLayout& v) {
    const std::int64_t inner = v.inner < 1 ? 1 : v.inner;
    std::int64_t lanes = 32;
    while (lanes > 1 && inner < lanes * kBatchNormPartialMin) lanes /= 2;
    return {v, (inner + kBatchNormChunk - 1) / kBatchNormChunk, lanes};
  }
};

// The index arithmetic of a partial's chunk by FastDiv's 32-bit magic
// divisions instead of 64-bit ones (a software routine each on CUDA, several
// per partial of 6-64 elements) when every partial index is below 2^31; the
// same results.
struct ChunkDivs {
  bool small = false;
  FastDiv by_lanes{}, by_per_channel{}, by_chunks{};
  static ChunkDivs of(const Partials& pt) {
    ChunkDivs d;
    d.small = pt.count() < (std::int64_t{1} << 31);
    if (d.small) {
      d.by_lanes = FastDiv(static_cast<std::uint32_t>(pt.lanes));
      d.by_per_channel = FastDiv(static_cast<std::uint32_t>(pt.per_channel()));
      d.by_chunks = FastDiv(static_cast<std::uint32_t>(pt.chunks));
    }
    return d;
  }
};

// The elements of partial p = (c * Q + q) * lanes + lane: plane offset, the
// first element, the end, the channel.
struct ChunkOf {
  std::int64_t offset, lo, hi, c;
};
QGRAD_HD ChunkOf chunk_of(std::int64_t p, const AxisLayout& v, std::int64_t chunks, std::int64_t lanes,
                          const ChunkDivs& d) {
  const std::int64_t per_channel = v.outer * chunks;
  std::int64_t lane, q, c, n;
  if (d.small) {
    const std::uint32_t pu = static_cast<std::uint32_t>(p), cq = d.by_lanes.div(pu);
    const std::uint32_t cu = d.by_per_channel.div(cq), qu = cq - cu * static_cast<std::uint32_t>(per_channel);
    lane = pu - cq * static_cast<std::uint32_t>(lanes);
    q = qu;
    c = cu;
    n = d.by_chunks.div(qu);
  } else {
    const std::int64_t cq = p / lanes;
    lane = p - cq * lanes;
    q = cq % per_channel;
    c = cq / per_channel;
    n = q / chunks;
  }
  const std::int64_t k = q - n * chunks;
  const std::int64_t lo = k * kBatchNormChunk;
  const std::int64_t hi = lo + kBatchNormChunk < v.inner ? lo + kBatchNormChunk : v.inner;
  return {(n * v.channels + c) * v.inner, lo + lane, hi, c};
}

template <class M>
struct SquaredDeviation {
  M center;
  QGRAD_HD M operator()(M v) const {
    const M d = v - center;
    return d * d;
  }
};

using formulas::Normalize;
using formulas::Unscale;

// Count, mean and sum of squared deviations (m2) of a set of values; +=
// merges another set into this one (Chan, Golub and LeVeque), so a
// formulas::lane_sum of Moments is a fixed-order merge tree. Counts are held
// in op math (exact up to 2^24 in f32, then rounded: a relative error of
// 2^-24 in a merge's weights).
template <class M>
struct Moments {
  M n, mean, m2;
  Moments() = default;                                      // trivial: a __shared__ array of column_sum.cuh
  QGRAD_HD explicit Moments(int) : n(0), mean(0), m2(0) {}  // the empty set (lane_sum's M(0))
  QGRAD_HD Moments(M n_, M mean_, M m2_) : n(n_), mean(mean_), m2(m2_) {}
  template <class S>
  QGRAD_HD Moments fields(S s) const {  // a warp shuffle of each (warp_rows.cuh)
    return {s(n), s(mean), s(m2)};
  }
  QGRAD_HD Moments& operator+=(const Moments& b) {
    if (b.n == M(0)) return *this;
    if (n == M(0)) return *this = b;
    const M total = n + b.n, delta = b.mean - mean;
    mean = mean + delta * (b.n / total);
    m2 = m2 + b.m2 + delta * delta * (n * b.n / total);
    n = total;
    return *this;
  }
};

// Moments with the range [lo, hi] of the values (formulas::range_min /
// range_max: NaN wins): batch_norm_stats' statistics when the range of its
// relu output is wanted too. The range merges in any order to the same bits.
template <class M>
struct RangedMoments {
  Moments<M> m;
  M lo, hi;
  RangedMoments() = default;
  QGRAD_HD explicit RangedMoments(int) : m(0), lo(M(INFINITY)), hi(M(-INFINITY)) {}
  QGRAD_HD RangedMoments(const Moments<M>& m_, M lo_, M hi_) : m(m_), lo(lo_), hi(hi_) {}
  template <class S>
  QGRAD_HD RangedMoments fields(S s) const {
    return {m.fields(s), s(lo), s(hi)};
  }
  QGRAD_HD RangedMoments& operator+=(const RangedMoments& b) {
    m += b.m;
    lo = formulas::range_min(lo, b.lo);
    hi = formulas::range_max(hi, b.hi);
    return *this;
  }
};

template <class A>
QGRAD_HD const auto& moments_of(const A& a) {
  if constexpr (requires { a.m; }) return a.m;
  else return a;
}

// Level 1 of the statistics, one pass over x: the partial's Moments, its
// mean = sum / count and m2 = sum of (x - mean)^2 over its <= 64 elements
// (the second loop re-reads what the first just loaded: cache hits). A
// (Moments or RangedMoments): with RangedMoments also the range of the
// values, taken as the first loop reads them.
template <class T, class A = Moments<op_math_t<T>>>
struct PartialMoments {
  static constexpr bool kRange = !std::is_same_v<A, Moments<op_math_t<T>>>;  // the values' range too
  const T* x;
  A* part;
  AxisLayout v;
  std::int64_t chunks, lanes;
  Unscale<T> in;
  ChunkDivs divs;
  QGRAD_HD void operator()(std::int64_t p) const {
    using M = op_math_t<T>;
    const ChunkOf ch = chunk_of(p, v, chunks, lanes, divs);
    const T* first = x + ch.offset + ch.lo;
    const std::int64_t count = ch.hi > ch.lo ? (ch.hi - ch.lo + lanes - 1) / lanes : 0;
    if (count == 0) {
      part[p] = A(0);
      return;
    }
    const auto u_c = in.shared(ch.c);
    // Specialised where divisor and shift are both given (formulas::for_every);
    // both passes under one Division (formulas::with_shared_division): where
    // the fast quotients do not apply, the partial is summed again dividing.
    formulas::for_every(u_c.is_every(), [&](auto every) {
      const auto u = every ? u_c.every() : u_c;
      formulas::with_shared_division(u.fast(), [&](auto& division) {
        M lo = M(INFINITY), hi = M(-INFINITY);  // the range, taken by the first loop
        const M mean = sum_strided_map(first, count, lanes,
                                       [&u, &lo, &hi, &division](M val) {
                                         const M unscaled = u(T(val), division);
                                         (void)lo;  // used only when kRange
                                         (void)hi;
                                         if constexpr (kRange) {
                                           lo = formulas::range_min(lo, unscaled);
                                           hi = formulas::range_max(hi, unscaled);
                                         }
                                         return unscaled;
                                       }) /
                       M(count);
        const SquaredDeviation<M> dev{mean};
        const Moments<M> m(M(count), mean, sum_strided_map(first, count, lanes, [&u, dev, &division](M val) {
                             return dev(u(T(val), division));
                           }));
        if constexpr (kRange) part[p] = A(m, lo, hi);
        else part[p] = m;
      });
    });
  }
};

// Level 2 as column sums (formulas::lane_sum's order over q, for_each_column_sum):
// column i = (array a, channel c, lane) sums the partials (c, q, lane),
// q = 0 .. Q - 1, of one or more arrays (array a at part + a * part_stride,
// its lane sums at out + a * per_array): the backwards' two sums in one launch.
template <class A>
struct LaneColumns {
  using Acc = A;
  const A* part;
  A* out;
  std::int64_t q, lanes, per_array, part_stride;
  QGRAD_HD std::int64_t count(std::int64_t) const { return q; }
  QGRAD_HD A term(std::int64_t r, std::int64_t i) const {
    const std::int64_t a = i / per_array, j = i - a * per_array;
    const std::int64_t c = j / lanes, lane = j - c * lanes;
    return part[a * part_stride + (c * q + r) * lanes + lane];
  }
  QGRAD_HD void write(std::int64_t i, A s) const { out[i] = s; }
};

// Level 3 of the statistics (for_each_row_sum): channel c merges its lane
// Moments in formulas::lane_sum's order; var = m2 / n, invstd, the running
// statistics and the counter (stats == false: none of these, mean and invstd
// given). With RangedMoments (A), range[c] and range[C + c] (f32) are the
// min and max of relu(batch_norm(x)) over the channel as batch_norm_apply
// writes it (formulas::normalize_relu at the ends of the input's range:
// every step is monotone, so the output's extremes are there).
template <class T, class A = Moments<op_math_t<T>>>
struct ChannelStats {
  using Acc = A;
  const Acc* lane_moments;
  op_math_t<T>* mean;
  op_math_t<T>* invstd;
  T* running_mean;  // null: not tracked
  T* running_var;
  std::int64_t lanes, n;
  op_math_t<T> momentum, eps;
  std::int64_t* batches;  // null: no counter
  bool stats = true;
  const T* weight = nullptr;  // the affine parameters of the range's batch norm
  const T* bias = nullptr;
  float* range = nullptr;  // with RangedMoments
  std::int64_t channels = 0;
  QGRAD_HD std::int64_t count(std::int64_t) const { return lanes; }
  QGRAD_HD Acc term(std::int64_t r, std::int64_t c) const { return lane_moments[c * lanes + r]; }
  QGRAD_HD void write(std::int64_t c, const Acc& a) const {
    using M = op_math_t<T>;
    const Moments<M>& t = moments_of(a);
    if (stats) {
      mean[c] = t.mean;
      invstd[c] = M(1) / sqrt_m(t.m2 / M(n) + eps);
      if (running_mean) {
        running_mean[c] = T(momentum * t.mean + (M(1) - momentum) * M(running_mean[c]));
        running_var[c] = T(momentum * (t.m2 / M(n - 1)) + (M(1) - momentum) * M(running_var[c]));
      }
      if (batches && c == 0) *batches += 1;
    }
    if constexpr (!std::is_same_v<A, Moments<M>>) {
      const Normalize<T> norm{mean, invstd, weight, bias};
      const float lo = formulas::cast_value<float>(formulas::normalize_relu(norm, a.lo, c));
      const float hi = formulas::cast_value<float>(formulas::normalize_relu(norm, a.hi, c));
      range[c] = formulas::min_combine(lo, hi);
      range[channels + c] = formulas::max_combine(lo, hi);
    }
  }
};

template <class T>
struct EvalStats {
  const T* running_mean;
  const T* running_var;
  op_math_t<T>* mean;
  op_math_t<T>* invstd;
  op_math_t<T> eps;
  QGRAD_HD void operator()(std::int64_t c) const {
    using M = op_math_t<T>;
    mean[c] = M(running_mean[c]);
    invstd[c] = M(1) / sqrt_m(M(running_var[c]) + eps);
  }
};

template <class T>
struct Apply {
  const T* x;
  Normalize<T> norm;
  T* y;
  ChannelIndexer ch;
  bool relu;  // then relu, as the relu op computes it
  Unscale<T> in;
  QGRAD_HD void operator()(std::int64_t i) const {
    const std::int64_t c = ch.channel(i);
    y[i] = relu ? formulas::normalize_relu(norm, in(x[i], c), c) : norm(in(x[i], c), c);
  }
};

// batch_norm_relu's backward of the relu, dy where y = batch_norm(x) > 0 else
// 0 (the relu op's backward, its mask recomputed from x); active == false:
// dy unchanged.
template <class T>
struct ReluGate {
  Normalize<T> norm;
  bool active;
  // Channel c's gate, its parameters loaded once (formulas::Unscale::At).
  struct At {
    typename Normalize<T>::At norm;
    bool active;
    QGRAD_HD T operator()(T dy, op_math_t<T> x) const {
      using M = op_math_t<T>;
      if (!active || formulas::relu_mask(M(norm(x)))) return dy;
      return T(M(0));
    }
    // Active with weight and bias; every(): see formulas::Unscale::At.
    QGRAD_HD bool is_every() const { return active && norm.is_every(); }
    QGRAD_HD At every() const { return {norm.every(), true}; }
  };
  QGRAD_HD At at(std::int64_t c) const { return {active ? norm.at(c) : typename Normalize<T>::At{}, active}; }
  QGRAD_HD T operator()(T dy, op_math_t<T> x, std::int64_t c) const { return at(c)(dy, x); }
};

// The last, partial batch of a backward partial (elements j, j + lanes, ...
// below hi; fewer than kSumLoadBatch) loaded as the full batches are, every
// load issued before the first use (past hi: element j again, unused); x's
// only where xs is given. Returns how many lie below hi. Loaded one at a
// time, a layer-2 partial of the CNN (6-7 elements, all in this batch) was
// 6-7 round trips in a row: batch norm's backward passes 31 -> 18 and 33 ->
// 24 us (H200).
template <class T>
QGRAD_HD int load_last_batch(const T* g, const T* xs, std::int64_t j, std::int64_t hi, std::int64_t lanes,
                             T (&gv)[kSumLoadBatch], T (&xv)[kSumLoadBatch]) {
  QGRAD_UNROLL
  for (int k = 0; k < kSumLoadBatch; ++k) {
    const std::int64_t at = j + k * lanes < hi ? j + k * lanes : j;
    gv[k] = g[at];
    xv[k] = xs ? xs[at] : T(op_math_t<T>(0));
  }
  return static_cast<int>((hi - j + lanes - 1) / lanes);
}

// Level 1 of the backwards (batch_norm, channel_div_add), one pass over the
// partial's elements: ps[p] = sum of dy; px[p] = sum of dy * (x - center[c])
// (center null: of dy * x, the same bits as x - 0) when px is given (x may
// be null otherwise); dx = dy / divisor[c] when dx is given.
template <class T>
struct PartialGrad {
  const T* dy;
  const T* x;
  const op_math_t<T>* center;
  const T* divisor;  // with dx
  T* dx;
  op_math_t<T>* ps;
  op_math_t<T>* px;
  AxisLayout v;
  std::int64_t chunks, lanes;
  ReluGate<T> gate = {};  // batch_norm_relu: dy through relu's backward (px given, so x is read)
  Unscale<T> in = {};     // batch norm fused after channel_div_add: x is the latter's input
  ChunkDivs divs = {};
  QGRAD_HD void operator()(std::int64_t p) const {
    using M = op_math_t<T>;
    const ChunkOf ch = chunk_of(p, v, chunks, lanes, divs);
    const M m = center ? center[ch.c] : M(0);
    // channel_div_add's dx divisor, its reciprocal taken only where dx is wanted.
    const auto d = dx ? formulas::SharedDivisor<M>::of(M(divisor[ch.c])) : formulas::SharedDivisor<M>{};
    const auto u_c = in.shared(ch.c);
    const auto gt_c = gate.at(ch.c);
    const T* g = dy + ch.offset;
    const T* xs = px ? x + ch.offset : nullptr;
    T* o = dx ? dx + ch.offset : nullptr;
    // Specialised where the prologue and the gate have every part
    // (formulas::for_every); the pass under one Division
    // (formulas::with_shared_division): where the fast quotients do not
    // apply, it runs again dividing (dx rewritten).
    formulas::for_every(u_c.is_every() && gt_c.is_every(), [&](auto every) {
      const auto u = every ? u_c.every() : u_c;
      const auto gt = every ? gt_c.every() : gt_c;
      formulas::with_shared_division(u.fast() && (!o || d.fast), [&](auto& division) {
        M s = M(0), t = M(0);
        std::int64_t j = ch.lo;
        // kSumLoadBatch elements' loads issued before their adds (reduce.h), in
        // order, and before the first unscaling: a division's slow-path call
        // ends the compiler's scheduling region, so loads interleaved with the
        // divisions were one round trip each (layer 1 of the CNN: 25 in a row).
        for (; j + (kSumLoadBatch - 1) * lanes < ch.hi; j += kSumLoadBatch * lanes) {
          T gv[kSumLoadBatch], xr[kSumLoadBatch];
          if (xs) {
            QGRAD_UNROLL
            for (int k = 0; k < kSumLoadBatch; ++k) {
              gv[k] = g[j + k * lanes];
              xr[k] = xs[j + k * lanes];
            }
          } else {
            QGRAD_UNROLL
            for (int k = 0; k < kSumLoadBatch; ++k) {
              gv[k] = g[j + k * lanes];
              xr[k] = T(M(0));
            }
          }
          M xv[kSumLoadBatch];
          QGRAD_UNROLL
          for (int k = 0; k < kSumLoadBatch; ++k) xv[k] = xs ? u(xr[k], division) : M(0);
          if (gt.active) {
            QGRAD_UNROLL
            for (int k = 0; k < kSumLoadBatch; ++k) gv[k] = gt(gv[k], xv[k]);
          }
          QGRAD_UNROLL
          for (int k = 0; k < kSumLoadBatch; ++k) {
            s += M(gv[k]);
            t += M(gv[k]) * (xv[k] - m);
            if (o) o[j + k * lanes] = T(division.divide(d, M(gv[k])));
          }
        }
        if (j < ch.hi) {
          T gv[kSumLoadBatch], xr[kSumLoadBatch];
          const int valid = load_last_batch(g, xs, j, ch.hi, lanes, gv, xr);
          QGRAD_UNROLL
          for (int k = 0; k < kSumLoadBatch; ++k) {
            if (k >= valid) break;
            const M xk = xs ? u(xr[k], division) : M(0);
            const M gk = M(gt(gv[k], xk));
            s += gk;
            if (xs) t += gk * (xk - m);
            if (o) o[j + k * lanes] = T(division.divide(d, gk));
          }
        }
        if (ps) ps[p] = s;
        if (px) px[p] = t;
      });
    });
  }
};

// Level 3 of the backward (for_each_row_sum): per channel, s and p from its
// lane sums in formulas::lane_sum's order; dbias, dweight and the
// coefficients of dx, coef[3c] = invstd * w, coef[3c + 1] = s / n,
// coef[3c + 2] = p * invstd^2 / n.
template <class T>
struct ChannelGrad {
  using Acc = SumPair<op_math_t<T>>;
  const op_math_t<T>* ls;
  const op_math_t<T>* lx;
  const op_math_t<T>* invstd;
  const T* weight;
  T* dweight;  // null: not wanted
  T* dbias;
  op_math_t<T>* coef;
  std::int64_t lanes, n;
  QGRAD_HD std::int64_t count(std::int64_t) const { return lanes; }
  QGRAD_HD Acc term(std::int64_t r, std::int64_t c) const { return {ls[c * lanes + r], lx[c * lanes + r]}; }
  QGRAD_HD void write(std::int64_t c, const Acc& t) const {
    using M = op_math_t<T>;
    const M is = invstd[c];
    if (dbias) dbias[c] = T(t.s);
    if (dweight) dweight[c] = T(t.p * is);
    coef[3 * c] = weight ? is * M(weight[c]) : is;
    coef[3 * c + 1] = t.s / M(n);
    coef[3 * c + 2] = t.p * is * is / M(n);
  }
};

template <class T>
struct EvalCoef {
  const op_math_t<T>* invstd;
  const T* weight;
  op_math_t<T>* coef;
  QGRAD_HD void operator()(std::int64_t c) const {
    using M = op_math_t<T>;
    coef[3 * c] = weight ? invstd[c] * M(weight[c]) : invstd[c];
  }
};

// batch_norm's dx at one element (x the normalisation's input, in op math).
template <class T>
struct InputGradFormula {
  const op_math_t<T>* mean;
  const op_math_t<T>* coef;
  bool training;
  ReluGate<T> gate;
  // Channel c's formula, its parameters loaded once (formulas::Unscale::At).
  struct At {
    op_math_t<T> mean, scale, shift, proj_scale;  // mean[c], coef[3c], coef[3c + 1], coef[3c + 2]
    bool training;
    typename ReluGate<T>::At gate;
    QGRAD_HD T operator()(T dy, op_math_t<T> x) const {
      using M = op_math_t<T>;
      const M g = M(gate(dy, x));
      if (!training) return T(g * scale);
      const M proj = (x - mean) * proj_scale;
      return T((g - shift - proj) * scale);
    }
    // Training through an every() gate; every(): see formulas::Unscale::At.
    QGRAD_HD bool is_every() const { return training && gate.is_every(); }
    QGRAD_HD At every() const {
      At a = *this;
      a.training = true;
      a.gate = gate.every();
      return a;
    }
  };
  QGRAD_HD At at(std::int64_t c) const {
    using M = op_math_t<T>;
    if (!training) return {M(0), coef[3 * c], M(0), M(0), false, gate.at(c)};
    return {mean[c], coef[3 * c], coef[3 * c + 1], coef[3 * c + 2], true, gate.at(c)};
  }
  QGRAD_HD T operator()(T dy, op_math_t<T> x, std::int64_t c) const { return at(c)(dy, x); }
};

template <class T>
struct InputGrad {
  const T* dy;
  const T* x;
  T* dx;
  ChannelIndexer ch;
  InputGradFormula<T> f;
  QGRAD_HD void operator()(std::int64_t i) const {
    const std::int64_t c = ch.channel(i);
    dx[i] = f(dy[i], op_math_t<T>(x[i]), c);
  }
};

// The fused channel_div_add_batch_norm's last backward pass, per partial p
// of the three-level order: the batch norm's dx (dxn, rounded to T as the
// unfused op writes it) from dy and x through the prologue, then what
// channel_div_add's backward does with it: dx = dxn / divisor[c] (when dx is
// given), ps[p] = sum of dxn and px[p] = sum of dxn * x in element order
// (when given): the same bits as the two ops.
template <class T>
struct FusedInputGrad {
  const T* dy;
  const T* x;
  T* dx;
  op_math_t<T>* ps;
  op_math_t<T>* px;
  AxisLayout v;
  std::int64_t chunks, lanes;
  InputGradFormula<T> f;
  Unscale<T> in;
  ChunkDivs divs;
  QGRAD_HD void operator()(std::int64_t p) const {
    using M = op_math_t<T>;
    const ChunkOf ch = chunk_of(p, v, chunks, lanes, divs);
    const std::int64_t c = ch.c;
    const auto fc_c = f.at(c);
    const auto u_c = in.shared(c);  // u.div: channel_div_add's divisor, for dx too
    const T* g = dy + ch.offset;
    const T* xs = x + ch.offset;
    T* o = dx ? dx + ch.offset : nullptr;
    // Specialised where the prologue and the formula have every part
    // (formulas::for_every); the pass under one Division
    // (formulas::with_shared_division): where the fast quotients do not
    // apply, it runs again dividing (dx rewritten).
    formulas::for_every(u_c.is_every() && fc_c.is_every(), [&](auto every) {
      const auto u = every ? u_c.every() : u_c;
      const auto fc = every ? fc_c.every() : fc_c;
      formulas::with_shared_division(u.div.fast, [&](auto& division) {
        M s = M(0), t = M(0);
        std::int64_t j = ch.lo;
        for (; j + (kSumLoadBatch - 1) * lanes < ch.hi; j += kSumLoadBatch * lanes) {
          T gv[kSumLoadBatch], xv[kSumLoadBatch];
          QGRAD_UNROLL
          for (int k = 0; k < kSumLoadBatch; ++k) {
            gv[k] = g[j + k * lanes];
            xv[k] = xs[j + k * lanes];
          }
          // Every dn of the batch before its stores: a store through o could alias
          // the channel's parameters, which f and in would then load again.
          M dn[kSumLoadBatch];
          QGRAD_UNROLL
          for (int k = 0; k < kSumLoadBatch; ++k) {
            dn[k] = M(fc(gv[k], u(xv[k], division)));
            s += dn[k];
            t += dn[k] * M(xv[k]);
          }
          if (o) {
            QGRAD_UNROLL
            for (int k = 0; k < kSumLoadBatch; ++k) o[j + k * lanes] = T(division.divide(u.div, dn[k]));
          }
        }
        if (j < ch.hi) {
          T gv[kSumLoadBatch], xv[kSumLoadBatch];
          const int valid = load_last_batch(g, xs, j, ch.hi, lanes, gv, xv);
          M dn[kSumLoadBatch] = {};
          QGRAD_UNROLL
          for (int k = 0; k < kSumLoadBatch; ++k) {
            if (k >= valid) break;
            dn[k] = M(fc(gv[k], u(xv[k], division)));
            s += dn[k];
            t += dn[k] * M(xv[k]);
          }
          if (o) {
            QGRAD_UNROLL
            for (int k = 0; k < kSumLoadBatch; ++k)
              if (k < valid) o[j + k * lanes] = T(division.divide(u.div, dn[k]));
          }
        }
        if (ps) ps[p] = s;
        if (px) px[p] = t;
      });
    });
  }
};

// channel_div_add: the quotient rounded to T, then the bias added (the two
// ops it replaces, each rounded).
template <class T>
struct DivAdd {
  const T* x;
  Unscale<T> in;
  T* y;
  ChannelIndexer ch;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = in.value(x[i], ch.channel(i)); }
};

// Level 3 of channel_div_add's backward (for_each_row_sum): per channel, s
// and p from its lane sums in formulas::lane_sum's order (each read only
// when wanted); dbias = s, ddivisor = -(p / (d * d)).
template <class T>
struct DivAddChannelGrad {
  using Acc = SumPair<op_math_t<T>>;
  const op_math_t<T>* ls;
  const op_math_t<T>* lx;
  const T* divisor;
  T* ddivisor;
  T* dbias;
  std::int64_t lanes;
  QGRAD_HD std::int64_t count(std::int64_t) const { return lanes; }
  QGRAD_HD Acc term(std::int64_t r, std::int64_t c) const {
    using M = op_math_t<T>;
    return {dbias ? ls[c * lanes + r] : M(0), ddivisor ? lx[c * lanes + r] : M(0)};
  }
  QGRAD_HD void write(std::int64_t c, const Acc& t) const {
    using M = op_math_t<T>;
    if (dbias) dbias[c] = T(t.s);
    if (ddivisor) {
      const M d = M(divisor[c]);
      ddivisor[c] = T(-(t.p / (d * d)));
    }
  }
};

template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

// Level-1 bodies sum up to kBatchNormChunk / lanes elements, level-2 ones
// N * chunks: an OpenMP team pays off from a few hundred of them.
constexpr std::int64_t kPartialGrain = 256;

// Level 2 over `arrays` arrays of pt's partials, at part, part + pt.count(),
// ...: their lane sums at out, out + channels * lanes, ...
template <class A>
void sum_lanes(Device dev, const Partials& pt, const A* part, A* out, const char* where, std::int64_t arrays = 1) {
  const std::int64_t per_array = pt.v.channels * pt.lanes;
  for_each_column_sum(dev, arrays * per_array,
                      LaneColumns<A>{part, out, pt.per_channel(), pt.lanes, per_array, pt.count()}, where);
}

TensorOptions math_options(const Tensor& like, DType math) {
  return TensorOptions{}.with_dtype(math).with_device(like.device());
}

template <class T>
Unscale<T> unscale(const DivAddPrologue& pre) {
  return {ptr_or_null<const T>(pre.divisor), ptr_or_null<const T>(pre.shift)};
}

// Levels 2 and 3 of channel_div_add's backward: `part` holds the level-1
// partials of dy (first pt.count(), when dbias is wanted) and of dy * x
// (next, when ddivisor is), then room for their lane sums; ddivisor and
// dbias (each optional, not both undefined) from them.
template <class T>
void divadd_channel_grads(Device dev, const Partials& pt, const Tensor& part, const Tensor& divisor,
                          const Tensor& ddivisor, const Tensor& dbias, const char* where) {
  using M = op_math_t<T>;
  M* ps = static_cast<M*>(part.data_ptr());
  M* px = ps + pt.count();
  M* ls = px + pt.count();
  M* lx = ls + pt.v.channels * pt.lanes;
  if (dbias.defined() && ddivisor.defined())
    sum_lanes(dev, pt, ps, ls, where, 2);  // px and lx follow ps and ls
  else if (dbias.defined())
    sum_lanes(dev, pt, ps, ls, where);
  else
    sum_lanes(dev, pt, px, lx, where);
  for_each_row_sum(dev, pt.v.channels,
                   DivAddChannelGrad<T>{ls, lx, static_cast<const T*>(divisor.data_ptr()), ptr_or_null<T>(ddivisor),
                                        ptr_or_null<T>(dbias), pt.lanes},
                   where);
}

}  // namespace

namespace {

// The three levels of the statistics with accumulator A (Moments, or
// RangedMoments for the relu output's range); stats as ChannelStats takes it.
template <class T, class A>
void run_stats(const Tensor& x, const AxisLayout& v, double momentum, double eps, const Tensor& running_mean,
               const Tensor& running_var, const Tensor& mean, const Tensor& invstd, const Tensor& num_batches_tracked,
               const DivAddPrologue& pre, const ReluRange* range, bool stats) {
  using M = op_math_t<T>;
  static_assert(sizeof(A) % sizeof(M) == 0);
  const Partials pt = Partials::of(v);
  const std::int64_t n = v.outer * v.inner, lane_sums = v.channels * pt.lanes;
  // One pass over x: A per partial, merged per (c, lane), then per c.
  const std::int64_t per = static_cast<std::int64_t>(sizeof(A) / sizeof(M));
  Tensor part = Tensor::empty({per * (pt.count() + lane_sums)}, math_options(x, dtype_of<M>));
  auto* pp = static_cast<A*>(part.data_ptr());
  A* lp = pp + pt.count();
  const Device dev = x.device();
  for_each_index(dev, pt.count(),
                 PartialMoments<T, A>{static_cast<const T*>(x.data_ptr()), pp, v, pt.chunks, pt.lanes, unscale<T>(pre),
                                      ChunkDivs::of(pt)},
                 "batch_norm", kPartialGrain);
  sum_lanes(dev, pt, pp, lp, "batch_norm");
  ChannelStats<T, A> f{lp,
                       static_cast<M*>(mean.data_ptr()),
                       static_cast<M*>(invstd.data_ptr()),
                       ptr_or_null<T>(running_mean),
                       ptr_or_null<T>(running_var),
                       pt.lanes,
                       n,
                       M(momentum),
                       M(eps),
                       ptr_or_null<std::int64_t>(num_batches_tracked),
                       stats};
  if (range) {
    f.weight = ptr_or_null<const T>(range->weight);
    f.bias = ptr_or_null<const T>(range->bias);
    f.range = static_cast<float*>(range->range.data_ptr());
    f.channels = v.channels;
  }
  for_each_row_sum(dev, v.channels, f, "batch_norm");
}

}  // namespace

void batch_norm_stats(const Tensor& x, const AxisLayout& v, double momentum, double eps, const Tensor& running_mean,
                      const Tensor& running_var, const Tensor& mean, const Tensor& invstd,
                      const Tensor& num_batches_tracked, const DivAddPrologue& pre, const ReluRange* range) {
  dispatch_floating(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    if (range)
      run_stats<T, RangedMoments<M>>(x, v, momentum, eps, running_mean, running_var, mean, invstd,
                                     num_batches_tracked, pre, range, true);
    else
      run_stats<T, Moments<M>>(x, v, momentum, eps, running_mean, running_var, mean, invstd, num_batches_tracked,
                               pre, nullptr, true);
  });
}

void batch_norm_relu_range(const Tensor& x, const AxisLayout& v, const Tensor& mean, const Tensor& invstd,
                           const ReluRange& range, const DivAddPrologue& pre) {
  dispatch_floating(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    run_stats<T, RangedMoments<M>>(x, v, 0.0, 1.0, Tensor(), Tensor(), mean, invstd, Tensor(), pre, &range, false);
  });
}

void batch_norm_eval_stats(const Tensor& running_mean, const Tensor& running_var, double eps, const Tensor& mean,
                           const Tensor& invstd) {
  dispatch_floating(running_mean.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    for_each_index(running_mean.device(), running_mean.numel(),
                   EvalStats<T>{static_cast<const T*>(running_mean.data_ptr()),
                                static_cast<const T*>(running_var.data_ptr()), static_cast<M*>(mean.data_ptr()),
                                static_cast<M*>(invstd.data_ptr()), M(eps)},
                   "batch_norm");
  });
}

void batch_norm_apply(const Tensor& x, const AxisLayout& v, const Tensor& mean, const Tensor& invstd,
                      const Tensor& weight, const Tensor& bias, const Tensor& y, bool relu, const DivAddPrologue& pre) {
  dispatch_floating(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const Normalize<T> norm{static_cast<const M*>(mean.data_ptr()), static_cast<const M*>(invstd.data_ptr()),
                            ptr_or_null<const T>(weight), ptr_or_null<const T>(bias)};
    for_each_index(y.device(), y.numel(),
                   Apply<T>{static_cast<const T*>(x.data_ptr()), norm, static_cast<T*>(y.data_ptr()), ChannelIndexer(v),
                            relu, unscale<T>(pre)},
                   "batch_norm");
  });
}

void batch_norm_backward(const Tensor& dy, const Tensor& x, const AxisLayout& v, const Tensor& mean,
                         const Tensor& invstd, const Tensor& weight, bool training, const Tensor& dx,
                         const Tensor& dweight, const Tensor& dbias, bool relu, const Tensor& bias,
                         const DivAddPrologue& pre) {
  dispatch_floating(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const Device dev = x.device();
    const T* dyp = static_cast<const T*>(dy.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    const M* mp = static_cast<const M*>(mean.data_ptr());
    const M* ip = static_cast<const M*>(invstd.data_ptr());
    const T* wp = ptr_or_null<const T>(weight);
    const ReluGate<T> gate{{mp, ip, wp, ptr_or_null<const T>(bias)}, relu};
    const Unscale<T> in = unscale<T>(pre);
    Tensor coef = Tensor::empty({3 * v.channels}, math_options(x, dtype_of<M>));
    M* cp = static_cast<M*>(coef.data_ptr());
    if (training || dweight.defined() || dbias.defined()) {
      const Partials pt = Partials::of(v);
      const std::int64_t lane_sums = v.channels * pt.lanes;
      Tensor part = Tensor::empty({2 * (pt.count() + lane_sums)}, math_options(x, dtype_of<M>));
      M* pd = static_cast<M*>(part.data_ptr());
      M* px = pd + pt.count();
      M* ld = px + pt.count();
      M* lx = ld + lane_sums;
      for_each_index(dev, pt.count(),
                     PartialGrad<T>{dyp, xp, mp, nullptr, nullptr, pd, px, v, pt.chunks, pt.lanes, gate, in, ChunkDivs::of(pt)},
                     "batch_norm_backward", kPartialGrain);
      sum_lanes(dev, pt, pd, ld, "batch_norm_backward", 2);  // px and lx follow pd and ld
      for_each_row_sum(dev, v.channels,
                       ChannelGrad<T>{ld, lx, ip, wp, ptr_or_null<T>(dweight), ptr_or_null<T>(dbias), cp, pt.lanes,
                                      v.outer * v.inner},
                       "batch_norm_backward");
    } else {
      for_each_index(dev, v.channels, EvalCoef<T>{ip, wp, cp}, "batch_norm_backward");
    }
    const InputGradFormula<T> f{mp, cp, training, gate};
    if (!in.divisor) {
      if (dx.defined())
        for_each_index(dev, dx.numel(), InputGrad<T>{dyp, xp, ptr_or_null<T>(dx), ChannelIndexer(v), f},
                       "batch_norm_backward");
      return;
    }
    // Fused with channel_div_add: its backward in the same pass.
    const bool sums = pre.ddivisor.defined() || pre.dshift.defined();
    if (!dx.defined() && !sums) return;
    const Partials pt = Partials::of(v);
    const std::int64_t lane_sums = v.channels * pt.lanes;
    Tensor part = sums ? Tensor::empty({2 * (pt.count() + lane_sums)}, math_options(x, dtype_of<M>)) : Tensor();
    M* ps = pre.dshift.defined() ? static_cast<M*>(part.data_ptr()) : nullptr;
    M* px = pre.ddivisor.defined() ? static_cast<M*>(part.data_ptr()) + pt.count() : nullptr;
    for_each_index(dev, pt.count(),
                   FusedInputGrad<T>{dyp, xp, ptr_or_null<T>(dx), ps, px, v, pt.chunks, pt.lanes, f, in, ChunkDivs::of(pt)},
                   "batch_norm_backward", kPartialGrain);
    if (sums) divadd_channel_grads<T>(dev, pt, part, pre.divisor, pre.ddivisor, pre.dshift, "batch_norm_backward");
  });
}

namespace {

template <class T>
struct ScaleFactor {
  const T* weight;
  const T* running_var;
  op_math_t<T> eps;
  T* f;
  T* std_dev;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    const T s = T(sqrt_m(M(T(M(running_var[i]) + eps))));
    std_dev[i] = s;
    f[i] = T(M(weight[i]) / M(s));
  }
};

}  // namespace

void batch_norm_scale_factor(const Tensor& weight, const Tensor& running_var, double eps, const Tensor& f,
                             const Tensor& std_dev) {
  dispatch_floating(f.dtype(), "batch_norm_scale_factor", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // eps rounded to T first, as add's host scalar is (binary_scalar).
    const op_math_t<T> e = op_math_t<T>(formulas::cast_value<T>(eps));
    for_each_index(f.device(), f.numel(),
                   ScaleFactor<T>{static_cast<const T*>(weight.data_ptr()), static_cast<const T*>(running_var.data_ptr()),
                                  e, static_cast<T*>(f.data_ptr()), static_cast<T*>(std_dev.data_ptr())},
                   "batch_norm_scale_factor");
  });
}

void channel_div_add(const Tensor& x, const AxisLayout& v, const Tensor& divisor, const Tensor& bias,
                     const Tensor& y) {
  dispatch_floating(x.dtype(), "channel_div_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(y.device(), y.numel(),
                   DivAdd<T>{static_cast<const T*>(x.data_ptr()),
                             {static_cast<const T*>(divisor.data_ptr()), ptr_or_null<const T>(bias)},
                             static_cast<T*>(y.data_ptr()),
                             ChannelIndexer(v)},
                   "channel_div_add");
  });
}

void channel_div_add_backward(const Tensor& dy, const Tensor& x, const AxisLayout& v, const Tensor& divisor,
                              const Tensor& dx, const Tensor& ddivisor, const Tensor& dbias) {
  dispatch_floating(dy.dtype(), "channel_div_add_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const Device dev = dy.device();
    const Partials pt = Partials::of(v);
    const std::int64_t lane_sums = v.channels * pt.lanes;
    const bool sums = ddivisor.defined() || dbias.defined();
    Tensor part = sums ? Tensor::empty({2 * (pt.count() + lane_sums)}, math_options(dy, dtype_of<M>)) : Tensor();
    M* ps = dbias.defined() ? static_cast<M*>(part.data_ptr()) : nullptr;
    M* px = ddivisor.defined() ? static_cast<M*>(part.data_ptr()) + pt.count() : nullptr;
    const T* dp = static_cast<const T*>(divisor.data_ptr());
    const T* xp = px ? static_cast<const T*>(x.data_ptr()) : nullptr;  // x is read for ddivisor only
    for_each_index(dev, pt.count(),
                   PartialGrad<T>{static_cast<const T*>(dy.data_ptr()), xp, nullptr, dp, ptr_or_null<T>(dx), ps, px,
                                  v, pt.chunks, pt.lanes, {}, {}, ChunkDivs::of(pt)},
                   "channel_div_add_backward", kPartialGrain);
    if (sums) divadd_channel_grads<T>(dev, pt, part, divisor, ddivisor, dbias, "channel_div_add_backward");
  });
}

}  // namespace qgrad::kernels
