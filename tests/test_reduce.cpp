// sum, mean, argmax: host references, gradcheck, CUDA vs CPU, errors.
#include "train_ops_helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

// Reference sum over axis of a [d0, d1, d2] tensor, in double.
std::vector<double> ref_sum3(const std::vector<double>& x, const Shape& s, int axis, bool mean) {
  const std::int64_t d0 = s[0], d1 = s[1], d2 = s[2];
  std::vector<double> out;
  for (std::int64_t i = 0; i < (axis == 0 ? 1 : d0); ++i)
    for (std::int64_t j = 0; j < (axis == 1 ? 1 : d1); ++j)
      for (std::int64_t k = 0; k < (axis == 2 ? 1 : d2); ++k) {
        double acc = 0;
        const std::int64_t n = s[static_cast<std::size_t>(axis)];
        for (std::int64_t r = 0; r < n; ++r) {
          const std::int64_t ii = axis == 0 ? r : i, jj = axis == 1 ? r : j, kk = axis == 2 ? r : k;
          acc += x[static_cast<std::size_t>((ii * d1 + jj) * d2 + kk)];
        }
        out.push_back(mean ? acc / static_cast<double>(n) : acc);
      }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- values

TEST_CASE("sum and mean over all elements match a double reference") {
  Tensor x = rnd({4, 5, 6}, 1);
  double acc = 0;
  for (double v : values(x)) acc += v;
  Tensor s = sum(x), m = mean(x);
  CHECK(s.shape() == Shape{});
  CHECK(s.item() == doctest::Approx(acc).epsilon(1e-12));
  CHECK(m.item() == doctest::Approx(acc / 120).epsilon(1e-12));
}

TEST_CASE("sum over each axis, negative axes and keepdim") {
  const Shape sh{3, 4, 5};
  Tensor x = rnd(sh, 2);
  for (int axis = 0; axis < 3; ++axis) {
    Tensor a = sum(x, axis), b = sum(x, axis - 3, true);
    Shape want = sh;
    want.erase(want.begin() + axis);
    CHECK(a.shape() == want);
    Shape keep = sh;
    keep[static_cast<std::size_t>(axis)] = 1;
    CHECK(b.shape() == keep);
    check_near(values(a), ref_sum3(values(x), sh, axis, false), 1e-12);
    CHECK(values(b) == values(a));
  }
}

// Axes with 64 or more consecutive outputs (a bias gradient's column sums)
// run row by row over runs of outputs on the CPU: each output is still the
// in-order f32 sum from row 0 (bit for bit a float loop), for runs with a
// tail, several outer indices, sum and mean, past the parallel grain.
TEST_CASE("sum and mean over an axis with long inner runs: the in-order f32 sum, bit for bit") {
  for (const Shape& sh : {Shape{1, 300, 130}, Shape{3, 50, 100}, Shape{2, 256, 256}})
    for (const bool take_mean : {false, true}) {
      CAPTURE(shape_str(sh));
      CAPTURE(take_mean);
      const std::vector<float> x = rnd(sh, 4, DType::f32).to_vector<float>();
      const Tensor xt = Tensor::from_vector(x, sh);
      const std::vector<float> got = (take_mean ? mean(xt, 1) : sum(xt, 1)).to_vector<float>();
      const std::int64_t d1 = sh[1], d2 = sh[2];
      int wrong = 0;
      for (std::int64_t i = 0; i < sh[0]; ++i)
        for (std::int64_t k = 0; k < d2; ++k) {
          float acc = 0.0f;
          for (std::int64_t r = 0; r < d1; ++r) acc += x[static_cast<std::size_t>((i * d1 + r) * d2 + k)];
          const float want = take_mean ? acc / static_cast<float>(d1) : acc;
          wrong += got[static_cast<std::size_t>(i * d2 + k)] != want;
        }
      CHECK(wrong == 0);
    }
}

TEST_CASE("mean over each axis") {
  const Shape sh{2, 3, 7};
  Tensor x = rnd(sh, 3, DType::f32);
  for (int axis = 0; axis < 3; ++axis) check_near(values(mean(x, axis)), ref_sum3(values(x), sh, axis, true), 1e-5);
}

TEST_CASE("sum of an empty tensor is zero") {
  CHECK(sum(Tensor::empty({0, 3}, opts())).item() == 0.0);
  CHECK(values(sum(Tensor::empty({0, 3}, opts()), 0)) == std::vector<double>{0, 0, 0});
}

TEST_CASE("sum and mean in f16 and bf16 accumulate in f32") {
  Tensor x = rnd({64, 50}, 4, DType::f32);
  for (DType d : {DType::f16, DType::bf16}) {
    Tensor xd = x.to(d);
    Tensor ref = sum(xd.to(DType::f32), 1);
    Tensor got = sum(xd, 1);
    CHECK(got.dtype() == d);
    const double tol = d == DType::f16 ? 1e-2 : 5e-2;
    for (std::size_t i = 0; i < 64; ++i) CHECK(values(got)[i] == doctest::Approx(values(ref)[i]).epsilon(tol).scale(1.0));
    CHECK(mean(xd).item() == doctest::Approx(mean(xd.to(DType::f32)).item()).epsilon(tol).scale(1.0));
  }
}

TEST_CASE("argmax picks the first largest along an axis") {
  Tensor x = Tensor::from_vector<double>({1, 5, 5, 2, 7, 0, 3, 3, 3}, {3, 3});
  Tensor a = argmax(x);
  CHECK(a.dtype() == DType::s64);
  CHECK(a.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 1, 0});
  CHECK(argmax(x, 0).to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 1, 0});
}

TEST_CASE("argmax treats NaN as the largest") {
  Tensor x = Tensor::from_vector<float>({1.f, NAN, 9.f, 2.f}, {4});
  CHECK(argmax(x, 0).to_vector<std::int64_t>() == std::vector<std::int64_t>{1});
}

TEST_CASE("argmax matches a reference on random data (3-D, middle axis)") {
  Tensor x = rnd({4, 6, 5}, 5, DType::f32);
  auto v = values(x);
  auto got = argmax(x, 1).to_vector<std::int64_t>();
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < 5; ++k) {
      int best = 0;
      for (int r = 1; r < 6; ++r)
        if (v[static_cast<std::size_t>((i * 6 + r) * 5 + k)] > v[static_cast<std::size_t>((i * 6 + best) * 5 + k)]) best = r;
      CHECK(got[static_cast<std::size_t>(i * 5 + k)] == best);
    }
}

// ---------------------------------------------------------------- gradients

TEST_CASE("gradcheck sum over all elements") {
  check_grad([](const std::vector<Tensor>& in) { return sum(in[0]); }, {param(rnd({3, 4}, 10))});
}

TEST_CASE("gradcheck mean over all elements") {
  check_grad([](const std::vector<Tensor>& in) { return mean(in[0]); }, {param(rnd({3, 4}, 11))});
}

TEST_CASE("gradcheck sum over an axis (each axis, keepdim)") {
  for (int axis = -3; axis < 3; ++axis)
    check_grad([axis](const std::vector<Tensor>& in) { return sum(in[0], axis, axis < 0); },
               {param(rnd({2, 3, 4}, 12))});
}

TEST_CASE("gradcheck mean over an axis (each axis, keepdim)") {
  for (int axis = 0; axis < 3; ++axis)
    check_grad([axis](const std::vector<Tensor>& in) { return mean(in[0], axis, axis == 1); },
               {param(rnd({2, 3, 4}, 13))});
}

TEST_CASE("argmax records nothing") {
  Tensor x = param(rnd({3, 4}, 14));
  Tensor a = argmax(x);
  CHECK(!a.requires_grad());
}

// ---------------------------------------------------------------- errors

TEST_CASE("sum and mean reject bad inputs") {
  Tensor x = rnd({2, 3}, 15);
  CHECK_THROWS_AS(sum(Tensor()), Error);
  CHECK_THROWS_AS(sum(x.to(DType::s32)), Error);
  CHECK_THROWS_AS(sum(x, 2), Error);
  CHECK_THROWS_AS(sum(x, -3), Error);
  CHECK_THROWS_AS(mean(x, 5, true), Error);
  CHECK_THROWS_AS(mean(x.to(DType::s64), 0), Error);
  CHECK_THROWS_AS(mean(Tensor::empty({0, 3}, opts())), Error);      // mean of nothing
  CHECK_THROWS_AS(mean(Tensor::empty({2, 0}, opts()), 1), Error);
  CHECK_THROWS_AS(sum(Tensor::scalar(1.0), 0), Error);             // no axis on a scalar
}

TEST_CASE("argmax rejects bad inputs") {
  CHECK_THROWS_AS(argmax(Tensor()), Error);
  CHECK_THROWS_AS(argmax(rnd({2, 3}, 16), 2), Error);
  CHECK_THROWS_AS(argmax(Tensor::empty({2, 0}, opts()), 1), Error);
  CHECK_THROWS_AS(argmax(arange(0, 4, 1, opts(DType::s64))), Error);
}

// ---------------------------------------------------------------- CUDA

TEST_CASE("cuda sum over short rows is bit-identical to the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor x = rnd({37, 100}, 20, DType::f32);
  Tensor xc = x.cuda();
  prepoison({37}, DType::f32);
  CHECK(bit_equal(sum(xc, 1), sum(x, 1)));
  prepoison({100}, DType::f32);
  CHECK(bit_equal(sum(xc, 0, false), sum(x, 0, false)));
}

TEST_CASE("cuda sum and mean over a few very long rows (two passes) match the CPU") {
  QGRAD_REQUIRE_GPU();
  Generator g(21);
  Tensor x = rand({5, 100003}, g, opts(DType::f32), 0.5, 1.5);
  Tensor xc = x.cuda();
  prepoison({5}, DType::f32);
  Tensor s = sum(xc, 1).cpu(), r = sum(x.to(DType::f64), 1).to(DType::f32);
  for (std::size_t i = 0; i < 5; ++i) CHECK(values(s)[i] == doctest::Approx(values(r)[i]).epsilon(1e-5));
  CHECK(sum(xc).item() == doctest::Approx(sum(x.to(DType::f64)).item()).epsilon(1e-5));
  CHECK(mean(xc).item() == doctest::Approx(mean(x.to(DType::f64)).item()).epsilon(1e-5));
  CHECK(bit_equal(sum(xc), sum(xc)));  // deterministic
}

TEST_CASE("cuda sum over many long rows (one block per row) matches the CPU") {
  QGRAD_REQUIRE_GPU();
  Generator g(27);
  Tensor x = rand({1024, 16500}, g, opts(DType::f32), 0.5, 1.5);
  Tensor got = sum(x.cuda(), 1), want = sum(x.to(DType::f64), 1);
  check_near(values(got), values(want), 1e-5);
  Tensor m = mean(x.cuda(), -1, true);
  CHECK(m.shape() == Shape{1024, 1});
  check_near(values(m), values(mean(x.to(DType::f64), 1)), 1e-5);
}

TEST_CASE("cuda column sums (a long strided axis: chunks of rows, then the chunks) match the CPU") {
  QGRAD_REQUIRE_GPU();
  Generator g(28);
  // [rows, features] over axis 0 (a bias gradient; 12800 rows = 200 chunks,
  // 1000 = 15 chunks + 40, 129 = one chunk + 1; 37 and 300 features: column
  // tiles with tails), and a middle axis of a 3-D tensor.
  for (const std::int64_t rows : {129LL, 1000LL, 12800LL})
  for (const std::int64_t cols : {37LL, 300LL}) {
    CAPTURE(rows);
    CAPTURE(cols);
    Tensor x = rand({rows, cols}, g, opts(DType::f32), -1.0, 1.5);
    Tensor xc = x.cuda();
    prepoison({cols}, DType::f32);
    Tensor got = sum(xc, 0), want = sum(x.to(DType::f64), 0);
    check_near(values(got), values(want), 1e-5);
    check_near(values(mean(xc, 0)), values(mean(x.to(DType::f64), 0)), 1e-5);
    CHECK(bit_equal(sum(xc, 0), got));  // deterministic
  }
  Tensor y = rand({3, 700, 5}, g, opts(DType::f32), -1.0, 1.5);
  check_near(values(sum(y.cuda(), 1)), values(sum(y.to(DType::f64), 1)), 1e-5);
}

TEST_CASE("cuda sum in f64, f16 and bf16 matches the CPU") {
  QGRAD_REQUIRE_GPU();
  for (DType d : {DType::f64, DType::f16, DType::bf16}) {
    Tensor x = rnd({7, 300}, 22, DType::f32).to(d);
    const double tol = d == DType::f64 ? 1e-12 : 1e-2;
    auto got = values(sum(x.cuda(), 1)), want = values(sum(x, 1));
    for (std::size_t i = 0; i < 7; ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(tol).scale(1.0));
  }
}

TEST_CASE("cuda argmax is bit-identical to the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor x = rnd({6, 50, 3}, 23, DType::f32);
  CHECK(bit_equal(argmax(x.cuda(), 1), argmax(x, 1)));
  CHECK(bit_equal(argmax(x.cuda(), -1), argmax(x, -1)));
}

TEST_CASE("cuda gradcheck sum and mean") {
  QGRAD_REQUIRE_GPU();
  check_grad([](const std::vector<Tensor>& in) { return sum(in[0]); }, {param(rnd({3, 4}, 24).cuda())});
  check_grad([](const std::vector<Tensor>& in) { return mean(in[0], 1, true); }, {param(rnd({3, 4}, 25).cuda())});
  check_grad([](const std::vector<Tensor>& in) { return sum(in[0], 0); }, {param(rnd({300, 2}, 26).cuda())});
}
