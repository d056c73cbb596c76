// Registry entries: int4 per group and FP8 (ops/lowbit.h), and the
// conversions of Tensor::to to and from the s4 / u4 / f8e4m3 / f8e5m2
// storage dtypes. Host references transcribe torchao's formulas
// (docs/ops.md, "Int4 and FP8").
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};
using Tensors = std::vector<Tensor>;
using Grads = std::vector<std::vector<double>>;

std::vector<double> host(const Tensor& t) { return t.detach().to(DType::f64).cpu().to_vector<double>(); }
Tensor f32_on(const std::vector<float>& v, const Shape& s, Device d) { return Tensor::from_vector(v, s, d); }
Tensor s32_on(const std::vector<std::int32_t>& v, const Shape& s, Device d) { return Tensor::from_vector(v, s, d); }

// Straight-through of the int4 fake quantize / quantize: dx = dy where
// qmin <= nearbyint(x * float(1 / s)) + zp <= qmax (x * inv in op math).
Grads int4_straight_through(const Tensor& x, const Tensor& dy, const std::vector<double>& scales,
                            const std::vector<double>& zps, std::int64_t group, int qmin, int qmax) {
  const auto xs = host(x), gs = host(dy);
  std::vector<double> dx(xs.size());
  const bool f64 = x.dtype() == DType::f64;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::size_t g = i / static_cast<std::size_t>(group);
    const float inv = 1.0f / static_cast<float>(scales[g]);
    const double v = f64 ? xs[i] * static_cast<double>(inv) : static_cast<double>(static_cast<float>(xs[i]) * inv);
    const double q = std::nearbyint(v) + zps[g];
    dx[i] = (q >= qmin && q <= qmax) ? gs[i] : 0.0;
  }
  return {dx};
}

// torchao's _choose_qparams_affine over groups, in f32 (the host reference
// of choose_qparams_int4).
void int4_ref_qparams(const std::vector<double>& xs, std::int64_t group, bool symmetric, int qmin, int qmax, float eps,
                      std::vector<double>& scales, std::vector<double>& zps) {
  for (std::size_t g0 = 0; g0 < xs.size(); g0 += static_cast<std::size_t>(group)) {
    float mn = INFINITY, mx = -INFINITY;
    for (std::size_t i = g0; i < g0 + static_cast<std::size_t>(group); ++i) {
      mn = std::min(mn, static_cast<float>(xs[i]));
      mx = std::max(mx, static_cast<float>(xs[i]));
    }
    const float min_neg = std::min(mn, 0.0f), max_pos = std::max(mx, 0.0f);
    float s = symmetric ? std::max(-min_neg, max_pos) / (static_cast<float>(qmax - qmin) / 2.0f)
                        : (max_pos - min_neg) / static_cast<float>(qmax - qmin);
    s = std::max(s, eps);
    double z = symmetric ? (qmax + qmin + 1) / 2 : std::clamp<double>(qmin - std::nearbyint(min_neg / s), qmin, qmax);
    scales.push_back(s);
    zps.push_back(z);
  }
}

// [6, cols] random rows, and rows that test the qparams: row 0 all zero,
// row 1 tiny (range < 255 * FLT_EPSILON: the eps floor binds), row 2 all
// positive, row 3 all negative; -0 at (0, 3) and (4, 4).
Tensor qparams_rows(Device d, DType dt, Generator& g, std::int64_t cols) {
  Tensor x = randn({6, cols}, g, on(Device::cpu(), DType::f64), 0.0, 2.0);
  std::vector<double> v = x.to_vector<double>();
  const auto c = static_cast<std::size_t>(cols);
  for (std::size_t i = 0; i < c; ++i) {
    v[i] = 0.0;
    v[c + i] = 1e-6 * static_cast<double>(i % 7);
    v[2 * c + i] = std::fabs(v[2 * c + i]) + 0.25;
    v[3 * c + i] = -std::fabs(v[3 * c + i]) - 0.25;
  }
  v[3] = -0.0;
  v[4 * c + 4] = -0.0;
  return Tensor::from_vector(v, {6, cols}).to(dt).to(d);
}

// qparams_rows of 256 columns as a leaf (the dynamic fake quants' input).
Tensors rows256_leaf(Device d, DType dt, Generator& g) { return Tensors{leaf(qparams_rows(d, dt, g, 256))}; }

float eps_of(DType dt) { return dt == DType::f16 ? 6.103515625e-05f : 1.17549435e-38f; }

}  // namespace

std::vector<OpEntry> lowbit_entries() {
  std::vector<OpEntry> e;
  // Dynamic int4 fake quantize (the 8da4w weight fake quantizer) and its
  // qparams: s4 symmetric groups of 32 (differentiated), u4 asymmetric
  // groups of 64, and the qparams themselves.
  e.push_back({"fake_quantize_int4 (dynamic)", {"fake_quantize_int4", "choose_qparams_int4"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 Tensor x = randn({4, 128}, g, on(Device::cpu(), DType::f64), 0.0, 1.5);
                 std::vector<double> v = x.to_vector<double>();
                 for (std::size_t i = 64; i < 96; ++i) v[i] = 0.0;  // an all-zero group: scale = eps
                 v[200] = -0.0;
                 return Tensors{leaf(Tensor::from_vector(v, {4, 128}).to(dt).to(d))};
               },
               [](const Tensors& v) {
                 const Tensor xd = v[0].detach();
                 const Int4Qparams a = choose_qparams_int4(xd, 32, QuantMode::symmetric, DType::s4);
                 const Int4Qparams b = choose_qparams_int4(xd, 64, QuantMode::asymmetric, DType::u4);
                 return Tensors{fake_quantize_int4(v[0], 32, QuantMode::symmetric, DType::s4),
                                fake_quantize_int4(xd, 64, QuantMode::asymmetric, DType::u4), a.scale, a.zero_point,
                                b.scale, b.zero_point};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 std::vector<double> s, z;
                 int4_ref_qparams(host(v[0]), 32, true, -8, 7, eps_of(v[0].dtype()), s, z);
                 return int4_straight_through(v[0], dy, s, z, 32, -8, 7);
               },
               {},
               [](Device d) {
                 const char* op = "fake_quantize_int4";
                 const Tensor x = some({4, 64}, d);
                 return std::vector<BadInput>{
                     {op, "group_size", [=] { fake_quantize_int4(x, 48); }},
                     {op, "group_size", [=] { fake_quantize_int4(x, 0); }},
                     {op, "group_size", [=] { fake_quantize_int4(x, -32); }},
                     {op, "x", [=] { fake_quantize_int4(Tensor::scalar(1.0f, d), 32); }},
                     {op, "x", [=] { fake_quantize_int4(Tensor(), 32); }},
                     {op, "x", [=] { fake_quantize_int4(some({4, 64}, d, DType::s8), 32); }},
                     {op, "qtype", [=] { fake_quantize_int4(x, 32, QuantMode::symmetric, DType::s8); }},
                     {op, "mode", [=] { fake_quantize_int4(x, 32, static_cast<QuantMode>(7)); }},
                     {"choose_qparams_int4", "group_size", [=] { choose_qparams_int4(x, 128); }},
                     {"choose_qparams_int4", "qtype", [=] { choose_qparams_int4(x, 32, QuantMode::asymmetric, DType::f32); }}};
               },
               [](const Tensors& v) {
                 const auto xs = host(v[0]);
                 std::vector<double> s, z, y(xs.size());
                 int4_ref_qparams(xs, 32, true, -8, 7, eps_of(v[0].dtype()), s, z);
                 const bool f64 = v[0].dtype() == DType::f64;
                 for (std::size_t i = 0; i < xs.size(); ++i) {
                   const float sc = static_cast<float>(s[i / 32]), inv = 1.0f / sc;
                   const double t = f64 ? xs[i] * static_cast<double>(inv) : static_cast<double>(static_cast<float>(xs[i]) * inv);
                   const double q = std::clamp(std::nearbyint(t) + z[i / 32], -8.0, 7.0);
                   y[i] = static_cast<double>(static_cast<float>(q - z[i / 32]) * sc);
                 }
                 return y;
               }});

  // Given qparams: the scale grid's edges (ties, clamp bounds and beyond, +-0, +-1e30).
  e.push_back({"fake_quantize_int4 (given qparams)", {"fake_quantize_int4"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{quant_input({3, 64}, g, d, dt, 0.25, 0, -8, 7),
                                f32_on({0.25f, 0.5f, 0.125f, 0.25f, 1.0f, 0.0625f}, {3, 2}, d),
                                s32_on({0, 1, -2, 0, 3, -8}, {3, 2}, d)};
               },
               [](const Tensors& v) { return Tensors{fake_quantize_int4(v[0], v[1], v[2], 32, DType::s4)}; },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 return int4_straight_through(v[0], dy, host(v[1]), host(v[2]), 32, -8, 7);
               },
               {},
               [](Device d) {
                 const char* op = "fake_quantize_int4";
                 const Tensor x = some({3, 64}, d), s = full({3, 2}, 0.25, on(d)), z = zeros({3, 2}, on(d, DType::s32));
                 std::vector<BadInput> c{
                     {op, "group_size", [=] { fake_quantize_int4(x, s, z, 24); }},
                     {op, "scale", [=] { fake_quantize_int4(x, s, z, 16); }},
                     {op, "scale", [=] { fake_quantize_int4(x, s.to(DType::f64), z, 32); }},
                     {op, "scale", [=] { fake_quantize_int4(x, Tensor(), z, 32); }},
                     {op, "zero_point", [=] { fake_quantize_int4(x, s, z.to(DType::s64), 32); }},
                     {op, "zero_point", [=] { fake_quantize_int4(x, s, zeros({3, 1}, on(d, DType::s32)), 32); }},
                     {op, "zero_point", [=] { fake_quantize_int4(x, s, full({3, 2}, 8, on(d, DType::s32)), 32); }, true},
                     {op, "zero_point", [=] { fake_quantize_int4(x, s, full({3, 2}, -1, on(d, DType::s32)), 32, DType::u4); }, true}};
                 for (float bad : {0.0f, -0.5f, INFINITY, NAN, 1e-45f})
                   c.push_back({op, "scale", [=] { fake_quantize_int4(x, full({3, 2}, bad, on(d)), z, 32); }, true});
                 return c;
               }});

  // quantize -> dequantize to packed s4 (power-of-two scales: dy * s / s is
  // exact, so the gradient is the straight-through mask) and u4.
  e.push_back({"quantize_int4 -> dequantize_int4", {"quantize_int4", "dequantize_int4"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{quant_input({3, 64}, g, d, dt, 0.25, 0, -8, 7),
                                f32_on({0.25f, 0.5f, 0.125f, 0.25f, 1.0f, 0.0625f}, {3, 2}, d),
                                s32_on({0, 1, -2, 0, 3, -8}, {3, 2}, d), s32_on({8, 9, 6, 8, 11, 0}, {3, 2}, d)};
               },
               [](const Tensors& v) {
                 const Tensor q = quantize_int4(v[0], v[1], v[2], 32, DType::s4);
                 const Tensor qu = quantize_int4(v[0].detach(), v[1], v[3], 32, DType::u4);
                 return Tensors{dequantize_int4(q, v[1], v[2], 32, v[0].dtype()), q, qu,
                                dequantize_int4(qu, v[1], v[3], 32, DType::f32)};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 return int4_straight_through(v[0], dy, host(v[1]), host(v[2]), 32, -8, 7);
               },
               {},
               [](Device d) {
                 const Tensor x = some({3, 64}, d), s = full({3, 2}, 0.25, on(d)), z = zeros({3, 2}, on(d, DType::s32));
                 const Tensor q = zeros({3, 64}, on(d, DType::s4));
                 const Tensor xo = some({3, 63}, d), so = full({3, 1}, 0.25, on(d)), zo = zeros({3, 1}, on(d, DType::s32));
                 return std::vector<BadInput>{
                     {"quantize_int4", "x", [=] { quantize_int4(xo, so, zo, 63); }},  // odd last dim
                     {"quantize_int4", "group_size", [=] { quantize_int4(x, s, z, 48); }},
                     {"quantize_int4", "qtype", [=] { quantize_int4(x, s, z, 32, DType::s8); }},
                     {"quantize_int4", "x", [=] { quantize_int4(some({3, 64}, d, DType::s32), s, z, 32); }},
                     {"quantize_int4", "scale", [=] { quantize_int4(x, full({3, 2}, 0.0, on(d)), z, 32); }, true},
                     {"quantize_int4", "scale", [=] { quantize_int4(x, full({3, 2}, NAN, on(d)), z, 32); }, true},
                     {"quantize_int4", "zero_point", [=] { quantize_int4(x, s, full({3, 2}, 20, on(d, DType::s32)), 32, DType::u4); }, true},
                     {"dequantize_int4", "q", [=] { dequantize_int4(x, s, z, 32); }},
                     {"dequantize_int4", "q", [=] { dequantize_int4(Tensor(), s, z, 32); }},
                     {"dequantize_int4", "q", [=] { dequantize_int4(zeros({3, 63}, on(d, DType::s4)), so, zo, 63); }},
                     {"dequantize_int4", "out_dtype", [=] { dequantize_int4(q, s, z, 32, DType::s8); }},
                     {"dequantize_int4", "group_size", [=] { dequantize_int4(q, s, z, 5); }},
                     {"dequantize_int4", "scale", [=] { dequantize_int4(q, full({3, 4}, 0.25, on(d)), z, 32); }},
                     {"dequantize_int4", "zero_point", [=] { dequantize_int4(q, s, zeros({2}, on(d, DType::s32)), 32); }},
                     {"dequantize_int4", "scale", [=] { dequantize_int4(q, full({3, 2}, INFINITY, on(d)), z, 32); }, true}};
               }});

  // dequantize_int4 with a scale that requires grad (the composite path):
  // dscale by finite differences (the packed q and the zero point are
  // constants made inside the call: gradcheck takes f64 inputs only).
  e.push_back({"dequantize_int4 (scale gradient)", {"dequantize_int4"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{leaf(rand({4, 2}, g, on(d, dt), 0.05, 0.5))}; },
               [](const Tensors& v) {
                 const Device d = v[0].device();
                 std::vector<std::int8_t> qv(4 * 64);
                 for (std::size_t i = 0; i < qv.size(); ++i) qv[i] = static_cast<std::int8_t>((i * 7 + i / 5) % 16) - 8;
                 const Tensor q = Tensor::from_vector(qv, {4, 64}, d).to(DType::s4);
                 const Tensor z = s32_on({0, 1, -1, 2, 0, -3, 7, -8}, {4, 2}, d);
                 return Tensors{dequantize_int4(q, v[0], z, 32, v[0].dtype())};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const Tensor q = zeros({4, 64}, on(d, DType::s4)), z = zeros({4, 2}, on(d, DType::s32));
                 return std::vector<BadInput>{
                     {"dequantize_int4", "scale", [=] { dequantize_int4(q, leaf(full({4, 3}, 0.1, on(d))), z, 32); }},
                     {"dequantize_int4", "scale", [=] { dequantize_int4(q, zeros({4, 2}, on(d, DType::s32)), z, 32); }}};
               }});

  // Dynamic FP8 fake quantize in each scope (per tensor e4m3 differentiated;
  // per channel, token and 1x128 block of the detached x, both formats) and
  // the scales themselves.
  e.push_back({"fake_quantize_fp8 (dynamic)", {"fake_quantize_fp8", "fp8_scale"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 Tensor x = randn({4, 256}, g, on(Device::cpu(), DType::f64), 0.0, 3.0);
                 std::vector<double> v = x.to_vector<double>();
                 for (std::size_t i = 128; i < 256; ++i) v[i] = 0.0;  // an all-zero block
                 v[300] = -0.0;
                 v[301] = 1e-30;
                 v[302] = 1e4;
                 return Tensors{leaf(Tensor::from_vector(v, {4, 256}).to(dt).to(d))};
               },
               [](const Tensors& v) {
                 const Tensor xd = v[0].detach();
                 Tensors out{fake_quantize_fp8(v[0], QuantScope::per_tensor(), DType::f8e4m3)};
                 for (const QuantScope s : {QuantScope::per_channel(0), QuantScope::per_channel(-1), QuantScope::per_token(),
                                            QuantScope::per_group(-1, 128)})
                   for (const DType f : {DType::f8e4m3, DType::f8e5m2}) {
                     out.push_back(fake_quantize_fp8(xd, s, f));
                     out.push_back(fp8_scale(xd, s, f));
                   }
                 return out;
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors&, const Tensor& dy) { return Grads{host(dy)}; }, {},
               [](Device d) {
                 const char* op = "fake_quantize_fp8";
                 const Tensor x = some({4, 256}, d);
                 return std::vector<BadInput>{
                     {op, "fp8", [=] { fake_quantize_fp8(x, QuantScope::per_tensor(), DType::s8); }},
                     {op, "fp8", [=] { fake_quantize_fp8(x, QuantScope::per_tensor(), DType::f16); }},
                     {op, "group_size", [=] { fake_quantize_fp8(x, QuantScope::per_group(-1, 100)); }},
                     {op, "group_size", [=] { fake_quantize_fp8(x, QuantScope::per_group(-1, 0)); }},
                     {op, "scope", [=] { fake_quantize_fp8(x, QuantScope::per_group(0, 2)); }},
                     {op, "scope", [=] { fake_quantize_fp8(x, QuantScope{static_cast<QuantScope::Kind>(9), 0, 0}); }},
                     {op, "axis", [=] { fake_quantize_fp8(x, QuantScope::per_channel(2)); }},
                     {op, "x", [=] { fake_quantize_fp8(Tensor::scalar(1.0f, d), QuantScope::per_token()); }},
                     {op, "x", [=] { fake_quantize_fp8(some({4}, d, DType::u8), QuantScope::per_tensor()); }},
                     {"fp8_scale", "fp8", [=] { fp8_scale(x, QuantScope::per_tensor(), DType::u4); }},
                     {"fp8_scale", "x", [=] { fp8_scale(Tensor(), QuantScope::per_tensor()); }}};
               },
               [](const Tensors& v) {  // per tensor e4m3: the f64 run, by the torchao formula
                 const auto xs = host(v[0]);
                 float amax = 0.0f;
                 for (double x : xs) amax = std::max(amax, std::fabs(static_cast<float>(x)));
                 const float s = std::max(amax, 1e-12f) / 448.0f;
                 std::vector<double> y(xs.size());
                 for (std::size_t i = 0; i < xs.size(); ++i) {
                   const float t = std::clamp(static_cast<float>(xs[i]) / s, -448.0f, 448.0f);
                   y[i] = static_cast<double>(static_cast<float>(float8_e4m3(t))) * static_cast<double>(s);
                 }
                 return y;
               }});

  // Given per-channel scales, small enough that some values saturate (their
  // gradient passes: dx = dy everywhere).
  e.push_back({"fake_quantize_fp8 (given scale)", {"fake_quantize_fp8"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({4, 64}, g, d, dt, 4.0), f32_on({0.001f, 0.01f, 1.0f / 64, 3.0f}, {4}, d)};
               },
               [](const Tensors& v) {
                 return Tensors{add(fake_quantize_fp8(v[0], v[1], QuantScope::per_channel(0), DType::f8e4m3),
                                    fake_quantize_fp8(v[0], v[1], QuantScope::per_channel(0), DType::f8e5m2))};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors&, const Tensor& dy) {
                 std::vector<double> g = host(dy);
                 for (double& x : g) x *= 2.0;
                 return Grads{g};
               },
               {},
               [](Device d) {
                 const char* op = "fake_quantize_fp8";
                 const Tensor x = some({4, 64}, d), s = full({4}, 0.5, on(d));
                 std::vector<BadInput> c{
                     {op, "scale", [=] { fake_quantize_fp8(x, s, QuantScope::per_channel(1)); }},
                     {op, "scale", [=] { fake_quantize_fp8(x, s.to(DType::f64), QuantScope::per_channel(0)); }},
                     {op, "scale", [=] { fake_quantize_fp8(x, Tensor(), QuantScope::per_tensor()); }},
                     {op, "scale", [=] { fake_quantize_fp8(x, s, QuantScope::per_tensor()); }}};
                 for (float bad : {0.0f, -1.0f, INFINITY, -INFINITY, NAN})
                   c.push_back({op, "scale", [=] { fake_quantize_fp8(x, full({4}, bad, on(d)), QuantScope::per_channel(0)); }, true});
                 return c;
               }});

  // quantize -> dequantize per 1x128 block with power-of-two scales (so
  // dy * s / s = dy exactly: the gradient is dy, saturated values included).
  e.push_back({"quantize_fp8 -> dequantize_fp8", {"quantize_fp8", "dequantize_fp8"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({2, 256}, g, d, dt, 8.0), f32_on({0.25f, 0.0078125f, 1.0f, 2.0f}, {2, 2}, d),
                                f32_on({0.5f}, {}, d)};
               },
               [](const Tensors& v) {
                 const QuantScope blocks = QuantScope::per_group(-1, 128);
                 const Tensor q = quantize_fp8(v[0], v[1], blocks, DType::f8e4m3);
                 const Tensor q5 = quantize_fp8(v[0].detach(), v[2], QuantScope::per_tensor(), DType::f8e5m2);
                 return Tensors{dequantize_fp8(q, v[1], blocks, v[0].dtype()), q, q5,
                                dequantize_fp8(q5, v[2], QuantScope::per_tensor(), DType::f64)};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors&, const Tensor& dy) { return Grads{host(dy)}; }, {},
               [](Device d) {
                 const Tensor x = some({2, 256}, d), s = full({2, 2}, 0.5, on(d)), q = zeros({2, 256}, on(d, DType::f8e4m3));
                 const QuantScope blocks = QuantScope::per_group(-1, 128);
                 return std::vector<BadInput>{
                     {"quantize_fp8", "fp8", [=] { quantize_fp8(x, s, blocks, DType::u8); }},
                     {"quantize_fp8", "scale", [=] { quantize_fp8(x, full({2, 3}, 0.5, on(d)), blocks); }},
                     {"quantize_fp8", "group_size", [=] { quantize_fp8(x, s, QuantScope::per_group(-1, 96)); }},
                     {"quantize_fp8", "x", [=] { quantize_fp8(q, s, blocks); }},
                     {"quantize_fp8", "scale", [=] { quantize_fp8(x, full({2, 2}, 0.0, on(d)), blocks); }, true},
                     {"quantize_fp8", "scale", [=] { quantize_fp8(x, full({2, 2}, NAN, on(d)), blocks); }, true},
                     {"dequantize_fp8", "q", [=] { dequantize_fp8(x, s, blocks); }},
                     {"dequantize_fp8", "q", [=] { dequantize_fp8(zeros({2, 256}, on(d, DType::s4)), s, blocks); }},
                     {"dequantize_fp8", "out_dtype", [=] { dequantize_fp8(q, s, blocks, DType::f8e5m2); }},
                     {"dequantize_fp8", "scale", [=] { dequantize_fp8(q, s, QuantScope::per_token()); }},
                     {"dequantize_fp8", "scale", [=] { dequantize_fp8(q, full({2, 2}, -INFINITY, on(d)), blocks); }, true}};
               }});

  // dequantize_fp8 with a scale that requires grad: dscale by finite
  // differences (q is a constant made inside the call).
  e.push_back({"dequantize_fp8 (scale gradient)", {"dequantize_fp8"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{leaf(rand({3}, g, on(d, dt), 0.05, 0.5))}; },
               [](const Tensors& v) {
                 Generator g(31);
                 const Tensor q = randn({3, 40}, g, on(v[0].device()), 0.0, 50.0).to(DType::f8e4m3);
                 return Tensors{dequantize_fp8(q, v[0], QuantScope::per_token(), v[0].dtype())};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const Tensor q = zeros({3, 40}, on(d, DType::f8e5m2));
                 return std::vector<BadInput>{
                     {"dequantize_fp8", "scale", [=] { dequantize_fp8(q, leaf(full({4}, 0.1, on(d))), QuantScope::per_token()); }}};
               }});

  // Tensor::to to and from the low-bit storage dtypes: every conversion, on
  // every device, bit-identical (the gradient of to() is its own entry's).
  e.push_back({"Tensor::to (s4, u4, f8e4m3, f8e5m2)", {}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 Tensor x = randn({3, 33}, g, on(Device::cpu(), DType::f64), 0.0, 6.0);
                 std::vector<double> v = x.to_vector<double>();
                 const double edges[] = {0.5, 1.5, 2.5, -0.5, -7.5, -8.5, 7.5, 15.5, -0.0, 448.0, 464.0, 480.0,
                                         57344.0, 61440.0, INFINITY, -INFINITY, NAN, 1e-3, 0.001953125, 1e-7};
                 for (std::size_t i = 0; i < std::size(edges); ++i) v[i * 5] = edges[i];
                 return Tensors{Tensor::from_vector(v, {3, 33}).to(dt).to(d)};
               },
               [](const Tensors& v) {
                 Tensors out;
                 for (const DType t : {DType::s4, DType::u4, DType::f8e4m3, DType::f8e5m2}) {
                   const Tensor c = v[0].to(t);
                   out.insert(out.end(), {c, c.to(v[0].dtype()), c.to(DType::s8), c.to(DType::s4), c.to(DType::f8e5m2)});
                 }
                 return out;
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, [](Device d) {
                 return std::vector<BadInput>{
                     {"rand", "dtype", [=] { Generator g; rand({4}, g, on(d, DType::s4)); }}};
               }});
  // choose_qparams_affine: torchao's choose_qparams_affine with an explicit
  // range and eps over every scope (per token asymmetric int8 with eps
  // FLT_EPSILON: the 8da4w activation qparams). Rows: all zero (scale = eps),
  // tiny (the eps floor binds), all positive, all negative, +-0, random.
  e.push_back({"choose_qparams_affine", {"choose_qparams_affine"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{qparams_rows(d, dt, g, 64)}; },
               [](const Tensors& v) {
                 Tensors out;
                 const float eps = std::numeric_limits<float>::epsilon();
                 for (const auto& [scope, mode, lo, hi, ep] :
                      {std::tuple{QuantScope::per_token(), QuantMode::asymmetric, -128, 127, static_cast<double>(eps)},
                       std::tuple{QuantScope::per_token(), QuantMode::symmetric, -128, 127, 1e-5},
                       std::tuple{QuantScope::per_group(-1, 32), QuantMode::symmetric, -8, 7, 1e-6},
                       std::tuple{QuantScope::per_group(-1, 16), QuantMode::asymmetric, 0, 15, 1e-6},
                       std::tuple{QuantScope::per_channel(1), QuantMode::asymmetric, 0, 255, 1e-8},
                       std::tuple{QuantScope::per_tensor(), QuantMode::asymmetric, -128, 127, static_cast<double>(eps)}}) {
                   const AffineQparams q = choose_qparams_affine(v[0], scope, mode, lo, hi, ep);
                   out.push_back(q.scale);
                   out.push_back(q.zero_point);
                 }
                 return out;
               },
               Promise::bit_identical(), GradMethod::none, {}, {},
               [](Device d) {
                 const char* op = "choose_qparams_affine";
                 const Tensor x = some({4, 64}, d);
                 const auto tok = QuantScope::per_token();
                 const auto asym = QuantMode::asymmetric;
                 return std::vector<BadInput>{
                     {op, "x", [=] { choose_qparams_affine(Tensor(), tok, asym, -128, 127, 1e-7); }},
                     {op, "x", [=] { choose_qparams_affine(some({4, 64}, d, DType::s8), tok, asym, -128, 127, 1e-7); }},
                     {op, "x", [=] { choose_qparams_affine(Tensor::scalar(1.0f, d), tok, asym, -128, 127, 1e-7); }},
                     {op, "mode", [=] { choose_qparams_affine(x, tok, static_cast<QuantMode>(5), -128, 127, 1e-7); }},
                     {op, "qmax", [=] { choose_qparams_affine(x, tok, asym, 127, -128, 1e-7); }},
                     {op, "qmax", [=] { choose_qparams_affine(x, tok, asym, 3, 3, 1e-7); }},
                     {op, "qmin", [=] { choose_qparams_affine(x, tok, asym, -(std::int64_t{1} << 40), 127, 1e-7); }},
                     {op, "qmax", [=] { choose_qparams_affine(x, tok, asym, 0, std::int64_t{1} << 25, 1e-7); }},
                     {op, "eps", [=] { choose_qparams_affine(x, tok, asym, -128, 127, 0.0); }},
                     {op, "eps", [=] { choose_qparams_affine(x, tok, asym, -128, 127, -1e-7); }},
                     {op, "eps", [=] { choose_qparams_affine(x, tok, asym, -128, 127, NAN); }},
                     {op, "eps", [=] { choose_qparams_affine(x, tok, asym, -128, 127, 1e-45); }},
                     {op, "group_size", [=] { choose_qparams_affine(x, QuantScope::per_group(-1, 48), asym, -8, 7, 1e-6); }},
                     {op, "scope", [=] { choose_qparams_affine(x, QuantScope::per_group(0, 2), asym, -8, 7, 1e-6); }},
                     {op, "axis", [=] { choose_qparams_affine(x, QuantScope::per_channel(2), asym, -8, 7, 1e-6); }}};
               }});
  // fake_quantize_dynamic: choose_qparams_affine + fake_quantize in one op.
  // Rows the CUDA kernel takes (per token over 2-D and 3-D x, axis-0
  // channels of 128 and 768, asymmetric and symmetric) and rows it leaves to
  // the composition (64 long, per group), all against the CPU's composition;
  // rows: all zero, tiny (the eps floor), all positive, all negative, +-0.
  e.push_back({"fake_quantize_dynamic", {"fake_quantize_dynamic"}, kFloat, rows256_leaf,
               [](const Tensors& v) {
                 const float eps = std::numeric_limits<float>::epsilon();
                 const Tensor xd = v[0].detach();
                 const auto tok = QuantScope::per_token(), ch0 = QuantScope::per_channel(0);
                 const auto asym = QuantMode::asymmetric, sym = QuantMode::symmetric;
                 return Tensors{fake_quantize_dynamic(v[0], tok, asym, -128, 127, eps),
                                fake_quantize_dynamic(xd.reshape({3, 2, 256}), tok, sym, -128, 127, 1e-5),
                                fake_quantize_dynamic(xd.reshape({12, 128}), ch0, sym, -128, 127, eps),
                                fake_quantize_dynamic(xd.reshape({2, 768}), ch0, asym, 0, 255, eps),
                                fake_quantize_dynamic(xd.reshape({24, 64}), tok, asym, -128, 127, eps),
                                fake_quantize_dynamic(xd, QuantScope::per_group(-1, 32), sym, -8, 7, 1e-6)};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 std::vector<double> s, z;
                 int4_ref_qparams(host(v[0]), 256, false, -128, 127, std::numeric_limits<float>::epsilon(), s, z);
                 return int4_straight_through(v[0], dy, s, z, 256, -128, 127);
               },
               {},
               [](Device d) {
                 const char* op = "fake_quantize_dynamic";
                 const Tensor x = some({4, 128}, d);
                 const auto tok = QuantScope::per_token();
                 const auto asym = QuantMode::asymmetric;
                 return std::vector<BadInput>{
                     {op, "x", [=] { fake_quantize_dynamic(Tensor(), tok, asym, -128, 127, 1e-7); }},
                     {op, "x", [=] { fake_quantize_dynamic(some({4, 128}, d, DType::s8), tok, asym, -128, 127, 1e-7); }},
                     {op, "x", [=] { fake_quantize_dynamic(Tensor::scalar(1.0f, d), tok, asym, -128, 127, 1e-7); }},
                     {op, "mode", [=] { fake_quantize_dynamic(x, tok, static_cast<QuantMode>(5), -128, 127, 1e-7); }},
                     {op, "qmax", [=] { fake_quantize_dynamic(x, tok, asym, 127, -128, 1e-7); }},
                     {op, "qmin", [=] { fake_quantize_dynamic(x, tok, asym, -(std::int64_t{1} << 40), 127, 1e-7); }},
                     {op, "eps", [=] { fake_quantize_dynamic(x, tok, asym, -128, 127, 0.0); }},
                     {op, "eps", [=] { fake_quantize_dynamic(x, tok, asym, -128, 127, NAN); }},
                     {op, "group_size", [=] { fake_quantize_dynamic(x, QuantScope::per_group(-1, 48), asym, -8, 7, 1e-6); }},
                     {op, "axis", [=] { fake_quantize_dynamic(x, QuantScope::per_channel(2), asym, -8, 7, 1e-6); }}};
               }});
  // fake_quantize_dynamic_batch: axis-0 channels of 256 (x), 128 and 384 (views
  // of x, so x's gradient is the three straight-throughs summed), 768 (a
  // detached view) and 64 (left to fake_quantize_dynamic); then per-token rows
  // of 256 and 128 in one call. On CUDA the row kernel's tensors go in one
  // launch a row length; CPU = fake_quantize_dynamic of each, so the devices'
  // agreement is the batch's equality with the op it repeats.
  e.push_back({"fake_quantize_dynamic_batch", {"fake_quantize_dynamic_batch"}, kFloat, rows256_leaf,
               [](const Tensors& v) {
                 const float eps = std::numeric_limits<float>::epsilon();
                 const Tensor xd = v[0].detach();
                 const auto ch0 = QuantScope::per_channel(0), tok = QuantScope::per_token();
                 const auto asym = QuantMode::asymmetric, sym = QuantMode::symmetric;
                 const std::vector<Tensor> c = fake_quantize_dynamic_batch(
                     {v[0], v[0].reshape({12, 128}), v[0].reshape({4, 384}), xd.reshape({2, 768}), xd.reshape({24, 64})},
                     ch0, sym, -128, 127, eps);
                 const std::vector<Tensor> t =
                     fake_quantize_dynamic_batch({xd.reshape({3, 2, 256}), xd.reshape({12, 128})}, tok, asym, -128, 127,
                                                 1e-5);
                 // out_dtype: f32 into bf16 (on CUDA the cast inside the op, whose gradient casts
                 // back exactly), the other dtypes into f32 (the op's to_batch).
                 const DType out = v[0].dtype() == DType::f32 ? DType::bf16 : DType::f32;
                 const std::vector<Tensor> o =
                     fake_quantize_dynamic_batch({xd.reshape({6, 256}), xd.reshape({12, 128}), xd.reshape({24, 64})},
                                                 ch0, sym, -128, 127, eps, out);
                 if (c.size() != 5 || t.size() != 2 || o.size() != 3) return c;  // never: one output a tensor
                 return Tensors{add(add(c[0], c[1].reshape({6, 256})), c[2].reshape({6, 256})),
                                c[3],
                                c[4],
                                t[0],
                                t[1],
                                o[0],
                                o[1],
                                o[2]};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 const float eps = std::numeric_limits<float>::epsilon();
                 std::vector<double> dx(static_cast<std::size_t>(v[0].numel()), 0.0);
                 for (const std::int64_t row : {256, 128, 384}) {
                   std::vector<double> s, z;
                   int4_ref_qparams(host(v[0]), row, true, -128, 127, eps, s, z);
                   const Grads g = int4_straight_through(v[0], dy, s, z, row, -128, 127);
                   for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += g[0][i];
                 }
                 return Grads{dx};
               },
               {},
               [](Device d) {
                 const char* op = "fake_quantize_dynamic_batch";
                 const Tensor x = some({4, 128}, d), u;
                 const auto ch0 = QuantScope::per_channel(0);
                 const auto sym = QuantMode::symmetric;
                 auto batch = [](const std::vector<Tensor>& xs, QuantScope sc, QuantMode m, std::int64_t lo,
                                 std::int64_t hi, double eps) { fake_quantize_dynamic_batch(xs, sc, m, lo, hi, eps); };
                 return std::vector<BadInput>{
                     {op, "out_dtype",
                      [=] { fake_quantize_dynamic_batch({x}, ch0, sym, -128, 127, 1e-7, DType::s8); }},
                     {op, "xs", [=] { batch({}, ch0, sym, -128, 127, 1e-7); }},
                     {op, "xs[1]", [=] { batch({x, u}, ch0, sym, -128, 127, 1e-7); }},
                     {op, "xs[0]", [=] { batch({some({4, 128}, d, DType::s8), x}, ch0, sym, -128, 127, 1e-7); }},
                     {op, "xs[1]", [=] { batch({x, Tensor::scalar(1.0f, d)}, ch0, sym, -128, 127, 1e-7); }},
                     {op, "mode", [=] { batch({x}, ch0, static_cast<QuantMode>(5), -128, 127, 1e-7); }},
                     {op, "qmax", [=] { batch({x}, ch0, sym, 127, -128, 1e-7); }},
                     {op, "eps", [=] { batch({x}, ch0, sym, -128, 127, 0.0); }},
                     {op, "axis", [=] { batch({x}, QuantScope::per_channel(2), sym, -128, 127, 1e-7); }},
                     {op, "group_size", [=] { batch({x}, QuantScope::per_group(-1, 48), sym, -8, 7, 1e-6); }}};
               }});
  // gelu_fake_quantize_dynamic: gelu + fake_quantize_dynamic in one op. Rows
  // the CUDA kernel takes (per token 256 with the erf and tanh forms, axis-0
  // channels of 128) and rows it leaves to the composition (64 long). Not
  // bit-identical across devices: gelu's erf / tanh are glibc's on the CPU
  // and libdevice's on CUDA, and a last-bit difference can move a value
  // across a rounding boundary of the fake quant (one step, a row's range / 255).
  e.push_back({"gelu_fake_quantize_dynamic", {"gelu_fake_quantize_dynamic"}, kFloat,
               rows256_leaf,
               [](const Tensors& v) {
                 const float eps = std::numeric_limits<float>::epsilon();
                 const Tensor xd = v[0].detach();
                 const auto tok = QuantScope::per_token(), ch0 = QuantScope::per_channel(0);
                 const auto asym = QuantMode::asymmetric, sym = QuantMode::symmetric;
                 const auto erf = GeluApproximate::none, tanh = GeluApproximate::tanh;
                 return Tensors{gelu_fake_quantize_dynamic(v[0], erf, tok, asym, -128, 127, eps),
                                gelu_fake_quantize_dynamic(xd.reshape({3, 2, 256}), tanh, tok, sym, -128, 127, 1e-5),
                                gelu_fake_quantize_dynamic(xd.reshape({12, 128}), erf, ch0, sym, -128, 127, eps),
                                gelu_fake_quantize_dynamic(xd.reshape({24, 64}), erf, tok, asym, -128, 127, eps)};
               },
               Promise::within(0.04, 0.04, 0.04, 0.06, "gelu (glibc against libdevice) may move a value across a "
                                                         "rounding boundary of the fake quant: one step"),
               GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 // dx = dy * 1[in range](gelu(x)) * gelu'(x), gelu's erf form in f64.
                 const std::vector<double> xs = host(v[0]);
                 std::vector<double> gs(xs.size()), slope(xs.size());
                 for (std::size_t i = 0; i < xs.size(); ++i) {
                   const double cdf = 0.5 * (1.0 + std::erf(xs[i] * M_SQRT1_2));
                   gs[i] = xs[i] * cdf;
                   slope[i] = cdf + xs[i] * std::exp(-0.5 * xs[i] * xs[i]) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
                 }
                 std::vector<double> s, z;
                 int4_ref_qparams(gs, 256, false, -128, 127, std::numeric_limits<float>::epsilon(), s, z);
                 Grads dx = int4_straight_through(Tensor::from_vector(gs, v[0].shape()), dy, s, z, 256, -128, 127);
                 for (std::size_t i = 0; i < xs.size(); ++i) dx[0][i] *= slope[i];
                 return dx;
               },
               {},
               [](Device d) {
                 const char* op = "gelu_fake_quantize_dynamic";
                 const Tensor x = some({4, 128}, d);
                 const auto tok = QuantScope::per_token();
                 const auto asym = QuantMode::asymmetric;
                 const auto erf = GeluApproximate::none;
                 return std::vector<BadInput>{
                     {op, "x", [=] { gelu_fake_quantize_dynamic(Tensor(), erf, tok, asym, -128, 127, 1e-7); }},
                     {op, "x", [=] { gelu_fake_quantize_dynamic(some({4, 128}, d, DType::s8), erf, tok, asym, -128, 127, 1e-7); }},
                     {op, "x", [=] { gelu_fake_quantize_dynamic(Tensor::scalar(1.0f, d), erf, tok, asym, -128, 127, 1e-7); }},
                     {op, "approximate", [=] { gelu_fake_quantize_dynamic(x, static_cast<GeluApproximate>(7), tok, asym, -128, 127, 1e-7); }},
                     {op, "mode", [=] { gelu_fake_quantize_dynamic(x, erf, tok, static_cast<QuantMode>(5), -128, 127, 1e-7); }},
                     {op, "qmax", [=] { gelu_fake_quantize_dynamic(x, erf, tok, asym, 127, -128, 1e-7); }},
                     {op, "eps", [=] { gelu_fake_quantize_dynamic(x, erf, tok, asym, -128, 127, 0.0); }},
                     {op, "group_size", [=] { gelu_fake_quantize_dynamic(x, erf, QuantScope::per_group(-1, 48), asym, -8, 7, 1e-6); }},
                     {op, "axis", [=] { gelu_fake_quantize_dynamic(x, erf, QuantScope::per_channel(2), asym, -8, 7, 1e-6); }}};
               }});
  return e;
}

}  // namespace qgrad::registry
