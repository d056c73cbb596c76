// The transformer ops (gelu, silu, softmax, layer_norm, rms_norm, embedding,
// dropout) against host references in double: special values, rows with large
// offsets, repeated indices and padding, the dropout mask's determinism and
// statistics, and CPU against CUDA where a GPU is present.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>

#include "qgrad/core/random.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/deferred.h"
#include "qgrad/kernels/quantize.h"
#include "train_ops_helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor from(const std::vector<double>& v, DType dt = DType::f64, Device d = Device::cpu()) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(dt).to(d);
}

// PyTorch's gelu formulas in double (ActivationGeluKernel.cu).
double gelu_ref(double x, bool tanh) {
  if (!tanh) return x * 0.5 * (1.0 + std::erf(x * M_SQRT1_2));
  const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
  return 0.5 * x * (1.0 + std::tanh(beta * (x + kappa * x * x * x)));
}
double gelu_grad_ref(double x, bool tanh) {
  if (!tanh) return 0.5 * (1.0 + std::erf(x * M_SQRT1_2)) + x * std::exp(-0.5 * x * x) * M_2_SQRTPI * M_SQRT1_2 * 0.5;
  const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
  const double t = std::tanh(beta * (x + kappa * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * beta * (1.0 + 3.0 * kappa * x * x);
}

// NaN equals NaN; otherwise |got - want| <= tol * max(1, |want|), infinities exact.
void check_values(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element ", i, ": got ", got[i], ", want ", want[i]);
    if (std::isnan(want[i])) {
      CHECK(std::isnan(got[i]));
    } else if (std::isinf(want[i])) {
      CHECK(got[i] == want[i]);
    } else {
      CHECK(std::fabs(got[i] - want[i]) <= tol * std::max(1.0, std::fabs(want[i])));
    }
  }
}

// A fresh leaf holding t's values in dt on dev (never t itself: to() of the
// same dtype or device returns t, and its grad would accumulate across runs).
Tensor fresh(const Tensor& t, DType dt, Device dev) { return param(t.detach().to(dt).to(dev).clone().detach()); }

Tensor grad_of(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const Tensor& dy) {
  Tensor xl = param(x.detach());
  f(xl).backward(dy);
  return xl.grad();
}

}  // namespace

// ---------------------------------------------------------------- gelu, silu

TEST_CASE("gelu (erf and tanh forms): PyTorch's formulas at special values, forward and backward, f64 and f32") {
  const std::vector<double> xs = {0.0, -0.0, 1.0, -1.0, 0.5, -3.0, 3.0, 10.0, -10.0, 30.0, -30.0, 1e-30, -1e-8,
                                  kInf, -kInf, kNaN};
  for (const bool tanh : {false, true}) {
    const GeluApproximate a = tanh ? GeluApproximate::tanh : GeluApproximate::none;
    std::vector<double> want, dwant;
    for (double x : xs) {
      want.push_back(gelu_ref(x, tanh));
      dwant.push_back(std::isfinite(x) ? gelu_grad_ref(x, tanh) : kNaN);
    }
    // +inf: gelu = inf; -inf: -inf * 0 = NaN (the formula's value, as PyTorch).
    CHECK(std::isinf(want[13]));
    CHECK(std::isnan(want[14]));
    for (const DType dt : {DType::f64, DType::f32}) {
      INFO("tanh ", tanh, " dtype ", dtype_name(dt));
      const double tol = dt == DType::f64 ? 1e-15 : 1e-6;
      const Tensor x = from(xs, dt);
      check_values(values(gelu(x, a)), want, tol);
      // signed zero: -0 * 0.5 * (1 + erf(-0)) = -0
      CHECK(std::signbit(values(gelu(x, a))[1]));
      std::vector<double> got = values(grad_of([a](const Tensor& t) { return gelu(t, a); }, x, ones_like(x)));
      for (std::size_t i = 0; i < xs.size(); ++i)
        if (!std::isfinite(xs[i])) got[i] = kNaN;  // d/dx at +-inf is not compared
      check_values(got, dwant, tol);
      CHECK(values(grad_of([a](const Tensor& t) { return gelu(t, a); }, x, ones_like(x)))[0] == 0.5);
    }
  }
  // The two forms differ, by at most ~5e-4 on this range.
  const Tensor x = rnd({1000}, 3, DType::f64, 3.0);
  const double d = max_abs_diff(gelu(x), gelu(x, GeluApproximate::tanh));
  CHECK(d > 1e-5);
  CHECK(d < 1e-3);
}

// CUDA's elementwise maps (kernels/loop.h map_elements, map_elements_masked)
// take four elements an index through vector accesses where every pointer
// is 16-byte aligned, and one an index otherwise: the same formula, so the
// same bits. A view that starts one element in (unaligned: the scalar path)
// and its aligned copy (the vector path; 4095 elements, so a ragged tail)
// must give the same values, gradients and masks (the masked maps' backward
// reads them), f32 and bf16.
TEST_CASE("elementwise maps on CUDA: four elements an index and one give the same bits (gelu, silu, sqrt, relu, "
          "dropout)") {
  QGRAD_REQUIRE_GPU();
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"gelu", [](const Tensor& t) { return gelu(t); }},
      {"gelu tanh", [](const Tensor& t) { return gelu(t, GeluApproximate::tanh); }},
      {"silu", [](const Tensor& t) { return silu(t); }},
      {"sqrt", [](const Tensor& t) { return qgrad::sqrt(add(mul(t, t), 0.5)); }},
      {"relu", [](const Tensor& t) { return relu(t); }},
      {"dropout", [](const Tensor& t) {
         Generator g(9);
         return dropout(t, 0.3, true, g);
       }},
  };
  for (const DType dt : {DType::f32, DType::bf16})
    for (const auto& op : ops) {
      const char* name = op.first;  // (not a structured binding: CAPTURE's lambda cannot capture one in clang 14)
      const auto& f = op.second;
      CAPTURE(dtype_name(dt));
      CAPTURE(name);
      const Tensor x = rnd({4096}, 13, dt, 3.0).cuda(), dy = rnd({4096}, 14, dt).cuda();
      const Tensor xs = narrow(x, 0, 1, 4095), dys = narrow(dy, 0, 1, 4095);
      const Tensor xa = xs.clone(), dya = dys.clone();
      prepoison({4095}, dt);
      const Tensor y_vec = f(xa).cpu(), g_vec = grad_of(f, xa, dya).cpu();
      prepoison({4095}, dt);
      CHECK(bit_equal(y_vec, f(xs).cpu()));
      CHECK(bit_equal(g_vec, grad_of(f, xs, dys).cpu()));
    }
}

TEST_CASE("gelu and silu: gradcheck, and CUDA within an ulp or two of the CPU") {
  const Tensor x = rnd({4, 7}, 11, DType::f64, 2.0);
  check_grad([](const std::vector<Tensor>& v) { return gelu(v[0]); }, {param(x.clone().detach())});
  check_grad([](const std::vector<Tensor>& v) { return gelu(v[0], GeluApproximate::tanh); }, {param(x.clone().detach())});
  check_grad([](const std::vector<Tensor>& v) { return silu(v[0]); }, {param(x.clone().detach())});
  if (!has_gpu()) return;
  for (const DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor xc = rnd({4096}, 12, dt, 3.0);
    const double tol = dt == DType::f64 ? 1e-14 : dt == DType::f32 ? 1e-6 : 1e-2;
    CHECK(max_abs_diff(gelu(xc.cuda()).cpu(), gelu(xc)) <= tol * 10);
    CHECK(max_abs_diff(silu(xc.cuda()).cpu(), silu(xc)) <= tol * 10);
  }
}

TEST_CASE("silu: x / (1 + exp(-x)) and PyTorch's backward at special values") {
  const std::vector<double> xs = {0.0, -0.0, 1.0, -1.0, 20.0, -20.0, 100.0, -100.0, kInf, -kInf, kNaN};
  std::vector<double> want, dwant;
  for (double x : xs) {
    want.push_back(x / (1.0 + std::exp(-x)));
    const double s = 1.0 / (1.0 + std::exp(-x));
    dwant.push_back(std::isfinite(x) ? s * (1.0 + x * (1.0 - s)) : kNaN);
  }
  CHECK(std::isnan(want[9]));  // -inf / inf, as PyTorch's formula
  for (const DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-15 : 1e-6;
    const Tensor x = from(xs, dt);
    check_values(values(silu(x)), want, tol);
    CHECK(std::signbit(values(silu(x))[1]));
    std::vector<double> got = values(grad_of([](const Tensor& t) { return silu(t); }, x, ones_like(x)));
    for (std::size_t i = 0; i < xs.size(); ++i)
      if (!std::isfinite(xs[i])) got[i] = kNaN;
    check_values(got, dwant, tol);
  }
}

// ---------------------------------------------------------------- softmax

TEST_CASE("softmax along an axis: host reference, rows sum to 1, large values, -inf and NaN rows, gradcheck") {
  const Tensor x = rnd({3, 5, 4}, 21, DType::f64, 3.0);
  const std::vector<double> xv = values(x);
  for (const std::int64_t axis : {0, 1, 2, -1}) {
    const std::int64_t ax = axis < 0 ? axis + 3 : axis;
    const Shape s = x.shape();
    std::vector<double> want(xv.size());
    const std::int64_t inner = ax == 0 ? 20 : ax == 1 ? 4 : 1, n = s[static_cast<std::size_t>(ax)];
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const auto ii = static_cast<std::int64_t>(i);
      const std::int64_t base = (ii / (inner * n)) * inner * n + ii % inner;
      double mx = -kInf, sum = 0;
      for (std::int64_t r = 0; r < n; ++r) mx = std::max(mx, xv[static_cast<std::size_t>(base + r * inner)]);
      for (std::int64_t r = 0; r < n; ++r) sum += std::exp(xv[static_cast<std::size_t>(base + r * inner)] - mx);
      want[i] = std::exp(xv[i] - mx) / sum;
    }
    check_values(values(softmax(x, axis)), want, 1e-14);
    check_grad([axis](const std::vector<Tensor>& v) { return softmax(v[0], axis); }, {param(x.clone().detach())});
  }
  const std::vector<double> sums = values(sum(softmax(rnd({6, 33}, 22, DType::f32), -1), 1));
  for (double s : sums) CHECK(s == doctest::Approx(1.0).epsilon(1e-6));
  // Large values do not overflow; -inf entries get 0; a NaN makes its row NaN.
  const Tensor big = Tensor::from_vector<double>({1000, 1001, -kInf, 0, kNaN, 1}, {2, 3});
  const std::vector<double> y = values(softmax(big, 1));
  CHECK(y[0] == doctest::Approx(1.0 / (1.0 + std::exp(1.0))));
  CHECK(y[2] == 0.0);
  CHECK(std::isnan(y[3]));
  CHECK(std::isnan(y[4]));
  CHECK(std::isnan(y[5]));
}

// ---------------------------------------------------------------- layer_norm, rms_norm

namespace {

struct NormRef {
  std::vector<double> y, dx, dw, db;
};
// The normalisations in double over rows of d: layer_norm (centered) or rms_norm.
NormRef norm_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                 const std::vector<double>& dy, std::int64_t d, double eps, bool centered) {
  const std::size_t D = static_cast<std::size_t>(d), rows = x.size() / D;
  NormRef r{std::vector<double>(x.size()), std::vector<double>(x.size()), std::vector<double>(D, 0.0),
            std::vector<double>(D, 0.0)};
  for (std::size_t row = 0; row < rows; ++row) {
    const double* xr = &x[row * D];
    double mean = 0, var = 0;
    if (centered) {
      for (std::size_t j = 0; j < D; ++j) mean += xr[j];
      mean /= static_cast<double>(D);
    }
    for (std::size_t j = 0; j < D; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= static_cast<double>(D);
    const double rstd = 1.0 / std::sqrt(var + eps);
    double mg = 0, mgx = 0;
    for (std::size_t j = 0; j < D; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      const double g = dy[row * D + j] * (w.empty() ? 1.0 : w[j]);
      r.y[row * D + j] = xhat * (w.empty() ? 1.0 : w[j]) + (b.empty() ? 0.0 : b[j]);
      mg += g;
      mgx += g * xhat;
      r.dw[j] += dy[row * D + j] * xhat;
      r.db[j] += dy[row * D + j];
    }
    mg = centered ? mg / static_cast<double>(D) : 0.0;
    mgx /= static_cast<double>(D);
    for (std::size_t j = 0; j < D; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      const double g = dy[row * D + j] * (w.empty() ? 1.0 : w[j]);
      r.dx[row * D + j] = rstd * (g - mg - xhat * mgx);
    }
  }
  return r;
}

}  // namespace

TEST_CASE("layer_norm: host reference for y, dx, dweight, dbias (f64), over one and two normalized dims") {
  for (const bool two_dims : {false, true}) {
    const Shape ns = two_dims ? Shape{3, 8} : Shape{8};
    // 70 rows: two chunks of the column sums (64 rows each, the second partial).
    const Tensor x = rnd({70, 3, 8}, 31, DType::f64, 2.0), dy = rnd({70, 3, 8}, 32);
    const Tensor w = rnd(ns, 33), b = rnd(ns, 34);
    const std::int64_t d = two_dims ? 24 : 8;
    const NormRef ref = norm_ref(values(x), values(w), values(b), values(dy), d, 1e-5, true);
    Tensor xl = param(x.clone().detach()), wl = param(w.clone().detach()), bl = param(b.clone().detach());
    Tensor y = layer_norm(xl, ns, wl, bl, 1e-5);
    check_values(values(y), ref.y, 1e-13);
    y.backward(dy);
    check_values(values(xl.grad()), ref.dx, 1e-12);
    check_values(values(wl.grad()), ref.dw, 1e-12);
    check_values(values(bl.grad()), ref.db, 1e-12);
    CHECK(wl.grad().shape() == ns);
    CHECK(bl.grad().shape() == ns);
  }
  // Without weight and bias; and with only one of them.
  const Tensor x = rnd({5, 6}, 35), w = rnd({6}, 36);
  check_grad([](const std::vector<Tensor>& v) { return layer_norm(v[0], {6}); }, {param(x.clone().detach())});
  check_grad([](const std::vector<Tensor>& v) { return layer_norm(v[0], {6}, v[1]); },
             {param(x.clone().detach()), param(w.clone().detach())});
  check_grad([](const std::vector<Tensor>& v) { return layer_norm(v[0], {6}, Tensor(), v[1], 0.1); },
             {param(x.clone().detach()), param(w.clone().detach())});
}

TEST_CASE("layer_norm: rows with a large offset stay exact (two-pass variance), in f32 and f64") {
  // f32 rows at 1e4 + N(0, 1): a one-pass E[x^2] - E[x]^2 in float would lose
  // every digit (x^2 ~ 1e8, float's ulp there is 8).
  for (const DType dt : {DType::f32, DType::f64}) {
    const double offset = dt == DType::f32 ? 1e4 : 1e9;
    std::vector<double> xv = values(rnd({16, 64}, 41));
    for (double& v : xv) v += offset;
    const Tensor x = Tensor::from_vector(xv, {16, 64}).to(dt);
    const std::vector<double> xr = values(x);  // the rounded inputs
    const NormRef ref = norm_ref(xr, {}, {}, std::vector<double>(xr.size(), 1.0), 64, 1e-5, true);
    const double tol = dt == DType::f32 ? 2e-3 : 1e-6;
    check_values(values(layer_norm(x, {64})), ref.y, tol);
  }
}

TEST_CASE("rms_norm: host reference, default eps = the math type's epsilon, gradcheck") {
  const Tensor x = rnd({70, 12}, 51, DType::f64, 2.0), dy = rnd({70, 12}, 52), w = rnd({12}, 53);
  const NormRef ref = norm_ref(values(x), values(w), {}, values(dy), 12, 1e-6, false);
  Tensor xl = param(x.clone().detach()), wl = param(w.clone().detach());
  Tensor y = rms_norm(xl, {12}, wl, 1e-6);
  check_values(values(y), ref.y, 1e-13);
  y.backward(dy);
  check_values(values(xl.grad()), ref.dx, 1e-12);
  check_values(values(wl.grad()), ref.dw, 1e-12);
  check_grad([](const std::vector<Tensor>& v) { return rms_norm(v[0], {3, 4}); },
             {param(rnd({2, 3, 4}, 54).detach())});
  // Default eps: float's epsilon for f32 (and f16/bf16), double's for f64.
  // Rows of 1e-4 (f32) and 1e-8 (f64), where eps is not negligible.
  const double ef = std::numeric_limits<float>::epsilon(), ed = std::numeric_limits<double>::epsilon();
  const std::vector<double> yf = values(rms_norm(full({2, 4}, 1e-4, opts(DType::f32)), {4}));
  CHECK(yf[0] == doctest::Approx(1e-4 / std::sqrt(1e-8 + ef)).epsilon(1e-6));
  const std::vector<double> yd = values(rms_norm(full({2, 4}, 1e-8, opts(DType::f64)), {4}));
  CHECK(yd[0] == doctest::Approx(1e-8 / std::sqrt(1e-16 + ed)).epsilon(1e-12));
  // A row of zeros: 0, not NaN.
  for (double v : values(rms_norm(zeros({2, 4}, opts(DType::bf16)), {4}))) CHECK(v == 0.0);
  // Large offsets: rms is dominated by the offset; f32 stays within 1e-6.
  std::vector<double> xv = values(rnd({4, 32}, 55));
  for (double& v : xv) v += 1e4;
  const Tensor xo = Tensor::from_vector(xv, {4, 32}).to(DType::f32);
  const NormRef ro = norm_ref(values(xo), {}, {}, std::vector<double>(xv.size(), 0.0), 32, ef, false);
  check_values(values(rms_norm(xo, {32})), ro.y, 1e-6);
}

TEST_CASE("layer_norm and rms_norm: f16/bf16 accumulate in f32, and CUDA is bit-identical to the CPU") {
  const Tensor x = rnd({33, 48}, 61, DType::f64, 3.0), w = rnd({48}, 62), b = rnd({48}, 63);
  const NormRef ref = norm_ref(values(x), values(w), values(b), std::vector<double>(x.numel(), 1.0), 48, 1e-5, true);
  for (const DType dt : {DType::f16, DType::bf16}) {
    const std::vector<double> got = values(layer_norm(x.to(dt), {48}, w.to(dt), b.to(dt)));
    for (std::size_t i = 0; i < got.size(); ++i)
      CHECK(std::fabs(got[i] - ref.y[i]) <= (dt == DType::bf16 ? 6e-2 : 1e-2) * std::max(1.0, std::fabs(ref.y[i])));
  }
  if (!has_gpu()) return;
  for (const DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    const Tensor dy = rnd({33, 48}, 64, dt);
    auto run = [&](Device dev) {
      Tensor xl = fresh(x, dt, dev), wl = fresh(w, dt, dev), bl = fresh(b, dt, dev);
      Tensor y = layer_norm(xl, {48}, wl, bl);
      Tensor z = rms_norm(xl, {48}, wl);
      add(y, z).backward(dy.to(dev));
      return std::vector<Tensor>{y.cpu(), z.cpu(), xl.grad().cpu(), wl.grad().cpu(), bl.grad().cpu()};
    };
    const auto c = run(Device::cpu()), g = run(Device::cuda(0));
    for (std::size_t i = 0; i < c.size(); ++i) CHECK(bit_equal(c[i], g[i]));
  }
}

TEST_CASE("layer_norm, rms_norm, softmax: warp-per-row CUDA rows (d >= 32, with tails) against the CPU") {
  QGRAD_REQUIRE_GPU();
  // 200 rows: the weight and bias gradients sum 4 chunks of kNormChunkRows
  // rows, the last one short (the CUDA column-sum kernel's tails). d: below
  // a warp's row (31), every held shape (4, 8, 16 and 32 elements a lane,
  // full: 128, 256, 512, 1024, and ragged: 32, 100, 200, 300, 700), and rows
  // walked in memory (1027).
  for (const std::int64_t rows : {17LL, 200LL})
  for (const std::int64_t d : {31LL, 32LL, 100LL, 128LL, 200LL, 256LL, 300LL, 512LL, 700LL, 1024LL, 1027LL}) {
    CAPTURE(rows);
    CAPTURE(d);
    const Tensor x = rnd({rows, d}, 65, DType::f64, 2.0), w = rnd({d}, 66), b = rnd({d}, 67);
    for (const DType dt : {DType::f64, DType::f32, DType::bf16}) {
      CAPTURE(dtype_name(dt));
      const Tensor dy = rnd({rows, d}, 68, dt);
      auto run = [&](Device dev) {
        Tensor xl = fresh(x, dt, dev), wl = fresh(w, dt, dev), bl = fresh(b, dt, dev);
        Tensor y = layer_norm(xl, {d}, wl, bl);
        Tensor z = rms_norm(xl, {d});
        Tensor s = softmax(xl, -1);
        add(add(y, z), s).backward(dy.to(dev));
        return std::vector<Tensor>{y.cpu(), z.cpu(), s.cpu(), xl.grad().cpu(), wl.grad().cpu(), bl.grad().cpu()};
      };
      const auto c = run(Device::cpu()), g = run(Device::cuda(0));
      // The normalisations: the same bits; softmax and the gradient through it:
      // exp is glibc's on the CPU and libdevice's on CUDA.
      CHECK(bit_equal(c[0], g[0]));
      CHECK(bit_equal(c[1], g[1]));
      CHECK(bit_equal(c[4], g[4]));
      CHECK(bit_equal(c[5], g[5]));
      const double tol = dt == DType::f64 ? 1e-13 : dt == DType::f32 ? 1e-5 : 1e-2;
      CHECK(max_abs_diff(c[2], g[2]) <= tol);
      CHECK(max_abs_diff(c[3], g[3]) <= tol * 10);
    }
  }
}

TEST_CASE("layer_norm, rms_norm backward: CUDA's one launch of dx and the parameters' chunk partials (d = 128, 256) "
          "gives the CPU's bits, with and without a fake quant's mask") {
  QGRAD_REQUIRE_GPU();
  // 17 rows: one short chunk; 64: one full; 200: three full and a short one.
  for (const std::int64_t rows : {17LL, 64LL, 200LL})
    for (const std::int64_t d : {128LL, 256LL})
      for (const DType dt : {DType::f32, DType::bf16, DType::f16}) {
        CAPTURE(rows);
        CAPTURE(d);
        CAPTURE(dtype_name(dt));
        const Tensor x = rnd({rows, d}, 81, DType::f64, 2.0), w = rnd({d}, 82), b = rnd({d}, 83);
        const Tensor dy = rnd({rows, d}, 84, dt);
        // 0: layer_norm (weight, bias); 1: layer_norm (weight only); 2: rms_norm (weight);
        // 3: layer_norm_fake_quantize_dynamic (weight, bias: dy read through its mask; symmetric, so
        // that a row's largest positive value, at +127.5 steps, rounds out of range: zero bits).
        for (int form = 0; form < 4; ++form) {
          CAPTURE(form);
          auto run = [&](Device dev) {
            const bool with_bias = form == 0 || form == 3;
            Tensor xl = fresh(x, dt, dev), wl = fresh(w, dt, dev), bl = with_bias ? fresh(b, dt, dev) : Tensor();
            if (dev.is_cuda()) prepoison({rows, d}, dt);
            Tensor y = form == 2   ? rms_norm(xl, {d}, wl)
                       : form == 3 ? layer_norm_fake_quantize_dynamic(xl, {d}, wl, bl, 1e-5, QuantMode::symmetric,
                                                                      -128, 127, FLT_EPSILON)
                                   : layer_norm(xl, {d}, wl, bl);
            if (dev.is_cuda()) prepoison({rows, d}, dt);
            y.backward(dy.to(dev));
            return std::vector<Tensor>{y.cpu(), xl.grad().cpu(), wl.grad().cpu(),
                                       with_bias ? bl.grad().cpu() : Tensor()};
          };
          const auto c = run(Device::cpu()), g = run(Device::cuda(0));
          CHECK(bit_equal(c[0], g[0]));
          CHECK(bit_equal(c[1], g[1]));
          CHECK(bit_equal(c[2], g[2]));
          if (c[3].defined()) CHECK(bit_equal(c[3], g[3]));
          if (form == 3) {  // the mask drops some of dy: the gradient differs from layer_norm's own
            const Device cpu = Device::cpu();
            const Tensor xl = fresh(x, dt, cpu), wl = fresh(w, dt, cpu), bl = fresh(b, dt, cpu);
            layer_norm(xl, {d}, wl, bl).backward(dy);
            CHECK_FALSE(bit_equal(xl.grad(), c[1]));
          }
        }
      }
}

TEST_CASE("layer_norm, rms_norm backward fold a residual's pending gradient: the engine's add, bit for bit, on every "
          "kernel path") {
  // out = h + norm(h), h = a + b: when the norm's rule runs, the residual's
  // gradient for h is pending, and dx is written as pending + the norm's dx.
  // d = 16 (the per-row loop), 128 and 256 (CUDA's chunk kernel where the
  // parameters need gradients), 300 (CUDA's warp rows); 200 rows.
  std::vector<Device> devices{Device::cpu()};
  if (has_gpu()) devices.push_back(Device::cuda(0));
  for (const Device dev : devices)
    for (const std::int64_t d : {16LL, 128LL, 256LL, 300LL})
      for (const DType dt : {DType::f64, DType::f32, DType::bf16}) {
        CAPTURE(dev.str());
        CAPTURE(d);
        CAPTURE(dtype_name(dt));
        const Tensor a0 = rnd({200, d}, 91, DType::f64, 2.0), b0 = rnd({200, d}, 92), w0 = rnd({d}, 93),
                     c0 = rnd({d}, 94);
        const Tensor dy = rnd({200, d}, 95, dt);
        // 0: layer_norm (weight, bias); 1: layer_norm without parameters (dx alone); 2: rms_norm (weight);
        // 3: layer_norm_fake_quantize_dynamic (weight, bias).
        for (int form = 0; form < 4; ++form) {
          CAPTURE(form);
          auto run = [&](bool fold) {
            set_gradient_folding(fold);
            const bool with_w = form != 1, with_b = form == 0 || form == 3;
            Tensor a = fresh(a0, dt, dev), b = fresh(b0, dt, dev);
            Tensor w = with_w ? fresh(w0, dt, dev) : Tensor(), c = with_b ? fresh(c0, dt, dev) : Tensor();
            Tensor h = add(a, b);
            Tensor y = form == 2   ? rms_norm(h, {d}, w)
                       : form == 3 ? layer_norm_fake_quantize_dynamic(h, {d}, w, c, 1e-5, QuantMode::asymmetric, -128,
                                                                      127, FLT_EPSILON)
                                   : layer_norm(h, {d}, w, c);
            if (dev.is_cuda()) prepoison({200, d}, dt);
            const std::uint64_t before = folded_gradient_count();
            add(h, y).backward(dy.to(dev));
            const std::uint64_t folds = folded_gradient_count() - before;
            set_gradient_folding(true);
            return std::pair{std::vector<Tensor>{a.grad().cpu(), b.grad().cpu(), with_w ? w.grad().cpu() : Tensor(),
                                                 with_b ? c.grad().cpu() : Tensor()},
                             folds};
          };
          const auto [folded, n_folded] = run(true);
          const auto [added, n_added] = run(false);
          CHECK(n_folded == 1);
          CHECK(n_added == 0);
          for (std::size_t i = 0; i < folded.size(); ++i)
            if (folded[i].defined()) CHECK(bit_equal(folded[i], added[i]));
          // h's gradient is dy plus the norm's: not dy alone.
          CHECK_FALSE(bit_equal(folded[0], dy.cpu()));
        }
      }
}

namespace {
// y.backward(dy) with gradient deferral on or off (on again after): the
// leaves' gradients on the host and how far `count` moved meanwhile.
std::pair<std::vector<Tensor>, std::uint64_t> grads_with_deferral(bool defer, const Tensor& y, const Tensor& dy,
                                                                  const std::vector<Tensor>& leaves,
                                                                  std::uint64_t (*count)()) {
  set_gradient_deferral(defer);
  const std::uint64_t before = count();
  y.backward(dy);
  const std::uint64_t moved = count() - before;
  set_gradient_deferral(true);
  std::vector<Tensor> grads;
  for (const Tensor& t : leaves) grads.push_back(t.grad().cpu());
  return {grads, moved};
}
}  // namespace

TEST_CASE("deferred gradient passes: a pre-norm MLP block's parameter gradients, bit for bit with deferral off, on "
          "every device") {
  // y = x + linear(gelu(linear(layer_norm(x), fq(Wa), ba)), fq(Wb), bb), the
  // weights fake-quantized by fake_quantize_dynamic_batch. Deferred: the
  // norm's two finishes and the weights' two mask passes (and on CUDA, where
  // 3000 rows take the chunked column sums, the biases' two finishes).
  const std::int64_t rows = 3000, d = 64, h = 96;
  for (const Device dev : test_devices())
    for (const DType dt : {DType::f64, DType::f32, DType::bf16}) {
      CAPTURE(dev.str());
      CAPTURE(dtype_name(dt));
      const Tensor x0 = rnd({rows, d}, 101), w0 = rnd({d}, 102), c0 = rnd({d}, 103), wa0 = rnd({h, d}, 104, DType::f64, 0.2),
                   ba0 = rnd({h}, 105), wb0 = rnd({d, h}, 106, DType::f64, 0.2), bb0 = rnd({d}, 107);
      const Tensor dy = rnd({rows, d}, 108, dt).to(dev);
      auto run = [&](bool defer) {
        std::vector<Tensor> p{fresh(x0, dt, dev),  fresh(w0, dt, dev),  fresh(c0, dt, dev), fresh(wa0, dt, dev),
                              fresh(ba0, dt, dev), fresh(wb0, dt, dev), fresh(bb0, dt, dev)};
        const std::vector<Tensor> wq = fake_quantize_dynamic_batch({p[3], p[5]}, QuantScope::per_channel(0),
                                                                    QuantMode::symmetric, -127, 127, FLT_EPSILON);
        Tensor y = add(p[0], linear(gelu(linear(layer_norm(p[0], {d}, p[1], p[2]), wq[0], p[4])), wq[1], p[6]));
        if (dev.is_cuda()) {
          prepoison({d}, dt);
          prepoison({h}, dt);
          prepoison({h, d}, dt);
        }
        return grads_with_deferral(defer, y, dy, p, deferred_gradient_pass_count);
      };
      const auto [on, n_on] = run(true);
      const auto [off, n_off] = run(false);
      CHECK(n_on == (dev.is_cuda() ? 6u : 4u));
      CHECK(n_off == 0u);
      for (std::size_t i = 0; i < on.size(); ++i) {
        CAPTURE(i);
        CHECK(bit_equal(on[i], off[i]));
        const std::vector<double> v = values(on[i]);  // no NaN left by an unwritten element
        CHECK(std::none_of(v.begin(), v.end(), [](double e) { return std::isnan(e); }));
      }
    }
}

// Mixed precision: f32 leaves cast to bf16 (to_batch; the weights by
// fake_quantize_dynamic_batch's out_dtype). The casts' nodes read their
// gradients only through queued passes, so the rules above them queue their
// last passes too (the norm's and the biases' finishes) and the casts run a
// generation later, reading what the finishes wrote: the same bits as with
// deferral off.
TEST_CASE("deferred gradient passes through mixed precision's casts: a pre-norm MLP block in bf16, bit for bit with "
          "deferral off, on every device") {
  // Weights [h, d] and [d, h]: rows of 128 and 256, which CUDA's row kernel takes.
  const std::int64_t rows = 3000, d = 128, h = 256;
  for (const Device dev : test_devices()) {
    CAPTURE(dev.str());
    const Tensor x0 = rnd({rows, d}, 111), w0 = rnd({d}, 112), c0 = rnd({d}, 113), wa0 = rnd({h, d}, 114, DType::f64, 0.2),
                 ba0 = rnd({h}, 115), wb0 = rnd({d, h}, 116, DType::f64, 0.2), bb0 = rnd({d}, 117);
    const Tensor dy = rnd({rows, d}, 118, DType::bf16).to(dev);
    auto run = [&](bool defer) {
      std::vector<Tensor> p{fresh(x0, DType::f32, dev),  fresh(w0, DType::f32, dev),  fresh(c0, DType::f32, dev),
                            fresh(wa0, DType::f32, dev), fresh(ba0, DType::f32, dev), fresh(wb0, DType::f32, dev),
                            fresh(bb0, DType::f32, dev)};
      const std::vector<Tensor> b = to_batch({p[0], p[1], p[2], p[4], p[6]}, DType::bf16);
      const std::vector<Tensor> wq = fake_quantize_dynamic_batch({p[3], p[5]}, QuantScope::per_channel(0),
                                                                  QuantMode::symmetric, -127, 127, FLT_EPSILON,
                                                                  DType::bf16);
      Tensor y = add(b[0], linear(gelu(linear(layer_norm(b[0], {d}, b[1], b[2]), wq[0], b[3])), wq[1], b[4]));
      if (dev.is_cuda()) {
        prepoison({d}, DType::bf16);
        prepoison({h}, DType::bf16);
        prepoison({d}, DType::f32);
      }
      return grads_with_deferral(defer, y, dy, p, deferred_gradient_pass_count);
    };
    const auto [on, n_on] = run(true);
    const auto [off, n_off] = run(false);
    // The five casts, the norm's two finishes, and the weights' passes: on CUDA two masks with their casts
    // inside, and the biases' two finishes (3000 rows: chunked sums); on the CPU two casts and two masks
    // (the weights take fake_quantize_dynamic there, then to_batch), and no finish for the biases.
    CHECK(n_on == 11u);
    CHECK(n_off == 0u);
    for (std::size_t i = 0; i < on.size(); ++i) {
      CAPTURE(i);
      CHECK(on[i].dtype() == DType::f32);
      CHECK(bit_equal(on[i], off[i]));
      const std::vector<double> v = values(on[i]);  // no NaN left by an unwritten element
      CHECK(std::none_of(v.begin(), v.end(), [](double e) { return std::isnan(e); }));
    }
  }
}

TEST_CASE("deferred gradient passes: a bias upstream of a norm finishes the norm's own chunk partials of dx, bit for "
          "bit with deferral off (CUDA)") {
  QGRAD_REQUIRE_GPU();
  // y = layer_norm(r + linear(a, W, bias)): the linear's dy is the norm's dx,
  // whose chunk partials the norm's one-launch backward (d = 128, 256; f32
  // math) leaves for the bias gradient, which then only queues its finish.
  const Device dev = Device::cuda(0);
  const std::int64_t rows = 3000, k = 48;
  for (const std::int64_t d : {128LL, 256LL})
    for (const DType dt : {DType::f32, DType::bf16, DType::f16}) {
      CAPTURE(d);
      CAPTURE(dtype_name(dt));
      const Tensor a0 = rnd({rows, k}, 111), r0 = rnd({rows, d}, 112), wl0 = rnd({d, k}, 113, DType::f64, 0.2),
                   bl0 = rnd({d}, 114), w0 = rnd({d}, 115), c0 = rnd({d}, 116);
      const Tensor dy = rnd({rows, d}, 117, dt).to(dev);
      auto run = [&](bool defer) {
        std::vector<Tensor> p{fresh(a0, dt, dev),  fresh(r0, dt, dev), fresh(wl0, dt, dev),
                              fresh(bl0, dt, dev), fresh(w0, dt, dev), fresh(c0, dt, dev)};
        Tensor y = layer_norm(add(p[1], linear(p[0], p[2], p[3])), {d}, p[4], p[5]);
        prepoison({d}, dt);
        return grads_with_deferral(defer, y, dy, p, kernels::DeferredPasses::column_partials_taken);
      };
      const auto [on, n_on] = run(true);
      const auto [off, n_off] = run(false);
      CHECK(n_on == 1u);
      CHECK(n_off == 0u);
      for (std::size_t i = 0; i < on.size(); ++i) {
        CAPTURE(i);
        CHECK(bit_equal(on[i], off[i]));
      }
    }
}

// A mask pass whose dy has a narrower dtype than dx (a mixed-precision
// weight's gradient: the cast back and the mask as one pass) gives the bits of
// the cast followed by the mask, run now or queued (CUDA: the batch kernel),
// with signed zeros, infinities and NaN among the inputs.
TEST_CASE("deferred masked gradient with a narrower dy: the cast then the mask, bit for bit, on every device") {
  struct Pair {
    DType dy, dx;
  };
  for (const Device dev : test_devices())
    for (const Pair p : {Pair{DType::bf16, DType::f32}, Pair{DType::f16, DType::f32}, Pair{DType::bf16, DType::f64},
                         Pair{DType::f32, DType::f64}})
      for (const bool queued : {false, true}) {
        CAPTURE(dev.str());
        CAPTURE(dtype_name(p.dy));
        CAPTURE(dtype_name(p.dx));
        CAPTURE(queued);
        const std::int64_t n = 5000;  // past one block of the batch kernel, not a multiple of 32
        std::vector<double> v = values(rnd({n}, 77, DType::f64, 3.0));
        v[1] = -0.0;
        v[2] = kInf;
        v[3] = -kInf;
        v[4] = kNaN;
        const Tensor dy = Tensor::from_vector(v, {n}).to(p.dy).to(dev);
        std::vector<std::int32_t> words(static_cast<std::size_t>(bitmask_words(n)));
        std::mt19937 bits(78);
        for (auto& w : words) w = static_cast<std::int32_t>(bits());
        const Tensor mask = Tensor::from_vector(words, {static_cast<std::int64_t>(words.size())}).to(dev);
        const auto* mask_words = static_cast<const std::uint32_t*>(mask.data_ptr());
        // The two passes it replaces: the cast back, then the mask in dx's dtype.
        const Tensor want = Tensor::empty({n}, TensorOptions{}.with_dtype(p.dx).with_device(dev));
        kernels::fake_quantize_backward(dy.to(p.dx), want, mask_words);
        Tensor dx = Tensor::empty({n}, TensorOptions{}.with_dtype(p.dx).with_device(dev));
        poison(dx);
        if (queued) {
          kernels::DeferredPasses passes;
          kernels::masked_gradient(dy, mask, dx, &passes);
          passes.flush();
        } else {
          kernels::masked_gradient(dy, mask, dx, nullptr);
        }
        CHECK(bit_equal(dx.cpu(), want.cpu()));
      }
  CHECK(kernels::masked_gradient_exact_cast(DType::bf16, DType::f32));
  CHECK_FALSE(kernels::masked_gradient_exact_cast(DType::f32, DType::bf16));
  CHECK_FALSE(kernels::masked_gradient_exact_cast(DType::f64, DType::f32));
}

// ---------------------------------------------------------------- embedding

// packed_attention_fake_quantize_dynamic against its composition on the same
// device: CUDA's fused path (the attention, the row fake quant, and a
// backward reading dO through the mask) gives fake_quantize_dynamic(
// packed_attention(.))'s output and dqkv bit for bit (widths 128 and 256, f32
// / bf16 / f16, causal or not, the output's block poisoned first); the CPU
// (the composition itself) too; the ViT's shape (L = 49, four heads) included.
TEST_CASE("packed_attention_fake_quantize_dynamic: its composition's values and gradient, bit for bit, on every "
          "device") {
  struct Case {
    std::int64_t batch, L, width, heads;
    bool causal;
  };
  const Case cases[] = {{3, 49, 128, 4, false}, {2, 17, 256, 8, true}, {1, 64, 128, 2, false}};
  const float eps = std::numeric_limits<float>::epsilon();
  std::uint64_t seed = 4000;
  for (const Device dev : test_devices())
    for (const Case& c : cases)
      for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
        if (dev.is_cpu() && dt != DType::f32) continue;
        CAPTURE(dev.str());
        CAPTURE(c.L);
        CAPTURE(c.width);
        CAPTURE(dtype_name(dt));
        const Tensor qkv = rnd({c.batch, c.L, 3 * c.width}, seed++, DType::f32, 1.5).to(dt).to(dev);
        const Tensor dy = rnd({c.batch, c.L, c.width}, seed++, DType::f32).to(dt).to(dev);
        auto run = [&](bool fused) {
          Tensor x = param(qkv.detach().clone());
          {
            Tensor poison = full({c.batch, c.L, c.width}, std::nan(""), opts(dt, dev));
          }
          Tensor y = fused ? packed_attention_fake_quantize_dynamic(x, c.heads, c.causal, QuantMode::asymmetric, -128,
                                                                    127, eps)
                           : fake_quantize_dynamic(packed_attention(x, c.heads, c.causal), QuantScope::per_token(),
                                                   QuantMode::asymmetric, -128, 127, eps);
          y.backward(dy);
          return std::vector<Tensor>{y.cpu(), x.grad().cpu()};
        };
        const auto fused = run(true), plain = run(false);
        CHECK(bit_equal(fused[0], plain[0]));
        CHECK(bit_equal(fused[1], plain[1]));
        CHECK(max_abs_diff(fused[1], zeros_like(fused[1])) > 0);  // a gradient flowed
      }
}

TEST_CASE("embedding: gather, repeated indices summed in order, padding_idx rows get zero gradient") {
  const std::int64_t V = 7, D = 5;
  const Tensor w = rnd({V, D}, 71);
  const std::vector<std::int64_t> idx = {3, 1, 3, 0, 6, 3, 2, 1, 2, 2, 5, 3};
  for (const bool s32 : {false, true}) {
    const Tensor ind = s32 ? Tensor::from_vector(std::vector<std::int32_t>(idx.begin(), idx.end()), {3, 4})
                           : Tensor::from_vector(idx, {3, 4});
    const Tensor dy = rnd({3, 4, D}, 72);
    for (const std::int64_t pad : {-1LL, 2LL, -5LL}) {  // none, row 2, row 2 from the end
      INFO("s32 ", s32, " padding_idx ", pad);
      Tensor wl = param(w.clone().detach());
      Tensor y = pad == -1 ? embedding(wl, ind) : embedding(wl, ind, pad);
      CHECK(y.shape() == Shape{3, 4, D});
      const std::vector<double> wv = values(w), yv = values(y), gv = values(dy);
      for (std::size_t n = 0; n < idx.size(); ++n)
        for (std::int64_t j = 0; j < D; ++j)  // the padding row is still gathered (PyTorch)
          CHECK(yv[n * D + j] == wv[static_cast<std::size_t>(idx[n] * D + j)]);
      y.backward(dy);
      const std::vector<double> got = values(wl.grad());
      for (std::int64_t v = 0; v < V; ++v)
        for (std::int64_t j = 0; j < D; ++j) {
          double want = 0;  // summed in index order, as the kernel promises
          if (pad == -1 || v != 2)
            for (std::size_t n = 0; n < idx.size(); ++n)
              if (idx[n] == v) want += gv[n * D + j];
          CHECK(got[static_cast<std::size_t>(v * D + j)] == want);
        }
    }
  }
  // (padding_idx 3 is not among the indices: a padding row that is used has
  // a zero gradient by definition, which finite differences would not see.)
  check_grad([](const std::vector<Tensor>& v) { return embedding(v[0], Tensor::from_vector<std::int64_t>({1, 1, 0}, {3}), 3); },
             {param(w.clone().detach())});
}

TEST_CASE("embedding: out-of-range indices throw on the CPU before anything is written; deterministic gradient") {
  const Tensor w = rnd({4, 3}, 81);
  CHECK_THROWS_AS(embedding(w, Tensor::from_vector<std::int64_t>({0, 4}, {2})), Error);
  CHECK_THROWS_AS(embedding(w, Tensor::from_vector<std::int32_t>({-1}, {1})), Error);
  CHECK_THROWS_AS(embedding(w, Tensor::from_vector<std::int64_t>({0}, {1}), 4), Error);
  // Many repeats of few rows in bf16 and f32: the same bits every run (and on CUDA).
  Generator g(82);
  const Tensor ind = randint(0, 4, {5000}, g, opts(DType::s64));
  for (const DType dt : {DType::f32, DType::bf16}) {
    const Tensor wd = w.to(dt), dy = rnd({5000, 3}, 83, dt);
    auto run = [&](Device dev) {
      Tensor wl = fresh(wd, dt, dev);
      embedding(wl, ind.to(dev), 1).backward(dy.to(dev));
      return wl.grad().cpu();
    };
    const Tensor a = run(Device::cpu()), b = run(Device::cpu());
    CHECK(bit_equal(a, b));
    CHECK(values(a)[3] == 0.0);  // padding row 1
    if (has_gpu()) CHECK(bit_equal(a, run(Device::cuda(0))));
  }
  if (has_gpu()) {
    // CUDA: an out-of-range index gives a NaN row and adds nothing to the gradient.
    Tensor wl = param(w.cuda());
    Tensor y = embedding(wl, Tensor::from_vector<std::int64_t>({1, 9, -2}, {3}, Device::cuda(0)));
    const std::vector<double> yv = values(y.cpu());
    CHECK(!std::isnan(yv[0]));
    CHECK(std::isnan(yv[3]));
    CHECK(std::isnan(yv[6]));
    y.backward(ones_like(y));
    const std::vector<double> gv = values(wl.grad().cpu());
    CHECK(gv[3] == 1.0);
    CHECK(gv[0] == 0.0);
  }
}

// ---------------------------------------------------------------- dropout

TEST_CASE("dropout: the same mask for the same seed, mask statistics, scaling, eval and p in {0, 1}") {
  const std::int64_t n = 100000;
  const double p = 0.3;
  const Tensor x = rnd({n}, 91, DType::f32);
  Generator g1(5), g2(5);
  const Tensor y1 = dropout(x, p, true, g1), y2 = dropout(x, p, true, g2);
  CHECK(bit_equal(y1, y2));
  // The generator advanced: the next draw differs.
  CHECK(!bit_equal(dropout(x, p, true, g1), y1));
  Generator g3(6);
  CHECK(!bit_equal(dropout(x, p, true, g3), y1));
  // Kept elements are x / (1 - p) (scale rounded to f32), the rest 0; the
  // mask is the host rule keep_i = uniform(seed, i) >= p.
  const std::vector<double> xv = values(x), yv = values(y1);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const bool keep = formulas::random_uniform(5, static_cast<std::uint64_t>(i)) >= p;
    kept += keep;
    CHECK(yv[k] == (keep ? static_cast<double>(static_cast<float>(xv[k]) * scale) : 0.0));
  }
  // Binomial(n, 0.7): within 5 standard deviations.
  const double sd = std::sqrt(n * p * (1 - p));
  CHECK(std::fabs(static_cast<double>(kept) - n * (1 - p)) < 5 * sd);
  // Runs of kept bits are not correlated with position: each quarter keeps ~70%.
  for (int q = 0; q < 4; ++q) {
    std::int64_t kq = 0;
    for (std::int64_t i = q * n / 4; i < (q + 1) * n / 4; ++i) kq += yv[static_cast<std::size_t>(i)] != 0.0;
    CHECK(std::fabs(static_cast<double>(kq) / (n / 4) - (1 - p)) < 0.01);
  }
  // Eval and p == 0: x itself; p == 1: zeros (NaN stays NaN, as x * 0).
  CHECK(dropout(x, p, false).data_ptr() == x.data_ptr());
  CHECK(dropout(x, 0.0, true).data_ptr() == x.data_ptr());
  const std::vector<double> z = values(dropout(from({1.0, -2.0, kNaN}, DType::f32), 1.0));
  CHECK(z[0] == 0.0);
  CHECK(z[1] == 0.0);
  CHECK(std::isnan(z[2]));
}

TEST_CASE("dropout: backward is dy * mask / (1 - p); CPU and CUDA draw the same mask") {
  const Tensor x = rnd({3, 77}, 92);
  Generator g(8);
  Tensor xl = param(x.clone().detach());
  Tensor y = dropout(xl, 0.4, true, g);
  const Tensor dy = rnd({3, 77}, 93);
  y.backward(dy);
  const std::vector<double> yv = values(y), xv = values(x), dv = values(dy), gv = values(xl.grad());
  for (std::size_t i = 0; i < yv.size(); ++i) {
    const bool keep = formulas::random_uniform(8, i) >= 0.4;
    CHECK(gv[i] == (keep ? dv[i] * (1.0 / 0.6) : 0.0));
    CHECK(yv[i] == (keep ? xv[i] * (1.0 / 0.6) : 0.0));
  }
  if (!has_gpu()) return;
  for (const DType dt : {DType::f32, DType::bf16, DType::f64}) {
    auto run = [&](Device dev) {
      Generator gg(9);
      Tensor xd = fresh(x, dt, dev);
      Tensor yd = dropout(xd, 0.25, true, gg);
      yd.backward(dy.to(dt).to(dev));
      return std::vector<Tensor>{yd.cpu(), xd.grad().cpu()};
    };
    const auto c = run(Device::cpu()), d = run(Device::cuda(0));
    CHECK(bit_equal(c[0], d[0]));
    CHECK(bit_equal(c[1], d[1]));
  }
}

// ---------------------------------------------------------------- nn modules

TEST_CASE("nn transformer modules: PyTorch's default inits, parameters, train/eval") {
  nn::LayerNorm ln({3, 4});
  CHECK(ln.named_parameters().size() == 2);
  for (double v : values(ln.weight())) CHECK(v == 1.0);
  for (double v : values(ln.bias())) CHECK(v == 0.0);
  const Tensor x = rnd({2, 3, 4}, 101, DType::f32);
  CHECK(bit_equal(ln(x), layer_norm(x, {3, 4})));
  CHECK(nn::LayerNorm({4}, 1e-5, false).named_parameters().empty());
  CHECK(nn::LayerNorm({4}, 1e-5, true, false).named_parameters().size() == 1);
  CHECK_THROWS_AS(nn::LayerNorm({4}, 0.0), Error);
  CHECK_THROWS_AS(nn::LayerNorm({}), Error);

  nn::RMSNorm rms({4});
  CHECK(rms.named_parameters().size() == 1);
  CHECK(bit_equal(rms(x), rms_norm(x, {4})));
  CHECK_THROWS_AS(nn::RMSNorm({4}, -1.0), Error);

  Generator g(7);
  nn::Embedding emb(10, 4, g, 3);
  const std::vector<double> w = values(emb.weight());
  for (int j = 0; j < 4; ++j) CHECK(w[static_cast<std::size_t>(12 + j)] == 0.0);  // padding row zeroed
  Generator g2(7);
  const std::vector<double> draw = values(randn({10, 4}, g2, opts(DType::f64)));
  CHECK(w[0] == static_cast<double>(static_cast<float>(draw[0])));  // N(0, 1) from the generator
  const Tensor ind = Tensor::from_vector<std::int64_t>({3, 1, 3}, {3});
  Tensor y = emb(ind);
  CHECK(y.shape() == Shape{3, 4});
  sum(y).backward();
  for (int j = 0; j < 4; ++j) CHECK(values(emb.weight().grad())[static_cast<std::size_t>(12 + j)] == 0.0);
  CHECK_THROWS_AS(nn::Embedding(10, 4, g, 10), Error);

  Generator gd(3);
  nn::Dropout drop(0.5, gd);
  const Tensor a = drop(x);
  CHECK(!bit_equal(a, x));
  drop.eval();
  CHECK(bit_equal(drop(x), x));
  CHECK_THROWS_AS(nn::Dropout(1.5), Error);

  nn::GELU gelu_tanh(GeluApproximate::tanh);
  CHECK(bit_equal(gelu_tanh(x), gelu(x, GeluApproximate::tanh)));
  CHECK(bit_equal(nn::GELU()(x), gelu(x)));
}
