// conv2d: seeded random inputs against a direct 7-loop convolution in double
// (forward, input, weight and bias gradients) over stride, padding, dilation,
// groups, depthwise, 1x1 and non-square kernels, in f32 and f64 on every
// device; edge cases (empty batch, NaN, partial requires_grad, determinism).
#include <algorithm>
#include <array>
#include <string>
#include <tuple>

#include "helpers.h"
#include "qgrad/kernels/conv.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

using Pair = std::array<std::int64_t, 2>;

struct Config {
  std::string name;
  Shape x, w;
  bool bias;
  Pair stride, padding, dilation;
  std::int64_t groups;
};

const std::vector<Config>& configs() {
  static const std::vector<Config> c = {
      {"3x3, padding 1", {2, 3, 6, 5}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {"stride 2", {2, 3, 7, 8}, {5, 3, 3, 3}, true, {2, 2}, {0, 0}, {1, 1}, 1},
      {"stride (2, 1), padding (2, 1)", {1, 2, 6, 7}, {3, 2, 3, 3}, false, {2, 1}, {2, 1}, {1, 1}, 1},
      {"dilation 2", {2, 2, 9, 8}, {3, 2, 3, 3}, true, {1, 1}, {1, 1}, {2, 2}, 1},
      {"dilation (1, 3), stride 3", {1, 3, 10, 11}, {2, 3, 2, 3}, true, {3, 3}, {1, 2}, {1, 3}, 1},
      {"groups 2", {2, 4, 6, 6}, {6, 2, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 2},
      {"depthwise", {2, 4, 7, 7}, {4, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 4},
      {"depthwise x2, stride 2", {2, 3, 8, 6}, {6, 1, 5, 3}, false, {2, 2}, {2, 1}, {1, 1}, 3},
      {"1x1", {3, 5, 4, 6}, {7, 5, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 1},
      {"1x1 stride 2, padding 1", {2, 4, 5, 5}, {3, 4, 1, 1}, true, {2, 2}, {1, 1}, {1, 1}, 1},
      {"non-square 2x5 kernel", {2, 3, 5, 9}, {4, 3, 2, 5}, true, {1, 1}, {0, 2}, {1, 1}, 1},
      {"kernel = padded input", {2, 2, 3, 3}, {3, 2, 5, 5}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      // CUDA's direct gradients (groups of <= 4 input channels): the weight
      // gradient over 3 chunks of 4096 positions, and 49 taps.
      {"first layer, 3 chunks", {12, 1, 28, 28}, {32, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {"depthwise 7x7", {3, 6, 12, 11}, {6, 1, 7, 7}, true, {1, 1}, {3, 3}, {1, 1}, 6},
      // The stride-1 input gradient's 25-tap kernel over planes of several blocks.
      {"5x5, padding 2, 2 channels", {2, 2, 19, 17}, {6, 2, 5, 5}, true, {1, 1}, {2, 2}, {1, 1}, 1},
      {"4 channels, 4x4, stride 2, dilation 2", {2, 4, 13, 12}, {5, 4, 4, 4}, true, {2, 2}, {3, 2}, {2, 2}, 1},
      // Large enough (> 4M multiply-adds) for the CPU's parallel path.
      {"parallel path", {4, 16, 18, 16}, {32, 16, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
      {"parallel path, groups 4", {3, 16, 24, 24}, {32, 4, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 4},
      // Staged channels-last on CUDA with TF32 (kernels/conv.h): 8 channels,
      // stride 2, unequal padding, a bias.
      {"channels-last staged, stride 2", {3, 8, 9, 10}, {12, 8, 3, 3}, true, {2, 2}, {1, 2}, {1, 1}, 1},
  };
  return c;
}

struct Reference {
  std::vector<double> y, dx, dw, db;
};

// The direct convolution and its three gradients for upstream dy, in double.
Reference reference(const Config& c, const std::vector<double>& x, const std::vector<double>& w,
                    const std::vector<double>& b, const std::vector<double>& dy, std::int64_t oh, std::int64_t ow) {
  const std::int64_t N = c.x[0], C = c.x[1], H = c.x[2], W = c.x[3];
  const std::int64_t O = c.w[0], Cg = c.w[1], KH = c.w[2], KW = c.w[3], Og = O / c.groups;
  Reference r;
  r.y.assign(static_cast<std::size_t>(N * O * oh * ow), 0.0);
  r.dx.assign(x.size(), 0.0);
  r.dw.assign(w.size(), 0.0);
  r.db.assign(static_cast<std::size_t>(O), 0.0);
  auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t a = 0; a < oh; ++a)
        for (std::int64_t bb = 0; bb < ow; ++bb) {
          const std::size_t yi = at(((n * O + o) * oh + a) * ow + bb);
          double acc = c.bias ? b[at(o)] : 0.0;
          const double g = dy[yi];
          r.db[at(o)] += g;
          for (std::int64_t cl = 0; cl < Cg; ++cl)
            for (std::int64_t i = 0; i < KH; ++i)
              for (std::int64_t j = 0; j < KW; ++j) {
                const std::int64_t ih = a * c.stride[0] - c.padding[0] + i * c.dilation[0];
                const std::int64_t iw = bb * c.stride[1] - c.padding[1] + j * c.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const std::int64_t ch = (o / Og) * Cg + cl;
                const std::size_t xi = at(((n * C + ch) * H + ih) * W + iw);
                const std::size_t wi = at(((o * Cg + cl) * KH + i) * KW + j);
                acc += w[wi] * x[xi];
                r.dx[xi] += g * w[wi];
                r.dw[wi] += g * x[xi];
              }
          r.y[yi] = acc;
        }
  return r;
}

Tensor seeded(const Shape& shape, std::uint64_t seed, DType dt, Device d, bool grad) {
  Generator g(seed);
  Tensor t = randn(shape, g, TensorOptions{}.with_dtype(dt).with_device(d));
  t.set_requires_grad(grad);
  return t;
}

// |got - want| <= tol · max(1, max |want|) elementwise (sums of many terms
// of either sign: the error scales with the terms, not with each result).
void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double scale = 1, worst = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
  INFO(what, ": worst error relative to max(1, max |reference|) ", worst);
  CHECK(worst <= tol);
}

void run_config(const Config& c, DType dt, Device d, std::uint64_t seed) {
  INFO("config ", c.name, ", ", std::string(dtype_name(dt)), " on ", d.str());
  Tensor x = seeded(c.x, seed, dt, d, true), w = seeded(c.w, seed + 1, dt, d, true);
  Tensor b = c.bias ? seeded({c.w[0]}, seed + 2, dt, d, true) : Tensor();
  Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
  const std::int64_t oh = (c.x[2] + 2 * c.padding[0] - c.dilation[0] * (c.w[2] - 1) - 1) / c.stride[0] + 1;
  const std::int64_t ow = (c.x[3] + 2 * c.padding[1] - c.dilation[1] * (c.w[3] - 1) - 1) / c.stride[1] + 1;
  REQUIRE(y.shape() == Shape{c.x[0], c.w[0], oh, ow});
  CHECK(y.dtype() == dt);
  CHECK(y.device() == d);
  Tensor dy = seeded(y.shape(), seed + 3, dt, d, false);
  y.backward(dy);
  const Reference r = reference(c, values(x), values(w), c.bias ? values(b) : std::vector<double>{}, values(dy), oh, ow);
  // CUDA: cuDNN's transform algorithms (Winograd, FFT) round more than a dot
  // product (the registry's promise across devices, docs/ops.md).
  const double tol = dt == DType::f64 ? 1e-12 : d.is_cuda() ? 1e-4 : 1e-5;
  check_close(values(y), r.y, tol, "forward");
  check_close(values(x.grad()), r.dx, tol, "input gradient");
  check_close(values(w.grad()), r.dw, tol, "weight gradient");
  if (c.bias) check_close(values(b.grad()), r.db, tol, "bias gradient");
}

}  // namespace

TEST_CASE("conv2d f64 matches a direct double-loop convolution: forward and the three gradients") {
  std::uint64_t seed = 100;
  for (Device d : test_devices())
    for (const Config& c : configs()) run_config(c, DType::f64, d, seed += 10);
}

TEST_CASE("conv2d f32 matches a direct double-loop convolution: forward and the three gradients") {
  std::uint64_t seed = 500;
  for (Device d : test_devices())
    for (const Config& c : configs()) run_config(c, DType::f32, d, seed += 10);
}

TEST_CASE("conv2d f16 and bf16: within their rounding of the f64 result (computed in f32, rounded once)") {
  const Config& c = configs()[5];  // groups 2
  for (Device d : test_devices())
    for (DType dt : {DType::f16, DType::bf16}) {
      INFO(std::string(dtype_name(dt)), " on ", d.str());
      Tensor x = seeded(c.x, 7, dt, d, false), w = seeded(c.w, 8, dt, d, false), b = seeded({c.w[0]}, 9, dt, d, false);
      Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
      Tensor y64 = conv2d(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64), c.stride, c.padding, c.dilation,
                          c.groups);
      // One rounding of the conv result and one of the bias sum.
      const double ulp = dt == DType::f16 ? 1.0 / 1024 : 1.0 / 128;
      check_close(values(y), values(y64), (d.is_cuda() ? 4 : 2) * ulp, "forward");
    }
}

TEST_CASE("conv2d: an empty batch gives an empty output, zero weight and bias gradients") {
  for (Device d : test_devices()) {
    Tensor x = seeded({0, 3, 5, 5}, 1, DType::f32, d, true), w = seeded({4, 3, 3, 3}, 2, DType::f32, d, true);
    Tensor b = seeded({4}, 3, DType::f32, d, true);
    Tensor y = conv2d(x, w, b, {2, 2}, {1, 1});
    CHECK(y.shape() == Shape{0, 4, 3, 3});
    y.backward(zeros(y.shape(), TensorOptions{}.with_device(d)));
    CHECK(x.grad().shape() == Shape{0, 3, 5, 5});
    CHECK(values(w.grad()) == std::vector<double>(108, 0.0));
    CHECK(values(b.grad()) == std::vector<double>(4, 0.0));
  }
}

TEST_CASE("conv2d: only the inputs that require grad get gradients, and only what they need is saved") {
  for (Device d : test_devices()) {
    Tensor x = seeded({2, 3, 5, 5}, 1, DType::f64, d, false), w = seeded({4, 3, 3, 3}, 2, DType::f64, d, true);
    Tensor y = conv2d(x, w);
    REQUIRE(y.grad_fn());
    CHECK(y.grad_fn()->saved_bytes == x.nbytes());  // x for the weight gradient; not the weight
    y.backward(ones_like(y));
    CHECK_FALSE(x.grad().defined());
    REQUIRE(w.grad().defined());
    Tensor x2 = seeded({2, 3, 5, 5}, 1, DType::f64, d, true), w2 = seeded({4, 3, 3, 3}, 2, DType::f64, d, false);
    Tensor y2 = conv2d(x2, w2);
    CHECK(y2.grad_fn()->saved_bytes == w2.nbytes());
    y2.backward(ones_like(y2));
    CHECK(x2.grad().defined());
    CHECK_FALSE(w2.grad().defined());
    NoGradGuard no_grad;
    Tensor y3 = conv2d(x2, seeded({4, 3, 3, 3}, 2, DType::f64, d, true));
    CHECK_FALSE(y3.grad_fn());
  }
}

TEST_CASE("conv2d is deterministic: two runs give the same bits (forward and gradients)") {
  const Config& c = configs()[12];  // the parallel path
  for (Device d : test_devices())
    for (DType dt : {DType::f32, DType::f16}) {
      std::vector<Tensor> runs;
      for (int k = 0; k < 2; ++k) {
        Tensor x = seeded(c.x, 11, dt, d, true), w = seeded(c.w, 12, dt, d, true), b = seeded({c.w[0]}, 13, dt, d, true);
        Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
        y.backward(seeded(y.shape(), 14, dt, d, false));
        runs.insert(runs.end(), {y, x.grad(), w.grad(), b.grad()});
      }
      for (std::size_t i = 0; i < 4; ++i) CHECK(bit_equal(runs[i], runs[i + 4]));
    }
}

TEST_CASE("conv2d on the CPU: a NaN in x reaches exactly the outputs whose window reads it") {
  // x [1, 1, 5, 5], 3x3 kernel of ones, padding 1: output (a, b) reads
  // x rows a-1..a+1 and columns b-1..b+1.
  std::vector<double> xv(25, 1.0);
  xv[2 * 5 + 3] = NAN;  // row 2, column 3
  Tensor x = Tensor::from_vector(xv, {1, 1, 5, 5});
  Tensor y = conv2d(x, ones({1, 1, 3, 3}, TensorOptions{}.with_dtype(DType::f64)), Tensor(), {1, 1}, {1, 1});
  const std::vector<double> v = values(y);
  for (std::int64_t a = 0; a < 5; ++a)
    for (std::int64_t b = 0; b < 5; ++b) {
      const bool reads = std::abs(a - 2) <= 1 && std::abs(b - 3) <= 1;
      INFO("output (", a, ", ", b, ")");
      CHECK(std::isnan(v[static_cast<std::size_t>(a * 5 + b)]) == reads);
    }
}

TEST_CASE("conv2d: errors name conv2d and the argument, and nothing is recorded") {
  Tensor x = zeros({2, 4, 5, 5}), w = zeros({6, 4, 3, 3});
  auto expect = [](const std::function<void()>& f, const char* arg) {
    try {
      f();
      FAIL_CHECK("no error for ", arg);
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.op() == "conv2d");
      CHECK(e.arg() == arg);
    }
  };
  expect([&] { conv2d(zeros({4, 5, 5}), w); }, "x");
  expect([&] { conv2d(x, zeros({6, 3, 3, 3})); }, "weight");
  expect([&] { conv2d(zeros({2, 3, 5, 5}), zeros({6, 1, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2); }, "groups");
  expect([&] { conv2d(x, zeros({6, 4, 7, 3})); }, "weight");
  expect([&] { conv2d(x, w, Tensor(), {0, 1}); }, "stride");
  expect([&] { conv2d(x, w, Tensor(), {1, 1}, {0, -1}); }, "padding");
  expect([&] { conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {0, 1}); }, "dilation");
  expect([&] { conv2d(x, w, zeros({5})); }, "bias");
  expect([&] { conv2d(x, zeros({6, 4, 3, 3}, TensorOptions{}.with_dtype(DType::f64))); }, "weight");
}

TEST_CASE("nn::Conv2d: PyTorch kaiming-uniform bounds, deterministic per seed, names, forward = conv2d") {
  Generator g1(3), g2(3);
  nn::Conv2dOptions o;
  o.stride = {2, 1};
  o.padding = {1, 1};
  o.groups = 2;
  nn::Conv2d a(4, 6, {3, 2}, g1, o), b(4, 6, {3, 2}, g2, o);
  CHECK(bit_equal(a.weight(), b.weight()));
  CHECK(bit_equal(a.bias(), b.bias()));
  CHECK(a.weight().shape() == Shape{6, 2, 3, 2});
  CHECK(a.bias().shape() == Shape{6});
  const double bound = 1.0 / std::sqrt(2.0 * 3 * 2);  // fan_in = in / groups · kh · kw
  double widest = 0;
  for (double v : values(a.weight())) widest = std::max(widest, std::fabs(v));
  CHECK(widest <= bound);
  CHECK(widest > 0.8 * bound);  // uniform over the whole range, not a narrower one
  for (double v : values(a.bias())) CHECK(std::fabs(v) <= bound);
  CHECK(a.weight().requires_grad());
  auto np = a.named_parameters();
  REQUIRE(np.size() == 2);
  CHECK(np[0].first == "weight");
  CHECK(np[1].first == "bias");
  CHECK(a.type_name() == "Conv2d");

  Tensor x = seeded({2, 4, 7, 5}, 4, DType::f32, Device::cpu(), false);
  Tensor y = a.forward(x);
  CHECK(bit_equal(y, conv2d(x, a.weight(), a.bias(), {2, 1}, {1, 1}, {1, 1}, 2)));
  sum(y).backward();
  CHECK(a.weight().grad().defined());
  CHECK(a.bias().grad().defined());

  nn::Conv2dOptions no_bias;
  no_bias.bias = false;
  CHECK(nn::Conv2d(3, 3, {1, 1}, g1, no_bias).named_parameters().size() == 1);
  CHECK_THROWS_AS(nn::Conv2d(0, 3, {3, 3}, g1), Error);
  CHECK_THROWS_AS(nn::Conv2d(3, 3, {0, 3}, g1), Error);
  nn::Conv2dOptions bad_groups;
  bad_groups.groups = 2;
  CHECK_THROWS_AS(nn::Conv2d(3, 4, {3, 3}, g1, bad_groups), Error);
  CHECK_THROWS_AS(nn::Conv2d(3, 3, {3, 3}, g1, {}, TensorOptions{}.with_dtype(DType::s32)), Error);
}

TEST_CASE("cuda conv2d agrees with the CPU in every dtype and repeats bit for bit (GPU)") {
  QGRAD_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  for (const Config& c : configs())
    for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
      INFO("config ", c.name, ", ", std::string(dtype_name(dt)));
      std::vector<Tensor> cpu, cuda, again;
      for (auto* out : {&cpu, &cuda, &again}) {
        const Device d = out == &cpu ? Device::cpu() : gpu;
        Tensor x = seeded(c.x, 21, dt, d, true), w = seeded(c.w, 22, dt, d, true);
        Tensor b = c.bias ? seeded({c.w[0]}, 23, dt, d, true) : Tensor();
        Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
        y.backward(seeded(y.shape(), 24, dt, d, false));
        *out = {y, x.grad(), w.grad()};
        if (c.bias) out->push_back(b.grad());
      }
      // The registry's promise (docs/ops.md): relative to max(1, max |cpu|).
      const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-4 : dt == DType::f16 ? 1e-2 : 6e-2;
      for (std::size_t i = 0; i < cpu.size(); ++i) {
        check_close(values(cuda[i]), values(cpu[i]), tol, "cuda vs cpu, output " + std::to_string(i));
        CHECK(bit_equal(cuda[i], again[i]));
      }
      if (c.bias) CHECK(bit_equal(cuda.back(), cpu.back()));  // the bias gradient: one kernel, one order
    }
}

TEST_CASE("conv2d with TF32 allowed: f32 on CUDA within the TF32 bound, deterministic; the CPU and other dtypes unchanged") {
  // The switch is process-wide: restored whatever happens below.
  const ConvTf32 restore(false);
  CHECK_FALSE(conv_allow_tf32());
  set_conv_allow_tf32(true);
  CHECK(conv_allow_tf32());

  // The CPU ignores it: the same bits as with it off.
  {
    const Config& c = configs()[0];
    std::vector<Tensor> on, off;
    for (bool tf32 : {true, false}) {
      set_conv_allow_tf32(tf32);
      Tensor x = seeded(c.x, 31, DType::f32, Device::cpu(), true), w = seeded(c.w, 32, DType::f32, Device::cpu(), true);
      Tensor y = conv2d(x, w, Tensor(), c.stride, c.padding, c.dilation, c.groups);
      y.backward(seeded(y.shape(), 33, DType::f32, Device::cpu(), false));
      std::vector<Tensor>& out = tf32 ? on : off;
      out = std::vector<Tensor>{y, x.grad(), w.grad()};
    }
    for (std::size_t i = 0; i < on.size(); ++i) CHECK(bit_equal(on[i], off[i]));
  }
  set_conv_allow_tf32(true);
  if (!cuda_available()) {
    MESSAGE("skipping the CUDA part: no GPU");
    return;
  }
  const Device gpu = Device::cuda(0);
  auto abs_values = [](const Tensor& t) {
    std::vector<double> v = values(t);
    for (double& e : v) e = std::fabs(e);
    return v;
  };
  for (const Config& c : configs()) {
    INFO("config ", c.name);
    std::vector<Tensor> run, again;
    Tensor x, w, b, dy;
    for (auto* out : {&run, &again}) {
      x = seeded(c.x, 41, DType::f32, gpu, true), w = seeded(c.w, 42, DType::f32, gpu, true);
      b = c.bias ? seeded({c.w[0]}, 43, DType::f32, gpu, true) : Tensor();
      Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
      dy = seeded(y.shape(), 44, DType::f32, gpu, false);
      y.backward(dy);
      *out = std::vector<Tensor>{y, x.grad(), w.grad()};
    }
    for (std::size_t i = 0; i < run.size(); ++i) CHECK(bit_equal(run[i], again[i]));
    const std::int64_t oh = run[0].size(2), ow = run[0].size(3);
    const Reference r = reference(c, values(x), values(w), c.bias ? values(b) : std::vector<double>{}, values(dy), oh, ow);
    // Each product's operands rounded (or truncated) to TF32's 10 mantissa
    // bits: error <= 2^-9 of |w| |x| per term, f32 accumulation besides; a
    // transform engine (Winograd, FFT) rounds its transformed operands, so
    // the test allows 8x that against the sum of the terms' magnitudes.
    const Reference bound = reference(c, abs_values(x), abs_values(w), c.bias ? abs_values(b) : std::vector<double>{},
                                      abs_values(dy), oh, ow);
    const std::vector<double>* want[] = {&r.y, &r.dx, &r.dw};
    const std::vector<double>* mag[] = {&bound.y, &bound.dx, &bound.dw};
    for (std::size_t i = 0; i < run.size(); ++i) {
      const std::vector<double> got = values(run[i]);
      REQUIRE(got.size() == want[i]->size());
      double worst = 0;
      for (std::size_t k = 0; k < got.size(); ++k)
        worst = std::max(worst, std::fabs(got[k] - (*want[i])[k]) / ((*mag[i])[k] * 0x1p-9 + 1e-6));
      INFO("output ", i, ": worst error in units of 2^-9 of the terms' magnitude ", worst);
      CHECK(worst <= 8.0);
    }
  }
  // f64 ignores it: the same bits as with it off.
  const Config& c = configs()[12];
  std::vector<Tensor> on, off;
  for (bool tf32 : {true, false}) {
    set_conv_allow_tf32(tf32);
    Tensor x = seeded(c.x, 51, DType::f64, gpu, false), w = seeded(c.w, 52, DType::f64, gpu, false);
    (tf32 ? on : off).push_back(conv2d(x, w, Tensor(), c.stride, c.padding, c.dilation, c.groups));
  }
  CHECK(bit_equal(on[0], off[0]));
}

TEST_CASE("to_channels_last: [a, b, h, w] -> [a, h, w, b] in every dtype and device, tile edges included") {
  // b and inner multiples of 4 (the last two cases): f32 on CUDA takes the
  // 16-byte copy, its partial tiles (36 = 32 + 4 channels, 196 = 6 x 32 + 4
  // positions) included.
  struct Case {
    std::int64_t a, b, h, w;
    std::int64_t inner() const { return h * w; }
  };
  for (Device d : test_devices())
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::s8})
      for (Case c : {Case{3, 37, 5, 9}, Case{2, 64, 3, 3}, Case{1, 5, 1, 1}, Case{3, 36, 7, 4}, Case{2, 64, 14, 14}}) {
        INFO(std::string(dtype_name(dt)), " on ", d.str(), ", a ", c.a, " b ", c.b, " inner ", c.inner());
        Generator g(61);
        const TensorOptions o = TensorOptions{}.with_device(d);
        Tensor in = dt == DType::s8 ? randint(-128, 128, {c.a, c.b, c.h, c.w}, g, TensorOptions(o).with_dtype(dt))
                                    : randn({c.a, c.b, c.h, c.w}, g, TensorOptions(o).with_dtype(dt));
        Tensor out = Tensor::empty({c.a, c.h, c.w, c.b}, TensorOptions(o).with_dtype(dt));
        poison(out);
        kernels::to_channels_last(in, out);
        const std::vector<double> vi = values(in), vo = values(out);
        std::size_t wrong = 0;
        for (std::int64_t a = 0; a < c.a; ++a)
          for (std::int64_t b = 0; b < c.b; ++b)
            for (std::int64_t j = 0; j < c.inner(); ++j) {
              const auto src = static_cast<std::size_t>((a * c.b + b) * c.inner() + j);
              const auto dst = static_cast<std::size_t>((a * c.inner() + j) * c.b + b);
              if (!(vo[dst] == vi[src])) ++wrong;
            }
        CHECK(wrong == 0);
      }
}

TEST_CASE("conv2d's channels-last staging: where it applies, and the staged passes agree with the NCHW ones (GPU)") {
  QGRAD_REQUIRE_GPU();
  const ConvTf32 restore(conv_allow_tf32());
  const Device gpu = Device::cuda(0);
  kernels::Conv2dShape s;
  s.n = 4, s.c = 16, s.h = 18, s.w = 16, s.o = 32, s.kh = 3, s.kw = 3, s.oh = 18, s.ow = 16, s.ph = 1, s.pw = 1;
  s.allow_tf32 = true;
  CHECK(kernels::conv2d_stages_channels_last(s, DType::f32, gpu));
  CHECK_FALSE(kernels::conv2d_stages_channels_last(s, DType::f32, Device::cpu()));
  CHECK_FALSE(kernels::conv2d_stages_channels_last(s, DType::f64, gpu));
  CHECK_FALSE(kernels::conv2d_stages_channels_last(s, DType::bf16, gpu));
  kernels::Conv2dShape exact = s;
  exact.allow_tf32 = false;
  CHECK_FALSE(kernels::conv2d_stages_channels_last(exact, DType::f32, gpu));
  kernels::Conv2dShape grouped = s;
  grouped.groups = 2;
  CHECK_FALSE(kernels::conv2d_stages_channels_last(grouped, DType::f32, gpu));
  kernels::Conv2dShape odd = s;
  odd.o = 30;
  CHECK_FALSE(kernels::conv2d_stages_channels_last(odd, DType::f32, gpu));

  // conv2d with grad (staged) against the NCHW kernels on the same operands
  // (other engines: TF32 both, so within TF32's rounding of each other).
  set_conv_allow_tf32(true);
  Tensor x = seeded({s.n, s.c, s.h, s.w}, 71, DType::f32, gpu, true);
  Tensor w = seeded({s.o, s.c, s.kh, s.kw}, 72, DType::f32, gpu, true);
  Tensor b = seeded({s.o}, 73, DType::f32, gpu, true);
  Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
  Tensor dy = seeded(y.shape(), 74, DType::f32, gpu, false);
  y.backward(dy);
  Tensor y_ref = Tensor::empty(y.shape(), TensorOptions{}.with_device(gpu)), dx_ref = empty_like(x),
         dw_ref = empty_like(w);
  for (const Tensor& t : {y_ref, dx_ref, dw_ref}) poison(t);
  kernels::conv2d_forward(s, x.detach(), w.detach(), y_ref);
  kernels::add_channel_bias(y_ref, b.detach(), s.o, s.oh * s.ow);
  kernels::conv2d_backward_input(s, dy, w.detach(), dx_ref);
  kernels::conv2d_backward_weight(s, x.detach(), dy, dw_ref);
  check_close(values(y), values(y_ref), 4e-3, "forward");
  check_close(values(x.grad()), values(dx_ref), 4e-3, "input gradient");
  check_close(values(w.grad()), values(dw_ref), 4e-3, "weight gradient");
  // The saved state: the staged copies, the same bytes as x and the weight.
  Tensor y2 = conv2d(x, w, b, {1, 1}, {1, 1});
  REQUIRE(y2.grad_fn());
  CHECK(y2.grad_fn()->saved_bytes == x.nbytes() + w.nbytes());
}

TEST_CASE("conv2d forks its weight and bias gradients onto the side stream: the same bits as one stream (GPU)") {
  // ops/conv.cpp: dW and db run on the side stream (core/device.h), dx on
  // the main stream beside them; the same kernels on the same data. Staged
  // (TF32, channels-last) and NCHW passes; every subset of gradients that
  // includes a parameter; none forks without one.
  QGRAD_REQUIRE_GPU();
  const ConvTf32 restore(conv_allow_tf32());
  const Device gpu = Device::cuda(0);
  struct Case {
    const char* name;
    bool tf32, need_x, need_w, need_b;
  };
  for (const Case& c : {Case{"staged, all", true, true, true, true}, Case{"f32, all", false, true, true, true},
                        Case{"f32, weight only", false, false, true, false},
                        Case{"f32, x and bias", false, true, false, true}, Case{"f32, x only", false, true, false, false}}) {
    INFO(c.name);
    set_conv_allow_tf32(c.tf32);
    const auto run = [&](bool side) {
      const SideStream stream(side);
      Tensor x = seeded({4, 16, 18, 16}, 81, DType::f32, gpu, c.need_x);
      Tensor w = seeded({32, 16, 3, 3}, 82, DType::f32, gpu, c.need_w);
      Tensor b = seeded({32}, 83, DType::f32, gpu, c.need_b);
      Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
      const std::uint64_t forks = cuda_side_stream_fork_count();
      y.backward(seeded(y.shape(), 84, DType::f32, gpu, false));
      const bool forked = cuda_side_stream_fork_count() > forks;
      return std::make_pair(std::vector<Tensor>{x.grad(), w.grad(), b.grad()}, forked);
    };
    const auto [on, forked] = run(true);
    const auto [off, forked_off] = run(false);
    CHECK(forked == (c.need_w || c.need_b));
    CHECK_FALSE(forked_off);
    const bool need[] = {c.need_x, c.need_w, c.need_b};
    for (std::size_t i = 0; i < 3; ++i) {
      INFO("gradient ", i);
      REQUIRE(on[i].defined() == need[i]);
      REQUIRE(off[i].defined() == need[i]);
      if (!need[i]) continue;
      CHECK(bit_equal(on[i], off[i]));
      const std::vector<double> v = values(on[i]);
      CHECK(std::count(v.begin(), v.end(), 0.0) == 0);  // a real gradient, not an unwritten buffer
    }
  }
}

TEST_CASE("side-stream gradients summed with main-stream ones: on the side, folded, the same bits as one stream (GPU)") {
  // autograd/engine.cpp: a folded Conv-BN's pattern (f = batch_norm_scale_factor
  // (gamma, running_var), the weight channel_mul(w, f), conv2d, the output
  // divided by f). conv2d's weight gradient comes from the side stream, so
  // channel_mul's rule runs there and folds channel_div_add's main-stream
  // gradient for f after the side waits for the main stream; with `extra`,
  // the scaled weight and gamma also feed main-stream ops, so a pending
  // gradient and a leaf's sum a side and a main term (on the side). Every
  // gradient the same bits, and the same folds, as on one stream.
  QGRAD_REQUIRE_GPU();
  const ConvTf32 restore(conv_allow_tf32());
  set_conv_allow_tf32(false);
  const Device gpu = Device::cuda(0);
  for (const bool extra : {false, true}) {
    INFO("extra uses ", extra);
    const auto run = [&](bool side) {
      const SideStream stream(side);
      Tensor x = seeded({4, 8, 10, 9}, 91, DType::f32, gpu, true);
      Tensor w = seeded({16, 8, 3, 3}, 92, DType::f32, gpu, true);
      Tensor gamma = seeded({16}, 93, DType::f32, gpu, true);
      const Tensor r = seeded({16}, 94, DType::f32, gpu, false), running_var = add(mul(r, r), 0.5);
      const Tensor dz = seeded({4, 16, 10, 9}, 95, DType::f32, gpu, false);
      const Tensor f = batch_norm_scale_factor(gamma, running_var, 1e-5);
      const Tensor wf = channel_mul(w, f, 0);
      Tensor loss = sum(mul(channel_div_add(conv2d(x, wf, Tensor(), {1, 1}, {1, 1}), f), dz));
      if (extra) {
        loss = add(loss, sum(mul(wf, seeded(wf.shape(), 96, DType::f32, gpu, false))));
        loss = add(loss, sum(mul(gamma, seeded({16}, 97, DType::f32, gpu, false))));
      }
      const std::uint64_t folds = folded_gradient_count(), forks = cuda_side_stream_fork_count();
      loss.backward(Tensor());
      const bool forked = cuda_side_stream_fork_count() > forks;
      return std::make_tuple(std::vector<Tensor>{x.grad(), w.grad(), gamma.grad()}, folded_gradient_count() - folds,
                             forked);
    };
    const auto [on, folds_on, forked] = run(true);
    const auto [off, folds_off, forked_off] = run(false);
    CHECK(forked);
    CHECK_FALSE(forked_off);
    CHECK(folds_off >= 1);
    CHECK(folds_on == folds_off);  // channel_mul on the side still took f's pending gradient
    for (std::size_t i = 0; i < on.size(); ++i) {
      INFO("gradient ", i);
      CHECK(bit_equal(on[i], off[i]));
      // Without the extra uses gamma's gradient is the fold's cancellation
      // (conv(x, w·f) / f does not depend on f): rounding residues, some 0.
      if (i == 2 && !extra) continue;
      const std::vector<double> v = values(on[i]);
      CHECK(std::count(v.begin(), v.end(), 0.0) == 0);
    }
  }
}

TEST_CASE("conv2d on CUDA adds a 16-bit bias after the convolution, as PyTorch does: conv2d without bias + bias, bit for bit (GPU)") {
  // ops/conv.cpp: PyTorch's _convolution runs cuDNN without the bias and then
  // output.add_(bias), so a 16-bit output rounds twice; qgrad's CUDA path does
  // the same in every dtype (the CPU accumulates onto the bias: one
  // rounding). A first layer (the direct kernel) and a cuDNN shape.
  QGRAD_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    for (const auto& shapes : {std::pair<Shape, Shape>{{4, 1, 12, 10}, {8, 1, 3, 3}},
                               std::pair<Shape, Shape>{{2, 16, 9, 11}, {32, 16, 3, 3}}}) {
      const Shape& xs = shapes.first;
      const Shape& ws = shapes.second;
      INFO(dtype_name(dt), " x ", shape_str(xs));
      const Tensor x = seeded(xs, 61, dt, gpu, false), w = seeded(ws, 62, dt, gpu, false);
      const Tensor b = seeded({ws[0]}, 63, dt, gpu, false);
      const Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
      const Tensor want = add(conv2d(x, w, Tensor(), {1, 1}, {1, 1}), b.reshape({1, ws[0], 1, 1}));
      CHECK(bit_equal(y, want));
      const std::vector<double> v = values(y);
      CHECK(std::count_if(v.begin(), v.end(), [](double e) { return !std::isfinite(e); }) == 0);
    }
  }
}
