// The loop primitive of the shared kernel sources (kernels/*.cpp): runs a
// loop body f(i) for i in [0, n) on a tensor's device, which is chosen here,
// in one place. On the CPU it is parallel_for (OpenMP, static schedule,
// kernels/cpu/parallel.h); on CUDA the grid-stride launch of
// kernels/cuda/launch.cuh. When CUDA is on, CMake compiles kernels/*.cpp
// with nvcc, so one translation unit holds both paths; in a build without
// CUDA the CUDA branch compiles away and throws (no CUDA tensor can exist).
//
// The body is a functor with a QGRAD_HD call operator, written once:
//
//   template <class T> struct AddOne {
//     const T* x; T* o;
//     QGRAD_HD void operator()(std::int64_t i) const { o[i] = x[i] + T(1); }
//   };
//   for_each_index(out.device(), out.numel(), AddOne<T>{x, o});
//
// Not a `[=] __host__ __device__` lambda: nvcc wraps an extended host-device
// lambda in a heap-allocated type-erased closure whose host-side call is an
// indirect call per element, so the CPU loop would not inline or vectorise.
// A functor has neither cost, nor the extended-lambda restrictions, so the
// per-dtype code may sit inside dispatch_floating's generic lambda.
#pragma once

#include <cstdint>

#include "qgrad/core/device.h"
#include "qgrad/core/half.h"
#include "qgrad/core/macros.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/dispatch.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/vec4.h"
#if defined(__CUDACC__)
#include "qgrad/kernels/cuda/column_sum.cuh"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/warp_rows.cuh"
#endif

namespace qgrad::kernels {

template <class F>
inline constexpr bool kAlwaysFalse = false;

namespace detail {
// for_each_index's body; kOnce: on CUDA a grid that covers [0, n) once.
template <bool kOnce, class F>
void run_indices(Device dev, std::int64_t n, F f, const char* where, std::int64_t cpu_grain) {
  if (dev.is_cuda()) {
#if defined(__CUDACC__)
    (void)where;
    if constexpr (kOnce) cuda::launch_elementwise_once(dev.index, n, f);
    else cuda::launch_elementwise(dev.index, n, f);
    return;
#elif QGRAD_WITH_CUDA
    static_assert(kAlwaysFalse<F>, "a kernel that uses for_each_index must be compiled by nvcc in a CUDA build");
#else
    no_cuda_build(where);
#endif
  }
  cpu::parallel_for(n, f, cpu_grain);
}
}  // namespace detail

// f(i) for i in [0, n) on `dev`. `where` names the kernel in the error of a
// build without CUDA. `cpu_grain`: the fewest indices worth an OpenMP team
// (kernels/cpu/parallel.h); a body that handles a block of many elements
// per index passes a smaller one.
template <class F>
void for_each_index(Device dev, std::int64_t n, F f, const char* where = "kernel",
                    std::int64_t cpu_grain = cpu::kParallelGrain) {
  detail::run_indices<false>(dev, n, f, where, cpu_grain);
}

// for_each_index for bodies that move 16 bytes per operand an index (a
// Vec4 of f32, a 16-byte copy): on CUDA a grid that covers [0, n) once
// (cuda::launch_elementwise_once); the same loop on the CPU.
template <class F>
void for_each_index_once(Device dev, std::int64_t n, F f, const char* where = "kernel") {
  detail::run_indices<true>(dev, n, f, where, cpu::kParallelGrain);
}

namespace detail {
// map_elements' bodies over kInputs (1 or 2) inputs: one element an index
// (Map, the CPU's loop), or on CUDA four consecutive elements an index through
// one Vec4 access per operand (MapFour; the last index takes the n % 4 left
// over one at a time).
template <class T, class F, int kInputs>
struct Map {
  const T* in[kInputs];
  T* out;
  F f;
  QGRAD_HD T at(std::int64_t i, const T (&v)[kInputs]) const {
    if constexpr (kInputs == 1) return f(i, v[0]);
    else return f(i, v[0], v[1]);
  }
  QGRAD_HD void operator()(std::int64_t i) const {
    T v[kInputs];
    for (int k = 0; k < kInputs; ++k) v[k] = in[k][i];
    out[i] = at(i, v);
  }
};
template <class T, class F, int kInputs>
struct MapFour {
  Map<T, F, kInputs> m;
  std::int64_t n;
  QGRAD_HD void operator()(std::int64_t q) const {
    const std::int64_t i0 = 4 * q;
    if (i0 + 3 < n) {
      Vec4<T> x[kInputs];
      for (int k = 0; k < kInputs; ++k) x[k] = reinterpret_cast<const Vec4<T>*>(m.in[k])[q];
      Vec4<T> r;
      for (int e = 0; e < 4; ++e) {
        T v[kInputs];
        for (int k = 0; k < kInputs; ++k) v[k] = x[k].v[e];
        r.v[e] = m.at(i0 + e, v);
      }
      reinterpret_cast<Vec4<T>*>(m.out)[q] = r;
    } else {
      tail(m, i0, n);
    }
  }
  // The last index's n % 4 elements, out of line in device code: inlined,
  // its loop let ptxas sink the second operand's vector load below the math
  // on the first (gelu's erf backward: two DRAM round trips a thread, 0.0323
  // ms against 0.0271 with both loads first, H200). Static, the map by
  // value: a member would copy the functor to local memory for `this`.
#if defined(__CUDACC__)
  __host__ __device__ __noinline__
#endif
  static void tail(Map<T, F, kInputs> map, std::int64_t i0, std::int64_t end) {
    for (std::int64_t i = i0; i < end; ++i) map(i);
  }
};
template <class T, class F, int kInputs>
void map_elements(Device dev, std::int64_t n, const Map<T, F, kInputs>& m, const char* where) {
  bool aligned = vec4_aligned<T>(m.out);
  for (int k = 0; k < kInputs; ++k) aligned = aligned && vec4_aligned<T>(m.in[k]);
  if (!dev.is_cuda() || !aligned) for_each_index(dev, n, m, where);
  else if constexpr (sizeof(T) >= 4) for_each_index_once(dev, (n + 3) / 4, MapFour<T, F, kInputs>{m, n}, where);
  else for_each_index(dev, (n + 3) / 4, MapFour<T, F, kInputs>{m, n}, where);  // 8-byte Vec4s: grid-stride
}
}  // namespace detail

// An elementwise map of one or two inputs of out's size: out[i] = f(i, a[i])
// or f(i, a[i], b[i]) for i in [0, n), f a functor with a QGRAD_HD call
// operator returning T (i is passed for bodies that read a mask or a random
// stream by index). On CUDA, where the pointers are Vec4-aligned, a thread
// takes four consecutive elements through one vector access per operand: one
// element a thread keeps too few loads in flight (gelu's forward over
// [8192, 1024] f32 ran at 57% of copy bandwidth that way, its four-a-thread
// backward at 90%); for 4-byte and wider elements on a grid that covers the
// range once (for_each_index_once). The same f per element either way, so
// the same bits.
template <class T, class F>
void map_elements(Device dev, std::int64_t n, const T* a, T* out, F f, const char* where = "kernel") {
  detail::map_elements(dev, n, detail::Map<T, F, 1>{{a}, out, f}, where);
}
template <class T, class F>
void map_elements(Device dev, std::int64_t n, const T* a, const T* b, T* out, F f, const char* where = "kernel") {
  detail::map_elements(dev, n, detail::Map<T, F, 2>{{a, b}, out, f}, where);
}

namespace detail {
// map_elements_masked's CPU body: one index per 128-element mask block,
// its elements in order (element 128 b + j is bit j / 4 of word 4 b + j % 4).
template <class T, class F>
struct MaskedMapBlock {
  const T* a;
  T* out;
  std::uint32_t* words;
  std::int64_t n;
  F f;
  QGRAD_HD void operator()(std::int64_t b) const {
    std::uint32_t w[kBitmaskWordsPerBlock] = {0, 0, 0, 0};
    const std::int64_t i0 = b * kBitmaskBlock, end = n - i0 < kBitmaskBlock ? n : i0 + kBitmaskBlock;
    for (std::int64_t i = i0; i < end; ++i) {
      bool bit = false;
      out[i] = f(i, a[i], bit);
      if (bit) w[i & 3] |= 1u << static_cast<unsigned>((i - i0) >> 2);
    }
    if (words != nullptr)
      for (int k = 0; k < kBitmaskWordsPerBlock; ++k) words[b * kBitmaskWordsPerBlock + k] = w[k];
  }
};
}  // namespace detail

// An elementwise map that also writes the saved mask (kernels/bitmask.h):
// out[i] = f(i, a[i], bit) with f setting bit, the predicate the backward
// needs (bits past n are 0; words null: no mask). CUDA: a warp per mask
// block, each lane four consecutive elements, each word one ballot
// (kernels/cuda/launch.cuh); CPU: one index per block, its elements in order.
template <class T, class F>
void map_elements_masked(Device dev, std::int64_t n, const T* a, T* out, std::uint32_t* words, F f,
                         const char* where = "kernel") {
  if (dev.is_cuda()) {
#if defined(__CUDACC__)
    (void)where;
    cuda::launch_masked_map(dev.index, n, a, out, words, f);
    return;
#elif QGRAD_WITH_CUDA
    static_assert(kAlwaysFalse<F>, "a kernel that uses map_elements_masked must be compiled by nvcc in a CUDA build");
#else
    no_cuda_build(where);
#endif
  }
  cpu::parallel_for(bitmask_blocks(n), detail::MaskedMapBlock<T, F>{a, out, words, n, f},
                    cpu::kParallelGrain / kBitmaskBlock);
}

// Two sums carried side by side through one lane_sum or column-sum pass (batch
// norm's backward: the sums of dy and of dy * x; layer_norm's: of its weight's
// and its bias's gradients): each component is added in the order it would
// be alone, so the same bits as two passes. Trivially default-constructible,
// as a __shared__ array of them must be.
template <class M>
struct SumPair {
  M s, p;
  SumPair() = default;
  QGRAD_HD explicit SumPair(int) : s(0), p(0) {}
  QGRAD_HD SumPair(M s_, M p_) : s(s_), p(p_) {}
  QGRAD_HD SumPair& operator+=(const SumPair& b) {
    s += b.s;
    p += b.p;
    return *this;
  }
  template <class S>
  QGRAD_HD SumPair fields(S f) const {
    return {f(s), f(p)};
  }
};

// Two column sums of one shape as one (for_each_column_sum): a's and b's terms
// side by side in a SumPair, each written by its own functor; a's count (and
// kMaxCount, where it has one) serves both. One launch and one pass where two
// would read the same rows.
template <class A, class B>
struct ColumnSumPairBase {
  using Acc = SumPair<typename A::Acc>;
  A a;
  B b;
  QGRAD_HD std::int64_t count(std::int64_t i) const { return a.count(i); }
  QGRAD_HD Acc term(std::int64_t r, std::int64_t i) const { return Acc(a.term(r, i), b.term(r, i)); }
  QGRAD_HD void write(std::int64_t i, Acc v) const {
    a.write(i, v.s);
    b.write(i, v.p);
  }
};
template <class A, class B>
struct ColumnSumPair : ColumnSumPairBase<A, B> {};
template <class A, class B>
  requires requires { A::kMaxCount; }
struct ColumnSumPair<A, B> : ColumnSumPairBase<A, B> {
  static constexpr std::int64_t kMaxCount = A::kMaxCount;
};

// The second stage of a chunked column sum: column j of `cols` adds its
// `chunks` partial sums part[c * cols + j] in lane_sum's order, then divides
// by mean_n when it is > 0.
template <class T>
struct ChunkSumsFinish {
  using Acc = op_math_t<T>;
  const Acc* part;
  T* out;
  std::int64_t chunks, cols, mean_n = 0;
  QGRAD_HD std::int64_t count(std::int64_t) const { return chunks; }
  QGRAD_HD Acc term(std::int64_t c, std::int64_t j) const { return part[c * cols + j]; }
  QGRAD_HD void write(std::int64_t j, Acc s) const { out[j] = T(mean_n > 0 ? s / Acc(mean_n) : s); }
};

namespace detail {
// The CPU side of for_each_column_sum / for_each_row_sum: one index per sum.
template <class F>
void lane_sums_on_cpu(std::int64_t n, const F& f, std::int64_t cpu_grain) {
  cpu::parallel_for(
      n,
      [&](std::int64_t i) {
        f.write(i, formulas::lane_sum<typename F::Acc>(f.count(i), [&](std::int64_t r) { return f.term(r, i); }));
      },
      cpu_grain);
}
}  // namespace detail

// Column sums in formulas::lane_sum's order, for reductions over rows:
// for each i in [0, cols), f.write(i, lane_sum<F::Acc>(f.count(i), r ->
// f.term(r, i))). f is a functor with `using Acc = ...` and QGRAD_HD
// count(i), term(r, i) and write(i, sum); one whose counts never exceed a
// bound declares `static constexpr std::int64_t kMaxCount`. CPU: one index
// per column; CUDA: kernels/cuda/column_sum.cuh (32 columns x 32 lanes per
// block, coalesced rows; under kMaxCount, four threads a column with its
// lanes in registers), the same bits. `cpu_grain` as for for_each_index, in
// columns.
template <class F>
void for_each_column_sum(Device dev, std::int64_t cols, F f, const char* where = "kernel",
                         std::int64_t cpu_grain = cpu::kParallelGrain / 64) {
  if (dev.is_cuda()) {
#if defined(__CUDACC__)
    (void)where;
    cuda::launch_column_sum(dev.index, cols, f);
    return;
#elif QGRAD_WITH_CUDA
    static_assert(kAlwaysFalse<F>, "a kernel that uses for_each_column_sum must be compiled by nvcc in a CUDA build");
#else
    no_cuda_build(where);
#endif
  }
  detail::lane_sums_on_cpu(cols, f, cpu_grain);
}

// Row sums in formulas::lane_sum's order: the same functor contract as
// for_each_column_sum, f.write(i, lane_sum<F::Acc>(f.count(i), r ->
// f.term(r, i))) for i in [0, rows), where term(r, i) reads the r-th term of
// output i (consecutive r, ideally consecutive addresses). CPU: one index
// per row; CUDA: a warp per row (lane l sums r = l, l + 32, ... in order,
// then the shuffle tree of warp_lane_sum), the same bits. For few, long
// sums, where a thread per output would wait on one load at a time.
template <class F>
void for_each_row_sum(Device dev, std::int64_t rows, F f, const char* where = "kernel",
                      std::int64_t cpu_grain = cpu::kParallelGrain / 64) {
  if (dev.is_cuda()) {
#if defined(__CUDACC__)
    (void)where;
    cuda::launch_warp_rows(dev.index, rows, cuda::RowLaneSum<F>{f});
    return;
#elif QGRAD_WITH_CUDA
    static_assert(kAlwaysFalse<F>, "a kernel that uses for_each_row_sum must be compiled by nvcc in a CUDA build");
#else
    no_cuda_build(where);
#endif
  }
  detail::lane_sums_on_cpu(rows, f, cpu_grain);
}

}  // namespace qgrad::kernels
