// Kernels of the shape ops (ops/shape.h): permute, slice and its gradient,
// and the copy of one cat operand into its place. Element copies only: any
// dtype with an element type (not the packed s4 / u4), written once over
// kernels/loop.h for both devices; bit-identical by construction.
#pragma once

#include <cstdint>

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
// The selection of full [outer, n, inner] = part; the rest of full is not
// touched (cat: each operand into its place, step 1).
void slice_put(const Tensor& part, const Tensor& full, const SliceLayout& s);

}  // namespace qgrad::kernels
