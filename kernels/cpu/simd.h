// The CPU kernels' vector paths chosen at run time: the library is built for
// the x86-64 baseline (SSE2), and the few f32 loops a training step spends
// its elementwise time in (fake quant, the observer's min/max, the masked
// gradients, SGD) have an AVX-512 variant, compiled with a target attribute
// and taken where the CPU has AVX-512 (F, BW, DQ, VL) and BMI2. Every lane
// is the same IEEE operation as the scalar formula (contraction is off for
// the whole library), so the paths give the same bits; tests run both
// (allow_avx512(false) forces the baseline).
#pragma once

#include <atomic>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define QGRAD_CPU_AVX512 1
#define QGRAD_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,bmi,bmi2")))
// GCC 12/13 report false (maybe-)uninitialized warnings inside the AVX-512
// intrinsic headers; the state at the header's own lines is what counts.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#define QGRAD_CPU_AVX512 0
#define QGRAD_TARGET_AVX512
#endif

namespace qgrad::kernels::cpu {

inline std::atomic<bool>& avx512_allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

// Whether the AVX-512 variants run: the CPU has the features and they are allowed.
inline bool use_avx512() {
#if QGRAD_CPU_AVX512
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("bmi2");
  return supported && avx512_allowed().load(std::memory_order_relaxed);
#else
  return false;
#endif
}

// Tests: false forces the baseline paths, true restores the run-time choice.
inline void allow_avx512(bool allowed) { avx512_allowed().store(allowed, std::memory_order_relaxed); }

}  // namespace qgrad::kernels::cpu
