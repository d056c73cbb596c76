// dynamic_range_quantize: every scope, mode and dtype against a host
// reference written independently of the kernels (scalar loops in the
// quantization math type), a double-precision error bound, all-zero and
// non-finite segments, bad inputs, and CPU/CUDA bit identity.
#include <algorithm>
#include <cmath>
#include <limits>

#include "helpers.h"
#include "qgrad/kernels/dynamic_quant.h"
#include "qgrad/kernels/formulas/dynamic_quant.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

struct RefResult {
  std::vector<double> q, scale, zp;
};

// Reference in math type M (float, or double for f64 inputs). `seg_of`
// maps a flat element index to its segment.
template <class M, class SegOf>
RefResult reference(const std::vector<double>& x, std::int64_t nseg, SegOf seg_of, bool symmetric, int qmin,
                    int qmax) {
  std::vector<M> lo(static_cast<std::size_t>(nseg), M(0)), hi(static_cast<std::size_t>(nseg), M(0));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const M v = static_cast<M>(x[i]);
    if (!std::isfinite(v)) continue;
    const auto s = static_cast<std::size_t>(seg_of(static_cast<std::int64_t>(i)));
    lo[s] = std::min(lo[s], v);  // starting at 0 = PyTorch's min(min, 0) / max(max, 0)
    hi[s] = std::max(hi[s], v);
  }
  RefResult r;
  std::vector<M> inv(static_cast<std::size_t>(nseg));
  std::vector<int> zps(static_cast<std::size_t>(nseg));
  for (std::size_t s = 0; s < static_cast<std::size_t>(nseg); ++s) {
    int zp = 0;
    M scale;
    if (symmetric) {
      zp = qmin < 0 ? 0 : (qmin + qmax + 1) / 2;
      scale = std::max(-lo[s], hi[s]) / M(qmax - zp);
    } else {
      scale = (hi[s] - lo[s]) / M(qmax - qmin);
    }
    if (scale == M(0)) scale = M(1);
    scale = std::max(scale, std::numeric_limits<M>::min());
    if (!symmetric) zp = static_cast<int>(std::clamp(M(qmin) - std::nearbyint(lo[s] / scale), M(qmin), M(qmax)));
    inv[s] = M(1) / scale;
    zps[s] = zp;
    r.scale.push_back(static_cast<double>(scale));
    r.zp.push_back(zp);
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto s = static_cast<std::size_t>(seg_of(static_cast<std::int64_t>(i)));
    const M v = std::nearbyint(static_cast<M>(x[i]) * inv[s]) + M(zps[s]);
    r.q.push_back(std::isnan(v) ? qmin : std::clamp<double>(v, qmin, qmax));
  }
  return r;
}

Tensor input(const Shape& shape, DType dt, std::uint64_t seed, double stddev = 3.0) {
  Generator g(seed);
  return randn(shape, g, TensorOptions{}.with_dtype(dt), 0.5, stddev);
}

template <class SegOf>
void check_against_reference(const Tensor& x, QuantScope scope, QuantMode mode, DType qt, std::int64_t nseg,
                             SegOf seg_of, int qmin, int qmax) {
  CAPTURE(dtype_name(x.dtype()));
  CAPTURE(dtype_name(qt));
  const auto r = dynamic_range_quantize(x, scope, mode, qt, qmin, qmax);
  const auto xv = values(x);
  const bool sym = mode == QuantMode::symmetric;
  const RefResult ref = x.dtype() == DType::f64 ? reference<double>(xv, nseg, seg_of, sym, qmin, qmax)
                                                : reference<float>(xv, nseg, seg_of, sym, qmin, qmax);
  CHECK(r.q.dtype() == qt);
  CHECK(r.scale.dtype() == (x.dtype() == DType::f64 ? DType::f64 : DType::f32));
  CHECK(r.q.shape() == x.shape());
  CHECK(values(r.q) == ref.q);
  CHECK(values(r.scale) == ref.scale);
  CHECK(values(r.zero_point) == ref.zp);
  // Double-precision bound: in-range values dequantize within scale / 2 (+ rounding slack).
  const auto qv = values(r.q), sv = values(r.scale), zv = values(r.zero_point);
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const auto s = static_cast<std::size_t>(seg_of(static_cast<std::int64_t>(i)));
    if (qv[i] == qmin || qv[i] == qmax) continue;
    REQUIRE(std::fabs((qv[i] - zv[s]) * sv[s] - xv[i]) <= 0.5 * sv[s] * (1 + 1e-5) + 1e-12);
  }
}

const DType kFloat[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("per-token symmetric s8, every input dtype, matches the reference") {
  for (DType dt : kFloat) {
    Tensor x = input({9, 37}, dt, 1);
    check_against_reference(x, QuantScope::per_token(), QuantMode::symmetric, DType::s8, 9,
                            [](std::int64_t i) { return i / 37; }, -128, 127);
  }
}

TEST_CASE("per-token asymmetric u8 and s8, every input dtype") {
  for (DType dt : kFloat) {
    Tensor x = input({5, 64}, dt, 2);
    check_against_reference(x, QuantScope::per_token(), QuantMode::asymmetric, DType::u8, 5,
                            [](std::int64_t i) { return i / 64; }, 0, 255);
    check_against_reference(x, QuantScope::per_token(), QuantMode::asymmetric, DType::s8, 5,
                            [](std::int64_t i) { return i / 64; }, -128, 127);
  }
}

TEST_CASE("per-token scale shape drops the last axis; rank 3 and rank 1") {
  auto r = dynamic_range_quantize(input({2, 3, 8}, DType::f32, 3), QuantScope::per_token());
  CHECK(r.scale.shape() == Shape{2, 3});
  CHECK(r.zero_point.shape() == Shape{2, 3});
  auto r1 = dynamic_range_quantize(input({8}, DType::f32, 3), QuantScope::per_token());
  CHECK(r1.scale.shape() == Shape{});
}

TEST_CASE("per-tensor, both modes, s8 and u8") {
  for (DType dt : kFloat) {
    Tensor x = input({4, 6, 5}, dt, 4);
    for (auto mode : {QuantMode::symmetric, QuantMode::asymmetric}) {
      check_against_reference(x, QuantScope::per_tensor(), mode, DType::s8, 1, [](std::int64_t) { return 0; }, -128,
                              127);
      check_against_reference(x, QuantScope::per_tensor(), mode, DType::u8, 1, [](std::int64_t) { return 0; }, 0, 255);
    }
  }
}

TEST_CASE("symmetric u8 uses the mid zero point 128") {
  auto r = dynamic_range_quantize(Tensor::from_vector<float>({-2.0f, 1.0f, 2.0f}, {3}), QuantScope::per_tensor(),
                                  QuantMode::symmetric, DType::u8);
  CHECK(r.zero_point.item() == 128);
  CHECK(r.q.to_vector<std::uint8_t>() == std::vector<std::uint8_t>{1, 192, 255});
}

TEST_CASE("per-channel along every axis of a rank-3 tensor, negative axis too") {
  const Shape shape{3, 4, 5};
  for (DType dt : kFloat) {
    Tensor x = input(shape, dt, 5);
    check_against_reference(x, QuantScope::per_channel(0), QuantMode::symmetric, DType::s8, 3,
                            [](std::int64_t i) { return i / 20; }, -128, 127);
    check_against_reference(x, QuantScope::per_channel(1), QuantMode::asymmetric, DType::u8, 4,
                            [](std::int64_t i) { return (i / 5) % 4; }, 0, 255);
    check_against_reference(x, QuantScope::per_channel(-1), QuantMode::asymmetric, DType::s8, 5,
                            [](std::int64_t i) { return i % 5; }, -128, 127);
  }
  auto r = dynamic_range_quantize(input(shape, DType::f32, 5), QuantScope::per_channel(1));
  CHECK(r.scale.shape() == Shape{4});
}

TEST_CASE("per-group along the last axis and along a leading axis") {
  for (DType dt : kFloat) {
    Tensor x = input({3, 8, 6}, dt, 6);
    // groups of 3 along the last axis: segment = flat index / 3
    check_against_reference(x, QuantScope::per_group(-1, 3), QuantMode::symmetric, DType::s8, 3 * 8 * 2,
                            [](std::int64_t i) { return i / 3; }, -128, 127);
    // groups of 4 along axis 1 (inner 6): segment (o, l / 4, i)
    check_against_reference(x, QuantScope::per_group(1, 4), QuantMode::asymmetric, DType::u8, 3 * 2 * 6,
                            [](std::int64_t i) {
                              const std::int64_t in = i % 6, l = (i / 6) % 8, o = i / 48;
                              return (o * 2 + l / 4) * 6 + in;
                            },
                            0, 255);
  }
  auto r = dynamic_range_quantize(input({3, 8, 6}, DType::f32, 6), QuantScope::per_group(1, 4));
  CHECK(r.scale.shape() == Shape{3, 2, 6});
}

TEST_CASE("explicit narrower ranges: [-127, 127] and reduce_range [0, 127]") {
  Tensor x = input({6, 10}, DType::f32, 7);
  check_against_reference(x, QuantScope::per_token(), QuantMode::symmetric, DType::s8, 6,
                          [](std::int64_t i) { return i / 10; }, -127, 127);
  check_against_reference(x, QuantScope::per_token(), QuantMode::asymmetric, DType::u8, 6,
                          [](std::int64_t i) { return i / 10; }, 0, 127);
}

TEST_CASE("an all-zero segment gets scale 1 and quantizes to the zero point") {
  std::vector<float> v(4 * 8);
  Generator g(8);
  auto rnd = randn({3 * 8}, g).to_vector<float>();
  for (int i = 8; i < 32; ++i) v[static_cast<std::size_t>(i)] = rnd[static_cast<std::size_t>(i - 8)];  // row 0 zero
  Tensor x = Tensor::from_vector<float>(v, {4, 8});
  for (auto mode : {QuantMode::symmetric, QuantMode::asymmetric}) {
    auto r = dynamic_range_quantize(x, QuantScope::per_token(), mode, DType::s8);
    const auto sc = values(r.scale);
    CHECK(sc[0] == 1.0);
    const auto q = values(r.q);
    const double zp = values(r.zero_point)[0];
    for (int j = 0; j < 8; ++j) CHECK(q[static_cast<std::size_t>(j)] == zp);
    for (double s : sc) CHECK(std::isfinite(s));
  }
  auto z = dynamic_range_quantize(zeros({2, 3}), QuantScope::per_tensor(), QuantMode::asymmetric, DType::u8);
  CHECK(z.scale.item() == 1.0);
  CHECK(z.zero_point.item() == 0.0);
}

TEST_CASE("tiny values: the scale stays normal and 1/scale finite") {
  // 1e-37 / 127 is subnormal: the scale is raised to FLT_MIN = 2^-126.
  Tensor x = Tensor::from_vector<float>({1e-37f, -3e-38f, 0.0f}, {3});
  auto r = dynamic_range_quantize(x, QuantScope::per_tensor());
  CHECK(r.scale.item() == static_cast<double>(std::numeric_limits<float>::min()));
  CHECK(values(r.q) == std::vector<double>{9, -3, 0});
  // Below that, amax / 127 underflows to 0: scale 1 (as for an all-zero segment).
  auto z = dynamic_range_quantize(Tensor::from_vector<float>({1e-44f, 0.0f}, {2}), QuantScope::per_tensor());
  CHECK(z.scale.item() == 1.0);
}

TEST_CASE("non-finite inputs: range ignores them; +inf -> qmax, -inf -> qmin, NaN -> qmin") {
  Tensor x = Tensor::from_vector<float>({1.0f, INFINITY, -INFINITY, NAN, -2.0f, 0.5f}, {1, 6});
  for (auto scope : {QuantScope::per_token(), QuantScope::per_tensor(), QuantScope::per_channel(0),
                     QuantScope::per_group(1, 6)}) {
    auto r = dynamic_range_quantize(x, scope, QuantMode::symmetric, DType::s8);
    CHECK(values(r.scale)[0] == doctest::Approx(2.0 / 127).epsilon(1e-6));
    const auto q = values(r.q);
    CHECK(q[1] == 127);
    CHECK(q[2] == -128);
    CHECK(q[3] == -128);
    CHECK(q[4] == -127);
  }
  auto u = dynamic_range_quantize(x, QuantScope::per_token(), QuantMode::asymmetric, DType::u8);
  const auto q = values(u.q);
  CHECK(q[1] == 255);
  CHECK(q[2] == 0);
  CHECK(q[3] == 0);
}

TEST_CASE("empty input: scale 1, zero point 0") {
  auto r = dynamic_range_quantize(zeros({3, 0}), QuantScope::per_token());
  CHECK(r.scale.shape() == Shape{3});
  CHECK(values(r.scale) == std::vector<double>{1, 1, 1});
}

TEST_CASE("bad inputs are rejected before anything runs") {
  Tensor x = input({4, 8}, DType::f32, 9);
  CHECK_THROWS_AS(dynamic_range_quantize(Tensor(), QuantScope::per_token()), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(zeros({2, 2}, TensorOptions{}.with_dtype(DType::s32)), QuantScope::per_token()),
                  Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_token(), QuantMode::symmetric, DType::f32), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_token(), QuantMode::symmetric, DType::s32), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_channel(2)), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_channel(-3)), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_group(1, 3)), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_group(1, 0)), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_group(5, 2)), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(Tensor::scalar(1.0f), QuantScope::per_token()), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(Tensor::scalar(1.0f), QuantScope::per_channel(0)), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_token(), QuantMode::symmetric, DType::s8, 5, 5), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_token(), QuantMode::symmetric, DType::s8, -129, 127),
                  Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_token(), QuantMode::symmetric, DType::u8, 0, 256), Error);
  CHECK_THROWS_AS(dynamic_range_quantize(x, QuantScope::per_token(), QuantMode::symmetric, DType::s8, -10, 0), Error);
  QuantScope bad;
  bad.kind = static_cast<QuantScope::Kind>(42);
  CHECK_THROWS_AS(dynamic_range_quantize(x, bad), Error);
}

TEST_CASE("asymmetric one-sided segments: all positive -> zp = qmin, all negative -> zp = qmax") {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, -1, -2, -3, -4}, {2, 4});
  auto r = dynamic_range_quantize(x, QuantScope::per_token(), QuantMode::asymmetric, DType::u8);
  CHECK(values(r.zero_point) == std::vector<double>{0, 255});
  CHECK(values(r.q)[3] == 255);
  CHECK(values(r.q)[7] == 0);
  auto s = dynamic_range_quantize(x, QuantScope::per_token(), QuantMode::asymmetric, DType::s8);
  CHECK(values(s.zero_point) == std::vector<double>{-128, 127});
}

TEST_CASE("round half to even at the quantization step") {
  // max 127 gives scale 1 exactly: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0, -2.5 -> -2.
  Tensor x = Tensor::from_vector<float>({0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 127.0f}, {6});
  auto r = dynamic_range_quantize(x, QuantScope::per_tensor());
  CHECK(r.scale.item() == 1.0);
  CHECK(values(r.q) == std::vector<double>{0, 2, 2, 0, -2, 127});
}

TEST_CASE("quantize_byte (the row kernels' form) equals quantize_value for every kind of input") {
  // Ties at every half integer of the range, values just beside them,
  // the ends and past them, +-0, subnormals, inf, NaN, and seeded random
  // values, through scales that make x * inv_scale land anywhere.
  std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, -1e-45f, 3.0e38f, -3.0e38f};
  for (int k = -600; k <= 600; ++k) {
    const float t = static_cast<float>(k) + 0.5f;
    xs.insert(xs.end(), {t, std::nextafter(t, 1e9f), std::nextafter(t, -1e9f), static_cast<float>(k)});
  }
  Generator g(41);
  const Tensor r = randn({20000}, g, TensorOptions{}, 0.0, 200.0);
  for (std::int64_t i = 0; i < r.numel(); ++i) xs.push_back(r.data<float>()[i]);
  const struct {
    int qmin, qmax, zp;
  } ranges[] = {{-128, 127, 0}, {-127, 127, 0}, {0, 255, 128}, {0, 255, 0}, {0, 255, 37}, {-128, 127, -5}, {0, 127, 3}};
  const float invs[] = {1.0f, 0.3f, 7.77f, 1.0f / 3.0f, 1e-30f, 1e30f};
  std::int64_t mismatches = 0;
  for (const auto& rg : ranges)
    for (const float inv : invs)
      for (const float x : xs) {
        const int want = formulas::quantize_value<float>(x, inv, rg.zp, rg.qmin, rg.qmax);
        const std::uint32_t b =
            formulas::quantize_byte(x, inv, static_cast<float>(rg.qmin - rg.zp), static_cast<float>(rg.qmax - rg.zp)) +
            static_cast<std::uint32_t>(rg.zp);
        const int got = rg.qmin < 0 ? static_cast<int>(static_cast<std::int8_t>(b & 0xffu)) : static_cast<int>(b & 0xffu);
        if (got != want) ++mismatches;
      }
  CHECK(mismatches == 0);
  CHECK(xs.size() > 24000);
}

TEST_CASE("row kernel with a padded row stride writes zeros into the pad") {
  Tensor x = input({5, 13}, DType::f32, 30);
  Tensor q = Tensor::empty({5, 16}, TensorOptions{}.with_dtype(DType::s8));
  Tensor sc = Tensor::empty({5});
  poison(q);
  poison(sc);
  kernels::quantize_rows_dynamic(x, 13, kernels::QuantSpec{}, q, 16, sc, Tensor());
  auto ref = dynamic_range_quantize(x, QuantScope::per_token());
  const auto qv = values(q), rv = values(ref.q);
  for (int r = 0; r < 5; ++r)
    for (int j = 0; j < 16; ++j)
      CHECK(qv[static_cast<std::size_t>(r * 16 + j)] == (j < 13 ? rv[static_cast<std::size_t>(r * 13 + j)] : 0.0));
  CHECK(bit_equal(sc, ref.scale));
}

// ---- CUDA (bit identity with the CPU) ----

namespace {
void check_cuda_matches(const Tensor& x, QuantScope scope, QuantMode mode, DType qt) {
  auto c = dynamic_range_quantize(x, scope, mode, qt);
  auto g = dynamic_range_quantize(x.cuda(), scope, mode, qt);
  CHECK(bit_equal(c.q, g.q));
  CHECK(bit_equal(c.scale, g.scale));
  CHECK(bit_equal(c.zero_point, g.zero_point));
}
}  // namespace

TEST_CASE("CUDA per-token matches the CPU bit for bit: dtypes, modes, vector and scalar paths") {
  QGRAD_REQUIRE_GPU();
  for (DType dt : kFloat) {
    for (auto mode : {QuantMode::symmetric, QuantMode::asymmetric}) {
      for (DType qt : {DType::s8, DType::u8}) {
        check_cuda_matches(input({33, 64}, dt, 10), QuantScope::per_token(), mode, qt);  // vectorized
        check_cuda_matches(input({7, 37}, dt, 11), QuantScope::per_token(), mode, qt);   // odd D: scalar path
      }
    }
  }
}

TEST_CASE("CUDA per-token: more than 65535 rows, and rows longer than the register cache") {
  QGRAD_REQUIRE_GPU();
  check_cuda_matches(input({70000, 8}, DType::f32, 12), QuantScope::per_token(), QuantMode::symmetric, DType::s8);
  check_cuda_matches(input({3, 40000}, DType::f32, 13), QuantScope::per_token(), QuantMode::asymmetric, DType::u8);
  check_cuda_matches(input({3, 40001}, DType::bf16, 13), QuantScope::per_token(), QuantMode::symmetric, DType::s8);
}

TEST_CASE("CUDA tensor, channel and group scopes match the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  for (DType dt : kFloat) {
    Tensor x = input({6, 40, 10}, dt, 14);
    for (auto mode : {QuantMode::symmetric, QuantMode::asymmetric}) {
      check_cuda_matches(x, QuantScope::per_tensor(), mode, DType::s8);
      check_cuda_matches(x, QuantScope::per_channel(0), mode, DType::u8);
      check_cuda_matches(x, QuantScope::per_channel(1), mode, DType::s8);
      check_cuda_matches(x, QuantScope::per_channel(-1), mode, DType::s8);
      check_cuda_matches(x, QuantScope::per_group(1, 8), mode, DType::s8);
      check_cuda_matches(x, QuantScope::per_group(-1, 5), mode, DType::u8);
    }
  }
  check_cuda_matches(input({1 << 20}, DType::f32, 15), QuantScope::per_tensor(), QuantMode::asymmetric, DType::s8);
}

TEST_CASE("CUDA non-finite and all-zero segments match the CPU") {
  QGRAD_REQUIRE_GPU();
  Tensor x = Tensor::from_vector<float>({1.0f, INFINITY, -INFINITY, NAN, -2.0f, 0.5f, 0, 0, 0, 0, 0, 0}, {2, 6});
  for (auto mode : {QuantMode::symmetric, QuantMode::asymmetric}) {
    check_cuda_matches(x, QuantScope::per_token(), mode, DType::s8);
    check_cuda_matches(x, QuantScope::per_tensor(), mode, DType::u8);
    check_cuda_matches(x, QuantScope::per_channel(1), mode, DType::s8);
  }
}

TEST_CASE("CUDA row kernel with a padded row stride matches the CPU") {
  QGRAD_REQUIRE_GPU();
  for (DType dt : kFloat) {
    Tensor x = input({7, 40}, dt, 31);
    auto run = [&](Device d) {
      Tensor q = Tensor::empty({7, 48}, TensorOptions{}.with_dtype(DType::s8).with_device(d));
      Tensor sc = Tensor::empty({7}, TensorOptions{}.with_dtype(dt == DType::f64 ? DType::f64 : DType::f32).with_device(d));
      poison(q);
      kernels::quantize_rows_dynamic(x.to(d), 40, kernels::QuantSpec{}, q, 48, sc, Tensor());
      return std::pair{q, sc};
    };
    auto [qc, sc] = run(Device::cpu());
    auto [qg, sg] = run(Device::cuda());
    CHECK(bit_equal(qc, qg));
    CHECK(bit_equal(sc, sg));
  }
}

TEST_CASE("CUDA per-token: the row kernel and its long-row fallback match the CPU bit for bit on many shapes") {
  QGRAD_REQUIRE_GPU();
#if QGRAD_WITH_CUDA
  // (rows, D): one column to longer than the register-resident kernel
  // holds (8193 is odd: scalar path; f64 16384 takes the long-row fallback).
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{70000, 1}, {1, 3},    {5, 7},     {33, 64},   {257, 1000},
                                                          {9, 4096},  {65, 8192}, {3, 8193}, {2, 16384}, {1000, 24}};
  struct Out {
    Tensor q, scale, zp;
  };
  for (DType dt : kFloat) {
    for (auto [rows, D] : shapes) {
      // Finite values plus specials: an inf, a -inf and a NaN in row 0, an all-zero last row.
      Generator g(static_cast<std::uint64_t>(rows * 131 + D));
      Tensor xf = randn({rows, D}, g, TensorOptions{}, 0.5, 3.0);
      float* p = xf.data<float>();
      if (rows > 1) {
        for (std::int64_t j = 0; j < D; ++j) p[(rows - 1) * D + j] = 0.0f;
        p[0] = INFINITY;
        if (D > 2) {
          p[1] = -INFINITY;
          p[2] = NAN;
        }
      }
      const Tensor x = xf.to(dt);
      const Tensor xg = x.cuda();
      const DType st = dt == DType::f64 ? DType::f64 : DType::f32;
      // symmetric s8, asymmetric u8, symmetric u8 (zero point 128)
      for (const kernels::QuantSpec spec : {kernels::QuantSpec{true, -128, 127}, kernels::QuantSpec{false, 0, 255},
                                            kernels::QuantSpec{true, 0, 255}}) {
        const DType qt = spec.qmin < 0 ? DType::s8 : DType::u8;
        for (std::int64_t ldq : {D, (D + 15) / 16 * 16 + 16}) {
          auto run = [&](const Tensor& xin, Device d) {
            const TensorOptions on = TensorOptions{}.with_device(d);
            Out o{Tensor::empty({rows, ldq}, TensorOptions(on).with_dtype(qt)),
                  Tensor::empty({rows}, TensorOptions(on).with_dtype(st)),
                  Tensor::empty({rows}, TensorOptions(on).with_dtype(DType::s32))};
            poison(o.q);
            poison(o.scale);
            poison(o.zp);
            kernels::quantize_rows_dynamic(xin, D, spec, o.q, ldq, o.scale, o.zp);
            return o;
          };
          CAPTURE(rows);
          CAPTURE(D);
          CAPTURE(ldq);
          CAPTURE(dtype_name(dt));
          CAPTURE(spec.symmetric);
          const Out c = run(x, Device::cpu());
          const Out o = run(xg, Device::cuda());
          CHECK(bit_equal(c.q, o.q));
          CHECK(bit_equal(c.scale, o.scale));
          CHECK(bit_equal(c.zp, o.zp));
        }
      }
    }
  }
#endif
}
