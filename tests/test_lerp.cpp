// lerp: the two-branch forward, gradcheck in f64 (scalar and tensor
// weight, broadcasting), the backward formulas bit for bit, and checks.
#include <cmath>

#include "test_quant_ref.h"

using namespace qgrad;
using namespace qgrad::testing;
using namespace qref;

namespace {

template <class M>
M ref_lerp(M a, M b, M w) {
  return std::fabs(w) < M(0.5) ? std::fma(w, b - a, a) : std::fma(-(b - a), M(1) - w, b);
}

TensorOptions opts(DType dt) { return TensorOptions{}.with_dtype(dt); }

}  // namespace

TEST_CASE("lerp forward: PyTorch's two branches as fused multiply-adds, every dtype") {
  for (DType dt : kFloatTypes) {
    Generator g(1);
    Tensor a = random_input({1000}, dt, 2), b = random_input({1000}, dt, 3);
    Tensor w = rand({1000}, g, opts(dt), -0.5, 1.5);
    Tensor y = lerp(a, b, w), ys = lerp(a, b, 0.3), yb = lerp(a, b, 0.8);
    dispatch_floating(dt, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = op_math_t<T>;
      const auto av = host<T>(a), bv = host<T>(b), wv = host<T>(w), yv = host<T>(y);
      const auto ysv = host<T>(ys), ybv = host<T>(yb);
      for (std::size_t i = 0; i < av.size(); ++i) {
        const M ai = M(to_d(av[i])), bi = M(to_d(bv[i]));
        REQUIRE(same_bits(yv[i], to_t<T>(ref_lerp<M>(ai, bi, M(to_d(wv[i]))))));
        REQUIRE(same_bits(ysv[i], to_t<T>(ref_lerp<M>(ai, bi, static_cast<M>(0.3)))));
        REQUIRE(same_bits(ybv[i], to_t<T>(ref_lerp<M>(ai, bi, static_cast<M>(0.8)))));
      }
    });
  }
}

TEST_CASE("lerp: exact at both ends and at the branch point") {
  Tensor a = Tensor::from_vector<float>({1.f, -3.f, 0.1f}, {3}), b = Tensor::from_vector<float>({5.f, 7.f, 0.7f}, {3});
  CHECK(bit_equal(lerp(a, b, 0.0), a));
  CHECK(bit_equal(lerp(a, b, 1.0), b));
  CHECK(lerp(a, b, 0.5).to_vector<float>()[0] == 3.f);
}

TEST_CASE("lerp: a zero result has PyTorch's sign (end - (end - self) * (1 - weight))") {
  // w = 1: the result is b; for b = -0 the sign follows -(b - a): +0 for
  // a > 0, -0 for a < 0 (and +0 for b = +0). Every dtype, scalar and
  // tensor weight, CPU and (when present) CUDA.
  const std::vector<double> av{2.5, -2.5, 1.0, -0.0, 0.0, 3.0};
  const std::vector<double> bv{-0.0, -0.0, 0.0, -0.0, -0.0, 0.0};
  const std::vector<bool> want_negative{false, true, false, true, false, false};
  for (const Device dev : test_devices()) {
    for (DType dt : kFloatTypes) {
      const Tensor a = Tensor::from_vector(av, {6}).to(dt).to(dev), b = Tensor::from_vector(bv, {6}).to(dt).to(dev);
      const Tensor w = full({6}, 1.0, TensorOptions{}.with_dtype(dt).with_device(dev));
      for (const Tensor& y : {lerp(a, b, 1.0), lerp(a, b, w)}) {
        const std::vector<double> yv = y.to(DType::f64).cpu().to_vector<double>();
        for (std::size_t i = 0; i < yv.size(); ++i) {
          INFO("device ", dev.str(), " dtype ", dtype_name(dt), " a = ", av[i], " b = ", bv[i]);
          CHECK(yv[i] == 0.0);
          CHECK(std::signbit(yv[i]) == want_negative[i]);
        }
      }
    }
  }
}

TEST_CASE("lerp: signed zeros as Lerp.h's expression gives them, weights 0, -0, 0.5, 1 and a tensor of them") {
  // Every pair a, b of {+0, -0, 1.5, -1.5} under each weight (one block of
  // 16 rows per weight); the reference is PyTorch's expression as written in
  // Lerp.h, unfused (every operation here is exact, so fused and unfused
  // give the same value and the same zero). Checked: value and sign bit,
  // with the weights as a tensor and with each weight as a scalar.
  const std::vector<double> vals{0.0, -0.0, 1.5, -1.5}, weights{0.0, -0.0, 0.5, 1.0};
  const std::size_t block = vals.size() * vals.size();
  std::vector<double> av, bv, wv;
  for (double w : weights)
    for (double x : vals)
      for (double y : vals) av.push_back(x), bv.push_back(y), wv.push_back(w);
  const auto n = static_cast<std::int64_t>(av.size());
  auto pytorch = [](double a, double b, double w) {
    return std::fabs(w) < 0.5 ? a + w * (b - a) : b - (b - a) * (1.0 - w);
  };
  std::size_t zeros = 0, negative_zeros = 0;
  for (std::size_t i = 0; i < av.size(); ++i) {
    const double r = pytorch(av[i], bv[i], wv[i]);
    zeros += r == 0.0;
    negative_zeros += r == 0.0 && std::signbit(r);
  }
  CHECK(zeros == 30);  // both signs of zero occur under the weights
  CHECK(negative_zeros == 7);
  auto check_rows = [&](const Tensor& y, std::size_t first, std::size_t count, const std::string& what) {
    const std::vector<double> yv = y.to(DType::f64).cpu().to_vector<double>();
    for (std::size_t i = first; i < first + count; ++i) {
      const double want = pytorch(av[i], bv[i], wv[i]);
      INFO(what, ": a = ", av[i], " b = ", bv[i], " w = ", wv[i], " want ", want, " got ", yv[i]);
      CHECK(yv[i] == want);
      CHECK(std::signbit(yv[i]) == std::signbit(want));
    }
  };
  for (const Device dev : test_devices()) {
    for (DType dt : kFloatTypes) {
      const std::string where = dev.str() + " " + dtype_name(dt);
      const Tensor a = Tensor::from_vector(av, {n}).to(dt).to(dev), b = Tensor::from_vector(bv, {n}).to(dt).to(dev);
      check_rows(lerp(a, b, Tensor::from_vector(wv, {n}).to(dt).to(dev)), 0, av.size(), where + " tensor weight");
      for (std::size_t k = 0; k < weights.size(); ++k)
        check_rows(lerp(a, b, weights[k]), k * block, block, where + " scalar weight");
    }
  }
}

TEST_CASE("lerp gradcheck (f64): scalar weight") {
  Tensor a = leaf_of(random_input({3, 4}, DType::f64, 1)), b = leaf_of(random_input({3, 4}, DType::f64, 2));
  for (double w : {0.2, 0.7, -0.3, 1.4}) {
    auto r = gradcheck([w](const std::vector<Tensor>& in) { return lerp(in[0], in[1], w); }, {a, b});
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("lerp gradcheck (f64): tensor weight on both branches") {
  Generator g(3);
  Tensor a = leaf_of(random_input({4, 5}, DType::f64, 4)), b = leaf_of(random_input({4, 5}, DType::f64, 5));
  Tensor w = leaf_of(rand({4, 5}, g, opts(DType::f64), -0.4, 1.4));
  auto r = gradcheck([](const std::vector<Tensor>& in) { return lerp(in[0], in[1], in[2]); }, {a, b, w});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("lerp gradcheck (f64): broadcasting a, b and weight") {
  Generator g(6);
  Tensor a = leaf_of(random_input({3, 1}, DType::f64, 7)), b = leaf_of(random_input({4}, DType::f64, 8));
  Tensor w = leaf_of(rand({2, 1, 1}, g, opts(DType::f64), 0.0, 1.0));
  auto r = gradcheck([](const std::vector<Tensor>& in) { return lerp(in[0], in[1], in[2]); }, {a, b, w});
  CHECK_MESSAGE(r.ok, r.message);
  Tensor y = lerp(a, b, w);
  CHECK(y.shape() == Shape{2, 3, 4});
  auto r2 = gradcheck([](const std::vector<Tensor>& in) { return lerp(in[0], in[1], 0.6); }, {a, b});
  CHECK_MESSAGE(r2.ok, r2.message);
}

TEST_CASE("lerp backward: da = dy (1 - w), db = dy w, dw = dy (b - a), rounded as PyTorch") {
  for (DType dt : kFloatTypes) {
    Generator g(9);
    Tensor a = leaf_of(random_input({300}, dt, 10)), b = leaf_of(random_input({300}, dt, 11));
    Tensor w = leaf_of(rand({300}, g, opts(dt), -0.5, 1.5));
    Tensor dy = random_input({300}, dt, 12);
    lerp(a, b, w).backward(dy);
    dispatch_floating(dt, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = op_math_t<T>;
      const auto av = host<T>(a), bv = host<T>(b), wv = host<T>(w), gv = host<T>(dy);
      const auto da = host<T>(a.grad()), db = host<T>(b.grad()), dw = host<T>(w.grad());
      for (std::size_t i = 0; i < av.size(); ++i) {
        const M gi = M(to_d(gv[i]));
        const T one_minus = to_t<T>(M(1) - M(to_d(wv[i])));
        REQUIRE(same_bits(da[i], to_t<T>(gi * M(to_d(one_minus)))));
        REQUIRE(same_bits(db[i], to_t<T>(gi * M(to_d(wv[i])))));
        const T diff = to_t<T>(M(to_d(bv[i])) - M(to_d(av[i])));
        REQUIRE(same_bits(dw[i], to_t<T>(gi * M(to_d(diff)))));
      }
    });
    // scalar weight: (1 - w) in double, then op math
    Tensor a2 = leaf_of(a), b2 = leaf_of(b);
    lerp(a2, b2, 0.3).backward(dy);
    dispatch_floating(dt, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using M = op_math_t<T>;
      const auto gv = host<T>(dy), da = host<T>(a2.grad()), db = host<T>(b2.grad());
      for (std::size_t i = 0; i < gv.size(); ++i) {
        REQUIRE(same_bits(da[i], to_t<T>(M(to_d(gv[i])) * static_cast<M>(1.0 - 0.3))));
        REQUIRE(same_bits(db[i], to_t<T>(M(to_d(gv[i])) * static_cast<M>(0.3))));
      }
    });
  }
}

TEST_CASE("lerp backward reduces each gradient to its input's shape") {
  Tensor a = leaf_of(ones({2, 3}, opts(DType::f64))), b = leaf_of(full({3}, 3.0, opts(DType::f64)));
  Tensor w = leaf_of(full({}, 0.25, opts(DType::f64)));
  lerp(a, b, w).backward(ones({2, 3}, opts(DType::f64)));
  CHECK(a.grad().to_vector<double>() == std::vector<double>(6, 0.75));
  CHECK(b.grad().to_vector<double>() == std::vector<double>(3, 0.5));
  CHECK(w.grad().shape() == Shape{});
  CHECK(w.grad().to_vector<double>()[0] == 12.0);
}

TEST_CASE("lerp saves only what the needed gradients read") {
  Tensor a = leaf_of(random_input({64}, DType::f32, 1)), b = random_input({64}, DType::f32, 2);
  CHECK(lerp(a, b, 0.3).grad_fn()->saved_bytes == 0);
  Tensor w = random_input({64}, DType::f32, 3);
  CHECK(lerp(a, b, w).grad_fn()->saved_bytes == w.nbytes());
  Tensor wl = leaf_of(w);
  CHECK(lerp(b, b, wl).grad_fn()->saved_bytes == 2 * b.nbytes());
}

TEST_CASE("lerp argument checks") {
  Tensor a = random_input({3}, DType::f32, 1), b = random_input({3}, DType::f32, 2);
  CHECK_THROWS_AS(lerp(Tensor(), b, 0.5), Error);
  CHECK_THROWS_AS(lerp(a, Tensor(), 0.5), Error);
  CHECK_THROWS_AS(lerp(a.to(DType::s32), b.to(DType::s32), 0.5), Error);
  CHECK_THROWS_AS(lerp(a, b.to(DType::f64), 0.5), Error);
  CHECK_THROWS_AS(lerp(a, random_input({4}, DType::f32, 3), 0.5), Error);
  CHECK_THROWS_AS(lerp(a, b, NAN), Error);
  CHECK_THROWS_AS(lerp(a, b, INFINITY), Error);
  CHECK_THROWS_AS(lerp(a, b, Tensor()), Error);
  CHECK_THROWS_AS(lerp(a, b, b.to(DType::f64)), Error);
  CHECK_THROWS_AS(lerp(a, b, random_input({2}, DType::f32, 4)), Error);
}
