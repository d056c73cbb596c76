// Index arithmetic for broadcasting, shared by host and device code.
#pragma once

#include <cstdint>

#include "qgrad/core/macros.h"
#include "qgrad/core/tensor.h"
#include "qgrad/kernels/layout.h"

namespace qgrad::kernels {

inline constexpr int kMaxDims = 8;

// Maps an index of the broadcast output to the offsets of two inputs. An
// output of fewer than 2^31 elements (`small`) decomposes the index with
// 32-bit magic divisions (FastDiv): a 64-bit division is a long software
// sequence on CUDA, and two of them per element held a [N, C, H, W] op
// [1, C, 1, 1] binary at half the copy rate. Same offsets either way.
struct BroadcastIndex {
  int ndim = 0;
  bool small = false;
  std::int64_t sizes[kMaxDims] = {};
  std::int64_t stride_a[kMaxDims] = {};  // 0 along broadcast dims
  std::int64_t stride_b[kMaxDims] = {};
  FastDiv div[kMaxDims];  // of sizes[d], when small

  QGRAD_HD void offsets(std::int64_t i, std::int64_t& oa, std::int64_t& ob) const {
    if (small) {
      auto j = static_cast<std::uint32_t>(i);
      std::uint32_t a = 0, b = 0;
      for (int d = ndim - 1; d > 0; --d) {
        const std::uint32_t q = div[d].div(j);
        const std::uint32_t c = j - q * static_cast<std::uint32_t>(sizes[d]);
        j = q;
        a += c * static_cast<std::uint32_t>(stride_a[d]);
        b += c * static_cast<std::uint32_t>(stride_b[d]);
      }
      if (ndim > 0) {  // the outermost coordinate is what is left
        a += j * static_cast<std::uint32_t>(stride_a[0]);
        b += j * static_cast<std::uint32_t>(stride_b[0]);
      }
      oa = a;
      ob = b;
      return;
    }
    oa = 0;
    ob = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const std::int64_t c = i % sizes[d];
      i /= sizes[d];
      oa += c * stride_a[d];
      ob += c * stride_b[d];
    }
  }
};

// Builds the index for out_shape (already the broadcast of a and b).
BroadcastIndex make_broadcast_index(const Shape& a, const Shape& b, const Shape& out);

// Reduction of `in` to `out_shape` (the shape it was broadcast from):
// every output element sums its inputs in one fixed order (row-major over
// the reduced dims; adjacent dims of the same kind are merged, which keeps
// that order and saves a division per merged dim).
struct ReduceIndex {
  int kept_ndim = 0;
  std::int64_t kept_sizes[kMaxDims] = {};
  std::int64_t kept_strides[kMaxDims] = {};  // in the input
  int red_ndim = 0;
  std::int64_t red_sizes[kMaxDims] = {};
  std::int64_t red_strides[kMaxDims] = {};
  std::int64_t red_count = 1;

  QGRAD_HD static std::int64_t offset(std::int64_t i, int n, const std::int64_t* sizes, const std::int64_t* strides) {
    std::int64_t o = 0;
    for (int d = n - 1; d >= 0; --d) {
      o += (i % sizes[d]) * strides[d];
      i /= sizes[d];
    }
    return o;
  }
  QGRAD_HD std::int64_t base(std::int64_t j) const { return offset(j, kept_ndim, kept_sizes, kept_strides); }
  QGRAD_HD std::int64_t reduced(std::int64_t r) const { return offset(r, red_ndim, red_sizes, red_strides); }
};
ReduceIndex make_reduce_index(const Shape& in, const Shape& out);

}  // namespace qgrad::kernels
