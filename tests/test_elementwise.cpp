// Broadcasting arithmetic: host reference, gradcheck, CUDA bit-identity.
#include <limits>

#include "helpers.h"
#include "qgrad/kernels/formulas/binary.h"

using namespace qgrad;
using namespace qgrad::testing;
using formulas::BinaryOp;

namespace {

Tensor op_of(BinaryOp op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::add: return add(a, b);
    case BinaryOp::sub: return sub(a, b);
    case BinaryOp::mul: return mul(a, b);
    case BinaryOp::div: return div(a, b);
    case BinaryOp::maximum: return maximum(a, b);
    default: break;  // not an op of its own (maximum_share: maximum's backward)
  }
  return {};
}

double ref_of(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::maximum: return a < b ? b : a;  // no NaN in these inputs
    default: break;
  }
  return 0;
}

const BinaryOp kOps[] = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::maximum};

struct ShapePair {
  Shape a, b;
};
const ShapePair kShapes[] = {{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}}, {{5}, {}}};

}  // namespace

TEST_CASE("binary ops match a double host reference under broadcasting") {
  Generator g(11);
  for (auto [sa, sb] : kShapes) {
    Tensor a = randn(sa, g, TensorOptions{}.with_dtype(DType::f64));
    Tensor b = rand(sb, g, TensorOptions{}.with_dtype(DType::f64), 0.5, 2.0);
    const Shape so = check::broadcast_shapes(sa, sb, "test");
    const auto bi = kernels::make_broadcast_index(sa, sb, so);
    const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
    for (BinaryOp op : kOps) {
      const auto out = op_of(op, a, b).to_vector<double>();
      REQUIRE(static_cast<std::int64_t>(out.size()) == shape_numel(so));
      for (std::size_t i = 0; i < out.size(); ++i) {
        std::int64_t oa, ob;
        bi.offsets(static_cast<std::int64_t>(i), oa, ob);
        REQUIRE(out[i] == ref_of(op, va[static_cast<std::size_t>(oa)], vb[static_cast<std::size_t>(ob)]));
      }
    }
  }
}

TEST_CASE("binary ops pass gradcheck with broadcasting (CPU)") {
  Generator g(12);
  for (auto [sa, sb] : kShapes) {
    Tensor a = randn(sa, g, TensorOptions{}.with_dtype(DType::f64));
    Tensor b = rand(sb, g, TensorOptions{}.with_dtype(DType::f64), 0.5, 2.0);
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    for (BinaryOp op : kOps) {
      auto r = gradcheck([op](const std::vector<Tensor>& in) { return op_of(op, in[0], in[1]); }, {a, b});
      CHECK_MESSAGE(r.ok, r.message);
    }
  }
}

TEST_CASE("sum_to_shape reduces broadcast dims in a fixed order") {
  Generator g(13);
  Tensor t = randn({2, 3, 4}, g, TensorOptions{}.with_dtype(DType::f64));
  const auto v = t.to_vector<double>();
  const auto s = sum_to_shape(t, {3, 1}).to_vector<double>();
  for (int j = 0; j < 3; ++j) {
    double acc = 0;
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < 4; ++k) acc += v[static_cast<std::size_t>(i * 12 + j * 4 + k)];
    CHECK(s[static_cast<std::size_t>(j)] == doctest::Approx(acc).epsilon(1e-14));
  }
}

TEST_CASE("binary ops reject bad arguments before writing") {
  Tensor f = ones({2, 3});
  CHECK_THROWS_AS(add(f, ones({4})), Error);                                                   // shapes
  CHECK_THROWS_AS(add(f, ones({2, 3}, TensorOptions{}.with_dtype(DType::f64))), Error);       // dtypes
  CHECK_THROWS_AS(add(f, ones({2, 3}, TensorOptions{}.with_dtype(DType::s32))), Error);       // integer
  CHECK_THROWS_AS(mul(Tensor(), f), Error);                                                    // undefined
  CHECK_THROWS_WITH(add(f, ones({4})), doctest::Contains("add"));
}

TEST_CASE("16-bit binary ops compute in f32 and round once") {
  Generator g(14);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor a = randn({257}, g).to(dt), b = randn({257}, g).to(dt);
    Tensor ref = mul(a.to(DType::f32), b.to(DType::f32)).to(dt);
    CHECK(bit_equal(mul(a, b), ref));
  }
}

TEST_CASE("CUDA: binary ops and sum_to_shape are bit-identical to the CPU") {
  QGRAD_REQUIRE_GPU();
  Generator g(15);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (auto [sa, sb] : kShapes) {
      Tensor a = randn(sa, g).to(dt), b = rand(sb, g, TensorOptions{}, 0.5, 2.0).to(dt);
      for (BinaryOp op : kOps) {
        Tensor cpu = op_of(op, a, b);
        Tensor gpu = op_of(op, a.cuda(), b.cuda());
        CHECK(gpu.is_cuda());
        CHECK(bit_equal(cpu, gpu));
      }
      Tensor big = randn({64, 33, 17}, g).to(dt);
      CHECK(bit_equal(sum_to_shape(big, {33, 1}), sum_to_shape(big.cuda(), {33, 1})));
    }
  }
}

TEST_CASE("CUDA: binary ops pass gradcheck on the device") {
  QGRAD_REQUIRE_GPU();
  Generator g(16);
  Tensor a = randn({3, 4}, g, TensorOptions{}.with_dtype(DType::f64).with_device(Device::cuda()));
  Tensor b = rand({4}, g, TensorOptions{}.with_dtype(DType::f64).with_device(Device::cuda()), 0.5, 2.0);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  for (BinaryOp op : kOps) {
    auto r = gradcheck([op](const std::vector<Tensor>& in) { return op_of(op, in[0], in[1]); }, {a, b});
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("CUDA: mixing devices is an error") {
  QGRAD_REQUIRE_GPU();
  CHECK_THROWS_AS(add(ones({2}), ones({2}).cuda()), Error);
}

namespace {
Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}
}  // namespace

TEST_CASE("maximum: NaN, ties and signed zeros as torch.maximum; gradient shares 1, 1/2, 0") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Device dev : test_devices()) {
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      Tensor a = leaf(Tensor::from_vector<double>({nan, 1.0, 0.0, -0.0, 2.0, -3.0}, {6}).to(dt).to(dev));
      Tensor b = leaf(Tensor::from_vector<double>({1.0, nan, -0.0, 0.0, 2.0, 4.0}, {6}).to(dt).to(dev));
      Tensor y = maximum(a, b);
      y.backward(Tensor::from_vector<double>({1, 2, 3, 4, 8, 16}, {6}).to(dt).to(dev));
      const auto yv = y.to(DType::f64).cpu().to_vector<double>();
      INFO("device ", dev.str(), " dtype ", dtype_name(dt));
      CHECK(std::isnan(yv[0]));
      CHECK(std::isnan(yv[1]));
      CHECK((yv[2] == 0.0 && !std::signbit(yv[2])));  // std::max(+0, -0) = +0 (the first on ties)
      CHECK((yv[3] == 0.0 && std::signbit(yv[3])));   // std::max(-0, +0) = -0
      CHECK(yv[4] == 2.0);
      CHECK(yv[5] == 4.0);
      // NaN compares false: both shares 1; ties (+0 == -0, 2 == 2) split the gradient.
      CHECK(a.grad().to(DType::f64).cpu().to_vector<double>() == std::vector<double>{1, 2, 1.5, 2, 4, 0});
      CHECK(b.grad().to(DType::f64).cpu().to_vector<double>() == std::vector<double>{1, 2, 1.5, 2, 4, 16});
    }
  }
}
