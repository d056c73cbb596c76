// The [outer, channels, inner] layout: a tensor viewed around one axis,
// outer = the product of the dims before it, channels = its length,
// inner = the product of the dims after it. Element i sits in channel
// (i / inner) % channels. One type for every kernel that works per axis:
// reductions and softmax (a "channel" is then the reduced axis), observers,
// quantize / dequantize / fake quantize per tensor, channel, token or group,
// and dynamic-range quantization.
//
// Per tensor is {1, 1, numel}; a full reduction is {1, numel, 1}; per token
// over x [N, D] is {1, N, D}; per group of G along the last axis is
// {1, numel / G, G}.
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"
#include "qgrad/core/tensor.h"

namespace qgrad::kernels {

struct AxisLayout {
  std::int64_t outer = 1, channels = 1, inner = 1;

  QGRAD_HD std::int64_t numel() const { return outer * channels * inner; }
  // The channel of element i.
  QGRAD_HD std::int64_t channel(std::int64_t i) const { return (i / inner) % channels; }
  // Offset of element 0 of line idx (idx < outer * inner): the line runs
  // along the axis, its `channels` elements `inner` apart.
  QGRAD_HD std::int64_t base(std::int64_t idx) const { return (idx / inner) * channels * inner + idx % inner; }
  // Offset of element j (j < outer * inner, in [outer, inner] order) of channel c.
  QGRAD_HD std::int64_t offset_in_channel(std::int64_t j, std::int64_t c) const {
    const std::int64_t o = j / inner;
    return (o * channels + c) * inner + (j - o * inner);
  }

  // The layout of `shape` around `axis` (0 <= axis < rank); axis < 0: one
  // channel, {1, 1, numel}.
  static AxisLayout of(const Shape& shape, std::int64_t axis) {
    AxisLayout v;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      const auto di = static_cast<std::int64_t>(d);
      if (axis < 0 || di > axis) v.inner *= shape[d];
      else if (di < axis) v.outer *= shape[d];
      else v.channels = shape[d];
    }
    return v;
  }
};

// n / d for n < 2^31 and 1 <= d < 2^31 by a multiply and a shift (the
// magic-number division of PyTorch's IntDivider); exact in that range.
struct FastDiv {
  std::uint32_t d = 1, m = 1, shift = 0;
  FastDiv() = default;
  explicit FastDiv(std::uint32_t divisor) : d(divisor) {
    for (shift = 0; shift < 32; ++shift)
      if ((1ull << shift) >= d) break;
    const std::uint64_t magic = ((1ull << 32) * ((1ull << shift) - d)) / d + 1;
    m = static_cast<std::uint32_t>(magic);
  }
  QGRAD_HD std::uint32_t div(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const std::uint32_t t = __umulhi(n, m);
#else
    const std::uint32_t t = static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * m) >> 32);
#endif
    return (t + n) >> shift;
  }
};

// AxisLayout::channel without a hardware division: a layout of fewer than
// 2^31 elements takes the magic division of FastDiv, a larger one the plain
// division. Same result as layout.channel(i).
struct ChannelIndexer {
  std::int64_t inner = 1, channels = 1;
  bool small = true;
  FastDiv div_inner, div_channels;
  ChannelIndexer() = default;
  explicit ChannelIndexer(const AxisLayout& l)
      : inner(l.inner), channels(l.channels), small(l.numel() < (std::int64_t(1) << 31)) {
    if (small) {
      div_inner = FastDiv(static_cast<std::uint32_t>(inner));
      div_channels = FastDiv(static_cast<std::uint32_t>(channels));
    }
  }
  QGRAD_HD std::int64_t channel(std::int64_t i) const {
    if (channels == 1) return 0;
    if (small) {
      const std::uint32_t row = div_inner.div(static_cast<std::uint32_t>(i));
      return static_cast<std::int64_t>(row - div_channels.div(row) * static_cast<std::uint32_t>(channels));
    }
    return (i / inner) % channels;
  }
};

}  // namespace qgrad::kernels
