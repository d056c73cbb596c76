// Shape ops: permute, slice / narrow, cat, split / chunk (PyTorch 2.11
// semantics, docs/ops.md "Shape ops"). qgrad tensors are contiguous with no
// strides (core/tensor.h), so each of these COPIES its output (one read and
// one write of the output's elements); none is a view. Any dtype with an
// element type (not the packed s4 / u4); differentiable for floating ones.
#pragma once

#include <cstdint>
#include <vector>

#include "qgrad/core/tensor.h"

namespace qgrad {

// out.shape[d] = x.shape[dims[d]]: dims is a permutation of [0, rank)
// (negative entries count from the end), rank <= 8. Backward: the inverse
// permutation of dy.
Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims);
// Elements start, start + step, ... (< end) of dim `dim`, as x[..., start:end:step]
// except that out-of-range bounds are errors, not clamped: negative start
// and end count from the end, then 0 <= start <= end <= size; step >= 1.
// Backward: dy scattered into zeros of x's shape.
Tensor slice(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step = 1);
// torch.narrow: `length` elements of dim `dim` from `start` (negative start
// counts from the end); 0 <= start, length >= 0, start + length <= size.
Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length);
// The tensors joined along `dim` (negative counts from the end): a non-empty
// list of defined tensors of one dtype, one device and one rank (>= 1),
// equal in every dim but `dim`. Backward: dy's matching slice to each.
Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim = 0);
// torch.split: consecutive pieces of split_size (> 0) along dim, the last
// one smaller when split_size does not divide the size (one empty piece for
// a dim of size 0). Each piece is a narrow of x with its own backward: the
// gradients of the pieces used accumulate into x's, unused ones add nothing.
std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim = 0);
// Pieces of the given sizes (each >= 0, summing to the size of dim).
std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim = 0);
// torch.chunk: split(x, ceil(size / chunks), dim) (chunks > 0); may return
// fewer than `chunks` pieces, and `chunks` empty ones for a dim of size 0,
// as PyTorch.
std::vector<Tensor> chunk(const Tensor& x, std::int64_t chunks, std::int64_t dim = 0);

}  // namespace qgrad
