// Broadcasting arithmetic: host reference, gradcheck, CUDA bit-identity.
#include <limits>

#include "helpers.h"
#include "qgrad/kernels/binary.h"
#include "qgrad/kernels/formulas/binary.h"
#include "test_nn_helpers.h"

using namespace qgrad;
using namespace qgrad::testing;
using qgrad::testing::error_of;
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

// Offsets from the output's multi-index by the broadcasting rule itself (not
// make_broadcast_index): shapes whose collapsed innermost run takes the CPU's
// row form (>= 8 elements) and ones that do not, with size-1 dims between.
TEST_CASE("broadcast binary ops (CPU row form, collapsed dims) match an independent host reference") {
  Generator g(19);
  const ShapePair shapes[] = {{{4, 6, 5, 7}, {1, 6, 1, 1}}, {{6, 1, 1}, {4, 6, 5, 7}},   {{9, 33}, {33}},
                              {{3, 1, 16}, {1, 5, 1}},      {{2, 1, 3, 1, 10}, {4, 1, 1, 10}}, {{8, 1}, {1, 9}},
                              {{2, 3, 4, 9}, {2, 3, 4, 9}}, {{5, 12}, {}},                  {{1, 1, 12}, {3, 1, 1}}};
  for (const ShapePair& row : shapes) {
    const Shape& sa = row.a;
    const Shape& sb = row.b;
    CAPTURE(shape_str(sa));
    CAPTURE(shape_str(sb));
    const Tensor a = randn(sa, g, TensorOptions{}.with_dtype(DType::f64));
    const Tensor b = rand(sb, g, TensorOptions{}.with_dtype(DType::f64), 0.5, 2.0);
    const Shape so = check::broadcast_shapes(sa, sb, "test");
    const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
    // Element offset in `s` (right-aligned to so, size-1 dims broadcast) of output index i.
    auto offset_in = [&](const Shape& s, std::int64_t i) {
      std::int64_t off = 0, stride = 1;
      for (std::size_t k = 0; k < so.size(); ++k) {
        const std::size_t d = so.size() - 1 - k;
        const std::int64_t c = i % so[d];
        i /= so[d];
        if (k < s.size()) {
          const std::int64_t sd = s[s.size() - 1 - k];
          if (sd != 1) off += c * stride;
          stride *= sd;
        }
      }
      return static_cast<std::size_t>(off);
    };
    for (BinaryOp op : kOps) {
      const auto out = op_of(op, a, b).to_vector<double>();
      REQUIRE(static_cast<std::int64_t>(out.size()) == shape_numel(so));
      for (std::size_t i = 0; i < out.size(); ++i)
        REQUIRE(out[i] == ref_of(op, va[offset_in(sa, static_cast<std::int64_t>(i))],
                                 vb[offset_in(sb, static_cast<std::int64_t>(i))]));
    }
    // f32 through the row form and the element form (f32 runs the same formula): the same bits as a
    // host loop in f32.
    const Tensor af = a.to(DType::f32), bf = b.to(DType::f32);
    const auto xa = af.to_vector<float>(), xb = bf.to_vector<float>();
    const auto got = mul(af, bf).to_vector<float>();
    for (std::size_t i = 0; i < got.size(); ++i)
      REQUIRE(got[i] == xa[offset_in(sa, static_cast<std::int64_t>(i))] * xb[offset_in(sb, static_cast<std::int64_t>(i))]);
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

// The multi-pass form taken for long reductions, checked
// against the one-loop form in f64 (same sums, another order) and, for 16 bit,
// against the f64 sum rounded once (one rounding at the end, not per pass).
TEST_CASE("sum_to_shape_by_axes equals the one-loop sum for every pattern of reduced dims") {
  Generator g(17);
  const std::pair<Shape, Shape> cases[] = {
      {{4, 3, 5, 6}, {1, 3, 1, 1}}, {{4, 3, 5, 6}, {3, 1, 1}}, {{4, 3, 5, 6}, {1, 1, 1, 6}},
      {{4, 3, 5, 6}, {4, 1, 5, 1}}, {{4, 3, 5, 6}, {1}},       {{2, 1, 7, 3}, {1, 1, 7, 1}},
      {{4, 3, 5, 6}, {5, 6}},       {{3, 4}, {4}},             {{4, 3, 5, 6}, {1, 3, 5, 1}}};
  for (const auto& row : cases) {
    const auto& in_shape = std::get<0>(row);
    const auto& out_shape = std::get<1>(row);
    CAPTURE(shape_str(in_shape));
    CAPTURE(shape_str(out_shape));
    const Tensor x = randn(in_shape, g, TensorOptions{}.with_dtype(DType::f64));
    const Tensor ref = sum_to_shape(x, out_shape);
    Tensor got = full(out_shape, std::nan(""), TensorOptions{}.with_dtype(DType::f64));
    kernels::sum_to_shape_by_axes(x, got);
    const auto r = ref.to_vector<double>(), v = got.to_vector<double>();
    REQUIRE(r.size() == v.size());
    for (std::size_t i = 0; i < r.size(); ++i) CHECK(v[i] == doctest::Approx(r[i]).epsilon(1e-13));
    const auto mag = sum_to_shape(add(relu(x), relu(neg(x))), out_shape).to_vector<double>();
    for (DType dt : {DType::f32, DType::bf16}) {
      CAPTURE(dt);
      const Tensor xd = x.to(dt);
      Tensor low = full(out_shape, std::nan(""), TensorOptions{}.with_dtype(dt));
      kernels::sum_to_shape_by_axes(xd, low);
      const auto want = sum_to_shape(xd.to(DType::f64), out_shape).to_vector<double>();
      const auto a = low.to(DType::f64).to_vector<double>();
      // One rounding to dt at the end (the unit roundoff u = 2^-p of its p-bit
      // significand) after f32 sums; a rounding per pass would exceed it.
      const double u = dt == DType::bf16 ? 0x1p-8 : 0x1p-24;
      for (std::size_t i = 0; i < a.size(); ++i)
        CHECK(std::fabs(a[i] - want[i]) <= u * std::fabs(want[i]) + 1e-6 * mag[i]);
    }
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

// A per-channel factor's gradient ([N, C, H, W] summed to [1, C, 1, 1]):
// sum_to_shape takes the multi-pass form (block reductions on CUDA).
void check_long_sum_to_shape(Device dev) {
  Generator g(18);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    CAPTURE(dt);
    const Tensor x = randn({64, 8, 28, 28}, g).to(dt);
    // Host sums per channel (not sum_to_shape, which takes the same passes).
    const auto v = x.to(DType::f64).to_vector<double>();
    std::vector<double> ref(8, 0.0), mag(8, 0.0);
    for (std::size_t i = 0; i < v.size(); ++i) {
      ref[(i / 784) % 8] += v[i];
      mag[(i / 784) % 8] += std::fabs(v[i]);
    }
    const auto got = sum_to_shape(x.to(dev), {1, 8, 1, 1}).to(DType::f64).cpu().to_vector<double>();
    const double ulp = dt == DType::bf16 ? 0x1p-8 : dt == DType::f32 ? 0x1p-23 : 0x1p-52;
    for (std::size_t c = 0; c < ref.size(); ++c)
      CHECK(std::fabs(got[c] - ref[c]) <= ulp * std::fabs(ref[c]) + 1e-6 * mag[c]);
  }
}

TEST_CASE("long sum_to_shape reductions match the f64 sum") { check_long_sum_to_shape(Device::cpu()); }

TEST_CASE("CUDA: long sum_to_shape reductions match the f64 sum") {
  QGRAD_REQUIRE_GPU();
  check_long_sum_to_shape(Device::cuda());
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

TEST_CASE("sqrt: seeded values against std::sqrt, edge values (-0, negatives, inf, NaN), gradient 0.5 / y") {
  for (const Device dev : test_devices()) {
    CAPTURE(dev.str());
    Generator gen(0x5e7);
    for (const DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
      CAPTURE(dtype_name(dt));
      Tensor x = rand({257}, gen, TensorOptions{}.with_dtype(dt), 0.0, 100.0);
      const auto xv = values(x), yv = values(sqrt(x.to(dev)));
      for (std::size_t i = 0; i < xv.size(); ++i) {
        // f16/bf16 compute in f32 and round once: the f32 result rounded to dt.
        const double want = dt == DType::f64 ? std::sqrt(xv[i])
                                             : values(Tensor::from_vector<float>({std::sqrt(static_cast<float>(xv[i]))},
                                                                                 {1}).to(dt))[0];
        CHECK(yv[i] == want);
      }
    }
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const auto y = values(sqrt(Tensor::from_vector<double>({0.0, -0.0, -1.0, inf, -inf, nan, 4.0}, {7}, dev)));
    CHECK(y[0] == 0.0);
    CHECK(!std::signbit(y[0]));
    CHECK(y[1] == 0.0);
    CHECK(std::signbit(y[1]));
    CHECK(std::isnan(y[2]));
    CHECK(y[3] == inf);
    CHECK(std::isnan(y[4]));
    CHECK(std::isnan(y[5]));
    CHECK(y[6] == 2.0);
    // Backward dy * 0.5 / y: 0.25 at x = 4, +inf at x = 0 (as PyTorch).
    Tensor x = Tensor::from_vector<double>({4.0, 0.0, 2.25}, {3}, dev).set_requires_grad(true);
    sum(sqrt(x)).backward();
    const auto g = values(x.grad());
    CHECK(g[0] == 0.25);
    CHECK(g[1] == inf);
    CHECK(g[2] == doctest::Approx(1.0 / 3.0).epsilon(1e-15));
    CHECK(gradcheck([](const std::vector<Tensor>& v) { return sqrt(v[0]); },
                    {Tensor::from_vector<double>({0.5, 1.0, 3.0, 9.0}, {4}, dev).set_requires_grad(true)})
              .ok);
  }
  CHECK(error_of([] { sqrt(Tensor()); }).find("sqrt: argument 'x'") != std::string::npos);
  CHECK(error_of([] { sqrt(zeros({2}, TensorOptions{}.with_dtype(DType::s32))); }).find("sqrt: argument 'x'") !=
        std::string::npos);
}
