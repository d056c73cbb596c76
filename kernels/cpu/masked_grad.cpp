#include "qgrad/kernels/cpu/masked_grad.h"

#include <algorithm>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/cpu/simd.h"

namespace qgrad::kernels::cpu {

namespace {

float masked_grad_scalar(MaskedGrad mode, float g, bool bit) {
  return mode == MaskedGrad::select ? (bit ? g : 0.0f) : g * (bit ? 1.0f : 0.0f);
}

#if QGRAD_CPU_AVX512
// One whole block sixteen lanes a step: elements 4 l ... 4 l + 15 are bits
// l + e / 4 of words e % 4 (the block's four words repeated in each 128-bit
// lane, each shifted by its own count).
QGRAD_TARGET_AVX512 void masked_block16(MaskedGrad mode, const float* g, const std::uint32_t* w, float* d) {
  const __m512i words = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  const __m512i quarter = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), one = _mm512_set1_epi32(1);
  for (int l = 0; l < 32; l += 4) {
    const __m512i shift = _mm512_add_epi32(quarter, _mm512_set1_epi32(l));
    const __m512i bits = _mm512_and_si512(_mm512_srlv_epi32(words, shift), one);
    const __m512 gv = _mm512_loadu_ps(g + 4 * l);
    const __m512 r = mode == MaskedGrad::select ? _mm512_maskz_mov_ps(_mm512_test_epi32_mask(bits, one), gv)
                                                : _mm512_mul_ps(gv, _mm512_cvtepi32_ps(bits));
    _mm512_storeu_ps(d + 4 * l, r);
  }
}
#endif

// One whole block four lanes a step.
void masked_block4(MaskedGrad mode, const float* g, const std::uint32_t* w, float* d) {
#if defined(__SSE2__)
  const __m128i wv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w)), one = _mm_set1_epi32(1);
  for (int l = 0; l < 32; ++l) {
    const __m128i bits = _mm_and_si128(_mm_srl_epi32(wv, _mm_cvtsi32_si128(l)), one);
    const __m128 gv = _mm_loadu_ps(g + 4 * l);
    const __m128 r = mode == MaskedGrad::select ? _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(bits, one)), gv)
                                                : _mm_mul_ps(gv, _mm_cvtepi32_ps(bits));
    _mm_storeu_ps(d + 4 * l, r);
  }
#else
  for (int i = 0; i < kBitmaskBlock; ++i) d[i] = masked_grad_scalar(mode, g[i], ((w[i & 3] >> (i >> 2)) & 1u) != 0);
#endif
}

}  // namespace

void masked_grad_f32(MaskedGrad mode, const float* g, const std::uint32_t* words, float* d, std::int64_t n) {
  const bool wide = use_avx512();
  parallel_for(
      bitmask_blocks(n),
      [&](std::int64_t b) {
        const std::int64_t base = b * kBitmaskBlock, len = std::min(kBitmaskBlock, n - base);
        const std::uint32_t* w = words + b * kBitmaskWordsPerBlock;
        if (len == kBitmaskBlock) {
#if QGRAD_CPU_AVX512
          if (wide) return masked_block16(mode, g + base, w, d + base);
#endif
          return masked_block4(mode, g + base, w, d + base);
        }
        for (std::int64_t i = 0; i < len; ++i)
          d[base + i] = masked_grad_scalar(mode, g[base + i], ((w[i & 3] >> (i >> 2)) & 1u) != 0);
      },
      kParallelGrain / kBitmaskBlock);
}

}  // namespace qgrad::kernels::cpu
