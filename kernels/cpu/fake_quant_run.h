// The CPU's vectorised f32 fake quant of part of one mask block
// (kernels/cpu/quantize.cpp), for CPU kernels that fake-quantize values of
// their own before using them (the fused max pooling of kernels/pool.cpp).
// Declarations only: callers may be compiled by nvcc.
#pragma once

#include <cstdint>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/formulas/quantize.h"

namespace qgrad::kernels::cpu {

// Whether the vector form equals formulas::FakeQuantOp for these
// parameters: qmin - zp and qmax - zp within +-2^24 (its exactness bound;
// past it the caller takes the scalar formula).
inline bool fake_quant_vector_exact(const formulas::ChannelParams& p, std::int64_t qmin, std::int64_t qmax) {
  constexpr std::int64_t kLim = std::int64_t{1} << 24;
  return qmin - p.zp >= -kLim && qmax - p.zp <= kLim;
}

// y[k] = formulas::FakeQuantOp<float>'s value of x[k] for k in [begin, end)
// (x and y at a mask block's start, end <= 128), each k's mask bit or-ed into
// w in the block's layout (bit k >> 2 of word k & 3); with relu,
// formulas::FakeQuantReluOp's value and bit. Requires
// fake_quant_vector_exact(p, qmin, qmax).
void fake_quant_block_run_f32(const float* x, float* y, std::int64_t begin, std::int64_t end,
                              const formulas::ChannelParams& p, std::int64_t qmin, std::int64_t qmax,
                              std::uint32_t (&w)[kBitmaskWordsPerBlock], bool relu = false);

}  // namespace qgrad::kernels::cpu
