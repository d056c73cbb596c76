// CPU kernels for fill, cast, rand and arange.
#include "qgrad/kernels/basic.h"
#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/core/random.h"

namespace qgrad::kernels::cpu {

void fill(const Tensor& out, double value) {
  dispatch_all(out.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = formulas::cast_value<T>(value);
    T* o = static_cast<T*>(out.data_ptr());
    parallel_for(out.numel(), [&](std::int64_t i) { o[i] = v; });
  });
}

void cast(const Tensor& in, const Tensor& out) {
  dispatch_all(in.dtype(), "cast", [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    dispatch_all(out.dtype(), "cast", [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      const In* x = static_cast<const In*>(in.data_ptr());
      Out* y = static_cast<Out*>(out.data_ptr());
      parallel_for(out.numel(), [&](std::int64_t i) { y[i] = formulas::cast_value<Out>(x[i]); });
    });
  });
}

void rand_uniform(const Tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high) {
  dispatch_all(out.dtype(), "rand", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.data_ptr());
    parallel_for(out.numel(), [&](std::int64_t i) {
      const double u = formulas::random_uniform(seed, offset + static_cast<std::uint64_t>(i));
      o[i] = formulas::cast_value<T>(low + (high - low) * u);
    });
  });
}

void arange(const Tensor& out, double start, double step) {
  dispatch_all(out.dtype(), "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.data_ptr());
    parallel_for(out.numel(), [&](std::int64_t i) { o[i] = formulas::cast_value<T>(start + step * static_cast<double>(i)); });
  });
}

}  // namespace qgrad::kernels::cpu
