// permute, slice and cat's copies, one source for both devices
// (kernels/loop.h): one index per output element, copied by element size.
#include "qgrad/kernels/shape.h"

#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

PermuteIndex make_permute_index(const Shape& shape, const std::vector<std::int64_t>& perm) {
  PermuteIndex p;
  p.ndim = static_cast<int>(shape.size());
  std::int64_t in_strides[kMaxTransposeDims] = {};
  std::int64_t stride = 1;
  for (int d = p.ndim - 1; d >= 0; --d) {
    in_strides[d] = stride;
    stride *= shape[static_cast<std::size_t>(d)];
  }
  for (int d = 0; d < p.ndim; ++d) {
    const auto src = static_cast<std::size_t>(perm[static_cast<std::size_t>(d)]);
    p.sizes[d] = shape[src];
    p.strides[d] = in_strides[src];
  }
  return p;
}

namespace {

template <class U>
struct PermuteCopy {
  const U* x;
  U* y;
  PermuteIndex p;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = x[p.offset(i)]; }
};

// Index i of the [outer, count, inner] part -> offset in the full tensor.
QGRAD_HD std::int64_t full_offset(const SliceLayout& s, std::int64_t i) {
  const std::int64_t in = i % s.inner, rest = i / s.inner;
  const std::int64_t j = rest % s.count, o = rest / s.count;
  return (o * s.n + s.start + j * s.step) * s.inner + in;
}

template <class U>
struct SliceGather {
  const U* full;
  U* part;
  SliceLayout s;
  QGRAD_HD void operator()(std::int64_t i) const { part[i] = full[full_offset(s, i)]; }
};

template <class U>
struct SlicePut {
  const U* part;
  U* full;
  SliceLayout s;
  QGRAD_HD void operator()(std::int64_t i) const { full[full_offset(s, i)] = part[i]; }
};

// Every element of full: its part element when selected, else zero bits.
template <class U>
struct SliceBackward {
  const U* part;
  U* full;
  SliceLayout s;
  QGRAD_HD void operator()(std::int64_t f) const {
    const std::int64_t in = f % s.inner, rest = f / s.inner;
    const std::int64_t k = rest % s.n, o = rest / s.n;
    const std::int64_t d = k - s.start;
    U v = U(0);
    if (d >= 0 && d % s.step == 0 && d / s.step < s.count) v = part[(o * s.count + d / s.step) * s.inner + in];
    full[f] = v;
  }
};

template <class F>
void by_size(const Tensor& t, F&& f) {
  dispatch_size(dtype_size(t.dtype()), std::forward<F>(f));
}

}  // namespace

void permute(const Tensor& in, const Tensor& out, const std::vector<std::int64_t>& perm) {
  const PermuteIndex p = make_permute_index(in.shape(), perm);
  by_size(in, [&](auto tag) {
    using U = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(),
                   PermuteCopy<U>{static_cast<const U*>(in.data_ptr()), static_cast<U*>(out.data_ptr()), p}, "permute");
  });
}

void expand(const Tensor& in, const Tensor& out) {
  const Shape& os = out.shape();
  const Shape& is = in.shape();
  PermuteIndex p;
  p.ndim = static_cast<int>(os.size());
  std::int64_t stride = 1;
  for (int d = p.ndim - 1; d >= 0; --d) {
    const auto k = static_cast<std::size_t>(d);
    const std::size_t lead = os.size() - is.size();
    const std::int64_t size = k >= lead ? is[k - lead] : 1;
    p.sizes[d] = os[k];
    p.strides[d] = size == 1 ? 0 : stride;
    stride *= size;
  }
  if (out.numel() == 0) return;
  by_size(in, [&](auto tag) {
    using U = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(),
                   PermuteCopy<U>{static_cast<const U*>(in.data_ptr()), static_cast<U*>(out.data_ptr()), p}, "expand");
  });
}

void slice_gather(const Tensor& in, const Tensor& out, const SliceLayout& s) {
  if (out.numel() == 0) return;
  by_size(in, [&](auto tag) {
    using U = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(),
                   SliceGather<U>{static_cast<const U*>(in.data_ptr()), static_cast<U*>(out.data_ptr()), s}, "slice");
  });
}

void slice_backward(const Tensor& part, const Tensor& full, const SliceLayout& s) {
  if (full.numel() == 0) return;
  by_size(full, [&](auto tag) {
    using U = typename decltype(tag)::type;
    for_each_index(full.device(), full.numel(),
                   SliceBackward<U>{static_cast<const U*>(part.data_ptr()), static_cast<U*>(full.data_ptr()), s},
                   "slice_backward");
  });
}

void slice_put(const Tensor& part, const Tensor& full, const SliceLayout& s) {
  if (part.numel() == 0) return;
  by_size(full, [&](auto tag) {
    using U = typename decltype(tag)::type;
    for_each_index(full.device(), part.numel(),
                   SlicePut<U>{static_cast<const U*>(part.data_ptr()), static_cast<U*>(full.data_ptr()), s}, "cat");
  });
}

}  // namespace qgrad::kernels
