// The CPU kernels' run-time vector paths (kernels/cpu/simd.h): where the CPU
// has AVX-512, the fake quant (values and mask bits), the observer's min/max
// and the masked gradients run sixteen lanes a step; forced off they run the
// SSE2 baseline. Both must give the same bits: the observer-fed fake quant per
// tensor and per channel (forward, running range, qparams, backward), relu's
// backward, with zeros of both signs, NaN, tails and sizes past the parallel
// grain.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "train_ops_helpers.h"
#include "qgrad/kernels/cpu/simd.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

using Outputs = std::vector<std::vector<float>>;

std::vector<float> floats(const Tensor& t) { return t.to(DType::f32).to_vector<float>(); }

// f32 values from a seeded normal draw (scale `spread`), with -0, +0 and, if
// asked, a NaN spread through them.
Tensor input(const Shape& shape, std::uint64_t seed, double spread, bool with_nan) {
  std::vector<float> v = rnd(shape, seed, DType::f32, spread).to_vector<float>();
  for (std::size_t i = 3; i < v.size(); i += 97) v[i] = -0.0f;
  for (std::size_t i = 11; i < v.size(); i += 89) v[i] = 0.0f;
  if (with_nan) v[v.size() / 2] = std::nanf("");
  return Tensor::from_vector(v, shape);
}

// f run with the AVX-512 paths allowed, then forced off: the same bytes.
void check_paths_agree(const std::function<Outputs()>& f) {
  kernels::cpu::allow_avx512(true);
  const Outputs wide = f();
  kernels::cpu::allow_avx512(false);
  const Outputs base = f();
  kernels::cpu::allow_avx512(true);
  REQUIRE(wide.size() == base.size());
  for (std::size_t k = 0; k < wide.size(); ++k) {
    CAPTURE(k);
    REQUIRE(wide[k].size() == base[k].size());
    CHECK(std::memcmp(wide[k].data(), base[k].data(), wide[k].size() * sizeof(float)) == 0);
  }
}

Outputs observed_fake_quant(const Tensor& x0, std::int64_t axis, bool moving) {
  const std::int64_t channels = axis < 0 ? 1 : x0.size(axis);
  const TensorOptions f32 = TensorOptions{}.with_dtype(DType::f32), s32 = TensorOptions{}.with_dtype(DType::s32);
  ObserverUpdate obs{full({channels}, INFINITY, f32), full({channels}, -INFINITY, f32), moving ? 0.01 : -1.0};
  Tensor scale = full({channels}, 1.0, f32), zp = zeros({channels}, s32);
  Outputs out;
  for (int step = 0; step < 2; ++step) {  // the second step moves a running range
    Tensor x = param(x0.detach().clone());
    Tensor y = axis < 0 ? observe_fake_quantize_per_tensor(x, scale, zp, -128, 127, obs)
                        : observe_fake_quantize_per_channel(x, scale, zp, axis, -128, 127, obs);
    y.backward(input(x0.shape(), 5, 1.0, false));
    for (const Tensor& t : {y, x.grad(), obs.run_min, obs.run_max, scale}) out.push_back(floats(t));
  }
  return out;
}

}  // namespace

TEST_CASE("CPU vector paths: the observer-fed fake quant gives the same bits with and without AVX-512") {
  const std::string paths = kernels::cpu::use_avx512() ? "run on this CPU" : "unavailable on this CPU (baseline only)";
  MESSAGE("AVX-512 paths: " << paths);
  for (const bool with_nan : {false, true})
    for (const bool moving : {false, true}) {
      CAPTURE(with_nan);
      CAPTURE(moving);
      check_paths_agree([&] { return observed_fake_quant(input({300, 257}, 1, 3.0, with_nan), -1, moving); });
      check_paths_agree([&] { return observed_fake_quant(input({64, 784}, 2, 3.0, with_nan), 0, moving); });
      check_paths_agree([&] { return observed_fake_quant(input({37, 300}, 3, 3.0, with_nan), 0, moving); });
      check_paths_agree([&] { return observed_fake_quant(input({300, 37}, 4, 3.0, with_nan), 1, moving); });
    }
}

TEST_CASE("CPU vector paths: relu's backward gives the same bits with and without AVX-512") {
  check_paths_agree([] {
    Tensor x = param(input({256, 300}, 6, 1.0, false));
    Tensor g = input({256, 300}, 7, 1.0, true);
    relu(x).backward(g);
    return Outputs{floats(x.grad())};
  });
}
