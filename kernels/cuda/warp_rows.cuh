// One warp per row: the launch and the warp reductions shared by the
// warp-per-row kernels (softmax.cu, attention.cu, loop.h's for_each_row_sum).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/formulas/softmax.h"

namespace qgrad::kernels::cuda {

template <class F>
__global__ void warp_rows_kernel(std::int64_t rows, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t warps = (static_cast<std::int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  for (std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; row < rows;
       row += warps)
    f(row, lane);
}

// Runs f(row, lane) for every row, one full warp per row.
template <class F>
void launch_warp_rows(int device, std::int64_t rows, F f) {
  if (rows <= 0) return;
  constexpr unsigned threads = 256;
  const unsigned blocks =
      ::qgrad::cuda::blocks_for(rows * 32, threads, ::qgrad::cuda::fill_blocks(device, threads) * 4LL);
  ::qgrad::cuda::launch_kernel(device, warp_rows_kernel<F>, blocks, threads, 0, rows, f);
}

// Runs f(row, lane) for every row, one full warp per row, on blocks of
// kHeldRowThreads covering the rows once (grid-stride past blocks_for's
// cap): the launch of the kernels that hold their rows in registers
// (LaneRow with kPer > 0). Measured on softmax's forward over [8192, 1024]
// f32 (dev/cuda/softmax_rows.cu, H200): 0.0212 ms on blocks of 128 covering
// the rows once, 0.0215-0.0218 on blocks of 256 or 512 or on launch_warp_rows'
// grid. (The held rows before, with a per-lane element count known only at
// run time, on launch_warp_rows' unbounded kernel at 54-112 registers, ran
// the norms at half the copy rate.)
constexpr unsigned kHeldRowThreads = 128;

template <class F>
__global__ void __launch_bounds__(kHeldRowThreads) held_rows_kernel(std::int64_t rows, F f) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t warps = (static_cast<std::int64_t>(gridDim.x) * kHeldRowThreads) >> 5;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  for (std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * kHeldRowThreads + threadIdx.x) >> 5;
       row < rows; row += warps)
    f(row, lane);
}

// The longest row, in elements a lane, that a warp holds in registers.
constexpr int kLaneRowHeld = 32;

// A warp's view of a contiguous row of d elements in formulas::lane_sum's
// order: lane l takes elements l, l + 32, ... in order, in op math. kPer > 0
// (d <= 32 * kPer): loaded into registers at construction, kPer loads a lane
// issued before the first use, so a kernel that walks the row several times
// reads memory once; launched by launch_lane_rows<kPer>. kFull (d == 32 *
// kPer): every load the row's address plus a constant, no predicates.
// Otherwise a lane past the row's end reads the row's last element and never
// uses it: loads without predicates still, which the compiler issues together
// (loads guarded by the bound it placed each beside its use, walking memory
// in effect). kPer == 0: each access reads memory (L1 after the first walk).
template <class T, int kPer, bool kFull = false>
struct LaneRow {
  using M = op_math_t<T>;
  const T* p;
  int lane;
  std::int64_t d;
  M v[kPer > 0 ? kPer : 1];
  __device__ __forceinline__ LaneRow(const T* row, std::int64_t d_, int lane_) : p(row), lane(lane_), d(d_) {
    if constexpr (kPer > 0) {
      const int last = static_cast<int>(d) - 1;
#pragma unroll
      for (int t = 0; t < kPer; ++t) v[t] = M(p[kFull ? lane + 32 * t : min(lane + 32 * t, last)]);
    }
  }
  // Whether the lane's t-th element is in the row.
  __device__ __forceinline__ bool has(int t) const {
    if constexpr (kFull) return true;
    else if constexpr (kPer > 0) return lane + 32 * t < static_cast<int>(d);  // d <= 32 * kPer
    else return lane + 32 * static_cast<std::int64_t>(t) < d;
  }
  __device__ __forceinline__ M operator[](int t) const {
    if constexpr (kPer > 0) return v[t];
    else return M(p[index(t)]);
  }
  // The element's place in the row.
  __device__ __forceinline__ std::int64_t index(int t) const { return lane + 32 * static_cast<std::int64_t>(t); }
  // f(t, a_t, b_t) for the lane's elements in order, a_t and b_t the
  // elements in the same place of the rows a and b (M(0) where null: a
  // norm's weight and bias). Full held rows load them 8 elements at a time,
  // before those elements' f: f's stores may alias a and b as far as the
  // compiler knows, so it keeps each load after the stores before it, and a
  // load beside each store left one weight load in flight a warp (rms_norm's
  // forward at 59% of copy, softmax's at 78%). Ragged rows load beside each
  // use (their clamped addresses, 8 at a time, took layer_norm to 222
  // registers).
  template <class F>
  __device__ __forceinline__ void each_with(const T* a, const T* b, F f) const {
    if constexpr (kPer > 0 && kFull) {
      constexpr int kChunk = kPer < 8 ? kPer : 8;
#pragma unroll
      for (int c = 0; c < kPer; c += kChunk) {
        M av[kChunk], bv[kChunk];
#pragma unroll
        for (int k = 0; k < kChunk; ++k) {
          const int i = lane + 32 * (c + k);
          av[k] = a != nullptr ? M(a[i]) : M(0);
          bv[k] = b != nullptr ? M(b[i]) : M(0);
        }
#pragma unroll
        for (int k = 0; k < kChunk; ++k) f(c + k, av[k], bv[k]);
      }
    } else {
      each([&](int t) {
        const std::int64_t j = index(t);
        f(t, a != nullptr ? M(a[j]) : M(0), b != nullptr ? M(b[j]) : M(0));
      });
    }
  }
  // f(t) for the lane's elements t = 0, 1, ... in the row, in order.
  template <class F>
  __device__ __forceinline__ void each(F f) const {
    if constexpr (kPer > 0) {
#pragma unroll
      for (int t = 0; t < kPer; ++t)
        if (has(t)) f(t);
    } else {
      for (int t = 0; has(t); ++t) f(t);
    }
  }
};

// A LaneRow's shape: kPer elements a lane, kFull where the row fills them.
template <int kPer, bool kFull>
struct LaneRowShape {
  static constexpr int per = kPer;
  static constexpr bool full = kFull;
};

// Calls f(LaneRowShape<kPer, kFull>{}) with the fewest elements a lane (4,
// 8, 16 or 32) that hold a row of d elements of T in registers, or kPer = 0
// where it does not fit (f64 rows are never held: twice the registers).
template <class T, class F>
void with_lane_row(std::int64_t d, F f) {
  if constexpr (sizeof(T) <= 4) {
    auto held = [&](auto per) {
      constexpr int k = decltype(per)::value;
      if (d == 32 * k) f(LaneRowShape<k, true>{});
      else f(LaneRowShape<k, false>{});
    };
    if (d <= 32 * 4) return held(std::integral_constant<int, 4>{});
    if (d <= 32 * 8) return held(std::integral_constant<int, 8>{});
    if (d <= 32 * 16) return held(std::integral_constant<int, 16>{});
    if (d <= 32 * kLaneRowHeld) return held(std::integral_constant<int, kLaneRowHeld>{});
  }
  f(LaneRowShape<0, false>{});
}

// Runs f(row, lane) for every row, a warp a row: held_rows_kernel's launch
// for rows held in registers (kPer > 0), launch_warp_rows' otherwise.
template <int kPer, class F>
void launch_lane_rows(int device, std::int64_t rows, F f) {
  if constexpr (kPer > 0) {
    if (rows <= 0) return;
    ::qgrad::cuda::launch_kernel(device, held_rows_kernel<F>, ::qgrad::cuda::blocks_for(rows * 32, kHeldRowThreads),
                                 kHeldRowThreads, 0, rows, f);
  } else {
    launch_warp_rows(device, rows, f);
  }
}

// Butterfly sum: every lane gets the same total.
template <class M>
__device__ __forceinline__ M warp_sum(M v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// A warp shuffle s of an accumulator: a number, or a struct of numbers
// (batch norm's moments) whose fields(s) shuffles each field.
template <class M, class S>
__device__ __forceinline__ M shuffle_acc(const M& v, S s) {
  if constexpr (std::is_arithmetic_v<M>)
    return s(v);
  else
    return v.fields(s);
}

// The tree of formulas::lane_sum (s[l] += s[l + h], h = 16 .. 1) over the
// lanes' partial sums, broadcast from lane 0: with lane l summing r = l,
// l + 32, ... in order, the same bits as lane_sum on the CPU.
template <class M>
__device__ __forceinline__ M warp_lane_sum(M v) {
  for (int h = 16; h > 0; h >>= 1) v += shuffle_acc(v, [h](auto x) { return __shfl_down_sync(0xffffffffu, x, h); });
  return shuffle_acc(v, [](auto x) { return __shfl_sync(0xffffffffu, x, 0); });
}

// Lane `first`'s sum of f.term(r, i) for r = first, first + 32, ... below n,
// in order: past one term a lane, kLaneTermBatch terms' loads issued before
// their adds (those of the last batch past n repeat the batch's first term,
// unused), the same bits as the plain loop. A lane of a 288-term row (a
// folded conv weight's gradient, 64 x 288) waited on one round trip a term:
// 9.7 -> 8.1 us (H200). Rows of at most 32 terms keep one guarded term a
// lane (the batch's extra index arithmetic cost rows of 9 terms 1 us).
constexpr int kLaneTermBatch = 4;
template <class F>
__device__ __forceinline__ typename F::Acc lane_terms_sum(const F& f, std::int64_t i, std::int64_t first,
                                                          std::int64_t n) {
  using M = typename F::Acc;
  M acc = M(0);
  if (n <= 32) {
    if (first < n) acc += f.term(first, i);
    return acc;
  }
  for (std::int64_t r = first; r < n; r += 32 * kLaneTermBatch) {
    M t[kLaneTermBatch];
#pragma unroll
    for (int k = 0; k < kLaneTermBatch; ++k) t[k] = f.term(r + 32 * k < n ? r + 32 * k : r, i);
#pragma unroll
    for (int k = 0; k < kLaneTermBatch; ++k)
      if (r + 32 * k < n) acc += t[k];
  }
  return acc;
}

// for_each_row_sum's warp body (kernels/loop.h): lane l sums f.term(r, row)
// for r = l, l + 32, ... in order, then warp_lane_sum's tree: the order of
// formulas::lane_sum.
template <class F>
struct RowLaneSum {
  F f;
  __device__ void operator()(std::int64_t row, int lane) const {
    using M = typename F::Acc;
    const std::int64_t n = f.count(row);
    M acc = lane_terms_sum(f, row, lane, n);
    acc = warp_lane_sum(acc);
    if (lane == 0) f.write(row, acc);
  }
};

template <class M>
__device__ __forceinline__ M warp_max(M v) {
  for (int m = 16; m > 0; m >>= 1) v = formulas::max_nan(v, __shfl_xor_sync(0xffffffffu, v, m));
  return __shfl_sync(0xffffffffu, v, 0);
}

}  // namespace qgrad::kernels::cuda
