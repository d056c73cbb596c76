// The bit-packed in-range mask that quantization ops save for backward:
// one bit per element, 1/32 of an f32 activation.
//
// Layout (shared by the CPU and CUDA kernels, so the two write the same
// words): elements are taken in blocks of 128; block b owns the 4 words
// 4b .. 4b+3, and element 128b + 4l + k (l in [0, 32), k in [0, 4)) is
// bit l of word 4b + k. On CUDA a warp handles one block, each lane four
// consecutive elements (one 16-byte load for f32), and word 4b + k is one
// __ballot_sync over the lanes' k-th element: no atomics, no shuffles.
// Bits past the end of the tensor are 0.
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"

namespace qgrad::kernels::qmask {

inline constexpr std::int64_t kBlock = 128;        // elements per block
inline constexpr std::int64_t kWordsPerBlock = 4;  // 32-bit words per block

// Blocks covering n elements.
QGRAD_HD std::int64_t blocks(std::int64_t n) { return (n + kBlock - 1) / kBlock; }
// 32-bit words of the mask of n elements.
QGRAD_HD std::int64_t words(std::int64_t n) { return blocks(n) * kWordsPerBlock; }
// Bytes of the mask of n elements (what a node saves).
inline std::int64_t bytes(std::int64_t n) { return words(n) * 4; }

// Word index and bit of element i.
QGRAD_HD std::int64_t word_of(std::int64_t i) { return (i / kBlock) * kWordsPerBlock + (i & 3); }
QGRAD_HD unsigned bit_of(std::int64_t i) { return static_cast<unsigned>((i % kBlock) >> 2); }

QGRAD_HD bool test(const std::uint32_t* mask, std::int64_t i) { return (mask[word_of(i)] >> bit_of(i)) & 1u; }

}  // namespace qgrad::kernels::qmask
