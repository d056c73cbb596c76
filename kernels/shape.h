// Kernels of the shape ops (ops/shape.h): permute, slice and its gradient,
// and cat's copies in both directions. Element copies only: any
// dtype with an element type (not the packed s4 / u4), written once over
// kernels/loop.h for both devices; bit-identical by construction.
#pragma once

#include <cstdint>
#include <vector>

#include "qgrad/core/tensor.h"
#include "qgrad/kernels/linalg.h"

namespace qgrad::kernels {

// The index that moves input dim perm[d] to output position d (perm a
// permutation of [0, rank), rank <= kMaxTransposeDims).
PermuteIndex make_permute_index(const Shape& shape, const std::vector<std::int64_t>& perm);
// out = in with its dims permuted by perm.
void permute(const Tensor& in, const Tensor& out, const std::vector<std::int64_t>& perm);

// out (shape `out_shape`) = in broadcast to it (numpy rules; in's shape
// already checked to broadcast; rank of out <= kMaxTransposeDims).
void expand(const Tensor& in, const Tensor& out);

// A strided selection along one dim of a tensor viewed as [outer, n, inner]:
// the elements start, start + step, ..., (count of them) of the n axis.
struct SliceLayout {
  std::int64_t outer = 1, n = 0, inner = 1;
  std::int64_t start = 0, count = 0, step = 1;
};
// out [outer, count, inner] = the selection of in [outer, n, inner].
void slice_gather(const Tensor& in, const Tensor& out, const SliceLayout& s);
// full [outer, n, inner]: part at the selected positions, zero elsewhere
// (one pass: slice's gradient).
void slice_backward(const Tensor& part, const Tensor& full, const SliceLayout& s);
// cat's copies, full viewed as [outer, row] and parts[j] as [outer, run_j]
// (the runs summing to row, in order): the parts into full (cat) or full
// into the parts (its backward). One launch per eight non-empty parts, each
// walking full in order.
void cat_into(const std::vector<Tensor>& parts, const Tensor& full, std::int64_t outer);
void cat_split(const Tensor& full, const std::vector<Tensor>& parts, std::int64_t outer);

}  // namespace qgrad::kernels
