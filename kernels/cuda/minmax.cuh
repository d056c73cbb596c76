// Device pieces of the observer's min/max reduction, shared by the observer
// kernels (observer.cu) and the fused observe + fake quantize kernels
// (quantize_observe*.cu). The combine is exact and order-free
// (formulas::min_combine), so any split of the work gives the CPU's bits.
#pragma once

#include <cstdint>

#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/formulas/observer.h"
#include "qgrad/kernels/observer.h"

namespace qgrad::kernels::cuda {

inline constexpr unsigned kMinmaxThreads = 256;  // blockDim of every kernel using block_minmax

// Order-preserving integer keys of floating values: a < b as floats (-0
// below +0) exactly when key(a) < key(b), so atomicMin / atomicMax on keys
// give an exact range whatever order the blocks arrive in (dynamic_quant.cu,
// qat_mlp.cu). Positive NaNs sort above +inf, negative ones below -inf.
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

// Min/max over the warp (exact and order-free: every lane gets the result).
__device__ inline void warp_minmax(float& lo, float& hi) {
  for (int w = 16; w > 0; w /= 2) {
    lo = formulas::min_combine(lo, __shfl_xor_sync(0xffffffffu, lo, w));
    hi = formulas::max_combine(hi, __shfl_xor_sync(0xffffffffu, hi, w));
  }
}

// Min/max over the block (blockDim.x == kMinmaxThreads); every thread gets
// the result. Shuffles within each warp, then every thread combines the
// warps' values from shared memory (broadcast reads): two barriers, where a
// shared-memory tree took eight (the observer's per-tensor row 0.0697-0.0700
// -> 0.0684-0.0687 ms on an H200, docs/benchmarks.md fifty-third session).
// Exact and order-free like the combines. Ends with a barrier, so a loop may
// call it again.
__device__ inline void block_minmax(float& lo, float& hi) {
  constexpr unsigned kWarps = kMinmaxThreads / 32;
  __shared__ float smin[kWarps];
  __shared__ float smax[kWarps];
  warp_minmax(lo, hi);
  if (threadIdx.x % 32 == 0) {
    smin[threadIdx.x / 32] = lo;
    smax[threadIdx.x / 32] = hi;
  }
  __syncthreads();
  lo = smin[0];
  hi = smax[0];
#pragma unroll
  for (unsigned w = 1; w < kWarps; ++w) {
    lo = formulas::min_combine(lo, smin[w]);
    hi = formulas::max_combine(hi, smax[w]);
  }
  __syncthreads();
}

// This thread's min/max over elements at(k), k = first, first + stride, ...
// below count: four loads issued before their combines (bytes in flight).
template <class At>
__device__ inline void strided_minmax(std::int64_t first, std::int64_t count, std::int64_t stride, At at, float& lo,
                                      float& hi) {
  constexpr int kUnroll = 4;
  lo = INFINITY;
  hi = -INFINITY;
  for (std::int64_t k0 = first; k0 < count; k0 += kUnroll * stride) {
    float f[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t k = k0 + u * stride;
      f[u] = at(k < count ? k : k0);  // k0 < count: a repeat changes neither min nor max
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      lo = formulas::min_combine(lo, f[u]);
      hi = formulas::max_combine(hi, f[u]);
    }
  }
}

// min/max of two floats by one PTX instruction each (sm_80+: min.NaN /
// max.NaN). For every pair without NaN the same value as formulas::min_combine
// / max_combine, -0 below +0 included (checked on an H100 over the special
// values, 2026-11-24); a NaN operand gives the canonical NaN where the
// combines return the operand's own, so callers redo a share that saw a NaN
// with the combines. The combines cost about seven instructions a pair: the
// f32 reductions were instruction-bound on them (4096 rows of 16384: 0.100 ms
// with the combines, 0.093 with these).
__device__ __forceinline__ float fast_min(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float d;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return formulas::min_combine(a, b);
#endif
}
__device__ __forceinline__ float fast_max(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return formulas::max_combine(a, b);
#endif
}

// Which float4 vectors a thread reads: v[first + u * apart] for u < U (U
// loads in flight), then the same `step` further on, below nv.
struct VectorShare {
  std::int64_t first, apart, step;
};

// Block chunks (the partial kernels of a split channel): each pass a block
// reads U * blockDim consecutive vectors, a warp U runs of 512 contiguous
// bytes, and the grid moves on by gridDim of those. With U = 8 and a wave of
// resident blocks, per tensor over [8192, 8192] f32 on an H200: 0.0673 ms
// against 0.0697 for the library's kernel before (grid-stride, the U = 4
// loads a grid apart), 0.0681 for the grid-stride order with U = 8, 0.0682
// for U = 4 in block chunks (dev/cuda/minmax_per_tensor.cu; torch.aminmax
// 0.0700 in the same run).
template <int U>
__device__ inline VectorShare block_chunk_share() {
  return VectorShare{std::int64_t{blockIdx.x} * blockDim.x * U + threadIdx.x, blockDim.x,
                     std::int64_t{gridDim.x} * blockDim.x * U};
}

// This thread's min/max over its share of the float4 vectors v[0 .. nv), U
// loads in flight; kFast: by fast_min / fast_max.
template <bool kFast, int U>
__device__ __forceinline__ void vector_minmax(const float4* v, std::int64_t nv, VectorShare share, float& lo,
                                              float& hi) {
  const auto mn = [](float a, float b) { return kFast ? fast_min(a, b) : formulas::min_combine(a, b); };
  const auto mx = [](float a, float b) { return kFast ? fast_max(a, b) : formulas::max_combine(a, b); };
  lo = INFINITY;
  hi = -INFINITY;
  for (std::int64_t k0 = share.first; k0 < nv; k0 += share.step) {
    float4 f[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t k = k0 + u * share.apart;
      f[u] = v[k < nv ? k : k0];  // k0 < nv: a repeat changes neither min nor max
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      lo = mn(mn(lo, f[u].x), mn(f[u].y, f[u].z));
      lo = mn(lo, f[u].w);
      hi = mx(mx(hi, f[u].x), mx(f[u].y, f[u].z));
      hi = mx(hi, f[u].w);
    }
  }
}

// This thread's min/max over its share of channel ch of x viewed as
// [outer, channels, inner] (count = outer * inner elements per channel):
// elements first, first + stride, ...: `stride` threads together cover the
// channel. f32 in one aligned slice goes by float4 vectors instead: U loads
// in flight, in the grid-stride order of (first, stride) or, with
// kBlockChunks (first and stride then being the grid's), in block chunks.
template <class T, int U = 4, bool kBlockChunks = false>
__device__ inline void slice_minmax(const T* x, std::int64_t channels, std::int64_t inner, std::int64_t count,
                                    std::int64_t ch, std::int64_t first, std::int64_t stride, float& lo, float& hi) {
  // One outer slice (per tensor, or channels on axis 0) needs no division.
  const bool one_slice = count == inner;
  if constexpr (sizeof(T) == 4) {
    // f32 (the only 4-byte floating type) in one contiguous slice: 16-byte
    // loads (scalar loads reached 55% of the copy rate, limited by load
    // instructions), fast_min / fast_max; then the tail of < 4 elements.
    const T* base = x + ch * inner;
    if (one_slice && (reinterpret_cast<std::uintptr_t>(base) & 15u) == 0) {
      const std::int64_t nv = count / 4;
      const float4* v = reinterpret_cast<const float4*>(base);
      const VectorShare share = kBlockChunks ? block_chunk_share<U>() : VectorShare{first, stride, U * stride};
      vector_minmax<true, U>(v, nv, share, lo, hi);
      // A NaN seen: redo the share with the combines (their choice of NaN).
      if (lo != lo || hi != hi) vector_minmax<false, U>(v, nv, share, lo, hi);
      for (std::int64_t k = 4 * nv + first; k < count; k += stride) {
        lo = formulas::min_combine(lo, static_cast<float>(base[k]));
        hi = formulas::max_combine(hi, static_cast<float>(base[k]));
      }
      return;
    }
  }
  strided_minmax(
      first, count, stride,
      [&](std::int64_t k) {
        const std::int64_t o = one_slice ? 0 : k / inner, i = k - o * inner;
        return formulas::cast_value<float>(x[(o * channels + ch) * inner + i]);
      },
      lo, hi);
}

// Optional qparams (scale == nullptr: none), as observer_qparams computes them.
struct QparamsArgs {
  float* scale = nullptr;
  std::int32_t* zero_point = nullptr;
  std::int64_t qmin = 0, qmax = 0;
  bool symmetric = false;
  std::int32_t symmetric_zero_point = 0;
};

// The kernel-side view of `q` (none when q is null).
inline QparamsArgs qparams_args(const ObserverQparams* q) {
  QparamsArgs a;
  if (q) {
    a.scale = q->scale.data<float>();
    a.zero_point = q->zero_point.data<std::int32_t>();
    a.qmin = q->qmin;
    a.qmax = q->qmax;
    a.symmetric = q->symmetric;
    a.symmetric_zero_point = q->symmetric_zero_point;
  }
  return a;
}

// Min/max of this lane's values v[0 .. N) and then over the warp, every lane
// getting the result: warp_minmax's value by fast_min / fast_max. A NaN
// anywhere makes every lane's result NaN (the butterfly leaves one value in
// all lanes), and then the warp redoes it with the combines (a uniform
// branch), so a row with NaN returns the combines' NaN. The per-token row
// kernels were instruction-bound on the combines (dev/cuda/row_fq_forms.cu).
template <int N>
__device__ __forceinline__ void warp_minmax_values(const float (&v)[N], float& lo, float& hi) {
  float a = v[0], b = v[0];
#pragma unroll
  for (int k = 1; k < N; ++k) {
    a = fast_min(a, v[k]);
    b = fast_max(b, v[k]);
  }
#pragma unroll
  for (int w = 16; w > 0; w /= 2) {
    a = fast_min(a, __shfl_xor_sync(0xffffffffu, a, w));
    b = fast_max(b, __shfl_xor_sync(0xffffffffu, b, w));
  }
  if (a == a && b == b) {
    lo = a;
    hi = b;
    return;
  }
  lo = INFINITY;
  hi = -INFINITY;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    lo = formulas::min_combine(lo, v[k]);
    hi = formulas::max_combine(hi, v[k]);
  }
  warp_minmax(lo, hi);
}

// Thread 0: the running update of channel ch with the batch's (lo, hi),
// then its qparams.
__device__ inline void update_channel(std::int64_t ch, float lo, float hi, float* run_min, float* run_max, float c,
                                      bool moving, const QparamsArgs& q) {
  formulas::observer_update(run_min[ch], run_max[ch], lo, hi, c, moving);
  if (q.scale)
    formulas::observer_qparams(run_min[ch], run_max[ch], q.qmin, q.qmax, q.symmetric, q.symmetric_zero_point,
                               q.scale[ch], q.zero_point[ch]);
}

// The block combines channel ch's `parts` partial (min, max) pairs (read
// through L2: other blocks wrote them), then thread 0 updates the channel.
__device__ inline void finish_channel(const float* partial, std::int64_t parts, std::int64_t ch, float* run_min,
                                      float* run_max, float c, bool moving, const QparamsArgs& q) {
  float lo = INFINITY, hi = -INFINITY;
  for (std::int64_t k = threadIdx.x; k < parts; k += blockDim.x) {
    const std::int64_t slot = ch * parts + k;
    lo = formulas::min_combine(lo, __ldcg(partial + 2 * slot));
    hi = formulas::max_combine(hi, __ldcg(partial + 2 * slot + 1));
  }
  block_minmax(lo, hi);
  if (threadIdx.x == 0) update_channel(ch, lo, hi, run_min, run_max, c, moving, q);
}

// How many parts each channel's reduction is split into: enough blocks to
// fill the device across all channels, at most 1024 per channel.
unsigned minmax_parts(int device, std::int64_t channels, std::int64_t count);

}  // namespace qgrad::kernels::cuda
