// More of the tape: integer outputs with float gradients, retain_graph,
// accumulation across branches, explicit non-scalar gradients, errors,
// conversions and views, and gradcheck's reporting.
#include <cmath>
#include <string>

#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

const TensorOptions f64 = TensorOptions{}.with_dtype(DType::f64);
const TensorOptions f32 = TensorOptions{};

Tensor leaf(const Shape& s, std::uint64_t seed, TensorOptions o = f64) {
  Generator g(seed);
  Tensor t = randn(s, g, o);
  t.set_requires_grad(true);
  return t;
}

// A fake per-tensor quantizer: f32 -> s8 (round(x / scale), clamped), its
// gradient the straight-through estimator, travelling in f32.
Tensor fake_quantize(const Tensor& x, float scale) {
  auto v = x.detach().to_vector<float>();
  std::vector<std::int8_t> q(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    q[i] = static_cast<std::int8_t>(std::fmax(-128.0f, std::fmin(127.0f, std::nearbyint(v[i] / scale))));
  Tensor out = Tensor::from_vector(q, x.shape());
  if (any_requires_grad({x}))
    record("quantize", out, {x}, [scale](const Tensor& g) { return std::vector<Tensor>{mul(g, 1.0 / scale)}; },
           0, DType::f32, true);
  return out;
}

Tensor fake_dequantize(const Tensor& q, float scale) {
  auto v = q.detach().to_vector<std::int8_t>();
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]) * scale;
  Tensor out = Tensor::from_vector(f, q.shape());
  if (any_requires_grad({q}))
    record("dequantize", out, {q}, [scale](const Tensor& g) { return std::vector<Tensor>{mul(g, double(scale))}; });
  return out;
}

}  // namespace

TEST_CASE("an integer output carries a float gradient through quantize/dequantize") {
  Tensor x = Tensor::from_vector<float>({0.3f, -1.2f, 2.5f, 0.05f}, {4});
  x.set_requires_grad(true);
  Tensor q = fake_quantize(x, 0.1f);
  CHECK(q.dtype() == DType::s8);
  CHECK(q.requires_grad());
  REQUIRE(q.grad_fn() != nullptr);
  CHECK(q.grad_fn()->grad_dtype == DType::f32);
  CHECK(q.to_vector<std::int8_t>() == std::vector<std::int8_t>{3, -12, 25, 0});
  Tensor y = mul(fake_dequantize(q, 0.1f), Tensor::from_vector<float>({1, 2, 3, 4}, {4}));
  y.backward(ones({4}));
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == DType::f32);
  const auto g = x.grad().to_vector<float>();
  for (int i = 0; i < 4; ++i) CHECK(g[static_cast<std::size_t>(i)] == doctest::Approx(i + 1.0));
}

TEST_CASE("backward from an integer output seeds a float gradient") {
  Tensor x = Tensor::from_vector<float>({0.5f, 1.0f}, {2});
  x.set_requires_grad(true);
  Tensor q = fake_quantize(x, 0.5f);
  q.backward(ones({2}));  // the caller's f32 grad for an s8 output
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2.0f, 2.0f});
  Tensor x1 = Tensor::from_vector<float>({0.5f}, {1});
  x1.set_requires_grad(true);
  fake_quantize(x1, 0.25f).backward();  // implied ones, in the grad dtype
  CHECK(x1.grad().dtype() == DType::f32);
  CHECK(x1.grad().to_vector<float>()[0] == 4.0f);
}

TEST_CASE("a grad_dtype that is not floating is refused") {
  Tensor x = leaf({2}, 1);
  Tensor out = Tensor::empty({2}, TensorOptions{}.with_dtype(DType::s8));
  CHECK_THROWS_AS(record("bad", out, {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; }, 0, DType::s8, true),
                  Error);
  Tensor out2 = Tensor::empty({2}, TensorOptions{}.with_dtype(DType::s8));
  // Defaulting to an integer output's own dtype is refused too.
  CHECK_THROWS_AS(record("bad", out2, {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; }), Error);
}

TEST_CASE("retain_graph keeps the graph for a second pass with the same result") {
  Tensor x = leaf({3}, 2);
  Tensor y = mul(mul(x, x), x);  // 3x^2
  y.backward(ones({3}, f64), /*retain_graph=*/true);
  const auto first = values(x.grad());
  x.zero_grad();
  y.backward(ones({3}, f64), /*retain_graph=*/true);
  CHECK(values(x.grad()) == first);
  y.backward(ones({3}, f64));  // accumulates, then frees
  const auto xv = values(x);
  const auto g = values(x.grad());
  for (std::size_t i = 0; i < 3; ++i) CHECK(g[i] == doctest::Approx(6 * xv[i] * xv[i]));
  CHECK_THROWS_AS(y.backward(ones({3}, f64)), Error);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->released);
}

TEST_CASE("a leaf used in several branches sums every contribution") {
  Tensor w = leaf({2, 2}, 3);
  Tensor a = mul(w, 2.0);
  Tensor b = mul(w, w);
  Tensor c = add(w, 1.0);
  Tensor d = add(add(a, b), mul(c, a));  // 2w + w^2 + (w+1)*2w = 4w^2 + 4w... d/dw = 2 + 2w + 4w + 2 = 6w + 4
  d.backward(ones({2, 2}, f64));
  const auto wv = values(w), g = values(w.grad());
  for (std::size_t i = 0; i < 4; ++i) CHECK(g[i] == doctest::Approx(6 * wv[i] + 4));
}

TEST_CASE("a shared intermediate node runs its backward once with the summed gradient") {
  Tensor x = leaf({2}, 4);
  int calls = 0;
  Tensor mid = x.detach().clone();
  record("counted", mid, {x}, [&calls](const Tensor& g) {
    ++calls;
    return std::vector<Tensor>{g};
  });
  Tensor y = add(mul(mid, 3.0), mul(mid, 4.0));
  y.backward(ones({2}, f64));
  CHECK(calls == 1);
  CHECK(values(x.grad()) == std::vector<double>{7.0, 7.0});
}

TEST_CASE("backward with an explicit non-scalar gradient") {
  Tensor x = leaf({2, 3}, 5);
  Tensor y = mul(x, x);
  Tensor gy = Tensor::from_vector<double>({1, -1, 2, 0.5, 0, 3}, {2, 3});
  y.backward(gy);
  const auto xv = values(x), g = values(x.grad()), gv = values(gy);
  for (std::size_t i = 0; i < 6; ++i) CHECK(g[i] == doctest::Approx(2 * xv[i] * gv[i]));
}

TEST_CASE("backward errors: no grad, implied grad of a non-scalar, wrong grad shape") {
  Tensor plain = ones({2}, f64);
  CHECK_THROWS_AS(plain.backward(), Error);
  CHECK_THROWS_AS(Tensor().backward(), Error);
  Tensor x = leaf({2, 2}, 6);
  Tensor y = mul(x, 2.0);
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("one-element"), Error);
  CHECK_THROWS_WITH_AS(y.backward(ones({4}, f64)), doctest::Contains("does not match"), Error);
  CHECK_THROWS_AS(y.backward(ones({2, 3}, f64)), Error);
  CHECK(!x.grad().defined());  // nothing was written by the failed calls
  y.backward(ones({2, 2}, f64));
  CHECK(values(x.grad()) == std::vector<double>{2, 2, 2, 2});
}

TEST_CASE("a backward rule returning a wrong shape or count is reported") {
  Tensor x = leaf({3}, 7);
  Tensor y = x.detach().clone();
  record("bad_shape", y, {x}, [](const Tensor&) { return std::vector<Tensor>{ones({4}, f64)}; });
  CHECK_THROWS_WITH_AS(y.backward(ones({3}, f64)), doctest::Contains("bad_shape"), Error);
  Tensor z = x.detach().clone();
  record("bad_count", z, {x}, [](const Tensor& g) { return std::vector<Tensor>{g, g}; });
  CHECK_THROWS_WITH_AS(z.backward(ones({3}, f64)), doctest::Contains("bad_count"), Error);
}

TEST_CASE("set_requires_grad: refused for non-leaves and integer tensors") {
  Tensor x = leaf({2}, 8);
  Tensor y = mul(x, x);
  CHECK(!y.is_leaf());
  CHECK_THROWS_AS(y.set_requires_grad(true), Error);
  Tensor i8 = zeros({2}, TensorOptions{}.with_dtype(DType::s8));
  CHECK_THROWS_AS(i8.set_requires_grad(true), Error);
  Tensor u8 = zeros({2}, TensorOptions{}.with_dtype(DType::u8));
  CHECK_THROWS_AS(u8.set_requires_grad(true), Error);
  i8.set_requires_grad(false);  // turning it off is always allowed
  CHECK(!i8.requires_grad());
  Tensor p = ones({2});
  CHECK_THROWS_AS(Tensor().set_requires_grad(true), Error);
  p.set_parameter("p");
  CHECK(p.requires_grad());
  CHECK(p.is_leaf());
  CHECK(p.name() == "p");
  CHECK(p.autograd_meta().is_parameter);
}

TEST_CASE("to(dtype) is differentiable between floating dtypes") {
  Tensor x = leaf({3}, 9, f32);
  Tensor y = mul(x.to(DType::f64), 2.0);
  CHECK(y.dtype() == DType::f64);
  y.backward(ones({3}, f64));
  CHECK(x.grad().dtype() == DType::f32);
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2, 2, 2});
  // A cast to an integer is not recorded: the result is a constant.
  Tensor i = leaf({3}, 9, f32).to(DType::s8);
  CHECK(!i.requires_grad());
  // Converting to its own dtype returns the same tensor.
  CHECK(x.to(DType::f32).impl() == x.impl());
}

TEST_CASE("to(device) is differentiable (GPU)") {
  QGRAD_REQUIRE_GPU();
  Tensor x = leaf({4}, 10);
  Tensor y = mul(x.cuda(), 3.0);
  CHECK(y.is_cuda());
  y.backward(ones({4}, TensorOptions{}.with_dtype(DType::f64).with_device(Device::cuda())));
  CHECK(x.grad().device() == Device::cpu());
  CHECK(values(x.grad()) == std::vector<double>{3, 3, 3, 3});
}

TEST_CASE("to(cpu) of a CPU tensor is the tensor itself") {
  Tensor x = leaf({2}, 11);
  CHECK(x.to(Device::cpu()).impl() == x.impl());
  CHECK(x.cpu().grad_fn() == nullptr);
}

TEST_CASE("clone and reshape pass gradients back in the original shape") {
  Tensor x = leaf({2, 3}, 12);
  Tensor c = x.clone();
  CHECK(c.data_ptr() != x.data_ptr());
  Tensor r = c.reshape({3, -1});
  CHECK(r.shape() == Shape{3, 2});
  CHECK(r.data_ptr() == c.data_ptr());
  Tensor f = mul(r, r).flatten();
  f.backward(ones({6}, f64));
  CHECK(x.grad().shape() == Shape{2, 3});
  const auto xv = values(x), g = values(x.grad());
  for (std::size_t i = 0; i < 6; ++i) CHECK(g[i] == doctest::Approx(2 * xv[i]));
  CHECK_THROWS_AS(x.reshape({4, -1}), Error);
  CHECK_THROWS_AS(x.reshape({-1, -1}), Error);
}

TEST_CASE("gradcheck passes through clone, reshape and to(dtype)") {
  Tensor a = leaf({2, 3}, 13);
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor t = in[0].clone().reshape({3, 2}).to(DType::f32).to(DType::f64);
    return mul(t, t);
  };
  GradcheckOptions o;
  o.atol = 1e-4;  // the f32 round trip costs precision
  o.eps = 1e-3;
  auto r = gradcheck(fn, {a}, o);
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("gradcheck fast mode fails on a wrong rule and full mode names the worst element") {
  Tensor a = leaf({5}, 14);
  // Correct except for element 3, whose gradient is 1.5 instead of 1.
  auto wrong = [](const std::vector<Tensor>& in) {
    Tensor out = in[0].detach().clone();
    if (any_requires_grad({in[0]}))
      record("wrong_at_3", out, {in[0]}, [](const Tensor& g) {
        return std::vector<Tensor>{mul(g, Tensor::from_vector<double>({1, 1, 1, 1.5, 1}, {5}))};
      });
    return out;
  };
  GradcheckOptions fast;
  fast.fast_mode = true;
  auto rf = gradcheck(wrong, {a}, fast);
  CHECK(!rf.ok);
  CHECK(rf.message.find("FAILED") != std::string::npos);
  CHECK(rf.message.find("fast mode") != std::string::npos);

  auto r = gradcheck(wrong, {a});
  CHECK(!r.ok);
  CHECK(r.worst_input == 0);
  CHECK(r.worst_input_index == 3);
  CHECK(r.worst_output_index == 3);
  CHECK(r.analytical == doctest::Approx(1.5));
  CHECK(r.numerical == doctest::Approx(1.0));
  CHECK(r.max_abs_error == doctest::Approx(0.5));
  CHECK(r.message.find("element 3") != std::string::npos);
  CHECK(r.message.find("input 0") != std::string::npos);
  CHECK(!a.grad().defined());
}

TEST_CASE("gradcheck checks only inputs that require grad, and validates its inputs") {
  Tensor a = leaf({3}, 15);
  Generator g(16);
  Tensor b = randn({3}, g, f64);  // no grad
  auto fn = [](const std::vector<Tensor>& in) { return mul(in[0], in[1]); };
  auto r = gradcheck(fn, {a, b});
  CHECK_MESSAGE(r.ok, r.message);
  CHECK_THROWS_AS(gradcheck(fn, {b, b}), Error);                      // nothing requires grad
  CHECK_THROWS_AS(gradcheck(fn, {leaf({3}, 17, f32), b}), Error);     // not f64
  CHECK_THROWS_AS(gradcheck(fn, {}), Error);                          // no inputs
  auto constant = [](const std::vector<Tensor>&) { return ones({3}, f64); };
  CHECK_THROWS_AS(gradcheck(constant, {a}), Error);                   // output has no graph
}

TEST_CASE("NoGradGuard nests and restores the previous mode") {
  CHECK(grad_enabled());
  {
    NoGradGuard outer;
    CHECK(!grad_enabled());
    {
      NoGradGuard inner;
      CHECK(!grad_enabled());
    }
    CHECK(!grad_enabled());
  }
  CHECK(grad_enabled());
  Tensor x = leaf({1}, 18);
  CHECK(!any_requires_grad({x.detach(), Tensor()}));
  CHECK(any_requires_grad({Tensor(), x}));
}

TEST_CASE("a graph frees itself when its last tensor goes") {
  Tensor x = leaf({2}, 19);
  std::weak_ptr<Node> first;
  {
    Tensor y = mul(x, 2.0);
    first = y.grad_fn();
    Tensor z = add(y, 1.0);
    y = Tensor();
    CHECK(!first.expired());  // z still holds the chain
  }
  CHECK(first.expired());
  CHECK(x.is_leaf());
}
