// permute, slice / narrow, cat, split / chunk: validation, forward (a copy:
// qgrad tensors have no strides), saved state and backward.
#include "qgrad/ops/shape.h"

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/shape.h"
#include "qgrad/ops/check.h"

namespace qgrad {

namespace {

TensorOptions like(const Tensor& t) { return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()); }

void element_typed(const Tensor& x, const char* op, const char* arg) {
  check::defined(x, op, arg);
  QGRAD_CHECK(!is_packed_int4(x.dtype()), op, arg, "packed dtype ", dtype_name(x.dtype()),
              " has no element type (unpack it first)");
}

// x viewed as [outer, size(dim), inner].
kernels::SliceLayout layout_of(const Shape& shape, std::int64_t dim) {
  kernels::SliceLayout s;
  for (std::int64_t d = 0; d < dim; ++d) s.outer *= shape[static_cast<std::size_t>(d)];
  s.n = shape[static_cast<std::size_t>(dim)];
  for (std::size_t d = static_cast<std::size_t>(dim) + 1; d < shape.size(); ++d) s.inner *= shape[d];
  return s;
}

// The slice itself, after validation (shared by slice, narrow and split).
Tensor slice_checked(const char* op, const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t count,
                     std::int64_t step) {
  kernels::SliceLayout s = layout_of(x.shape(), dim);
  s.start = start;
  s.count = count;
  s.step = step;
  Shape out_shape = x.shape();
  out_shape[static_cast<std::size_t>(dim)] = count;
  Tensor out = Tensor::empty(out_shape, like(x));
  kernels::slice_gather(x, out, s);
  if (any_requires_grad({x}))
    record(op, out, {x}, [s, shape = x.shape()](const Tensor& g) {
      Tensor dx = Tensor::empty(shape, like(g));
      kernels::slice_backward(g, dx, s);
      return std::vector<Tensor>{dx};
    });
  return out;
}

}  // namespace

// Backward: permute(dy, inverse of dims). Saves nothing.
Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims) {
  constexpr const char* op = "permute";
  element_typed(x, op, "x");
  const std::int64_t rank = x.dim();
  QGRAD_CHECK(rank <= kernels::kMaxTransposeDims, op, "x", "rank ", rank, " exceeds the limit ",
              kernels::kMaxTransposeDims);
  QGRAD_CHECK(static_cast<std::int64_t>(dims.size()) == rank, op, "dims", "expected ", rank,
              " dims for x of shape ", shape_str(x.shape()), ", got ", dims.size());
  std::vector<std::int64_t> perm(dims.size()), inverse(dims.size(), -1);
  for (std::size_t d = 0; d < dims.size(); ++d) {
    perm[d] = check::axis(dims[d], rank, op, "dims");
    QGRAD_CHECK(inverse[static_cast<std::size_t>(perm[d])] < 0, op, "dims", "dim ", perm[d],
                " appears twice: not a permutation");
    inverse[static_cast<std::size_t>(perm[d])] = static_cast<std::int64_t>(d);
  }
  Shape out_shape(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) out_shape[d] = x.shape()[static_cast<std::size_t>(perm[d])];
  Tensor out = Tensor::empty(out_shape, like(x));
  if (out.numel() > 0) kernels::permute(x, out, perm);
  if (any_requires_grad({x}))
    record(op, out, {x}, [inverse](const Tensor& g) { return std::vector<Tensor>{permute(g, inverse)}; });
  return out;
}

// Backward: dy into zeros of x's shape (one pass). Saves nothing.
Tensor slice(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step) {
  constexpr const char* op = "slice";
  element_typed(x, op, "x");
  QGRAD_CHECK(x.dim() >= 1, op, "x", "a scalar has no dim to slice");
  const std::int64_t d = check::axis(dim, x.dim(), op, "dim");
  const std::int64_t n = x.size(d);
  QGRAD_CHECK(start >= -n && start <= n, op, "start", "start ", start, " out of range for size ", n);
  QGRAD_CHECK(end >= -n && end <= n, op, "end", "end ", end, " out of range for size ", n);
  const std::int64_t b = start < 0 ? start + n : start, e = end < 0 ? end + n : end;
  QGRAD_CHECK(b <= e, op, "end", "end ", end, " lies before start ", start, " (size ", n, ")");
  QGRAD_CHECK(step >= 1, op, "step", "must be >= 1, got ", step);
  return slice_checked(op, x, d, b, (e - b + step - 1) / step, step);
}

Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  constexpr const char* op = "narrow";
  element_typed(x, op, "x");
  QGRAD_CHECK(x.dim() >= 1, op, "x", "a scalar has no dim to narrow");
  const std::int64_t d = check::axis(dim, x.dim(), op, "dim");
  const std::int64_t n = x.size(d);
  QGRAD_CHECK(start >= -n && start <= n, op, "start", "start ", start, " out of range for size ", n);
  const std::int64_t b = start < 0 ? start + n : start;
  QGRAD_CHECK(length >= 0 && length <= n - b, op, "length", "length ", length, " from start ", start,
              " exceeds the size ", n);
  return slice_checked(op, x, d, b, length, 1);
}

// Backward: each input gets its slice of dy, all in one pass over dy (eight
// operands a launch). Saves the operands' shapes.
Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim) {
  constexpr const char* op = "cat";
  QGRAD_CHECK(!tensors.empty(), op, "tensors", "empty list");
  const Tensor& first = tensors[0];
  element_typed(first, op, "tensors[0]");
  QGRAD_CHECK(first.dim() >= 1, op, "tensors[0]", "a scalar cannot be joined (shape ", shape_str(first.shape()), ")");
  const std::int64_t d = check::axis(dim, first.dim(), op, "dim");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string arg = "tensors[" + std::to_string(i) + "]";
    QGRAD_CHECK(t.defined(), op, arg, "undefined tensor");
    QGRAD_CHECK(t.dtype() == first.dtype(), op, arg, "dtype ", dtype_name(t.dtype()), " differs from tensors[0]'s ",
                dtype_name(first.dtype()));
    QGRAD_CHECK(t.device() == first.device(), op, arg, "tensor is on ", t.device().str(), ", tensors[0] on ",
                first.device().str());
    bool same = t.dim() == first.dim();
    for (std::int64_t k = 0; same && k < t.dim(); ++k) same = k == d || t.size(k) == first.size(k);
    QGRAD_CHECK(same, op, arg, "shape ", shape_str(t.shape()), " does not match tensors[0]'s ",
                shape_str(first.shape()), " outside dim ", d);
    total += t.size(d);
  }
  Shape out_shape = first.shape();
  out_shape[static_cast<std::size_t>(d)] = total;
  shape_numel(out_shape, op);
  Tensor out = Tensor::empty(out_shape, like(first));
  const std::int64_t outer = layout_of(out_shape, d).outer;
  kernels::cat_into(tensors, out, outer);
  if (any_requires_grad(tensors)) {
    std::vector<Shape> shapes;
    shapes.reserve(tensors.size());
    for (const Tensor& t : tensors) shapes.push_back(t.shape());
    record(op, out, tensors, [shapes, outer](const Tensor& g) {
      std::vector<Tensor> grads;
      grads.reserve(shapes.size());
      for (const Shape& shape : shapes) grads.push_back(Tensor::empty(shape, like(g)));
      kernels::cat_split(g, grads, outer);
      return grads;
    });
  }
  return out;
}

std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim) {
  constexpr const char* op = "split_with_sizes";
  element_typed(x, op, "x");
  QGRAD_CHECK(x.dim() >= 1, op, "x", "a scalar has no dim to split");
  const std::int64_t d = check::axis(dim, x.dim(), op, "dim");
  QGRAD_CHECK(!sizes.empty(), op, "sizes", "empty list");
  std::int64_t total = 0;
  for (std::int64_t s : sizes) {
    QGRAD_CHECK(s >= 0 && s <= x.size(d) - total, op, "sizes", "sizes do not sum to the size ", x.size(d), " of dim ",
                d, " (piece of ", s, " after ", total, ")");
    total += s;
  }
  QGRAD_CHECK(total == x.size(d), op, "sizes", "sizes sum to ", total, ", not to the size ", x.size(d), " of dim ", d);
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  std::int64_t start = 0;
  for (std::int64_t s : sizes) {
    out.push_back(slice_checked(op, x, d, start, s, 1));
    start += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim) {
  constexpr const char* op = "split";
  element_typed(x, op, "x");
  QGRAD_CHECK(x.dim() >= 1, op, "x", "a scalar has no dim to split");
  const std::int64_t d = check::axis(dim, x.dim(), op, "dim");
  QGRAD_CHECK(split_size > 0, op, "split_size", "must be > 0, got ", split_size);
  const std::int64_t n = x.size(d);
  std::vector<Tensor> out;
  std::int64_t start = 0;
  do {
    const std::int64_t len = std::min(split_size, n - start);
    out.push_back(slice_checked(op, x, d, start, len, 1));
    start += len;
  } while (start < n);
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, std::int64_t chunks, std::int64_t dim) {
  constexpr const char* op = "chunk";
  element_typed(x, op, "x");
  QGRAD_CHECK(x.dim() >= 1, op, "x", "a scalar has no dim to chunk");
  const std::int64_t d = check::axis(dim, x.dim(), op, "dim");
  QGRAD_CHECK(chunks > 0, op, "chunks", "must be > 0, got ", chunks);
  const std::int64_t n = x.size(d);
  std::vector<Tensor> out;
  if (n == 0) {  // as PyTorch: `chunks` empty pieces
    for (std::int64_t c = 0; c < chunks; ++c) out.push_back(slice_checked(op, x, d, 0, 0, 1));
    return out;
  }
  const std::int64_t size = (n + chunks - 1) / chunks;
  std::int64_t start = 0;
  do {
    const std::int64_t len = std::min(size, n - start);
    out.push_back(slice_checked(op, x, d, start, len, 1));
    start += len;
  } while (start < n);
  return out;
}

}  // namespace qgrad
