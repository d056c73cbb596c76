// Scalar formulas of the int4 linear layers (ops/lowbit_linear.h), shared by
// the CPU and CUDA kernels (kernels/cpu/lowbit_linear.cpp,
// kernels/cuda/lowbit_linear.cu). The build has no FMA contraction, so every
// product and sum below rounds once, identically on both devices.
#pragma once

#include <cstdint>

#include "qgrad/core/float8.h"  // nibble_get
#include "qgrad/core/half.h"

namespace qgrad::formulas {

// The integer value of nibble u (0..15) of an s4 (two's complement) or u4 weight.
QGRAD_HD int int4_value(unsigned u, bool is_signed) {
  return is_signed ? static_cast<int>(u ^ 8u) - 8 : static_cast<int>(u);
}

// W4A16's dequantized weight: T((q - zp) * s), the f32 product rounded once
// to the activation dtype T (dequantize_int4's value for a T output).
template <class T>
QGRAD_HD T w4a16_weight(int q_minus_zp, float scale) {
  return T(static_cast<float>(q_minus_zp) * scale);
}

// The fragment order of pack_w4a16 (ops/lowbit_linear.h), the layout the
// CUDA split-K GEMV reads with 512 contiguous bytes a warp instruction and
// no shuffle of x. Units of 16 output channels x 128 input channels (1024
// bytes), channel blocks outer, column blocks inner; N padded to a multiple
// of 32 and K to a multiple of 128 with zero nibbles. In a unit, half h
// (channels 8h .. 8h + 7) takes 512 bytes, and in it lane l = 4g + t (the
// mma lane of row g, k group t) 16 bytes: channel 8h + g, columns 32t .. 32t
// + 31. In each 32-bit word (8 columns c .. c + 7) nibble i holds column c +
// 2i and nibble i + 4 column c + 2i + 1 (i < 4), so that the dequantizing
// LOP3 of nibbles i and i + 4 gives the pair (c + 2i, c + 2i + 1), which is
// x's own order (the plain order's pairs (c + i, c + i + 4) need x shuffled).
inline constexpr std::int64_t kW4a16FragUnitBytes = 1024;
QGRAD_HD std::int64_t w4a16_frag_rows(std::int64_t N) { return (N + 31) / 32 * 32; }
QGRAD_HD std::int64_t w4a16_frag_cols(std::int64_t K) { return (K + 127) / 128 * 128; }
QGRAD_HD std::int64_t w4a16_frag_bytes(std::int64_t N, std::int64_t K) {
  return w4a16_frag_rows(N) * w4a16_frag_cols(K) / 2;
}
// Chunk c (16 bytes at c * 16) of the layout: its channel and first column.
struct W4a16FragChunk {
  std::int64_t n, k;
};
QGRAD_HD W4a16FragChunk w4a16_frag_chunk(std::int64_t c, std::int64_t K) {
  const std::int64_t lane = c % 32, half = (c / 32) % 2, unit = c / 64, col_blocks = w4a16_frag_cols(K) / 128;
  return {(unit / col_blocks) * 16 + half * 8 + lane / 4, (unit % col_blocks) * 128 + (lane % 4) * 32};
}
// A 32-bit word of 8 columns from the plain order (column c + j in nibble j)
// to the fragment order, and back.
QGRAD_HD std::uint32_t w4a16_frag_word(std::uint32_t plain) {
  std::uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= ((plain >> (8 * i)) & 0xfu) << (4 * i) | ((plain >> (8 * i + 4)) & 0xfu) << (4 * i + 16);
  return r;
}
QGRAD_HD std::uint32_t w4a16_plain_word(std::uint32_t frag) {
  std::uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= ((frag >> (4 * i)) & 0xfu) << (8 * i) | ((frag >> (4 * i + 16)) & 0xfu) << (8 * i + 4);
  return r;
}
// Chunk c's four words from the plain weight w ([N, K] packed, K / 2 bytes
// a row; byte reads: rows need not be 4-byte aligned), zeros past N and K;
// and back (nothing written past N and K).
QGRAD_HD void w4a16_frag_gather(const std::uint8_t* w, std::int64_t N, std::int64_t K, std::int64_t c,
                                std::uint32_t (&word)[4]) {
  const W4a16FragChunk at = w4a16_frag_chunk(c, K);
  for (int j = 0; j < 4; ++j) {
    std::uint32_t plain = 0;
    for (int b = 0; b < 4; ++b) {
      const std::int64_t kb = at.k / 2 + 4 * j + b;
      if (at.n < N && kb < K / 2) plain |= static_cast<std::uint32_t>(w[at.n * (K / 2) + kb]) << (8 * b);
    }
    word[j] = w4a16_frag_word(plain);
  }
}
QGRAD_HD void w4a16_frag_scatter(const std::uint32_t (&word)[4], std::int64_t N, std::int64_t K, std::int64_t c,
                                 std::uint8_t* w) {
  const W4a16FragChunk at = w4a16_frag_chunk(c, K);
  if (at.n >= N) return;
  for (int j = 0; j < 4; ++j) {
    const std::uint32_t plain = w4a16_plain_word(word[j]);
    for (int b = 0; b < 4; ++b) {
      const std::int64_t kb = at.k / 2 + 4 * j + b;
      if (kb < K / 2) w[at.n * (K / 2) + kb] = static_cast<std::uint8_t>(plain >> (8 * b));
    }
  }
}

// W4A8: one group's term, float(acc) * (sa * sw), in f32 (quantized_linear's
// epilogue, formulas::qlinear_epilogue<float>, for one group). The output is
// term(g = 0) + term(1) + ... in increasing g (the first term is not added
// to a zero, so a lone group gives qlinear_epilogue's bits), then + bias.
QGRAD_HD float w4a8_group_term(std::int32_t acc, float sa, float sw) { return static_cast<float>(acc) * (sa * sw); }

}  // namespace qgrad::formulas
