// Counter-based random numbers: the value for element i of a draw is a
// pure function of (seed, offset + i), so CPU and CUDA agree.
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"

namespace qgrad::formulas {

// SplitMix64 finaliser over the counter, keyed by the seed.
QGRAD_HD std::uint64_t random_bits(std::uint64_t seed, std::uint64_t counter) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + counter * 0xbf58476d1ce4e5b9ULL + 0x94d049bb133111ebULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform double in [0, 1) with 53 random bits.
QGRAD_HD double random_uniform(std::uint64_t seed, std::uint64_t counter) {
  return static_cast<double>(random_bits(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace qgrad::formulas
