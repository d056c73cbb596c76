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
  dispatch_all(out.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(), Fill<T>{formulas::cast_value<T>(value), static_cast<T*>(out.data_ptr())},
                   "fill");
  });
}

void cast(const Tensor& in, const Tensor& out) {
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
