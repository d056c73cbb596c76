// The 16-bit tensor-core product shared by the kernels that issue it
// directly (lowbit_linear.cu's W4A16 GEMV, attention.cu's 16-bit
// packed_attention): mma.sync m16n8k16 with f32 accumulators, and the packing
// of two floats into one operand register.
//
// Fragments (PTX ISA, "mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A (16 x 16, row major): a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g, 2t+8..), a3 = (g + 8, 2t+8..)
//   B (16 x 8, k x n):      b0 = (k = 2t..2t+1, n = g), b1 = (k = 2t+8..2t+9, n = g)
//   C (16 x 8, f32):        c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..2t+1)
// each register's lower half the lower index.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "qgrad/core/half.h"

namespace qgrad::kernels::cuda {

template <class T> struct Mma;
template <> struct Mma<bfloat16> {
  // Two floats as a bf16x2 register, low half first (round to nearest even).
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
  // c += a * b.
  static __device__ __forceinline__ void run(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                             std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<half> {
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
  static __device__ __forceinline__ void run(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                             std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

}  // namespace qgrad::kernels::cuda
