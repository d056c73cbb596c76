// Shared by the dev programs that call cuBLAS / cuBLASLt directly: a status
// check that exits, and an integer attribute of a cuBLASLt algorithm's
// configuration (tile, split-K count, reduction scheme, ...).
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define DEV_CHECK_BLAS(x)                                                 \
  do {                                                                    \
    const int s_ = static_cast<int>(x);                                   \
    if (s_ != 0) {                                                        \
      std::printf("cuBLAS status %d at %s:%d\n", s_, __FILE__, __LINE__); \
      std::exit(1);                                                       \
    }                                                                     \
  } while (0)

inline int config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  std::uint32_t v = 0;
  std::size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written);
  return static_cast<int>(v);
}
