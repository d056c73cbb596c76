// fp8_linear (ops/fp8_linear.h): seeded inputs against a host reference
// written here from the documented formula, the activation bytes and scale
// bit for bit across devices and against the public FP8 ops, edge values,
// bad arguments and the compute-capability check.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "helpers.h"
#include "qgrad/kernels/fp8_linear.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

constexpr const char* kOp = "fp8_linear";

Tensor f32v(const std::vector<float>& v, Device d = Device::cpu()) {
  return Tensor::from_vector(v, Shape{static_cast<std::int64_t>(v.size())}, d);
}

// A CUDA device with FP8 tensor cores, or a skip message.
bool fp8_gpu() {
  if (!has_gpu()) {
    std::printf("SKIPPED: no CUDA device present; the CUDA part of this test needs a GPU\n");
    return false;
  }
  if (cuda_compute_capability(0) < 89) {
    std::printf("SKIPPED: cuda:0 has no FP8 tensor cores (compute capability < 8.9)\n");
    return false;
  }
  return true;
}

struct Ref {
  std::vector<double> y;     // the output before rounding to out_dtype (f32 values)
  std::vector<double> size;  // per element: sx * sw * sum |qx * qw| + |bias| (the accumulation's scale)
  float sx = 0;
  std::vector<std::uint8_t> qx;  // [M, K]
};

// The documented formula, independently of the kernels: sx from max |x|
// (or given), qx = e4m3(clamp(x / sx, +-448)), f64 sum of the products,
// y = float(acc) * (sx * sw) + float(bf16(bias)) in f32.
Ref reference(const Tensor& x, const Tensor& w, float sw, const Tensor& bias, const Tensor& x_scale) {
  const std::int64_t K = x.size(-1), N = w.size(0), M = x.numel() / K;
  const std::vector<double> xs = values(x);
  Ref r;
  if (x_scale.defined()) {
    r.sx = x_scale.cpu().data<float>()[0];
  } else {
    float amax = 0;
    bool nan = false;
    for (double v : xs) {
      nan = nan || std::isnan(v);
      amax = std::max(amax, std::fabs(static_cast<float>(v)));
    }
    r.sx = nan ? NAN : std::max(amax, 1e-12f) / 448.0f;
  }
  r.qx.resize(static_cast<std::size_t>(M * K));
  for (std::size_t i = 0; i < r.qx.size(); ++i) {
    const float v = static_cast<float>(xs[i]) / r.sx;
    r.qx[i] = float8_e4m3(std::isnan(v) ? v : std::clamp(v, -448.0f, 448.0f)).bits;
  }
  const Tensor wh = w.cpu();
  const auto* wb = static_cast<const std::uint8_t*>(wh.data_ptr());
  std::vector<double> b;
  if (bias.defined()) b = values(bias.to(DType::bf16));
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(f8e4m3_bits_to_float(r.qx[static_cast<std::size_t>(m * K + k)])) *
                         static_cast<double>(f8e4m3_bits_to_float(wb[n * K + k]));
        acc += p;
        mag += std::fabs(p);
      }
      float y = static_cast<float>(acc) * (r.sx * sw);
      if (bias.defined()) y += static_cast<float>(b[static_cast<std::size_t>(n)]);
      r.y.push_back(y);
      r.size.push_back(static_cast<double>(r.sx) * sw * mag + (bias.defined() ? std::fabs(b[static_cast<std::size_t>(n)]) : 0.0));
    }
  return r;
}

// The reference rounded to out_dtype (what the CPU must give exactly).
std::vector<double> rounded(const std::vector<double>& y, DType out) {
  std::vector<double> r;
  for (double v : y) r.push_back(out == DType::bf16 ? static_cast<double>(static_cast<float>(bfloat16(static_cast<float>(v)))) : v);
  return r;
}

Tensor weight(std::int64_t N, std::int64_t K, Generator& g, Device d = Device::cpu()) {
  return randn({N, K}, g, TensorOptions{}.with_device(d), 0.0, 64.0).to(DType::f8e4m3);
}

// CUDA against the reference: cuBLASLt's sum is within 2^-10 of the sum of
// |terms| (f32 with periodic promotion), then one rounding to out_dtype.
void check_cuda_close(const Tensor& y, const Ref& r, DType out) {
  const std::vector<double> got = values(y);
  REQUIRE(got.size() == r.y.size());
  const double ulp = out == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -23);
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(r.y[i])) {
      CHECK(std::isnan(got[i]));
      continue;
    }
    const double tol = std::ldexp(1.0, -10) * r.size[i] + ulp * std::fabs(r.y[i]) + 1e-30;
    if (std::fabs(got[i] - r.y[i]) > tol) {
      INFO("element ", i, ": cuda ", got[i], ", reference ", r.y[i], ", tolerance ", tol);
      CHECK(false);
      return;
    }
  }
}

}  // namespace

TEST_CASE("fp8_linear: CPU equals the host reference exactly (M = 0/1/odd, bias, scales, dtypes)") {
  Generator g(7);
  for (const DType xdt : {DType::f32, DType::bf16, DType::f16})
    for (const DType out : {DType::bf16, DType::f32})
      for (const Shape& xshape : {Shape{0, 40}, Shape{1, 40}, Shape{7, 40}, Shape{3, 5, 40}, Shape{2, 33}})
        for (int variant = 0; variant < 4; ++variant) {
          const std::int64_t K = xshape.back(), N = 24;
          const Tensor x = randn(xshape, g, TensorOptions{}.with_dtype(xdt));
          const Tensor w = weight(N, K, g);
          const float sw = 0.002f;
          const Tensor bias = variant == 1 ? randn({N}, g) : variant == 2 ? randn({N}, g).to(DType::bf16) : Tensor();
          const Tensor xs = variant == 3 ? f32v({0.004f}) : Tensor();
          INFO("x ", dtype_name(xdt), " ", shape_str(xshape), ", out ", dtype_name(out), ", variant ", variant);
          const Tensor y = fp8_linear(x, w, f32v({sw}), bias, out, xs);
          Shape want = xshape;
          want.back() = N;
          REQUIRE(y.shape() == want);
          REQUIRE(y.dtype() == out);
          const Ref r = reference(x, w, sw, bias, xs);
          const std::vector<double> got = values(y), exp = rounded(r.y, out);
          REQUIRE(got.size() == exp.size());
          for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == exp[i]);
        }
}

// x [9, K] in dtype with edge values: +-0, a tie of the e4m3 grid after
// scaling, a negative value.
Tensor quant_input(DType dt, std::int64_t K, Generator& g) {
  Tensor h = randn({9, K}, g);
  if (K >= 4) {
    float* p = h.data<float>();
    p[0] = 0.0f;
    p[1] = -0.0f;
    p[2] = 3.0f;
    p[3] = -2.5f;
  }
  return h.to(dt);
}

TEST_CASE("fp8_linear: x's bytes and scale equal quantize_fp8(x, fp8_scale(x)) bit for bit (CPU)") {
  Generator g(11);
  for (const DType xdt : {DType::f32, DType::bf16, DType::f16})
    for (const std::int64_t K : {64, 40, 1}) {
      INFO(dtype_name(xdt), " K = ", K);
      const Tensor x = quant_input(xdt, K, g);
      const Tensor scale = Tensor::empty({1});
      const Tensor q = Tensor::empty({9, K}, TensorOptions{}.with_dtype(DType::f8e4m3));
      kernels::fp8_quantize_rows(x, K, scale, true, q, K);
      const Tensor s_pub = fp8_scale(x, QuantScope::per_tensor(), DType::f8e4m3);
      CHECK(bit_equal(scale.reshape(s_pub.shape()), s_pub));
      CHECK(bit_equal(q, quantize_fp8(x, s_pub, QuantScope::per_tensor(), DType::f8e4m3)));
      const Tensor given = f32v({0.002f});
      const Tensor qg = Tensor::empty({9, K}, TensorOptions{}.with_dtype(DType::f8e4m3));
      kernels::fp8_quantize_rows(x, K, given, false, qg, K);
      CHECK(bit_equal(qg, quantize_fp8(x, given.reshape({}), QuantScope::per_tensor(), DType::f8e4m3)));
    }
}

TEST_CASE("fp8_linear: x's bytes and scale are bit-identical on CUDA and the CPU (pad columns zero)") {
  if (!fp8_gpu()) return;
  Generator g(12);
  const Device c = Device::cuda(0);
  for (const DType xdt : {DType::f32, DType::bf16, DType::f16})
    for (const std::int64_t K : {64, 40, 1, 4096})
      for (const bool dynamic : {true, false}) {
        INFO(dtype_name(xdt), " K = ", K, dynamic ? " dynamic" : " given");
        const Tensor x = quant_input(xdt, K, g);
        const Tensor scale = dynamic ? Tensor::empty({1}) : f32v({0.002f});
        const Tensor q = Tensor::empty({9, K}, TensorOptions{}.with_dtype(DType::f8e4m3));
        kernels::fp8_quantize_rows(x, K, scale, dynamic, q, K);
        const std::int64_t ld = kernels::fp8_linear_ld(c, K);
        const Tensor sc = dynamic ? Tensor::empty({1}, TensorOptions{}.with_device(c)) : scale.cuda();
        const Tensor qc = Tensor::empty({9, ld}, TensorOptions{}.with_device(c).with_dtype(DType::f8e4m3));
        kernels::fp8_quantize_rows(x.cuda(), K, sc, dynamic, qc, ld);
        CHECK(bit_equal(sc, scale));
        const Tensor hq = qc.cpu();
        const auto* a = static_cast<const std::uint8_t*>(hq.data_ptr());
        const auto* b = static_cast<const std::uint8_t*>(q.data_ptr());
        for (std::int64_t m = 0; m < 9; ++m) {
          CHECK(std::memcmp(a + m * ld, b + m * K, static_cast<std::size_t>(K)) == 0);
          for (std::int64_t k = K; k < ld; ++k) CHECK(a[m * ld + k] == 0);
        }
      }
}

TEST_CASE("fp8_linear: CUDA against the host reference (cuBLASLt), shapes padded and not") {
  if (!fp8_gpu()) return;
  Generator g(13);
  const Device c = Device::cuda(0);
  struct Case {
    std::int64_t M, N, K;
  };
  for (const Case& cs : {Case{0, 32, 64}, Case{1, 32, 64}, Case{7, 24, 40}, Case{64, 48, 128}, Case{33, 17, 100},
                         Case{128, 256, 512}})
    for (const DType xdt : {DType::bf16, DType::f32, DType::f16})
      for (const DType out : {DType::bf16, DType::f32})
        for (int variant = 0; variant < 4; ++variant) {
          INFO("M ", cs.M, " N ", cs.N, " K ", cs.K, " x ", dtype_name(xdt), " out ", dtype_name(out), " variant ",
               variant);
          const Tensor x = randn({cs.M, cs.K}, g, TensorOptions{}.with_dtype(xdt));
          const Tensor w = weight(cs.N, cs.K, g);
          const float sw = 0.002f;
          const Tensor bias = variant == 1 ? randn({cs.N}, g) : variant == 2 ? randn({cs.N}, g).to(DType::bf16) : Tensor();
          const Tensor xs = variant == 3 ? f32v({0.004f}) : Tensor();
          const Tensor y = fp8_linear(x.cuda(), w.cuda(), f32v({sw}, c), bias.defined() ? bias.cuda() : bias, out,
                                      variant == 3 ? xs.cuda() : xs);
          REQUIRE(y.shape() == Shape{cs.M, cs.N});
          check_cuda_close(y, reference(x, w, sw, bias, xs), out);
          // Host scales are read on the host and copied: the same result.
          if (variant == 3) CHECK(bit_equal(y, fp8_linear(x.cuda(), w.cuda(), f32v({sw}), Tensor(), out, xs)));
        }
}

TEST_CASE("fp8_linear: edge values (NaN, +-0, all-zero x, saturation)") {
  for (const Device d : test_devices()) {
    if (d.is_cuda() && cuda_compute_capability(0) < 89) continue;  // refused: see the capability test
    INFO(d.str());
    Generator g(17);
    const Tensor w = weight(16, 32, g, d);
    const Tensor bias = randn({16}, g, TensorOptions{}.with_device(d));
    const std::vector<double> b = values(bias.to(DType::bf16));
    // All-zero x (-0 included): the dynamic scale is 1e-12 / 448, q = 0, y = bf16(bias) exactly.
    std::vector<float> zero(3 * 32, 0.0f);
    for (std::size_t i = 0; i < zero.size(); i += 2) zero[i] = -0.0f;
    const Tensor xz = Tensor::from_vector(zero, {3, 32}, d);
    const std::vector<double> yz = values(fp8_linear(xz, w, f32v({0.01f}, d), bias, DType::f32));
    for (std::size_t i = 0; i < yz.size(); ++i) CHECK(yz[i] == b[i % 16]);
    // A NaN: with the dynamic scale it reaches every output (sx is NaN);
    // with a given scale only its row.
    Tensor h = randn({3, 32}, g);
    h.data<float>()[32 + 5] = NAN;
    const Tensor xn = h.to(d);
    for (const double v : values(fp8_linear(xn, w, f32v({0.01f}, d), Tensor(), DType::f32))) CHECK(std::isnan(v));
    const std::vector<double> yg = values(fp8_linear(xn, w, f32v({0.01f}, d), Tensor(), DType::f32, f32v({0.01f}, d)));
    for (std::size_t i = 0; i < yg.size(); ++i) CHECK(std::isnan(yg[i]) == (i / 16 == 1));
    // Saturation: a given scale far too small clamps every |x / sx| to 448.
    const Tensor xs = full({1, 32}, 1.0, TensorOptions{}.with_device(d));
    const Tensor w1 = full({16, 32}, 1.0, TensorOptions{}.with_device(d)).to(DType::f8e4m3);
    const std::vector<double> ys = values(fp8_linear(xs, w1, f32v({1.0f}, d), Tensor(), DType::f32, f32v({1e-6f}, d)));
    for (const double v : ys) CHECK(v == static_cast<double>(static_cast<float>(448.0 * 32) * (1e-6f * 1.0f)));
  }
}

TEST_CASE("fp8_linear: bad arguments name the op and the argument") {
  Generator g(19);
  const Tensor x = randn({4, 32}, g), w = weight(8, 32, g), ws = f32v({0.01f});
  auto expect = [](const char* arg, auto&& fn) {
    INFO("argument ", arg);
    try {
      fn();
      CHECK_MESSAGE(false, "no error");
    } catch (const Error& e) {
      CHECK(e.op() == kOp);
      CHECK(e.arg() == arg);
    }
  };
  expect("x", [&] { fp8_linear(x.to(DType::f64), w, ws); });
  expect("x", [&] { fp8_linear(x.to(DType::s32), w, ws); });
  expect("w_q", [&] { fp8_linear(x, x.to(DType::s8), ws); });
  expect("w_q", [&] { fp8_linear(x, x.to(DType::f8e5m2), ws); });
  expect("w_q", [&] { fp8_linear(x, weight(8, 16, g), ws); });
  expect("w_scale", [&] { fp8_linear(x, w, f32v({0.01f, 0.01f})); });
  expect("w_scale", [&] { fp8_linear(x, w, f32v({0.0f})); });
  expect("w_scale", [&] { fp8_linear(x, w, f32v({INFINITY})); });
  expect("bias", [&] { fp8_linear(x, w, ws, randn({8}, g).to(DType::f16)); });
  expect("bias", [&] { fp8_linear(x, w, ws, randn({7}, g)); });
  expect("out_dtype", [&] { fp8_linear(x, w, ws, Tensor(), DType::f16); });
  expect("x_scale", [&] { fp8_linear(x, w, ws, Tensor(), DType::bf16, f32v({0.0f})); });
  expect("x_scale", [&] { fp8_linear(x, w, ws, Tensor(), DType::bf16, f32v({NAN})); });
  expect("x_scale", [&] { fp8_linear(x, w, ws, Tensor(), DType::bf16, f32v({-INFINITY})); });
  expect("x_scale", [&] { fp8_linear(x, w, ws, Tensor(), DType::bf16, f32v({1.0f}).to(DType::f64)); });
  // K not a multiple of 16 is accepted (CUDA pads it): see the cases above.
  if (has_gpu()) {
    expect("w_q", [&] { fp8_linear(x.cuda(), w, ws); });
    expect("bias", [&] { fp8_linear(x.cuda(), w.cuda(), ws, randn({8}, g)); });
  }
}

TEST_CASE("fp8_linear: a GPU without FP8 tensor cores is refused (the capability check)") {
  const Device c = Device::cuda(0);
  for (const int cc : {61, 70, 75, 80, 86, 87}) {
    INFO("compute capability ", cc);
    try {
      check::fp8_tensor_cores(cc, c, kOp);
      CHECK_MESSAGE(false, "no error");
    } catch (const Error& e) {
      CHECK(e.op() == kOp);
      CHECK(e.arg() == "device");
      CHECK(std::string(e.what()).find("FP8 tensor cores need sm_89+") != std::string::npos);
    }
  }
  for (const int cc : {89, 90, 100, 120}) CHECK_NOTHROW(check::fp8_tensor_cores(cc, c, kOp));
  if (has_gpu() && cuda_compute_capability(0) < 89) {
    Generator g(23);
    CHECK_THROWS_AS(fp8_linear(randn({2, 32}, g).cuda(), weight(8, 32, g).cuda(), f32v({0.01f})), Error);
  }
}
