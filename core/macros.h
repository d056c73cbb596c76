// Portability macros shared by host and device code.
#pragma once

#if defined(__CUDACC__)
#define QGRAD_HD __host__ __device__ __forceinline__
#define QGRAD_DEVICE_CODE 1
#else
#define QGRAD_HD inline
#define QGRAD_DEVICE_CODE 0
#endif

// Unrolls the constant-trip loop that follows in device code (nvcc's device
// pass); the host compilers decide for themselves (GCC, nvcc's host pass
// included, would warn at `#pragma unroll`).
#if defined(__CUDA_ARCH__)
#define QGRAD_UNROLL _Pragma("unroll")
#else
#define QGRAD_UNROLL
#endif
