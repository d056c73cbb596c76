// Bit-packed masks: one bit per element, 32 elements per uint32 word
// (element i lives in word i / 32, bit i % 32). Used where a backward needs
// only a predicate of its input (relu: x > 0; fake-quant: inside the clamp
// range), at 1/32 of an f32 tensor's memory.
//
// A mask lives in an s32 tensor of bitmask_words(n) elements (qgrad has no
// u32 dtype; the words are reinterpreted). Writers own whole words: on the
// CPU one loop iteration packs one word; on CUDA one warp packs one word
// with a ballot (bitmask_ballot_store), so no atomics are needed.
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"

namespace qgrad {

QGRAD_HD std::int64_t bitmask_words(std::int64_t n) { return (n + 31) / 32; }

QGRAD_HD bool bitmask_get(const std::uint32_t* words, std::int64_t i) {
  return ((words[i >> 5] >> static_cast<unsigned>(i & 31)) & 1u) != 0;
}

// Sets or clears bit i. Not atomic: the caller must own word i / 32.
QGRAD_HD void bitmask_set(std::uint32_t* words, std::int64_t i, bool bit) {
  const std::uint32_t m = 1u << static_cast<unsigned>(i & 31);
  words[i >> 5] = bit ? (words[i >> 5] | m) : (words[i >> 5] & ~m);
}

// Packs word w of a mask over n elements from pred(i) (host or device; one
// caller per word). Bits past n are zero.
template <class Pred>
QGRAD_HD std::uint32_t bitmask_pack_word(std::int64_t w, std::int64_t n, Pred pred) {
  std::uint32_t word = 0;
  const std::int64_t base = w * 32;
  for (int b = 0; b < 32 && base + b < n; ++b)
    if (pred(base + b)) word |= 1u << static_cast<unsigned>(b);
  return word;
}

#if defined(__CUDACC__)
// Device: called by all 32 lanes of a full warp for 32 consecutive indices
// starting at a multiple of 32 (i = that base + lane). Lane 0 stores the word;
// indices >= n contribute a zero bit and a word past the mask is not written.
__device__ __forceinline__ void bitmask_ballot_store(std::uint32_t* words, std::int64_t i, std::int64_t n,
                                                     bool bit) {
  const unsigned word = __ballot_sync(0xffffffffu, bit && i < n);
  if ((threadIdx.x & 31u) == 0 && i < n) words[i >> 5] = word;
}
#endif

}  // namespace qgrad
