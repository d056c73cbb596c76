// CUDA kernels for fill, cast, rand and arange (same formulas as the CPU).
//
// nvcc forbids __device__ lambdas inside generic lambdas, so each kernel
// body is a function template and the dispatch lambda only instantiates it.
#include "qgrad/kernels/basic.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/formulas/cast.h"
#include "qgrad/core/random.h"

namespace qgrad::kernels::cuda {

namespace {

template <class T>
void fill_impl(const Tensor& out, double value) {
  const T v = formulas::cast_value<T>(value);
  T* o = static_cast<T*>(out.data_ptr());
  launch_elementwise(out.device().index, out.numel(), [=] __device__(std::int64_t i) { o[i] = v; });
}

template <class In, class Out>
void cast_impl(const Tensor& in, const Tensor& out) {
  const In* x = static_cast<const In*>(in.data_ptr());
  Out* y = static_cast<Out*>(out.data_ptr());
  launch_elementwise(out.device().index, out.numel(),
                     [=] __device__(std::int64_t i) { y[i] = formulas::cast_value<Out>(x[i]); });
}

template <class T>
void rand_impl(const Tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high) {
  T* o = static_cast<T*>(out.data_ptr());
  launch_elementwise(out.device().index, out.numel(), [=] __device__(std::int64_t i) {
    const double u = formulas::random_uniform(seed, offset + static_cast<std::uint64_t>(i));
    o[i] = formulas::cast_value<T>(low + (high - low) * u);
  });
}

template <class T>
void arange_impl(const Tensor& out, double start, double step) {
  T* o = static_cast<T*>(out.data_ptr());
  launch_elementwise(out.device().index, out.numel(), [=] __device__(std::int64_t i) {
    o[i] = formulas::cast_value<T>(start + step * static_cast<double>(i));
  });
}

}  // namespace

void fill(const Tensor& out, double value) {
  dispatch_all(out.dtype(), "fill", [&](auto tag) { fill_impl<typename decltype(tag)::type>(out, value); });
}

void cast(const Tensor& in, const Tensor& out) {
  dispatch_all(in.dtype(), "cast", [&](auto in_tag) {
    dispatch_all(out.dtype(), "cast", [&](auto out_tag) {
      cast_impl<typename decltype(in_tag)::type, typename decltype(out_tag)::type>(in, out);
    });
  });
}

void rand_uniform(const Tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high) {
  dispatch_all(out.dtype(), "rand",
               [&](auto tag) { rand_impl<typename decltype(tag)::type>(out, seed, offset, low, high); });
}

void arange(const Tensor& out, double start, double step) {
  dispatch_all(out.dtype(), "arange", [&](auto tag) { arange_impl<typename decltype(tag)::type>(out, start, step); });
}

}  // namespace qgrad::kernels::cuda
