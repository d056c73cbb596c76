// permute, slice and cat's copies, one source for both devices
// (kernels/loop.h): one index per output unit, a unit being one element or,
// where the innermost run allows and the pointers are aligned, up to 16
// bytes of consecutive elements; 32-bit index arithmetic where it fits.
#include "qgrad/kernels/shape.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "qgrad/kernels/linalg.h"
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

// The copies below take an index type I: std::uint32_t when every index
// and offset of the copy is below 2^32 (index_fits), else std::int64_t.
template <class U, class I>
struct PermuteCopy {
  const U* x;
  U* y;
  PermuteIndex p;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = x[p.offset<I>(static_cast<I>(i))]; }
};

// Index i of the [outer, count, inner] part -> offset in the full tensor.
template <class I>
QGRAD_HD I full_offset(const SliceLayout& s, I i) {
  const auto inner = static_cast<I>(s.inner), count = static_cast<I>(s.count);
  const I in = i % inner, rest = i / inner;
  const I j = rest % count, o = rest / count;
  return (o * static_cast<I>(s.n) + static_cast<I>(s.start) + j * static_cast<I>(s.step)) * inner + in;
}

// The slice copies, each made as {src, dst, layout} by slice_copy (gather:
// full -> part; put and backward: part -> full).
template <class U, class I>
struct SliceGather {
  const U* full;
  U* part;
  SliceLayout s;
  QGRAD_HD void operator()(std::int64_t i) const { part[i] = full[full_offset(s, static_cast<I>(i))]; }
};

// Every element of full: its part element when selected, else zero bits.
// (start, the offset d and its quotient stay signed: d < 0 is "before".)
template <class U, class I>
struct SliceBackward {
  const U* part;
  U* full;
  SliceLayout s;
  QGRAD_HD void operator()(std::int64_t f) const {
    const auto fi = static_cast<I>(f), inner = static_cast<I>(s.inner), n = static_cast<I>(s.n);
    const I in = fi % inner, rest = fi / inner;
    const I k = rest % n, o = rest / n;
    const std::int64_t d = static_cast<std::int64_t>(k) - s.start;
    U v{};
    if (d >= 0 && d % s.step == 0 && d / s.step < s.count)
      v = part[(static_cast<std::int64_t>(o) * s.count + d / s.step) * s.inner + static_cast<std::int64_t>(in)];
    full[f] = v;
  }
};

// cat's copies: up to kCatBatch operands in one launch. Index i walks the
// batch's columns [first, first + width) of each of full's `outer` rows (in
// copy units), so full is written (forward) or read (backward) in order;
// operand j holds the batch's columns [ends[j - 1], ends[j]) (ends[-1] = 0).
constexpr int kCatBatch = 8;
template <class U, class I, bool kIntoFull>
struct CatCopy {
  U* parts[kCatBatch];
  I ends[kCatBatch];
  int count;
  I width, row, first;
  U* full;
  QGRAD_HD void operator()(std::int64_t idx) const {
    const auto i = static_cast<I>(idx);
    const I o = i / width, c = i % width;
    U* part = parts[0];
    I begin = 0, end = ends[0];
    // Unrolled over the batch, so the parameters are indexed statically.
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 1; k < kCatBatch; ++k)
      if (k < count && c >= end) {
        part = parts[k];
        begin = end;
        end = ends[k];
      }
    U& p = part[o * (end - begin) + (c - begin)];
    U& f = full[o * row + first + c];
    if constexpr (kIntoFull) f = p;
    else p = f;
  }
};

bool index_fits(std::int64_t n) { return n < (std::int64_t{1} << 32); }

// The widest copy unit (up to 16 bytes) of whole elements that every count
// (in elements) splits into, with every pointer aligned to it; the element
// size when none is wider.
template <class Counts, class Pointers>
std::size_t widest_unit(std::size_t elem, const Counts& counts, const Pointers& ptrs) {
  for (std::size_t w = 16; w > elem; w /= 2) {
    if (w % elem != 0) continue;
    const auto k = static_cast<std::int64_t>(w / elem);
    bool fits = true;
    for (const std::int64_t c : counts) fits = fits && c % k == 0;
    for (const void* p : ptrs) fits = fits && reinterpret_cast<std::uintptr_t>(p) % w == 0;
    if (fits) return w;
  }
  return elem;
}
std::size_t copy_unit(std::size_t elem, std::int64_t inner, std::initializer_list<const void*> ptrs) {
  return widest_unit(elem, std::initializer_list<std::int64_t>{inner}, ptrs);
}

// Runs f(TypeTag<U>, TypeTag<I>) for copy unit `unit` and an index type
// that holds `extent`.
template <class F>
void by_unit(std::size_t unit, std::int64_t extent, F&& f) {
  dispatch_size(unit, [&](auto u) {
    if (index_fits(extent)) f(u, TypeTag<std::uint32_t>{});
    else f(u, TypeTag<std::int64_t>{});
  });
}

// A slice layout in copy units of k elements (k divides inner).
SliceLayout in_units(SliceLayout s, std::int64_t k) {
  s.inner /= k;
  return s;
}

// The permutation without its size-1 dims, with output dims that are also
// adjacent in the input merged (same copy, fewer divisions per element).
PermuteIndex simplified(const PermuteIndex& p) {
  PermuteIndex q;
  for (int d = 0; d < p.ndim; ++d) {
    if (p.sizes[d] == 1) continue;
    if (q.ndim > 0 && q.strides[q.ndim - 1] == p.strides[d] * p.sizes[d]) {
      q.sizes[q.ndim - 1] *= p.sizes[d];
      q.strides[q.ndim - 1] = p.strides[d];
      continue;
    }
    q.sizes[q.ndim] = p.sizes[d];
    q.strides[q.ndim] = p.strides[d];
    ++q.ndim;
  }
  return q;
}

// Copies out[i] = in[p.offset(i)], k elements at a time where the innermost
// dim is contiguous in the input and k divides every size and stride.
void permute_copy(const Tensor& in, const Tensor& out, const PermuteIndex& index, const char* where) {
  PermuteIndex p = simplified(index);
  const std::size_t elem = dtype_size(in.dtype());
  std::size_t unit = elem;
  if (p.ndim > 0 && p.strides[p.ndim - 1] == 1) {
    unit = copy_unit(elem, p.sizes[p.ndim - 1], {in.data_ptr(), out.data_ptr()});
    for (int d = 0; d + 1 < p.ndim; ++d)
      if (p.strides[d] % static_cast<std::int64_t>(unit / elem) != 0) unit = elem;
  }
  const auto k = static_cast<std::int64_t>(unit / elem);
  if (k > 1) {
    p.sizes[p.ndim - 1] /= k;
    for (int d = 0; d + 1 < p.ndim; ++d) p.strides[d] /= k;
  }
  by_unit(unit, std::max(in.numel(), out.numel()), [&](auto u, auto ix) {
    using U = typename decltype(u)::type;
    using I = typename decltype(ix)::type;
    for_each_index(out.device(), out.numel() / k,
                   PermuteCopy<U, I>{static_cast<const U*>(in.data_ptr()), static_cast<U*>(out.data_ptr()), p}, where);
  });
}

// The copy unit (up to 16 bytes) of a slice copy and its layout in those
// units. A step-1 selection is, for each outer index, one run of count *
// inner consecutive elements at start * inner in a row of n * inner: the same
// selection with inner 1, whose units may span positions wherever the row,
// the start and the run split into them (cat along the last dim: 16-byte
// units, where units of whole `inner` runs were single elements). Other
// steps move whole runs of `inner` elements, in units where inner splits.
std::pair<std::size_t, SliceLayout> slice_units(std::size_t elem, const SliceLayout& s,
                                                std::initializer_list<const void*> ptrs) {
  if (s.step != 1) {
    const std::size_t unit = copy_unit(elem, s.inner, ptrs);
    return {unit, in_units(s, static_cast<std::int64_t>(unit / elem))};
  }
  SliceLayout r{s.outer, s.n * s.inner, 1, s.start * s.inner, s.count * s.inner, 1};
  const std::size_t w = widest_unit(elem, std::initializer_list<std::int64_t>{r.n, r.start, r.count}, ptrs);
  const auto k = static_cast<std::int64_t>(w / elem);
  r.n /= k;
  r.start /= k;
  r.count /= k;
  return {w, r};
}

// `indices`: the elements the copy walks (of dst, or of the part for cat);
// `extent`: the largest tensor.
template <template <class, class> class Copy>
void slice_copy(const Tensor& src, const Tensor& dst, const SliceLayout& s, std::int64_t indices,
                std::int64_t extent, const char* where) {
  const std::size_t elem = dtype_size(dst.dtype());
  // (no structured binding: clang 14, the sanitizer build's, cannot capture one)
  const std::pair<std::size_t, SliceLayout> units = slice_units(elem, s, {src.data_ptr(), dst.data_ptr()});
  const std::size_t unit = units.first;
  const SliceLayout layout = units.second;
  const auto k = static_cast<std::int64_t>(unit / elem);
  by_unit(unit, extent, [&](auto u, auto ix) {
    using U = typename decltype(u)::type;
    using I = typename decltype(ix)::type;
    for_each_index(dst.device(), indices / k,
                   Copy<U, I>{static_cast<const U*>(src.data_ptr()), static_cast<U*>(dst.data_ptr()), layout}, where);
  });
}

// cat's copies between the operands (each `outer` rows of run_j elements,
// the runs summing to full's row) and full: the empty operands dropped, the
// rest kCatBatch a launch, each launch in the widest unit (up to 16 bytes)
// that full's row, the batch's first column, every run and every pointer
// split into.
template <bool kIntoFull>
void cat_copies(const std::vector<Tensor>& parts, const Tensor& full, std::int64_t outer, const char* where) {
  if (full.numel() == 0) return;
  const std::size_t elem = dtype_size(full.dtype());
  const std::int64_t row = full.numel() / outer;
  std::vector<std::pair<void*, std::int64_t>> operands;  // data, run
  for (const Tensor& p : parts)
    if (p.numel() > 0) operands.emplace_back(p.data_ptr(), p.numel() / outer);
  std::int64_t first = 0;
  for (std::size_t b = 0; b < operands.size(); b += kCatBatch) {
    const std::size_t count = std::min<std::size_t>(kCatBatch, operands.size() - b);
    std::int64_t width = 0;
    for (std::size_t j = b; j < b + count; ++j) width += operands[j].second;
    std::vector<std::int64_t> counts{row, first};
    std::vector<const void*> ptrs{full.data_ptr()};
    for (std::size_t j = b; j < b + count; ++j) {
      counts.push_back(operands[j].second);
      ptrs.push_back(operands[j].first);
    }
    const std::size_t unit = widest_unit(elem, counts, ptrs);
    const auto k = static_cast<std::int64_t>(unit / elem);
    by_unit(unit, full.numel(), [&](auto u, auto ix) {
      using U = typename decltype(u)::type;
      using I = typename decltype(ix)::type;
      CatCopy<U, I, kIntoFull> c{};
      std::int64_t end = 0;
      for (std::size_t j = 0; j < count; ++j) {
        c.parts[j] = static_cast<U*>(operands[b + j].first);
        end += operands[b + j].second / k;
        c.ends[j] = static_cast<I>(end);
      }
      c.count = static_cast<int>(count);
      c.width = static_cast<I>(width / k);
      c.row = static_cast<I>(row / k);
      c.first = static_cast<I>(first / k);
      c.full = static_cast<U*>(full.data_ptr());
      if (unit == 16) for_each_index_once(full.device(), outer * (width / k), c, where);
      else for_each_index(full.device(), outer * (width / k), c, where);
    });
    first += width;
  }
}

}  // namespace

void permute(const Tensor& in, const Tensor& out, const std::vector<std::int64_t>& perm) {
  if (out.numel() == 0) return;
  permute_copy(in, out, make_permute_index(in.shape(), perm), "permute");
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
  permute_copy(in, out, p, "expand");
}

void slice_gather(const Tensor& in, const Tensor& out, const SliceLayout& s) {
  if (out.numel() > 0) slice_copy<SliceGather>(in, out, s, out.numel(), in.numel(), "slice");
}

void slice_backward(const Tensor& part, const Tensor& full, const SliceLayout& s) {
  if (full.numel() > 0) slice_copy<SliceBackward>(part, full, s, full.numel(), full.numel(), "slice_backward");
}

void cat_into(const std::vector<Tensor>& parts, const Tensor& full, std::int64_t outer) {
  cat_copies<true>(parts, full, outer, "cat");
}

void cat_split(const Tensor& full, const std::vector<Tensor>& parts, std::int64_t outer) {
  cat_copies<false>(parts, full, outer, "cat_backward");
}

}  // namespace qgrad::kernels
