// Shared benchmark machinery: device-side timing with CUDA events, warm-up,
// median of many repetitions, inputs rotated past the L2 cache, and a
// JSON-lines record per measurement (merged into docs/benchmarks.md by
// scripts/bench_table.py).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "qgrad/qgrad.h"

#if QGRAD_WITH_CUDA
#include <cuda_runtime.h>

#include "qgrad/core/cuda/common.cuh"
#endif

namespace qgrad::bench {

struct Timing {
  double median_ms = 0, min_ms = 0;
  int reps = 0;
};

// Times `work(rep)` on the device's stream: `warmup` untimed calls, then
// `reps` calls each bracketed by events; returns the median. `rep` lets the
// caller rotate among input sets larger than L2.
inline Timing time_cuda(const std::function<void(int)>& work, int reps = 50, int warmup = 5) {
  Timing t;
#if QGRAD_WITH_CUDA
  cudaStream_t s = qgrad::cuda::stream(0);
  for (int i = 0; i < warmup; ++i) work(i);
  std::vector<cudaEvent_t> ev(static_cast<std::size_t>(2 * reps));
  for (auto& e : ev) QGRAD_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    QGRAD_CUDA_CHECK(cudaEventRecord(ev[static_cast<std::size_t>(2 * i)], s));
    work(i);
    QGRAD_CUDA_CHECK(cudaEventRecord(ev[static_cast<std::size_t>(2 * i + 1)], s));
  }
  QGRAD_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    float m = 0;
    QGRAD_CUDA_CHECK(cudaEventElapsedTime(&m, ev[static_cast<std::size_t>(2 * i)], ev[static_cast<std::size_t>(2 * i + 1)]));
    ms.push_back(m);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  t.median_ms = ms[ms.size() / 2];
  t.min_ms = ms.front();
  t.reps = reps;
#else
  (void)work;
  (void)reps;
  (void)warmup;
#endif
  return t;
}

// Device-to-device copy bandwidth (read + write bytes per second) over
// `bytes` of data: the ceiling for memory-bound kernels, measured in the
// same run as the kernels it judges.
inline double copy_bandwidth_gbs(std::size_t bytes) {
#if QGRAD_WITH_CUDA
  Generator g(0xb0);
  Tensor a = rand({static_cast<std::int64_t>(bytes / 4)}, g, TensorOptions{}.with_device(Device::cuda()));
  Tensor b = empty_like(a);
  // The driver's own device-to-device copy, not qgrad's copy kernel: the
  // ceiling comes from outside the code it judges.
  Timing t = time_cuda(
      [&](int) {
        QGRAD_CUDA_CHECK(cudaMemcpyAsync(b.data_ptr(), a.data_ptr(), bytes / 4 * 4, cudaMemcpyDeviceToDevice,
                                         qgrad::cuda::stream(0)));
      },
      30, 3);
#else
  Timing t;
  t.median_ms = 1;
#endif
  return 2.0 * static_cast<double>(bytes) / (t.median_ms * 1e-3) / 1e9;
}

// One result line: {"bench": ..., "case": ..., "ms": ..., "gbs": ..., ...}
inline void emit(const std::string& json_line) {
  std::printf("%s\n", json_line.c_str());
  std::fflush(stdout);
}

// Whether two tensors (any devices) hold the same bytes: the dev programs'
// check of a variant against the library.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.cpu(), hb = b.cpu();
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

// A dev program's row of a memory-bound variant: {"bench", ["case",] "impl",
// "ms", "min_ms", "gbs", "frac_copy"} (kase null: no "case").
inline void memory_row(const char* bench, const char* kase, const char* impl, const Timing& t, double bytes,
                       double copy_gbs) {
  const double gbs = bytes / (t.median_ms * 1e-3) / 1e9;
  char case_field[160] = "";
  if (kase != nullptr) std::snprintf(case_field, sizeof case_field, "\"case\":\"%s\",", kase);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"bench\":\"%s\",%s\"impl\":\"%s\",\"ms\":%.4f,\"min_ms\":%.4f,\"gbs\":%.1f,\"frac_copy\":%.3f}",
                bench, case_field, impl, t.median_ms, t.min_ms, gbs, gbs / copy_gbs);
  emit(buf);
}

}  // namespace qgrad::bench
