// dev/cuda/minmax_per_tensor.cu: shapes of the per-tensor min/max reduction
// (the observer's batch range over one f32 tensor, 64M elements), against a
// literal copy of the library's kernel (kernels/cuda/observer.cu's
// partial_minmax_kernel with minmax_parts' grid) in the same run. llm.c
// style: every variant, its check and its benchmark in one file; not part of
// the library. Needs no library build (only headers):
//
//   nvcc -O3 -arch=sm_90 -std=c++20 --expt-relaxed-constexpr -I<dir holding qgrad/>
//        -DQGRAD_WITH_CUDA=1 dev/cuda/minmax_per_tensor.cu -o dev_minmax_per_tensor
//
// (it is also built as dev_minmax_per_tensor with the benchmarks). #16 item 4
// asks it at least as fast as torch.aminmax(x) over [8192, 8192]; the
// thirty-seventh session measured 0.0700 against 0.0698 ms, both at 93% of
// the copy rate.
//
// Variants, one launch each (partial min/max per block, the last block to
// finish combines them, as the library does):
//   T threads a block (256, 512), U 16-byte loads in flight a thread (4, 8),
//   the order of a thread's loads: "gs" grid-stride with the U loads a grid
//   apart (the library's), "gb" grid-stride over chunks of T * U vectors a
//   block (the U loads a block apart), "ct" one contiguous range a block;
//   cache hint: none, "na" (ld.global.nc.L1::no_allocate.L2::256B), "ef"
//   (the same with an L2::evict_first cache policy); B blocks: 1024, W x
//   the SMs or one wave of resident blocks.
// Every variant's (min, max) is compared with a host reference before it is
// timed (CUDA events around each launch, median of 50 after 5, two rounds).
// Output: JSON lines {"bench":"dev_minmax_per_tensor","impl":...,"ms":...,"gbs":...}.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "qgrad/kernels/cuda/minmax.cuh"

namespace {

namespace kc = qgrad::kernels::cuda;
namespace formulas = qgrad::formulas;

#define DEV_CHECK(call)                                                                     \
  do {                                                                                      \
    const cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

// Thread 0 stores the block's partial range; whether this block finished
// last (then it combines the partials; the others leave).
__device__ __forceinline__ bool publish_partial(float lo, float hi, float* partial, std::uint32_t* counters) {
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = lo;
    partial[2 * blockIdx.x + 1] = hi;
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(counters, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// ---- the library's kernel, copied (observer.cu), per tensor only ----
// (Before 2026-12-02 it read its vectors in the grid-stride order, four in
// flight, on 1024 blocks: the variant t256_u4_gs_b1024 but for the block
// reduction.) lib_unbounded: the same without its launch bounds (72
// registers, 3 blocks an SM, where the bounds give 46 and 5); lib_shuffle
// (below): its block reductions by warp shuffles.
template <int U>
__device__ __forceinline__ void lib_body(const float* x, std::int64_t count, float* partial, std::uint32_t* counters,
                                         float* out) {
  float lo, hi;
  kc::slice_minmax<float, U, true>(x, 1, count, count, 0, std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x,
                                   std::int64_t{gridDim.x} * blockDim.x, lo, hi);
  kc::block_minmax(lo, hi);
  if (!publish_partial(lo, hi, partial, counters)) return;
  kc::finish_channel(partial, gridDim.x, 0, out, out + 1, -1.0f, false, kc::QparamsArgs{});
  if (threadIdx.x == 0) counters[0] = 0;
}
__global__ void __launch_bounds__(kc::kMinmaxThreads, 5)
    lib_kernel(const float* x, std::int64_t count, float* partial, std::uint32_t* counters, float* out) {
  lib_body<8>(x, count, partial, counters, out);
}
__global__ void lib_unbounded_kernel(const float* x, std::int64_t count, float* partial, std::uint32_t* counters,
                                     float* out) {
  lib_body<8>(x, count, partial, counters, out);
}

// ---- the variants ----
enum Order { kGridStride, kGridBlocks, kContiguous };
enum Hint { kNone, kNoAllocate, kEvictFirst };

template <int H>
__device__ __forceinline__ float4 load4(const float4* p) {
  float4 r;
  if constexpr (H == kNone) {
    r = __ldg(p);
  } else if constexpr (H == kNoAllocate) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
                 : "l"(p));
  } else {
    // L2::evict_first on a 16-byte ld needs a cache policy operand (sm_90).
    std::uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
                 : "l"(p), "l"(policy));
  }
  return r;
}

template <bool kFast>
__device__ __forceinline__ void fold4(const float4& f, float& lo, float& hi) {
  const auto mn = [](float a, float b) { return kFast ? kc::fast_min(a, b) : formulas::min_combine(a, b); };
  const auto mx = [](float a, float b) { return kFast ? kc::fast_max(a, b) : formulas::max_combine(a, b); };
  lo = mn(mn(lo, f.x), mn(f.y, f.z));
  lo = mn(lo, f.w);
  hi = mx(mx(hi, f.x), mx(f.y, f.z));
  hi = mx(hi, f.w);
}

// This thread's range over its vectors in the variant's order.
template <int T, int U, int O, int H, bool kFast>
__device__ __forceinline__ void thread_range(const float4* v, std::int64_t nv, float& lo, float& hi) {
  lo = INFINITY;
  hi = -INFINITY;
  std::int64_t begin, end = nv, step, apart;
  if constexpr (O == kGridStride) {
    begin = std::int64_t{blockIdx.x} * T + threadIdx.x;
    apart = std::int64_t{gridDim.x} * T;
    step = apart * U;
  } else if constexpr (O == kGridBlocks) {
    begin = std::int64_t{blockIdx.x} * T * U + threadIdx.x;
    apart = T;
    step = std::int64_t{gridDim.x} * T * U;
  } else {
    const std::int64_t tile = std::int64_t{T} * U;
    const std::int64_t chunk = (nv + gridDim.x - 1) / gridDim.x;
    const std::int64_t per = (chunk + tile - 1) / tile * tile;
    begin = std::int64_t{blockIdx.x} * per + threadIdx.x;
    end = std::min(nv, std::int64_t{blockIdx.x} * per + per);
    apart = T;
    step = tile;
  }
  for (std::int64_t k0 = begin; k0 < end; k0 += step) {
    float4 f[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t k = k0 + u * apart;
      f[u] = load4<H>(v + (k < end ? k : k0));  // a repeat changes neither min nor max
    }
#pragma unroll
    for (int u = 0; u < U; ++u) fold4<kFast>(f[u], lo, hi);
  }
}

// Block range by warp shuffles (exact, order-free), every thread of warp 0 holding it.
template <int T>
__device__ __forceinline__ void block_range(float& lo, float& hi) {
  __shared__ float smin[T / 32], smax[T / 32];
  kc::warp_minmax(lo, hi);
  if (threadIdx.x % 32 == 0) {
    smin[threadIdx.x / 32] = lo;
    smax[threadIdx.x / 32] = hi;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    lo = threadIdx.x < T / 32 ? smin[threadIdx.x] : INFINITY;
    hi = threadIdx.x < T / 32 ? smax[threadIdx.x] : -INFINITY;
    kc::warp_minmax(lo, hi);
  }
}

// The block's range (this thread's share in lo, hi) to a partial; the last
// block combines the partials into out[0], out[1].
template <int T>
__device__ __forceinline__ void block_finish(float lo, float hi, float* partial, std::uint32_t* counters, float* out) {
  block_range<T>(lo, hi);
  if (!publish_partial(lo, hi, partial, counters)) return;
  lo = INFINITY;
  hi = -INFINITY;
  for (unsigned k = threadIdx.x; k < gridDim.x; k += T) {
    lo = formulas::min_combine(lo, __ldcg(partial + 2 * k));
    hi = formulas::max_combine(hi, __ldcg(partial + 2 * k + 1));
  }
  block_range<T>(lo, hi);
  if (threadIdx.x == 0) {
    out[0] = lo;
    out[1] = hi;
    counters[0] = 0;
  }
}

template <int T, int U, int O, int H>
__global__ void __launch_bounds__(T)
    variant_kernel(const float4* v, std::int64_t nv, float* partial, std::uint32_t* counters, float* out) {
  float lo, hi;
  thread_range<T, U, O, H, true>(v, nv, lo, hi);
  if (lo != lo || hi != hi) thread_range<T, U, O, H, false>(v, nv, lo, hi);
  block_finish<T>(lo, hi, partial, counters, out);
}

// The library's kernel with the variants' block reduction (warp shuffles,
// two barriers; block_minmax's shared-memory tree takes eight) for both the
// partial and the last block's combine.
__global__ void __launch_bounds__(kc::kMinmaxThreads, 5)
    lib_shuffle_kernel(const float* x, std::int64_t count, float* partial, std::uint32_t* counters, float* out) {
  constexpr int T = kc::kMinmaxThreads;
  float lo, hi;
  kc::slice_minmax<float, 8, true>(x, 1, count, count, 0, std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x,
                                   std::int64_t{gridDim.x} * blockDim.x, lo, hi);
  block_finish<T>(lo, hi, partial, counters, out);
}

__global__ void fill_kernel(float* x, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    // Values in about [-8, 8): a normal-like spread without special values.
    x[i] = (static_cast<float>(h >> 8) / 16777216.0f - 0.5f) * 16.0f;
  }
}

struct Variant {
  std::string name;
  void (*kernel)(const float4*, std::int64_t, float*, std::uint32_t*, float*);
  unsigned threads, blocks;
};

template <int T, int U, int O, int H>
Variant make(const char* order, const char* hint, unsigned blocks, const char* grid) {
  char name[96];
  std::snprintf(name, sizeof name, "t%d_u%d_%s%s%s_%s", T, U, order, *hint ? "_" : "", hint, grid);
  return Variant{name, variant_kernel<T, U, O, H>, T, blocks};
}

double median_ms(const std::vector<float>& v) {
  std::vector<float> s = v;
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace

int main() {
  const std::int64_t n = std::int64_t{8192} * 8192, nv = n / 4;
  int sms = 0;
  DEV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  DEV_CHECK(cudaGetDeviceProperties(&prop, 0));
  float* x = nullptr;
  float *partial = nullptr, *out = nullptr;
  std::uint32_t* counters = nullptr;
  DEV_CHECK(cudaMalloc(&x, n * sizeof(float)));
  DEV_CHECK(cudaMalloc(&partial, 2 * 65536 * sizeof(float)));
  DEV_CHECK(cudaMalloc(&out, 2 * sizeof(float)));
  DEV_CHECK(cudaMalloc(&counters, sizeof(std::uint32_t)));
  DEV_CHECK(cudaMemset(counters, 0, sizeof(std::uint32_t)));
  fill_kernel<<<4 * sms, 256>>>(x, n, 0x5eedu);
  DEV_CHECK(cudaGetLastError());
  std::vector<float> host(static_cast<std::size_t>(n));
  DEV_CHECK(cudaMemcpy(host.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost));
  float ref_lo = INFINITY, ref_hi = -INFINITY;
  for (float f : host) {
    ref_lo = formulas::min_combine(ref_lo, f);
    ref_hi = formulas::max_combine(ref_hi, f);
  }

  // The library's grid: minmax_parts(device, 1, n).
  int lib_per_sm = 0;
  DEV_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&lib_per_sm, lib_kernel, kc::kMinmaxThreads, 0));
  const std::int64_t wave = std::int64_t{sms} * 8 / 8 * std::max(lib_per_sm, 1);
  const unsigned lib_blocks =
      static_cast<unsigned>(std::clamp<std::int64_t>((n + 4095) / 4096, 1, std::min<std::int64_t>(wave, 1024)));

  // Grids: 1024 blocks (the library's cap), W x the SMs, or "wave": as many as are resident at once.
  const unsigned s = static_cast<unsigned>(sms);
  std::vector<Variant> vs = {
      make<256, 4, kGridStride, kNone>("gs", "", 1024, "b1024"),
      make<256, 4, kGridStride, kNone>("gs", "", 0, "wave"),
      make<256, 8, kGridStride, kNone>("gs", "", 0, "wave"),
      make<256, 4, kGridBlocks, kNone>("gb", "", 0, "wave"),
      make<256, 8, kGridBlocks, kNone>("gb", "", 0, "wave"),
      make<256, 4, kContiguous, kNone>("ct", "", 0, "wave"),
      make<256, 8, kContiguous, kNone>("ct", "", 0, "wave"),
      make<256, 4, kGridStride, kNoAllocate>("gs", "na", 1024, "b1024"),
      make<256, 4, kGridStride, kEvictFirst>("gs", "ef", 1024, "b1024"),
      make<256, 4, kGridBlocks, kNoAllocate>("gb", "na", 0, "wave"),
      make<256, 8, kGridBlocks, kNoAllocate>("gb", "na", 0, "wave"),
      make<256, 4, kContiguous, kNoAllocate>("ct", "na", 0, "wave"),
      make<256, 8, kContiguous, kNoAllocate>("ct", "na", 0, "wave"),
      make<256, 4, kGridBlocks, kEvictFirst>("gb", "ef", 0, "wave"),
      make<512, 4, kGridStride, kNone>("gs", "", 0, "wave"),
      make<512, 8, kGridBlocks, kNoAllocate>("gb", "na", 0, "wave"),
      make<256, 4, kGridStride, kNone>("gs", "", 16 * s, "w16"),
      make<256, 4, kGridBlocks, kNoAllocate>("gb", "na", 16 * s, "w16"),
      make<256, 8, kGridBlocks, kNoAllocate>("gb", "na", 2 * s, "w2"),
      make<256, 4, kGridBlocks, kNoAllocate>("gb", "na", 4 * s, "w4"),
  };
  for (Variant& v : vs) {
    if (v.blocks != 0) continue;
    int per_sm = 0;
    DEV_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.kernel, static_cast<int>(v.threads), 0));
    v.blocks = s * static_cast<unsigned>(std::max(per_sm, 1));
  }

  const auto check = [&](const char* name) {
    float got[2] = {0, 0};
    DEV_CHECK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    const bool ok = std::memcmp(&got[0], &ref_lo, 4) == 0 && std::memcmp(&got[1], &ref_hi, 4) == 0;
    std::printf("check %s: %s (%.9g, %.9g)\n", name, ok ? "ok" : "MISMATCH", got[0], got[1]);
    return ok;
  };
  // The variants write their range; the library's kernel folds it into the
  // running (min, max) (no averaging constant), which therefore starts empty.
  const auto poison = [&](bool running) {
    const float nan2[2] = {running ? INFINITY : NAN, running ? -INFINITY : NAN};
    DEV_CHECK(cudaMemcpy(out, nan2, sizeof nan2, cudaMemcpyHostToDevice));
  };
  const auto run_lib = [&] { lib_kernel<<<lib_blocks, kc::kMinmaxThreads>>>(x, n, partial, counters, out); };
  int unbounded_per_sm = 0;
  DEV_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&unbounded_per_sm, lib_unbounded_kernel,
                                                          kc::kMinmaxThreads, 0));
  const unsigned unbounded_blocks = static_cast<unsigned>(sms * std::max(unbounded_per_sm, 1));
  const auto run_shuffle = [&] { lib_shuffle_kernel<<<lib_blocks, kc::kMinmaxThreads>>>(x, n, partial, counters, out); };
  const auto run_unbounded = [&] {
    lib_unbounded_kernel<<<unbounded_blocks, kc::kMinmaxThreads>>>(x, n, partial, counters, out);
  };
  const auto run_variant = [&](const Variant& v) {
    v.kernel<<<v.blocks, v.threads>>>(reinterpret_cast<const float4*>(x), nv, partial, counters, out);
  };
  bool all_ok = true;
  poison(true);
  run_lib();
  DEV_CHECK(cudaDeviceSynchronize());
  all_ok &= check("lib");
  poison(true);
  run_unbounded();
  DEV_CHECK(cudaDeviceSynchronize());
  all_ok &= check("lib_unbounded");
  poison(true);
  run_shuffle();
  DEV_CHECK(cudaDeviceSynchronize());
  all_ok &= check("lib_shuffle");
  for (const Variant& v : vs) {
    poison(false);
    run_variant(v);
    DEV_CHECK(cudaDeviceSynchronize());
    all_ok &= check(v.name.c_str());
  }
  if (!all_ok) return 2;

  constexpr int kReps = 50, kWarm = 5;
  cudaEvent_t ev[2 * kReps];
  for (auto& e : ev) DEV_CHECK(cudaEventCreate(&e));
  const auto time = [&](auto&& launch) {
    for (int i = 0; i < kWarm; ++i) launch();
    for (int i = 0; i < kReps; ++i) {
      DEV_CHECK(cudaEventRecord(ev[2 * i]));
      launch();
      DEV_CHECK(cudaEventRecord(ev[2 * i + 1]));
    }
    DEV_CHECK(cudaDeviceSynchronize());
    DEV_CHECK(cudaGetLastError());
    std::vector<float> ms(kReps);
    for (int i = 0; i < kReps; ++i) DEV_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    return median_ms(ms);
  };
  const double bytes = static_cast<double>(n) * 4;
  const auto emit = [&](const std::string& impl, unsigned blocks, unsigned threads, int round, double ms) {
    std::printf(
        "{\"bench\":\"dev_minmax_per_tensor\",\"impl\":\"%s\",\"blocks\":%u,\"threads\":%u,\"round\":%d,"
        "\"ms\":%.5f,\"gbs\":%.1f,\"device\":\"%s\"}\n",
        impl.c_str(), blocks, threads, round, ms, bytes / (ms * 1e-3) / 1e9, prop.name);
  };
  for (int round = 1; round <= 2; ++round) {
    emit("lib", lib_blocks, kc::kMinmaxThreads, round, time(run_lib));
    emit("lib_unbounded", unbounded_blocks, kc::kMinmaxThreads, round, time(run_unbounded));
    emit("lib_shuffle", lib_blocks, kc::kMinmaxThreads, round, time(run_shuffle));
    for (const Variant& v : vs) emit(v.name, v.blocks, v.threads, round, time([&] { run_variant(v); }));
  }
  // The copy rate of the same bytes (read + write counted) for scale.
  float* copy_dst = nullptr;
  DEV_CHECK(cudaMalloc(&copy_dst, n * sizeof(float)));
  const double copy_ms = time([&] { DEV_CHECK(cudaMemcpyAsync(copy_dst, x, n * sizeof(float), cudaMemcpyDeviceToDevice)); });
  std::printf("{\"bench\":\"dev_minmax_per_tensor\",\"impl\":\"copy\",\"ms\":%.5f,\"gbs\":%.1f}\n", copy_ms,
              2 * bytes / (copy_ms * 1e-3) / 1e9);
  DEV_CHECK(cudaFree(copy_dst));
  for (auto& e : ev) cudaEventDestroy(e);
  return 0;
}
