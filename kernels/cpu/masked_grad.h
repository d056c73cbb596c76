// The gradient through a saved mask (kernels/bitmask.h) on the CPU in f32, a
// mask block of 128 elements at a time: bit l of the block's word k is
// element 4 l + k, so one shift of the block's four words gives the bits of
// four consecutive elements (SSE2, in every x86-64 CPU; sixteen with AVX-512,
// kernels/cpu/simd.h) instead of one branch per element. Each lane is the
// scalar formula's one IEEE operation, so the bits are the per-element
// loop's (kernels/activation.cpp's ReluBackward, formulas::FakeQuantGradOp)
// and CUDA's. Compiled by the C++ compiler only (kernels/cpu/masked_grad.cpp).
#pragma once

#include <cstdint>

namespace qgrad::kernels::cpu {

enum class MaskedGrad {
  select,    // d = bit ? g : +0 (relu's backward)
  multiply,  // d = g * (bit ? 1 : 0) (a fake quant's straight-through backward: -0 and NaN kept)
};

// d[i] for i < n from g[i] and bit i of `words`; d may be g.
void masked_grad_f32(MaskedGrad mode, const float* g, const std::uint32_t* words, float* d, std::int64_t n);

}  // namespace qgrad::kernels::cpu
