// quantize / dequantize / fake_quantize over a QuantScope: bit-identical to
// the per-scope functions (values, masks through the gradients, scale
// gradients) on seeded random input with ties, clamp edges and
// non-finite values; the dynamic_range_quantize result dequantizes with
// its own scope; bad arguments name the op and the argument.
#include "test_quant_ref.h"

using namespace qgrad;
using namespace qgrad::testing;
using namespace qref;

namespace {

// Same dtype, numel and bytes (the per-token functions take x as [N, D]).
bool bits_equal(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.detach().cpu(), cb = b.detach().cpu();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// Normal values (scale 0.05 puts about a third outside an 8-bit range),
// exact ties k + 0.5 of the scale, values at qmin / qmax and one step past,
// +-inf and NaN, in dtype dt.
Tensor edge_input(const Shape& shape, DType dt, std::uint64_t seed) {
  std::vector<double> v = random_input(shape, DType::f64, seed, 4.0).to_vector<double>();
  const std::vector<double> tie = halves(-140, 140, 0.0625);
  for (std::size_t i = 0; i < v.size(); i += 3) v[i] = tie[(i / 3) % tie.size()];
  const double edges[] = {-128 * 0.0625, 127 * 0.0625, -129 * 0.0625, 128 * 0.0625, 255 * 0.0625, 0.0, -0.0};
  for (std::size_t i = 1, k = 0; i < v.size(); i += 7, ++k) v[i] = edges[k % 7];
  if (v.size() > 10) {
    v[2] = INFINITY;
    v[5] = -INFINITY;
    v[8] = NAN;
  }
  return Tensor::from_vector(v, shape).to(dt);
}

// Per-channel scales (powers of two and odd ones) and zero points of `shape`.
void channel_qparams(const Shape& shape, std::uint64_t seed, DType qdt, Tensor& scale, Tensor& zp) {
  const std::int64_t n = shape_numel(shape);
  std::vector<float> s(static_cast<std::size_t>(n));
  std::vector<std::int32_t> z(s.size());
  const std::int64_t lo = qdt == DType::u8 ? 0 : -128;
  for (std::size_t i = 0; i < s.size(); ++i) {
    s[i] = i % 2 == 0 ? 0.0625f : 0.0371f * static_cast<float>(1 + (i + seed) % 5);
    z[i] = static_cast<std::int32_t>(lo + 128 + static_cast<std::int64_t>((i * 7 + seed) % 9) - 4);
  }
  scale = Tensor::from_vector<float>(s, shape);
  zp = Tensor::from_vector<std::int32_t>(z, shape);
}

struct Case {
  const char* name;
  QuantScope scope;
  Shape qshape;  // shape of the qparams
};

// The scopes over x [4, 6, 8], with their qparams shapes.
std::vector<Case> cases() {
  return {{"tensor", QuantScope::per_tensor(), {1}},
          {"channel 0", QuantScope::per_channel(0), {4}},
          {"channel 1", QuantScope::per_channel(1), {6}},
          {"channel -1", QuantScope::per_channel(-1), {8}},
          {"token", QuantScope::per_token(), {4, 6}},
          {"group 4", QuantScope::per_group(-1, 4), {4, 6, 2}},
          {"group 8 (axis 2)", QuantScope::per_group(2, 8), {4, 6, 1}}};
}

// The per-scope function of each case; token takes x as [N, D].
Tensor old_quantize(const Case& c, const Tensor& x, const Tensor& s, const Tensor& z, DType dt) {
  switch (c.scope.kind) {
    case QuantScope::tensor: return quantize_per_tensor(x, s, z, dt);
    case QuantScope::channel: return quantize_per_channel(x, s, z, c.scope.axis, dt);
    case QuantScope::token: return quantize_per_token(x.reshape({24, 8}), s.reshape({24}), z.reshape({24}), dt);
    default: return quantize_per_group(x, s, z, c.scope.group_size, dt);
  }
}
Tensor old_dequantize(const Case& c, const Tensor& q, const Tensor& s, const Tensor& z, DType out) {
  switch (c.scope.kind) {
    case QuantScope::tensor: return dequantize_per_tensor(q, s, z, out);
    case QuantScope::channel: return dequantize_per_channel(q, s, z, c.scope.axis, out);
    case QuantScope::token: return dequantize_per_token(q.reshape({24, 8}), s.reshape({24}), z.reshape({24}), out);
    default: return dequantize_per_group(q, s, z, c.scope.group_size, out);
  }
}

// ya and yb hold the same bits, and so do the gradients of leaves a and b
// after backward(dy) through each.
void require_same(const Tensor& ya, const Tensor& yb, const Tensor& a, const Tensor& b, const Tensor& dy) {
  REQUIRE(bits_equal(ya, yb));
  ya.backward(dy.reshape(ya.shape()));
  yb.backward(dy.reshape(yb.shape()));
  REQUIRE(bits_equal(a.grad(), b.grad()));
}

// f(float dtype, integer dtype, case, scale, zero point) for every
// combination, the qparams of the case's shape.
template <class F>
void for_each_case(F&& f) {
  for (DType dt : kFloatTypes) {
    for (DType qdt : {DType::s8, DType::u8}) {
      for (const Case& c : cases()) {
        const std::string name = c.name;
        CAPTURE(name);
        Tensor s, z;
        channel_qparams(c.qshape, 3, qdt, s, z);
        f(dt, qdt, c, s, z);
      }
    }
  }
}

}  // namespace

TEST_CASE("quantize(x, scale, zp, scope) is bit-identical to quantize_per_* (values and gradients)") {
  for_each_case([](DType dt, DType qdt, const Case& c, const Tensor& s, const Tensor& z) {
    const Tensor x0 = edge_input({4, 6, 8}, dt, 17);
    Tensor xa = leaf_of(x0), xb = leaf_of(x0);
    Tensor qa = quantize(xa, s, z, c.scope, qdt);
    Tensor qb = old_quantize(c, xb, s, z, qdt);
    REQUIRE(qa.shape() == x0.shape());
    require_same(qa, qb, xa, xb, random_input({4, 6, 8}, dt, 5, 1.0));
  });
}

TEST_CASE("dequantize(q, scale, zp, scope) is bit-identical to dequantize_per_* (f32 scale and a scale with grad)") {
  for_each_case([](DType out, DType qdt, const Case& c, const Tensor& s, const Tensor& z) {
    const Tensor q = quantize(edge_input({4, 6, 8}, DType::f32, 23), s, z, c.scope, qdt);
    REQUIRE(bits_equal(dequantize(q, s, z, c.scope, out), old_dequantize(c, q, s, z, out)));
    // The composite path: the scale requires grad.
    Tensor sa = leaf_of(s), sb = leaf_of(s);
    Tensor ya = dequantize(q, sa, z, c.scope, out);
    Tensor yb = old_dequantize(c, q, sb, z, out);
    require_same(ya, yb, sa, sb, random_input({4, 6, 8}, out, 31, 1.0));
  });
}

TEST_CASE("fake_quantize(x, scale, zp, scope) equals fake_quantize_per_tensor / _per_channel bit for bit") {
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases()) {
      if (c.scope.kind != QuantScope::tensor && c.scope.kind != QuantScope::channel) continue;
      const std::string name = c.name;
      CAPTURE(name);
      Tensor s, z;
      channel_qparams(c.qshape, 1, DType::s8, s, z);
      for (auto [qmin, qmax] : {std::pair<std::int64_t, std::int64_t>{-128, 127}, {-8, 7}, {0, 255}}) {
        if (qmin == 0) z = full(c.qshape, 3, s32());
        const Tensor x0 = edge_input({4, 6, 8}, dt, 41);
        Tensor xa = leaf_of(x0), xb = leaf_of(x0);
        Tensor ya = fake_quantize(xa, s, z, c.scope, qmin, qmax);
        Tensor yb = c.scope.kind == QuantScope::tensor
                        ? fake_quantize_per_tensor(xb, s, z, qmin, qmax)
                        : fake_quantize_per_channel(xb, s, z, c.scope.axis, qmin, qmax);
        REQUIRE(bits_equal(ya, yb));
        const Tensor dy = random_input({4, 6, 8}, dt, 43, 1.0);
        ya.backward(dy);
        yb.backward(dy.reshape(yb.shape()));
        REQUIRE(bits_equal(xa.grad(), xb.grad()));  // the saved masks agree
      }
    }
  }
}

TEST_CASE("fake_quantize per token and per group: the reference formula with each row's or group's qparams") {
  for (DType dt : kFloatTypes) {
    dispatch_floating(dt, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (const Case& c : cases()) {
        if (c.scope.kind != QuantScope::token && c.scope.kind != QuantScope::group) continue;
        const std::string name = c.name;
        CAPTURE(name);
        Tensor s, z;
        channel_qparams(c.qshape, 2, DType::s8, s, z);
        const Tensor x = leaf_of(edge_input({4, 6, 8}, dt, 47));
        Tensor y = fake_quantize(x, s, z, c.scope, -100, 100);
        const Tensor dy = random_input({4, 6, 8}, dt, 53, 1.0);
        y.backward(dy);
        const auto xs = host<T>(x), ys = host<T>(y), gs = host<T>(dy), dxs = host<T>(x.grad());
        const auto sv = s.to_vector<float>();
        const auto zv = z.to_vector<std::int32_t>();
        const std::size_t per = c.scope.kind == QuantScope::token ? 8 : static_cast<std::size_t>(c.scope.group_size);
        for (std::size_t i = 0; i < xs.size(); ++i) {
          bool in;
          const T want = ref_fake_quant(xs[i], sv[i / per], zv[i / per], -100, 100, in, true);
          REQUIRE_MESSAGE(same_bits(ys[i], want), "element ", i);
          REQUIRE_MESSAGE(same_bits(dxs[i], to_t<T>(to_d(gs[i]) * (in ? 1.0 : 0.0))), "grad element ", i);
        }
      }
    });
  }
}

TEST_CASE("dynamic_range_quantize's qparams dequantize with the same scope") {
  const Tensor x = random_input({3, 4, 8}, DType::f32, 61);
  for (QuantScope scope : {QuantScope::per_tensor(), QuantScope::per_channel(1), QuantScope::per_token(),
                           QuantScope::per_group(2, 4)}) {
    CAPTURE(static_cast<int>(scope.kind));
    const DynamicQuantized r = dynamic_range_quantize(x, scope, QuantMode::asymmetric, DType::u8);
    const auto q = r.q.to_vector<std::uint8_t>();
    const auto sv = r.scale.to_vector<float>();
    const auto zv = r.zero_point.to_vector<std::int32_t>();
    const auto y = dequantize(r.q, r.scale, r.zero_point, scope).to_vector<float>();
    for (std::size_t i = 0; i < q.size(); ++i) {
      std::size_t seg = 0;
      switch (scope.kind) {
        case QuantScope::tensor: seg = 0; break;
        case QuantScope::channel: seg = (i / 8) % 4; break;
        case QuantScope::token: seg = i / 8; break;
        default: seg = i / 4; break;
      }
      REQUIRE(same_bits(y[i], static_cast<float>(static_cast<std::int64_t>(q[i]) - zv[seg]) * sv[seg]));
    }
  }
}

TEST_CASE("the scope ops name the op and the argument of a bad input, before writing anything") {
  const Tensor x = random_input({4, 6}, DType::f32, 1);
  const Tensor s4 = full({4}, 0.1, f32()), z4 = full({4}, 0, s32());
  const Tensor q = quantize_per_tensor(x, 0.1, 0, DType::s8);
  auto expect = [](const char* op, const char* arg, auto&& f) {
    try {
      f();
      FAIL("no error for ", op, " ", arg);
    } catch (const Error& e) {
      CHECK(e.op() == op);
      CHECK(e.arg() == arg);
    }
  };
  expect("quantize", "scale", [&] {
    quantize(x, full({6}, 0.1, f32()), full({6}, 0, s32()), QuantScope::per_token(), DType::s8);
  });
  expect("quantize", "dtype", [&] { quantize(x, s4, z4, QuantScope::per_token(), DType::s32); });
  expect("quantize", "x", [&] { quantize(x.to(DType::s8), s4, z4, QuantScope::per_token(), DType::s8); });
  expect("quantize", "axis", [&] { quantize(x, s4, z4, QuantScope::per_channel(2), DType::s8); });
  expect("quantize", "scope", [&] {
    quantize(x, full({2, 6}, 0.1, f32()), full({2, 6}, 0, s32()), QuantScope::per_group(0, 2), DType::s8);
  });
  expect("quantize", "group_size", [&] {
    quantize(x, full({4, 2}, 0.1, f32()), full({4, 2}, 0, s32()), QuantScope::per_group(1, 4), DType::s8);
  });
  expect("quantize", "scope", [&] {
    quantize(x, s4, z4, QuantScope{static_cast<QuantScope::Kind>(7), 0, 0}, DType::s8);
  });
  expect("quantize", "x", [&] { quantize(full({}, 1.0, f32()), s4, z4, QuantScope::per_token(), DType::s8); });
  expect("dequantize", "zero_point", [&] { dequantize(q, s4, full({4}, 300, s32()), QuantScope::per_token()); });
  expect("dequantize", "out_dtype", [&] { dequantize(q, s4, z4, QuantScope::per_token(), DType::s8); });
  expect("dequantize", "scale", [&] { dequantize(q, full({4}, -1.0, f32()), z4, QuantScope::per_token()); });
  expect("dequantize", "q", [&] { dequantize(x, s4, z4, QuantScope::per_token()); });
  expect("fake_quantize", "qmax", [&] { fake_quantize(x, s4, z4, QuantScope::per_token(), 5, 5); });
  expect("fake_quantize", "zero_point",
         [&] { fake_quantize(x, s4, z4.to(DType::f32), QuantScope::per_token(), -8, 7); });
  expect("fake_quantize", "scale", [&] { fake_quantize(x, s4, z4, QuantScope::per_channel(1), -8, 7); });
  expect("fake_quantize", "x", [&] { fake_quantize(x.to(DType::s32), s4, z4, QuantScope::per_token(), -8, 7); });
}
