// Observers and qparams against PyTorch's observer.py formulas.
#include <cmath>
#include <cstring>
#include <functional>

#include "helpers.h"
#include "qgrad/nn/quant.h"
#include "qgrad/ops/activation.h"
#include "qgrad/ops/registry.h"

using namespace qgrad;
using namespace qgrad::nn;
using qgrad::testing::bit_equal;

namespace {

// torch.ao.quantization _calculate_qparams, transcribed in float.
std::pair<float, int> ref_qparams(float mn, float mx, int qmin, int qmax, bool symmetric, int sym_zp) {
  if (mn == INFINITY && mx == -INFINITY) return {1.0f, 0};
  const float min_neg = std::min(mn, 0.0f), max_pos = std::max(mx, 0.0f);
  const float eps = std::numeric_limits<float>::epsilon();
  if (symmetric) {
    float s = std::max(-min_neg, max_pos) / static_cast<float>((qmax - qmin) / 2.0);
    return {std::max(s, eps), sym_zp};
  }
  float s = std::max((max_pos - min_neg) / static_cast<float>(qmax - qmin), eps);
  int zp = qmin - static_cast<int>(std::nearbyint(min_neg / s));
  return {s, std::clamp(zp, qmin, qmax)};
}

Tensor vec(const std::vector<float>& v, Shape s = {}) {
  if (s.empty()) s = {static_cast<std::int64_t>(v.size())};
  return Tensor::from_vector(v, s);
}

std::pair<float, int> qp(const Observer& o) {
  auto [s, z] = o.calculate_qparams();
  return {s.to_vector<float>()[0], z.to_vector<std::int32_t>()[0]};
}

}  // namespace

TEST_CASE("quant_min_max: PyTorch ranges incl. reduce_range and custom ranges") {
  ObserverOptions o;
  o.dtype = DType::u8;
  CHECK(quant_min_max(o) == std::pair<std::int64_t, std::int64_t>{0, 255});
  o.reduce_range = true;
  CHECK(quant_min_max(o) == std::pair<std::int64_t, std::int64_t>{0, 127});
  o.dtype = DType::s8;
  CHECK(quant_min_max(o) == std::pair<std::int64_t, std::int64_t>{-64, 63});
  o.reduce_range = false;
  CHECK(quant_min_max(o) == std::pair<std::int64_t, std::int64_t>{-128, 127});
  o.quant_range = {{-128, 127}};
  o.reduce_range = true;
  CHECK(quant_min_max(o) == std::pair<std::int64_t, std::int64_t>{-64, 63});
  o.dtype = DType::u8;
  o.quant_range = {{0, 255}};
  CHECK(quant_min_max(o) == std::pair<std::int64_t, std::int64_t>{0, 127});
}

TEST_CASE("MinMaxObserver affine quint8: hand-computed qparams") {
  MinMaxObserver obs;
  obs.forward(vec({-1.0f, 0.5f, 2.0f}));
  auto [s, z] = qp(obs);
  CHECK(s == 3.0f / 255.0f);
  CHECK(z == 85);
  CHECK(obs.min_val().item() == -1.0);
  CHECK(obs.max_val().item() == 2.0);
  // Running min/max across calls.
  obs.forward(vec({-3.0f, 1.0f}));
  CHECK(obs.min_val().item() == -3.0);
  CHECK(obs.max_val().item() == 2.0);
  auto [s2, z2] = qp(obs);
  CHECK(s2 == 5.0f / 255.0f);
  CHECK(z2 == ref_qparams(-3, 2, 0, 255, false, 0).second);
}

TEST_CASE("Symmetric qparams: qint8 zero point 0, quint8 zero point 128") {
  MinMaxObserver s8(DType::s8, QScheme::per_tensor_symmetric);
  s8.forward(vec({-1.0f, 0.5f, 2.0f}));
  auto [s, z] = qp(s8);
  CHECK(s == 2.0f / 127.5f);
  CHECK(z == 0);
  MinMaxObserver u8(DType::u8, QScheme::per_tensor_symmetric);
  u8.forward(vec({-4.0f, 0.5f, 2.0f}));
  auto [su, zu] = qp(u8);
  CHECK(su == 4.0f / 127.5f);
  CHECK(zu == 128);
}

TEST_CASE("reduce_range quint8 uses [0, 127]") {
  MinMaxObserver obs(DType::u8, QScheme::per_tensor_affine, true);
  obs.forward(vec({-1.0f, 2.0f}));
  auto [s, z] = qp(obs);
  CHECK(s == 3.0f / 127.0f);
  CHECK(z == ref_qparams(-1, 2, 0, 127, false, 0).second);
  CHECK(obs.qmax() == 127);
}

TEST_CASE("eps floor, all-positive, all-negative, clamped zero points") {
  {
    MinMaxObserver obs;
    obs.forward(vec({1e-9f, 2e-9f}));
    auto [s, z] = qp(obs);
    CHECK(s == std::numeric_limits<float>::epsilon());
    CHECK(z == 0);
  }
  {
    MinMaxObserver obs;
    obs.forward(vec({0.0f, 0.0f}));
    CHECK(qp(obs) == std::pair<float, int>{std::numeric_limits<float>::epsilon(), 0});
  }
  {
    MinMaxObserver obs(DType::s8);
    obs.forward(vec({5.0f, 10.0f}));
    auto [s, z] = qp(obs);
    CHECK(s == 10.0f / 255.0f);
    CHECK(z == -128);
  }
  {
    MinMaxObserver obs(DType::s8);
    obs.forward(vec({-10.0f, -5.0f}));
    auto [s, z] = qp(obs);
    CHECK(s == 10.0f / 255.0f);
    CHECK(z == 127);
  }
}

TEST_CASE("never observed: scale 1, zero point 0") {
  MinMaxObserver obs;
  CHECK(qp(obs) == std::pair<float, int>{1.0f, 0});
  PerChannelMinMaxObserver pc(3, 0, DType::s8, QScheme::per_channel_symmetric);
  auto [s, z] = pc.calculate_qparams();
  CHECK(s.to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(z.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 0, 0});
  obs.forward(Tensor::empty({0}));  // an empty input changes nothing
  CHECK(qp(obs) == std::pair<float, int>{1.0f, 0});
}

TEST_CASE("qparams match the PyTorch transcription on random ranges") {
  Generator gen(5);
  auto lo = rand({200}, gen, {}, -50, 5).to_vector<float>();
  auto hi = rand({200}, gen, {}, -5, 50).to_vector<float>();
  for (int sym = 0; sym < 2; ++sym)
    for (DType dt : {DType::u8, DType::s8})
      for (int rr = 0; rr < 2; ++rr) {
        for (int i = 0; i < 200; ++i) {
          MinMaxObserver obs(dt, sym ? QScheme::per_tensor_symmetric : QScheme::per_tensor_affine, rr != 0);
          const float a = std::min(lo[i], hi[i]), b = std::max(lo[i], hi[i]);
          obs.forward(vec({a, b}));
          const int sym_zp = dt == DType::u8 ? 128 : 0;
          auto want = ref_qparams(a, b, static_cast<int>(obs.qmin()), static_cast<int>(obs.qmax()), sym != 0, sym_zp);
          REQUIRE(qp(obs) == want);
        }
      }
}

TEST_CASE("MovingAverageMinMaxObserver: first call copies, then min += c*(cur - min)") {
  MovingAverageMinMaxObserver obs(0.01);
  obs.forward(vec({-2.0f, 3.0f}));
  CHECK(obs.min_val().item() == -2.0);
  CHECK(obs.max_val().item() == 3.0);
  obs.forward(vec({-1.0f, 5.0f}));
  float mn = -2.0f, mx = 3.0f;
  mn = mn + 0.01f * (-1.0f - mn);
  mx = mx + 0.01f * (5.0f - mx);
  CHECK(obs.min_val().to_vector<float>()[0] == mn);
  CHECK(obs.max_val().to_vector<float>()[0] == mx);
  auto [s, z] = qp(obs);
  CHECK(std::pair<float, int>{s, z} == ref_qparams(mn, mx, 0, 255, false, 0));
  obs.reset();
  obs.forward(vec({4.0f}));
  CHECK(obs.min_val().item() == 4.0);
}

TEST_CASE("PerChannelMinMaxObserver: min/max over every axis but ch_axis") {
  Generator gen(6);
  Tensor x = rand({2, 3, 4}, gen, {}, -3, 3);
  auto v = x.to_vector<float>();
  for (std::int64_t axis = 0; axis < 3; ++axis) {
    const std::int64_t c = x.size(axis);
    PerChannelMinMaxObserver obs(c, axis, DType::s8, QScheme::per_channel_symmetric);
    obs.forward(x);
    std::vector<float> mn(c, INFINITY), mx(c, -INFINITY);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) {
          const int idx[3] = {i, j, k};
          const float f = v[(i * 3 + j) * 4 + k];
          mn[idx[axis]] = std::min(mn[idx[axis]], f);
          mx[idx[axis]] = std::max(mx[idx[axis]], f);
        }
    CHECK(obs.min_val().to_vector<float>() == mn);
    CHECK(obs.max_val().to_vector<float>() == mx);
    auto [s, z] = obs.calculate_qparams();
    auto sv = s.to_vector<float>();
    for (std::int64_t ch = 0; ch < c; ++ch) CHECK(sv[ch] == ref_qparams(mn[ch], mx[ch], -128, 127, true, 0).first);
    CHECK(z.to_vector<std::int32_t>() == std::vector<std::int32_t>(c, 0));
  }
}

TEST_CASE("MovingAveragePerChannelMinMaxObserver and f64 / bf16 inputs") {
  MovingAveragePerChannelMinMaxObserver obs(2, 0, 0.5);
  obs.forward(Tensor::from_vector<double>({1, 2, -3, 4}, {2, 2}));
  CHECK(obs.min_val().to_vector<float>() == std::vector<float>{1, -3});
  obs.forward(Tensor::from_vector<double>({3, 3, -1, 0}, {2, 2}));
  CHECK(obs.min_val().to_vector<float>() == std::vector<float>{2, -2});
  CHECK(obs.max_val().to_vector<float>() == std::vector<float>{2.5f, 2});
  MinMaxObserver b;
  b.forward(Tensor::from_vector<float>({-1.5f, 2.25f}, {2}).to(DType::bf16));
  CHECK(b.min_val().item() == -1.5);
  CHECK(b.max_val().item() == 2.25);
}

TEST_CASE("Observer errors") {
  CHECK_THROWS_AS((MinMaxObserver(DType::f32)), qgrad::Error);  // parenthesized: an expression, not a declaration
  CHECK_THROWS_AS(MinMaxObserver(DType::u8, QScheme::per_channel_affine), qgrad::Error);
  CHECK_THROWS_AS(PerChannelMinMaxObserver(0), qgrad::Error);
  CHECK_THROWS_AS(MovingAverageMinMaxObserver(1.5), qgrad::Error);
  ObserverOptions bad;
  bad.quant_range = {{1, 255}};
  CHECK_THROWS_AS(Observer{bad}, qgrad::Error);
  PerChannelMinMaxObserver pc(3, 1);
  CHECK_THROWS_AS(pc.forward(Tensor::empty({2, 4})), qgrad::Error);   // 4 channels, not 3
  CHECK_THROWS_AS(pc.forward(Tensor::empty({3})), qgrad::Error);      // axis 1 out of range
  MinMaxObserver obs;
  CHECK_THROWS_AS(obs.forward(Tensor::from_vector<std::int32_t>({1}, {1})), qgrad::Error);
  CHECK_THROWS_AS(obs.forward(Tensor()), qgrad::Error);
  CHECK_THROWS_AS(obs.calculate_qparams(zeros({2}), zeros({1}, TensorOptions{}.with_dtype(DType::s32))),
                  qgrad::Error);
  CHECK_THROWS_AS(obs.calculate_qparams(zeros({1}), zeros({1})), qgrad::Error);
}

namespace {
// Host reference of fake_quantize_per_tensor (forward only).
Tensor fq_ref(const Tensor& x, const Tensor& scale, const Tensor& zp, std::int64_t qmin, std::int64_t qmax) {
  const float s = scale.to_vector<float>()[0];
  const int z = zp.to_vector<std::int32_t>()[0];
  auto v = x.to_vector<float>();
  const float inv = 1.0f / s;
  for (float& f : v) {
    float q = std::nearbyint(f * inv) + static_cast<float>(z);
    q = std::clamp(q, static_cast<float>(qmin), static_cast<float>(qmax));
    f = (q - static_cast<float>(z)) * s;
  }
  return Tensor::from_vector(v, x.shape());
}
}  // namespace

TEST_CASE("FakeQuantize: observer updates device qparams; switches freeze and bypass") {
  ObserverOptions o;
  o.averaging_constant = 0.01;
  o.quant_range = {{0, 255}};
  o.reduce_range = true;
  FakeQuantize fq(o);
  CHECK(fq.qmin() == 0);
  CHECK(fq.qmax() == 127);
  Tensor x = vec({-1.0f, 0.3f, 2.0f});
  Tensor y = fq(x);
  auto [s, z] = ref_qparams(-1, 2, 0, 127, false, 0);
  CHECK(fq.scale().to_vector<float>()[0] == s);
  CHECK(fq.zero_point().to_vector<std::int32_t>()[0] == z);
  CHECK(bit_equal(y, fq_ref(x, fq.scale(), fq.zero_point(), 0, 127)));
  // Frozen observer: qparams stay.
  fq.enable_observer(false);
  fq(vec({-100.0f, 100.0f}));
  CHECK(fq.scale().to_vector<float>()[0] == s);
  // No fake quant: identity (the same tensor).
  fq.enable_fake_quant(false);
  Tensor same = fq(x);
  CHECK(same.impl() == x.impl());
  // State names.
  auto names = fq.named_buffers();
  REQUIRE(names.size() == 4);
  CHECK(names[0].first == "scale");
  CHECK(names[2].first == "activation_post_process.min_val");
  // Recursive switches.
  enable_fake_quant(fq, true);
  CHECK(fq.fake_quant_enabled());
  enable_observer(fq, true);
  CHECK(fq.observer_enabled());
}

TEST_CASE("LearnableFakeQuantize: grad factor and parameter switches") {
  ObserverOptions o;
  LearnableFakeQuantize lfq(o, true);
  CHECK(lfq.grad_factor(100) == doctest::Approx(1.0 / std::sqrt(100.0 * 255.0)));
  LearnableFakeQuantize plain(o, false);
  CHECK(plain.grad_factor(100) == 1.0);
  CHECK(lfq.named_parameters().size() == 2);
  lfq.enable_static_estimate();
  CHECK_FALSE(lfq.scale().requires_grad());
  lfq.enable_param_learning();
  CHECK(lfq.scale().requires_grad());
  // Observer-only pass: qparams land in the float parameters.
  lfq.enable_static_estimate();
  lfq.enable_fake_quant(false);
  lfq(vec({-1.0f, 2.0f}));
  CHECK(lfq.scale().to_vector<float>()[0] == 3.0f / 255.0f);
  CHECK(lfq.zero_point().to_vector<float>()[0] == 85.0f);
}

TEST_CASE("CUDA observers match CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  Generator gen(7);
  // Large per-tensor inputs (many partial blocks; the second past one pass of
  // a resident wave's block chunks on an H200, with a scalar tail), and
  // per-channel on each axis.
  for (std::int64_t n : {std::int64_t{1} << 20, (std::int64_t{6} << 20) + 5}) {
    Tensor x = randn({n}, gen, {}, 0.3, 2.0);
    Observer oc(ObserverOptions{}), og(ObserverOptions{});
    og.to(Device::cuda(0));
    oc.forward(x);
    og.forward(x.cuda());
    CHECK(bit_equal(oc.min_val(), og.min_val()));
    CHECK(bit_equal(oc.max_val(), og.max_val()));
  }
  Tensor big = randn({1 << 20}, gen, {}, 0.3, 2.0);
  Tensor w = randn({64, 33, 5}, gen);
  for (double c : {-1.0, 0.01}) {
    ObserverOptions pt;
    pt.averaging_constant = c;
    Observer oc(pt), og(pt);
    og.to(Device::cuda(0));
    for (int rep = 0; rep < 3; ++rep) {
      Tensor x = rep == 0 ? big : mul(big, 0.5 + rep);
      oc.forward(x);
      og.forward(x.cuda());
    }
    CHECK(bit_equal(oc.min_val(), og.min_val()));
    CHECK(bit_equal(oc.max_val(), og.max_val()));
    auto [sc, zc] = oc.calculate_qparams();
    auto [sg, zg] = og.calculate_qparams();
    CHECK(bit_equal(sc, sg));
    CHECK(bit_equal(zc, zg));
    for (std::int64_t axis = 0; axis < 3; ++axis) {
      ObserverOptions pc;
      pc.qscheme = QScheme::per_channel_symmetric;
      pc.dtype = DType::s8;
      pc.ch_axis = axis;
      pc.channels = w.size(axis);
      pc.averaging_constant = c;
      Observer a(pc), b(pc);
      b.to(Device::cuda(0));
      a.forward(w);
      b.forward(w.cuda());
      a.forward(mul(w, 1.5));
      b.forward(mul(w, 1.5).cuda());
      CHECK(bit_equal(a.min_val(), b.min_val()));
      CHECK(bit_equal(a.max_val(), b.max_val()));
      auto [s1, z1] = a.calculate_qparams();
      auto [s2, z2] = b.calculate_qparams();
      CHECK(bit_equal(s1, s2));
      CHECK(bit_equal(z1, z2));
    }
  }
}

TEST_CASE("CUDA observers match CPU bit for bit on signed zeros, infinities and NaN payloads") {
  QGRAD_REQUIRE_GPU();
  // The f32 reductions run on min.NaN / max.NaN and redo a share that saw a
  // NaN with the exact combines: a NaN of a non-canonical payload must come
  // back with its payload, as on the CPU, and -0 must stay below +0.
  const auto bits = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  const float payload_nan = bits(0xffc00123u);
  Generator gen(11);
  const std::int64_t rows = 6, len = 4100;  // rows of whole float4 vectors (16-byte aligned)
  std::vector<float> v = randn({rows, len}, gen).to_vector<float>();
  for (std::int64_t i = 0; i < len; ++i) {
    v[static_cast<std::size_t>(1 * len + i)] = i % 3 == 0 ? -0.0f : 0.0f;  // row 1: zeros of both signs
    v[static_cast<std::size_t>(2 * len + i)] = -0.0f;                      // row 2: only -0
  }
  v[static_cast<std::size_t>(3 * len + 1234)] = payload_nan;  // row 3: one NaN
  v[static_cast<std::size_t>(4 * len + 7)] = INFINITY;        // row 4: both infinities
  v[static_cast<std::size_t>(4 * len + 2048)] = -INFINITY;
  v[static_cast<std::size_t>(5 * len + len - 2)] = payload_nan;  // row 5: a NaN, in the tail of the prefix below
  const Tensor x = Tensor::from_vector(v, {rows, len});
  // Per tensor: the rows without NaN (zeros and infinities decide the
  // range), all rows (the NaN decides it), a prefix of 4k + 3 elements whose
  // only NaN is in the scalar tail; then per channel.
  const Tensor flat = x.reshape({rows * len});
  const std::vector<std::pair<Tensor, bool>> cases = {
      {slice(x, 0, 0, 3), false}, {x, false}, {slice(flat, 0, 0, rows * len - 1), false}, {x, true}};
  for (const auto& [in, per_channel] : cases) {
    ObserverOptions o;
    o.averaging_constant = -1.0;
    if (per_channel) {
      o.qscheme = QScheme::per_channel_symmetric;
      o.dtype = DType::s8;
      o.ch_axis = 0;
      o.channels = rows;
    }
    Observer oc(o), og(o);
    og.to(Device::cuda(0));
    oc.forward(in);
    og.forward(in.cuda());
    CHECK(bit_equal(oc.min_val(), og.min_val()));
    CHECK(bit_equal(oc.max_val(), og.max_val()));
  }
  // The CPU's values are the ones meant: row 2's range is (-0, -0), row 1's
  // (-0, +0), row 3's min the NaN with its payload.
  ObserverOptions o;
  o.averaging_constant = -1.0;
  o.qscheme = QScheme::per_channel_symmetric;
  o.dtype = DType::s8;
  o.ch_axis = 0;
  o.channels = rows;
  Observer og(o);
  og.to(Device::cuda(0));
  og.forward(x.cuda());
  const std::vector<float> mn = og.min_val().cpu().to_vector<float>(), mx = og.max_val().cpu().to_vector<float>();
  CHECK(std::signbit(mn[1]));
  CHECK(!std::signbit(mx[1]));
  CHECK(std::signbit(mn[2]));
  CHECK(std::signbit(mx[2]));
  std::uint32_t u = 0;
  std::memcpy(&u, &mn[3], sizeof u);
  CHECK(u == 0xffc00123u);
  std::memcpy(&u, &mx[5], sizeof u);
  CHECK(u == 0xffc00123u);
  CHECK(mn[4] == -INFINITY);
  CHECK(mx[4] == INFINITY);
}

namespace {

// One observe + fake quantize case: x of `shape` (dtype), observed per
// tensor (axis < 0) or on `axis`, `calls` times with growing inputs.
struct ObserveCase {
  Shape shape;
  std::int64_t axis;
  DType dtype;
  double c;  // averaging constant
};

ObserverOptions observe_options(const ObserveCase& k, const Tensor& x) {
  ObserverOptions o;
  o.averaging_constant = k.c;
  if (k.axis >= 0) {
    o.qscheme = QScheme::per_channel_symmetric;
    o.dtype = DType::s8;
    o.ch_axis = k.axis;
    o.channels = x.size(k.axis);
  } else {
    o.quant_range = {{0, 255}};
    o.reduce_range = true;
  }
  return o;
}

// The fused step's results: out, the gradient of sum(out * g) (the mask
// times g), and the observer's and qparams' state.
struct ObserveResult {
  Tensor out, dx, run_min, run_max, scale, zp;
};

ObserveResult run_fused(Observer& obs, const Tensor& x, const Tensor& g, Tensor scale, Tensor zp, bool relu = false) {
  testing::poison(scale);  // the op must write every qparam before the fake quantize reads it
  testing::poison(zp);
  Tensor leaf = x.detach();
  leaf.set_requires_grad(true);
  Tensor out = obs.observe_and_fake_quantize(leaf, scale, zp, relu);
  sum(mul(out, g)).backward();
  return {out.detach(), leaf.grad(), obs.min_val(), obs.max_val(), scale, zp};
}

// Every output and every piece of state of two runs bit for bit.
void check_same(const ObserveResult& a, const ObserveResult& b) {
  CHECK(bit_equal(a.out, b.out));
  CHECK(bit_equal(a.dx, b.dx));
  CHECK(bit_equal(a.run_min, b.run_min));
  CHECK(bit_equal(a.run_max, b.run_max));
  CHECK(bit_equal(a.scale, b.scale));
  CHECK(bit_equal(a.zp, b.zp));
}

}  // namespace

TEST_CASE("observe + fake quantize equals the observer followed by the fake quantize") {
  Generator gen(11);
  for (const ObserveCase& k : {ObserveCase{{1000}, -1, DType::f32, 0.01}, ObserveCase{{64, 33, 5}, 1, DType::f32, -1.0},
                               ObserveCase{{16, 40}, 0, DType::f64, 0.01}, ObserveCase{{7, 9}, -1, DType::bf16, -1.0},
                               ObserveCase{{8, 24}, 1, DType::f16, 0.01}}) {
    CAPTURE(shape_str(k.shape));
    CAPTURE(k.axis);
    Tensor x0 = randn(k.shape, gen, TensorOptions{}.with_dtype(k.dtype), 0.2, 1.5);
    const ObserverOptions o = observe_options(k, x0);
    Observer fused(o), two_step(o);
    const std::int64_t c = fused.channels();
    for (int call = 0; call < 3; ++call) {
      Tensor x = mul(x0, 1.0 + 0.5 * call);
      Tensor g = randn(k.shape, gen, TensorOptions{}.with_dtype(k.dtype));
      const ObserveResult r =
          run_fused(fused, x, g, Tensor::empty({c}), Tensor::empty({c}, TensorOptions{}.with_dtype(DType::s32)));
      Tensor s = Tensor::empty({c}), z = Tensor::empty({c}, TensorOptions{}.with_dtype(DType::s32));
      two_step.observe_and_calculate_qparams(x, s, z);
      Tensor leaf = x.detach();
      leaf.set_requires_grad(true);
      Tensor ref = k.axis >= 0 ? fake_quantize_per_channel(leaf, s, z, k.axis, two_step.qmin(), two_step.qmax())
                               : fake_quantize_per_tensor(leaf, s, z, two_step.qmin(), two_step.qmax());
      sum(mul(ref, g)).backward();
      CHECK(bit_equal(r.out, ref));
      CHECK(bit_equal(r.dx, leaf.grad()));
      CHECK(bit_equal(r.run_min, two_step.min_val()));
      CHECK(bit_equal(r.run_max, two_step.max_val()));
      CHECK(bit_equal(r.scale, s));
      CHECK(bit_equal(r.zp, z));
    }
  }
}

// t with every zero (either sign) as +0: the relu form's gradient against the
// composition's (ops/quantize.h: +0 where the composition gives dy * 0).
Tensor zeros_positive(const Tensor& t) {
  Tensor f = t.detach().to(DType::f64).cpu();
  double* v = f.data<double>();
  for (std::int64_t i = 0; i < f.numel(); ++i)
    if (v[i] == 0) v[i] = 0.0;
  return f.to(t.dtype());
}

TEST_CASE("observe + fake quantize + relu equals relu of the observer's fake quantize") {
  Generator gen(15);
  std::int64_t top_clamped_negative = 0;  // elements where the two gradients differ in the sign of zero
  for (const ObserveCase& k : {ObserveCase{{1000}, -1, DType::f32, 0.01}, ObserveCase{{64, 33, 5}, -1, DType::f32, -1.0},
                               ObserveCase{{16, 40}, -1, DType::f64, 0.01}, ObserveCase{{7, 9}, -1, DType::bf16, -1.0},
                               ObserveCase{{8, 24}, -1, DType::f16, 0.01}}) {
    CAPTURE(shape_str(k.shape));
    CAPTURE(dtype_name(k.dtype));
    Tensor x0 = randn(k.shape, gen, TensorOptions{}.with_dtype(k.dtype), 0.2, 1.5);
    const ObserverOptions o = observe_options(k, x0);
    Observer fused(o), two_step(o);
    for (int call = 0; call < 3; ++call) {
      // Growing inputs against a moving-average range: elements past the top clamp.
      Tensor x = mul(x0, 1.0 + 0.5 * call);
      Tensor g = randn(k.shape, gen, TensorOptions{}.with_dtype(k.dtype));
      const ObserveResult r =
          run_fused(fused, x, g, Tensor::empty({1}), Tensor::empty({1}, TensorOptions{}.with_dtype(DType::s32)), true);
      Tensor s = Tensor::empty({1}), z = Tensor::empty({1}, TensorOptions{}.with_dtype(DType::s32));
      two_step.observe_and_calculate_qparams(x, s, z);
      Tensor leaf = x.detach();
      leaf.set_requires_grad(true);
      Tensor ref = relu(fake_quantize_per_tensor(leaf, s, z, two_step.qmin(), two_step.qmax()));
      sum(mul(ref, g)).backward();
      CHECK(bit_equal(r.out, ref));
      CHECK(bit_equal(r.dx, zeros_positive(leaf.grad())));
      CHECK(bit_equal(r.run_min, two_step.min_val()));
      CHECK(bit_equal(r.run_max, two_step.max_val()));
      CHECK(bit_equal(r.scale, s));
      CHECK(bit_equal(r.zp, z));
      // Without the observer: fake_quantize_relu_per_tensor with the same qparams.
      Tensor leaf2 = x.detach();
      leaf2.set_requires_grad(true);
      Tensor y2 = fake_quantize_relu_per_tensor(leaf2, s, z, two_step.qmin(), two_step.qmax());
      sum(mul(y2, g)).backward();
      CHECK(bit_equal(y2, ref));
      CHECK(bit_equal(leaf2.grad(), r.dx));
      const Tensor dxc = leaf.grad().to(DType::f64);
      for (std::int64_t i = 0; i < dxc.numel(); ++i)
        top_clamped_negative += dxc.data<double>()[i] == 0 && std::signbit(dxc.data<double>()[i]);
    }
  }
  CHECK(top_clamped_negative > 0);  // the documented difference was exercised
}

TEST_CASE("fake_quantize_relu_per_tensor equals relu of the fake quantize on edge values, every clamp range") {
  // The CPU's f32 vector path (a raised clamp bound and mask bound) and the
  // per-element formula (f64), on ties, clamp bounds, signed zeros, huge values.
  Generator gen(17);
  struct Range {
    std::int64_t qmin, qmax, zp;
  };
  for (const DType dt : {DType::f32, DType::f64}) {
    for (const Range r : {Range{0, 255, 100}, Range{0, 255, 0}, Range{0, 255, 255}, Range{-128, 127, -128},
                          Range{-128, 127, 5}, Range{-8, 7, 7}}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(r.zp);
      const Tensor x = registry::quant_input({1000}, gen, Device::cpu(), dt, 0.0625, r.zp, r.qmin, r.qmax);
      const Tensor g = randn({1000}, gen, TensorOptions{}.with_dtype(dt));
      const Tensor s = full({1}, 0.0625f), z = full({1}, static_cast<double>(r.zp), TensorOptions{}.with_dtype(DType::s32));
      Tensor a = x.detach(), b = x.detach();
      a.set_requires_grad(true);
      b.set_requires_grad(true);
      const Tensor ya = fake_quantize_relu_per_tensor(a, s, z, r.qmin, r.qmax);
      const Tensor yb = relu(fake_quantize_per_tensor(b, s, z, r.qmin, r.qmax));
      sum(mul(ya, g)).backward();
      sum(mul(yb, g)).backward();
      CHECK(bit_equal(ya, yb));
      CHECK(bit_equal(a.grad(), zeros_positive(b.grad())));
    }
  }
}

TEST_CASE("CUDA observe + fake quantize + relu matches the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  Generator gen(16);
  // The QAT MLP's activations (one launch and two), large, odd and 16-bit.
  for (const ObserveCase& k :
       {ObserveCase{{256, 256}, -1, DType::f32, 0.01}, ObserveCase{{256, 10}, -1, DType::f32, 0.01},
        ObserveCase{{4096, 1024}, -1, DType::f32, 0.01}, ObserveCase{{(1 << 20) + 7}, -1, DType::f32, -1.0},
        ObserveCase{{300, 70}, -1, DType::bf16, 0.01}, ObserveCase{{3}, -1, DType::f64, 0.01},
        ObserveCase{{(1 << 16) + 3}, -1, DType::f16, -1.0}}) {
    CAPTURE(shape_str(k.shape));
    CAPTURE(dtype_name(k.dtype));
    Tensor x0 = randn(k.shape, gen, TensorOptions{}.with_dtype(k.dtype), 0.2, 1.5);
    const ObserverOptions o = observe_options(k, x0);
    Observer on_cpu(o), on_gpu(o);
    on_gpu.to(Device::cuda(0));
    const auto gpu = TensorOptions{}.with_device(Device::cuda(0));
    for (int call = 0; call < 3; ++call) {
      Tensor x = mul(x0, 1.0 + 0.5 * call);
      Tensor g = randn(k.shape, gen, TensorOptions{}.with_dtype(k.dtype));
      testing::poison(Tensor::empty(k.shape, TensorOptions{gpu}.with_dtype(k.dtype)));
      const ObserveResult a =
          run_fused(on_cpu, x, g, Tensor::empty({1}), Tensor::empty({1}, TensorOptions{}.with_dtype(DType::s32)), true);
      const ObserveResult b = run_fused(on_gpu, x.cuda(), g.cuda(), Tensor::empty({1}, gpu),
                                        Tensor::empty({1}, TensorOptions{gpu}.with_dtype(DType::s32)), true);
      check_same(a, b);
      // Without grad (the per-tensor kernel without a mask) and without the observer.
      NoGradGuard no_grad;
      const Tensor c = fake_quantize_relu_per_tensor(x, a.scale, a.zp, on_cpu.qmin(), on_cpu.qmax());
      const Tensor d = fake_quantize_relu_per_tensor(x.cuda(), b.scale, b.zp, on_cpu.qmin(), on_cpu.qmax());
      CHECK(bit_equal(c, d));
    }
  }
}

TEST_CASE("observe + fake quantize: argument errors name the op and the argument, state untouched") {
  Generator gen(12);
  Tensor x = randn({4, 6}, gen);
  Tensor run = full({1}, 2.0f), scale = full({1}, 0.5f), zp = zeros({1}, TensorOptions{}.with_dtype(DType::s32));
  auto expect = [&](const std::function<void()>& f, const char* op, const char* arg) {
    try {
      f();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.op() == op);
      CHECK(e.arg() == arg);
    }
    CHECK(run.to_vector<float>()[0] == 2.0f);
    CHECK(scale.to_vector<float>()[0] == 0.5f);
  };
  const char* pt = "observe_fake_quantize_per_tensor";
  const char* pc = "observe_fake_quantize_per_channel";
  expect([&] { observe_fake_quantize_per_tensor(x, scale, zp, 0, 255, {full({2}, 0.0f), run, 0.01}); }, pt,
         "run_min");
  expect([&] { observe_fake_quantize_per_tensor(x, scale, zp, 0, 255, {run, run.to(DType::f64), 0.01}); }, pt,
         "run_max");
  expect([&] { observe_fake_quantize_per_tensor(x, scale, zp, 0, 255, {run, run, 1.5}); }, pt, "averaging_constant");
  expect([&] { observe_fake_quantize_per_tensor(x, scale, zp, 5, 5, {run, run, 0.01}); }, pt, "qmax");
  expect([&] { observe_fake_quantize_per_tensor(x.to(DType::s32), scale, zp, 0, 255, {run, run, 0.01}); }, pt, "x");
  expect([&] { observe_fake_quantize_per_channel(x, scale, zp, 1, -128, 127, {run, run, 0.01}); }, pc, "scale");
  expect([&] { observe_fake_quantize_per_channel(x, full({6}, 0.5f), zeros({6}, TensorOptions{}.with_dtype(DType::s32)),
                                                 1, -128, 127, {run, run, 0.01}); },
         pc, "run_min");
}

// Whole tensors the observer splits into parts run as one cooperative launch
// (kernels/cuda/quantize_observe.cu observe_tensor_kernel); with grad the case above
// covers them ([256, 256], [4096, 1024], 2^20 + 7, bf16 [300, 70]), here
// without grad (no mask written), poisoned outputs, state over three calls.
TEST_CASE("CUDA observe + fake quantize of a whole tensor without grad matches the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  Generator gen(14);
  const auto gpu = TensorOptions{}.with_device(Device::cuda(0));
  for (const ObserveCase& k : {ObserveCase{{256, 784}, -1, DType::f32, 0.01},
                               ObserveCase{{(1 << 16) + 3}, -1, DType::f16, -1.0},
                               ObserveCase{{4096, 1024}, -1, DType::f32, -1.0}}) {
    CAPTURE(shape_str(k.shape));
    CAPTURE(dtype_name(k.dtype));
    const Tensor x0 = randn(k.shape, gen, TensorOptions{}.with_dtype(k.dtype), 0.2, 1.5);
    ObserverUpdate cpu{full({1}, -0.5f), full({1}, 0.75f), k.c};
    ObserverUpdate cuda{cpu.run_min.cuda(), cpu.run_max.cuda(), k.c};
    for (int call = 0; call < 3; ++call) {
      const Tensor x = mul(x0, 1.0 + 0.5 * call);
      Tensor s_cpu = Tensor::empty({1}), z_cpu = Tensor::empty({1}, TensorOptions{}.with_dtype(DType::s32));
      Tensor s_gpu = Tensor::empty({1}, gpu), z_gpu = Tensor::empty({1}, TensorOptions{gpu}.with_dtype(DType::s32));
      testing::poison(s_gpu);
      testing::poison(z_gpu);
      testing::poison(Tensor::empty(k.shape, TensorOptions{}.with_dtype(k.dtype).with_device(Device::cuda(0))));
      const Tensor a = observe_fake_quantize_per_tensor(x, s_cpu, z_cpu, 0, 255, cpu);
      const Tensor b = observe_fake_quantize_per_tensor(x.cuda(), s_gpu, z_gpu, 0, 255, cuda);
      CHECK(bit_equal(a, b));
      CHECK(bit_equal(cpu.run_min, cuda.run_min));
      CHECK(bit_equal(cpu.run_max, cuda.run_max));
      CHECK(bit_equal(s_cpu, s_gpu));
      CHECK(bit_equal(z_cpu, z_gpu));
    }
  }
}

// observe_fake_quantize_per_channel_batch against the single op on copies of
// the same state, three calls (the moving averages move), on every device:
// a group of ten f32 axis-0 weights of the row kernel (the b256 MLP's three,
// a 3x3 conv's, six [16, 40]: two launches of 8 and 2 on CUDA), one without
// grad (no mask), an f16 group of two, a bf16 running min/max alone, and two
// the row kernel does not take (too long a row; axis 1), one at a time.
TEST_CASE("observe_fake_quantize_per_channel_batch is observe_fake_quantize_per_channel of each tensor, bit for bit") {
  struct Item {
    Shape shape;
    std::int64_t axis;
    DType dtype;
    double c;
    bool grad;
  };
  std::vector<Item> items = {{{256, 784}, 0, DType::f32, 0.01, true}, {{256, 256}, 0, DType::f32, 0.01, true},
                             {{10, 256}, 0, DType::f32, 0.01, true},  {{32, 1, 3, 3}, 0, DType::f32, 0.01, true},
                             {{70, 300}, 0, DType::f16, 0.01, true},  {{3, 96}, 0, DType::bf16, -1.0, true},
                             {{4, 70000}, 0, DType::f32, 0.01, true}, {{64, 33, 5}, 1, DType::f32, 0.01, true},
                             {{70, 128}, 0, DType::f16, 0.01, true}};
  for (int i = 0; i < 6; ++i) items.push_back({{16, 40}, 0, DType::f32, 0.01, i != 2});
  for (const Device dev : testing::test_devices()) {
    CAPTURE(dev.str());
    Generator gen(17);
    const auto on = [&](DType dt) { return TensorOptions{}.with_device(dev).with_dtype(dt); };
    struct State {
      Tensor run_min, run_max, scale, zp;
    };
    const auto fresh = [&](std::int64_t c) {
      // Never observed: the first call takes x's range, the later ones (x scaled up) clamp some elements.
      State s{full({c}, INFINITY, on(DType::f32)), full({c}, -INFINITY, on(DType::f32)), Tensor::empty({c}, on(DType::f32)),
              Tensor::empty({c}, on(DType::s32))};
      testing::poison(s.scale);  // the op must write every qparam before the fake quantize reads it
      testing::poison(s.zp);
      return s;
    };
    std::vector<Tensor> x0;
    std::vector<State> batch_state, single_state;
    for (const Item& it : items) {
      x0.push_back(randn(it.shape, gen, on(it.dtype), 0.1, 1.5));
      const std::int64_t c = it.shape[static_cast<std::size_t>(it.axis)];
      batch_state.push_back(fresh(c));
      single_state.push_back(fresh(c));
    }
    for (int call = 0; call < 3; ++call) {
      CAPTURE(call);
      std::vector<Tensor> leaves_batch, leaves_single, gs;
      std::vector<ChannelObserveArgs> args;
      for (std::size_t i = 0; i < items.size(); ++i) {
        const Tensor x = mul(x0[i], 1.0 + 0.5 * call);
        leaves_batch.push_back(x.detach());
        leaves_single.push_back(x.detach());
        leaves_batch.back().set_requires_grad(items[i].grad);
        leaves_single.back().set_requires_grad(items[i].grad);
        gs.push_back(randn(items[i].shape, gen, on(items[i].dtype)));
        const State& s = batch_state[i];
        args.push_back({leaves_batch[i], s.scale, s.zp, items[i].axis, -128, 127,
                        {s.run_min, s.run_max, items[i].c, true, 0}});
      }
      const std::vector<Tensor> ys = observe_fake_quantize_per_channel_batch(args);
      REQUIRE(ys.size() == items.size());
      for (std::size_t i = 0; i < items.size(); ++i) {
        CAPTURE(i);
        const State& s = single_state[i];
        const Tensor y = observe_fake_quantize_per_channel(leaves_single[i], s.scale, s.zp, items[i].axis, -128, 127,
                                                           {s.run_min, s.run_max, items[i].c, true, 0});
        CHECK(bit_equal(ys[i], y));
        CHECK(bit_equal(batch_state[i].run_min, s.run_min));
        CHECK(bit_equal(batch_state[i].run_max, s.run_max));
        CHECK(bit_equal(batch_state[i].scale, s.scale));
        CHECK(bit_equal(batch_state[i].zp, s.zp));
        CHECK(ys[i].requires_grad() == items[i].grad);
        if (!items[i].grad) continue;
        sum(mul(ys[i], gs[i])).backward();
        sum(mul(y, gs[i])).backward();
        CHECK(bit_equal(leaves_batch[i].grad(), leaves_single[i].grad()));
        // Not trivially equal: some elements clamp (gradient 0), most pass g.
        const std::vector<double> dx = testing::values(leaves_batch[i].grad()), g = testing::values(gs[i]);
        std::size_t passed = 0;
        for (std::size_t e = 0; e < dx.size(); ++e) passed += dx[e] == g[e] && g[e] != 0;
        CHECK(passed > dx.size() / 2);
      }
    }
  }
}

TEST_CASE("CUDA observe + fake quantize (rows kernel and observer + engine) matches the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  Generator gen(13);
  // The QAT MLP's activations and weights, large and odd sizes, every axis.
  for (const ObserveCase& k :
       {ObserveCase{{256, 256}, -1, DType::f32, 0.01}, ObserveCase{{256, 10}, -1, DType::f32, 0.01},
        ObserveCase{{256, 784}, 0, DType::f32, 0.01}, ObserveCase{{10, 256}, 0, DType::f32, 0.01},
        ObserveCase{{(1 << 20) + 7}, -1, DType::f32, -1.0}, ObserveCase{{4096, 1024}, -1, DType::f32, 0.01},
        ObserveCase{{1024, 1024}, 0, DType::f32, -1.0}, ObserveCase{{64, 33, 5}, 1, DType::f32, 0.01},
        ObserveCase{{64, 33, 5}, 2, DType::f64, -1.0}, ObserveCase{{3}, -1, DType::f32, 0.01},
        ObserveCase{{300, 70}, -1, DType::bf16, 0.01}, ObserveCase{{70, 300}, 0, DType::f16, 0.01},
        // rows per block: 128 (inner 7), 16 (inner 1000); too much for one block: two launches
        ObserveCase{{300, 7}, 0, DType::f32, 0.01}, ObserveCase{{300, 1000}, 0, DType::f32, -1.0},
        ObserveCase{{4, 70000}, 0, DType::f32, 0.01},
        // fewer channels than SMs: the fewest rows per block, warps sharing a row
        // (a linear head's weight; 3 rows of 96: 2 warps a row, 2 warps idle)
        ObserveCase{{10, 3136}, 0, DType::f32, 0.01}, ObserveCase{{64, 288}, 0, DType::f32, -1.0},
        ObserveCase{{3, 96}, 0, DType::bf16, 0.01},
        // short rows (3x3 conv weights, a thread per row): [32, 1, 3, 3], [100, 1, 5, 5]
        ObserveCase{{32, 1, 3, 3}, 0, DType::f32, 0.01}, ObserveCase{{100, 1, 5, 5}, 0, DType::f16, -1.0}}) {
    CAPTURE(shape_str(k.shape));
    CAPTURE(k.axis);
    CAPTURE(dtype_name(k.dtype));
    Tensor x0 = randn(k.shape, gen, TensorOptions{}.with_dtype(k.dtype), 0.2, 1.5);
    const ObserverOptions o = observe_options(k, x0);
    Observer on_cpu(o), on_gpu(o);
    on_gpu.to(Device::cuda(0));
    const std::int64_t c = on_cpu.channels();
    const auto gpu = TensorOptions{}.with_device(Device::cuda(0));
    for (int call = 0; call < 3; ++call) {
      Tensor x = mul(x0, 1.0 + 0.5 * call);
      Tensor g = randn(k.shape, gen, TensorOptions{}.with_dtype(k.dtype));
      const ObserveResult a =
          run_fused(on_cpu, x, g, Tensor::empty({c}), Tensor::empty({c}, TensorOptions{}.with_dtype(DType::s32)));
      const ObserveResult b = run_fused(on_gpu, x.cuda(), g.cuda(), Tensor::empty({c}, gpu),
                                        Tensor::empty({c}, TensorOptions{}.with_device(Device::cuda(0)).with_dtype(DType::s32)));
      check_same(a, b);
    }
  }
}
