// The saved mask: one bit per element, the predicate a backward needs of
// its input (relu: x > 0; fake quantize and quantize: inside the clamp
// range), at 1/32 of an f32 tensor's memory. One format for every op that
// saves one, written identically by the CPU and CUDA kernels.
//
// Layout: elements are taken in blocks of 128; block b owns the 4 words
// 4b .. 4b+3, and element 128b + 4l + k (l in [0, 32), k in [0, 4)) is bit
// l of word 4b + k. So a CUDA warp that handles one block, each lane four
// consecutive elements (one 16-byte load for f32), builds word 4b + k with
// one __ballot_sync over the lanes' k-th element: no atomics, no shuffles.
// A mask lives in an s32 tensor of bitmask_words(n) elements (qgrad has no
// u32 dtype; the words are reinterpreted). Bits past the end of the tensor
// are 0.
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"

namespace qgrad {

inline constexpr std::int64_t kBitmaskBlock = 128;        // elements per block
inline constexpr std::int64_t kBitmaskWordsPerBlock = 4;  // 32-bit words per block

// Blocks covering n elements.
QGRAD_HD std::int64_t bitmask_blocks(std::int64_t n) { return (n + kBitmaskBlock - 1) / kBitmaskBlock; }
// 32-bit words of the mask of n elements.
QGRAD_HD std::int64_t bitmask_words(std::int64_t n) { return bitmask_blocks(n) * kBitmaskWordsPerBlock; }

// Word index and bit of element i.
QGRAD_HD std::int64_t bitmask_word_of(std::int64_t i) {
  return (i / kBitmaskBlock) * kBitmaskWordsPerBlock + (i & 3);
}
QGRAD_HD unsigned bitmask_bit_of(std::int64_t i) { return static_cast<unsigned>((i % kBitmaskBlock) >> 2); }

QGRAD_HD bool bitmask_get(const std::uint32_t* words, std::int64_t i) {
  return ((words[bitmask_word_of(i)] >> bitmask_bit_of(i)) & 1u) != 0;
}

// Sets or clears bit i. Not atomic: the caller must own word bitmask_word_of(i).
QGRAD_HD void bitmask_set(std::uint32_t* words, std::int64_t i, bool bit) {
  const std::uint32_t m = 1u << bitmask_bit_of(i);
  const std::int64_t w = bitmask_word_of(i);
  words[w] = bit ? (words[w] | m) : (words[w] & ~m);
}

// Packs word w of a mask over n elements from pred(i) (host or device; one
// caller per word). Bits past n are zero.
template <class Pred>
QGRAD_HD std::uint32_t bitmask_pack_word(std::int64_t w, std::int64_t n, Pred pred) {
  std::uint32_t word = 0;
  const std::int64_t first = (w / kBitmaskWordsPerBlock) * kBitmaskBlock + (w % kBitmaskWordsPerBlock);
  for (int l = 0; l < 32; ++l) {
    const std::int64_t i = first + 4 * l;
    if (i < n && pred(i)) word |= 1u << static_cast<unsigned>(l);
  }
  return word;
}

#if defined(__CUDACC__)
// Device, for kernels whose warps take 32 consecutive elements: called by
// all 32 lanes of a full warp for the indices i = base + lane (base a
// multiple of 32, below bitmask_words(n) * 32). One ballot; the run's 32
// bits are one byte of each of the block's 4 words (bits l0 .. l0 + 7,
// l0 = (base % 128) / 4), which lanes 0..3 store: no atomics. Indices >= n
// contribute a zero bit.
__device__ __forceinline__ void bitmask_ballot_store(std::uint32_t* words, std::int64_t i, std::int64_t n,
                                                     bool bit) {
  const unsigned v = __ballot_sync(0xffffffffu, bit && i < n);
  const unsigned lane = threadIdx.x & 31u;
  if (lane < 4) {
    const std::int64_t base = i - lane;
    unsigned byte = 0;
#pragma unroll
    for (unsigned m = 0; m < 8; ++m) byte |= ((v >> (4 * m + lane)) & 1u) << m;
    auto* bytes = reinterpret_cast<std::uint8_t*>(words + (base / kBitmaskBlock) * kBitmaskWordsPerBlock + lane);
    bytes[(base % kBitmaskBlock) / 32] = static_cast<std::uint8_t>(byte);
  }
}
#endif

}  // namespace qgrad
