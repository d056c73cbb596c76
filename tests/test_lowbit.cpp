// The low-bit dtypes and ops (issue #14): FP8 conversions bit for bit
// against PyTorch 2.11 (tests/data/golden_fp8.json, from
// tests/python/gen_fp8_golden.py), their edge values, the int4 nibble order
// (ONNX's), Tensor::to / copies of s4, u4, f8e4m3, f8e5m2 on every device,
// and the int4 / FP8 ops against host transcriptions of torchao's formulas.
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "helpers.h"
#include "qgrad/ops/lowbit.h"

using namespace qgrad;
using namespace qgrad::testing;
using json = nlohmann::json;

namespace {

const char* kGoldenPath = QGRAD_SOURCE_DIR "/tests/data/golden_fp8.json";

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A tensor of dtype dt holding raw bytes (host), moved to dev.
Tensor from_bytes(const std::vector<std::uint8_t>& bytes, const Shape& shape, DType dt, Device dev) {
  Tensor t = Tensor::empty(shape, TensorOptions{}.with_dtype(dt));
  REQUIRE(t.nbytes() == bytes.size());
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t.to(dev);
}
std::vector<std::uint8_t> bytes_of(const Tensor& t) {
  Tensor h = t.detach().cpu();
  std::vector<std::uint8_t> b(h.nbytes());
  std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

std::uint8_t e4m3(float f) { return float_to_f8e4m3_bits(f); }
std::uint8_t e5m2(float f) { return float_to_f8e5m2_bits(f); }

}  // namespace

TEST_CASE("fp8 conversions: bit for bit with PyTorch 2.11 (golden table) on every device") {
  std::ifstream f(kGoldenPath);
  if (!f) {
    std::printf("SKIPPED: %s missing (run tests/python/gen_fp8_golden.py)\n", kGoldenPath);
    return;
  }
  const json doc = json::parse(f);
  std::vector<std::uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
  std::vector<float> inputs;
  for (const auto& h : doc["f32_inputs"]) inputs.push_back(float_of(static_cast<std::uint32_t>(std::stoul(h.get<std::string>(), nullptr, 16))));
  CHECK(inputs.size() > 2000);
  for (const Device dev : test_devices()) {
    CAPTURE(dev.str());
    for (const auto& row : {std::tuple{DType::f8e4m3, "e4m3_to_f32", "f32_to_e4m3"},
                                          std::tuple{DType::f8e5m2, "e5m2_to_f32", "f32_to_e5m2"}}) {
      const auto& dt = std::get<0>(row);
      const auto& key = std::get<1>(row);
      const auto& to_key = std::get<2>(row);
      CAPTURE(dtype_name(dt));
      // All 256 patterns -> f32.
      const auto out = Tensor(from_bytes(codes, {256}, dt, dev)).to(DType::f32).cpu().to_vector<float>();
      int bad = 0;
      for (int i = 0; i < 256; ++i) {
        const auto want = static_cast<std::uint32_t>(std::stoul(doc[key][static_cast<std::size_t>(i)].get<std::string>(), nullptr, 16));
        if (bits_of(out[static_cast<std::size_t>(i)]) != want && bad++ < 5)
          MESSAGE("code ", i, ": got ", bits_of(out[static_cast<std::size_t>(i)]), " want ", want);
      }
      CHECK(bad == 0);
      // f32 edge values -> fp8 bits.
      const auto q = bytes_of(Tensor::from_vector(inputs, {static_cast<std::int64_t>(inputs.size())}, dev).to(dt));
      bad = 0;
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        const auto want = static_cast<std::uint8_t>(std::stoul(doc[to_key][i].get<std::string>(), nullptr, 16));
        if (q[i] != want && bad++ < 5) MESSAGE("input ", bits_of(inputs[i]), ": got ", int(q[i]), " want ", int(want));
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("fp8 conversions: edge values (ties to even, overflow, NaN, -0, subnormals)") {
  // E4M3FN: max 448 = 0x7e; 464 is the tie between 448 and 480 (not
  // representable): even -> 448; above it, and +-inf, NaN.
  CHECK(e4m3(448.0f) == 0x7e);
  CHECK(e4m3(464.0f) == 0x7e);
  CHECK(e4m3(std::nextafter(464.0f, 1e9f)) == 0x7f);
  CHECK(e4m3(480.0f) == 0x7f);
  CHECK(e4m3(-1e9f) == 0xff);
  CHECK(e4m3(INFINITY) == 0x7f);
  CHECK(e4m3(-INFINITY) == 0xff);
  CHECK((e4m3(NAN) & 0x7f) == 0x7f);
  CHECK(e4m3(-0.0f) == 0x80);
  CHECK(e4m3(0.0f) == 0x00);
  CHECK(e4m3(0.001953125f) == 0x01);             // 2^-9, the smallest subnormal
  CHECK(e4m3(0.0009765625f) == 0x00);            // 2^-10: tie with 0 -> even (0)
  CHECK(e4m3(3 * 0.0009765625f) == 0x02);        // 3 * 2^-10: tie between 1 and 2 -> 2
  CHECK(e4m3(1.0625f) == 0x38);                  // tie between 1 and 1.125 -> 1 (even)
  CHECK(e4m3(1.1875f) == 0x3a);                  // tie between 1.125 and 1.25 -> 1.25
  CHECK(f8e4m3_bits_to_float(0x7e) == 448.0f);
  CHECK(std::isnan(f8e4m3_bits_to_float(0x7f)));
  CHECK(std::isnan(f8e4m3_bits_to_float(0xff)));
  CHECK(f8e4m3_bits_to_float(0x78) == 256.0f);
  CHECK(f8e4m3_bits_to_float(0x01) == 0.001953125f);
  CHECK(std::signbit(f8e4m3_bits_to_float(0x80)));
  // E5M2: max 57344 = 0x7b; 61440 ties to even -> inf (0x7c); NaN 0x7f.
  CHECK(e5m2(57344.0f) == 0x7b);
  CHECK(e5m2(61439.0f) == 0x7b);
  CHECK(e5m2(61440.0f) == 0x7c);
  CHECK(e5m2(INFINITY) == 0x7c);
  CHECK(e5m2(-INFINITY) == 0xfc);
  CHECK(e5m2(NAN) == 0x7f);
  CHECK(e5m2(-0.0f) == 0x80);
  CHECK(e5m2(1.52587890625e-05f) == 0x01);  // 2^-16
  CHECK(std::isinf(f8e5m2_bits_to_float(0x7c)));
  CHECK(std::isnan(f8e5m2_bits_to_float(0x7d)));
  // Every code round-trips through float (both formats, all non-NaN codes).
  for (int c = 0; c < 256; ++c) {
    const auto b = static_cast<std::uint8_t>(c);
    if ((b & 0x7f) != 0x7f) CHECK(e4m3(f8e4m3_bits_to_float(b)) == b);
    if ((b & 0x7f) <= 0x7c) CHECK(e5m2(f8e5m2_bits_to_float(b)) == b);
  }
}

TEST_CASE("packed int4: ONNX nibble order, storage of ceil(n/2) bytes, conversions, copies") {
  for (const Device dev : test_devices()) {
    CAPTURE(dev.str());
    const Tensor v = Tensor::from_vector<std::int8_t>({1, -2, 3, 7, -8, 0, 5}, {7}, dev);
    const Tensor q = v.to(DType::s4);
    CHECK(q.numel() == 7);
    CHECK(q.nbytes() == 4);
    // Element 2k in the low nibble of byte k, 2k + 1 in the high one; the odd tail's high nibble is 0.
    CHECK(bytes_of(q) == std::vector<std::uint8_t>{0xe1, 0x73, 0x08, 0x05});
    CHECK(q.to(DType::s8).cpu().to_vector<std::int8_t>() == std::vector<std::int8_t>{1, -2, 3, 7, -8, 0, 5});
    CHECK(q.to(DType::f32).cpu().to_vector<float>() == std::vector<float>{1, -2, 3, 7, -8, 0, 5});
    // u4 saturates at [0, 15]; floats round half to even, NaN -> 0.
    CHECK(q.to(DType::u4).to(DType::s32).cpu().to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 0, 3, 7, 0, 0, 5});
    const Tensor f = Tensor::from_vector<float>({2.5f, 3.5f, -8.6f, 100.0f, NAN, -0.5f, 15.5f, 1.49f}, {8}, dev);
    CHECK(f.to(DType::s4).to(DType::f32).cpu().to_vector<float>() == std::vector<float>{2, 4, -8, 7, 0, 0, 7, 1});
    CHECK(f.to(DType::u4).to(DType::f32).cpu().to_vector<float>() == std::vector<float>{2, 4, 0, 15, 0, 0, 15, 1});
    // Copies between devices, clone, fill.
    CHECK(bit_equal(q.cpu(), q));
    CHECK(bit_equal(q.clone(), q));
    CHECK(bytes_of(full({5}, -3.0, TensorOptions{}.with_dtype(DType::s4).with_device(dev))) ==
          std::vector<std::uint8_t>{0xdd, 0xdd, 0x0d});
    CHECK(Tensor(q.reshape({7, 1})).shape() == Shape{7, 1});
    CHECK(full({1}, 6.0, TensorOptions{}.with_dtype(DType::u4).with_device(dev)).item() == 6.0);
  }
  CHECK(dtype_from_name("s4") == DType::s4);
  CHECK(dtype_from_name("f8e5m2") == DType::f8e5m2);
  CHECK(dtype_bytes(DType::u4, 9) == 5);
}

TEST_CASE("fp8 tensors: to() from and to every floating dtype, copies, item") {
  for (const Device dev : test_devices()) {
    CAPTURE(dev.str());
    const std::vector<float> v{1.0f, -448.0f, 500.0f, 0.3f, -0.0f, 1e-3f, 57344.0f, 70000.0f};
    const Tensor x = Tensor::from_vector(v, {8}, dev);
    for (const DType fp8 : {DType::f8e4m3, DType::f8e5m2}) {
      const Tensor q = x.to(fp8);
      CHECK(q.nbytes() == 8);
      const auto b = bytes_of(q);
      for (std::size_t i = 0; i < v.size(); ++i) CHECK(b[i] == (fp8 == DType::f8e4m3 ? e4m3(v[i]) : e5m2(v[i])));
      for (const DType dt : {DType::f64, DType::f16, DType::bf16}) {
        // From another float dtype: through float (f64 rounds to f32 first; f16/bf16 widen exactly).
        CHECK(bit_equal(x.to(dt).to(fp8), x.to(dt).to(DType::f32).to(fp8)));
        // To it: exact (every fp8 value is an f16 / bf16 value, but e5m2 huge values exceed neither).
        CHECK(bit_equal(q.to(dt).to(DType::f32), q.to(DType::f32)));
      }
      CHECK(bit_equal(q.cpu(), q));
      CHECK(q.to(DType::f32).cpu().to_vector<float>()[0] == 1.0f);
    }
  }
  CHECK(Tensor::from_vector<float>({0.3f}, {1}).to(DType::f8e4m3).item() == static_cast<double>(f8e4m3_bits_to_float(e4m3(0.3f))));
  const Tensor t = Tensor::from_vector(std::vector<float8_e5m2>{float8_e5m2(2.0f)}, {1});
  CHECK(t.data<float8_e5m2>()[0].bits == 0x40);
}

namespace {

// torchao's _choose_qparams_affine + _fake_quantize_affine over groups of G
// along the last axis, in f32 (host transcription).
std::vector<float> int4_reference(const std::vector<float>& x, std::int64_t G, bool symmetric, int qmin, int qmax,
                                  std::vector<float>* scales = nullptr, std::vector<std::int32_t>* zps = nullptr,
                                  std::vector<int>* qs = nullptr, std::vector<bool>* mask = nullptr) {
  std::vector<float> y(x.size());
  const float eps = std::numeric_limits<float>::min();
  for (std::size_t g0 = 0; g0 < x.size(); g0 += static_cast<std::size_t>(G)) {
    float mn = INFINITY, mx = -INFINITY;
    for (std::size_t i = g0; i < g0 + static_cast<std::size_t>(G); ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
    const float min_neg = std::min(mn, 0.0f), max_pos = std::max(mx, 0.0f);
    float s = symmetric ? std::max(-min_neg, max_pos) / 7.5f : (max_pos - min_neg) / static_cast<float>(qmax - qmin);
    s = std::max(s, eps);
    const std::int32_t z = symmetric ? (qmax + qmin + 1) / 2
                                     : static_cast<std::int32_t>(std::clamp<float>(qmin - std::nearbyint(min_neg / s), qmin, qmax));
    if (scales) scales->push_back(s), zps->push_back(z);
    const float inv = 1.0f / s;
    for (std::size_t i = g0; i < g0 + static_cast<std::size_t>(G); ++i) {
      const float qf = std::nearbyint(x[i] * inv) + static_cast<float>(z);
      const float qc = std::clamp(qf, static_cast<float>(qmin), static_cast<float>(qmax));
      y[i] = (qc - static_cast<float>(z)) * s;
      if (qs) qs->push_back(static_cast<int>(qc));
      if (mask) mask->push_back(qf >= qmin && qf <= qmax);
    }
  }
  return y;
}

}  // namespace

TEST_CASE("fake_quantize_int4: torchao's formulas, every group size and mode, mask gradient, on every device") {
  Generator gen(77);
  const Tensor xh = randn({6, 256}, gen, TensorOptions{}, 0.0, 2.0);
  std::vector<float> xv = xh.to_vector<float>();
  xv[5] = 0.0f;
  xv[7] = -0.0f;
  for (const Device dev : test_devices())
    for (const std::int64_t G : {32, 64, 128, 256})
      for (const bool sym : {true, false})
        for (const DType qt : {DType::s4, DType::u4}) {
          CAPTURE(dev.str());
          CAPTURE(G);
          CAPTURE(sym);
          CAPTURE(dtype_name(qt));
          const int qmin = qt == DType::s4 ? -8 : 0, qmax = qt == DType::s4 ? 7 : 15;
          std::vector<float> scales;
          std::vector<std::int32_t> zps;
          std::vector<bool> mask;
          const auto want = int4_reference(xv, G, sym, qmin, qmax, &scales, &zps, nullptr, &mask);
          Tensor x = Tensor::from_vector(xv, {6, 256}, dev);
          x.set_requires_grad(true);
          const QuantMode mode = sym ? QuantMode::symmetric : QuantMode::asymmetric;
          Tensor y = fake_quantize_int4(x, G, mode, qt);
          const auto got = y.cpu().to_vector<float>();
          for (std::size_t i = 0; i < want.size(); ++i) REQUIRE(bits_of(got[i]) == bits_of(want[i]));
          const Int4Qparams p = choose_qparams_int4(x, G, mode, qt);
          CHECK(p.scale.shape() == Shape{6, 256 / G});
          CHECK(p.scale.cpu().to_vector<float>() == scales);
          CHECK(p.zero_point.cpu().to_vector<std::int32_t>() == zps);
          // Straight-through: dx = dy where the unclamped q is in range.
          Tensor dy = randn({6, 256}, gen, TensorOptions{}.with_device(dev));
          y.backward(dy);
          const auto g = x.grad().cpu().to_vector<float>(), dyv = dy.cpu().to_vector<float>();
          for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == (mask[i] ? dyv[i] : 0.0f));
          // quantize -> dequantize with the same qparams: fake quantize's values; the packing is ONNX's.
          Tensor q = quantize_int4(x.detach(), p.scale, p.zero_point, G, qt);
          CHECK(bit_equal(dequantize_int4(q, p.scale, p.zero_point, G), y));
          const auto qb = bytes_of(q);
          const auto qi = q.to(DType::s32).cpu().to_vector<std::int32_t>();
          for (std::size_t i = 0; i < qi.size(); i += 2) REQUIRE(qb[i / 2] == nibble_pack(qi[i], qi[i + 1]));
        }
}

TEST_CASE("fake_quantize_int4: bf16 / f16 inputs compute in f32 (torchao promotes to the f32 scale)") {
  Generator gen(5);
  for (const DType dt : {DType::bf16, DType::f16}) {
    const Tensor x = randn({2, 64}, gen, TensorOptions{}.with_dtype(dt));
    const auto xv = x.to(DType::f32).to_vector<float>();
    const auto want = int4_reference(xv, 32, true, -8, 7);
    const Tensor y = fake_quantize_int4(x, 32);
    CHECK(y.dtype() == dt);
    CHECK(bit_equal(y, Tensor::from_vector(want, {2, 64}).to(dt)));
  }
}

namespace {
template <class F8>
float fp8_max_of() {
  return std::is_same_v<F8, float8_e4m3> ? 448.0f : 57344.0f;
}

template <class F8>
std::vector<float> fp8_reference(const std::vector<float>& x, std::int64_t block, std::vector<float>* scales) {
  std::vector<float> y(x.size());
  const float m = fp8_max_of<F8>();
  for (std::size_t b0 = 0; b0 < x.size(); b0 += static_cast<std::size_t>(block)) {
    float amax = 0.0f;
    for (std::size_t i = b0; i < b0 + static_cast<std::size_t>(block); ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = std::max(amax, 1e-12f) / m;
    scales->push_back(s);
    for (std::size_t i = b0; i < b0 + static_cast<std::size_t>(block); ++i)
      y[i] = static_cast<float>(F8(std::clamp(x[i] / s, -m, m))) * s;
  }
  return y;
}
}  // namespace

TEST_CASE("fake_quantize_fp8: torchao's formulas per tensor, token and 1x128 block; gradient passes everywhere") {
  Generator gen(11);
  std::vector<float> xv = randn({4, 256}, gen, TensorOptions{}, 0.0, 5.0).to_vector<float>();
  xv[3] = -0.0f;
  xv[4] = 1e-30f;
  for (std::size_t i = 256; i < 384; ++i) xv[i] = 0.0f;  // an all-zero block: amax floored at 1e-12
  for (const Device dev : test_devices())
    for (const DType fp8 : {DType::f8e4m3, DType::f8e5m2})
      for (const auto& row : {std::pair{QuantScope::per_tensor(), std::int64_t{1024}},
                                         std::pair{QuantScope::per_token(), std::int64_t{256}},
                                         std::pair{QuantScope::per_group(-1, 128), std::int64_t{128}}}) {
        const auto& scope = std::get<0>(row);
        const auto& block = std::get<1>(row);
        CAPTURE(dev.str());
        CAPTURE(dtype_name(fp8));
        CAPTURE(block);
        std::vector<float> scales;
        const auto want = fp8 == DType::f8e4m3 ? fp8_reference<float8_e4m3>(xv, block, &scales)
                                               : fp8_reference<float8_e5m2>(xv, block, &scales);
        Tensor x = Tensor::from_vector(xv, {4, 256}, dev);
        x.set_requires_grad(true);
        Tensor y = fake_quantize_fp8(x, scope, fp8);
        const auto got = y.cpu().to_vector<float>();
        for (std::size_t i = 0; i < want.size(); ++i) REQUIRE(bits_of(got[i]) == bits_of(want[i]));
        const Tensor s = fp8_scale(x, scope, fp8);
        CHECK(s.cpu().to_vector<float>() == scales);
        // quantize -> dequantize: the same values; q is fp8(clamp(x / s)).
        const Tensor q = quantize_fp8(x.detach(), s, scope, fp8);
        CHECK(q.dtype() == fp8);
        CHECK(bit_equal(dequantize_fp8(q, s, scope), y));
        Tensor dy = randn({4, 256}, gen, TensorOptions{}.with_device(dev));
        y.backward(dy);
        CHECK(bit_equal(x.grad(), dy));
      }
}

TEST_CASE("fake_quantize_fp8: a given scale saturates at +-max (no NaN, no inf) and the gradient still passes") {
  const Tensor x = Tensor::from_vector<float>({1000.0f, -1e30f, INFINITY, -INFINITY, NAN, 3.0f}, {6});
  const Tensor s = Tensor::from_vector<float>({1.0f}, {1});
  const auto y4 = fake_quantize_fp8(x, s, QuantScope::per_tensor(), DType::f8e4m3).to_vector<float>();
  CHECK(y4[0] == 448.0f);
  CHECK(y4[1] == -448.0f);
  CHECK(y4[2] == 448.0f);
  CHECK(y4[3] == -448.0f);
  CHECK(std::isnan(y4[4]));
  CHECK(y4[5] == 3.0f);
  const auto y5 = fake_quantize_fp8(x * 100.0, s, QuantScope::per_tensor(), DType::f8e5m2).to_vector<float>();
  CHECK(y5[0] == 57344.0f);
  CHECK(y5[3] == -57344.0f);
  // Per channel on axis 1 of [2, 3]: channel = column.
  const Tensor x2 = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const auto s2 = fp8_scale(x2, QuantScope::per_channel(1), DType::f8e4m3).to_vector<float>();
  CHECK(s2 == std::vector<float>{4.0f / 448.0f, 5.0f / 448.0f, 6.0f / 448.0f});
}

TEST_CASE("quantize_int4 / dequantize_int4 gradients: dx = dy / scale * mask, dq = dy * scale, dscale") {
  const Tensor x = Tensor::from_vector<float>({0.5f, -1.0f, 3.0f, 100.0f}, {1, 4}).set_requires_grad(true);
  const Tensor s = Tensor::from_vector<float>({0.5f}, {1, 1}), z = Tensor::from_vector<std::int32_t>({0}, {1, 1});
  Tensor y = dequantize_int4(quantize_int4(x, s, z, 4), s, z, 4);
  CHECK(y.to_vector<float>() == std::vector<float>{0.5f, -1.0f, 3.0f, 3.5f});
  y.backward(Tensor::from_vector<float>({1, 2, 3, 4}, {1, 4}));
  CHECK(x.grad().to_vector<float>() == std::vector<float>{1, 2, 3, 0});
  // A scale that requires grad: dscale = sum of dy * (q - zp).
  const Tensor q = Tensor::from_vector<std::int8_t>({1, -2, 3, 7}, {1, 4}).to(DType::s4);
  Tensor sg = Tensor::from_vector<float>({0.25f}, {1, 1}).set_requires_grad(true);
  Tensor y2 = dequantize_int4(q, sg, z, 4);
  CHECK(y2.to_vector<float>() == std::vector<float>{0.25f, -0.5f, 0.75f, 1.75f});
  y2.backward(Tensor::from_vector<float>({1, 1, 1, 2}, {1, 4}));
  CHECK(sg.grad().to_vector<float>() == std::vector<float>{16.0f});
}

TEST_CASE("low-bit ops: argument errors before anything is written") {
  const Tensor x = Tensor::from_vector<float>(std::vector<float>(6 * 64, 1.0f), {6, 64});
  CHECK_THROWS_AS(fake_quantize_int4(x, 48), Error);                  // 48 does not divide 64
  CHECK_THROWS_AS(quantize_int4(Tensor::from_vector<float>({1, 2, 3}, {1, 3}), Tensor::from_vector<float>({1}, {1, 1}),
                                Tensor::from_vector<std::int32_t>({0}, {1, 1}), 3),
                  Error);                                              // odd last dimension
  CHECK_THROWS_AS(fake_quantize_fp8(x, Tensor::from_vector<float>({0.0f}, {1}), QuantScope::per_tensor()), Error);
  CHECK_THROWS_AS(fake_quantize_fp8(x, Tensor::from_vector<float>({NAN}, {1}), QuantScope::per_tensor()), Error);
  CHECK_THROWS_AS(fake_quantize_fp8(x, QuantScope::per_group(-1, 100)), Error);
  try {
    fake_quantize_int4(x, 48);
  } catch (const Error& e) {
    CHECK(e.op() == "fake_quantize_int4");
    CHECK(e.arg() == "group_size");
  }
}

TEST_CASE("int4 / fp8 fake quantize: bit for bit with torchao's formulas run by PyTorch 2.11 (golden table)") {
  std::ifstream f(kGoldenPath);
  if (!f) {
    std::printf("SKIPPED: %s missing (run tests/python/gen_fp8_golden.py)\n", kGoldenPath);
    return;
  }
  const json doc = json::parse(f);
  const json& ops = doc["ops"];
  auto floats = [](const json& arr) {
    std::vector<float> v;
    for (const auto& h : arr) v.push_back(float_of(static_cast<std::uint32_t>(std::stoul(h.get<std::string>(), nullptr, 16))));
    return v;
  };
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (bits_of(a[i]) != bits_of(b[i])) return false;
    return true;
  };
  for (const Device dev : test_devices()) {
    CAPTURE(dev.str());
    const Tensor x4 = Tensor::from_vector(floats(ops["x_int4"]), {6, 256}, dev);
    for (const auto& c : ops["int4"]) {
      const std::int64_t G = c["group"].get<std::int64_t>();
      const bool sym = c["symmetric"].get<bool>();
      const DType qt = c["qmin"].get<int>() < 0 ? DType::s4 : DType::u4;
      CAPTURE(G);
      CAPTURE(sym);
      CAPTURE(dtype_name(qt));
      const QuantMode mode = sym ? QuantMode::symmetric : QuantMode::asymmetric;
      CHECK(same_bits(fake_quantize_int4(x4, G, mode, qt).cpu().to_vector<float>(), floats(c["y"])));
      const Int4Qparams p = choose_qparams_int4(x4, G, mode, qt);
      CHECK(same_bits(p.scale.cpu().to_vector<float>(), floats(c["scale"])));
      CHECK(p.zero_point.cpu().to_vector<std::int32_t>() == c["zero_point"].get<std::vector<std::int32_t>>());
    }
    const Tensor x8 = Tensor::from_vector(floats(ops["x_fp8"]), {4, 256}, dev);
    for (const auto& c : ops["fp8"]) {
      const DType fp8 = dtype_from_name(c["dtype"].get<std::string>());
      const std::int64_t block = c["block"].get<std::int64_t>();
      CAPTURE(dtype_name(fp8));
      CAPTURE(block);
      const QuantScope scope = block == 1024 ? QuantScope::per_tensor()
                               : block == 256 ? QuantScope::per_token()
                                              : QuantScope::per_group(-1, block);
      CHECK(same_bits(fake_quantize_fp8(x8, scope, fp8).cpu().to_vector<float>(), floats(c["y"])));
      CHECK(same_bits(fp8_scale(x8, scope, fp8).cpu().to_vector<float>(), floats(c["scale"])));
    }
  }
}

TEST_CASE("checkpoints: F8_E4M3 / F8_E5M2 and packed int4 as U8 with metadata, loaded back and read by Python") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("qgrad_lowbit_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string in = (dir / "lowbit.safetensors").string(), out = (dir / "from_py.safetensors").string(),
                    log = (dir / "log.txt").string();
  std::vector<std::int8_t> w(32);
  for (int i = 0; i < 32; ++i) w[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(i % 16 - 8);
  const Tensor w4 = Tensor::from_vector(w, {4, 8}).to(DType::s4);
  const Tensor u4 = Tensor::from_vector<std::int8_t>({1, 2, 3, 4, 15}, {5}).to(DType::u4);
  const Tensor e4 = Tensor::from_vector<float>({1, -2, 0.5f, 208, -0.0f, 0.3f}, {6}).to(DType::f8e4m3);
  const Tensor e5 = Tensor::from_vector<float>({57344, -1.5f, 1e-5f}, {3}).to(DType::f8e5m2);
  nn::save_safetensors(in, {{"w4", w4}, {"u4odd", u4}, {"e4m3", e4}, {"e5m2", e5}}, {{"w4.group_size", "8"}});
  // Loaded back: same dtypes, shapes and bytes.
  const nn::SafetensorsFile f = nn::load_safetensors(in);
  std::map<std::string, Tensor> got(f.tensors.begin(), f.tensors.end());
  CHECK(bit_equal(got.at("w4"), w4));
  CHECK(bit_equal(got.at("u4odd"), u4));
  CHECK(bit_equal(got.at("e4m3"), e4));
  CHECK(bit_equal(got.at("e5m2"), e5));
  CHECK(f.metadata.at("w4.shape") == "[4,8]");
  CHECK(f.metadata.at("w4.group_size") == "8");
  // A wrong recorded shape is an error naming the file.
  {
    const std::string bad = (dir / "bad.safetensors").string();
    nn::save_safetensors(bad, {{"w4", w4}}, {});
    std::ifstream is(bad, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
    const auto pos = bytes.find("[4,8]");
    REQUIRE(pos != std::string::npos);
    bytes.replace(pos, 5, "[4,9]");
    CHECK_THROWS_AS(nn::parse_safetensors(bytes.data(), bytes.size(), bad), Error);
  }
  const std::string py = QGRAD_PYTHON_EXE;
  if (py.empty()) {
    std::printf("SKIPPED: no Python (configure with -DQGRAD_PYTHON=/path/to/python)\n");
    fs::remove_all(dir);
    return;
  }
  const std::string script = std::string(QGRAD_SOURCE_DIR) + "/tests/python/roundtrip_lowbit_safetensors.py";
  const int rc = std::system(("'" + py + "' '" + script + "' '" + in + "' '" + out + "' > '" + log + "' 2>&1").c_str());
  std::ifstream ls(log);
  const std::string text((std::istreambuf_iterator<char>(ls)), std::istreambuf_iterator<char>());
  if (text.find("SKIPPED:") != std::string::npos) {
    std::printf("SKIPPED: python safetensors not installed\n");
    fs::remove_all(dir);
    return;
  }
  INFO("python output: ", text);
  REQUIRE(rc == 0);
  const nn::SafetensorsFile p = nn::load_safetensors(out);
  std::map<std::string, Tensor> pg(p.tensors.begin(), p.tensors.end());
  REQUIRE(pg.count("w4_py") == 1);
  CHECK(pg.at("w4_py").dtype() == DType::s4);
  CHECK(pg.at("w4_py").shape() == Shape{2, 4});
  CHECK(pg.at("w4_py").to(DType::s32).to_vector<std::int32_t>() == std::vector<std::int32_t>{-8, -7, -6, -5, -4, -3, -2, -1});
  if (pg.count("e4m3_py")) {
    CHECK(bit_equal(pg.at("e4m3_py"), (e4.to(DType::f32) * 2.0).to(DType::f8e4m3)));
    CHECK(bit_equal(pg.at("e5m2_py"), e5));
  }
  fs::remove_all(dir);
}
