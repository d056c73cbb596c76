// quantized_conv2d: a host reference (independent scalar loops over the
// convolution, the activation quantization in its documented float sequence,
// exact int64 accumulation, quantized_linear's epilogue) on seeded random
// inputs over strides, padding, dilation, groups and depthwise; closeness to
// the f64 convolution of the dequantized operands; the N = 0 batch; zero
// padding meaning the zero point; non-finite inputs; bad inputs; CPU/CUDA
// identity.
#include <algorithm>
#include <array>
#include <cmath>

#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

using Pair = std::array<std::int64_t, 2>;

struct Case {
  Shape x, w;
  Pair stride, padding, dilation;
  std::int64_t groups;
};

const Case kCases[] = {
    {{2, 3, 6, 5}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
    {{2, 3, 7, 6}, {5, 3, 3, 2}, {2, 2}, {1, 2}, {1, 1}, 1},
    {{2, 4, 7, 7}, {6, 2, 3, 3}, {1, 2}, {1, 1}, {2, 2}, 2},   // groups, dilation
    {{2, 3, 6, 6}, {6, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 3},   // depthwise, 2 per channel
    {{3, 8, 5, 5}, {8, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 8},   // depthwise, 1 per channel
    {{2, 32, 4, 3}, {7, 32, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1}, // 1x1, K = 32
    {{1, 5, 9, 4}, {3, 5, 2, 4}, {3, 1}, {0, 2}, {2, 1}, 1},   // rectangular everything
    {{2, 16, 8, 8}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
};

struct Weights {
  Tensor w_q, w_scale, bias;
};

Weights make_weights(const Shape& w, std::uint64_t seed, bool bias = true) {
  Generator g(seed);
  Weights r;
  r.w_q = randint(-128, 128, w, g, TensorOptions{}.with_dtype(DType::s8));
  r.w_scale = rand({w[0]}, g, {}, 0.001, 0.02);
  if (bias) r.bias = randn({w[0]}, g);
  return r;
}

Tensor make_x(const Shape& shape, DType dt, std::uint64_t seed) {
  Generator g(seed);
  return randn(shape, g, TensorOptions{}.with_dtype(dt), 0.5, 2.0);
}

ActivationQuant act_of(float scale, std::int32_t zp, std::int64_t qmin, std::int64_t qmax, Device d = Device::cpu()) {
  return ActivationQuant::fixed(Tensor::from_vector(std::vector<float>{scale}, {1}, d),
                                Tensor::from_vector(std::vector<std::int32_t>{zp}, {1}, d), qmin, qmax);
}

// a_q - za for one value, in Mq (float; double for an f64 input): NaN ->
// qmin, +-inf saturate, ties to even.
template <class Mq>
int ref_quant(double x, float scale, int za, int qmin, int qmax) {
  const Mq inv = Mq(1) / static_cast<Mq>(scale);
  const Mq r = std::nearbyint(static_cast<Mq>(x) * inv) + Mq(za);
  int q = qmin;
  if (r >= Mq(qmax)) q = qmax;
  else if (r >= Mq(qmin)) q = static_cast<int>(r);
  return q - za;
}

struct Ref {
  Shape shape;
  std::vector<std::int64_t> acc;  // exact sums, NCHW
};

// The exact integer convolution of the quantized activation (zero where the
// window reads padding) with w_q.
Ref ref_acc(const Tensor& x, const Tensor& w_q, float sa, int za, int qmin, int qmax, const Case& c) {
  const std::int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const std::int64_t O = w_q.size(0), kh = w_q.size(2), kw = w_q.size(3), G = c.groups, Cg = C / G, Og = O / G;
  const std::int64_t OH = (H + 2 * c.padding[0] - c.dilation[0] * (kh - 1) - 1) / c.stride[0] + 1;
  const std::int64_t OW = (W + 2 * c.padding[1] - c.dilation[1] * (kw - 1) - 1) / c.stride[1] + 1;
  const auto xv = values(x), wv = values(w_q);
  std::vector<int> aq(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i)
    aq[i] = x.dtype() == DType::f64 ? ref_quant<double>(xv[i], sa, za, qmin, qmax)
                                    : ref_quant<float>(xv[i], sa, za, qmin, qmax);
  Ref r{{N, O, OH, OW}, std::vector<std::int64_t>(static_cast<std::size_t>(N * O * OH * OW), 0)};
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o) {
      const std::int64_t g = o / Og;
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          std::int64_t acc = 0;
          for (std::int64_t ci = 0; ci < Cg; ++ci)
            for (std::int64_t i = 0; i < kh; ++i)
              for (std::int64_t j = 0; j < kw; ++j) {
                const std::int64_t ih = oh * c.stride[0] - c.padding[0] + i * c.dilation[0];
                const std::int64_t iw = ow * c.stride[1] - c.padding[1] + j * c.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const std::int64_t ch = g * Cg + ci;
                acc += static_cast<std::int64_t>(aq[static_cast<std::size_t>(((n * C + ch) * H + ih) * W + iw)]) *
                       static_cast<std::int64_t>(wv[static_cast<std::size_t>(((o * Cg + ci) * kh + i) * kw + j)]);
              }
          r.acc[static_cast<std::size_t>(((n * O + o) * OH + oh) * OW + ow)] = acc;
        }
    }
  return r;
}

// The documented epilogue: f32 math (f64 for an f64 output), rounded once.
Tensor ref_output(const Ref& r, float sa, const Weights& wt, DType out) {
  const auto sw = values(wt.w_scale);
  const auto bv = wt.bias.defined() ? values(wt.bias) : std::vector<double>();
  const std::int64_t O = r.shape[1], P = r.shape[2] * r.shape[3];
  if (out == DType::f64) {
    std::vector<double> y(r.acc.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      const std::int64_t o = (static_cast<std::int64_t>(i) / P) % O;
      double v = static_cast<double>(static_cast<std::int32_t>(r.acc[i])) * (double(sa) * sw[static_cast<std::size_t>(o)]);
      if (!bv.empty()) v = v + bv[static_cast<std::size_t>(o)];
      y[i] = v;
    }
    return Tensor::from_vector(y, r.shape);
  }
  std::vector<float> y(r.acc.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    const std::int64_t o = (static_cast<std::int64_t>(i) / P) % O;
    float v = static_cast<float>(static_cast<std::int32_t>(r.acc[i])) *
              (sa * static_cast<float>(sw[static_cast<std::size_t>(o)]));
    if (!bv.empty()) v = v + static_cast<float>(bv[static_cast<std::size_t>(o)]);
    y[i] = v;
  }
  return Tensor::from_vector(y, r.shape).to(out);
}

Tensor run(const Tensor& x, const Weights& wt, const ActivationQuant& a, const Case& c, DType out = DType::f32) {
  return quantized_conv2d(x, wt.w_q, wt.w_scale, wt.bias, a, c.stride, c.padding, c.dilation, c.groups, out);
}

Weights weights_on(const Weights& w, Device d) {
  return {w.w_q.to(d), w.w_scale.to(d), w.bias.defined() ? w.bias.to(d) : Tensor()};
}

}  // namespace

TEST_CASE("quantized_conv2d matches the host reference: strides, padding, dilation, groups, depthwise") {
  std::uint64_t seed = 100;
  for (const Case& c : kCases) {
    const Weights wt = make_weights(c.w, seed++);
    const Tensor x = make_x(c.x, DType::f32, seed++);
    for (auto row : {std::tuple<float, int, int, int>{0.02f, 0, -127, 127},
                                      std::tuple<float, int, int, int>{0.03f, 37, 0, 127},
                                      std::tuple<float, int, int, int>{0.05f, 128, 0, 255}}) {
      const auto& sa = std::get<0>(row);
      const auto& za = std::get<1>(row);
      const auto& qmin = std::get<2>(row);
      const auto& qmax = std::get<3>(row);
      const Ref r = ref_acc(x, wt.w_q, sa, za, qmin, qmax, c);
      for (DType out : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
        INFO("x ", shape_str(c.x), " w ", shape_str(c.w), " groups ", c.groups, " zp ", za, " out ", dtype_name(out));
        const Tensor y = run(x, wt, act_of(sa, za, qmin, qmax), c, out);
        CHECK(y.shape() == r.shape);
        CHECK(bit_equal(y, ref_output(r, sa, wt, out)));
      }
    }
  }
}

TEST_CASE("quantized_conv2d: every input dtype, no bias") {
  const Case c = kCases[2];
  const Weights wt = make_weights(c.w, 7, false);
  for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    INFO("x dtype ", dtype_name(dt));
    const Tensor x = make_x(c.x, dt, 8);
    const Ref r = ref_acc(x, wt.w_q, 0.04f, 3, 0, 127, c);
    CHECK(bit_equal(run(x, wt, act_of(0.04f, 3, 0, 127), c), ref_output(r, 0.04f, wt, DType::f32)));
  }
}

TEST_CASE("quantized_conv2d is close to the f64 convolution of its dequantized operands") {
  const Case c = kCases[7];
  const Weights wt = make_weights(c.w, 11);
  const Tensor x = make_x(c.x, DType::f32, 12);
  const float sa = 0.03f;
  const int za = 10;
  const Tensor y = run(x, wt, act_of(sa, za, 0, 127), c);
  // f64: (a_q - za) sa ⋆ w_q sw + bias, every product and sum exact or nearly.
  const auto xv = values(x);
  std::vector<double> xd(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) xd[i] = ref_quant<float>(xv[i], sa, za, 0, 127) * double(sa);
  const auto wq = values(wt.w_q), sw = values(wt.w_scale);
  std::vector<double> wd(wq.size());
  const std::size_t per_o = wq.size() / static_cast<std::size_t>(c.w[0]);
  for (std::size_t i = 0; i < wq.size(); ++i) wd[i] = wq[i] * sw[i / per_o];
  const Tensor y64 = conv2d(Tensor::from_vector(xd, c.x), Tensor::from_vector(wd, c.w), wt.bias.to(DType::f64),
                            c.stride, c.padding, c.dilation, c.groups);
  const auto a = values(y), b = values(y64);
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / (1 + std::fabs(b[i])));
  CHECK(worst < 1e-5);
}

TEST_CASE("quantized_conv2d: the zero padding is the zero point (a zero input gives exactly the bias)") {
  const Case c{{2, 3, 4, 4}, {5, 3, 3, 3}, {1, 1}, {2, 2}, {1, 1}, 1};
  const Weights wt = make_weights(c.w, 21);
  const Tensor x = zeros(c.x);
  for (int za : {0, 17, 100}) {
    const Tensor y = run(x, wt, act_of(0.1f, za, 0, 127), c);
    const auto yv = values(y), bv = values(wt.bias);
    bool all_bias = true;
    for (std::size_t i = 0; i < yv.size(); ++i)
      all_bias = all_bias && yv[i] == static_cast<double>(static_cast<float>(bv[(i / 36) % 5]));
    CHECK(all_bias);
  }
}

TEST_CASE("quantized_conv2d: N = 0 gives an empty [0, O, OH, OW] and non-finite inputs saturate") {
  const Case c = kCases[0];
  const Weights wt = make_weights(c.w, 31);
  const Tensor y = run(zeros({0, 3, 6, 5}), wt, act_of(0.1f, 0, -127, 127), c);
  CHECK(y.shape() == Shape{0, 4, 6, 5});
  std::vector<float> xv = make_x(c.x, DType::f32, 32).to_vector<float>();
  xv[0] = NAN;
  xv[7] = INFINITY;
  xv[19] = -INFINITY;
  xv[40] = 0.05f * 2.5f;  // a tie at scale 0.05
  xv[41] = -0.0f;
  const Tensor x = Tensor::from_vector(xv, c.x);
  const Ref r = ref_acc(x, wt.w_q, 0.05f, 4, 0, 127, c);
  CHECK(bit_equal(run(x, wt, act_of(0.05f, 4, 0, 127), c), ref_output(r, 0.05f, wt, DType::f32)));
}

TEST_CASE("quantized_conv2d bad inputs name the op and the argument") {
  const Weights wt = make_weights({6, 4, 3, 3}, 41);
  const Tensor x = make_x({2, 4, 5, 5}, DType::f32, 42);
  const ActivationQuant a = act_of(0.1f, 0, -127, 127);
  auto expect = [](const char* arg, auto&& f) {
    INFO("argument ", arg);
    try {
      f();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.op() == "quantized_conv2d");
      CHECK(e.arg() == arg);
    }
  };
  expect("x", [&] { quantized_conv2d(zeros({4, 5, 5}), wt.w_q, wt.w_scale, wt.bias, a); });
  expect("w_q", [&] { quantized_conv2d(x, wt.w_q.reshape({6, 36}), wt.w_scale, wt.bias, a); });
  expect("groups", [&] { quantized_conv2d(zeros({1, 3, 5, 5}), wt.w_q, wt.w_scale, wt.bias, a, {1, 1}, {0, 0}, {1, 1}, 2); });
  expect("w_q", [&] { quantized_conv2d(zeros({1, 4, 2, 2}), wt.w_q, wt.w_scale, wt.bias, a); });  // 3x3 > 2x2
  expect("x", [&] { quantized_conv2d(zeros({1, 4, 0, 5}), wt.w_q, wt.w_scale, wt.bias, a, {1, 1}, {2, 2}); });
  expect("w_q", [&] { quantized_conv2d(x, wt.w_q.to(DType::u8), wt.w_scale, wt.bias, a); });
  expect("x", [&] { quantized_conv2d(x.to(DType::s8), wt.w_q, wt.w_scale, wt.bias, a); });
  expect("w_scale", [&] { quantized_conv2d(x, wt.w_q, wt.w_scale.to(DType::f64), wt.bias, a); });
  expect("act.kind", [&] { quantized_conv2d(x, wt.w_q, wt.w_scale, wt.bias, ActivationQuant::dynamic()); });
  if (has_gpu()) {
    expect("w_q", [&] { quantized_conv2d(x, wt.w_q.cuda(), wt.w_scale, wt.bias, a); });
    expect("bias", [&] { quantized_conv2d(x, wt.w_q, wt.w_scale, wt.bias.cuda(), a); });
  }
}

TEST_CASE("quantized_conv2d on CUDA matches the CPU bit for bit") {
  QGRAD_REQUIRE_GPU();
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({{4, 64, 14, 14}, {64, 64, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1});  // cuBLASLt, K = 576
  cases.push_back({{8, 1, 28, 28}, {32, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1});     // K = 9, padded to 16
  cases.push_back({{2, 64, 9, 9}, {64, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 64});    // depthwise, 64 groups
  std::uint64_t seed = 500;
  for (const Case& c : cases) {
    const Weights wt = make_weights(c.w, seed++);
    const Weights wg = weights_on(wt, Device::cuda(0));
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      const Tensor x = make_x(c.x, dt, seed++);
      for (DType out : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
        INFO("x ", shape_str(c.x), " w ", shape_str(c.w), " groups ", c.groups, " x ", dtype_name(dt), " out ",
             dtype_name(out));
        const Tensor cpu = run(x, wt, act_of(0.03f, 9, 0, 127), c, out);
        CHECK(bit_equal(run(x.cuda(), wg, act_of(0.03f, 9, 0, 127), c, out), cpu));                  // host qparams
        CHECK(bit_equal(run(x.cuda(), wg, act_of(0.03f, 9, 0, 127, Device::cuda(0)), c, out), cpu));  // device
      }
    }
  }
  const Tensor empty = run(zeros({0, 3, 6, 5}, TensorOptions{}.with_device(Device::cuda(0))),
                           weights_on(make_weights({4, 3, 3, 3}, 9), Device::cuda(0)), act_of(0.1f, 0, -127, 127),
                           kCases[0]);
  CHECK(empty.shape() == Shape{0, 4, 6, 5});
}
