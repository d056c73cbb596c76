// The gradient through a saved mask (kernels/bitmask.h) on the CPU in f32, a
// mask block of 128 elements at a time: bit l of the block's word k is
// element 4 l + k, so one shift of the block's four words gives the bits of
// four consecutive elements, and the gradient is written four lanes at a
// time (SSE2, in every x86-64 CPU) instead of one branch per element. Each
// lane is the scalar formula's one IEEE operation, so the bits are the
// per-element loop's (kernels/activation.cpp's ReluBackward, formulas::
// FakeQuantGradOp) and CUDA's.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cpu/parallel.h"

namespace qgrad::kernels::cpu {

enum class MaskedGrad {
  select,    // d = bit ? g : +0 (relu's backward)
  multiply,  // d = g * (bit ? 1 : 0) (a fake quant's straight-through backward: -0 and NaN kept)
};

template <MaskedGrad kMode>
inline float masked_grad_scalar(float g, bool bit) {
  if constexpr (kMode == MaskedGrad::select) return bit ? g : 0.0f;
  else return g * (bit ? 1.0f : 0.0f);
}

// d[i] for i < n from g[i] and bit i of `words`; d may be g.
template <MaskedGrad kMode>
void masked_grad_f32(const float* g, const std::uint32_t* words, float* d, std::int64_t n) {
  parallel_for(
      bitmask_blocks(n),
      [&](std::int64_t b) {
        const std::int64_t base = b * kBitmaskBlock, len = std::min(kBitmaskBlock, n - base);
        const std::uint32_t* w = words + b * kBitmaskWordsPerBlock;
#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
        if (len == kBitmaskBlock) {
          const __m128i wv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w)), one = _mm_set1_epi32(1);
          for (int l = 0; l < 32; ++l) {
            const __m128i bits = _mm_and_si128(_mm_srl_epi32(wv, _mm_cvtsi32_si128(l)), one);
            const __m128 gv = _mm_loadu_ps(g + base + 4 * l);
            __m128 r;
            if constexpr (kMode == MaskedGrad::select) r = _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(bits, one)), gv);
            else r = _mm_mul_ps(gv, _mm_cvtepi32_ps(bits));
            _mm_storeu_ps(d + base + 4 * l, r);
          }
          return;
        }
#endif
        for (std::int64_t i = 0; i < len; ++i)
          d[base + i] = masked_grad_scalar<kMode>(g[base + i], ((w[i & 3] >> (i >> 2)) & 1u) != 0);
      },
      kParallelGrain / kBitmaskBlock);
}

}  // namespace qgrad::kernels::cpu
