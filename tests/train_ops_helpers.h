// Helpers shared by the training-op tests (linalg, reduce, activation, loss).
#pragma once

#include "helpers.h"

namespace qgrad::testing {

inline TensorOptions opts(DType d = DType::f64, Device dev = Device::cpu()) {
  return TensorOptions{}.with_dtype(d).with_device(dev);
}
// Seeded standard-normal values (times scale).
inline Tensor rnd(const Shape& s, std::uint64_t seed, DType d = DType::f64, double scale = 1.0) {
  Generator g(seed);
  return randn(s, g, opts(d), 0.0, scale);
}
inline Tensor param(Tensor t) {
  t.set_requires_grad(true);
  return t;
}
// Full-mode gradcheck (f64) that reports its message on failure.
inline void check_grad(const GradcheckFn& fn, const std::vector<Tensor>& in) {
  const GradcheckResult r = gradcheck(fn, in);
  CHECK_MESSAGE(r.ok, r.message);
}
// Poisons a CUDA block of this size and frees it: the caching allocator hands
// it to the op's next allocation of that size, so unwritten elements show up.
inline void prepoison(const Shape& s, DType d) {
  Tensor p = Tensor::empty(s, opts(d, Device::cuda()));
  poison(p);
}

// Elementwise |got - want| within tol relative (doctest Approx, scale 1).
inline void check_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(tol).scale(1.0));
}

}  // namespace qgrad::testing
