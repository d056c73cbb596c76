// QAT recipes (nn/recipes.h, issue #14 item 3): the 8da4w and fp8 fake
// quantizers against host transcriptions of torchao's f32 formulas (bit for
// bit), their straight-through gradients, choose_qparams_affine, the QAT
// linears' forward and gradients against a host composition, prepare_qat /
// convert per recipe, and bad input.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "helpers.h"
#include "train_ops_helpers.h"
#include "qgrad/core/float8.h"
#include "qgrad/nn/nn.h"
#include "qgrad/ops/lowbit.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

// torchao's _choose_qparams_affine in f32 for blocks of `block` consecutive
// elements (per token: block = the row length).
struct HostQ {
  std::vector<float> scale;
  std::vector<int> zp;
};
HostQ host_qparams(const std::vector<float>& x, std::size_t block, bool symmetric, int qmin, int qmax, float eps) {
  HostQ q;
  for (std::size_t b0 = 0; b0 < x.size(); b0 += block) {
    float mn = INFINITY, mx = -INFINITY;
    for (std::size_t i = b0; i < b0 + block; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
    const float min_neg = std::min(mn, 0.0f), max_pos = std::max(mx, 0.0f);
    float s = symmetric ? std::max(-min_neg, max_pos) / (static_cast<float>(qmax - qmin) / 2.0f)
                        : (max_pos - min_neg) / static_cast<float>(qmax - qmin);
    s = std::max(s, eps);
    const int z = symmetric ? (qmax + qmin + 1) / 2
                            : static_cast<int>(std::clamp<float>(static_cast<float>(qmin) - std::nearbyint(min_neg / s),
                                                                 static_cast<float>(qmin), static_cast<float>(qmax)));
    q.scale.push_back(s);
    q.zp.push_back(z);
  }
  return q;
}

// _fake_quantize_affine in f32: values and the straight-through mask.
void host_fake_quant(const std::vector<float>& x, std::size_t block, const HostQ& q, int qmin, int qmax,
                     std::vector<float>& y, std::vector<double>& mask) {
  y.resize(x.size());
  mask.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float s = q.scale[i / block], inv = 1.0f / s;
    const float v = std::nearbyint(x[i] * inv) + static_cast<float>(q.zp[i / block]);
    mask[i] = (v >= qmin && v <= qmax) ? 1.0 : 0.0;
    const float c = std::clamp(v, static_cast<float>(qmin), static_cast<float>(qmax));
    y[i] = (c - static_cast<float>(q.zp[i / block])) * s;
  }
}

std::vector<float> host_fp8(const std::vector<float>& x) {
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float s = std::max(amax, 1e-12f) / 448.0f;
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float c = std::clamp(x[i] / s, -448.0f, 448.0f);
    y[i] = f8e4m3_bits_to_float(float_to_f8e4m3_bits(c)) * s;
  }
  return y;
}

std::vector<float> f32s(const Tensor& t) { return t.detach().cpu().to(DType::f32).to_vector<float>(); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Tensor randn_leaf(const Shape& s, std::uint64_t seed, Device d, double stddev = 1.0) {
  Generator g(seed);
  Tensor t = randn(s, g, TensorOptions{}.with_device(d), 0.0, stddev);
  t.set_requires_grad(true);
  return t;
}

std::shared_ptr<nn::Sequential> mlp(std::int64_t in, std::int64_t hidden, std::int64_t out, std::uint64_t seed) {
  Generator g(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->emplace_back<nn::Linear>(in, hidden, g);
  m->emplace_back<nn::ReLU>();
  m->emplace_back<nn::Linear>(hidden, out, g);
  return m;
}

}  // namespace

TEST_CASE("recipes: parse_recipe and recipe_name") {
  CHECK(nn::parse_recipe("int8") == nn::Recipe::int8);
  CHECK(nn::parse_recipe("8da4w") == nn::Recipe::w8da4);
  CHECK(nn::parse_recipe("fp8") == nn::Recipe::fp8);
  for (auto r : {nn::Recipe::int8, nn::Recipe::w8da4, nn::Recipe::fp8})
    CHECK(nn::parse_recipe(nn::recipe_name(r)) == r);
  for (const char* bad : {"", "int4", "8DA4W", "w8da4", "fp8 ", "e4m3"})
    check_error([&] { nn::parse_recipe(bad); }, "parse_recipe", "recipe");
}

TEST_CASE("recipes: choose_qparams_affine equals torchao's f32 formulas (token, group, eps floor)") {
  for (const Device d : test_devices()) {
    Generator g(11);
    std::vector<float> v = randn({8, 64}, g).to_vector<float>();
    for (std::size_t i = 0; i < 64; ++i) {
      v[i] = 0.0f;                                            // all zero: scale = eps
      v[64 + i] = 1e-6f * static_cast<float>(i % 5);          // range below 255 * eps: the eps floor binds
      v[128 + i] = std::fabs(v[128 + i]) + 0.5f;              // all positive: min_neg = 0
      v[192 + i] = -std::fabs(v[192 + i]) * 3.0f - 0.1f;      // all negative
    }
    const Tensor x = Tensor::from_vector(v, {8, 64}).to(d);
    const float eps = FLT_EPSILON;
    struct Case {
      QuantScope scope;
      std::size_t block;
      QuantMode mode;
      int qmin, qmax;
      float eps;
    };
    for (const Case c : {Case{QuantScope::per_token(), 64, QuantMode::asymmetric, -128, 127, eps},
                         Case{QuantScope::per_token(), 64, QuantMode::symmetric, -128, 127, eps},
                         Case{QuantScope::per_group(-1, 32), 32, QuantMode::symmetric, -8, 7, 1e-6f},
                         Case{QuantScope::per_group(-1, 16), 16, QuantMode::asymmetric, 0, 15, 1e-3f},
                         Case{QuantScope::per_tensor(), 512, QuantMode::asymmetric, -128, 127, eps}}) {
      const AffineQparams q = choose_qparams_affine(x, c.scope, c.mode, c.qmin, c.qmax, c.eps);
      const HostQ h = host_qparams(v, c.block, c.mode == QuantMode::symmetric, c.qmin, c.qmax, c.eps);
      CHECK(same_bits(f32s(q.scale), h.scale));
      const auto z = q.zero_point.cpu().to_vector<std::int32_t>();
      CHECK(std::vector<int>(z.begin(), z.end()) == h.zp);
    }
    // The all-zero and the tiny row take the floor.
    const auto s = f32s(choose_qparams_affine(x, QuantScope::per_token(), QuantMode::asymmetric, -128, 127, eps).scale);
    CHECK(s[0] == eps);
    CHECK(s[1] == eps);
  }
}

TEST_CASE("recipes: 8da4w activation fake quant equals torchao's per-token formula, straight-through gradient") {
  for (const Device d : test_devices()) {
    Tensor x = randn_leaf({16, 96}, 5, d, 2.0);
    // Row 0 spans [-3, 3]: 3 * float(1/scale) = 127.5 exactly (torch: the
    // same f32 values) -> 128 with zp 0, out of range (mask 0): the
    // straight-through gradient is the clamp's, not all ones.
    std::vector<float> v = f32s(x);
    for (std::size_t i = 0; i < 96; ++i) v[i] = (i % 2 ? 3.0f : -3.0f) * static_cast<float>(i % 7) / 6.0f;
    v[0] = -3.0f;
    v[1] = 3.0f;
    x = Tensor::from_vector(v, {16, 96}).to(d);
    x.set_requires_grad(true);
    const Tensor y = nn::fake_quantize_8da4w_activation(x);
    const HostQ h = host_qparams(v, 96, false, -128, 127, FLT_EPSILON);
    std::vector<float> ry;
    std::vector<double> mask;
    host_fake_quant(v, 96, h, -128, 127, ry, mask);
    CHECK(same_bits(f32s(y), ry));
    CHECK(mask[1] == 0.0);  // 127.5 rounds (half to even) to 128
    Generator g(7);
    const Tensor dy = randn({16, 96}, g).to(d);
    y.backward(dy);
    const auto gx = values(x.grad()), gy = values(dy);
    std::size_t zeros = 0;
    for (std::size_t i = 0; i < gx.size(); ++i) {
      CHECK(gx[i] == gy[i] * mask[i]);
      zeros += mask[i] == 0.0;
    }
    CHECK(zeros >= 1);
  }
}

TEST_CASE("recipes: gelu_fake_quantize_dynamic is gelu then fake_quantize_dynamic, bit for bit, on each device") {
  // Rows the CUDA row kernel takes (128, 512: one fused kernel each way) and
  // one it leaves to the composition (64); f64 is always the composition.
  const Shape shapes[] = {{3, 5, 128}, {4, 512}, {6, 64}};
  const float eps = FLT_EPSILON;
  const auto tok = QuantScope::per_token();
  for (const Device d : test_devices())
    for (const DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
      for (const Shape& s : shapes)
        for (const GeluApproximate a : {GeluApproximate::none, GeluApproximate::tanh}) {
          CAPTURE(d.str());
          CAPTURE(dtype_name(dt));
          CAPTURE(s.back());
          Generator g(31);
          const Tensor x0 = randn(s, g, TensorOptions{}, 0.0, 2.0), dy0 = randn(s, g);
          Tensor x1 = x0.to(dt).to(d), x2 = x0.to(dt).to(d);
          x1.set_requires_grad(true);
          x2.set_requires_grad(true);
          const QuantMode mode = a == GeluApproximate::none ? QuantMode::asymmetric : QuantMode::symmetric;
          if (d.is_cuda()) prepoison(s, dt);
          const Tensor y1 = gelu_fake_quantize_dynamic(x1, a, tok, mode, -128, 127, eps);
          const Tensor y2 = fake_quantize_dynamic(gelu(x2, a), tok, mode, -128, 127, eps);
          CHECK(bit_equal(y1, y2));
          const auto v = values(y1);
          CHECK(std::none_of(v.begin(), v.end(), [](double e) { return std::isnan(e); }));
          const Tensor dy = dy0.to(dt).to(d);
          if (d.is_cuda()) prepoison(s, dt);
          y1.backward(dy);
          y2.backward(dy);
          CHECK(bit_equal(x1.grad(), x2.grad()));
          const auto gx = values(x1.grad());
          CHECK(std::count(gx.begin(), gx.end(), 0.0) < static_cast<std::ptrdiff_t>(gx.size()));
        }
  // An 8da8w QAT linear after a GELU: forward_gelu is forward(gelu(.)), values and gradients.
  for (const Device d : test_devices()) {
    Generator g(32);
    nn::Linear lin(128, 16, g, true, TensorOptions{}.with_device(d));
    nn::Int8DynActInt8WeightQATLinear q(lin);
    Tensor h1 = randn({8, 128}, g, TensorOptions{}.with_device(d), 0.0, 2.0).detach(), h2 = h1.detach();
    h1.set_requires_grad(true);
    h2.set_requires_grad(true);
    const Tensor y1 = q.forward_gelu(h1, GeluApproximate::none);
    const Tensor w1 = [&] {
      sum(y1).backward();
      return q.weight().grad().detach().clone();
    }();
    q.weight().zero_grad();
    const Tensor y2 = q.forward(gelu(h2));
    sum(y2).backward();
    CHECK(bit_equal(y1, y2));
    CHECK(bit_equal(h1.grad(), h2.grad()));
    CHECK(bit_equal(w1, q.weight().grad()));
  }
}

TEST_CASE("recipes: fake_quantize_dynamic_batch is fake_quantize_dynamic of each tensor, values and gradients") {
  // Per channel: rows of 128 (two tensors, one batch), 512, 64 (not the row
  // kernel's) and a rank-3 tensor; per token: rows of 256 and 384. f64: the composition.
  const Shape shapes[] = {{384, 128}, {128, 128}, {64, 512}, {16, 64}, {2, 3, 256}, {5, 384}};
  for (const Device d : test_devices())
    for (const DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
      for (const bool per_token : {false, true}) {
        CAPTURE(d.str());
        CAPTURE(dtype_name(dt));
        CAPTURE(per_token);
        const QuantScope scope = per_token ? QuantScope::per_token() : QuantScope::per_channel(0);
        const QuantMode mode = per_token ? QuantMode::asymmetric : QuantMode::symmetric;
        Generator g(52);
        std::vector<Tensor> xa, xb, dys;
        for (const Shape& s : shapes) {
          const Tensor x0 = randn(s, g, TensorOptions{}, 0.0, 2.0).to(dt).to(d);
          xa.push_back(param(x0.clone().detach()));
          xb.push_back(param(x0.clone().detach()));
          dys.push_back(randn(s, g).to(dt).to(d));
        }
        if (d.is_cuda()) prepoison(shapes[0], dt);
        const std::vector<Tensor> ya = fake_quantize_dynamic_batch(xa, scope, mode, -128, 127, FLT_EPSILON);
        REQUIRE(ya.size() == xa.size());
        for (std::size_t i = 0; i < xa.size(); ++i) {
          CAPTURE(i);
          const Tensor yb = fake_quantize_dynamic(xb[i], scope, mode, -128, 127, FLT_EPSILON);
          CHECK(bit_equal(ya[i], yb));
          ya[i].backward(dys[i]);
          yb.backward(dys[i]);
          CHECK(bit_equal(xa[i].grad(), xb[i].grad()));
        }
        // Symmetric per channel clamps each row's largest positive value (+127.5 steps): some zero gradients.
        if (!per_token) {
          const std::vector<double> g0 = values(xa[0].grad());
          CHECK(std::count(g0.begin(), g0.end(), 0.0) > 0);
        }
      }
}

// out_dtype: to_batch of the results, the same values and gradients bit for
// bit, where CUDA's row kernel took a tensor (the cast inside the op, its
// gradient cast back in the mask's pass) and elsewhere (to_batch); leaves
// (the pass deferred) and non-leaves (run at once); narrowing and widening.
TEST_CASE("recipes: fake_quantize_dynamic_batch's out_dtype is to_batch of its results, values and gradients") {
  const Shape shapes[] = {{384, 128}, {128, 128}, {16, 64}};
  struct Dtypes {
    DType in, out;
  };
  for (const Device d : test_devices())
    for (const Dtypes t : {Dtypes{DType::f32, DType::bf16}, Dtypes{DType::f32, DType::f16},
                           Dtypes{DType::bf16, DType::f32}, Dtypes{DType::f64, DType::f32}})
      for (const bool leaf : {true, false}) {
        CAPTURE(d.str());
        CAPTURE(dtype_name(t.in));
        CAPTURE(dtype_name(t.out));
        CAPTURE(leaf);
        Generator g(53);
        std::vector<Tensor> la, lb, dys;
        for (const Shape& s : shapes) {
          const Tensor x0 = randn(s, g, TensorOptions{}, 0.0, 2.0).to(t.in).to(d);
          la.push_back(param(x0.clone().detach()));
          lb.push_back(param(x0.clone().detach()));
          dys.push_back(randn(s, g).to(t.out).to(d));
        }
        // Non-leaves: x * 1, whose gradient reaches the leaf unchanged.
        auto inputs = [&](const std::vector<Tensor>& ls) {
          std::vector<Tensor> xs;
          for (const Tensor& l : ls) xs.push_back(leaf ? l : mul(l, 1.0));
          return xs;
        };
        const auto ch0 = QuantScope::per_channel(0);
        if (d.is_cuda()) prepoison(shapes[0], t.out);
        const std::vector<Tensor> ya =
            fake_quantize_dynamic_batch(inputs(la), ch0, QuantMode::symmetric, -128, 127, FLT_EPSILON, t.out);
        const std::vector<Tensor> yb =
            to_batch(fake_quantize_dynamic_batch(inputs(lb), ch0, QuantMode::symmetric, -128, 127, FLT_EPSILON), t.out);
        REQUIRE(ya.size() == yb.size());
        for (std::size_t i = 0; i < ya.size(); ++i) {
          CAPTURE(i);
          CHECK(ya[i].dtype() == t.out);
          CHECK(bit_equal(ya[i], yb[i]));
        }
        Tensor lossa = sum(mul(ya[0], dys[0])), lossb = sum(mul(yb[0], dys[0]));
        for (std::size_t i = 1; i < ya.size(); ++i) {
          lossa = add(lossa, sum(mul(ya[i], dys[i])));
          lossb = add(lossb, sum(mul(yb[i], dys[i])));
        }
        lossa.backward();
        lossb.backward();
        for (std::size_t i = 0; i < la.size(); ++i) {
          CAPTURE(i);
          CHECK(la[i].grad().dtype() == t.in);
          CHECK(bit_equal(la[i].grad(), lb[i].grad()));
        }
        const std::vector<double> g0 = values(la[0].grad());  // the clamp's zeros are there
        CHECK(std::count(g0.begin(), g0.end(), 0.0) > 0);
      }
}

TEST_CASE("recipes: layer_norm_fake_quantize_dynamic is layer_norm then fake_quantize_dynamic, bit for bit, each device") {
  // Rows the CUDA kernel takes (128, 384), one it leaves to the composition
  // (96), and a normalized shape of two dims (the composition); with and
  // without weight and bias; f64 is always the composition.
  struct Case {
    Shape x, normalized;
    bool affine;
  };
  const Case cases[] = {{{3, 5, 128}, {128}, true}, {{4, 384}, {384}, false}, {{6, 96}, {96}, true},
                        {{2, 4, 32}, {4, 32}, true}};
  const float eps = FLT_EPSILON;
  for (const Device d : test_devices())
    for (const DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
      for (const Case& c : cases)
        for (const QuantMode mode : {QuantMode::asymmetric, QuantMode::symmetric}) {
          CAPTURE(d.str());
          CAPTURE(dtype_name(dt));
          CAPTURE(c.x.back());
          Generator g(41);
          const Tensor x0 = randn(c.x, g, TensorOptions{}, 0.5, 2.0), dy0 = randn(c.x, g);
          const Tensor w0 = randn(c.normalized, g, TensorOptions{}, 1.0, 0.5), b0 = randn(c.normalized, g);
          auto leaf_of = [&](const Tensor& t) {
            Tensor l = t.to(dt).to(d);
            l.set_requires_grad(true);
            return l;
          };
          Tensor x1 = leaf_of(x0), x2 = leaf_of(x0), w1 = leaf_of(w0), w2 = leaf_of(w0), b1 = leaf_of(b0),
                 b2 = leaf_of(b0);
          if (!c.affine) w1 = w2 = b1 = b2 = Tensor();
          if (d.is_cuda()) prepoison(c.x, dt);
          const Tensor y1 = layer_norm_fake_quantize_dynamic(x1, c.normalized, w1, b1, 1e-5, mode, -128, 127, eps);
          const Tensor y2 = fake_quantize_dynamic(layer_norm(x2, c.normalized, w2, b2, 1e-5), QuantScope::per_token(),
                                                  mode, -128, 127, eps);
          CHECK(bit_equal(y1, y2));
          const auto v = values(y1);
          CHECK(std::none_of(v.begin(), v.end(), [](double e) { return std::isnan(e); }));
          const Tensor dy = dy0.to(dt).to(d);
          if (d.is_cuda()) prepoison(c.x, dt);
          y1.backward(dy);
          y2.backward(dy);
          CHECK(bit_equal(x1.grad(), x2.grad()));
          if (c.affine) {
            CHECK(bit_equal(w1.grad(), w2.grad()));
            CHECK(bit_equal(b1.grad(), b2.grad()));
          }
        }
  // An 8da8w QAT linear after a LayerNorm: forward_layer_norm is forward(ln.forward(.)),
  // in f32 and under bf16 mixed precision (x already bf16: the fused op on the norm's bf16 casts).
  for (const Device d : test_devices())
    for (const bool mixed : {false, true}) {
    CAPTURE(mixed);
    Generator g(42);
    nn::Linear lin(128, 16, g, true, TensorOptions{}.with_device(d));
    nn::Int8DynActInt8WeightQATLinear q(lin);
    nn::LayerNorm ln({128}, 1e-5, true, true, TensorOptions{}.with_device(d));
    if (mixed) {
      q.set_compute_dtype(DType::bf16);
      ln.set_compute_dtype(DType::bf16);
      NoGradGuard ng;  // a weight and bias other than ones and zeros
      ln.weight().copy_(randn({128}, g, TensorOptions{}.with_device(d), 1.0, 0.3));
      ln.bias().copy_(randn({128}, g, TensorOptions{}.with_device(d), 0.0, 0.3));
    }
    Tensor h1 = randn({8, 128}, g, TensorOptions{}.with_device(d), 0.0, 2.0).to(mixed ? DType::bf16 : DType::f32).detach(),
           h2 = h1.detach();
    h1.set_requires_grad(true);
    h2.set_requires_grad(true);
    const Tensor y1 = q.forward_layer_norm(h1, ln);
    sum(y1).backward();
    const Tensor gw = q.weight().grad().detach().clone(), gln = ln.weight().grad().detach().clone();
    q.weight().zero_grad();
    ln.weight().zero_grad();
    const Tensor y2 = q.forward(ln.forward(h2));
    sum(y2).backward();
    CHECK(bit_equal(y1, y2));
    CHECK(bit_equal(h1.grad(), h2.grad()));
    CHECK(bit_equal(gw, q.weight().grad()));
    CHECK(bit_equal(gln, ln.weight().grad()));
    CHECK(y1.dtype() == (mixed ? DType::bf16 : DType::f32));
  }
}

TEST_CASE("recipes: the per-token row kernels on +-0, ties, huge and subnormal values: the CPU's bits, values and masks") {
  // CUDA's row kernels take the min/max by min.NaN / max.NaN (redoing a row
  // that holds a NaN with the combines) and fake-quantize in FakeQuantOp's
  // float form; the CPU takes the combines and its own forms. Rows of 128
  // and 256 (the row kernels' lengths) with special values in some rows:
  // fake_quantize_dynamic per token (both modes) and layer_norm's fused form
  // against the CPU, values and input gradients (the masks). The GELU
  // prologue against gelu then fake_quantize_dynamic on the same device
  // (gelu's erf is libdevice's on CUDA and glibc's on the CPU: not the same
  // bits, docs/ops.md). Finite values only: rows holding NaN or an infinity
  // are the next test's.
  const auto tok = QuantScope::per_token();
  for (const std::int64_t d : {128, 256})
    for (const DType dt : {DType::f32, DType::bf16, DType::f16}) {
      CAPTURE(d);
      CAPTURE(dtype_name(dt));
      const std::int64_t rows = 12;
      Generator g(53);
      std::vector<float> xv = f32s(randn({rows, d}, g, TensorOptions{}, 0.0, 2.0));
      const float big = dt == DType::f16 ? 6e4f : 1e30f;
      const float specials[] = {0.0f, -0.0f, 0.5f, 0.0f, -0.0f, -2.5f, big, -big, 3.0f, 1e-40f};
      // Row r < 10: specials[r] at three places; rows 3 and 4 all +-0 around
      // them; row 5 on a grid of halves (ties after scaling); rows 10, 11 as drawn.
      for (std::int64_t r = 0; r < 10; ++r) {
        float* row = xv.data() + r * d;
        if (r == 3 || r == 4)
          for (std::int64_t j = 0; j < d; ++j) row[j] = j % 2 ? 0.0f : -0.0f;
        if (r == 5)
          for (std::int64_t j = 0; j < d; ++j) row[j] = static_cast<float>((j * 7) % 33 - 16) * 0.5f;
        for (const std::int64_t j : {std::int64_t{1}, d / 2, d - 1}) row[j] = specials[r];
      }
      const Tensor x0 = Tensor::from_vector(xv, {rows, d}), dy0 = randn({rows, d}, g);
      const Tensor w0 = randn({d}, g, TensorOptions{}, 1.0, 0.5), b0 = randn({d}, g);
      const auto run = [&](Device dev, int form, QuantMode mode) {
        // A copy: to() of x0 in its own dtype and device is x0 itself, which must stay a plain tensor.
        Tensor x = x0.to(dt).to(dev).clone().detach();
        x.set_requires_grad(true);
        const Tensor w = w0.to(dt).to(dev), b = b0.to(dt).to(dev);
        if (dev.is_cuda()) prepoison({rows, d}, dt);
        // Forms: 0 fake_quantize_dynamic, 1 its GELU prologue, 2 layer_norm's fused form, 3 gelu then form 0.
        const Tensor y = form == 0   ? fake_quantize_dynamic(x, tok, mode, -128, 127, FLT_EPSILON)
                         : form == 1 ? gelu_fake_quantize_dynamic(x, GeluApproximate::none, tok, mode, -128, 127,
                                                                  FLT_EPSILON)
                         : form == 2 ? layer_norm_fake_quantize_dynamic(x, {d}, w, b, 1e-5, mode, -128, 127,
                                                                        FLT_EPSILON)
                                     : fake_quantize_dynamic(gelu(x), tok, mode, -128, 127, FLT_EPSILON);
        y.backward(dy0.to(dt).to(dev));
        return std::pair<Tensor, Tensor>{y.detach().cpu(), x.grad().detach().cpu()};
      };
      for (int form = 0; form < 3; ++form)
        for (const QuantMode mode : {QuantMode::asymmetric, QuantMode::symmetric}) {
          CAPTURE(form);
          CAPTURE(mode == QuantMode::symmetric);
          const auto [y_cpu, gx_cpu] = run(Device::cpu(), form, mode);
          if (form == 0 && mode == QuantMode::asymmetric && dt == DType::f32) {
            // Against torchao's f32 formula: the specials reach the grid as values do.
            std::vector<float> ry;
            std::vector<double> mask;
            host_fake_quant(xv, static_cast<std::size_t>(d), host_qparams(xv, static_cast<std::size_t>(d), false, -128,
                                                                           127, FLT_EPSILON),
                            -128, 127, ry, mask);
            const std::vector<float> got = f32s(y_cpu);
            for (std::int64_t r = 0; r < rows; ++r) {
              CAPTURE(r);
              CHECK(std::memcmp(got.data() + r * d, ry.data() + r * d, static_cast<std::size_t>(d) * 4) == 0);
            }
          }
          for (const Device dev : test_devices()) {
            if (!dev.is_cuda() && form != 1) continue;  // the CPU is the reference itself
            CAPTURE(dev.str());
            const auto [y_dev, gx_dev] = run(dev, form, mode);
            const auto [y_ref, gx_ref] = form == 1 ? run(dev, 3, mode) : std::pair<Tensor, Tensor>{y_cpu, gx_cpu};
            CHECK(bit_equal(y_dev, y_ref));
            CHECK(bit_equal(gx_dev, gx_ref));
          }
        }
    }
}

TEST_CASE("recipes: fake_quantize_dynamic of rows holding NaN or an infinity: the formula's values on each device, no error") {
  // A NaN row: scale NaN, so every element's q is NaN: y = x, gradient 0. A
  // row with +inf (or -inf): scale inf, inv_scale 0, so a finite x gives
  // q = zp, in range, and y = 0 * inf = NaN with its gradient passed; the
  // infinity itself gives q = NaN: y = x, gradient 0. The CPU's composition
  // once rejected the computed scale as if a user had passed it. Rows of 128
  // (CUDA's row kernel) and 96 (the composition on both devices).
  for (const Device dev : test_devices())
    for (const std::int64_t d : {128, 96})
      for (const DType dt : {DType::f32, DType::bf16})
        for (const QuantMode mode : {QuantMode::asymmetric, QuantMode::symmetric}) {
          CAPTURE(dev.str());
          CAPTURE(d);
          CAPTURE(dtype_name(dt));
          CAPTURE(mode == QuantMode::symmetric);
          Generator g(61);
          std::vector<float> xv = f32s(randn({4, d}, g, TensorOptions{}, 0.0, 2.0));
          xv[static_cast<std::size_t>(0 * d + 5)] = NAN;
          xv[static_cast<std::size_t>(1 * d + 7)] = INFINITY;
          xv[static_cast<std::size_t>(2 * d + 9)] = -INFINITY;
          Tensor x = Tensor::from_vector(xv, {4, d}).to(dt).to(dev).clone().detach();
          x.set_requires_grad(true);
          Tensor y;
          CHECK_NOTHROW(y = fake_quantize_dynamic(x, QuantScope::per_token(), mode, -128, 127, FLT_EPSILON));
          REQUIRE(y.defined());
          const Tensor dy = full({4, d}, 1.0, TensorOptions{}.with_dtype(dt).with_device(dev));
          y.backward(dy);
          const std::vector<double> xs = values(x), ys = values(y), gs = values(x.grad());
          for (std::int64_t j = 0; j < d; ++j) {
            const auto at = [&](std::int64_t r) { return static_cast<std::size_t>(r * d + j); };
            // Row 0 (NaN): y = x, gradient 0.
            if (j == 5) CHECK(std::isnan(ys[at(0)]));
            else CHECK(ys[at(0)] == xs[at(0)]);
            CHECK(gs[at(0)] == 0.0);
            // Rows 1, 2 (+-inf): the infinity kept with gradient 0; finite values NaN with gradient 1.
            for (const std::int64_t r : {std::int64_t{1}, std::int64_t{2}}) {
              if (j == 5 + 2 * r) {
                CHECK(ys[at(r)] == xs[at(r)]);
                CHECK(gs[at(r)] == 0.0);
              } else {
                CHECK(std::isnan(ys[at(r)]));
                CHECK(gs[at(r)] == 1.0);
              }
            }
            // Row 3 (finite): on the grid, no NaN.
            CHECK(!std::isnan(ys[at(3)]));
          }
        }
}

TEST_CASE("recipes: 8da4w weight fake quant equals torchao's int4 symmetric per-group formula, straight-through") {
  for (const Device d : test_devices()) {
    for (const std::int64_t group : {32, 64, 128}) {
      const Tensor w = randn_leaf({8, 256}, 100 + static_cast<std::uint64_t>(group), d, 0.1);
      const std::vector<float> v = f32s(w);
      const Tensor y = nn::fake_quantize_8da4w_weight(w, group);
      const HostQ h = host_qparams(v, static_cast<std::size_t>(group), true, -8, 7, FLT_MIN);
      std::vector<float> ry;
      std::vector<double> mask;
      host_fake_quant(v, static_cast<std::size_t>(group), h, -8, 7, ry, mask);
      CHECK(same_bits(f32s(y), ry));
      Generator g(3);
      const Tensor dy = randn({8, 256}, g).to(d);
      y.backward(dy);
      const auto gx = values(w.grad()), gy = values(dy);
      // A positive group max lands on 7.5 (or an ulp off it): 8 is clamped, gradient 0.
      for (std::size_t i = 0; i < gx.size(); ++i) CHECK(gx[i] == gy[i] * mask[i]);
    }
  }
}

TEST_CASE("recipes: fp8 fake quant equals torchao's e4m3 per-tensor formula, gradient passes unchanged") {
  for (const Device d : test_devices()) {
    const Tensor x = randn_leaf({12, 40}, 9, d, 3.0);
    const Tensor y = nn::fake_quantize_fp8_tensor(x);
    CHECK(same_bits(f32s(y), host_fp8(f32s(x))));
    Generator g(4);
    const Tensor dy = randn({12, 40}, g).to(d);
    y.backward(dy);
    CHECK(bit_equal(x.grad(), dy));
  }
}

namespace {

// Host linear in f64 of f32 operands: y = a b^T + bias.
std::vector<double> host_linear(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& bias,
                                std::size_t m, std::size_t k, std::size_t n) {
  std::vector<double> y(m * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double s = bias[j];
      for (std::size_t t = 0; t < k; ++t) s += static_cast<double>(a[i * k + t]) * b[j * k + t];
      y[i * n + j] = s;
    }
  return y;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(std::fabs(got[i] - want[i]) <= rtol * std::max(1.0, std::fabs(want[i])), i, ": ", got[i], " vs ",
                  want[i]);
}

}  // namespace

TEST_CASE("recipes: QAT linears: forward and gradients equal the host composition") {
  const std::size_t m = 8, k = 64, n = 12;
  for (const Device d : test_devices()) {
    for (const nn::Recipe r : {nn::Recipe::w8da4, nn::Recipe::fp8}) {
      CAPTURE(nn::recipe_name(r));
      Generator gen(21);
      nn::Linear lin(static_cast<std::int64_t>(k), static_cast<std::int64_t>(n), gen);
      lin.to(d);
      std::shared_ptr<nn::Module> q;
      if (r == nn::Recipe::w8da4) q = std::make_shared<nn::Int8DynActInt4WeightQATLinear>(lin, 32);
      else q = std::make_shared<nn::Float8QATLinear>(lin);
      const Tensor x = randn_leaf({static_cast<std::int64_t>(m), static_cast<std::int64_t>(k)}, 31, d);
      const Tensor y = (*q)(x);
      const auto xv = f32s(x), wv = f32s(lin.weight()), bv = f32s(lin.bias());
      std::vector<float> xq, wq;
      std::vector<double> mx(xv.size(), 1.0), mw(wv.size(), 1.0);
      if (r == nn::Recipe::w8da4) {
        host_fake_quant(xv, k, host_qparams(xv, k, false, -128, 127, FLT_EPSILON), -128, 127, xq, mx);
        host_fake_quant(wv, 32, host_qparams(wv, 32, true, -8, 7, FLT_MIN), -8, 7, wq, mw);
      } else {
        xq = host_fp8(xv);
        wq = host_fp8(wv);
      }
      check_close(values(y), host_linear(xq, wq, bv, m, k, n), 1e-5);
      Generator g(8);
      const Tensor dy = randn({static_cast<std::int64_t>(m), static_cast<std::int64_t>(n)}, g).to(d);
      y.backward(dy);
      const auto gy = values(dy);
      std::vector<double> dx(m * k), dw(n * k), db(n, 0.0);
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t t = 0; t < k; ++t) {
          double s = 0;
          for (std::size_t j = 0; j < n; ++j) s += gy[i * n + j] * wq[j * k + t];
          dx[i * k + t] = s * mx[i * k + t];
        }
      for (std::size_t j = 0; j < n; ++j) {
        for (std::size_t i = 0; i < m; ++i) db[j] += gy[i * n + j];
        for (std::size_t t = 0; t < k; ++t) {
          double s = 0;
          for (std::size_t i = 0; i < m; ++i) s += gy[i * n + j] * xq[i * k + t];
          dw[j * k + t] = s * mw[j * k + t];
        }
      }
      check_close(values(x.grad()), dx, 1e-5);
      check_close(values(lin.weight().grad()), dw, 1e-5);  // the QAT linear shares the Linear's parameters
      check_close(values(lin.bias().grad()), db, 1e-5);
      // Fake quant off: the plain linear.
      nn::enable_recipe_fake_quant(*q, false);
      NoGradGuard ng;
      CHECK(bit_equal((*q)(x), linear(x, lin.weight(), lin.bias())));
    }
  }
}

TEST_CASE("recipes: prepare_qat per recipe swaps the Linear layers and keeps parameter names") {
  for (const nn::Recipe r : {nn::Recipe::int8, nn::Recipe::w8da4, nn::Recipe::fp8}) {
    CAPTURE(nn::recipe_name(r));
    auto m = mlp(64, 32, 10, 1);
    nn::NamedTensors before = m->named_parameters();
    nn::prepare_qat(*m, r);
    const std::string want = r == nn::Recipe::int8    ? "QATLinear"
                             : r == nn::Recipe::w8da4 ? "Int8DynActInt4WeightQATLinear"
                                                      : "Float8QATLinear";
    std::size_t found = 0;
    for (std::size_t i = 0; i < m->size(); ++i) found += (*m)[i]->type_name() == want;
    CHECK(found == 2);
    if (r != nn::Recipe::int8) {
      const nn::NamedTensors after = m->named_parameters();
      REQUIRE(after.size() == before.size());
      for (std::size_t i = 0; i < after.size(); ++i) {
        CHECK(after[i].first == before[i].first);
        CHECK(after[i].second.data_ptr() == before[i].second.data_ptr());  // shared, not copied
      }
    }
    CHECK(nn::float_layers(*m).empty());
    check_error([&] { nn::prepare_qat(*m, r); }, "prepare_qat", "model");  // already prepared
    Generator g(2);
    const Tensor y = (*m)(randn({4, 64}, g));
    CHECK(y.shape() == Shape{4, 10});
  }
}

TEST_CASE("recipes: 8da4w group size not dividing in_features: an error naming group_size, or float with skip") {
  // 784 = 24.5 groups of 32 (the Fashion-MNIST input layer).
  auto m = mlp(784, 64, 10, 3);
  const std::string before = (*m)[0]->type_name();
  check_error([&] { nn::prepare_qat(*m, nn::Recipe::w8da4); }, "prepare_qat", "group_size");
  CHECK((*m)[0]->type_name() == before);  // validated before any change
  CHECK((*m)[2]->type_name() == "Linear");
  nn::RecipeOptions o;
  o.group_size = 0;
  check_error([&] { nn::prepare_qat(*m, nn::Recipe::w8da4, o); }, "prepare_qat", "group_size");
  o.group_size = 32;
  o.skip_indivisible = true;
  nn::prepare_qat(*m, nn::Recipe::w8da4, o);
  CHECK((*m)[0]->type_name() == "Linear");  // torchao's filter: left in float
  CHECK((*m)[2]->type_name() == "Int8DynActInt4WeightQATLinear");
  CHECK(nn::float_layers(*m) == std::vector<std::string>{"0"});
  // Every Linear indivisible: nothing to prepare.
  auto only = std::make_shared<nn::Sequential>();
  Generator g(1);
  only->emplace_back<nn::Linear>(48, 4, g);
  check_error([&] { nn::prepare_qat(*only, nn::Recipe::w8da4, o); }, "prepare_qat", "model");
  // The module itself.
  nn::Linear lin(48, 4, g);
  check_error([&] { nn::Int8DynActInt4WeightQATLinear(lin, 32); }, "Int8DynActInt4WeightQATLinear", "group_size");
  check_error([&] { nn::Int8DynActInt4WeightQATLinear(lin, -16); }, "Int8DynActInt4WeightQATLinear", "group_size");
  check_error([&] { nn::prepare_qat(*only, static_cast<nn::Recipe>(9)); }, "prepare_qat", "recipe");
}

TEST_CASE("recipes: convert per recipe: inference layers whose weights dequantize to the fake-quant weights") {
  for (const Device d : test_devices()) {
    for (const nn::Recipe r : {nn::Recipe::w8da4, nn::Recipe::fp8}) {
      CAPTURE(nn::recipe_name(r));
      auto m = mlp(96, 64, 10, 5);
      m->to(d);
      nn::prepare_qat(*m, r);
      auto c = nn::convert(*m, r);
      REQUIRE(c->size() == 3);
      CHECK((*c)[1]->type_name() == "ReLU");
      for (const std::size_t i : {std::size_t{0}, std::size_t{2}}) {
        if (r == nn::Recipe::w8da4) {
          const auto* q = dynamic_cast<const nn::Int8DynActInt4WeightQATLinear*>((*m)[i].get());
          const auto* l = dynamic_cast<const nn::Int8DynActInt4WeightLinear*>((*c)[i].get());
          REQUIRE(q);
          REQUIRE(l);
          const std::int64_t n = q->weight().size(0), k = q->weight().size(1);
          CHECK(l->weight().dtype() == DType::s4);
          CHECK(l->weight().shape() == Shape{n, k});
          CHECK(l->weight_scale().shape() == Shape{n, k / 32});
          const Tensor zp = zeros({n, k / 32}, TensorOptions{}.with_dtype(DType::s32).with_device(d));
          CHECK(bit_equal(dequantize_int4(l->weight(), l->weight_scale(), zp, 32),
                          nn::fake_quantize_8da4w_weight(q->weight().detach(), 32)));
        } else {
          const auto* q = dynamic_cast<const nn::Float8QATLinear*>((*m)[i].get());
          const auto* l = dynamic_cast<const nn::Float8Linear*>((*c)[i].get());
          REQUIRE(q);
          REQUIRE(l);
          CHECK(l->weight().dtype() == DType::f8e4m3);
          CHECK(l->weight_scale().shape() == Shape{1});
          CHECK(bit_equal(dequantize_fp8(l->weight(), l->weight_scale(), QuantScope::per_tensor()),
                          nn::fake_quantize_fp8_tensor(q->weight().detach())));
        }
      }
      // The converted model computes what the fake-quant model computes, up
      // to the accumulation (int32 group sums; fp8: f32 sums and the bias in bf16).
      Generator g(6);
      const Tensor x = randn({32, 96}, g).to(d);
      NoGradGuard ng;
      const auto yq = values((*m)(x)), yc = values((*c)(x));
      double worst = 0;
      for (std::size_t i = 0; i < yq.size(); ++i) worst = std::max(worst, std::fabs(yq[i] - yc[i]));
      CHECK(worst < (r == nn::Recipe::w8da4 ? 1e-4 : 5e-3));
      // Converting with the other recipe names the layer.
      check_error([&] { nn::convert(*m, r == nn::Recipe::w8da4 ? nn::Recipe::fp8 : nn::Recipe::w8da4); }, "convert",
                  "0");
      // The converted model is a copy: training the QAT model further does not change it.
      const Tensor before = (*c)[0]->state_dict()[0].second.clone();
      m->named_parameters()[0].second.copy_(zeros_like(m->named_parameters()[0].second));
      CHECK(bit_equal((*c)[0]->state_dict()[0].second, before));
    }
  }
}

TEST_CASE("recipes: convert keeps a float layer of an 8da4w model, and bad input of convert and the inference layers") {
  auto m = mlp(784, 64, 10, 3);
  nn::RecipeOptions o;
  o.skip_indivisible = true;
  nn::prepare_qat(*m, nn::Recipe::w8da4, o);
  auto c = nn::convert(*m, nn::Recipe::w8da4);
  CHECK((*c)[0]->type_name() == "Linear");
  CHECK((*c)[2]->type_name() == "Int8DynActInt4WeightLinear");
  Generator g(2);
  const Tensor x = randn({4, 784}, g);
  {
    NoGradGuard ng;
    CHECK(bit_equal((*(*c)[0])(x), (*(*m)[0])(x)));
  }
  auto plain = mlp(64, 32, 10, 1);
  check_error([&] { nn::convert(*plain, nn::Recipe::fp8); }, "convert", "model");  // not prepared
  check_error([&] { nn::convert(*plain, static_cast<nn::Recipe>(7)); }, "convert", "recipe");
  const auto s4 = TensorOptions{}.with_dtype(DType::s4);
  const Tensor wq = zeros({8, 64}, s4), ws = ones({8, 2});
  check_error([&] { nn::Int8DynActInt4WeightLinear(zeros({8, 64}, TensorOptions{}.with_dtype(DType::s8)), ws, Tensor(), 32); },
              "Int8DynActInt4WeightLinear", "weight");
  check_error([&] { nn::Int8DynActInt4WeightLinear(wq, ws, Tensor(), 48); }, "Int8DynActInt4WeightLinear", "group_size");
  check_error([&] { nn::Int8DynActInt4WeightLinear(wq, ones({8, 4}), Tensor(), 32); }, "Int8DynActInt4WeightLinear",
              "weight_scale");
  check_error([&] { nn::Int8DynActInt4WeightLinear(wq, ws, ones({7}), 32); }, "Int8DynActInt4WeightLinear", "bias");
  const Tensor fq = zeros({8, 64}, TensorOptions{}.with_dtype(DType::f8e4m3));
  check_error([&] { nn::Float8Linear(wq, ones({1}), Tensor()); }, "Float8Linear", "weight");
  check_error([&] { nn::Float8Linear(fq, ones({8}), Tensor()); }, "Float8Linear", "weight_scale");
  check_error([&] { nn::Float8Linear(fq, ones({1}), ones({8}, TensorOptions{}.with_dtype(DType::f64))); },
              "Float8Linear", "bias");
}

// ---- 8da8w: the transformer recipe ----

TEST_CASE("recipes: 8da8w parse, and the weight fake quant equals torchao's int8 per-channel symmetric formula") {
  CHECK(nn::parse_recipe("8da8w") == nn::Recipe::w8da8);
  CHECK(std::string(nn::recipe_name(nn::Recipe::w8da8)) == "8da8w");
  for (const Device d : test_devices()) {
    Tensor w = randn_leaf({6, 40}, 21, d, 0.1);
    std::vector<float> v = f32s(w);
    // Row 0 holds +-amax = 127.5 / 256: scale = 1/256 exactly, amax * 256 = 127.5 -> 128 (ties to
    // even), clamped to 127, mask 0; -amax -> -128, in range. Row 5 is all zeros: scale floored at FLT_EPSILON.
    v[0] = 127.5f / 256, v[1] = -127.5f / 256;
    for (std::size_t j = 200; j < 240; ++j) v[j] = 0.0f;
    w = Tensor::from_vector(v, {6, 40}).to(d);
    w.set_requires_grad(true);
    const Tensor y = nn::fake_quantize_8da8w_weight(w);
    const HostQ h = host_qparams(v, 40, true, -128, 127, FLT_EPSILON);
    CHECK(h.scale[0] == 1.0f / 256);
    CHECK(h.scale[5] == FLT_EPSILON);
    std::vector<float> ry;
    std::vector<double> mask;
    host_fake_quant(v, 40, h, -128, 127, ry, mask);
    CHECK(same_bits(f32s(y), ry));
    CHECK(mask[0] == 0.0);
    CHECK(mask[1] == 1.0);
    CHECK(ry[0] == 127.0f * h.scale[0]);
    Generator g(4);
    const Tensor dy = randn({6, 40}, g).to(d);
    y.backward(dy);
    const auto gw = values(w.grad()), gy = values(dy);
    for (std::size_t i = 0; i < gw.size(); ++i) CHECK(gw[i] == gy[i] * mask[i]);
  }
  check_error([] { nn::fake_quantize_8da8w_weight(zeros({8})); }, "fake_quantize_8da8w_weight", "w");
  check_error([] { nn::fake_quantize_8da8w_weight(zeros({2, 3}, TensorOptions{}.with_dtype(DType::s32))); },
              "fake_quantize_8da8w_weight", "w");
}

TEST_CASE("recipes: 8da8w prepare_qat reaches nested Linears (MultiheadAttention, a nested Sequential)") {
  Generator g(8);
  auto inner = std::make_shared<nn::Sequential>();
  inner->emplace_back<nn::Linear>(16, 32, g);
  inner->emplace_back<nn::GELU>();
  inner->emplace_back<nn::Linear>(32, 16, g);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back("attn", std::make_shared<nn::MultiheadAttention>(16, 4, g));
  m->push_back("mlp", inner);
  m->emplace_back<nn::Linear>(16, 3, g);
  const nn::NamedTensors before = m->named_parameters();
  Generator gx(9);
  const Tensor x = randn({2, 5, 16}, gx);
  Tensor y_float;
  {
    NoGradGuard ng;
    y_float = (*m)(x);
  }
  nn::prepare_qat(*m, nn::Recipe::w8da8);
  auto& attn = dynamic_cast<nn::MultiheadAttention&>(*(*m)[0]);
  CHECK(attn.in_proj() == nullptr);
  CHECK(attn.named_children()[0].second->type_name() == "Int8DynActInt8WeightQATLinear");
  CHECK(attn.named_children()[1].second->type_name() == "Int8DynActInt8WeightQATLinear");
  CHECK((*inner)[0]->type_name() == "Int8DynActInt8WeightQATLinear");
  CHECK((*inner)[1]->type_name() == "GELU");
  CHECK((*inner)[2]->type_name() == "Int8DynActInt8WeightQATLinear");
  CHECK((*m)[2]->type_name() == "Int8DynActInt8WeightQATLinear");
  // Same names, same tensors (shared with the float Linears).
  const nn::NamedTensors after = m->named_parameters();
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].first == before[i].first);
    CHECK(after[i].second.impl() == before[i].second.impl());
  }
  // The forward runs the QAT children: fake quant on changes the output, off gives the float output back.
  NoGradGuard ng;
  const Tensor y_qat = (*m)(x);
  CHECK(!bit_equal(y_qat, y_float));
  CHECK(max_abs_diff(y_qat, y_float) < 0.05);
  nn::enable_recipe_fake_quant(*m, false);
  CHECK(bit_equal((*m)(x), y_float));
  nn::enable_recipe_fake_quant(*m, true);
  // Twice, or a model without any Linear: errors naming the model.
  check_error([&] { nn::prepare_qat(*m, nn::Recipe::w8da8); }, "prepare_qat", "model");
  nn::Sequential no_linear;
  no_linear.emplace_back<nn::GELU>();
  check_error([&] { nn::prepare_qat(no_linear, nn::Recipe::w8da8); }, "prepare_qat", "model");
}

TEST_CASE("recipes: 8da8w convert: W8A8 layers at every depth, weights exactly the fake-quant grid, a deep copy") {
  for (const Device d : test_devices()) {
    Generator g(12);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back("attn", std::make_shared<nn::MultiheadAttention>(32, 4, g));
    m->push_back("ln", std::make_shared<nn::LayerNorm>(Shape{32}));
    m->emplace_back<nn::Linear>(32, 10, g);
    m->to(d);
    nn::prepare_qat(*m, nn::Recipe::w8da8);
    auto c = nn::convert(*m, nn::Recipe::w8da8);
    const auto& attn_c = dynamic_cast<const nn::MultiheadAttention&>(*(*c)[0]);
    const auto& attn_q = dynamic_cast<const nn::MultiheadAttention&>(*(*m)[0]);
    for (std::size_t i = 0; i < 2; ++i) {
      const auto* q = dynamic_cast<const nn::Int8DynActInt8WeightQATLinear*>(attn_q.named_children()[i].second.get());
      const auto* l = dynamic_cast<const nn::Int8DynActInt8WeightLinear*>(attn_c.named_children()[i].second.get());
      REQUIRE(q);
      REQUIRE(l);
      const std::int64_t n = q->out_features();
      CHECK(l->weight().dtype() == DType::s8);
      CHECK(l->weight().device() == d);
      const Tensor zp = zeros({n}, TensorOptions{}.with_dtype(DType::s32).with_device(d));
      CHECK(bit_equal(dequantize(l->weight(), l->weight_scale(), zp, QuantScope::per_channel(0)),
                      nn::fake_quantize_8da8w_weight(q->weight().detach())));
      // Row sums of the s8 weight, for the zero-point correction.
      const auto wq = values(l->weight()), rs = values(l->weight_row_sums());
      const std::int64_t k = q->in_features();
      for (std::int64_t r = 0; r < n; ++r) {
        double s = 0;
        for (std::int64_t j = 0; j < k; ++j) s += wq[static_cast<std::size_t>(r * k + j)];
        CHECK(rs[static_cast<std::size_t>(r)] == s);
      }
    }
    CHECK((*c)[1]->type_name() == "LayerNorm");
    CHECK((*c)[2]->type_name() == "Int8DynActInt8WeightLinear");
    CHECK(!c->is_training());
    // The W8A8 model computes what the fake-quant model computes up to the
    // accumulation (exact int32 sums against f32 sums of the same products).
    Generator gx(13);
    const Tensor x = randn({4, 7, 32}, gx).to(d);
    {
      NoGradGuard ng;
      m->eval();
      const Tensor yq = (*m)(x), yc = (*c)(x);
      CHECK(yc.shape() == Shape{4, 7, 10});
      CHECK(max_abs_diff(yq, yc) < 1e-4);
      // A copy: the QAT model's parameters changing later leaves it as it is.
      const Tensor before = yc.clone();
      for (auto& [n, t] : m->named_parameters()) t.copy_(zeros_like(t));
      CHECK(bit_equal((*c)(x), before));
    }
  }
  // Not prepared, or prepared for another recipe: errors.
  auto plain = mlp(16, 8, 4, 1);
  check_error([&] { nn::convert(*plain, nn::Recipe::w8da8); }, "convert", "model");
  nn::prepare_qat(*plain, nn::Recipe::fp8);
  check_error([&] { nn::convert(*plain, nn::Recipe::w8da8); }, "convert", "0");
  // The inference layer's own checks.
  const Tensor w8 = zeros({4, 8}, TensorOptions{}.with_dtype(DType::s8));
  check_error([&] { nn::Int8DynActInt8WeightLinear(zeros({4, 8}), ones({4}), Tensor()); },
              "Int8DynActInt8WeightLinear", "weight");
  check_error([&] { nn::Int8DynActInt8WeightLinear(w8, ones({3}), Tensor()); }, "Int8DynActInt8WeightLinear",
              "weight_scale");
  check_error([&] { nn::Int8DynActInt8WeightLinear(w8, ones({4}), ones({5})); }, "Int8DynActInt8WeightLinear",
              "bias");
  check_error([&] { nn::Int8DynActInt8WeightLinear(w8, ones({4}), Tensor(), ones({4})); },
              "Int8DynActInt8WeightLinear", "weight_row_sums");
}
