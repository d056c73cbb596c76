// SmoothQuant: calibration observer, smoothing factors, folding, the static
// W8A8 forward, accuracy against naive W8A8 on outlier activations, bad
// inputs, CPU/CUDA identity.
#include <algorithm>
#include <cmath>

#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

// Activations with a few large outlier channels (the case SmoothQuant targets).
Tensor outlier_batch(std::int64_t rows, std::int64_t K, std::uint64_t seed) {
  Generator g(seed);
  auto v = randn({rows, K}, g).to_vector<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j : {std::int64_t(3), K / 2, K - 2}) v[static_cast<std::size_t>(r * K + j)] *= 60.0f;
  return Tensor::from_vector<float>(v, {rows, K});
}

std::vector<double> float_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const auto xv = values(x), wv = values(w), bv = values(b);
  const std::int64_t K = w.size(1), N = w.size(0), M = x.numel() / K;
  std::vector<double> y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = bv[static_cast<std::size_t>(n)];
      for (std::int64_t k = 0; k < K; ++k)
        acc += xv[static_cast<std::size_t>(m * K + k)] * wv[static_cast<std::size_t>(n * K + k)];
      y[static_cast<std::size_t>(m * N + n)] = acc;
    }
  return y;
}

struct Fixture {
  std::int64_t N = 32, K = 64;
  Tensor w, b;
  SmoothQuantCalibrator calib{64};
  Fixture() {
    Generator g(100);
    w = randn({N, K}, g, {}, 0.0, 0.1);
    b = randn({N}, g, {}, 0.0, 0.1);
    for (std::uint64_t s = 0; s < 3; ++s) calib.observe(outlier_batch(16, K, 200 + s));
  }
};

}  // namespace

TEST_CASE("calibrator keeps the running max |x_j| over batches, ignoring non-finite values") {
  SmoothQuantCalibrator c(3);
  c.observe(Tensor::from_vector<float>({1, -5, 2, -3, 4, NAN}, {2, 3}));
  c.observe(Tensor::from_vector<double>({-2, 1, INFINITY}, {1, 3}));
  CHECK(c.batches() == 2);
  CHECK(c.act_absmax().to_vector<float>() == std::vector<float>{3, 5, 2});
  c.observe(Tensor::from_vector<float>({0.5f, 0.5f, 7.0f, 0, 0, 0}, {1, 2, 3}));
  CHECK(c.act_absmax().to_vector<float>() == std::vector<float>{3, 5, 7});
}

TEST_CASE("smoothing factors: s_j = amax_j^alpha / wmax_j^(1 - alpha)") {
  Tensor amax = Tensor::from_vector<float>({4, 9, 0}, {3});
  Tensor w = Tensor::from_vector<float>({1, -2, 0, 0.5f, 1, 0}, {2, 3});
  for (double alpha : {0.5, 0.8}) {
    const auto s = smoothquant_factors(amax, w, alpha).to_vector<float>();
    CHECK(s[0] == static_cast<float>(std::pow(4.0, alpha) / std::pow(1.0, 1 - alpha)));
    CHECK(s[1] == static_cast<float>(std::pow(9.0, alpha) / std::pow(2.0, 1 - alpha)));
    CHECK(s[2] == static_cast<float>(std::pow(1e-5, alpha) / std::pow(1e-5, 1 - alpha)));  // floored
  }
}

TEST_CASE("from_float: weight folded and quantized per output channel, static activation scale") {
  Fixture f;
  SmoothQuantLinear q = SmoothQuantLinear::from_float(f.w, f.b, f.calib, 0.5);
  CHECK(q.w_q.dtype() == DType::s8);
  CHECK(q.w_q.shape() == Shape{f.N, f.K});
  CHECK(q.w_scale.shape() == Shape{f.N});
  CHECK(q.divisor.shape() == Shape{f.K});
  CHECK(q.act_scale.numel() == 1);
  const auto s = q.divisor.to_vector<float>();
  const auto amax = f.calib.act_absmax().to_vector<float>();
  double xmax = 0;
  for (std::int64_t j = 0; j < f.K; ++j) xmax = std::max(xmax, double(amax[static_cast<std::size_t>(j)]) / s[static_cast<std::size_t>(j)]);
  CHECK(q.act_scale.item() == static_cast<double>(static_cast<float>(xmax / 127)));
  // Dequantized folded weight ~ W * s.
  const auto wq = values(q.w_q), sw = values(q.w_scale), wv = values(f.w);
  for (std::int64_t n = 0; n < f.N; ++n)
    for (std::int64_t j = 0; j < f.K; ++j) {
      const auto i = static_cast<std::size_t>(n * f.K + j);
      REQUIRE(std::fabs(wq[i] * sw[static_cast<std::size_t>(n)] - wv[i] * s[static_cast<std::size_t>(j)]) <=
              0.5001 * sw[static_cast<std::size_t>(n)]);
    }
}

TEST_CASE("SmoothQuant beats naive W8A8 on outlier activations") {
  Fixture f;
  SmoothQuantLinear sq = SmoothQuantLinear::from_float(f.w, f.b, f.calib, 0.5);
  Tensor x = outlier_batch(16, f.K, 300);
  const auto ref = float_linear(x, f.w, f.b);
  // Naive: weight per channel, activation static per tensor from the same calibration.
  auto wq = dynamic_range_quantize(f.w, QuantScope::per_token(), QuantMode::symmetric, DType::s8, -127, 127);
  const auto amax = f.calib.act_absmax().to_vector<float>();
  const float sa = *std::max_element(amax.begin(), amax.end()) / 127.0f;
  Tensor naive = quantized_linear(x, wq.q, wq.scale, f.b,
                                  ActivationQuant::fixed(Tensor::from_vector<float>({sa}, {1}),
                                                         Tensor::from_vector<std::int32_t>({0}, {1}), -127, 127));
  const double e_naive = rel_fro(values(naive), ref);
  const double e_sq = rel_fro(values(sq.forward(x)), ref);
  CHECK(e_sq < e_naive);
  CHECK(e_sq < 0.05);
}

TEST_CASE("folding the divisor into the previous layer matches the stored divisor") {
  Fixture f;
  SmoothQuantLinear a = SmoothQuantLinear::from_float(f.w, f.b, f.calib);
  SmoothQuantLinear b = a;
  Generator g(7);
  Tensor prev_w = randn({f.K, 16}, g);
  Tensor prev_b = randn({f.K}, g);
  Tensor h_in = randn({8, 16}, g);
  // previous layer output h = h_in W_prev^T + b_prev, computed by hand
  auto prev = [&](const Tensor& w, const Tensor& bias) {
    const auto hv = values(h_in), wv = values(w), bv = values(bias);
    std::vector<float> out(static_cast<std::size_t>(8 * f.K));
    for (int m = 0; m < 8; ++m)
      for (std::int64_t j = 0; j < f.K; ++j) {
        double acc = bv[static_cast<std::size_t>(j)];
        for (int k = 0; k < 16; ++k) acc += hv[static_cast<std::size_t>(m * 16 + k)] * wv[static_cast<std::size_t>(j * 16 + k)];
        out[static_cast<std::size_t>(m * f.K + j)] = static_cast<float>(acc);
      }
    return Tensor::from_vector<float>(out, {8, f.K});
  };
  const auto ya = values(a.forward(prev(prev_w, prev_b)));
  Tensor w2 = prev_w.clone().detach(), b2 = prev_b.clone().detach();
  b.fold_divisor_into(w2, b2);
  CHECK_FALSE(b.divisor.defined());
  const auto yb = values(b.forward(prev(w2, b2)));
  CHECK(rel_fro(yb, ya) < 0.02);
  CHECK_THROWS_AS(b.fold_divisor_into(w2, b2), Error);  // already folded
}

TEST_CASE("bad arguments: alpha, shapes, empty calibration") {
  Fixture f;
  CHECK_THROWS_AS(SmoothQuantCalibrator(0), Error);
  CHECK_THROWS_AS(f.calib.observe(zeros({2, 5})), Error);
  CHECK_THROWS_AS(f.calib.observe(zeros({2, 64}, TensorOptions{}.with_dtype(DType::s32))), Error);
  for (double alpha : {0.0, 1.0, -0.5, 1.5, double(NAN)}) {
    CHECK_THROWS_AS(SmoothQuantLinear::from_float(f.w, f.b, f.calib, alpha), Error);
    CHECK_THROWS_AS(smoothquant_factors(f.calib.act_absmax(), f.w, alpha), Error);
  }
  CHECK_THROWS_AS(smoothquant_factors(ones({5}), f.w), Error);
  CHECK_THROWS_AS(smoothquant_factors(f.calib.act_absmax(), ones({64})), Error);
  CHECK_THROWS_AS(SmoothQuantLinear::from_float(ones({32, 63}), f.b, f.calib), Error);
  CHECK_THROWS_AS(SmoothQuantLinear::from_float(f.w, ones({31}), f.calib), Error);
  SmoothQuantCalibrator empty(64);
  CHECK_THROWS_AS(SmoothQuantLinear::from_float(f.w, f.b, empty), Error);
  SmoothQuantLinear q = SmoothQuantLinear::from_float(f.w, f.b, f.calib);
  CHECK_THROWS_AS(q.forward(zeros({2, 63})), Error);
  Tensor pw = ones({63, 4}), pb = ones({64});
  CHECK_THROWS_AS(q.fold_divisor_into(pw, pb), Error);
}

TEST_CASE("alpha near the ends of (0, 1) is accepted and moves the balance") {
  Fixture f;
  const auto s_lo = smoothquant_factors(f.calib.act_absmax(), f.w, 0.01).to_vector<float>();
  const auto s_hi = smoothquant_factors(f.calib.act_absmax(), f.w, 0.99).to_vector<float>();
  // The outlier channel 3 gets a larger divisor with a larger alpha.
  CHECK(s_hi[3] > s_lo[3]);
  SmoothQuantLinear q = SmoothQuantLinear::from_float(f.w, f.b, f.calib, 0.99);
  CHECK(q.forward(outlier_batch(4, f.K, 5)).shape() == Shape{4, f.N});
}

TEST_CASE("forward output dtypes and batched input") {
  Fixture f;
  SmoothQuantLinear q = SmoothQuantLinear::from_float(f.w, f.b, f.calib);
  Tensor x = outlier_batch(6, f.K, 9).reshape({2, 3, f.K});
  for (DType out : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Tensor y = q.forward(x, out);
    CHECK(y.dtype() == out);
    CHECK(y.shape() == Shape{2, 3, f.N});
  }
}

TEST_CASE("CUDA calibration and forward match the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  Fixture f;
  SmoothQuantCalibrator cg(f.K, Device::cuda());
  for (std::uint64_t s = 0; s < 3; ++s) cg.observe(outlier_batch(16, f.K, 200 + s).cuda());
  CHECK(bit_equal(cg.act_absmax(), f.calib.act_absmax()));
  SmoothQuantLinear c = SmoothQuantLinear::from_float(f.w, f.b, f.calib);
  SmoothQuantLinear g = SmoothQuantLinear::from_float(f.w.cuda(), f.b.cuda(), cg);
  Tensor x = outlier_batch(16, f.K, 300);
  CHECK(bit_equal(c.forward(x), g.forward(x.cuda())));
}
