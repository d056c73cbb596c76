// Portability macros shared by host and device code.
#pragma once

#if defined(__CUDACC__)
#define QGRAD_HD __host__ __device__ __forceinline__
#define QGRAD_DEVICE_CODE 1
#else
#define QGRAD_HD inline
#define QGRAD_DEVICE_CODE 0
#endif
