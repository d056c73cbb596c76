// The elementwise engine's device pieces (the engine's shape: quantize.cu):
// a lane's four elements of a 128-element mask block loaded, the op applied
// and stored with the block's mask words, and a warp's run over a range of
// mask blocks. Shared by the engine's kernels (quantize.cu), the observe +
// fake quantize kernels (quantize_observe.cu) and the dynamic rows' loads
// (quantize_rows.cu): three files, so that a build compiles their kernels in
// parallel (as one file they were a library build's longest step by far).
#pragma once

#include <cstdint>
#include <type_traits>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/kernels/layout.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels::cuda {

// Loads the four elements of lane `lane` in mask block b.
template <class In, bool kVec>
__device__ __forceinline__ void engine_load(const In* __restrict__ in, std::int64_t b, unsigned lane, std::int64_t n,
                                            In (&v)[4]) {
  const std::int64_t i0 = b * kBitmaskBlock + 4 * static_cast<std::int64_t>(lane);
  if (kVec && i0 + 3 < n) {
    const Vec4<In> w = *reinterpret_cast<const Vec4<In>*>(in + i0);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = w.v[k];
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = i0 + k < n ? in[i0 + k] : In{};
  }
}

// Applies op to the loaded elements of mask block b and stores the results
// (and the block's mask words, built by ballots).
template <class Op, bool kVec>
__device__ __forceinline__ void engine_finish(const Op& op, const typename Op::In (&v)[4],
                                              typename Op::Out* __restrict__ out,
                                              const std::uint32_t* __restrict__ mask_in,
                                              std::uint32_t* __restrict__ mask_out, std::int64_t b, unsigned lane,
                                              std::int64_t n, const ChannelIndexer& map,
                                              const formulas::ParamSource& ps, bool same4) {
  using Out = typename Op::Out;
  const std::int64_t i0 = b * kBitmaskBlock + 4 * static_cast<std::int64_t>(lane);
  const bool full = i0 + 3 < n;
  bool bit_in[4] = {false, false, false, false};
  if constexpr (Op::kReadsMask) {
    const uint4 w = *reinterpret_cast<const uint4*>(mask_in + b * kBitmaskWordsPerBlock);
    bit_in[0] = (w.x >> lane) & 1u;
    bit_in[1] = (w.y >> lane) & 1u;
    bit_in[2] = (w.z >> lane) & 1u;
    bit_in[3] = (w.w >> lane) & 1u;
  }
  formulas::ChannelParams p;
  if constexpr (Op::kParams) {
    if (same4 && i0 < n) p = ps.get(map.channel(i0));
  }
  Out o[4];
  bool bit[4] = {false, false, false, false};
  if (full) {  // no per-element bound checks on all but the last block
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (Op::kParams) {
        if (!same4) p = ps.get(map.channel(i0 + k));
      }
      o[k] = op(v[k], p, bit_in[k], bit[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (i0 + k < n) {
        if constexpr (Op::kParams) {
          if (!same4) p = ps.get(map.channel(i0 + k));
        }
        o[k] = op(v[k], p, bit_in[k], bit[k]);
      }
    }
  }
  if (kVec && full) {
    Vec4<Out> w;
#pragma unroll
    for (int k = 0; k < 4; ++k) w.v[k] = o[k];
    *reinterpret_cast<Vec4<Out>*>(out + i0) = w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i0 + k < n) out[i0 + k] = o[k];
  }
  if constexpr (Op::kWritesMask) {
    if (mask_out) store_mask_block(mask_out, b, bit, lane);  // uniform: no mask wanted, no ballots
  }
}

// Each warp takes kUnroll consecutive mask blocks per iteration and issues
// all their loads before any arithmetic: more bytes in flight per warp,
// which the narrow-output ops (quantize: 4 bytes in, 1 out) need to reach
// the copy bandwidth on a grid of a few waves. Ops whose output is at least
// as wide as their input (dequantize, fake quantize, the gradients) run one
// mask block per warp on a grid that covers the tensor once: H100 sweeps of
// both shapes (2026-11-24, docs/benchmarks.md) put the single pass at the copy
// rate (s8 -> f32 dequantize 0.458 ms for 256M against 0.487 on 8 waves of 4
// blocks per warp), the few-waves grid 5-7% under it.
constexpr int kEngineUnroll = 4;

template <class Op>
constexpr int engine_unroll() {
  return sizeof(typename Op::Out) < sizeof(typename Op::In) ? kEngineUnroll : 1;
}

// The engine over mask blocks [first, last): warp w of nwarps takes groups
// of kUnroll consecutive mask blocks, striding by nwarps groups.
template <class Op, bool kVec, int kUnroll = kEngineUnroll>
__device__ __forceinline__ void engine_range(const Op& op, const typename Op::In* __restrict__ in,
                                             typename Op::Out* __restrict__ out,
                                             const std::uint32_t* __restrict__ mask_in,
                                             std::uint32_t* __restrict__ mask_out, std::int64_t n,
                                             const ChannelIndexer& map, const formulas::ParamSource& ps,
                                             bool same4, std::int64_t first, std::int64_t last, std::int64_t warp,
                                             std::int64_t nwarps) {
  using In = typename Op::In;
  const unsigned lane = threadIdx.x & 31u;
  for (std::int64_t b0 = first + warp * kUnroll; b0 < last; b0 += nwarps * kUnroll) {
    In v[kUnroll][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (b0 + u < last) engine_load<In, kVec>(in, b0 + u, lane, n, v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (b0 + u < last) engine_finish<Op, kVec>(op, v[u], out, mask_in, mask_out, b0 + u, lane, n, map, ps, same4);
  }
}

// The engine's ops an observer may precede (observe_fake_quantize):
// fake_quantize and its relu form.
template <class Op>
constexpr bool kFollowsObserver = std::is_same_v<Op, formulas::FakeQuantOp<typename Op::In, true>> ||
                                  std::is_same_v<Op, formulas::FakeQuantOp<typename Op::In, false>> ||
                                  std::is_same_v<Op, formulas::FakeQuantReluOp<typename Op::In, true>> ||
                                  std::is_same_v<Op, formulas::FakeQuantReluOp<typename Op::In, false>>;

}  // namespace qgrad::kernels::cuda
