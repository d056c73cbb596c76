// Learnable fake quantize (LSQ): forward against fake quantize with the
// rounded zero point; gradients for x, scale and zero point against a host
// reference of PyTorch's formulas (bit for bit per element, and summed in
// double for the reductions); the documented zero-point rounding; checks.
#include "test_quant_ref.h"

using namespace qgrad;
using namespace qgrad::testing;
using namespace qref;

namespace {

struct LsqRef {
  double dx, ds, dz;
};

// PyTorch's per-element formula (_fake_quantize_grad_learnable_tensor_kernel)
// in op math M with its multiplication order; z is the forward-rounded zp.
template <class M>
LsqRef lsq_ref(M x, M dy, float s, std::int64_t z, std::int64_t qmin, std::int64_t qmax, M g) {
  const float inv = 1.0f / s;
  const M v = x * static_cast<M>(inv);
  if (std::isnan(v)) return {0, 0, 0};
  const long double q = static_cast<long double>(std::nearbyint(v)) + z;
  if (q < qmin || q > qmax) {
    const M dz = ((dy * M(-1)) * static_cast<M>(s)) * g;
    const M ds = (dy * static_cast<M>((q < qmin ? qmin : qmax) - z)) * g;
    return {static_cast<double>(dy * M(0)), static_cast<double>(ds), static_cast<double>(dz)};
  }
  const M xfq = static_cast<M>(static_cast<std::int64_t>(q) - z) * static_cast<M>(s);
  const M ds = ((dy * (xfq - x)) * static_cast<M>(inv)) * g;
  return {static_cast<double>(dy), static_cast<double>(ds), 0.0};
}

std::int64_t round_zp(double zp, std::int64_t qmin, std::int64_t qmax) {
  const double r = std::nearbyint(static_cast<float>(zp));
  return static_cast<std::int64_t>(std::min<double>(std::max<double>(r, qmin), qmax));
}

// Runs LSQ per channel (axis over shape) and checks every gradient.
template <class T>
void check_lsq(const Shape& shape, std::int64_t axis, DType param_dtype, double grad_factor, double rtol) {
  using M = op_math_t<T>;
  const std::int64_t rank = static_cast<std::int64_t>(shape.size());
  const std::int64_t ax = axis < 0 ? axis + rank : axis;
  const std::int64_t c = shape[static_cast<std::size_t>(ax)];
  std::int64_t inner = 1;
  for (std::int64_t d = ax + 1; d < rank; ++d) inner *= shape[static_cast<std::size_t>(d)];
  Generator g(static_cast<std::uint64_t>(c * 7 + ax));
  Tensor x = leaf_of(random_input(shape, dtype_of<T>, 3, 2.0));
  Tensor scale = leaf_of(rand({c}, g, TensorOptions{}.with_dtype(param_dtype), 0.01, 0.05));
  Tensor zp = leaf_of(rand({c}, g, TensorOptions{}.with_dtype(param_dtype), -20.0, 20.0));
  Tensor y = fake_quantize_learnable_per_channel(x, scale, zp, axis, -32, 31, grad_factor);
  Tensor dy = random_input(shape, dtype_of<T>, 4);
  y.backward(dy);
  const auto xs = host<T>(x), gs = host<T>(dy), dx = host<T>(x.grad()), ys = host<T>(y);
  const auto ss = values(scale), zs = values(zp), ds = values(scale.grad()), dz = values(zp.grad());
  std::vector<double> want_ds(static_cast<std::size_t>(c)), want_dz(static_cast<std::size_t>(c));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::size_t ch = (i / static_cast<std::size_t>(inner)) % static_cast<std::size_t>(c);
    const float s = static_cast<float>(ss[ch]);
    const std::int64_t z = round_zp(zs[ch], -32, 31);
    bool in;
    REQUIRE(same_bits(ys[i], ref_fake_quant(xs[i], s, z, -32, 31, in, true)));
    const LsqRef r = lsq_ref<M>(M(to_d(xs[i])), M(to_d(gs[i])), s, z, -32, 31, static_cast<M>(grad_factor));
    REQUIRE(same_bits(dx[i], to_t<T>(r.dx)));
    want_ds[ch] += r.ds;
    want_dz[ch] += r.dz;
  }
  for (std::size_t ch = 0; ch < want_ds.size(); ++ch) {
    CHECK(ds[ch] == doctest::Approx(want_ds[ch]).epsilon(rtol).scale(1.0));
    CHECK(dz[ch] == doctest::Approx(want_dz[ch]).epsilon(rtol).scale(1.0));
  }
  CHECK(scale.grad().dtype() == param_dtype);
  CHECK(scale.grad().shape() == Shape{c});
}

}  // namespace

TEST_CASE("LSQ per tensor: forward is fake quantize with the rounded, clamped zero point") {
  for (DType dt : kFloatTypes) {
    Tensor x = random_input({300}, dt, 1, 3.0);
    Tensor s = full({1}, 0.05), z = full({1}, 2.6);
    Tensor y = fake_quantize_learnable_per_tensor(x, s, z, -16, 15);
    CHECK(bit_equal(y, fake_quantize_per_tensor(x, 0.05, 3, -16, 15)));
    Tensor y2 = fake_quantize_learnable_per_tensor(x, s, full({1}, 40.0), -16, 15);  // clamped to qmax
    CHECK(bit_equal(y2, fake_quantize_per_tensor(x, 0.05, 15, -16, 15)));
  }
}

TEST_CASE("LSQ per channel: gradients for x, scale, zero point match PyTorch's formulas (f32)") {
  check_lsq<float>({6, 40}, 0, DType::f32, 1.0, 1e-4);
  check_lsq<float>({3, 5, 7}, 1, DType::f32, 0.5, 1e-4);
  check_lsq<float>({3, 5, 7}, -1, DType::f32, 1.0, 1e-4);
}

TEST_CASE("LSQ per channel: gradients in f64 against the double-precision reference") {
  check_lsq<double>({4, 3, 50}, 1, DType::f64, 1.0, 1e-12);
  check_lsq<double>({4, 3, 50}, 2, DType::f64, 0.25, 1e-12);
}

TEST_CASE("LSQ per channel: 16-bit inputs compute in float") {
  check_lsq<half>({5, 30}, 0, DType::f32, 1.0, 1e-4);
  check_lsq<bfloat16>({5, 30}, 1, DType::f32, 1.0, 1e-4);
}

TEST_CASE("LSQ: one element per channel gives PyTorch's per-element gradient bit for bit") {
  Generator g(9);
  Tensor x = leaf_of(random_input({64}, DType::f32, 10, 2.0));
  Tensor s = leaf_of(rand({64}, g, TensorOptions{}, 0.02, 0.06));
  Tensor z = leaf_of(randint(-10, 10, {64}, g).to(DType::f32));
  fake_quantize_learnable_per_channel(x, s, z, 0, -16, 15, 0.7).backward(ones({64}));
  const auto xs = x.to_vector<float>(), ss = s.to_vector<float>(), zs = z.to_vector<float>();
  const auto ds = s.grad().to_vector<float>(), dz = z.grad().to_vector<float>();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const LsqRef r = lsq_ref<float>(xs[i], 1.0f, ss[i], round_zp(zs[i], -16, 15), -16, 15, 0.7f);
    REQUIRE(same_bits(ds[i], static_cast<float>(r.ds)));
    REQUIRE(same_bits(dz[i], static_cast<float>(r.dz)));
  }
}

TEST_CASE("LSQ per tensor: gradients against the reference, large enough for many reduction chunks") {
  Tensor x = leaf_of(random_input({70000}, DType::f64, 12, 1.0));
  Tensor s = leaf_of(full({1}, 0.013, TensorOptions{}.with_dtype(DType::f64)));
  Tensor z = leaf_of(full({1}, -3.2, TensorOptions{}.with_dtype(DType::f64)));
  Tensor y = fake_quantize_learnable_per_tensor(x, s, z, -64, 63, 0.3);
  Tensor dy = random_input({70000}, DType::f64, 13);
  y.backward(dy);
  const auto xs = x.to_vector<double>(), gs = dy.to_vector<double>(), dx = x.grad().to_vector<double>();
  double ds = 0, dz = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const LsqRef r = lsq_ref<double>(xs[i], gs[i], static_cast<float>(0.013), -3, -64, 63, 0.3);
    REQUIRE(same_bits(dx[i], r.dx));
    ds += r.ds;
    dz += r.dz;
  }
  CHECK(s.grad().to_vector<double>()[0] == doctest::Approx(ds).epsilon(1e-10));
  CHECK(z.grad().to_vector<double>()[0] == doctest::Approx(dz).epsilon(1e-10));
  CHECK(s.grad().shape() == Shape{1});
}

TEST_CASE("LSQ: the zero point rounds the same way in forward and backward (PyTorch's do not)") {
  // x = -3, s = 1, zp = 2.5, range [0, 255]: forward rounds zp to 2 (even),
  // q = -1 is clamped, so the gradient is 0. PyTorch's backward rounds
  // zp + 0.5 down to 3, finds q = 0 in range and passes 1.
  Tensor x = leaf_of(Tensor::from_vector<float>({-3.f}, {1}));
  Tensor s = leaf_of(full({1}, 1.0)), z = leaf_of(full({1}, 2.5));
  Tensor y = fake_quantize_learnable_per_tensor(x, s, z, 0, 255);
  CHECK(y.to_vector<float>()[0] == -2.f);
  y.backward(ones({1}));
  CHECK(x.grad().to_vector<float>()[0] == 0.f);
  CHECK(z.grad().to_vector<float>()[0] == -1.f);  // below qmin: dz = -dy * s
  CHECK(s.grad().to_vector<float>()[0] == -2.f);  // dy * (qmin - z)
}

TEST_CASE("LSQ: grad_factor scales the scale and zero-point gradients only") {
  Tensor x0 = random_input({500}, DType::f32, 20, 3.0);
  auto run = [&](double gf) {
    Tensor x = leaf_of(x0), s = leaf_of(full({1}, 0.04)), z = leaf_of(full({1}, 1.0));
    fake_quantize_learnable_per_tensor(x, s, z, -32, 31, gf).backward(ones({500}));
    return std::vector<double>{s.grad().item(), z.grad().item(), values(x.grad())[7]};
  };
  const auto a = run(1.0), b = run(0.5);
  CHECK(b[0] == doctest::Approx(a[0] * 0.5));
  CHECK(b[1] == doctest::Approx(a[1] * 0.5));
  CHECK(b[2] == a[2]);
}

TEST_CASE("LSQ: repeated backward passes are bit-identical (deterministic reduction)") {
  Tensor x0 = random_input({3, 9000}, DType::f32, 21, 3.0);
  auto run = [&]() {
    Tensor x = leaf_of(x0), s = leaf_of(full({3}, 0.04)), z = leaf_of(full({3}, 1.0));
    fake_quantize_learnable_per_channel(x, s, z, 0, -32, 31).backward(ones({3, 9000}));
    return std::vector<Tensor>{s.grad(), z.grad(), x.grad()};
  };
  const auto a = run(), b = run();
  for (int i = 0; i < 3; ++i) CHECK(bit_equal(a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)]));
}

TEST_CASE("LSQ saves x and the rounded qparams") {
  Tensor x = leaf_of(random_input({4, 100}, DType::f32, 22));
  Tensor y = fake_quantize_learnable_per_channel(x, leaf_of(full({4}, 0.1)), leaf_of(full({4}, 0.0)), 0, -8, 7);
  CHECK(y.grad_fn()->saved_bytes == x.nbytes() + 4 * 4 + 4 * 4);
}

TEST_CASE("LSQ argument checks") {
  Tensor x = random_input({4, 3}, DType::f32, 1);
  const Tensor s = full({1}, 0.1), z = full({1}, 0.0);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x.to(DType::s32), s, z, -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, s.to(DType::s32), z, -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, s, z.to(DType::s32), -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, full({2}, 0.1), z, -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, s, full({2}, 0.0), -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, full({1}, 0.0), z, -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, full({1}, NAN), z, -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, s, full({1}, NAN), -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, s, z, 7, -8), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, s, z, -8, 7, INFINITY), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_tensor(x, Tensor(), z, -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_channel(x, full({3}, 0.1), full({3}, 0.0), 0, -8, 7), Error);
  CHECK_THROWS_AS(fake_quantize_learnable_per_channel(x, full({3}, 0.1), full({3}, 0.0), 2, -8, 7), Error);
  CHECK_NOTHROW(fake_quantize_learnable_per_channel(x, full({3}, 0.1), full({3}, 0.0), -1, -8, 7));
}
