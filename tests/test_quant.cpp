// Fake quantize, quantize and dequantize on the CPU: forward against a host
// reference of PyTorch's CPU formulas, straight-through backward against
// the mask formula, saved bytes, scopes, and every argument check.
#include <cstring>
#include <random>
#include <vector>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/formulas/quantize.h"
#include "qgrad/kernels/quantize.h"
#include "test_quant_ref.h"

using namespace qgrad;
using namespace qgrad::testing;
using namespace qref;

namespace {

// Runs per-tensor fake quantize (forward + backward) on x and compares with
// the host reference bit for bit.
template <class T>
void check_fq_tensor(const Tensor& x_in, double scale, std::int64_t zp, std::int64_t qmin, std::int64_t qmax) {
  Tensor x = leaf_of(x_in);
  Tensor y = fake_quantize_per_tensor(x, scale, zp, qmin, qmax);
  Tensor dy = random_input(x.shape(), x.dtype(), 77, 1.0);
  y.backward(dy);
  const auto xs = host<T>(x), ys = host<T>(y), gs = host<T>(dy), dxs = host<T>(x.grad());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    bool in;
    const T want = ref_fake_quant(xs[i], static_cast<float>(scale), zp, qmin, qmax, in);
    REQUIRE_MESSAGE(same_bits(ys[i], want), "element ", i, " x=", to_d(xs[i]), " got ", to_d(ys[i]), " want ", to_d(want));
    const T want_dx = to_t<T>(to_d(gs[i]) * (in ? 1.0 : 0.0));
    REQUIRE_MESSAGE(same_bits(dxs[i], want_dx), "grad element ", i);
  }
}

void for_each_dtype(const std::function<void(DType)>& f) {
  for (DType dt : kFloatTypes) f(dt);
}

}  // namespace

TEST_CASE("fake_quantize_per_tensor: ties round to even and the zero point is added after rounding") {
  Tensor x = Tensor::from_vector<float>({0.5f, 1.5f, 2.5f, -0.5f, -2.5f}, {5});
  Tensor y = fake_quantize_per_tensor(x, 1.0, 1, -128, 127);
  CHECK(y.to_vector<float>() == std::vector<float>{0, 2, 2, 0, -2});
}

TEST_CASE("fake_quantize_per_tensor matches the PyTorch CPU formula on random inputs, every dtype") {
  for_each_dtype([](DType dt) {
    Tensor x = random_input({3, 257}, dt, 11, 4.0);
    dispatch_floating(dt, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      check_fq_tensor<T>(x, 0.0371, 3, -128, 127);
      check_fq_tensor<T>(x, 0.1, 0, 0, 255);
      check_fq_tensor<T>(x, 0.02, -5, -8, 7);  // 4-bit range: many clamped
    });
  });
}

TEST_CASE("fake_quantize_per_tensor: exact halves x/scale = k + 0.5 round to even") {
  for_each_dtype([](DType dt) {
    Tensor x = from_doubles(halves(-140, 140, 0.25), dt);
    dispatch_floating(dt, "test", [&](auto tag) { check_fq_tensor<typename decltype(tag)::type>(x, 0.25, 2, -128, 127); });
    auto y = values(fake_quantize_per_tensor(from_doubles({0.125, 0.375, -0.125}, dt), 0.25, 0, -128, 127));
    CHECK(y == std::vector<double>{0.0, 0.5, 0.0});
  });
}

TEST_CASE("fake_quantize_per_tensor: +inf and -inf go to the range edges with zero gradient") {
  for_each_dtype([](DType dt) {
    Tensor x = leaf_of(from_doubles({INFINITY, -INFINITY, 1.0}, dt));
    Tensor y = fake_quantize_per_tensor(x, 0.5, 1, -8, 7);
    CHECK(values(y) == std::vector<double>{3.0, -4.5, 1.0});
    y.backward(ones({3}, TensorOptions{}.with_dtype(dt)));
    CHECK(values(x.grad()) == std::vector<double>{0.0, 0.0, 1.0});
  });
}

TEST_CASE("fake_quantize_per_tensor: NaN gives NaN and zero gradient (PyTorch maps NaN to qmin)") {
  for_each_dtype([](DType dt) {
    Tensor x = leaf_of(from_doubles({NAN, 2.0}, dt));
    Tensor y = fake_quantize_per_tensor(x, 0.5, 0, -8, 7);
    auto v = values(y);
    CHECK(std::isnan(v[0]));
    CHECK(v[1] == 2.0);
    y.backward(ones({2}, TensorOptions{}.with_dtype(dt)));
    CHECK(values(x.grad()) == std::vector<double>{0.0, 1.0});
  });
}

TEST_CASE("fake_quantize_per_tensor: the mask bounds are inclusive at qmin and qmax") {
  // scale 1, zp 0, range [-3, 4]: q = -4 .. 5
  Tensor x = leaf_of(Tensor::from_vector<double>({-4, -3, 0, 4, 5, -3.5, 4.5}, {7}));
  Tensor y = fake_quantize_per_tensor(x, 1.0, 0, -3, 4);
  CHECK(y.to_vector<double>() == std::vector<double>{-3, -3, 0, 4, 4, -3, 4});
  y.backward(ones({7}, TensorOptions{}.with_dtype(DType::f64)));
  // -3.5 rounds to -4 (even): out; 4.5 rounds to 4: in.
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 1, 1, 1, 0, 0, 1});
}

TEST_CASE("fake_quantize_per_tensor: masked gradients keep PyTorch's signed zero (dy * 0)") {
  Tensor x = leaf_of(Tensor::from_vector<float>({100.f}, {1}));
  Tensor y = fake_quantize_per_tensor(x, 1.0, 0, -8, 7);
  y.backward(Tensor::from_vector<float>({-2.f}, {1}));
  const float g = x.grad().to_vector<float>()[0];
  CHECK(g == 0.0f);
  CHECK(std::signbit(g));
}

TEST_CASE("fake quantize saves a bit-packed mask: 1/32 of an f32 activation") {
  for (std::int64_t n : {1, 31, 127, 128, 129, 1000, 4096}) {
    Tensor x = leaf_of(random_input({n}, DType::f32, 5));
    Tensor y = fake_quantize_per_tensor(x, 0.05, 0, -128, 127);
    REQUIRE(y.grad_fn() != nullptr);
    CHECK(y.grad_fn()->saved_bytes == static_cast<std::size_t>((n + 127) / 128 * 16));
  }
  Tensor x = leaf_of(random_input({4096}, DType::f32, 5));
  CHECK(fake_quantize_per_tensor(x, 0.05, 0, -128, 127).grad_fn()->saved_bytes * 32 == x.nbytes());
}

TEST_CASE("fake quantize records nothing when no input requires grad") {
  Tensor x = random_input({10}, DType::f32, 1);
  CHECK(fake_quantize_per_tensor(x, 0.1, 0, -128, 127).grad_fn() == nullptr);
  Tensor xl = leaf_of(x);
  NoGradGuard guard;
  CHECK(fake_quantize_per_tensor(xl, 0.1, 0, -128, 127).grad_fn() == nullptr);
}

TEST_CASE("fake_quantize_per_tensor: STE backward equals the mask formula at every size (f64 check)") {
  for (std::int64_t n : {1, 3, 127, 128, 129, 300, 1031}) {
    Tensor x = random_input({n}, DType::f64, static_cast<std::uint64_t>(n), 5.0);
    check_fq_tensor<double>(x, 0.07, -1, -16, 15);
  }
}

TEST_CASE("fake_quantize_per_tensor: device-tensor qparams equal host-scalar qparams") {
  for_each_dtype([](DType dt) {
    Tensor x = random_input({5, 77}, dt, 3);
    Tensor a = fake_quantize_per_tensor(x, 0.043, 7, -128, 127);
    Tensor b = fake_quantize_per_tensor(x, full({1}, 0.043, f32()), full({1}, 7, s32()), -128, 127);
    CHECK(bit_equal(a, b));
    Tensor c = fake_quantize_per_tensor(x, full({}, 0.043, f32()), full({}, 7, s32()), -128, 127);
    CHECK(bit_equal(a, c));
  });
}

TEST_CASE("fake_quantize_per_channel: every axis, negative axes, ranks 1 to 4") {
  const std::vector<Shape> shapes{{6}, {3, 5}, {2, 3, 7}, {2, 3, 4, 5}, {4, 1, 3, 8}};
  for (const Shape& shape : shapes) {
    for (std::int64_t axis = -static_cast<std::int64_t>(shape.size()); axis < static_cast<std::int64_t>(shape.size()); ++axis) {
      const std::int64_t ax = axis < 0 ? axis + static_cast<std::int64_t>(shape.size()) : axis;
      const std::int64_t c = shape[static_cast<std::size_t>(ax)];
      std::int64_t inner = 1;
      for (std::size_t d = static_cast<std::size_t>(ax) + 1; d < shape.size(); ++d) inner *= shape[d];
      Generator g(static_cast<std::uint64_t>(c * 31 + ax));
      Tensor scale = rand({c}, g, f32(), 0.02, 0.3);
      Tensor zp = randint(-5, 6, {c}, g, s32());
      for_each_dtype([&](DType dt) {
        Tensor x = leaf_of(random_input(shape, dt, 9));
        Tensor y = fake_quantize_per_channel(x, scale, zp, axis, -16, 15);
        y.backward(ones(shape, TensorOptions{}.with_dtype(dt)));
        dispatch_floating(dt, "test", [&](auto tag) {
          using T = typename decltype(tag)::type;
          const auto xs = host<T>(x), ys = host<T>(y), dxs = host<T>(x.grad());
          const auto ss = scale.to_vector<float>();
          const auto zs = zp.to_vector<std::int32_t>();
          for (std::size_t i = 0; i < xs.size(); ++i) {
            const std::size_t ch = (i / static_cast<std::size_t>(inner)) % static_cast<std::size_t>(c);
            bool in;
            const T want = ref_fake_quant(xs[i], ss[ch], zs[ch], -16, 15, in, true);
            REQUIRE(same_bits(ys[i], want));
            REQUIRE(to_d(dxs[i]) == (in ? 1.0 : 0.0));
          }
        });
      });
    }
  }
}

// Rows that start inside a mask block and off a multiple of 4 (37, 300
// columns) and the MLP's first weight [256, 784]: the CPU's f32 kernel takes
// each block as runs of one channel; values and mask bits equal the
// reference's, every element.
TEST_CASE("fake_quantize_per_channel along axis 0: channels starting anywhere in a mask block") {
  for (const Shape& shape : {Shape{5, 37}, Shape{3, 300}, Shape{256, 784}}) {
    CAPTURE(shape_str(shape));
    const std::int64_t c = shape[0], inner = shape[1];
    Generator g(static_cast<std::uint64_t>(inner));
    Tensor scale = rand({c}, g, f32(), 0.01, 0.05);
    Tensor zp = randint(-5, 6, {c}, g, s32());
    Tensor x = leaf_of(random_input(shape, DType::f32, 10, 3.0));
    Tensor y = fake_quantize_per_channel(x, scale, zp, 0, -128, 127);
    y.backward(ones(shape, f32()));
    const auto xs = host<float>(x), ys = host<float>(y), dxs = host<float>(x.grad());
    const auto ss = scale.to_vector<float>();
    const auto zs = zp.to_vector<std::int32_t>();
    int wrong = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const std::size_t ch = i / static_cast<std::size_t>(inner);
      bool in;
      const float want = ref_fake_quant(xs[i], ss[ch], zs[ch], -128, 127, in, true);
      wrong += !same_bits(ys[i], want) || dxs[i] != (in ? 1.0f : 0.0f);
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("fake_quantize_per_channel with one channel equals per tensor") {
  Tensor x = random_input({4, 9}, DType::f32, 2);
  Tensor a = fake_quantize_per_channel(x.reshape({1, 36}), full({1}, 0.05, f32()), full({1}, 3, s32()), 0, -128, 127);
  CHECK(bit_equal(a.reshape({4, 9}), fake_quantize_per_tensor(x, 0.05, 3, -128, 127)));
}

TEST_CASE("quantize_per_tensor / dequantize_per_tensor: s8 and u8 against the reference") {
  for (DType qt : {DType::s8, DType::u8}) {
    const std::int64_t qmin = quant_min_of(qt), qmax = quant_max_of(qt);
    const std::int64_t zp = qt == DType::s8 ? -3 : 128;
    for_each_dtype([&](DType dt) {
      Tensor x = random_input({1000}, dt, 21, 4.0);
      Tensor q = quantize_per_tensor(x, 0.031, zp, qt);
      CHECK(q.dtype() == qt);
      Tensor qs = q.to(DType::s64);
      const auto qv = qs.to_vector<std::int64_t>();
      dispatch_floating(dt, "test", [&](auto tag) {
        using T = typename decltype(tag)::type;
        const auto xs = host<T>(x);
        for (std::size_t i = 0; i < xs.size(); ++i) {
          bool in;
          REQUIRE(qv[i] == ref_quantize(xs[i], 0.031f, zp, qmin, qmax, in));
        }
        Tensor y = dequantize_per_tensor(q, 0.031, zp, dt);
        CHECK(y.dtype() == dt);
        const auto ys = host<T>(y);
        for (std::size_t i = 0; i < ys.size(); ++i)
          REQUIRE(same_bits(ys[i], ref_value<T>(static_cast<long double>(qv[i] - zp), 0.031f,
                                                std::is_same_v<T, double>)));  // f64: exact product
      });
    });
  }
}

TEST_CASE("quantize maps +-inf to the dtype's range edges and NaN to qmin, all with zero gradient") {
  Tensor x = leaf_of(Tensor::from_vector<float>({INFINITY, -INFINITY, NAN, 1.0f}, {4}));
  Tensor q = quantize_per_tensor(x, 0.5, 0, DType::s8);
  CHECK(q.to_vector<std::int8_t>() == std::vector<std::int8_t>{127, -128, -128, 2});
  dequantize_per_tensor(q, 0.5, 0).backward(ones({4}));
  CHECK(x.grad().to_vector<float>() == std::vector<float>{0, 0, 0, 1});
}

TEST_CASE("quantize backward is dy / scale * mask; dequantize backward is dy * scale") {
  Tensor x = leaf_of(random_input({300}, DType::f64, 4, 6.0));
  Tensor q = quantize_per_tensor(x, 0.03, 5, DType::s8);
  Tensor y = dequantize_per_tensor(q, 0.03, 5, DType::f64);
  Tensor dy = random_input({300}, DType::f64, 8);
  y.backward(dy);
  const auto xs = x.to_vector<double>(), gs = dy.to_vector<double>(), dx = x.grad().to_vector<double>();
  const double s = static_cast<double>(0.03f);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    bool in;
    ref_quantize(xs[i], 0.03f, 5, -128, 127, in);
    REQUIRE(same_bits(dx[i], (gs[i] * s) / s * (in ? 1.0 : 0.0)));
  }
}

TEST_CASE("quantize then dequantize gives exactly the gradients of fake quantize") {
  for_each_dtype([](DType dt) {
    for (DType qt : {DType::s8, DType::u8}) {
      const std::int64_t zp = qt == DType::s8 ? 1 : 120;
      Tensor x1 = leaf_of(random_input({2, 500}, dt, 31, 150.0)), x2 = leaf_of(x1);
      Tensor dy = random_input({2, 500}, dt, 32);
      // A power-of-two scale >= 1: (dy * s) / s == dy exactly, even in f16
      // (a scale < 1 could push dy * s into f16's subnormals).
      dequantize_per_tensor(quantize_per_tensor(x1, 2.0, zp, qt), 2.0, zp, dt).backward(dy);
      Tensor y2 = fake_quantize_per_tensor(x2, 2.0, zp, quant_min_of(qt), quant_max_of(qt));
      y2.backward(dy);
      CHECK(bit_equal(x1.grad(), x2.grad()));
      CHECK(bit_equal(dequantize_per_tensor(quantize_per_tensor(x1, 2.0, zp, qt), 2.0, zp, dt), y2));
    }
  });
}

TEST_CASE("quantize_per_channel / dequantize_per_channel on every axis with per-channel gradients") {
  const Shape shape{3, 4, 5};
  for (std::int64_t axis : {0, 1, 2, -1}) {
    const std::int64_t ax = axis < 0 ? axis + 3 : axis;
    const std::int64_t c = shape[static_cast<std::size_t>(ax)];
    Generator g(static_cast<std::uint64_t>(40 + ax));
    Tensor scale = rand({c}, g, f32(), 0.01, 0.1);
    Tensor zp = randint(-10, 10, {c}, g, s32());
    Tensor x = leaf_of(random_input(shape, DType::f32, 41));
    Tensor q = quantize_per_channel(x, scale, zp, axis, DType::s8);
    Tensor y = dequantize_per_channel(q, scale, zp, axis, DType::f32);
    Tensor dy = random_input(shape, DType::f32, 42);
    y.backward(dy);
    const auto xs = x.to_vector<float>(), ys = y.to_vector<float>();
    const auto qs = q.to_vector<std::int8_t>();
    const auto gs = dy.to_vector<float>(), dx = x.grad().to_vector<float>();
    const auto ss = scale.to_vector<float>();
    const auto zs = zp.to_vector<std::int32_t>();
    std::int64_t inner = 1;
    for (std::size_t d = static_cast<std::size_t>(ax) + 1; d < 3; ++d) inner *= shape[d];
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const std::size_t ch = (i / static_cast<std::size_t>(inner)) % static_cast<std::size_t>(c);
      bool in;
      REQUIRE(qs[i] == ref_quantize(xs[i], ss[ch], zs[ch], -128, 127, in));
      REQUIRE(same_bits(ys[i], static_cast<float>(static_cast<double>(qs[i] - zs[ch]) * ss[ch])));
      REQUIRE(same_bits(dx[i], (gs[i] * ss[ch]) / ss[ch] * (in ? 1.0f : 0.0f)));
    }
  }
}

TEST_CASE("dequantize_per_channel backward is dy * scale[c] (the seed's rank-4 case)") {
  Generator g(50);
  Tensor q = randint(-128, 128, {2, 3, 4, 5}, g, TensorOptions{}.with_dtype(DType::s8));
  Tensor scale = rand({4}, g, f32(), 0.01, 0.2);
  Tensor zp = randint(-4, 4, {4}, g, s32());
  // q does not require grad: a stand-in graph makes it so through quantize.
  Tensor xf = leaf_of(dequantize_per_channel(q, scale, zp, 2, DType::f32));
  Tensor q2 = quantize_per_channel(xf, scale, zp, 2, DType::s8);
  CHECK(bit_equal(q2, q));
  Tensor y = dequantize_per_channel(q2, scale, zp, 2, DType::f32);
  Tensor dy = random_input(y.shape(), DType::f32, 51);
  Tensor dq = y.grad_fn()->backward(dy)[0];
  const auto gs = dy.to_vector<float>(), d = dq.to_vector<float>();
  const auto ss = scale.to_vector<float>();
  for (std::size_t i = 0; i < gs.size(); ++i) REQUIRE(same_bits(d[i], gs[i] * ss[(i / 5) % 4]));
}

TEST_CASE("quantize_per_token quantizes each row with its own qparams") {
  Generator g(60);
  Tensor x = leaf_of(random_input({7, 33}, DType::bf16, 61));
  Tensor scale = rand({7}, g, f32(), 0.01, 0.1);
  Tensor zp = randint(0, 256, {7}, g, s32());
  Tensor q = quantize_per_token(x, scale, zp, DType::u8);
  Tensor y = dequantize_per_token(q, scale, zp, DType::bf16);
  y.backward(ones({7, 33}, TensorOptions{}.with_dtype(DType::bf16)));
  const auto xs = host<bfloat16>(x);
  const auto qs = q.to_vector<std::uint8_t>();
  const auto ss = scale.to_vector<float>();
  const auto zs = zp.to_vector<std::int32_t>();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    bool in;
    REQUIRE(qs[i] == ref_quantize(xs[i], ss[i / 33], zs[i / 33], 0, 255, in));
  }
  // the same as per channel on axis 0
  CHECK(bit_equal(q, quantize_per_channel(x, scale, zp, 0, DType::u8)));
}

TEST_CASE("quantize_per_group: groups along the last axis") {
  Generator g(70);
  Tensor x = leaf_of(random_input({2, 3, 64}, DType::f16, 71));
  Tensor scale = rand({2, 3, 4}, g, f32(), 0.01, 0.1);
  Tensor zp = randint(-20, 20, {2, 3, 4}, g, s32());
  Tensor q = quantize_per_group(x, scale, zp, 16, DType::s8);
  const auto xs = host<half>(x);
  const auto qs = q.to_vector<std::int8_t>();
  const auto ss = scale.to_vector<float>();
  const auto zs = zp.to_vector<std::int32_t>();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    bool in;
    REQUIRE(qs[i] == ref_quantize(xs[i], ss[i / 16], zs[i / 16], -128, 127, in));
  }
  Tensor y = dequantize_per_group(q, scale, zp, 16, DType::f32);
  const auto ys = y.to_vector<float>();
  for (std::size_t i = 0; i < ys.size(); ++i)
    REQUIRE(same_bits(ys[i], static_cast<float>(static_cast<double>(qs[i] - zs[i / 16]) * ss[i / 16])));
  y.backward(ones({2, 3, 64}));
  CHECK(x.grad().dtype() == DType::f16);
  // per group with the group = the whole row is per token
  Tensor x2 = random_input({5, 32}, DType::f32, 72);
  Tensor s2 = rand({5, 1}, g, f32(), 0.01, 0.1);
  Tensor z2 = randint(-3, 3, {5, 1}, g, s32());
  CHECK(bit_equal(quantize_per_group(x2, s2, z2, 32, DType::s8),
                  quantize_per_token(x2, s2.reshape({5}), z2.reshape({5}), DType::s8)));
}

TEST_CASE("quantize records its gradient in the float dtype of the input") {
  Tensor x = leaf_of(random_input({8}, DType::f16, 3));
  Tensor q = quantize_per_tensor(x, 0.1, 0, DType::s8);
  REQUIRE(q.grad_fn() != nullptr);
  CHECK(q.grad_fn()->grad_dtype == DType::f16);
  CHECK(q.grad_fn()->saved_bytes == 16);
  Tensor y = dequantize_per_tensor(q, 0.1, 0, DType::f32);  // another float dtype downstream
  y.backward(ones({8}));
  CHECK(x.grad().dtype() == DType::f16);
}

TEST_CASE("fake quantize argument checks fire before anything is written") {
  Tensor x = random_input({4, 3}, DType::f32, 1);
  CHECK_THROWS_AS(fake_quantize_per_tensor(Tensor(), 0.1, 0, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x.to(DType::s32), 0.1, 0, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, 0.0, 0, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, -0.1, 0, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, INFINITY, 0, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, NAN, 0, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, 1e-300, 0, -128, 127), Error);  // 0 in f32
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, 1e300, 0, -128, 127), Error);   // inf in f32
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, 0.1, 0, 5, 5), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, 0.1, 0, 6, 5), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, 0.1, 0, -(1LL << 40), 5), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, 0.1, 0, 0, 1LL << 40), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, 0.1, 200, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, 0.1, -129, -128, 127), Error);
  const Tensor s = full({1}, 0.1, f32()), z = full({1}, 0, s32());
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, s.to(DType::f64), z, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, s, z.to(DType::s64), -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, full({2}, 0.1, f32()), z, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, s, full({2}, 0, s32()), -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, full({1}, -1.0, f32()), z, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, full({1}, NAN, f32()), z, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, s, full({1}, 300, s32()), -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_tensor(x, Tensor(), z, -128, 127), Error);
}

TEST_CASE("fake_quantize_per_channel argument checks") {
  Tensor x = random_input({4, 3}, DType::f32, 1);
  const Tensor s3 = full({3}, 0.1, f32()), z3 = full({3}, 0, s32());
  CHECK_NOTHROW(fake_quantize_per_channel(x, s3, z3, 1, -128, 127));
  CHECK_NOTHROW(fake_quantize_per_channel(x, s3, z3, -1, -128, 127));
  CHECK_THROWS_AS(fake_quantize_per_channel(x, s3, z3, 0, -128, 127), Error);   // C mismatch
  CHECK_THROWS_AS(fake_quantize_per_channel(x, s3, z3, 2, -128, 127), Error);   // axis
  CHECK_THROWS_AS(fake_quantize_per_channel(x, s3, z3, -3, -128, 127), Error);  // axis
  CHECK_THROWS_AS(fake_quantize_per_channel(full({}, 1.0), s3, z3, 0, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_channel(x, s3.reshape({1, 3}), z3, 1, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_channel(x, s3, z3.to(DType::f32), 1, -128, 127), Error);
  CHECK_THROWS_AS(fake_quantize_per_channel(x, s3, z3, 1, 127, -128), Error);
  CHECK_THROWS_AS(fake_quantize_per_channel(x, Tensor::from_vector<float>({0.1f, 0.f, 0.1f}, {3}), z3, 1, -128, 127),
                  Error);
  CHECK_THROWS_AS(fake_quantize_per_channel(x, s3, Tensor::from_vector<std::int32_t>({0, 0, 128}, {3}), 1, -128, 127),
                  Error);
}

TEST_CASE("quantize / dequantize argument checks") {
  Tensor x = random_input({4, 6}, DType::f32, 1);
  CHECK_THROWS_AS(quantize_per_tensor(x, 0.1, 0, DType::s32), Error);
  CHECK_THROWS_AS(quantize_per_tensor(x, 0.1, 0, DType::f32), Error);
  CHECK_THROWS_AS(quantize_per_tensor(x, 0.1, 128, DType::s8), Error);
  CHECK_THROWS_AS(quantize_per_tensor(x, 0.1, -1, DType::u8), Error);
  CHECK_THROWS_AS(quantize_per_tensor(x, 0.0, 0, DType::u8), Error);
  CHECK_THROWS_AS(quantize_per_tensor(x.to(DType::s8), 0.1, 0, DType::s8), Error);
  Tensor q = quantize_per_tensor(x, 0.1, 0, DType::s8);
  CHECK_THROWS_AS(dequantize_per_tensor(x, 0.1, 0), Error);  // float input
  CHECK_THROWS_AS(dequantize_per_tensor(q, 0.1, 0, DType::s8), Error);
  CHECK_THROWS_AS(dequantize_per_tensor(q, -0.1, 0), Error);
  CHECK_THROWS_AS(dequantize_per_tensor(q, 0.1, 300), Error);
  CHECK_THROWS_AS(dequantize_per_tensor(q, full({1}, 0.1, f32()), full({1}, 0, TensorOptions{}.with_dtype(DType::s64))),
                  Error);
  const Tensor s4 = full({4}, 0.1, f32()), z4 = full({4}, 0, s32());
  CHECK_THROWS_AS(quantize_per_channel(x, s4, z4, 1, DType::s8), Error);
  CHECK_THROWS_AS(quantize_per_token(x.reshape({24}), s4, z4, DType::s8), Error);
  CHECK_THROWS_AS(quantize_per_token(x, full({6}, 0.1, f32()), full({6}, 0, s32()), DType::s8), Error);
  CHECK_THROWS_AS(dequantize_per_token(q, s4, full({4}, 200, s32()), DType::f32), Error);
  CHECK_THROWS_AS(quantize_per_group(x, full({4, 2}, 0.1, f32()), full({4, 2}, 0, s32()), 4, DType::s8), Error);
  CHECK_THROWS_AS(quantize_per_group(x, full({4, 2}, 0.1, f32()), full({4, 2}, 0, s32()), 0, DType::s8), Error);
  CHECK_THROWS_AS(quantize_per_group(x, full({4, 3}, 0.1, f32()), full({4, 2}, 0, s32()), 3, DType::s8), Error);
  CHECK_NOTHROW(quantize_per_group(x, full({4, 2}, 0.1, f32()), full({4, 2}, 0, s32()), 3, DType::s8));
  CHECK_THROWS_AS(dequantize_per_group(x, full({4, 2}, 0.1, f32()), full({4, 2}, 0, s32()), 3), Error);
}

TEST_CASE("empty tensors quantize to empty tensors") {
  Tensor x = leaf_of(Tensor::empty({0, 3}));
  Tensor y = fake_quantize_per_tensor(x, 0.1, 0, -128, 127);
  CHECK(y.numel() == 0);
  CHECK(quantize_per_tensor(x, 0.1, 0, DType::s8).numel() == 0);
}

TEST_CASE("the magic-number division finds every channel exactly") {
  std::uint64_t state = 12345;
  auto next = [&]() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::uint32_t>(state >> 33);  // < 2^31
  };
  const std::uint32_t divisors[] = {1, 2, 3, 4, 5, 7, 31, 32, 33, 127, 128, 1000, 4096, 65535, 65536, 65537,
                                    (1u << 30) + 1, (1u << 31) - 1, 1u << 31};
  for (std::uint32_t d : divisors) {
    const kernels::FastDiv fd(d);
    for (std::uint32_t n : {0u, 1u, d - 1, d, d + 1, (1u << 31) - 1, (1u << 31) - 2})
      if (n < (1u << 31)) REQUIRE(fd.div(n) == n / d);
    for (int i = 0; i < 20000; ++i) {
      const std::uint32_t n = next();
      REQUIRE(fd.div(n) == n / d);
    }
  }
  const kernels::AxisLayout lay{1000 / 35 + 1, 7, 5};
  const kernels::ChannelIndexer map(lay);
  for (std::int64_t i = 0; i < 1000; ++i) REQUIRE(map.channel(i) == (i / 5) % 7);
  for (std::int64_t i = 0; i < 1000; ++i) REQUIRE(lay.channel(i) == (i / 5) % 7);
  const kernels::AxisLayout big_lay{(std::int64_t(1) << 33) / 33 + 1, 11, 3};
  const kernels::ChannelIndexer big(big_lay);  // the 64-bit path
  REQUIRE(!big.small);
  for (std::int64_t i : {std::int64_t(0), (std::int64_t(1) << 32) + 7, (std::int64_t(1) << 33) - 1})
    REQUIRE(big.channel(i) == (i / 3) % 11);
}

TEST_CASE("a wide integer range takes the exact f64 product (|q - zp| > 2^24)") {
  for (DType dt : kFloatTypes) {
    Tensor x = random_input({2000}, dt, 90, 1e8);
    dispatch_floating(dt, "test", [&](auto tag) {
      check_fq_tensor<typename decltype(tag)::type>(x, 0.37, 5, -2147483647LL - 1, 2147483647LL);
    });
  }
}

TEST_CASE("f64 values: per tensor takes PyTorch's f32 product, per channel its f64 product") {
  Tensor x = Tensor::from_vector<double>({0.3}, {1});
  const double pt = fake_quantize_per_tensor(x, 0.1, 0, -128, 127).item();
  CHECK(pt == static_cast<double>(3.0f * 0.1f));
  const double pc = fake_quantize_per_channel(x, full({1}, 0.1), full({1}, 0, s32()), 0, -128, 127).item();
  CHECK(pc == 3.0 * static_cast<double>(0.1f));
  CHECK(pt != pc);
  // dequantize to f64 holds the exact f64 product in every scope (the f64
  // output is asked for precision), so per tensor it is not fake quantize's
  // f32 product
  Tensor q = quantize_per_tensor(x, 0.1, 0, DType::s8);
  CHECK(dequantize_per_tensor(q, 0.1, 0, DType::f64).item() == pc);
  Tensor qc = quantize_per_channel(x, full({1}, 0.1), full({1}, 0, s32()), 0, DType::s8);
  CHECK(dequantize_per_channel(qc, full({1}, 0.1), full({1}, 0, s32()), 0, DType::f64).item() == pc);
}

TEST_CASE("dequantize to f64 is the exact f64 product (q - zp) * scale, every scope and device") {
  Generator g(81);
  Tensor q = randint(-128, 128, {6, 40}, g, TensorOptions{}.with_dtype(DType::s8));
  const double scale = 0.0123;  // not a short binary fraction: f32 and f64 products differ
  const auto qv = q.to_vector<std::int8_t>();
  for (const Device dev : test_devices()) {
    Tensor qd = q.to(dev);
    Tensor sc = full({6}, scale, TensorOptions{}.with_device(dev));
    Tensor zc = full({6}, -3, TensorOptions{}.with_dtype(DType::s32).with_device(dev));
    const auto yt = dequantize_per_tensor(qd, scale, -3, DType::f64).cpu().to_vector<double>();
    const auto yc = dequantize_per_channel(qd, sc, zc, 0, DType::f64).cpu().to_vector<double>();
    std::size_t f32_differs = 0;
    for (std::size_t i = 0; i < qv.size(); ++i) {
      const double want = (static_cast<double>(qv[i]) + 3.0) * static_cast<double>(static_cast<float>(scale));
      REQUIRE(same_bits(yt[i], want));
      REQUIRE(same_bits(yc[i], want));
      f32_differs += static_cast<double>(static_cast<float>(qv[i] + 3) * static_cast<float>(scale)) != want;
    }
    CHECK(f32_differs > 0);  // the check can tell the f32 product from the f64 one
  }
}

TEST_CASE("dequantize gradcheck (f64) in the scale, every scope") {
  Generator g(80);
  Tensor q = randint(-128, 128, {3, 4, 8}, g, TensorOptions{}.with_dtype(DType::s8));
  auto check_scope = [&](const Shape& sshape, const Tensor& zp, auto&& fn) {
    Tensor s = leaf_of(rand(sshape, g, TensorOptions{}.with_dtype(DType::f64), 0.01, 0.2));
    auto r = gradcheck([&](const std::vector<Tensor>& in) { return fn(in[0]); }, {s});
    CHECK_MESSAGE(r.ok, r.message);
    (void)zp;
  };
  const TensorOptions i32 = s32();
  Tensor z1 = full({1}, 3, i32), zc = randint(-5, 5, {4}, g, i32), zg = randint(-5, 5, {3, 4, 2}, g, i32);
  check_scope({1}, z1, [&](const Tensor& s) { return dequantize_per_tensor(q, s, z1, DType::f64); });
  check_scope({4}, zc, [&](const Tensor& s) { return dequantize_per_channel(q, s, zc, 1, DType::f64); });
  check_scope({4}, zc, [&](const Tensor& s) { return dequantize_per_channel(q, s, zc, -2, DType::f64); });
  Tensor q2 = q.reshape({12, 8});
  Tensor zt = randint(-5, 5, {12}, g, i32);
  check_scope({12}, zt, [&](const Tensor& s) { return dequantize_per_token(q2, s, zt, DType::f64); });
  check_scope({3, 4, 2}, zg, [&](const Tensor& s) { return dequantize_per_group(q, s, zg, 4, DType::f64); });
}

TEST_CASE("dequantize with a scale that requires grad: same values, dscale = sum dy (q - zp), dq = dy * scale") {
  Generator g(81);
  Tensor x = leaf_of(random_input({6, 5}, DType::f32, 82));
  Tensor s = rand({5}, g, TensorOptions{}, 0.05, 0.2), z = randint(-3, 3, {5}, g, s32());
  Tensor q = quantize_per_channel(x, s, z, 1, DType::s8);
  Tensor ys = leaf_of(s);
  Tensor y = dequantize_per_channel(q, ys, z, 1, DType::f32);
  CHECK(bit_equal(y, dequantize_per_channel(q, s, z, 1, DType::f32)));
  Tensor dy = random_input({6, 5}, DType::f32, 83);
  y.backward(dy);
  const auto qv = q.to_vector<std::int8_t>();
  const auto zv = z.to_vector<std::int32_t>();
  const auto gv = dy.to_vector<float>(), sv = s.to_vector<float>();
  std::vector<double> want(5, 0.0);
  for (std::size_t i = 0; i < qv.size(); ++i) want[i % 5] += static_cast<double>(gv[i]) * (qv[i] - zv[i % 5]);
  const auto ds = values(ys.grad());
  for (std::size_t c = 0; c < 5; ++c) CHECK(ds[c] == doctest::Approx(want[c]).epsilon(1e-5));
  // x's gradient is the STE rule of quantize after dq = dy * scale
  const auto xv = x.to_vector<float>(), dx = x.grad().to_vector<float>();
  for (std::size_t i = 0; i < xv.size(); ++i) {
    bool in;
    ref_quantize(xv[i], sv[i % 5], zv[i % 5], -128, 127, in);
    REQUIRE(same_bits(dx[i], (gv[i] * sv[i % 5]) / sv[i % 5] * (in ? 1.0f : 0.0f)));
  }
}

TEST_CASE("the saved mask has the documented layout: element 128b + 4l + k is bit l of word 4b + k") {
  const std::int64_t n = 300;
  Tensor x = random_input({n}, DType::f32, 91, 8.0);
  Tensor y = Tensor::empty({n});
  Tensor mask = Tensor::empty({bitmask_words(n)}, s32());
  CHECK(mask.numel() == 12);
  kernels::QuantParams p;
  p.source.scale_value = 0.05f;
  p.qmin = -100;
  p.qmax = 100;
  kernels::fake_quantize(x, y, p, static_cast<std::uint32_t*>(mask.data_ptr()));
  const auto xs = x.to_vector<float>();
  const auto words = mask.to_vector<std::int32_t>();
  for (std::int64_t i = 0; i < 384; ++i) {
    const std::int64_t b = i / 128, l = (i % 128) / 4, k = i % 4;
    const bool bit = (static_cast<std::uint32_t>(words[static_cast<std::size_t>(4 * b + k)]) >> l) & 1u;
    bool in = false;
    if (i < n) ref_fake_quant(xs[static_cast<std::size_t>(i)], 0.05f, 0, -100, 100, in);
    REQUIRE_MESSAGE(bit == in, "element ", i);  // bits past the end are 0
  }
}

TEST_CASE("per-channel quantize then dequantize gives exactly the values and gradients of fake quantize") {
  for (DType dt : kFloatTypes) {
    const Tensor scale = Tensor::from_vector<float>({0.5f, 1.0f, 2.0f, 4.0f}, {4});  // powers of two
    const Tensor zp = Tensor::from_vector<std::int32_t>({-3, 0, 5, 100}, {4});
    Tensor x1 = leaf_of(random_input({3, 4, 33}, dt, 95, 150.0)), x2 = leaf_of(x1);
    Tensor dy = random_input({3, 4, 33}, dt, 96);
    Tensor y1 = dequantize_per_channel(quantize_per_channel(x1, scale, zp, 1, DType::s8), scale, zp, 1, dt);
    Tensor y2 = fake_quantize_per_channel(x2, scale, zp, 1, -128, 127);
    CHECK(bit_equal(y1, y2));
    y1.backward(dy);
    y2.backward(dy);
    CHECK(bit_equal(x1.grad(), x2.grad()));
  }
}

// QuantizeOp / DequantizeOp take a float form where every integer involved
// is an exact float; it must give the int64 form's value and bit for every
// input: specials, halves, huge values, zero points at the edge of the form.
namespace {
// The float-form tests' inputs: specials, halves, huge values, the edges of
// the exact float integers, then `drawn` seeded values over ten decades.
std::vector<float> float_form_inputs(std::uint32_t seed, int drawn) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-3.0f, 3.0f);
  std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 3.4e38f, 0.5f, -0.5f, 1.5f, 2.5f,
                           -2.5f, 126.5f, 127.5f, -128.5f, 8388607.5f, 16777216.0f, -16777216.0f};
  for (int i = 0; i < drawn; ++i) xs.push_back(unit(rng) * std::pow(10.0f, static_cast<float>(i % 9) - 2.0f));
  return xs;
}
// The qparams of a channel as the kernels form them from (scale, zp).
formulas::ChannelParams channel_params(float scale, std::int32_t zp) {
  formulas::ChannelParams p;
  p.scale = scale;
  p.zp = zp;
  p.inv_scale = formulas::inv_scale_of(scale);
  return p;
}

}  // namespace

TEST_CASE("quantize and dequantize formulas: the float form equals the int64 form") {
  namespace f = formulas;
  const std::vector<float> xs = float_form_inputs(20261123, 2000);
  const std::int32_t zps[] = {0, 3, -128, 255, (1 << 24) - 1, -(1 << 24) + 1, 1 << 24, -(1 << 24), 1 << 30};
  const float scales[] = {0.02f, 1.0f, 3.0e-5f, 1.0f / 3.0f, 7.0f};
  const std::pair<std::int64_t, std::int64_t> ranges[] = {{-128, 127}, {0, 255}, {-(1 << 23), (1 << 23) - 1}};
  std::int64_t checked = 0;
  for (float scale : scales)
    for (std::int32_t zp : zps)
      for (auto [qmin, qmax] : ranges) {
        const f::ChannelParams p = channel_params(scale, zp);
        const f::QuantizeOp<float, std::int32_t> op{qmin, qmax};
        for (float x : xs) {
          std::int64_t qc = 0;
          bool want_bit = false, got_bit = true;
          const std::int64_t want = f::clamped_quant(x, p, qmin, qmax, qc, want_bit) ? qc : qmin;
          const std::int32_t got = op(x, p, false, got_bit);
          CAPTURE(x);
          CAPTURE(zp);
          CAPTURE(scale);
          REQUIRE(got == want);
          REQUIRE(got_bit == want_bit);
          ++checked;
        }
        for (int q = -128; q <= 255; ++q) {
          bool unused = false;
          const float want = f::dequant_value<float, false>(q, zp, scale);
          const float got = f::DequantizeOp<std::int16_t, float, false>{qmin, qmax}(static_cast<std::int16_t>(q), p,
                                                                                     false, unused);
          REQUIRE(std::memcmp(&want, &got, sizeof want) == 0);
          const bfloat16 wb = f::dequant_value<bfloat16, true>(q, zp, scale);
          const bfloat16 gb = f::DequantizeOp<std::int16_t, bfloat16, true>{qmin, qmax}(static_cast<std::int16_t>(q), p,
                                                                                         false, unused);
          REQUIRE(wb.bits == gb.bits);
        }
      }
  CHECK(checked == 5 * 9 * 3 * static_cast<std::int64_t>(xs.size()));
}

// FakeQuantOp::float_form (CUDA's per-token row kernels) must give the
// general form's value bits and mask bit wherever float_form_exact holds,
// for each float-math dtype and both product forms: specials, halves,
// huge values, infinite and NaN scales (a row range of inf or NaN), zero
// points at the edge of the form; and float_form_exact must refuse the
// parameters outside it.
TEST_CASE("fake quantize formula: the float form equals the general form wherever it is exact") {
  namespace f = formulas;
  std::vector<float> xs = float_form_inputs(20261127, 1000);
  xs.insert(xs.end(), {1e-40f, -1e-40f});  // subnormals (f32 and bf16 keep them)
  const std::int32_t zps[] = {0, 3, -128, 127, 255, (1 << 23) - 1, -(1 << 23), (1 << 24) - 1, -(1 << 24) + 1, 1 << 30};
  const float scales[] = {0.02f, 1.0f, 3.0e-5f, 1.0f / 3.0f, 7.0f, 1.1920929e-07f, 3.9e27f, INFINITY, NAN};
  const std::pair<std::int64_t, std::int64_t> ranges[] = {{-128, 127}, {0, 255}, {-(1 << 23), (1 << 23) - 1}};
  std::int64_t exact = 0, refused = 0;
  const auto compare = [&](auto tag, auto product, const f::ChannelParams& p, std::int64_t qmin, std::int64_t qmax) {
    using T = typename decltype(tag)::type;
    const f::FakeQuantOp<T, decltype(product)::value> op{qmin, qmax};
    if (!op.float_form_exact(p)) {
      ++refused;
      return;
    }
    ++exact;
    for (float xf : xs) {
      const T x = T(xf);
      bool want_bit = false, got_bit = true;
      const T want = op(x, p, false, want_bit);
      const T got = op.float_form(x, p, got_bit);
      CAPTURE(xf);
      CAPTURE(p.zp);
      CAPTURE(p.scale);
      REQUIRE(std::memcmp(&want, &got, sizeof(T)) == 0);
      REQUIRE(got_bit == want_bit);
      bool row_bit = true;
      const T row = op.row_value(x, p, true, row_bit);
      REQUIRE(std::memcmp(&want, &row, sizeof(T)) == 0);
      REQUIRE(row_bit == want_bit);
    }
  };
  for (float scale : scales)
    for (std::int32_t zp : zps)
      for (auto [qmin, qmax] : ranges) {
        const f::ChannelParams p = channel_params(scale, zp);
        compare(std::type_identity<float>{}, std::true_type{}, p, qmin, qmax);
        compare(std::type_identity<float>{}, std::false_type{}, p, qmin, qmax);
        compare(std::type_identity<bfloat16>{}, std::true_type{}, p, qmin, qmax);
        compare(std::type_identity<half>{}, std::true_type{}, p, qmin, qmax);
      }
  // Every scale with the zero points and ranges inside the form, and none with zp = 2^30.
  CHECK(exact > 0);
  CHECK(refused >= 9 * 3 * 4);
  const f::FakeQuantOp<double, true> f64op{-128, 127};
  CHECK(!f64op.float_form_exact(f::ChannelParams{}));  // f64 has no float form
}
