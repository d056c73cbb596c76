// fill, cast, rand and arange, one source for both devices (kernels/loop.h).
#include "qgrad/kernels/basic.h"

#include "qgrad/core/random.h"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {

template <class T>
struct Fill {
  T v;
  T* o;
  QGRAD_HD void operator()(std::int64_t i) const { o[i] = v; }
};

template <class In, class Out>
struct Cast {
  const In* x;
  Out* y;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = formulas::cast_value<Out>(x[i]); }
};

// Packed 4-bit: one byte (two elements) per index on the packing side.
template <class In>
struct PackFrom {
  const In* x;
  std::uint8_t* y;
  std::int64_t n;
  bool is_signed;
  QGRAD_HD void operator()(std::int64_t j) const {
    const int lo = formulas::int4_from(x[2 * j], is_signed);
    const int hi = 2 * j + 1 < n ? formulas::int4_from(x[2 * j + 1], is_signed) : 0;
    y[j] = nibble_pack(lo, hi);
  }
};
template <class Out>
struct UnpackTo {
  const std::uint8_t* x;
  Out* y;
  bool is_signed;
  QGRAD_HD void operator()(std::int64_t i) const { y[i] = formulas::cast_value<Out>(nibble_get(x, i, is_signed)); }
};
struct Repack {  // s4 <-> u4: saturate each value into the target range
  const std::uint8_t* x;
  std::uint8_t* y;
  std::int64_t n;
  bool in_signed, out_signed;
  QGRAD_HD void operator()(std::int64_t j) const {
    const int lo = formulas::int4_from(nibble_get(x, 2 * j, in_signed), out_signed);
    const int hi = 2 * j + 1 < n ? formulas::int4_from(nibble_get(x, 2 * j + 1, in_signed), out_signed) : 0;
    y[j] = nibble_pack(lo, hi);
  }
};
struct FillBytes {
  std::uint8_t v, last;
  std::int64_t bytes;
  std::uint8_t* o;
  QGRAD_HD void operator()(std::int64_t j) const { o[j] = j + 1 == bytes ? last : v; }
};

template <class T>
struct RandUniform {
  std::uint64_t seed, offset;
  double low, high;
  T* o;
  QGRAD_HD void operator()(std::int64_t i) const {
    const double u = formulas::random_uniform(seed, offset + static_cast<std::uint64_t>(i));
    o[i] = formulas::cast_value<T>(low + (high - low) * u);
  }
};

template <class T>
struct Arange {
  double start, step;
  T* o;
  QGRAD_HD void operator()(std::int64_t i) const {
    o[i] = formulas::cast_value<T>(start + step * static_cast<double>(i));
  }
};

}  // namespace

void fill(const Tensor& out, double value) {
  if (is_packed_int4(out.dtype())) {
    const int v = formulas::int4_from(value, out.dtype() == DType::s4);
    const auto bytes = static_cast<std::int64_t>(out.nbytes());
    const std::uint8_t full = nibble_pack(v, v), last = out.numel() % 2 ? nibble_pack(v, 0) : full;
    for_each_index(out.device(), bytes, FillBytes{full, last, bytes, static_cast<std::uint8_t*>(out.data_ptr())}, "fill");
    return;
  }
  dispatch_all(out.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(), Fill<T>{formulas::cast_value<T>(value), static_cast<T*>(out.data_ptr())},
                   "fill");
  });
}

void cast(const Tensor& in, const Tensor& out) {
  const bool pin = is_packed_int4(in.dtype()), pout = is_packed_int4(out.dtype());
  if (pin || pout) {
    const auto* xb = static_cast<const std::uint8_t*>(in.data_ptr());
    auto* yb = static_cast<std::uint8_t*>(out.data_ptr());
    const std::int64_t n = out.numel(), bytes = (n + 1) / 2;
    if (pin && pout) {
      for_each_index(out.device(), bytes, Repack{xb, yb, n, in.dtype() == DType::s4, out.dtype() == DType::s4}, "cast");
    } else if (pin) {
      dispatch_all(out.dtype(), "cast", [&](auto tag) {
        using Out = typename decltype(tag)::type;
        for_each_index(out.device(), n, UnpackTo<Out>{xb, static_cast<Out*>(out.data_ptr()), in.dtype() == DType::s4},
                       "cast");
      });
    } else {
      dispatch_all(in.dtype(), "cast", [&](auto tag) {
        using In = typename decltype(tag)::type;
        for_each_index(out.device(), bytes,
                       PackFrom<In>{static_cast<const In*>(in.data_ptr()), yb, n, out.dtype() == DType::s4}, "cast");
      });
    }
    return;
  }
  dispatch_all(in.dtype(), "cast", [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    dispatch_all(out.dtype(), "cast", [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      for_each_index(out.device(), out.numel(),
                     Cast<In, Out>{static_cast<const In*>(in.data_ptr()), static_cast<Out*>(out.data_ptr())}, "cast");
    });
  });
}

void rand_uniform(const Tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high) {
  dispatch_all(out.dtype(), "rand", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(),
                   RandUniform<T>{seed, offset, low, high, static_cast<T*>(out.data_ptr())}, "rand");
  });
}

void arange(const Tensor& out, double start, double step) {
  dispatch_all(out.dtype(), "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(), Arange<T>{start, step, static_cast<T*>(out.data_ptr())}, "arange");
  });
}

}  // namespace qgrad::kernels
