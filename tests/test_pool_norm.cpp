// max_pool2d, avg_pool2d, adaptive_avg_pool2d, batch_norm (and
// batch_norm_relu against relu(batch_norm)), flatten: host
// references in double (values, indices, gradients, running statistics),
// PyTorch's edge semantics (NaN, ties, ceil_mode, count_include_pad),
// gradcheck, errors that write nothing, CUDA against the CPU.
#include <algorithm>
#include <limits>
#include <numeric>

#include "qgrad/kernels/pool.h"
#include "train_ops_helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

struct Geo {
  std::int64_t n, c, h, w;
  std::int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
  bool ceil_mode = false;
};

// PyTorch's pooling_output_shape, written out again.
std::int64_t out_size(std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t p, std::int64_t d, bool ceil) {
  const std::int64_t num = in + 2 * p - d * (k - 1) - 1;
  std::int64_t o = (ceil ? (num + s - 1) / s : num / s) + 1;
  if (ceil && (o - 1) * s >= in + p) --o;
  return o;
}

struct MaxRef {
  std::vector<double> y;
  std::vector<std::int64_t> idx;
  std::int64_t oh, ow;
};

// PyTorch's cpu_max_pool: scan the dilated window row-major, keep val when
// val > best or val is NaN.
MaxRef ref_max_pool(const std::vector<double>& x, const Geo& g) {
  MaxRef r;
  r.oh = out_size(g.h, g.kh, g.sh, g.ph, g.dh, g.ceil_mode);
  r.ow = out_size(g.w, g.kw, g.sw, g.pw, g.dw, g.ceil_mode);
  for (std::int64_t pl = 0; pl < g.n * g.c; ++pl)
    for (std::int64_t oh = 0; oh < r.oh; ++oh)
      for (std::int64_t ow = 0; ow < r.ow; ++ow) {
        std::int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
        const std::int64_t h1 = std::min(h0 + (g.kh - 1) * g.dh + 1, g.h), w1 = std::min(w0 + (g.kw - 1) * g.dw + 1, g.w);
        while (h0 < 0) h0 += g.dh;
        while (w0 < 0) w0 += g.dw;
        double best = -INFINITY;
        std::int64_t arg = h0 * g.w + w0;
        for (std::int64_t h = h0; h < h1; h += g.dh)
          for (std::int64_t w = w0; w < w1; w += g.dw) {
            const double v = x[static_cast<std::size_t>(pl * g.h * g.w + h * g.w + w)];
            if (v > best || std::isnan(v)) {
              best = v;
              arg = h * g.w + w;
            }
          }
        r.y.push_back(best);
        r.idx.push_back(arg);
      }
  return r;
}

// PyTorch's cpu_avg_pool (and its backward: each output's gradient / divisor
// scattered over its window).
std::vector<double> ref_avg_pool(const std::vector<double>& x, const Geo& g, bool count_include_pad,
                                 const std::vector<double>* dy = nullptr, std::vector<double>* dx = nullptr) {
  const std::int64_t oh_n = out_size(g.h, g.kh, g.sh, g.ph, 1, g.ceil_mode);
  const std::int64_t ow_n = out_size(g.w, g.kw, g.sw, g.pw, 1, g.ceil_mode);
  std::vector<double> y;
  if (dx) dx->assign(x.size(), 0.0);
  for (std::int64_t pl = 0; pl < g.n * g.c; ++pl)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow) {
        std::int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
        std::int64_t h1 = std::min(h0 + g.kh, g.h + g.ph), w1 = std::min(w0 + g.kw, g.w + g.pw);
        const std::int64_t pool = (h1 - h0) * (w1 - w0);
        h0 = std::max<std::int64_t>(h0, 0);
        w0 = std::max<std::int64_t>(w0, 0);
        h1 = std::min(h1, g.h);
        w1 = std::min(w1, g.w);
        const std::int64_t div = count_include_pad ? pool : (h1 - h0) * (w1 - w0);
        double s = 0;
        for (std::int64_t h = h0; h < h1; ++h)
          for (std::int64_t w = w0; w < w1; ++w) s += x[static_cast<std::size_t>(pl * g.h * g.w + h * g.w + w)];
        y.push_back(s / static_cast<double>(div));
        if (dx) {
          const double gd = (*dy)[y.size() - 1] / static_cast<double>(div);
          for (std::int64_t h = h0; h < h1; ++h)
            for (std::int64_t w = w0; w < w1; ++w) (*dx)[static_cast<std::size_t>(pl * g.h * g.w + h * g.w + w)] += gd;
        }
      }
  return y;
}

// PyTorch's adaptive windows [floor(i H / o), ceil((i + 1) H / o)).
std::vector<double> ref_adaptive(const std::vector<double>& x, std::int64_t planes, std::int64_t H, std::int64_t W,
                                 std::int64_t OH, std::int64_t OW, const std::vector<double>* dy = nullptr,
                                 std::vector<double>* dx = nullptr) {
  std::vector<double> y;
  if (dx) dx->assign(x.size(), 0.0);
  auto start = [](std::int64_t i, std::int64_t in, std::int64_t out) {
    return static_cast<std::int64_t>(std::floor(static_cast<double>(i * in) / static_cast<double>(out)));
  };
  auto end = [](std::int64_t i, std::int64_t in, std::int64_t out) {
    return static_cast<std::int64_t>(std::ceil(static_cast<double>((i + 1) * in) / static_cast<double>(out)));
  };
  for (std::int64_t pl = 0; pl < planes; ++pl)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        const std::int64_t h0 = start(oh, H, OH), h1 = end(oh, H, OH), w0 = start(ow, W, OW), w1 = end(ow, W, OW);
        const double cnt = static_cast<double>((h1 - h0) * (w1 - w0));
        double s = 0;
        for (std::int64_t h = h0; h < h1; ++h)
          for (std::int64_t w = w0; w < w1; ++w) s += x[static_cast<std::size_t>(pl * H * W + h * W + w)];
        y.push_back(s / cnt);
        if (dx)
          for (std::int64_t h = h0; h < h1; ++h)
            for (std::int64_t w = w0; w < w1; ++w)
              (*dx)[static_cast<std::size_t>(pl * H * W + h * W + w)] += (*dy)[y.size() - 1] / cnt;
      }
  return y;
}

// Distinct values in a seeded random order, 1/32 apart (no ties).
Tensor distinct(const Shape& shape, std::uint64_t seed, DType dt = DType::f64) {
  const std::int64_t n = shape_numel(shape);
  const std::vector<double> keys = values(rnd({n}, seed));
  std::vector<std::size_t> order(keys.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  std::vector<double> v(keys.size());
  for (std::size_t j = 0; j < order.size(); ++j) v[order[j]] = (static_cast<double>(j) - static_cast<double>(n / 2)) / 32;
  return Tensor::from_vector(v, shape).to(dt);
}

std::vector<double> as_double(const std::vector<std::int64_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

// ---------------------------------------------------------------- max_pool2d

TEST_CASE("max_pool2d: values and indices match PyTorch's scan for strides, padding, dilation, ceil_mode") {
  const Geo cases[] = {
      {2, 3, 7, 8, 3, 2, 2, 1, 1, 1},            // overlapping rows, padding
      {1, 2, 9, 10, 3, 3, 1, 3, 1, 0, 2, 2},     // dilation 2
      {1, 2, 7, 7, 3, 3, 2, 2, 1, 1, 1, 1, true},  // ceil_mode
      {1, 1, 5, 5, 2, 2, 2, 2, 1, 1, 1, 1, true},  // ceil_mode drops a window starting in the padding
      {2, 2, 6, 5, 2, 2, 2, 2, 0, 0},            // the default stride = kernel
      {1, 1, 4, 4, 1, 1, 1, 1, 0, 0},            // kernel 1: the identity
  };
  for (const Geo& g : cases) {
    Tensor x = rnd({g.n, g.c, g.h, g.w}, static_cast<std::uint64_t>(g.h * 31 + g.w));
    const MaxRef want = ref_max_pool(values(x), g);
    const MaxPool2dResult r =
        max_pool2d_with_indices(x, {g.kh, g.kw}, Size2{g.sh, g.sw}, {g.ph, g.pw}, {g.dh, g.dw}, g.ceil_mode);
    CHECK(r.output.shape() == Shape{g.n, g.c, want.oh, want.ow});
    CHECK(r.indices.dtype() == DType::s64);
    CHECK(values(r.output) == want.y);  // a maximum is exact
    CHECK(values(r.indices) == as_double(want.idx));
    CHECK(bit_equal(max_pool2d(x, {g.kh, g.kw}, Size2{g.sh, g.sw}, {g.ph, g.pw}, {g.dh, g.dw}, g.ceil_mode), r.output));
  }
  // Output sizes of PyTorch (F.max_pool2d on these shapes).
  CHECK(max_pool2d(zeros({1, 1, 5, 5}), 2, Size2{2}, 1, 1, true).shape() == Shape{1, 1, 3, 3});
  CHECK(max_pool2d(zeros({1, 1, 5, 5}), 2, Size2{2}, 0, 1, true).shape() == Shape{1, 1, 3, 3});
  CHECK(max_pool2d(zeros({1, 1, 5, 5}), 2, Size2{2}, 0, 1, false).shape() == Shape{1, 1, 2, 2});
  CHECK(max_pool2d(zeros({1, 1, 7, 7}), 3, Size2{2}, 1, 1, true).shape() == Shape{1, 1, 4, 4});
  CHECK(max_pool2d(zeros({1, 1, 6, 6}), 3, Size2{2}, 0, 1, true).shape() == Shape{1, 1, 3, 3});
}

TEST_CASE("max_pool2d: NaN wins (the last NaN of the window gives the index), ties keep the first") {
  const double nan = NAN, inf = INFINITY;
  // One 2 x 4 plane, windows 2 x 2: [1 1 | nan 5]   -> 1 at index 0 (tie: first), NaN at index 7 (the last NaN)
  //                                  [1 0 | 3 nan]
  Tensor x = Tensor::from_vector<double>({1, 1, nan, 5, 1, 0, 3, nan}, {1, 1, 2, 4});
  for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    const MaxPool2dResult r = max_pool2d_with_indices(x.to(dt), 2);
    const auto y = values(r.output);
    CHECK(y[0] == 1.0);
    CHECK(std::isnan(y[1]));
    CHECK(values(r.indices) == std::vector<double>{0, 7});
  }
  // -inf everywhere: -inf at the window's first element; +-0 tie: the first.
  Tensor z = Tensor::from_vector<double>({-inf, -inf, -0.0, 0.0, -inf, -inf, 0.0, -0.0}, {1, 1, 2, 4});
  const MaxPool2dResult r = max_pool2d_with_indices(z, 2);
  const auto y = values(r.output);
  CHECK(y[0] == -inf);
  CHECK(std::signbit(y[1]));  // -0 comes first and 0 is not > -0
  CHECK(values(r.indices) == std::vector<double>{0, 2});
  // The gradient of a NaN window goes to the NaN's index.
  Tensor xl = param(x.clone());
  max_pool2d(xl, 2).backward(Tensor::from_vector<double>({10, 20}, {1, 1, 1, 2}));
  CHECK(values(xl.grad()) == std::vector<double>{10, 0, 0, 0, 0, 0, 0, 20});
}

TEST_CASE("max_pool2d: backward scatters through the indices (overlapping windows) and passes gradcheck") {
  const Geo g{2, 2, 7, 6, 3, 3, 1, 2, 1, 1};
  Tensor x = param(distinct({g.n, g.c, g.h, g.w}, 5));
  Tensor y = max_pool2d(x, 3, Size2{1, 2}, 1);
  Tensor dy = rnd(y.shape(), 6);
  y.backward(dy);
  const MaxRef want = ref_max_pool(values(x), g);
  std::vector<double> dx(static_cast<std::size_t>(x.numel()), 0.0);
  const auto vdy = values(dy);
  const std::int64_t per_out = want.oh * want.ow, per_in = g.h * g.w;
  for (std::size_t o = 0; o < want.idx.size(); ++o)
    dx[static_cast<std::size_t>(static_cast<std::int64_t>(o) / per_out * per_in + want.idx[o])] += vdy[o];
  check_near(values(x.grad()), dx, 1e-12);
  check_grad([](const std::vector<Tensor>& v) { return max_pool2d(v[0], {3, 2}, Size2{2, 1}, {1, 1}, 1, true); },
             {param(distinct({2, 2, 7, 6}, 7))});
  check_grad([](const std::vector<Tensor>& v) { return max_pool2d(v[0], 2, Size2{1}, 1, 2); },
             {param(distinct({1, 2, 6, 6}, 8))});
}

TEST_CASE("max_pool2d backward: windows that tile the input (one index per window) give the gather's bits") {
  // Tiled: 2x2 stride 2 on even planes; kernel 2 dilation 2 stride 3 (taps
  // 3 apart, the rows between them in no window); kernel 1. Not tiled (the
  // gather): an odd width. dy holds -0.0 (the gradient reaching an argmax
  // is 0 + dy: +0) and dx is poisoned first; f32, every device, CUDA = CPU.
  struct Case {
    Geo g;
    bool tiled;
  };
  const Case cases[] = {{{2, 3, 8, 6, 2, 2, 2, 2, 0, 0}, true},
                        {{1, 2, 9, 6, 2, 2, 3, 3, 0, 0, 2, 2}, true},
                        {{1, 2, 4, 3, 1, 1, 1, 1, 0, 0}, true},
                        {{2, 2, 6, 5, 2, 2, 2, 2, 0, 0}, false}};
  for (const Case& c : cases) {
    const Geo& g = c.g;
    INFO(g.h, "x", g.w, " kernel ", g.kh, " stride ", g.sh, " dilation ", g.dh);
    const Tensor x0 = rnd({g.n, g.c, g.h, g.w}, static_cast<std::uint64_t>(g.h * 7 + g.w), DType::f32);
    const MaxRef want = ref_max_pool(values(x0), g);
    std::vector<float> dy = rnd({g.n, g.c, want.oh, want.ow}, 77, DType::f32).to_vector<float>();
    for (std::size_t o = 0; o < dy.size(); o += 3) dy[o] = -0.0f;
    std::vector<float> dx(static_cast<std::size_t>(x0.numel()), 0.0f);
    const std::int64_t per_out = want.oh * want.ow, per_in = g.h * g.w;
    for (std::size_t o = 0; o < want.idx.size(); ++o)
      dx[static_cast<std::size_t>(static_cast<std::int64_t>(o) / per_out * per_in + want.idx[o])] = 0.0f + dy[o];
    const Tensor expected = Tensor::from_vector(dx, x0.shape());
    CHECK(std::count(dy.begin(), dy.end(), -0.0f) > 0);
    for (const Device dev : test_devices()) {
      INFO(dev.str());
      Tensor x = x0.to(dev).detach();
      x.set_requires_grad(true);
      const MaxPool2dResult r = max_pool2d_with_indices(x, {g.kh, g.kw}, Size2{g.sh, g.sw}, {g.ph, g.pw}, {g.dh, g.dw});
      REQUIRE(r.output.shape() == Shape{g.n, g.c, want.oh, want.ow});
      const Tensor dyt = Tensor::from_vector(dy, r.output.shape()).to(dev);
      r.output.backward(dyt);
      CHECK(bit_equal(x.grad(), expected));
      // The kernel alone into a poisoned output: every element written.
      const formulas::Pool2dGeometry geo{g.n * g.c, g.h,  g.w,  want.oh, want.ow, g.kh, g.kw,
                                         g.sh,      g.sw, g.ph, g.pw,    g.dh,    g.dw};
      CHECK(kernels::windows_tile_input(geo) == c.tiled);
      Tensor dx_k = Tensor::empty(x.shape(), TensorOptions{}.with_device(dev));
      poison(dx_k);
      kernels::max_pool2d_backward(dyt, r.indices, dx_k, geo);
      CHECK(bit_equal(dx_k, expected));
    }
  }
}

TEST_CASE("max_pool2d saves the indices, not the input") {
  Tensor x = param(rnd({2, 3, 8, 8}, 9));
  Tensor y = max_pool2d(x, 2);
  CHECK(y.grad_fn()->saved_bytes == static_cast<std::size_t>(y.numel()) * sizeof(std::int64_t));
  NoGradGuard no_grad;
  CHECK(bit_equal(max_pool2d(x, 2), y));
}

TEST_CASE("fake_quantize_max_pool2d equals max_pool2d(fake_quantize_per_tensor) bit for bit: ties, mask, NaN, -0.0") {
  // Values on a 1/16 grid (so many round to the same multiple of the scale
  // 1/8, ties inside windows), beyond the clamp range on both sides (a mask
  // bit of 0 at the argmax) and NaN; upstream gradients with -0.0 and
  // negative values; tiled windows (the backward's one index per window)
  // and overlapping ones with padding and ceil_mode (the gather). Output,
  // input gradient and saved bytes against the composition, every device
  // and floating dtype (the conformance harness runs it into poisoned blocks).
  struct Case {
    Shape shape;
    Size2 k;
    std::optional<Size2> s;
    Size2 p;
    bool ceil;
  };
  // A plane 132 wide: the CPU's f32 2 x 2 path takes its rows in runs of 64
  // columns (64, 64, 4). 2 x 2 windows: CUDA's outputs in pairs within a row
  // (ow = 66), one at a time where rows are of odd length (ow = 3, 5: planes
  // of 15 outputs, an even and an odd count in all).
  const Case cases[] = {{{2, 3, 8, 6}, 2, std::nullopt, 0, false},
                        {{1, 4, 7, 9}, 3, Size2{2}, 1, true},
                        {{1, 2, 4, 132}, 2, std::nullopt, 0, false},
                        {{2, 3, 6, 10}, 2, std::nullopt, 0, false},
                        {{1, 3, 6, 10}, 2, std::nullopt, 0, false}};
  for (const Case& c : cases) {
    std::vector<double> xv = values(rnd(c.shape, 0xfa, DType::f64, 14.0));
    for (double& v : xv) v = std::floor(v * 16) / 16;
    xv[5] = NAN;
    xv[xv.size() / 2] = -1e30;
    const std::int64_t qmin = -128, qmax = 127;
    for (const Device dev : test_devices()) {
      for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
        INFO(dev.str(), " ", dtype_name(dt), " ", shape_str(c.shape));
        const TensorOptions o = TensorOptions{}.with_device(dev);
        const Tensor x0 = Tensor::from_vector(xv, c.shape).to(dt).to(dev);
        const Tensor scale = full({1}, 0.125, o), zp = full({1}, 3.0, TensorOptions{}.with_device(dev).with_dtype(DType::s32));
        const auto run = [&](bool fused) {
          Tensor x = x0.detach();
          x.set_requires_grad(true);
          Tensor y = fused ? fake_quantize_max_pool2d(x, scale, zp, qmin, qmax, c.k, c.s, c.p, 1, c.ceil)
                           : max_pool2d(fake_quantize_per_tensor(x, scale, zp, qmin, qmax), c.k, c.s, c.p, 1, c.ceil);
          std::vector<double> dv = values(rnd(y.shape(), 0xfb));
          for (std::size_t i = 0; i < dv.size(); i += 3) dv[i] = -0.0;
          y.backward(Tensor::from_vector(dv, y.shape()).to(dt).to(dev));
          return std::pair<Tensor, Tensor>{y, x.grad()};
        };
        const auto [want_y, want_dx] = run(false);
        const auto [got_y, got_dx] = run(true);
        CHECK(bit_equal(got_y, want_y));
        CHECK(bit_equal(got_dx, want_dx));
        // Real values: masked argmaxes (zero gradients) and passed ones.
        const std::vector<double> g = values(want_dx);
        CHECK(std::count_if(g.begin(), g.end(), [](double v) { return v != 0; }) > 4);
        CHECK(std::isnan(values(want_y)[0]) == std::isnan(values(got_y)[0]));
        CHECK(got_y.grad_fn()->saved_bytes == static_cast<std::size_t>(got_y.numel()) * sizeof(std::int32_t));
      }
    }
  }
}

// ---------------------------------------------------------------- avg_pool2d

TEST_CASE("avg_pool2d: PyTorch's divisors (count_include_pad, ceil_mode windows clipped at the end)") {
  const Geo cases[] = {
      {2, 3, 7, 8, 3, 3, 2, 2, 1, 1, 1, 1, true},  // last column window clipped to the padded input
      {1, 2, 5, 7, 2, 3, 1, 2, 1, 0},
      {1, 1, 5, 5, 2, 2, 2, 2, 1, 1, 1, 1, true},
      {2, 1, 6, 6, 2, 2, 2, 2, 0, 0, 1, 1, true},
      {1, 1, 5, 5, 3, 3, 3, 3, 0, 0, 1, 1, true},  // ceil_mode window past the input, no padding
  };
  for (const Geo& g : cases)
    for (const bool include : {true, false}) {
      Tensor x = param(rnd({g.n, g.c, g.h, g.w}, static_cast<std::uint64_t>(g.h * 7 + g.w)));
      Tensor y = avg_pool2d(x, {g.kh, g.kw}, Size2{g.sh, g.sw}, {g.ph, g.pw}, g.ceil_mode, include);
      Tensor dy = rnd(y.shape(), 3);
      std::vector<double> dx;
      const auto vdy = values(dy);
      const auto want = ref_avg_pool(values(x), g, include, &vdy, &dx);
      CHECK(y.numel() == static_cast<std::int64_t>(want.size()));
      check_near(values(y), want, 1e-12);
      y.backward(dy);
      check_near(values(x.grad()), dx, 1e-12);
      check_grad(
          [g, include](const std::vector<Tensor>& v) {
            return avg_pool2d(v[0], {g.kh, g.kw}, Size2{g.sh, g.sw}, {g.ph, g.pw}, g.ceil_mode, include);
          },
          {param(rnd({g.n, g.c, g.h, g.w}, 4))});
    }
  // A value PyTorch gives: F.avg_pool2d(ones(1,1,3,3), 2, 2, 1, ceil_mode=True) = [[.25 .5] [.5 1]];
  // without count_include_pad all ones.
  check_near(values(avg_pool2d(ones({1, 1, 3, 3}, opts()), 2, Size2{2}, 1, true, true)), {0.25, 0.5, 0.5, 1.0}, 1e-15);
  check_near(values(avg_pool2d(ones({1, 1, 3, 3}, opts()), 2, Size2{2}, 1, true, false)), {1, 1, 1, 1}, 1e-15);
}

// ---------------------------------------------------------------- adaptive_avg_pool2d

TEST_CASE("adaptive_avg_pool2d: PyTorch's windows, global pooling, upsampling; backward and gradcheck") {
  const std::int64_t shapes[][4] = {{7, 9, 3, 4}, {12, 13, 1, 1}, {3, 4, 5, 6}, {6, 6, 3, 2}, {5, 7, 5, 7}, {40, 40, 1, 1}};
  for (const auto& s : shapes) {
    Tensor x = param(rnd({2, 3, s[0], s[1]}, static_cast<std::uint64_t>(s[0] + s[2])));
    Tensor y = adaptive_avg_pool2d(x, {s[2], s[3]});
    CHECK(y.shape() == Shape{2, 3, s[2], s[3]});
    Tensor dy = rnd(y.shape(), 2);
    std::vector<double> dx;
    const auto vdy = values(dy);
    check_near(values(y), ref_adaptive(values(x), 6, s[0], s[1], s[2], s[3], &vdy, &dx), 1e-12);
    y.backward(dy);
    check_near(values(x.grad()), dx, 1e-12);
  }
  for (const Size2 o : {Size2{3, 4}, Size2{1}, Size2{5, 11}})
    check_grad([o](const std::vector<Tensor>& v) { return adaptive_avg_pool2d(v[0], o); }, {param(rnd({2, 2, 7, 9}, 3))});
}

TEST_CASE("adaptive_avg_pool2d (1, 1) takes the row reduction with the general formula's bits on the CPU") {
  // The general loop with one window per plane sums in the same order and
  // divides once: (1, 1) and an equivalent avg_pool2d agree bitwise.
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Tensor x = rnd({3, 4, 11, 13}, 12, dt);
    CHECK(bit_equal(adaptive_avg_pool2d(x, 1), avg_pool2d(x, {11, 13})));
  }
}

// ---------------------------------------------------------------- batch_norm

namespace {

struct BnRef {
  std::vector<double> y, mean, var_biased, var_unbiased, dx, dw, db;
};

// Batch statistics per channel of x [N, C, inner], PyTorch's formulas for y
// and the training backward (or the evaluation one with given statistics).
BnRef ref_batch_norm(const std::vector<double>& x, std::int64_t N, std::int64_t C, std::int64_t inner,
                     const std::vector<double>& w, const std::vector<double>& b, const std::vector<double>& dy,
                     bool training, double eps, const std::vector<double>& rm = {},
                     const std::vector<double>& rv = {}) {
  BnRef r;
  const double n = static_cast<double>(N * inner);
  auto at = [&](std::int64_t i, std::int64_t c, std::int64_t j) { return static_cast<std::size_t>((i * C + c) * inner + j); };
  r.y.assign(x.size(), 0);
  r.dx.assign(x.size(), 0);
  for (std::int64_t c = 0; c < C; ++c) {
    double s = 0, sq = 0;
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t j = 0; j < inner; ++j) s += x[at(i, c, j)];
    const double mean = s / n;
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t j = 0; j < inner; ++j) sq += (x[at(i, c, j)] - mean) * (x[at(i, c, j)] - mean);
    r.mean.push_back(mean);
    r.var_biased.push_back(sq / n);
    r.var_unbiased.push_back(sq / (n - 1));
    const double m = training ? mean : rm[static_cast<std::size_t>(c)];
    const double invstd = 1.0 / std::sqrt((training ? sq / n : rv[static_cast<std::size_t>(c)]) + eps);
    const double wc = w.empty() ? 1.0 : w[static_cast<std::size_t>(c)], bc = b.empty() ? 0.0 : b[static_cast<std::size_t>(c)];
    double gs = 0, dot = 0;
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t j = 0; j < inner; ++j) {
        const std::size_t k = at(i, c, j);
        r.y[k] = (x[k] - m) * invstd * wc + bc;
        if (!dy.empty()) {
          gs += dy[k];
          dot += dy[k] * (x[k] - m);
        }
      }
    r.db.push_back(gs);
    r.dw.push_back(dot * invstd);
    for (std::int64_t i = 0; i < N; ++i)
      for (std::int64_t j = 0; j < inner; ++j) {
        const std::size_t k = at(i, c, j);
        if (dy.empty()) continue;
        r.dx[k] = training ? (dy[k] - gs / n - (x[k] - m) * invstd * invstd * dot / n) * invstd * wc
                           : dy[k] * invstd * wc;
      }
  }
  return r;
}

}  // namespace

TEST_CASE("batch_norm training: batch statistics, running statistics (unbiased variance), full backward") {
  const std::int64_t N = 4, C = 3, H = 5, W = 6;
  Tensor x = param(add(mul(rnd({N, C, H, W}, 1), 2.0), 0.5).detach());
  Tensor w = param(rnd({C}, 2)), b = param(rnd({C}, 3));
  Tensor rm = Tensor::from_vector<double>({0.1, -0.2, 0.3}, {C}), rv = Tensor::from_vector<double>({1.0, 0.5, 2.0}, {C});
  const auto rm0 = values(rm), rv0 = values(rv);
  const double momentum = 0.3, eps = 1e-4;
  Tensor y = batch_norm(x, w, b, rm, rv, true, momentum, eps);
  Tensor dy = rnd(y.shape(), 4);
  const BnRef want = ref_batch_norm(values(x), N, C, H * W, values(w), values(b), values(dy), true, eps);
  check_near(values(y), want.y, 1e-12);
  std::vector<double> rm_want, rv_want;
  for (std::size_t c = 0; c < 3; ++c) {
    rm_want.push_back((1 - momentum) * rm0[c] + momentum * want.mean[c]);
    rv_want.push_back((1 - momentum) * rv0[c] + momentum * want.var_unbiased[c]);
  }
  check_near(values(rm), rm_want, 1e-12);
  check_near(values(rv), rv_want, 1e-12);
  CHECK(!rm.requires_grad());
  CHECK(!rv.requires_grad());
  y.backward(dy);
  check_near(values(x.grad()), want.dx, 1e-10);
  check_near(values(w.grad()), want.dw, 1e-10);
  check_near(values(b.grad()), want.db, 1e-10);
  check_grad(
      [](const std::vector<Tensor>& v) { return batch_norm(v[0], v[1], v[2], Tensor(), Tensor(), true, 0.1, 1e-5); },
      {param(rnd({3, 2, 3, 4}, 5)), param(rnd({2}, 6)), param(rnd({2}, 7))});
}

TEST_CASE("batch_norm training on [N, C], without affine parameters; momentum 0 and 1; a constant channel") {
  Tensor x = param(rnd({8, 5}, 11));
  Tensor y = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  const BnRef want = ref_batch_norm(values(x), 8, 5, 1, {}, {}, {}, true, 1e-5);
  check_near(values(y), want.y, 1e-12);
  check_grad([](const std::vector<Tensor>& v) { return batch_norm(v[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
             {param(rnd({6, 4}, 12))});
  // momentum 1: the running statistics become the batch's; 0: unchanged.
  Tensor rm = zeros({5}, opts()), rv = ones({5}, opts());
  batch_norm(x.detach(), Tensor(), Tensor(), rm, rv, true, 1.0);
  check_near(values(rm), want.mean, 1e-12);
  check_near(values(rv), want.var_unbiased, 1e-12);
  const auto rm1 = values(rm), rv1 = values(rv);
  batch_norm(mul(x.detach(), 3.0), Tensor(), Tensor(), rm, rv, true, 0.0);
  CHECK(values(rm) == rm1);
  CHECK(values(rv) == rv1);
  // A constant channel: variance 0, y = 0, invstd = 1 / sqrt(eps).
  Tensor c = full({4, 2, 3}, 2.5, opts());
  Tensor yc = batch_norm(c, Tensor(), full({2}, 0.75, opts()), Tensor(), Tensor(), true, 0.1, 1e-5);
  for (double v : values(yc)) CHECK(v == 0.75);
}

TEST_CASE("batch_norm evaluation: running statistics, the affine backward") {
  const std::int64_t N = 3, C = 4, H = 2, W = 5;
  Tensor x = param(rnd({N, C, H, W}, 21)), w = param(rnd({C}, 22)), b = param(rnd({C}, 23));
  Tensor rm = rnd({C}, 24), rv = add(mul(rnd({C}, 25), mul(rnd({C}, 25), 1.0)), 0.5).detach();
  const auto rm0 = values(rm), rv0 = values(rv);
  Tensor y = batch_norm(x, w, b, rm, rv, false, 0.1, 1e-3);
  Tensor dy = rnd(y.shape(), 26);
  const BnRef want = ref_batch_norm(values(x), N, C, H * W, values(w), values(b), values(dy), false, 1e-3, rm0, rv0);
  check_near(values(y), want.y, 1e-12);
  y.backward(dy);
  check_near(values(x.grad()), want.dx, 1e-12);
  check_near(values(w.grad()), want.dw, 1e-10);
  check_near(values(b.grad()), want.db, 1e-10);
  CHECK(values(rm) == rm0);  // evaluation leaves the running statistics alone
  CHECK(values(rv) == rv0);
  check_grad([rm, rv](const std::vector<Tensor>& v) { return batch_norm(v[0], v[1], v[2], rm, rv, false); },
             {param(rnd({2, 4, 3, 3}, 27)), param(rnd({C}, 28)), param(rnd({C}, 29))});
}

TEST_CASE("batch_norm: several chunks per plane, half types against f64") {
  // 50 x 50 = 2500 elements per plane: two chunks of the fixed summation order.
  Tensor x = rnd({2, 3, 50, 50}, 31, DType::f64, 3.0);
  const BnRef want = ref_batch_norm(values(x), 2, 3, 2500, {}, {}, {}, true, 1e-5);
  Tensor rm = zeros({3}, opts()), rv = ones({3}, opts());
  check_near(values(batch_norm(x, Tensor(), Tensor(), rm, rv, true, 1.0)), want.y, 1e-10);
  check_near(values(rv), want.var_unbiased, 1e-10);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    const double tol = dt == DType::f32 ? 1e-5 : dt == DType::f16 ? 1e-2 : 5e-2;
    Tensor xl = x.to(dt);
    const BnRef wl = ref_batch_norm(values(xl), 2, 3, 2500, {}, {}, {}, true, 1e-5);
    Tensor rml = zeros({3}, opts(dt)), rvl = ones({3}, opts(dt));
    Tensor y = batch_norm(xl, Tensor(), Tensor(), rml, rvl, true, 1.0);
    CHECK(y.dtype() == dt);
    check_near(values(y), wl.y, tol);
    check_near(values(rvl), wl.var_unbiased, tol);
  }
}

TEST_CASE("batch_norm: a bad argument throws before the running statistics are written") {
  Tensor x = rnd({4, 3, 2, 2}, 41);
  Tensor rm = rnd({3}, 42), rv = ones({3}, opts());
  const auto rm0 = values(rm), rv0 = values(rv);
  auto expect = [&](const char* arg, const std::function<void()>& f) {
    try {
      f();
      FAIL((std::string("no error for ") + arg));
    } catch (const Error& e) {
      CHECK(std::string(e.op()) == "batch_norm");
      CHECK(std::string(e.arg()) == arg);
    }
    CHECK(values(rm) == rm0);
    CHECK(values(rv) == rv0);
  };
  expect("eps", [&] { batch_norm(x, Tensor(), Tensor(), rm, rv, true, 0.1, 0.0); });
  expect("momentum", [&] { batch_norm(x, Tensor(), Tensor(), rm, rv, true, 1.5); });
  expect("weight", [&] { batch_norm(x, ones({4}, opts()), Tensor(), rm, rv, true); });
  expect("bias", [&] { batch_norm(x, Tensor(), ones({3}, opts(DType::f32)), rm, rv, true); });
  expect("x", [&] { batch_norm(rnd({1, 3}, 1), Tensor(), Tensor(), rm, rv, true); });
  expect("running_var", [&] { batch_norm(x, Tensor(), Tensor(), rm, ones({2}, opts()), true); });
}

TEST_CASE("batch_norm records nothing for the running statistics and only what it needs") {
  Tensor x = param(rnd({4, 3, 2, 2}, 51));
  Tensor rm = zeros({3}, opts()), rv = ones({3}, opts());
  Tensor y = batch_norm(x, Tensor(), Tensor(), rm, rv, true);
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->inputs.size() == 3);
  CHECK(!rm.grad_fn());
  CHECK(!rv.requires_grad());
  sum(y).backward();
  CHECK(x.grad().defined());
  NoGradGuard no_grad;
  CHECK(!batch_norm(x, Tensor(), Tensor(), rm, rv, true).requires_grad());
}

TEST_CASE("batch_norm_relu equals relu(batch_norm) bit for bit: output, running statistics, every gradient") {
  // Planes of 30 elements (one chunk, the partial sums' tail loop) and of
  // 2500 (two chunks, the batched loop); training and evaluation; the bias
  // near 0 so that about half the outputs are cut; dy of both signs (a cut
  // element's gradient is +0 either way).
  for (const Device dev : test_devices()) {
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
      for (const Shape& shape : {Shape{4, 3, 5, 6}, Shape{2, 3, 50, 50}}) {
        for (bool training : {true, false}) {
          INFO(dev.str(), " ", dtype_name(dt), " ", shape_str(shape), training ? " training" : " eval");
          Generator g(0xb4e1);
          const TensorOptions o = TensorOptions{}.with_device(dev).with_dtype(dt);
          const Tensor x0 = add(mul(randn(shape, g, o), 2.0), 0.25), w0 = randn({3}, g, o);
          const Tensor b0 = mul(randn({3}, g, o), 0.2), dy = randn(shape, g, o);
          const Tensor rm0 = mul(randn({3}, g, o), 0.1), rv0 = add(mul(rand({3}, g, o), 0.5), 0.75);
          // y, the running statistics, dx, dweight, dbias.
          const auto run = [&](bool fused) {
            Tensor x = x0.clone(), w = w0.clone(), b = b0.clone(), rm = rm0.clone(), rv = rv0.clone();
            for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
            Tensor y = fused ? batch_norm_relu(x, w, b, rm, rv, training, 0.1, 1e-5)
                             : relu(batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5));
            y.backward(dy);
            return std::vector<Tensor>{y, rm, rv, x.grad(), w.grad(), b.grad()};
          };
          const std::vector<Tensor> want = run(false), got = run(true);
          const char* names[] = {"y", "running_mean", "running_var", "dx", "dweight", "dbias"};
          for (std::size_t k = 0; k < want.size(); ++k) {
            INFO(names[k]);
            CHECK(bit_equal(got[k], want[k]));
          }
          // The relu cut a real share of the outputs (the test would pass
          // vacuously without).
          const std::vector<double> y = values(want[0]);
          const auto cut = std::count(y.begin(), y.end(), 0.0);
          CHECK(cut > static_cast<std::ptrdiff_t>(y.size() / 5));
          CHECK(cut < static_cast<std::ptrdiff_t>(y.size() * 4 / 5));
        }
      }
    }
  }
}

TEST_CASE("batch_norm_scale_factor equals div(weight, sqrt(add(running_var, eps))) bit for bit: values, gradient") {
  // Every floating dtype (f16 / bf16: each step rounded to the dtype, eps
  // too), eps of the batch norm and one that is not exact in any dtype, and
  // the weight gradient against div's; running variances down to 1e-4 (eps
  // matters) and up to 50.
  for (const Device dev : test_devices()) {
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      for (double eps : {1e-5, 0.1}) {
        INFO(dev.str(), " ", dtype_name(dt), " eps ", eps);
        Generator g(0x5ca1e);
        const TensorOptions o = TensorOptions{}.with_device(dev).with_dtype(dt);
        const Tensor w0 = randn({67}, g, o), rv = mul(rand({67}, g, o, 0.01, 1.0), rand({67}, g, o, 0.01, 1.0));
        const Tensor rv_big = rand({67}, g, o, 1.0, 50.0), dy = randn({67}, g, o);
        for (const Tensor& v : {rv, rv_big}) {
          Tensor wa = w0.clone(), wb = w0.clone();
          wa.set_requires_grad(true);
          wb.set_requires_grad(true);
          const Tensor fa = batch_norm_scale_factor(wa, v, eps);
          const Tensor fb = div(wb, sqrt(add(v, eps)));
          CHECK(bit_equal(fa, fb));
          fa.backward(dy);
          fb.backward(dy);
          CHECK(bit_equal(wa.grad(), wb.grad()));
          const std::vector<double> fv = values(fa);
          CHECK(std::count(fv.begin(), fv.end(), 0.0) == 0);  // real values
        }
      }
    }
  }
}

TEST_CASE("channel_mul equals mul by the reshaped scale bit for bit: values, both gradients, short and long sums") {
  // Conv weights along axis 0 (one pass: 9 and 288 terms a channel), [N, C,
  // H, W] along axes 1 and -1 (strided channels), and 4200 elements a channel
  // (the composed passes).
  struct Case {
    Shape shape;
    std::int64_t axis;
  };
  const Case cases[] = {{{32, 1, 3, 3}, 0}, {{64, 32, 3, 3}, 0}, {{3, 5, 4, 7}, 1}, {{3, 5, 4, 7}, -1}, {{2, 3, 2100}, 1}};
  for (const Device dev : test_devices()) {
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
      for (const Case& c : cases) {
        INFO(dev.str(), " ", dtype_name(dt), " ", shape_str(c.shape), " axis ", c.axis);
        Generator g(0xc4a1);
        const TensorOptions o = TensorOptions{}.with_device(dev).with_dtype(dt);
        const std::int64_t ax = c.axis < 0 ? c.axis + static_cast<std::int64_t>(c.shape.size()) : c.axis;
        const std::int64_t ch = c.shape[static_cast<std::size_t>(ax)];
        Shape bshape(c.shape.size() - static_cast<std::size_t>(ax), 1);
        bshape[0] = ch;
        const Tensor x0 = randn(c.shape, g, o), s0 = add(rand({ch}, g, o), 0.5), dy = randn(c.shape, g, o);
        const auto run = [&](bool fused) {
          Tensor x = x0.clone(), s = s0.clone();
          x.set_requires_grad(true);
          s.set_requires_grad(true);
          Tensor y = fused ? channel_mul(x, s, c.axis) : mul(x, s.reshape(bshape));
          y.backward(dy);
          return std::vector<Tensor>{y, x.grad(), s.grad()};
        };
        const std::vector<Tensor> want = run(false), got = run(true);
        CHECK(bit_equal(got[0], want[0]));
        CHECK(bit_equal(got[1], want[1]));
        CHECK(bit_equal(got[2], want[2]));
        const std::vector<double> ds = values(want[2]);
        CHECK(std::count(ds.begin(), ds.end(), 0.0) == 0);  // real sums
      }
      // Empty tensors: no elements in a channel (dscale zero), and no channels.
      for (const Case& c : {Case{{0, 3}, 1}, Case{{0, 2, 2}, 0}}) {
        INFO(dev.str(), " ", dtype_name(dt), " empty ", shape_str(c.shape), " axis ", c.axis);
        const TensorOptions o = TensorOptions{}.with_device(dev).with_dtype(dt);
        const std::int64_t ch = c.shape[static_cast<std::size_t>(c.axis)];
        Tensor x = zeros(c.shape, o), s = full({ch}, 2.0, o);
        x.set_requires_grad(true);
        s.set_requires_grad(true);
        const Tensor y = channel_mul(x, s, c.axis);
        y.backward(zeros(c.shape, o));
        CHECK(y.shape() == c.shape);
        CHECK(x.grad().shape() == c.shape);
        CHECK(s.grad().shape() == Shape{ch});
        const std::vector<double> ds = values(s.grad());
        CHECK(std::count(ds.begin(), ds.end(), 0.0) == static_cast<std::ptrdiff_t>(ds.size()));
      }
    }
  }
}

TEST_CASE("channel_mul folds the batch norm's gradient for a folded Conv-BN's scale factor, the same bits") {
  // ConvBn2d's pattern: f = batch_norm_scale_factor(gamma, running_var), the
  // weight scaled by f, and f the divisor of channel_div_add, whose backward
  // runs first. channel_mul's rule adds that pending gradient in its own pass
  // (one folded gradient a pass); with folding off the engine adds it, and
  // mul by the reshaped f gives the composed ops' bits.
  for (const Device dev : test_devices()) {
    for (DType dt : {DType::f32, DType::bf16}) {
      for (std::int64_t cin : {1, 32}) {
        INFO(dev.str(), " ", dtype_name(dt), " cin ", cin);
        Generator g(0xf01d);
        const TensorOptions o = TensorOptions{}.with_device(dev).with_dtype(dt);
        const Tensor w0 = randn({16, cin, 3, 3}, g, o), gamma0 = randn({16}, g, o), rv = add(rand({16}, g, o), 0.5);
        const Tensor z = randn({4, 16, 5, 5}, g, o), dw = randn({16, cin, 3, 3}, g, o), dz = randn({4, 16, 5, 5}, g, o);
        const auto run = [&](int mode) {  // 0: mul by the reshaped f, 1: channel_mul, 2: channel_mul unfolded
          set_gradient_folding(mode != 2);
          Tensor w = w0.clone(), gamma = gamma0.clone();
          w.set_requires_grad(true);
          gamma.set_requires_grad(true);
          const Tensor f = batch_norm_scale_factor(gamma, rv, 1e-5);
          const Tensor wf = mode == 0 ? mul(w, f.reshape({16, 1, 1, 1})) : channel_mul(w, f, 0);
          const Tensor loss = add(sum(mul(wf, dw)), sum(mul(channel_div_add(z, f), dz)));
          const std::uint64_t before = folded_gradient_count();
          loss.backward(Tensor());
          const std::uint64_t folds = folded_gradient_count() - before;
          set_gradient_folding(true);
          return std::make_pair(std::vector<Tensor>{wf, w.grad(), gamma.grad()}, folds);
        };
        const auto [want, folds0] = run(0);
        const auto [got, folds1] = run(1);
        const auto [unfolded, folds2] = run(2);
        CHECK(folds1 == folds0 + 1);  // channel_mul's rule took the batch norm's gradient for f
        CHECK(folds2 == 0);
        for (std::size_t k = 0; k < want.size(); ++k) {
          INFO("output ", k);
          CHECK(bit_equal(got[k], want[k]));
          CHECK(bit_equal(unfolded[k], want[k]));
        }
        const std::vector<double> dg = values(want[2]);
        CHECK(std::count(dg.begin(), dg.end(), 0.0) == 0);
      }
    }
  }
}

TEST_CASE("channel_div_add_batch_norm equals batch_norm(channel_div_add) bit for bit: output, statistics, gradients") {
  // As above: planes of 30 (tail loops) and 2500 (two chunks, batched
  // loops); training and evaluation; with and without relu and shift; every
  // gradient (x, divisor, shift, weight, bias) against the two ops'.
  for (const Device dev : test_devices()) {
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
      for (const Shape& shape : {Shape{4, 3, 5, 6}, Shape{2, 3, 50, 50}}) {
        for (int mode = 0; mode < 8; ++mode) {
          const bool training = mode & 1, relu = mode & 2, with_shift = mode & 4;
          INFO(dev.str(), " ", dtype_name(dt), " ", shape_str(shape), training ? " training" : " eval",
               relu ? " relu" : "", with_shift ? " shift" : "");
          Generator g(0xd1ad);
          const TensorOptions o = TensorOptions{}.with_device(dev).with_dtype(dt);
          const Tensor x0 = add(mul(randn(shape, g, o), 2.0), 0.25), d0 = add(mul(rand({3}, g, o), 1.5), 0.5);
          const Tensor s0 = randn({3}, g, o), w0 = randn({3}, g, o), b0 = mul(randn({3}, g, o), 0.2);
          const Tensor dy = randn(shape, g, o);
          const Tensor rm0 = mul(randn({3}, g, o), 0.1), rv0 = add(mul(rand({3}, g, o), 0.5), 0.75);
          const auto run = [&](bool fused) {
            Tensor x = x0.clone(), d = d0.clone(), sh = with_shift ? s0.clone() : Tensor(), w = w0.clone(),
                   b = b0.clone(), rm = rm0.clone(), rv = rv0.clone();
            for (Tensor* t : {&x, &d, &w, &b}) t->set_requires_grad(true);
            if (with_shift) sh.set_requires_grad(true);
            Tensor y = fused ? channel_div_add_batch_norm(x, d, sh, w, b, rm, rv, training, relu, 0.1, 1e-5)
                             : (relu ? batch_norm_relu : batch_norm)(channel_div_add(x, d, sh), w, b, rm, rv, training,
                                                                     0.1, 1e-5, Tensor());
            y.backward(dy);
            return std::vector<Tensor>{y,        rm,       rv,       x.grad(),
                                       d.grad(), w.grad(), b.grad(), with_shift ? sh.grad() : zeros({1})};
          };
          const std::vector<Tensor> want = run(false), got = run(true);
          const char* names[] = {"y", "running_mean", "running_var", "dx", "ddivisor", "dweight", "dbias", "dshift"};
          for (std::size_t k = 0; k < want.size(); ++k) {
            INFO(names[k]);
            CHECK(bit_equal(got[k], want[k]));
          }
          // Real values: the gradients are not all zero.
          const std::vector<double> gx = values(want[3]), gd = values(want[4]);
          CHECK(std::count(gx.begin(), gx.end(), 0.0) < static_cast<std::ptrdiff_t>(gx.size() * 4 / 5));
          CHECK(std::count(gd.begin(), gd.end(), 0.0) == 0);
        }
      }
    }
  }
}

TEST_CASE("fused batch norm divides as channel_div_add does where its shared-divisor quotients do not apply") {
  // The fused kernels divide a channel's elements by its divisor through
  // formulas::SharedDivisor (on CUDA a reciprocal taken once and two fma
  // corrections, for |d| in [2^-32, 2^32] and |x| in [2^-90, 2^90]; a
  // partial with any other dividend is computed again dividing). Here:
  // channel 0 holds 0, -0, 1e-30 (< 2^-90), a subnormal and 1.3e27
  // (> 2^90) among normal values, channel 1 a divisor of 1e-12 (< 2^-32),
  // channel 2 one of -3e12 (> 2^32). Every output and gradient of
  // channel_div_add_batch_norm and of the fused pooling equals the
  // composition's (which divides element by element), and CUDA's the CPU's.
  struct Case {
    Shape shape;
    MaxPool2dArgs pool;
  };
  // Rows of odd length (one output an index on CUDA) and of even length (pairs).
  const Case cases[] = {{{2, 3, 6, 10}, {2}}, {{4, 3, 6, 8}, {2}}};
  std::vector<std::vector<Tensor>> per_device;
  for (const Device dev : test_devices()) {
    std::vector<Tensor> all;
    for (const Case& cs : cases) {
      for (int mode = 0; mode < 2; ++mode) {
        const bool pooled = mode == 1;
        const std::string what = pooled ? "fused pooling" : "channel_div_add_batch_norm";
        INFO(dev.str(), " ", shape_str(cs.shape), " ", what);
        Generator g(0x5d1);
        const TensorOptions o = TensorOptions{}.with_device(dev);
        Generator gx0(0x5d2);  // the same x on every device: drawn on the host
        std::vector<double> xv = values(add(mul(randn(cs.shape, gx0, TensorOptions{}), 2.0), 0.25));
        const std::int64_t plane = cs.shape[2] * cs.shape[3];
        xv[3] = 0.0;                      // image 0, channel 0
        xv[7] = -0.0;
        xv[plane - 2] = 1e-30;
        xv[3 * plane + 5] = 1e-40;        // image 1, channel 0: subnormal
        xv[3 * plane + plane - 1] = 1.3e27;
        const Tensor x0 = Tensor::from_vector(xv, cs.shape).to(DType::f32).to(dev);
        const Tensor d0 = Tensor::from_vector(std::vector<double>{0.75, 1e-12, -3e12}, {3}).to(DType::f32).to(dev);
        const Tensor s0 = randn({3}, g, o), w0 = add(rand({3}, g, o), 0.5), b0 = mul(randn({3}, g, o), 0.2);
        const Tensor rm0 = mul(randn({3}, g, o), 0.1), rv0 = add(mul(rand({3}, g, o), 0.5), 0.75);
        const auto run = [&](bool fused) {
          Tensor x = x0.clone(), d = d0.clone(), sh = s0.clone(), w = w0.clone(), b = b0.clone(), rm = rm0.clone(),
                 rv = rv0.clone();
          for (Tensor* t : {&x, &d, &sh, &w, &b}) t->set_requires_grad(true);
          Tensor y;
          if (pooled) {
            Tensor scale = full({1}, 0.0625, o), zp = full({1}, 7.0, TensorOptions{}.with_device(dev).with_dtype(DType::s32));
            const BatchNormArgs a{.divisor = d, .shift = sh, .weight = w, .bias = b, .running_mean = rm,
                                  .running_var = rv, .training = true};
            y = fused ? batch_norm_relu_fake_quantize_max_pool2d(x, a, scale, zp, 0, 255, cs.pool, nullptr)
                      : fake_quantize_max_pool2d(channel_div_add_batch_norm(x, d, sh, w, b, rm, rv, true, true, 0.1,
                                                                            1e-5),
                                                 scale, zp, 0, 255, cs.pool.kernel_size, cs.pool.stride,
                                                 cs.pool.padding, cs.pool.dilation, cs.pool.ceil_mode);
          } else {
            y = fused ? channel_div_add_batch_norm(x, d, sh, w, b, rm, rv, true, true, 0.1, 1e-5)
                      : batch_norm_relu(channel_div_add(x, d, sh), w, b, rm, rv, true, 0.1, 1e-5, Tensor());
          }
          Generator gd(0xd9);
          y.backward(randn(y.shape(), gd, TensorOptions{}).to(dev));
          return std::vector<Tensor>{y, rm, rv, x.grad(), d.grad(), sh.grad(), w.grad(), b.grad()};
        };
        const std::vector<Tensor> want = run(false), got = run(true);
        const char* names[] = {"y", "running_mean", "running_var", "dx", "ddivisor", "dshift", "dweight", "dbias"};
        for (std::size_t k = 0; k < want.size(); ++k) {
          INFO(names[k]);
          CHECK(bit_equal(got[k], want[k]));
          all.push_back(got[k]);
        }
        // Real values: the outputs and x's gradient are not all zero.
        const std::vector<double> yv = values(got[0]), gx = values(got[3]);
        CHECK(std::count(yv.begin(), yv.end(), 0.0) < static_cast<std::ptrdiff_t>(yv.size()));
        CHECK(std::count(gx.begin(), gx.end(), 0.0) < static_cast<std::ptrdiff_t>(gx.size() / 2));
      }
    }
    per_device.push_back(all);
  }
  for (std::size_t dv = 1; dv < per_device.size(); ++dv)
    for (std::size_t k = 0; k < per_device[0].size(); ++k) {
      INFO("device ", dv, " output ", k);
      CHECK(bit_equal(per_device[dv][k], per_device[0][k]));
    }
}

TEST_CASE("batch_norm_relu_fake_quantize_max_pool2d equals its composition bit for bit: values, state, gradients") {
  // The composition: channel_div_add_batch_norm (relu; batch_norm_relu
  // without the prologue), the observer update (observe_minmax_qparams_ per
  // tensor), fake_quantize_max_pool2d. Planes of 48 (one chunk) and 2500
  // (two chunks); training and evaluation; with and without the prologue,
  // the observer (never observed: a copy; moving average: c = 0.25) and
  // overlapping windows; divisors and weights of both signs (channels whose
  // output falls as x rises). Every output,
  // running statistic, the counter, the observer's range and the qparams,
  // and every gradient against the composition's.
  struct Case {
    Shape shape;
    MaxPool2dArgs pool;
  };
  // 2 x 2 windows with outputs paired within rows on CUDA (4 x 3 x 3 x 4) and
  // one at a time in rows of odd length, planes of different channels
  // (2 x 3 x 3 x 5).
  const Case cases[] = {{{4, 3, 6, 8}, {2}}, {{2, 3, 50, 50}, {3, Size2{2}, 1, 1, true}}, {{2, 3, 6, 10}, {2}}};
  for (const Device dev : test_devices()) {
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      for (const Case& cs : cases) {
        // Without weight and bias (affine off) on the small case: every mode.
        for (int mode = 0; mode < (&cs == &cases[0] ? 32 : 16); ++mode) {
          const bool training = mode & 1, prologue = mode & 2, observe = mode & 4, moving = mode & 8;
          const bool affine = !(mode & 16);
          INFO(dev.str(), " ", dtype_name(dt), " ", shape_str(cs.shape), training ? " training" : " eval",
               prologue ? " prologue" : "", observe ? " observer" : "", moving ? " moving" : "",
               affine ? "" : " no weight, no bias");
          Generator g(0xb0f9 + mode);
          const TensorOptions o = TensorOptions{}.with_device(dev).with_dtype(dt);
          const TensorOptions f32 = TensorOptions{}.with_device(dev);
          const Tensor x0 = add(mul(randn(cs.shape, g, o), 2.0), 0.25);
          const Tensor d0 = mul(add(mul(rand({3}, g, o), 1.5), 0.5), Tensor::from_vector(std::vector<double>{1, -1, 1}, {3}).to(dt).to(dev));
          const Tensor s0 = randn({3}, g, o), b0 = mul(randn({3}, g, o), 0.2);
          const Tensor w0 = mul(add(rand({3}, g, o), 0.5), Tensor::from_vector(std::vector<double>{1, 1, -1}, {3}).to(dt).to(dev));
          const Tensor rm0 = mul(randn({3}, g, o), 0.1), rv0 = add(mul(rand({3}, g, o), 0.5), 0.75);
          const auto run = [&](bool fused) {
            Tensor x = x0.clone(), d = d0.clone(), sh = s0.clone(), w = w0.clone(), b = b0.clone(), rm = rm0.clone(),
                   rv = rv0.clone();
            for (Tensor* t : {&x, &d, &sh, &w, &b}) t->set_requires_grad(true);
            if (!affine) w = b = Tensor();
            Tensor count = full({}, 5.0, TensorOptions{}.with_device(dev).with_dtype(DType::s64));
            Tensor scale = full({1}, 0.0625, f32), zp = full({1}, 7.0, TensorOptions{}.with_device(dev).with_dtype(DType::s32));
            Tensor lo = full({1}, moving ? -0.5 : INFINITY, f32), hi = full({1}, moving ? 1.75 : -INFINITY, f32);
            const ObserverUpdate u{lo, hi, moving ? 0.25 : -1.0, false, 0};
            const BatchNormArgs a{.divisor = prologue ? d : Tensor(),
                                  .shift = prologue ? sh : Tensor(),
                                  .weight = w,
                                  .bias = b,
                                  .running_mean = rm,
                                  .running_var = rv,
                                  .num_batches_tracked = training ? count : Tensor(),
                                  .training = training};
            Tensor y;
            if (fused) {
              y = batch_norm_relu_fake_quantize_max_pool2d(x, a, scale, zp, 0, 255, cs.pool, observe ? &u : nullptr);
            } else {
              Tensor n = prologue ? channel_div_add_batch_norm(x, d, sh, w, b, rm, rv, training, true, 0.1, 1e-5,
                                                               a.num_batches_tracked)
                                  : batch_norm_relu(x, w, b, rm, rv, training, 0.1, 1e-5, a.num_batches_tracked);
              if (observe) observe_minmax_qparams_(n.detach(), u, -1, scale, zp, 0, 255);
              y = fake_quantize_max_pool2d(n, scale, zp, 0, 255, cs.pool.kernel_size, cs.pool.stride, cs.pool.padding,
                                           cs.pool.dilation, cs.pool.ceil_mode);
            }
            Generator gd(0xd9);
            std::vector<double> dv = values(randn(y.shape(), gd, o));
            for (std::size_t i = 0; i < dv.size(); i += 5) dv[i] = -0.0;
            y.backward(Tensor::from_vector(dv, y.shape()).to(dt).to(dev));
            return std::vector<Tensor>{y,        rm,       rv,       count, lo,       hi,
                                       scale,    zp,       x.grad(), affine ? w.grad() : zeros({1}),
                                       affine ? b.grad() : zeros({1}),
                                       prologue ? d.grad() : zeros({1}), prologue ? sh.grad() : zeros({1})};
          };
          const std::vector<Tensor> want = run(false), got = run(true);
          const char* names[] = {"y",     "running_mean", "running_var", "count",   "observer min", "observer max",
                                 "scale", "zero_point",   "dx",          "dweight", "dbias",        "ddivisor",
                                 "dshift"};
          for (std::size_t k = 0; k < want.size(); ++k) {
            INFO(names[k]);
            CHECK(bit_equal(got[k], want[k]));
          }
          // Real values: a range was observed, gradients pass the masks.
          if (observe) CHECK(values(got[5])[0] > 0.5);
          const std::vector<double> gx = values(want[8]);
          CHECK(std::count_if(gx.begin(), gx.end(), [](double v) { return v != 0; }) > 8);
        }
      }
    }
  }
}

TEST_CASE("batch_norm_relu_fake_quantize_max_pool2d: a NaN in x reaches the observer's range") {
  for (const Device dev : test_devices()) {
    INFO(dev.str());
    Generator g(0x4a);
    const TensorOptions f32 = TensorOptions{}.with_device(dev);
    std::vector<double> xv = values(randn({2, 3, 4, 4}, g, f32));
    xv[21] = NAN;  // image 0, channel 1
    const Tensor x = Tensor::from_vector(xv, {2, 3, 4, 4}).to(dev);
    Tensor scale = full({1}, 1.0, f32), zp = full({1}, 0.0, TensorOptions{}.with_device(dev).with_dtype(DType::s32));
    Tensor lo = full({1}, INFINITY, f32), hi = full({1}, -INFINITY, f32);
    const ObserverUpdate u{lo, hi, -1.0, false, 0};
    BatchNormArgs a;
    batch_norm_relu_fake_quantize_max_pool2d(x, a, scale, zp, 0, 255, {}, &u);
    CHECK(std::isnan(values(lo)[0]));
    CHECK(std::isnan(values(hi)[0]));
  }
}

TEST_CASE("batch_norm_relu_fake_quantize_max_pool2d: errors name the op and write nothing") {
  const TensorOptions o = opts();
  Tensor x = rnd({4, 3, 4, 4}, 43), rm = rnd({3}, 44), rv = ones({3}, o);
  Tensor count = full({}, 2.0, TensorOptions{}.with_dtype(DType::s64));
  const TensorOptions f32{};  // the observer's range and the scale
  Tensor lo = full({1}, -1.0, f32), hi = full({1}, 1.0, f32);
  const Tensor scale = full({1}, 0.1, f32), zp = full({1}, 3.0, TensorOptions{}.with_dtype(DType::s32));
  const auto rm0 = values(rm), rv0 = values(rv);
  const BatchNormArgs a{.running_mean = rm, .running_var = rv, .num_batches_tracked = count};
  const ObserverUpdate u{lo, hi, 0.5, false, 0};
  const ObserverUpdate bad_u{lo, full({2}, 1.0, f32), 0.5, false, 0};
  const char* op = "batch_norm_relu_fake_quantize_max_pool2d";
  // Each error comes after checks that pass: batch norm, pooling, qparams, observer.
  check_error([&] { batch_norm_relu_fake_quantize_max_pool2d(x, a, scale, zp, 0, 255, MaxPool2dArgs{5}, &u); }, op,
              "kernel_size");
  check_error([&] { batch_norm_relu_fake_quantize_max_pool2d(x, a, scale, zp.to(DType::s64), 0, 255, {}, &u); }, op,
              "zero_point");
  check_error([&] { batch_norm_relu_fake_quantize_max_pool2d(x, a, scale, zp, 0, 255, {}, &bad_u); }, op, "run_max");
  check_error([&] { batch_norm_relu_fake_quantize_max_pool2d(x, a, full({1}, -1.0, f32), zp, 0, 255, {}); }, op,
              "scale");
  CHECK(values(rm) == rm0);
  CHECK(values(rv) == rv0);
  CHECK(count.item() == 2.0);
  CHECK(values(lo)[0] == -1.0);
  CHECK(values(hi)[0] == 1.0);
}

TEST_CASE("batch_norm counts batches in training only, on the device, for batch_norm and batch_norm_relu") {
  for (const Device dev : test_devices()) {
    INFO(dev.str());
    const TensorOptions o = TensorOptions{}.with_device(dev).with_dtype(DType::f32);
    Generator g(0xc0);
    Tensor x = randn({4, 3, 2, 2}, g, o), rm = zeros({3}, o), rv = ones({3}, o);
    Tensor count = full({}, 41.0, TensorOptions{}.with_device(dev).with_dtype(DType::s64));
    batch_norm(x, Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5, count);
    batch_norm_relu(x, Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5, count);
    CHECK(count.item() == 43.0);
    batch_norm(x, Tensor(), Tensor(), rm, rv, false, 0.1, 1e-5, count);  // evaluation: not counted
    CHECK(count.item() == 43.0);
    // A bad counter writes nothing (the running statistics included).
    const std::vector<double> rm0 = values(rm);
    check_error([&] { batch_norm(x, Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5, count.to(DType::f64)); },
                "batch_norm", "num_batches_tracked");
    CHECK(values(rm) == rm0);
    CHECK(count.item() == 43.0);
  }
}

TEST_CASE("batch_norm_relu: errors name batch_norm_relu and write nothing") {
  Tensor x = rnd({4, 3, 2, 2}, 41);
  Tensor rm = rnd({3}, 42), rv = ones({3}, opts());
  const auto rm0 = values(rm), rv0 = values(rv);
  check_error([&] { batch_norm_relu(x, Tensor(), Tensor(), rm, rv, true, 0.1, 0.0); }, "batch_norm_relu", "eps");
  check_error([&] { batch_norm_relu(x, ones({4}, opts()), Tensor(), rm, rv, true); }, "batch_norm_relu", "weight");
  CHECK(values(rm) == rm0);
  CHECK(values(rv) == rv0);
}

// ---------------------------------------------------------------- flatten

TEST_CASE("flatten: shapes, negative dims, a view with gradient") {
  Tensor x = param(rnd({2, 3, 4, 5}, 61));
  CHECK(flatten(x).shape() == Shape{2, 60});
  CHECK(flatten(x, 0).shape() == Shape{120});
  CHECK(flatten(x, 1, 2).shape() == Shape{2, 12, 5});
  CHECK(flatten(x, -2, -1).shape() == Shape{2, 3, 20});
  CHECK(flatten(x, 2, 2).shape() == Shape{2, 3, 4, 5});
  CHECK(flatten(Tensor::scalar(1.5), 0).shape() == Shape{1});
  CHECK(values(flatten(x)) == values(x));
  Tensor y = flatten(x, 1, 2);
  Tensor dy = rnd(y.shape(), 62);
  y.backward(dy);
  CHECK(x.grad().shape() == x.shape());
  CHECK(values(x.grad()) == values(dy));
}

// ---------------------------------------------------------------- the errors

TEST_CASE("pooling errors name the op and the argument") {
  auto arg_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.op()) + "/" + e.arg();
    }
    return "no error";
  };
  Tensor x = rnd({2, 3, 7, 8}, 71);
  CHECK(arg_of([&] { max_pool2d(rnd({3, 7, 8}, 1), 2); }) == "max_pool2d/x");
  CHECK(arg_of([&] { max_pool2d(x, 3, std::nullopt, 2); }) == "max_pool2d/padding");
  CHECK(arg_of([&] { max_pool2d(x, 2, Size2{0}); }) == "max_pool2d/stride");
  CHECK(arg_of([&] { max_pool2d(x, 2, std::nullopt, 0, 0); }) == "max_pool2d/dilation");
  CHECK(arg_of([&] { max_pool2d(x, {8, 2}); }) == "max_pool2d/kernel_size");
  CHECK(arg_of([&] { max_pool2d(rnd({1, 1, 3, 3}, 1), 2, Size2{1}, 0, 4); }) == "max_pool2d/kernel_size");
  CHECK(arg_of([&] { avg_pool2d(x, {3, 4}, std::nullopt, {1, 3}); }) == "avg_pool2d/padding");
  CHECK(arg_of([&] { avg_pool2d(rnd({1, 1, 2, 2}, 1), 5, Size2{1}, 1); }) == "avg_pool2d/kernel_size");
  CHECK(arg_of([&] { adaptive_avg_pool2d(x, 0); }) == "adaptive_avg_pool2d/output_size");
  CHECK(arg_of([&] { adaptive_avg_pool2d(zeros({2, 0, 3, 3}), 1); }) == "adaptive_avg_pool2d/x");
  CHECK(arg_of([&] { flatten(x, 3, 1); }) == "flatten/start_dim");
  CHECK(arg_of([&] { flatten(x, 0, 4); }) == "flatten/end_dim");
}

// ---------------------------------------------------------------- a small network

TEST_CASE("batch_norm -> relu -> max_pool2d -> adaptive_avg_pool2d -> flatten -> linear trains one step") {
  Generator g(81);
  Tensor x = randn({4, 3, 8, 8}, g, opts());
  Tensor w = param(ones({3}, opts())), b = param(zeros({3}, opts()));
  Tensor lw = param(randn({5, 3}, g, opts(), 0.0, 0.5));
  Tensor rm = zeros({3}, opts()), rv = ones({3}, opts());
  Tensor h = relu(batch_norm(x, w, b, rm, rv, true));
  h = flatten(adaptive_avg_pool2d(max_pool2d(h, 2), 1));
  CHECK(h.shape() == Shape{4, 3});
  Tensor loss = cross_entropy(linear(h, lw), Tensor::from_vector<std::int64_t>({0, 1, 2, 3}, {4}));
  loss.backward();
  CHECK(w.grad().defined());
  CHECK(b.grad().defined());
  CHECK(lw.grad().defined());
  for (double v : values(w.grad())) CHECK(std::isfinite(v));
}

// ---------------------------------------------------------------- CUDA

TEST_CASE("CUDA pooling and batch_norm are bit-identical to the CPU (larger shapes)") {
  QGRAD_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::f16, DType::f64}) {
    Tensor x = rnd({4, 8, 33, 29}, 91, dt);
    Tensor xc = x.to(Device::cuda());
    CHECK(bit_equal(max_pool2d_with_indices(x, 3, Size2{2}, 1, 1, true).indices,
                    max_pool2d_with_indices(xc, 3, Size2{2}, 1, 1, true).indices));
    CHECK(bit_equal(avg_pool2d(x, 3, Size2{2}, 1, true, false), avg_pool2d(xc, 3, Size2{2}, 1, true, false)));
    CHECK(bit_equal(adaptive_avg_pool2d(x, {5, 7}), adaptive_avg_pool2d(xc, {5, 7})));
    Tensor rm = zeros({8}, opts(dt)), rv = ones({8}, opts(dt));
    Tensor rmc = rm.to(Device::cuda()), rvc = rv.to(Device::cuda());
    Tensor xl = param(x.clone()), xlc = param(xc.clone());
    Tensor y = batch_norm(xl, Tensor(), Tensor(), rm, rv, true), yc = batch_norm(xlc, Tensor(), Tensor(), rmc, rvc, true);
    CHECK(bit_equal(y, yc));
    CHECK(bit_equal(rm, rmc));
    CHECK(bit_equal(rv, rvc));
    Tensor dy = rnd(y.shape(), 92, dt);
    y.backward(dy);
    yc.backward(dy.to(Device::cuda()));
    CHECK(bit_equal(xl.grad(), xlc.grad()));
    // Global pooling of long planes: the block reduction (within the sum tolerance).
    const double tol = dt == DType::f16 ? 1e-2 : dt == DType::f32 ? 1e-5 : 1e-12;
    CHECK(max_abs_diff(adaptive_avg_pool2d(x, 1), adaptive_avg_pool2d(xc, 1)) <= tol);
  }
}

// ---------------------------------------------------------------- PyTorch 2.11 goldens

TEST_CASE("golden values from PyTorch 2.11 (F.max_pool2d, avg_pool2d, adaptive_avg_pool2d, batch_norm)") {
  // x[i] = 2 sin(0.7 i) + 0.1 i, [1, 2, 5, 4] f64; dy[i] = cos(1.3 i).
  std::vector<double> xv, dyv;
  for (int i = 0; i < 40; ++i) {
    xv.push_back(std::sin(i * 0.7) * 2 + 0.1 * i);
    dyv.push_back(std::cos(i * 1.3));
  }
  Tensor x = Tensor::from_vector(xv, {1, 2, 5, 4}), dy = Tensor::from_vector(dyv, {1, 2, 5, 4});
  CHECK(values(max_pool2d_with_indices(x, 3, Size2{2}, 1, 1, true).indices) ==
        std::vector<double>{1, 2, 3, 12, 11, 11, 12, 19, 19, 0, 1, 7, 9, 9, 11, 17, 18, 19});
  check_near(values(avg_pool2d(x, 3, Size2{2}, 1, true, false)),
             {0.5642113048519881, 0.49602172371582837, 0.38075675402454134, 1.0311498185053156, 0.6733512429951899,
              0.5173465741873317, 1.238191214524641, 1.3193263901021528, 1.4898740022249313, 2.2365805738940723,
              2.145585876879001, 2.1683512706228054, 2.3562646453044223, 2.584021158267421, 2.93074520617961,
              3.184314844918302, 3.619264666432264, 3.9359703707302565},
             1e-14);
  check_near(values(avg_pool2d(x, 3, Size2{2}, 1, true, true)),
             {0.25076057993421697, 0.3306811491438856, 0.12691891800818045, 0.687433212336877, 0.6733512429951899,
              0.2586732870936658, 0.550307206455396, 0.8795509267347685, 0.4966246674083104, 0.9940358106195877,
              1.4303905845860008, 0.7227837568742684, 1.5708430968696148, 2.584021158267421, 1.465372603089805,
              1.4152510421859121, 2.4128431109548427, 1.3119901235767522},
             1e-14);
  check_near(values(adaptive_avg_pool2d(x, 3)),
             {0.5642113048519881, 0.5536542085614719, 0.44731535579970694, 1.0311498185053156, 0.7513535773991188,
              0.5649838527780907, 1.238191214524641, 1.2340525840407637, 1.3785089600970706, 2.2365805738940723,
              2.1342031800070984, 2.1333184024811125, 2.3562646453044223, 2.410659134311326, 2.7187140598851083,
              3.184314844918302, 3.4609118142832678, 3.7794083494321153},
             1e-14);
  Tensor xl = param(x.clone());
  Tensor w = param(Tensor::from_vector<double>({0.5, -1.5}, {2})), b = param(Tensor::from_vector<double>({0.25, 1.0}, {2}));
  Tensor rm = Tensor::from_vector<double>({0.1, -0.2}, {2}), rv = Tensor::from_vector<double>({1.0, 2.0}, {2});
  Tensor y = batch_norm(xl, w, b, rm, rv, true, 0.1, 1e-5);
  y.backward(dy);
  check_near(values(rm), {0.19187155765754632, 0.13365682657219033}, 1e-13);
  check_near(values(rv), {1.0949570354288334, 2.0656498589495236}, 1e-13);
  const auto yv = values(y), dxv = values(xl.grad());
  check_near({yv.begin(), yv.begin() + 6},
             {-0.12427474219654104, 0.38583455993587534, 0.6733108198588006, 0.6202287938511121, 0.2688331214348603,
              -0.19832998868265098},
             1e-13);
  check_near({dxv.begin(), dxv.begin() + 6},
             {0.34769993048700576, 0.08845069511286956, -0.3190850778277391, -0.27199900109319547, 0.16004038087791844,
              0.3376652716755844},
             1e-12);
  check_near(values(w.grad()), {-0.5266812625851414, 0.38131695328440024}, 1e-12);
  check_near(values(b.grad()), {0.6780886404165533, 0.5523293247288505}, 1e-12);
}
