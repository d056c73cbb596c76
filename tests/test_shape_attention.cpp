// The shape ops (permute, slice / narrow, cat, split / chunk), matmul with
// broadcast batch dims, scaled_dot_product_attention and nn::MultiheadAttention
// against host references in double with seeded random inputs; SDPA against
// PyTorch 2.11's math backend (tests/data/golden_sdpa.json); CPU against CUDA
// where a GPU is present.
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "qgrad/kernels/attention.h"
#include "qgrad/kernels/formulas/attention.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "train_ops_helpers.h"

using namespace qgrad;
using namespace qgrad::testing;
using json = nlohmann::json;

namespace {

constexpr const char* kGoldenPath = QGRAD_SOURCE_DIR "/tests/data/golden_sdpa.json";

std::vector<std::int64_t> strides_of(const Shape& s) {
  std::vector<std::int64_t> st(s.size(), 1);
  for (std::size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}
// The multi-index of flat index i in shape s.
std::vector<std::int64_t> unravel(std::int64_t i, const Shape& s) {
  std::vector<std::int64_t> idx(s.size());
  for (std::size_t d = s.size(); d-- > 0;) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}

// |got - want| <= tol * max(1, |want|) elementwise.
void check_values_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element ", i, ": got ", got[i], ", want ", want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tol * std::max(1.0, std::fabs(want[i])));
  }
}

Tensor fresh(const Tensor& t, DType dt = DType::f64, Device dev = Device::cpu()) {
  return param(t.detach().to(dt).to(dev).clone().detach());
}

// Host attention in double: out [batch, L, Dv] and the probabilities, for
// flat q [batch, L, D], k [batch, S, D], v [batch, S, Dv]; mask(b, i, j)
// returns {masked, additive}.
struct HostAttention {
  std::vector<double> out, probs;
};
template <class Mask>
HostAttention host_attention(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                             std::int64_t batch, std::int64_t L, std::int64_t S, std::int64_t D, std::int64_t Dv,
                             double scale, bool causal, Mask mask) {
  HostAttention r;
  r.out.assign(static_cast<std::size_t>(batch * L * Dv), 0.0);
  r.probs.assign(static_cast<std::size_t>(batch * L * S), 0.0);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < L; ++i) {
      std::vector<double> z(static_cast<std::size_t>(S));
      double mx = -INFINITY;
      for (std::int64_t j = 0; j < S; ++j) {
        double s = 0;
        for (std::int64_t d = 0; d < D; ++d) s += q[static_cast<std::size_t>((b * L + i) * D + d)] * k[static_cast<std::size_t>((b * S + j) * D + d)];
        auto [masked, add] = mask(b, i, j);
        z[static_cast<std::size_t>(j)] = (masked || (causal && j > i)) ? -INFINITY : s * scale + add;
        mx = std::max(mx, z[static_cast<std::size_t>(j)]);
      }
      double sum = 0;
      for (double zz : z) sum += mx == -INFINITY ? 0.0 : std::exp(zz - mx);
      for (std::int64_t j = 0; j < S; ++j) {
        const double p = mx == -INFINITY ? 0.0 : std::exp(z[static_cast<std::size_t>(j)] - mx) / sum;
        r.probs[static_cast<std::size_t>((b * L + i) * S + j)] = p;
        for (std::int64_t e = 0; e < Dv; ++e) r.out[static_cast<std::size_t>((b * L + i) * Dv + e)] += p * v[static_cast<std::size_t>((b * S + j) * Dv + e)];
      }
    }
  return r;
}

}  // namespace

// ---------------------------------------------------------------- shape ops

TEST_CASE("permute: a host reference, f64 and s32, forward and backward") {
  const Shape s{2, 3, 4, 5};
  const std::vector<std::int64_t> perm{3, 1, 0, 2};
  Tensor x = param(rnd(s, 1));
  Tensor y = permute(x, {-1, 1, 0, 2});
  Shape os{5, 3, 2, 4};
  REQUIRE(y.shape() == os);
  const auto xv = values(x), yv = values(y);
  const auto st = strides_of(s);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const auto idx = unravel(i, os);
    std::int64_t off = 0;
    for (std::size_t d = 0; d < 4; ++d) off += idx[d] * st[static_cast<std::size_t>(perm[d])];
    REQUIRE(yv[static_cast<std::size_t>(i)] == xv[static_cast<std::size_t>(off)]);
  }
  Tensor dy = rnd(os, 2);
  y.backward(dy);
  CHECK(bit_equal(permute(x.grad(), {3, 1, 0, 2}), dy));  // the gradient is dy permuted back
  Tensor xi = Tensor::from_vector<std::int32_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK(permute(xi, {1, 0}).to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("copies in units (up to 16 bytes of a contiguous run) and merged dims: every element size, CPU and CUDA") {
  // The shape kernels group the elements of a contiguous innermost run into
  // copy units of up to 16 bytes and merge dims that stay adjacent; these
  // shapes take those paths (inner runs of 8 and 16 elements) and the
  // element-wise ones (odd runs), checked against index arithmetic here.
  const std::vector<DType> dtypes{DType::f64, DType::f32, DType::bf16, DType::s8};
  struct PermuteCase {
    Shape shape;
    std::vector<std::int64_t> perm;
  };
  const std::vector<PermuteCase> permutes{{{2, 3, 5, 2, 8}, {2, 0, 3, 1, 4}},  // the attention head split
                                          {{3, 4, 16}, {1, 0, 2}},
                                          {{2, 3, 4, 6}, {0, 1, 3, 2}},  // innermost dim moves: elements
                                          {{4, 1, 5, 7}, {2, 1, 0, 3}}};
  std::vector<Device> devices{Device::cpu()};
  if (cuda_available()) devices.push_back(Device::cuda(0));
  for (const DType dt : dtypes) {
    CAPTURE(dtype_name(dt));
    for (const auto& pc : permutes) {
      const Tensor x = (rnd(pc.shape, 81, DType::f64, 50.0)).to(dt);
      const auto xv = values(x.to(DType::f64));
      Shape os;
      for (std::int64_t d : pc.perm) os.push_back(pc.shape[static_cast<std::size_t>(d)]);
      const auto st = strides_of(pc.shape);
      std::vector<double> want(xv.size());
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        const auto idx = unravel(i, os);
        std::int64_t off = 0;
        for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[static_cast<std::size_t>(pc.perm[d])];
        want[static_cast<std::size_t>(i)] = xv[static_cast<std::size_t>(off)];
      }
      for (const Device dev : devices) {
        CAPTURE(dev.str());
        const Tensor y = permute(x.to(dev), pc.perm);
        CHECK(y.shape() == os);
        CHECK(values(y.cpu().to(DType::f64)) == want);
      }
    }
    // chunk along dim 0 (contiguous blocks), a slice of a middle dim with
    // step 1 and 2 (runs of 16 elements), and cat putting the pieces back.
    const Tensor x = (rnd({3, 6, 16}, 82, DType::f64, 50.0)).to(dt);
    const auto xv = values(x.to(DType::f64));
    for (const Device dev : devices) {
      CAPTURE(dev.str());
      const Tensor xd = x.to(dev);
      const std::vector<Tensor> parts = chunk(xd, 3, 0);
      REQUIRE(parts.size() == 3);
      for (std::size_t c = 0; c < 3; ++c) {
        const auto pv = values(parts[c].cpu().to(DType::f64));
        CHECK(std::equal(pv.begin(), pv.end(), xv.begin() + static_cast<std::ptrdiff_t>(c * 96)));
      }
      CHECK(values(cat(parts, 0).cpu().to(DType::f64)) == xv);
      for (const std::int64_t step : {1LL, 2LL}) {
        CAPTURE(step);
        const Tensor y = slice(xd, 1, 1, 6, step);
        const std::int64_t n = step == 1 ? 5 : 3;
        REQUIRE(y.shape() == Shape{3, n, 16});
        const auto yv = values(y.cpu().to(DType::f64));
        std::int64_t bad = 0;
        for (std::int64_t o = 0; o < 3; ++o)
          for (std::int64_t j = 0; j < n; ++j)
            for (std::int64_t i = 0; i < 16; ++i)
              bad += yv[static_cast<std::size_t>((o * n + j) * 16 + i)] !=
                     xv[static_cast<std::size_t>((o * 6 + 1 + step * j) * 16 + i)];
        CHECK(bad == 0);
      }
    }
  }
  // The gradient of chunk's pieces (slice backward: the piece in place,
  // zero elsewhere) in f32 units of 16 bytes, on every device.
  for (const Device dev : devices) {
    CAPTURE(dev.str());
    Tensor w = param(rnd({3, 4, 8}, 83, DType::f32).to(dev));
    const std::vector<Tensor> parts = chunk(w, 3, 0);
    Tensor dy = rnd({1, 4, 8}, 84, DType::f32);
    parts[1].backward(dy.to(dev));
    const auto g = values(w.grad().cpu().to(DType::f64)), dv = values(dy.to(DType::f64));
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == (i >= 32 && i < 64 ? dv[i - 32] : 0.0));
  }
}

TEST_CASE("slice and narrow: a host reference; the gradient is zero outside the selection") {
  Tensor x = param(rnd({3, 7, 2}, 3));
  Tensor y = slice(x, 1, 1, 7, 2);  // columns 1, 3, 5
  REQUIRE(y.shape() == Shape{3, 3, 2});
  const auto xv = values(x), yv = values(y);
  for (std::int64_t o = 0; o < 3; ++o)
    for (std::int64_t j = 0; j < 3; ++j)
      for (std::int64_t i = 0; i < 2; ++i)
        CHECK(yv[static_cast<std::size_t>((o * 3 + j) * 2 + i)] == xv[static_cast<std::size_t>((o * 7 + 1 + 2 * j) * 2 + i)]);
  Tensor dy = rnd({3, 3, 2}, 4);
  y.backward(dy);
  const auto g = values(x.grad()), dv = values(dy);
  for (std::int64_t f = 0; f < x.numel(); ++f) {
    const auto idx = unravel(f, {3, 7, 2});
    const bool sel = idx[1] % 2 == 1;
    const double want = sel ? dv[static_cast<std::size_t>((idx[0] * 3 + idx[1] / 2) * 2 + idx[2])] : 0.0;
    CHECK(g[static_cast<std::size_t>(f)] == want);
  }
  // narrow with a negative start; empty selections; step past the end.
  CHECK(bit_equal(narrow(x, 1, -3, 2), slice(x, 1, 4, 6)));
  CHECK(narrow(x, 1, 7, 0).shape() == Shape{3, 0, 2});
  CHECK(slice(x, 1, 6, 7, 5).shape() == Shape{3, 1, 2});
  CHECK(slice(x, 0, 0, 3, 100).shape() == Shape{1, 7, 2});
}

TEST_CASE("slice and cat with step 1 along the last dim: copy units across positions (16, 8, 4 bytes), against a "
          "host reference, on every device") {
  // A step-1 selection copies runs of count elements in rows of n: its copy
  // units span positions where n, start and count split into them (start 4:
  // 16-byte units of f32; start 2: 8 bytes; start 1: single elements).
  std::vector<Device> devices{Device::cpu()};
  if (cuda_available()) devices.push_back(Device::cuda(0));
  const Tensor x = rnd({5, 24}, 91, DType::f32, 10.0);
  const auto xv = values(x.to(DType::f64));
  for (const Device dev : devices) {
    CAPTURE(dev.str());
    for (const std::int64_t start : {4LL, 2LL, 1LL}) {
      CAPTURE(start);
      Tensor xd = param(x.to(dev).clone());  // a leaf of its own: gradients do not accumulate across starts
      if (dev.is_cuda()) prepoison({5, 24}, DType::f32);
      const Tensor y = slice(xd, 1, start, 20);
      const std::int64_t n = 20 - start;
      const auto yv = values(y.cpu().to(DType::f64));
      std::int64_t bad = 0;
      for (std::int64_t o = 0; o < 5; ++o)
        for (std::int64_t j = 0; j < n; ++j)
          bad += yv[static_cast<std::size_t>(o * n + j)] != xv[static_cast<std::size_t>(o * 24 + start + j)];
      CHECK(bad == 0);
      const Tensor dy = rnd({5, n}, 92, DType::f32);
      if (dev.is_cuda()) prepoison({5, 24}, DType::f32);
      y.backward(dy.to(dev));  // slice_backward: dy in place, zero elsewhere
      const auto g = values(xd.grad().cpu().to(DType::f64)), dv = values(dy.to(DType::f64));
      bad = 0;
      for (std::int64_t o = 0; o < 5; ++o)
        for (std::int64_t c = 0; c < 24; ++c) {
          const double want = c >= start && c < 20 ? dv[static_cast<std::size_t>(o * n + c - start)] : 0.0;
          bad += g[static_cast<std::size_t>(o * 24 + c)] != want;
        }
      CHECK(bad == 0);
    }
    // cat along the last dim: pieces of 8, 4, 8 (16-byte units) and 6, 2 (8-byte units).
    for (const std::vector<std::int64_t>& widths : {std::vector<std::int64_t>{8, 4, 8}, std::vector<std::int64_t>{6, 2}}) {
      std::vector<Tensor> pieces;
      std::vector<std::vector<double>> pv;
      std::int64_t total = 0;
      for (std::size_t i = 0; i < widths.size(); ++i) {
        pieces.push_back(rnd({5, widths[i]}, 93 + static_cast<std::uint64_t>(i), DType::f32).to(dev));
        pv.push_back(values(pieces.back().cpu().to(DType::f64)));
        total += widths[i];
      }
      if (dev.is_cuda()) prepoison({5, total}, DType::f32);
      const auto yv = values(cat(pieces, -1).cpu().to(DType::f64));
      std::int64_t bad = 0;
      for (std::int64_t o = 0; o < 5; ++o) {
        std::int64_t c0 = 0;
        for (std::size_t i = 0; i < widths.size(); ++i) {
          for (std::int64_t j = 0; j < widths[i]; ++j)
            bad += yv[static_cast<std::size_t>(o * total + c0 + j)] != pv[i][static_cast<std::size_t>(o * widths[i] + j)];
          c0 += widths[i];
        }
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("cat of more than one launch's eight operands, empty ones among them: forward and backward against a host "
          "reference, f32 and f16, on every device") {
  std::vector<Device> devices{Device::cpu()};
  if (cuda_available()) devices.push_back(Device::cuda(0));
  // Along dim 1 of [3, w, 5] (runs of 5w elements: single-element units),
  // and along the last dim of [3, w] with w multiples of 8 (16-byte units
  // for f16, 16 and 8 for f32 within each batch of eight).
  struct Case {
    std::vector<std::int64_t> widths;
    bool inner;
  };
  const std::vector<Case> cases{{{3, 0, 4, 8, 1, 2, 16, 5, 0, 7, 2}, true},
                                {{8, 16, 0, 8, 24, 8, 8, 16, 8, 8, 0, 40}, false}};
  for (const Device dev : devices)
    for (const DType dt : {DType::f32, DType::f16})
      for (const Case& cs : cases) {
        CAPTURE(dev.str());
        CAPTURE(dtype_name(dt));
        CAPTURE(cs.inner);
        auto shape_of = [&](std::int64_t w) { return cs.inner ? Shape{3, w, 5} : Shape{3, w}; };
        std::vector<Tensor> parts;
        std::vector<std::vector<double>> pv;
        std::int64_t total = 0;
        for (std::size_t i = 0; i < cs.widths.size(); ++i) {
          parts.push_back(param(rnd(shape_of(cs.widths[i]), 200 + i, dt).to(dev)));
          pv.push_back(values(parts.back().cpu().to(DType::f64)));
          total += cs.widths[i];
        }
        const std::int64_t inner = cs.inner ? 5 : 1, row = total * inner;
        if (dev.is_cuda()) prepoison(shape_of(total), dt);
        Tensor y = cat(parts, 1);
        REQUIRE(y.shape() == shape_of(total));
        const auto yv = values(y.cpu().to(DType::f64));
        const Tensor dy = rnd(shape_of(total), 300, dt);
        const auto dyv = values(dy.to(DType::f64));
        if (dev.is_cuda())
          for (const std::int64_t w : cs.widths) prepoison(shape_of(w), dt);
        y.backward(dy.to(dev));
        std::int64_t bad = 0, bad_grad = 0, c0 = 0;
        for (std::size_t i = 0; i < parts.size(); ++i) {
          const std::int64_t run = cs.widths[i] * inner;
          const auto gv = values(parts[i].grad().cpu().to(DType::f64));
          REQUIRE(gv.size() == static_cast<std::size_t>(3 * run));
          for (std::int64_t o = 0; o < 3; ++o)
            for (std::int64_t j = 0; j < run; ++j) {
              const auto at = static_cast<std::size_t>(o * row + c0 + j), in = static_cast<std::size_t>(o * run + j);
              bad += yv[at] != pv[i][in];
              bad_grad += gv[in] != dyv[at];
            }
          c0 += run;
        }
        CHECK(bad == 0);
        CHECK(bad_grad == 0);
      }
}

TEST_CASE("cat: a host reference along every dim, gradients are the matching slices, errors name the operand") {
  for (std::int64_t dim = 0; dim < 3; ++dim) {
    CAPTURE(dim);
    Shape sa{2, 3, 4}, sb{2, 3, 4};
    sb[static_cast<std::size_t>(dim)] = 1;
    Tensor a = param(rnd(sa, 5)), b = param(rnd(sb, 6));
    Tensor y = cat({a, b, a}, dim - 3);
    Shape os = sa;
    os[static_cast<std::size_t>(dim)] = 2 * sa[static_cast<std::size_t>(dim)] + 1;
    REQUIRE(y.shape() == os);
    const auto av = values(a), bv = values(b), yv = values(y);
    const auto sta = strides_of(sa), stb = strides_of(sb);
    const std::int64_t na = sa[static_cast<std::size_t>(dim)];
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      auto idx = unravel(i, os);
      std::int64_t& c = idx[static_cast<std::size_t>(dim)];
      double want;
      if (c < na || c > na) {
        if (c > na) c -= na + 1;
        want = av[static_cast<std::size_t>(std::inner_product(idx.begin(), idx.end(), sta.begin(), std::int64_t{0}))];
      } else {
        c = 0;
        want = bv[static_cast<std::size_t>(std::inner_product(idx.begin(), idx.end(), stb.begin(), std::int64_t{0}))];
      }
      REQUIRE(yv[static_cast<std::size_t>(i)] == want);
    }
    Tensor dy = rnd(os, 7);
    y.backward(dy);
    std::vector<Tensor> parts = split_with_sizes(dy, {na, 1, na}, dim);
    CHECK(bit_equal(a.grad(), add(parts[0], parts[2])));  // a used twice: its slices accumulate
    CHECK(bit_equal(b.grad(), parts[1]));
  }
  Tensor a = rnd({2, 3}, 8);
  try {
    cat({a, rnd({3, 3}, 9)}, 1);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "cat");
    CHECK(e.arg() == "tensors[1]");
  }
}

TEST_CASE("split / chunk: sizes as PyTorch; gradients accumulate over the pieces used, unused pieces add nothing") {
  Tensor x = param(rnd({7, 3}, 10));
  std::vector<Tensor> p = split(x, 3);
  REQUIRE(p.size() == 3);
  CHECK(p[0].shape() == Shape{3, 3});
  CHECK(p[2].shape() == Shape{1, 3});
  // Only pieces 0 and 2 used, piece 0 twice.
  Tensor loss = sum(add(mul(p[0], p[0]), mul(p[2], 5.0)));
  loss.backward();
  const auto xv = values(x), g = values(x.grad());
  for (std::int64_t r = 0; r < 7; ++r)
    for (std::int64_t c = 0; c < 3; ++c) {
      const auto i = static_cast<std::size_t>(r * 3 + c);
      const double want = r < 3 ? 2.0 * xv[i] : r == 6 ? 15.0 : 0.0;  // p[2] broadcast over 3 rows
      CHECK(g[i] == doctest::Approx(want).epsilon(1e-15));
    }
  // chunk: ceil(n / chunks) per piece, possibly fewer pieces; an empty dim
  // gives `chunks` empty pieces (torch.chunk).
  std::vector<Tensor> c = chunk(rnd({5}, 11), 4);
  REQUIRE(c.size() == 3);
  CHECK(c[0].numel() == 2);
  CHECK(c[2].numel() == 1);
  CHECK(chunk(Tensor::empty({0, 2}, opts()), 3).size() == 3);
  CHECK(split(Tensor::empty({0, 2}, opts()), 2).size() == 1);
  CHECK(split_with_sizes(rnd({4, 2}, 12), {0, 4, 0}).size() == 3);
}

// ---------------------------------------------------------------- matmul

TEST_CASE("matmul: broadcast batch dims against a double-loop reference, all three plans, and their gradients") {
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {{{2, 1, 3, 4}, {3, 4, 5}},  // both broadcast (copies)
                        {{3, 2, 3, 4}, {4, 5}},      // b one matrix: folded
                        {{3, 4}, {2, 3, 4, 5}},      // a one matrix: batch stride 0
                        {{1, 3, 4}, {2, 1, 4, 5}},   // a one matrix with leading 1s
                        {{2, 3, 3, 4}, {2, 3, 4, 5}}};  // equal batches
  for (const Case& c : cases) {
    CAPTURE(shape_str(c.a));
    CAPTURE(shape_str(c.b));
    for (const DType dt : {DType::f64, DType::f32}) {
      Tensor a = param(rnd(c.a, 13, dt)), b = param(rnd(c.b, 14, dt));
      Tensor y = matmul(a, b);
      const Shape ba(c.a.begin(), c.a.end() - 2), bb(c.b.begin(), c.b.end() - 2);
      const Shape batch = check::broadcast_shapes(ba, bb, "test");
      Shape os = batch;
      os.push_back(c.a[c.a.size() - 2]);
      os.push_back(c.b.back());
      REQUIRE(y.shape() == os);
      const std::int64_t M = c.a[c.a.size() - 2], K = c.a.back(), N = c.b.back();
      const auto av = values(a), bv = values(b), yv = values(y);
      // The batch offset of an operand: its own dims, broadcast ones at 0.
      auto batch_off = [&](const std::vector<std::int64_t>& idx, const Shape& own) {
        std::int64_t off = 0, stride = 1;
        for (std::size_t d = own.size(); d-- > 0;) {
          const std::int64_t k = idx[idx.size() - own.size() + d];
          off += (own[d] == 1 ? 0 : k) * stride;
          stride *= own[d];
        }
        return off;
      };
      std::vector<double> ga(av.size(), 0.0), gb(bv.size(), 0.0);
      const std::vector<double> dy = values(rnd(os, 15));
      const std::int64_t nb = shape_numel(batch);
      for (std::int64_t t = 0; t < nb; ++t) {
        const auto idx = unravel(t, batch);
        const std::int64_t oa = batch_off(idx, ba) * M * K, ob = batch_off(idx, bb) * K * N;
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < N; ++n) {
            double s = 0;
            for (std::int64_t k = 0; k < K; ++k) s += av[static_cast<std::size_t>(oa + m * K + k)] * bv[static_cast<std::size_t>(ob + k * N + n)];
            const auto o = static_cast<std::size_t>((t * M + m) * N + n);
            CHECK(yv[o] == doctest::Approx(s).epsilon(dt == DType::f64 ? 1e-13 : 1e-5));
            for (std::int64_t k = 0; k < K; ++k) {
              ga[static_cast<std::size_t>(oa + m * K + k)] += dy[o] * bv[static_cast<std::size_t>(ob + k * N + n)];
              gb[static_cast<std::size_t>(ob + k * N + n)] += dy[o] * av[static_cast<std::size_t>(oa + m * K + k)];
            }
          }
      }
      y.backward(rnd(os, 15).to(dt));
      check_near(values(a.grad()), ga, dt == DType::f64 ? 1e-12 : 1e-4);
      check_near(values(b.grad()), gb, dt == DType::f64 ? 1e-12 : 1e-4);
    }
  }
}

TEST_CASE("matmul: many small batches (OpenMP over batches) give the bits of a batch-by-batch product") {
  Tensor a = rnd({64, 5, 7}, 16, DType::f32), b = rnd({64, 7, 3}, 17, DType::f32);
  Tensor y = matmul(a, b);
  for (std::int64_t i = 0; i < 64; i += 9) CHECK(bit_equal(matmul(narrow(a, 0, i, 1), narrow(b, 0, i, 1)), narrow(y, 0, i, 1)));
}

// ---------------------------------------------------------------- attention

TEST_CASE("scaled_dot_product_attention: a host reference in f64 (masks, causal, zero rows) and gradcheck") {
  const std::int64_t B = 2, H = 3, L = 4, S = 6, D = 5, Dv = 3;
  Tensor q = param(rnd({B, H, L, D}, 20)), k = param(rnd({B, H, S, D}, 21)), v = param(rnd({B, H, S, Dv}, 22));
  Tensor add_mask = param(rnd({L, S}, 23));
  std::vector<bool> keep(static_cast<std::size_t>(B * S));
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = i >= static_cast<std::size_t>(S) ? false : (i % 3 != 1);
  Tensor bmask = Tensor::from_vector(keep, {B, 1, 1, S});  // batch 1: every key hidden
  const auto qv = values(q), kv = values(k), vv = values(v), mv = values(add_mask);
  const double scale = 1.0 / std::sqrt(5.0);
  {
    HostAttention want = host_attention(qv, kv, vv, B * H, L, S, D, Dv, scale, false, [&](std::int64_t, std::int64_t i, std::int64_t j) {
      return std::pair<bool, double>{false, mv[static_cast<std::size_t>(i * S + j)]};
    });
    check_near(values(scaled_dot_product_attention(q, k, v, add_mask)), want.out, 1e-13);
  }
  {
    HostAttention want = host_attention(qv, kv, vv, B * H, L, S, D, Dv, 0.25, true, [&](std::int64_t bh, std::int64_t, std::int64_t j) {
      return std::pair<bool, double>{!keep[static_cast<std::size_t>((bh / H) * S + j)], 0.0};
    });
    Tensor y = scaled_dot_product_attention(q, k, v, bmask, true, 0.25);
    check_near(values(y), want.out, 1e-13);
    const auto yv = values(y);
    for (std::size_t i = static_cast<std::size_t>(H * L * Dv); i < yv.size(); ++i) CHECK(yv[i] == 0.0);  // all masked: zeros
  }
  check_grad([](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2], in[3]); },
             {q, k, v, add_mask});
  check_grad([bmask](const std::vector<Tensor>& in) {
               return scaled_dot_product_attention(in[0], in[1], in[2], bmask, true, 0.7);
             },
             {q, k, v});
  check_grad([](const std::vector<Tensor>& in) {
               Generator g(5);
               return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), false, std::nullopt, 0.4, g);
             },
             {q, k, v});
}

TEST_CASE("scaled_dot_product_attention: dropout is the dropout op's mask on the probabilities (same generator draw)") {
  const std::int64_t B = 2, H = 2, L = 5, S = 7, D = 4;
  Tensor q = rnd({B, H, L, D}, 30), k = rnd({B, H, S, D}, 31), v = rnd({B, H, S, D}, 32);
  Generator g1(99), g2(99);
  g1.advance(13);
  g2.advance(13);
  Tensor y = scaled_dot_product_attention(q, k, v, Tensor(), false, std::nullopt, 0.3, g1);
  Tensor probs = softmax(mul(matmul(q, transpose(k, -1, -2)), 0.5), -1);
  Tensor want = matmul(dropout(probs, 0.3, true, g2), v);
  CHECK(max_abs_diff(y, want) < 1e-13);
  CHECK(g1.offset() == g2.offset());
  // A failed call draws nothing.
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, rnd({3, 3}, 1), false, std::nullopt, 0.3, g1), Error);
  CHECK(g1.offset() == g2.offset());
}

TEST_CASE("scaled_dot_product_attention: f32 matches PyTorch 2.11's math backend (golden values)") {
  std::ifstream f(kGoldenPath);
  if (!f) {
    std::printf("SKIPPED: %s missing (run tests/python/gen_sdpa_golden.py)\n", kGoldenPath);
    return;
  }
  const json doc = json::parse(f);
  auto filled = [](const Shape& s, auto fn) {
    std::vector<float> v(static_cast<std::size_t>(shape_numel(s)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(fn(static_cast<double>(i)));
    return Tensor::from_vector(v, s);
  };
  for (const auto& c : doc["cases"]) {
    const std::string name = c["name"];
    CAPTURE(name);
    const std::int64_t B = c["B"], H = c["H"], L = c["L"], S = c["S"], D = c["D"], Dv = c["Dv"];
    const std::string mk = c["mask"];
    const bool causal = c["causal"];
    std::optional<double> scale;
    if (!c["scale"].is_null()) scale = c["scale"].get<double>();
    for (const Device dev : test_devices()) {
      CAPTURE(dev.str());
      Tensor q = param(filled({B, H, L, D}, [](double i) { return std::sin(0.37 * i + 0.1); }).to(dev));
      Tensor k = param(filled({B, H, S, D}, [](double i) { return std::cos(0.23 * i); }).to(dev));
      Tensor v = param(filled({B, H, S, Dv}, [](double i) { return 2.0 * std::sin(0.11 * i + 0.5); }).to(dev));
      Tensor mask;
      if (mk == "additive") mask = param(filled({L, S}, [](double i) { return 0.5 * std::cos(0.7 * i); }).to(dev));
      if (mk == "bool") {
        std::vector<bool> keep(static_cast<std::size_t>(B * L * S));
        for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = (i * 7) % 5 != 0;
        mask = Tensor::from_vector(keep, {B, 1, L, S}, dev);
      }
      Tensor out = scaled_dot_product_attention(q, k, v, mask, causal, scale);
      Tensor w = filled(out.shape(), [](double i) { return std::cos(0.05 * i); }).to(dev);
      sum(mul(out, w)).backward();
      // f32 against PyTorch: 1e-5 relative to max(1, |x|) (torch scales q
      // and k by sqrt(scale) each before its GEMM; qgrad scales the scores).
      check_values_near(values(out), c["out"].get<std::vector<double>>(), 1e-5);
      check_values_near(values(q.grad()), c["dq"].get<std::vector<double>>(), 1e-5);
      check_values_near(values(k.grad()), c["dk"].get<std::vector<double>>(), 1e-5);
      check_values_near(values(v.grad()), c["dv"].get<std::vector<double>>(), 1e-5);
      if (mk == "additive") check_values_near(values(mask.grad()), c["dmask"].get<std::vector<double>>(), 1e-5);
    }
  }
}

TEST_CASE("scaled_dot_product_attention: CUDA matches the CPU in every dtype, dropout masks identical") {
  QGRAD_REQUIRE_GPU();
  const std::int64_t B = 3, H = 2, L = 37, S = 70, D = 16;
  for (const DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : dt == DType::f16 ? 1e-2 : 6e-2;
    Tensor q = rnd({B, H, L, D}, 40, dt), k = rnd({B, H, S, D}, 41, dt), v = rnd({B, H, S, D}, 42, dt);
    Tensor m = rnd({B, 1, L, S}, 43, dt);
    Tensor y[2], gq[2], gk[2], gv[2], gm[2];
    int i = 0;
    for (const Device dev : {Device::cpu(), Device::cuda(0)}) {
      Tensor ql = fresh(q, dt, dev), kl = fresh(k, dt, dev), vl = fresh(v, dt, dev), ml = fresh(m, dt, dev);
      Generator g(7);
      y[i] = scaled_dot_product_attention(ql, kl, vl, ml, true, std::nullopt, 0.25, g);
      y[i].backward(rnd(y[i].shape(), 44, dt).to(dev));
      gq[i] = ql.grad();
      gk[i] = kl.grad();
      gv[i] = vl.grad();
      gm[i] = ml.grad();
      ++i;
    }
    for (auto* pair : {y, gq, gk, gv, gm}) {
      const auto a = values(pair[0]), b = values(pair[1]);
      for (std::size_t e = 0; e < a.size(); ++e) CHECK(std::fabs(a[e] - b[e]) <= tol * std::max(1.0, std::fabs(a[e])));
    }
  }
}

TEST_CASE("packed_attention: the fused kernel and the fallback against the composition, both devices") {
  struct Case {
    std::int64_t B, L, D, H;
    bool causal, fused;
  };
  // Fused: odd and 49-long sequences, L = 64, a head dim of 64, L = 1; past the reach (the
  // composition): L = 65, and L = head dim = 64 (100 KiB of shared memory in f32).
  const Case cases[] = {{2, 5, 12, 3, true, true},  {3, 49, 64, 2, false, true}, {1, 64, 64, 2, true, true},
                        {2, 40, 128, 2, false, true}, {2, 1, 8, 2, false, true},   {1, 65, 8, 2, true, false},
                        {1, 64, 64, 1, false, false}};
  for (const Case& c : cases) {
    CAPTURE(c.L);
    CAPTURE(c.D);
    CHECK(kernels::packed_attention_fits(c.L, c.D / c.H, DType::f32) == c.fused);
    const Tensor qkv0 = rnd({c.B, c.L, 3 * c.D}, 60 + static_cast<std::uint64_t>(c.L)),
                 dy0 = rnd({c.B, c.L, c.D}, 61);
    // The reference: the head split, scaled_dot_product_attention, the merge, in f64 on the CPU.
    Tensor ref_in = fresh(qkv0);
    const std::int64_t Dh = c.D / c.H;
    std::vector<Tensor> parts = chunk(permute(ref_in.reshape({c.B, c.L, 3, c.H, Dh}), {2, 0, 3, 1, 4}), 3, 0);
    auto heads = [&](const Tensor& t) { return t.reshape({c.B, c.H, c.L, Dh}); };
    Tensor ref = permute(scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), Tensor(),
                                                      c.causal),
                         {0, 2, 1, 3})
                     .reshape({c.B, c.L, c.D});
    ref.backward(dy0);
    for (const Device dev : test_devices())
      for (const DType dt : {DType::f64, DType::f32}) {
        CAPTURE(dev.str());
        CAPTURE(dtype_name(dt));
        const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
        Tensor in = fresh(qkv0, dt, dev);
        if (dev.is_cuda()) prepoison({c.B, c.L, c.D}, dt);
        Tensor y = packed_attention(in, c.H, c.causal);
        REQUIRE(y.shape() == Shape{c.B, c.L, c.D});
        check_values_near(values(y), values(ref), tol);
        if (dev.is_cuda()) prepoison({c.B, c.L, 3 * c.D}, dt);
        y.backward(dy0.to(dt).to(dev));
        check_values_near(values(in.grad()), values(ref_in.grad()), tol);
      }
  }
  // f64 gradients on both paths (the fused one and, at L = 65, the composition).
  for (const std::int64_t L : {std::int64_t{6}, std::int64_t{65}})
    check_grad([](const std::vector<Tensor>& in) { return packed_attention(in[0], 2, true, 0.8); },
               {param(rnd({1, L, 12}, 62))});
}

// f32 on CUDA: the fused kernels' bits are the CPU loop's order (docs/ops.md,
// "packed_attention") with CUDA's expf. The host emulates every sum in that
// order (each product a fused multiply-add chain from index 0, dP . P in
// lane_sum's order) and takes the probabilities from CUDA's softmax of the
// host's logits, the same exp, max and lane_sum order: so the output and
// every element of dqkv must match bit for bit. Sequences across the 16-key
// tile columns' edges (5, 17, 33, 49, 64), every head-dim tile count, causal
// or not.
TEST_CASE("packed_attention in f32 on CUDA: the bits of the CPU loop's order with CUDA's exp") {
  QGRAD_REQUIRE_GPU();
  struct Case {
    std::int64_t B, L, D, H;
    bool causal;
  };
  const Case cases[] = {{2, 49, 128, 4, false}, {2, 49, 128, 4, true}, {1, 64, 64, 2, true}, {2, 5, 12, 3, true},
                        {2, 17, 16, 1, false},  {1, 33, 64, 1, true},  {2, 40, 96, 2, false}};
  const double scale = 0.3;
  const Device gpu = Device::cuda(0);
  for (const Case& c : cases) {
    CAPTURE(c.L);
    CAPTURE(c.D);
    CAPTURE(c.causal);
    const std::int64_t L = c.L, D = c.D, H = c.H, Dh = D / H, W3 = 3 * D;
    REQUIRE(kernels::packed_attention_fits(L, Dh, DType::f32));
    const Tensor qkv = rnd({c.B, L, W3}, 90 + static_cast<std::uint64_t>(L), DType::f32);
    const Tensor dy = rnd({c.B, L, D}, 91 + static_cast<std::uint64_t>(L), DType::f32);
    const std::vector<float> x = qkv.to_vector<float>(), g = dy.to_vector<float>();
    const float sc = static_cast<float>(scale);
    auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
    // q, k, v element (b, h, i, d) of the packed rows, and dO's.
    auto qv = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d, int part) {
      return x[at((b * L + i) * W3 + part * D + h * Dh + d)];
    };
    auto gv = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) { return g[at((b * L + i) * D + h * Dh + d)]; };
    // The logits on the host, then their softmax on CUDA.
    std::vector<float> z(at(c.B * H * L * L));
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < L; ++i)
          for (std::int64_t j = 0; j < L; ++j) {
            float acc = 0.0f;
            for (std::int64_t d = 0; d < Dh; ++d) acc = formulas::fused_multiply_add(qv(b, h, i, d, 0), qv(b, h, j, d, 1), acc);
            z[at(((b * H + h) * L + i) * L + j)] = formulas::packed_logit(acc, sc, c.causal, i, j);
          }
    const std::vector<float> P =
        softmax(Tensor::from_vector(z, {c.B * H * L, L}).to(gpu), -1).cpu().to_vector<float>();
    auto pv = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) { return P[at(((b * H + h) * L + i) * L + j)]; };
    std::vector<float> out(at(c.B * L * D)), dqkv(at(c.B * L * W3));
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < H; ++h) {
        std::vector<float> ds(at(L * L));
        for (std::int64_t i = 0; i < L; ++i) {
          for (std::int64_t d = 0; d < Dh; ++d) {
            float o = 0.0f;
            for (std::int64_t j = 0; j < L; ++j) o = formulas::fused_multiply_add(pv(b, h, i, j), qv(b, h, j, d, 2), o);
            out[at((b * L + i) * D + h * Dh + d)] = o;
          }
          std::vector<float> dp(at(L));
          for (std::int64_t j = 0; j < L; ++j) {
            float acc = 0.0f;
            for (std::int64_t d = 0; d < Dh; ++d) acc = formulas::fused_multiply_add(gv(b, h, i, d), qv(b, h, j, d, 2), acc);
            dp[at(j)] = acc;
          }
          const float dot = formulas::lane_sum<float>(L, [&](std::int64_t j) { return dp[at(j)] * pv(b, h, i, j); });
          for (std::int64_t j = 0; j < L; ++j) ds[at(i * L + j)] = formulas::packed_logit_grad(pv(b, h, i, j), dp[at(j)], dot, sc);
        }
        for (std::int64_t r = 0; r < L; ++r)
          for (std::int64_t d = 0; d < Dh; ++d) {
            float dq = 0.0f, dk = 0.0f, dv = 0.0f;
            for (std::int64_t t = 0; t < L; ++t) {
              dq = formulas::fused_multiply_add(ds[at(r * L + t)], qv(b, h, t, d, 1), dq);
              dk = formulas::fused_multiply_add(ds[at(t * L + r)], qv(b, h, t, d, 0), dk);
              dv = formulas::fused_multiply_add(pv(b, h, t, r), gv(b, h, t, d), dv);
            }
            dqkv[at((b * L + r) * W3 + h * Dh + d)] = dq;
            dqkv[at((b * L + r) * W3 + D + h * Dh + d)] = dk;
            dqkv[at((b * L + r) * W3 + 2 * D + h * Dh + d)] = dv;
          }
      }
    Tensor in = param(qkv.to(gpu).clone().detach());
    prepoison({c.B, L, D}, DType::f32);
    Tensor y = packed_attention(in, H, c.causal, scale);
    CHECK(bit_equal(y, Tensor::from_vector(out, {c.B, L, D})));
    prepoison({c.B, L, W3}, DType::f32);
    y.backward(dy.to(gpu));
    CHECK(bit_equal(in.grad(), Tensor::from_vector(dqkv, {c.B, L, W3})));
  }
}

// f16 and bf16: CUDA's tensor-core kernels (every head-dim tile count, odd and
// 49-long sequences, causal or not) and the CPU's loop, each within the
// dtype's rounding of an f64 reference on the same rounded inputs, and close
// to each other; the probabilities and logit gradients enter their products
// rounded to the dtype on both devices (formulas::packed_operand), so what
// remains between them is the order of the sums.
TEST_CASE("packed_attention in f16 and bf16: the tensor-core kernel and the CPU within the dtype's rounding of "
          "an f64 reference") {
  struct Case {
    std::int64_t B, L, D, H;
    bool causal;
  };
  const Case cases[] = {{2, 5, 12, 3, true},   {3, 49, 128, 4, false}, {2, 49, 64, 2, true}, {1, 64, 64, 2, false},
                        {2, 40, 128, 2, true}, {2, 17, 96, 2, true},   {2, 1, 8, 2, false}};
  for (const Case& c : cases)
    for (const DType dt : {DType::bf16, DType::f16}) {
      CAPTURE(c.L);
      CAPTURE(c.D);
      CAPTURE(dtype_name(dt));
      REQUIRE(kernels::packed_attention_fits(c.L, c.D / c.H, dt));
      // Inputs rounded to the dtype once; the reference takes those values exactly.
      const Tensor qkv = rnd({c.B, c.L, 3 * c.D}, 90 + static_cast<std::uint64_t>(c.L)).to(dt);
      const Tensor dy = rnd({c.B, c.L, c.D}, 91).to(dt);
      Tensor ref_in = fresh(qkv);
      const std::int64_t Dh = c.D / c.H;
      std::vector<Tensor> parts = chunk(permute(ref_in.reshape({c.B, c.L, 3, c.H, Dh}), {2, 0, 3, 1, 4}), 3, 0);
      auto heads = [&](const Tensor& t) { return t.reshape({c.B, c.H, c.L, Dh}); };
      Tensor ref = permute(scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                                        Tensor(), c.causal),
                           {0, 2, 1, 3})
                       .reshape({c.B, c.L, c.D});
      ref.backward(dy.to(DType::f64));
      // One rounding of each operand and of the result (2^-8 in bf16, 2^-11 in f16) over sums of up to 64 terms.
      const double tol = dt == DType::bf16 ? 3e-2 : 5e-3;
      std::vector<std::vector<double>> got;  // y and dqkv per device
      for (const Device dev : test_devices()) {
        CAPTURE(dev.str());
        Tensor in = fresh(qkv, dt, dev);
        if (dev.is_cuda()) prepoison({c.B, c.L, c.D}, dt);
        Tensor y = packed_attention(in, c.H, c.causal);
        check_values_near(values(y), values(ref), tol);
        if (dev.is_cuda()) prepoison({c.B, c.L, 3 * c.D}, dt);
        y.backward(dy.to(dev));
        check_values_near(values(in.grad()), values(ref_in.grad()), tol);
        got.push_back(values(y));
        got.push_back(values(in.grad()));
      }
      if (got.size() == 4) {  // CPU and CUDA: a few steps of the dtype apart at most
        check_values_near(got[2], got[0], tol / 2);
        check_values_near(got[3], got[1], tol / 2);
      }
    }
}

// ---------------------------------------------------------------- nn

TEST_CASE("MultiheadAttention: a host reference, parameter names, head-count errors") {
  const std::int64_t B = 2, L = 5, E = 12, H = 3, Dh = E / H;
  Generator g(50);
  nn::MultiheadAttention mha(E, H, g, 0.0, true, opts());
  std::vector<std::string> names;
  for (const auto& [name, t] : mha.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias"});
  CHECK(mha.in_proj()->weight().shape() == Shape{3 * E, E});
  Tensor x = rnd({B, L, E}, 51);
  Tensor y = mha.forward(x, Tensor(), true);
  REQUIRE(y.shape() == Shape{B, L, E});
  // Host: qkv = x W_inᵀ + b_in; heads; causal attention; out = o W_outᵀ + b_out.
  {
    NoGradGuard ng;
    mha.in_proj()->bias().copy_(rnd({3 * E}, 52));
    mha.out_proj()->bias().copy_(rnd({E}, 53));
  }
  y = mha.forward(x, Tensor(), true);
  const auto xv = values(x), wi = values(mha.in_proj()->weight()), bi = values(mha.in_proj()->bias());
  const auto wo = values(mha.out_proj()->weight()), bo = values(mha.out_proj()->bias());
  std::vector<double> qkv(static_cast<std::size_t>(B * L * 3 * E));
  for (std::int64_t r = 0; r < B * L; ++r)
    for (std::int64_t o = 0; o < 3 * E; ++o) {
      double s = bi[static_cast<std::size_t>(o)];
      for (std::int64_t e = 0; e < E; ++e) s += xv[static_cast<std::size_t>(r * E + e)] * wi[static_cast<std::size_t>(o * E + e)];
      qkv[static_cast<std::size_t>(r * 3 * E + o)] = s;
    }
  // Per (b, h): q, k, v [L, Dh] gathered from qkv.
  std::vector<double> qh, kh, vh;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t l = 0; l < L; ++l)
        for (std::int64_t d = 0; d < Dh; ++d) {
          const auto base = static_cast<std::size_t>((b * L + l) * 3 * E + h * Dh + d);
          qh.push_back(qkv[base]);
          kh.push_back(qkv[base + static_cast<std::size_t>(E)]);
          vh.push_back(qkv[base + static_cast<std::size_t>(2 * E)]);
        }
  HostAttention att = host_attention(qh, kh, vh, B * H, L, L, Dh, Dh, 1.0 / std::sqrt(double(Dh)), true,
                                     [](std::int64_t, std::int64_t, std::int64_t) { return std::pair<bool, double>{false, 0.0}; });
  std::vector<double> want(static_cast<std::size_t>(B * L * E));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t o = 0; o < E; ++o) {
        double s = bo[static_cast<std::size_t>(o)];
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < Dh; ++d)
            s += att.out[static_cast<std::size_t>(((b * H + h) * L + l) * Dh + d)] * wo[static_cast<std::size_t>(o * E + h * Dh + d)];
        want[static_cast<std::size_t>((b * L + l) * E + o)] = s;
      }
  check_near(values(y), want, 1e-12);
  // Gradients reach every parameter.
  sum(y).backward();
  for (const auto& row : mha.named_parameters()) {
    const auto& name = std::get<0>(row);
    const auto& t = std::get<1>(row);
    CAPTURE(name);
    CHECK(t.grad().defined());
  }
  auto bad = [](auto f, const char* arg) {
    try {
      f();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.op() == "MultiheadAttention");
      CHECK(e.arg() == arg);
    }
  };
  Generator g2(1);
  bad([&] { nn::MultiheadAttention(130, 4, g2); }, "num_heads");
  bad([&] { nn::MultiheadAttention(128, 0, g2); }, "num_heads");
  bad([&] { nn::MultiheadAttention(0, 1, g2); }, "embed_dim");
  bad([&] { nn::MultiheadAttention(8, 2, g2, 1.5); }, "dropout");
  bad([&] { mha.forward(rnd({2, 5, 8}, 1)); }, "x");
  bad([&] { mha.forward(rnd({5, 12}, 1)); }, "x");
}
