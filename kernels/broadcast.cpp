#include "qgrad/kernels/broadcast.h"

namespace qgrad::kernels {

namespace {
Shape contiguous_strides(const Shape& s) {
  Shape st(s.size(), 1);
  for (std::size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}
}  // namespace

BroadcastIndex make_broadcast_index(const Shape& a, const Shape& b, const Shape& out) {
  BroadcastIndex bi;
  QGRAD_CHECK(out.size() <= static_cast<std::size_t>(kMaxDims), "broadcast", "shape", "rank ", out.size(),
              " exceeds ", kMaxDims);
  bi.ndim = static_cast<int>(out.size());
  const Shape sa = contiguous_strides(a), sb = contiguous_strides(b);
  for (std::size_t d = 0; d < out.size(); ++d) {
    bi.sizes[d] = out[d];
    const std::size_t pa = out.size() - d, pb = out.size() - d;  // position from the right
    if (pa <= a.size()) {
      const std::size_t k = a.size() - pa;
      bi.stride_a[d] = a[k] == 1 ? 0 : sa[k];
    }
    if (pb <= b.size()) {
      const std::size_t k = b.size() - pb;
      bi.stride_b[d] = b[k] == 1 ? 0 : sb[k];
    }
  }
  // Size-1 dims dropped, and a dim merged into the one before it when both
  // operands walk the pair as one run (contiguous, or broadcast, in both):
  // fewer divisions per element and a longer innermost run (binary's CPU
  // rows). [N, C, H, W] with [1, C, 1, 1] becomes [N, C, H*W].
  int n = 0;
  for (int d = 0; d < bi.ndim; ++d) {
    if (bi.sizes[d] == 1) continue;
    if (n > 0 && bi.stride_a[n - 1] == bi.stride_a[d] * bi.sizes[d] &&
        bi.stride_b[n - 1] == bi.stride_b[d] * bi.sizes[d]) {
      bi.sizes[n - 1] *= bi.sizes[d];
    } else {
      bi.sizes[n] = bi.sizes[d];
      ++n;
    }
    bi.stride_a[n - 1] = bi.stride_a[d];
    bi.stride_b[n - 1] = bi.stride_b[d];
  }
  for (int d = n; d < bi.ndim; ++d) bi.sizes[d] = bi.stride_a[d] = bi.stride_b[d] = 0;
  bi.ndim = n;
  // Offsets stay below the output's size (a broadcast operand is never
  // larger than the output), so 32 bits hold every quantity when it does.
  std::int64_t numel = 1;
  for (int d = 0; d < n; ++d) numel *= bi.sizes[d];
  // An empty output decomposes no index (and FastDiv(0) would divide by 0).
  bi.small = numel > 0 && numel < (std::int64_t(1) << 31);
  if (bi.small)
    for (int d = 0; d < n; ++d) bi.div[d] = FastDiv(static_cast<std::uint32_t>(bi.sizes[d]));
  return bi;
}

ReduceIndex make_reduce_index(const Shape& in, const Shape& out) {
  ReduceIndex ri;
  QGRAD_CHECK(in.size() <= static_cast<std::size_t>(kMaxDims), "sum_to_shape", "shape", "rank too large");
  const Shape st = contiguous_strides(in);
  bool last_kept = false;
  for (std::size_t d = 0; d < in.size(); ++d) {
    if (in[d] == 1) continue;  // neither kept nor reduced: no coordinate
    const std::size_t from_right = in.size() - d;
    const bool kept = from_right <= out.size() && out[out.size() - from_right] == in[d];
    int& ndim = kept ? ri.kept_ndim : ri.red_ndim;
    std::int64_t* sizes = kept ? ri.kept_sizes : ri.red_sizes;
    std::int64_t* strides = kept ? ri.kept_strides : ri.red_strides;
    // `in` is contiguous: a dim next to one of its own kind continues that
    // run (stride[d - 1] = stride[d] * size[d]), so the two become one.
    if (ndim > 0 && last_kept == kept) {
      sizes[ndim - 1] *= in[d];
      strides[ndim - 1] = st[d];
    } else {
      sizes[ndim] = in[d];
      strides[ndim++] = st[d];
    }
    if (!kept) ri.red_count *= in[d];
    last_kept = kept;
  }
  return ri;
}

}  // namespace qgrad::kernels
