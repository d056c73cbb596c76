// Registry entries: the transformer ops (gelu, silu, softmax, layer_norm,
// rms_norm, embedding, dropout), scaled_dot_product_attention and
// packed_attention.
#include <algorithm>
#include <cmath>
#include <limits>

#include "qgrad/core/random.h"
#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

using Tensors = std::vector<Tensor>;
const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const DType kNonFloat[] = {DType::s8, DType::u8, DType::s32, DType::s64, DType::boolean};

// exp, erf and tanh are glibc's on the CPU and libdevice's on CUDA: each
// within an ulp or two, not always the same ulp; the backward formulas
// amplify that through (1 - s) and (1 - tanh^2) times x (about 1e-6 in f32
// for |x| ~ 4); f16/bf16: one rounding step of the result may differ.
Promise transcendental(const char* what) { return Promise::within(1e-13, 1e-5, 1e-2, 1e-2, what); }

// Values from a normal draw plus special ones spread through the tensor:
// +-0, a large and a tiny magnitude (all finite: the gradient is checked).
Tensor activation_input(const Shape& shape, Generator& g, Device d, DType dt) {
  std::vector<double> v = randn(shape, g, on(Device::cpu(), DType::f64), 0.0, 2.0).to_vector<double>();
  const double special[] = {0.0, -0.0, 6.0, -6.0, 1e-3, -9.5};
  for (std::size_t i = 0; i < std::size(special) && i < v.size(); ++i) v[i * 5 % v.size()] = special[i];
  return leaf(Tensor::from_vector(v, shape).to(dt).to(d));
}

// The device on the other side, when a GPU is present (mixed-device cases).
bool other_device(Device d, Device& other) {
  if (cuda_device_count() == 0) return false;
  other = d.is_cpu() ? Device::cuda(0) : Device::cpu();
  return true;
}

std::vector<BadInput> unary_errors(const char* op, std::function<Tensor(const Tensor&)> f, Device d) {
  std::vector<BadInput> c{{op, "x", [f] { f(Tensor()); }}};
  for (DType dt : kNonFloat) c.push_back({op, "x", [=] { f(some({2, 3}, d, dt)); }});
  return c;
}

Tensor embedding_indices(Device d, bool s32) {
  // Repeated rows (1 three times, 4 twice), row 0 and the last row 5.
  const std::vector<std::int64_t> v = {1, 4, 2, 1, 0, 5, 1, 4};
  if (s32) return Tensor::from_vector<std::int32_t>({1, 4, 2, 1, 0, 5, 1, 4}, {2, 4}, d);
  return Tensor::from_vector<std::int64_t>(v, {2, 4}, d);
}

constexpr std::uint64_t kDropoutSeed = 77;
constexpr double kDropoutP = 0.3;

}  // namespace

std::vector<OpEntry> transformer_entries() {
  std::vector<OpEntry> e;
  for (const bool tanh : {false, true}) {
    const char* name = tanh ? "gelu (tanh)" : "gelu (erf)";
    const GeluApproximate a = tanh ? GeluApproximate::tanh : GeluApproximate::none;
    e.push_back({name, {"gelu"}, kFloat,
                 [](Device d, DType dt, Generator& g) { return Tensors{activation_input({4, 9}, g, d, dt)}; },
                 [a](const Tensors& v) { return Tensors{gelu(v[0], a)}; }, transcendental("erf / tanh / exp"),
                 GradMethod::finite_differences, {}, {}, [](Device d) {
                   auto f = [](const Tensor& x) { return gelu(x); };
                   std::vector<BadInput> c = unary_errors("gelu", f, d);
                   const Tensor x = some({3}, d);
                   c.push_back({"gelu", "approximate", [=] { gelu(x, static_cast<GeluApproximate>(7)); }});
                   return c;
                 }});
  }
  e.push_back({"silu", {"silu"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{activation_input({4, 9}, g, d, dt)}; },
               [](const Tensors& v) { return Tensors{silu(v[0])}; }, transcendental("exp"),
               GradMethod::finite_differences, {}, {},
               [](Device d) { return unary_errors("silu", [](const Tensor& x) { return silu(x); }, d); }});
  // Along a middle axis (strided rows) and the last one.
  e.push_back({"softmax", {"softmax"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({2, 5, 3}, g, d, dt, 2.0)}; },
               [](const Tensors& v) { return Tensors{add(softmax(v[0], 1), mul(softmax(v[0], -1), 0.5))}; },
               transcendental("exp"), GradMethod::finite_differences, {}, {}, [](Device d) {
                 std::vector<BadInput> c = unary_errors("softmax", [](const Tensor& x) { return softmax(x); }, d);
                 const Tensor x = some({2, 3}, d);
                 for (std::int64_t ax : {2LL, -3LL, 100LL}) c.push_back({"softmax", "axis", [=] { softmax(x, ax); }});
                 c.push_back({"softmax", "axis", [=] { softmax(Tensor::scalar(1.5f, d), 0); }});
                 return c;
               }});
  // Rows with a large common offset (the two-pass variance keeps them
  // exact), weight and bias over two dims, and a plain call over one dim.
  e.push_back({"layer_norm", {"layer_norm"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 std::vector<double> x = randn({2, 3, 4}, g, on(Device::cpu(), DType::f64)).to_vector<double>();
                 for (std::size_t i = 12; i < 24; ++i) x[i] += 100.0;
                 return Tensors{leaf(Tensor::from_vector(x, {2, 3, 4}).to(dt).to(d)),
                                leaf(rand({3, 4}, g, on(d, dt), 0.5, 1.5)), normal({3, 4}, g, d, dt)};
               },
               [](const Tensors& v) {
                 return Tensors{add(layer_norm(v[0], {3, 4}, v[1], v[2], 1e-5), layer_norm(v[0], {4}))};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "layer_norm";
                 const Tensor x = some({2, 3, 4}, d), w = some({3, 4}, d), b = some({3, 4}, d), u;
                 std::vector<BadInput> c{
                     {op, "x", [=] { layer_norm(u, {4}); }},
                     {op, "normalized_shape", [=] { layer_norm(x, {5}); }},
                     {op, "normalized_shape", [=] { layer_norm(x, {}); }},
                     {op, "normalized_shape", [=] { layer_norm(x, {1, 2, 3, 4}); }},
                     {op, "normalized_shape", [=] { layer_norm(x, {4, 3}); }},
                     {op, "weight", [=] { layer_norm(x, {3, 4}, some({4}, d), b); }},
                     {op, "weight", [=] { layer_norm(x, {3, 4}, some({4, 3}, d), b); }},
                     {op, "weight", [=] { layer_norm(x, {3, 4}, some({3, 4}, d, DType::f64), b); }},
                     {op, "weight", [=] { layer_norm(x, {3, 4}, some({3, 4}, d, DType::s32), b); }},
                     {op, "bias", [=] { layer_norm(x, {3, 4}, w, some({12}, d)); }},
                     {op, "bias", [=] { layer_norm(x, {3, 4}, w, some({3, 4}, d, DType::f16)); }},
                     {op, "eps", [=] { layer_norm(x, {3, 4}, w, b, 0.0); }},
                     {op, "eps", [=] { layer_norm(x, {4}, u, u, -1e-5); }},
                     {op, "eps", [=] { layer_norm(x, {4}, u, u, kNaN); }},
                     {op, "eps", [=] { layer_norm(x, {4}, u, u, kInf); }}};
                 for (DType dt : kNonFloat) c.push_back({op, "x", [=] { layer_norm(some({2, 4}, d, dt), {4}); }});
                 Device o;
                 if (other_device(d, o)) {
                   c.push_back({op, "weight", [=] { layer_norm(x, {3, 4}, some({3, 4}, o), b); }});
                   c.push_back({op, "bias", [=] { layer_norm(x, {3, 4}, w, some({3, 4}, o)); }});
                 }
                 return c;
               }});
  // layer_norm_fake_quantize_dynamic: layer_norm + the per-token dynamic
  // fake quant in one op. Rows of 128 (the CUDA kernel, with weight and bias:
  // differentiated; both modes), rows of 96 and a two-dim normalized shape
  // (the composition); CUDA against the CPU bit for bit (layer_norm is).
  e.push_back({"layer_norm_fake_quantize_dynamic", {"layer_norm_fake_quantize_dynamic"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{leaf(normal({6, 128}, g, d, dt, 2.0)), leaf(rand({128}, g, on(d, dt), 0.5, 1.5)),
                                leaf(normal({128}, g, d, dt))};
               },
               [](const Tensors& v) {
                 const float eps = std::numeric_limits<float>::epsilon();
                 const Tensor xd = v[0].detach();
                 const auto asym = QuantMode::asymmetric, sym = QuantMode::symmetric;
                 return Tensors{
                     layer_norm_fake_quantize_dynamic(v[0], {128}, v[1], v[2], 1e-5, asym, -128, 127, eps),
                     layer_norm_fake_quantize_dynamic(xd.reshape({3, 2, 128}), {128}, Tensor(), Tensor(), 1e-6, sym,
                                                      -128, 127, 1e-5),
                     layer_norm_fake_quantize_dynamic(xd.reshape({8, 96}), {96}, Tensor(), Tensor(), 1e-5, asym, -128,
                                                      127, eps),
                     layer_norm_fake_quantize_dynamic(xd.reshape({6, 2, 64}), {2, 64}, Tensor(), Tensor(), 1e-5, asym,
                                                      0, 255, eps)};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 // dym = dy * 1[in range] over the f64 layer norm's rows (torchao's qparams in f32), then
                 // layer_norm's backward: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dym w;
                 // dw = sum_rows dym xhat, db = sum_rows dym.
                 const auto host = [](const Tensor& t) { return t.detach().to(DType::f64).cpu().to_vector<double>(); };
                 const std::vector<double> x = host(v[0]), w = host(v[1]), b = host(v[2]), gy = host(dy);
                 const std::size_t d = 128, rows = x.size() / d;
                 std::vector<double> xhat(x.size()), rstd(rows), dx(x.size()), dw(d, 0.0), db(d, 0.0);
                 for (std::size_t r = 0; r < rows; ++r) {
                   double mean = 0, var = 0;
                   for (std::size_t j = 0; j < d; ++j) mean += x[r * d + j];
                   mean /= static_cast<double>(d);
                   for (std::size_t j = 0; j < d; ++j) var += (x[r * d + j] - mean) * (x[r * d + j] - mean);
                   rstd[r] = 1.0 / std::sqrt(var / static_cast<double>(d) + 1e-5);
                   for (std::size_t j = 0; j < d; ++j) xhat[r * d + j] = (x[r * d + j] - mean) * rstd[r];
                 }
                 for (std::size_t r = 0; r < rows; ++r) {
                   float lo = 0.0f, hi = 0.0f;  // torchao's range always holds 0
                   std::vector<double> y(d);
                   for (std::size_t j = 0; j < d; ++j) {
                     y[j] = xhat[r * d + j] * w[j] + b[j];
                     lo = std::min(lo, static_cast<float>(y[j]));
                     hi = std::max(hi, static_cast<float>(y[j]));
                   }
                   const float scale = std::max((hi - lo) / 255.0f, std::numeric_limits<float>::epsilon());
                   const double zp = std::clamp<double>(-128.0 - std::nearbyint(lo / scale), -128.0, 127.0);
                   const double inv = static_cast<double>(1.0f / scale);
                   double mg = 0, mgx = 0;
                   std::vector<double> g(d), dym(d);
                   for (std::size_t j = 0; j < d; ++j) {
                     const double q = std::nearbyint(y[j] * inv) + zp;
                     dym[j] = (q >= -128.0 && q <= 127.0) ? gy[r * d + j] : 0.0;
                     g[j] = dym[j] * w[j];
                     mg += g[j];
                     mgx += g[j] * xhat[r * d + j];
                     dw[j] += dym[j] * xhat[r * d + j];
                     db[j] += dym[j];
                   }
                   mg /= static_cast<double>(d);
                   mgx /= static_cast<double>(d);
                   for (std::size_t j = 0; j < d; ++j) dx[r * d + j] = rstd[r] * ((g[j] - mg) - xhat[r * d + j] * mgx);
                 }
                 return std::vector<std::vector<double>>{dx, dw, db};
               },
               {},
               [](Device d) {
                 const char* op = "layer_norm_fake_quantize_dynamic";
                 const Tensor x = some({2, 128}, d), w = some({128}, d), u;
                 const auto asym = QuantMode::asymmetric;
                 const float fe = std::numeric_limits<float>::epsilon();
                 auto call = [=](const Tensor& xx, Shape s, const Tensor& ww, double eps, QuantMode m, std::int64_t lo,
                                 std::int64_t hi, double qe) {
                   return [=] { layer_norm_fake_quantize_dynamic(xx, s, ww, Tensor(), eps, m, lo, hi, qe); };
                 };
                 std::vector<BadInput> c{{op, "x", call(u, {128}, u, 1e-5, asym, -128, 127, fe)},
                                         {op, "x", call(some({2, 128}, d, DType::s32), {128}, u, 1e-5, asym, -128, 127, fe)},
                                         {op, "normalized_shape", call(x, {64}, u, 1e-5, asym, -128, 127, fe)},
                                         {op, "weight", call(x, {128}, some({64}, d), 1e-5, asym, -128, 127, fe)},
                                         {op, "eps", call(x, {128}, w, 0.0, asym, -128, 127, fe)},
                                         {op, "mode", call(x, {128}, w, 1e-5, static_cast<QuantMode>(5), -128, 127, fe)},
                                         {op, "qmax", call(x, {128}, w, 1e-5, asym, 127, -128, fe)},
                                         {op, "eps", call(x, {128}, w, 1e-5, asym, -128, 127, 0.0)}};
                 return c;
               }});
  e.push_back({"rms_norm", {"rms_norm"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 std::vector<double> x = randn({2, 3, 4}, g, on(Device::cpu(), DType::f64)).to_vector<double>();
                 for (std::size_t i = 0; i < 4; ++i) x[i] += 30.0;
                 return Tensors{leaf(Tensor::from_vector(x, {2, 3, 4}).to(dt).to(d)),
                                leaf(rand({4}, g, on(d, dt), 0.5, 1.5))};
               },
               [](const Tensors& v) {
                 return Tensors{add(rms_norm(v[0], {4}, v[1], 1e-6), rms_norm(v[0], {3, 4}))};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "rms_norm";
                 const Tensor x = some({2, 3, 4}, d), w = some({4}, d), u;
                 std::vector<BadInput> c{{op, "x", [=] { rms_norm(u, {4}); }},
                                         {op, "normalized_shape", [=] { rms_norm(x, {3}); }},
                                         {op, "normalized_shape", [=] { rms_norm(x, {}); }},
                                         {op, "normalized_shape", [=] { rms_norm(x, {0}); }},
                                         {op, "weight", [=] { rms_norm(x, {4}, some({3}, d)); }},
                                         {op, "weight", [=] { rms_norm(x, {4}, some({1, 4}, d)); }},
                                         {op, "weight", [=] { rms_norm(x, {4}, some({4}, d, DType::bf16)); }},
                                         {op, "weight", [=] { rms_norm(x, {4}, some({4}, d, DType::s64)); }},
                                         {op, "eps", [=] { rms_norm(x, {4}, w, 0.0); }},
                                         {op, "eps", [=] { rms_norm(x, {4}, w, -1.0); }},
                                         {op, "eps", [=] { rms_norm(x, {4}, w, kNaN); }},
                                         {op, "eps", [=] { rms_norm(x, {4}, u, kInf); }}};
                 for (DType dt : kNonFloat) c.push_back({op, "x", [=] { rms_norm(some({2, 4}, d, dt), {4}); }});
                 Device o;
                 if (other_device(d, o)) c.push_back({op, "weight", [=] { rms_norm(x, {4}, some({4}, o)); }});
                 return c;
               }});
  // s64 indices with repeats, and s32 ones with padding_idx -3 (row 3: not
  // among the indices, since a used padding row has a zero gradient by
  // definition, which finite differences would not see; the unit tests check
  // used padding rows).
  e.push_back({"embedding", {"embedding"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({6, 3}, g, d, dt)}; },
               [](const Tensors& v) {
                 const Device d = v[0].device();
                 return Tensors{add(embedding(v[0], embedding_indices(d, false)),
                                    mul(embedding(v[0], embedding_indices(d, true), -3), 0.5))};
               },
               Promise::bit_identical(), GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "embedding";
                 const Tensor w = some({6, 3}, d), idx = embedding_indices(d, false), u;
                 auto s64 = [d](std::vector<std::int64_t> v) {
                   const auto n = static_cast<std::int64_t>(v.size());
                   return Tensor::from_vector<std::int64_t>(v, {n}, d);
                 };
                 std::vector<BadInput> c{
                     {op, "weight", [=] { embedding(u, idx); }},
                     {op, "weight", [=] { embedding(some({6}, d), idx); }},
                     {op, "weight", [=] { embedding(some({6, 3, 1}, d), idx); }},
                     {op, "indices", [=] { embedding(w, u); }},
                     {op, "indices", [=] { embedding(w, some({4}, d)); }},
                     {op, "indices", [=] { embedding(w, some({4}, d, DType::u8)); }},
                     {op, "indices", [=] { embedding(w, some({4}, d, DType::s8)); }},
                     {op, "padding_idx", [=] { embedding(w, idx, 6); }},
                     {op, "padding_idx", [=] { embedding(w, idx, -7); }},
                     {op, "indices", [=] { embedding(w, s64({0, 6})); }, true},
                     {op, "indices", [=] { embedding(w, s64({-1, 2})); }, true},
                     {op, "indices",
                      [=] { embedding(w, Tensor::from_vector<std::int32_t>({3, 1 << 30}, {2}, d)); }, true}};
                 for (DType dt : kNonFloat) c.push_back({op, "weight", [=] { embedding(some({6, 3}, d, dt), idx); }});
                 Device o;
                 if (other_device(d, o)) c.push_back({op, "indices", [=] { embedding(w, idx.to(o)); }});
                 return c;
               }});
  // Training with p = 0.3 over 200 elements (two mask blocks, the second
  // partial), checked against the host transcription of the mask rule; p = 1
  // and eval mode as extra outputs.
  OpEntry drop{"dropout", {"dropout"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({5, 40}, g, d, dt)}; },
               [](const Tensors& v) {
                 Generator g(kDropoutSeed);
                 Tensor y = dropout(v[0], kDropoutP, true, g);
                 Tensor all = dropout(v[0].detach(), 1.0, true, g);
                 Tensor eval = dropout(v[0].detach(), 0.5, false, g);
                 return Tensors{y, all, eval};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& in, const Tensor& dy) {
                 const std::vector<double> g = dy.detach().cpu().to(DType::f64).to_vector<double>();
                 std::vector<double> dx(g.size());
                 for (std::size_t i = 0; i < g.size(); ++i)
                   dx[i] = formulas::random_uniform(kDropoutSeed, i) >= kDropoutP ? g[i] * (1.0 / (1.0 - kDropoutP))
                                                                                  : g[i] * 0.0;
                 (void)in;
                 return std::vector<std::vector<double>>{dx};
               },
               {}, [](Device d) {
                 const char* op = "dropout";
                 const Tensor x = some({2, 3}, d);
                 std::vector<BadInput> c{{op, "p", [=] { dropout(x, -0.1); }},
                                         {op, "p", [=] { dropout(x, 1.5); }},
                                         {op, "p", [=] { dropout(x, kNaN); }},
                                         {op, "p", [=] { dropout(x, -kInf, false); }},
                                         {op, "x", [=] { dropout(Tensor(), 0.5); }}};
                 for (DType dt : kNonFloat) c.push_back({op, "x", [=] { dropout(some({4}, d, dt), 0.5); }});
                 return c;
               }};
  drop.forward_reference = [](const Tensors& in) {
    const std::vector<double> x = in[0].detach().cpu().to(DType::f64).to_vector<double>();
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      y[i] = formulas::random_uniform(kDropoutSeed, i) >= kDropoutP ? x[i] * (1.0 / (1.0 - kDropoutP)) : x[i] * 0.0;
    return y;
  };
  e.push_back(drop);
  // q [2, 2, 3, 4], k [2, 2, 5, 4], v [2, 2, 5, 3] with an additive mask
  // [3, 5] (a leaf: its gradient is checked) and dropout 0.3 from a fixed
  // seed, plus a causal call with its own scale; extra outputs: a boolean
  // mask [2, 1, 1, 5] broadcast over heads and queries that hides every key
  // of the second batch (zero rows), and causal with L > S.
  e.push_back({"scaled_dot_product_attention", {"scaled_dot_product_attention"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({2, 2, 3, 4}, g, d, dt), normal({2, 2, 5, 4}, g, d, dt),
                                normal({2, 2, 5, 3}, g, d, dt), normal({3, 5}, g, d, dt)};
               },
               [](const Tensors& v) {
                 const Device d = v[0].device();
                 Generator g(kDropoutSeed);
                 Tensor y = add(scaled_dot_product_attention(v[0], v[1], v[2], v[3], false, std::nullopt, kDropoutP, g),
                                scaled_dot_product_attention(v[0], v[1], v[2], Tensor(), true, 0.7));
                 const Tensor keep = Tensor::from_vector<bool>({true, false, true, true, false, false, false, false,
                                                                false, false},
                                                               {2, 1, 1, 5}, d);
                 Tensor masked = scaled_dot_product_attention(v[0].detach(), v[1].detach(), v[2].detach(), keep);
                 Tensor tall = scaled_dot_product_attention(v[1].detach(), v[0].detach(), v[0].detach(), Tensor(), true);
                 return Tensors{y, masked, tall};
               },
               Promise::within(1e-12, 1e-5, 1e-2, 6e-2, "cuBLAS GEMMs and exp (glibc / libdevice)"),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "scaled_dot_product_attention";
                 const Tensor q = some({2, 2, 3, 4}, d), k = some({2, 2, 5, 4}, d), v = some({2, 2, 5, 3}, d), u;
                 auto f = [=](const Tensor& m) { scaled_dot_product_attention(q, k, v, m); };
                 std::vector<BadInput> c{
                     {op, "q", [=] { scaled_dot_product_attention(u, k, v); }},
                     {op, "k", [=] { scaled_dot_product_attention(q, u, v); }},
                     {op, "v", [=] { scaled_dot_product_attention(q, k, u); }},
                     {op, "q", [=] { scaled_dot_product_attention(some({4}, d), some({4}, d), some({4}, d)); }},
                     {op, "k", [=] { scaled_dot_product_attention(q, some({2, 5, 4}, d), v); }},
                     {op, "k", [=] { scaled_dot_product_attention(q, some({2, 3, 5, 4}, d), v); }},
                     {op, "k", [=] { scaled_dot_product_attention(q, some({2, 2, 5, 3}, d), v); }},
                     {op, "k", [=] { scaled_dot_product_attention(q, some({2, 2, 5, 4}, d, DType::f64), v); }},
                     {op, "v", [=] { scaled_dot_product_attention(q, k, some({2, 2, 4, 3}, d)); }},
                     {op, "v", [=] { scaled_dot_product_attention(q, k, some({1, 2, 5, 3}, d)); }},
                     {op, "attn_mask", [=] { f(some({3, 4}, d)); }},
                     {op, "attn_mask", [=] { f(some({5, 3}, d)); }},
                     {op, "attn_mask", [=] { f(some({3, 2, 3, 5}, d)); }},
                     {op, "attn_mask", [=] { f(some({1, 2, 2, 3, 5}, d)); }},
                     {op, "attn_mask", [=] { f(some({3, 5}, d, DType::s32)); }},
                     {op, "attn_mask", [=] { f(some({3, 5}, d, DType::f64)); }},
                     {op, "dropout_p", [=] { scaled_dot_product_attention(q, k, v, u, false, std::nullopt, -0.1); }},
                     {op, "dropout_p", [=] { scaled_dot_product_attention(q, k, v, u, false, std::nullopt, 1.5); }},
                     {op, "dropout_p", [=] { scaled_dot_product_attention(q, k, v, u, false, std::nullopt, kNaN); }},
                     {op, "scale", [=] { scaled_dot_product_attention(q, k, v, u, false, kNaN); }},
                     {op, "scale", [=] { scaled_dot_product_attention(q, k, v, u, false, kInf); }}};
                 for (DType dt : kNonFloat) {
                   c.push_back({op, "q", [=] { scaled_dot_product_attention(some({2, 3, 4}, d, dt), k, v); }});
                 }
                 Device o;
                 if (other_device(d, o)) {
                   c.push_back({op, "v", [=] { scaled_dot_product_attention(q, k, v.to(o)); }});
                   c.push_back({op, "attn_mask", [=] { f(some({3, 5}, o)); }});
                 }
                 return c;
               }});
  // packed_attention: the fused kernel with two heads (default scale) and, on
  // the same input, causal with four heads and its own scale; extra output:
  // a sequence of 65 (past the fused reach: the composition), forward only.
  e.push_back({"packed_attention", {"packed_attention"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 // The second input only feeds the extra output (no gradient: the checks
                 // differentiate outputs[0]; the unit test gradchecks the composition).
                 return Tensors{normal({2, 5, 24}, g, d, dt), normal({1, 65, 6}, g, d, dt).detach()};
               },
               [](const Tensors& v) {
                 Tensor y = add(packed_attention(v[0], 2), packed_attention(v[0], 4, true, 0.7));
                 return Tensors{y, packed_attention(v[1], 1, true)};
               },
               Promise::within(1e-12, 1e-5, 1e-2, 6e-2, "exp (glibc / libdevice); the composition's cuBLAS GEMMs"),
               GradMethod::finite_differences, {}, {}, [](Device d) {
                 const char* op = "packed_attention";
                 const Tensor qkv = some({2, 5, 24}, d);
                 std::vector<BadInput> c{
                     {op, "qkv", [] { packed_attention(Tensor(), 2); }},
                     {op, "qkv", [=] { packed_attention(some({24}, d), 2); }},
                     {op, "qkv", [=] { packed_attention(some({2, 5, 25}, d), 2); }},
                     {op, "qkv", [=] { packed_attention(some({2, 5, 0}, d), 2); }},
                     {op, "heads", [=] { packed_attention(qkv, 0); }},
                     {op, "heads", [=] { packed_attention(qkv, 3); }},
                     {op, "scale", [=] { packed_attention(qkv, 2, false, kNaN); }},
                     {op, "scale", [=] { packed_attention(qkv, 2, false, kInf); }}};
                 for (DType dt : kNonFloat) c.push_back({op, "qkv", [=] { packed_attention(some({2, 5, 24}, d, dt), 2); }});
                 return c;
               }});
  // packed_attention_fake_quantize_dynamic: packed_attention + the per-token
  // dynamic fake quant in one op. Width 128 with four heads (CUDA: the fused
  // kernels, the backward reading dO masked; differentiated), width 24 (the
  // composition everywhere). Not bit-identical across devices: exp is glibc's
  // on the CPU and libdevice's on CUDA (packed_attention's tolerance), and a
  // last-bit difference can move a value across a rounding boundary of the
  // fake quant (one step, a row's range / 255).
  e.push_back({"packed_attention_fake_quantize_dynamic", {"packed_attention_fake_quantize_dynamic"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{normal({2, 5, 384}, g, d, dt), normal({2, 5, 24}, g, d, dt).detach()};
               },
               [](const Tensors& v) {
                 const float eps = std::numeric_limits<float>::epsilon();
                 const auto asym = QuantMode::asymmetric, sym = QuantMode::symmetric;
                 return Tensors{packed_attention_fake_quantize_dynamic(v[0], 4, false, asym, -128, 127, eps),
                                packed_attention_fake_quantize_dynamic(v[0].detach(), 2, true, sym, -128, 127, 1e-5),
                                packed_attention_fake_quantize_dynamic(v[1], 2, false, asym, -128, 127, eps)};
               },
               Promise::within(0.04, 0.04, 0.04, 0.06, "exp (glibc against libdevice) may move a value across a "
                                                         "rounding boundary of the fake quant: one step"),
               GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 // f64: O = softmax(q kᵀ / sqrt(32)) v per head; dOm = dy * 1[in range] over O's rows
                 // (torchao's qparams in f32); then the attention's backward with dOm.
                 const auto host = [](const Tensor& t) { return t.detach().to(DType::f64).cpu().to_vector<double>(); };
                 const std::vector<double> x = host(v[0]), gy = host(dy);
                 const std::size_t B = 2, L = 5, H = 4, Dh = 32, D = H * Dh, W3 = 3 * D;
                 const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
                 auto at = [&](std::size_t b, std::size_t i, std::size_t part, std::size_t h, std::size_t d) {
                   return x[(b * L + i) * W3 + part * D + h * Dh + d];
                 };
                 std::vector<double> P(B * H * L * L), O(B * L * D), dx(x.size(), 0.0), dom(B * L * D);
                 for (std::size_t b = 0; b < B; ++b)
                   for (std::size_t h = 0; h < H; ++h)
                     for (std::size_t i = 0; i < L; ++i) {
                       double* p = &P[((b * H + h) * L + i) * L];
                       double mx = -INFINITY, sum = 0;
                       for (std::size_t j = 0; j < L; ++j) {
                         double dot = 0;
                         for (std::size_t d = 0; d < Dh; ++d) dot += at(b, i, 0, h, d) * at(b, j, 1, h, d);
                         p[j] = dot * scale;
                         mx = std::max(mx, p[j]);
                       }
                       for (std::size_t j = 0; j < L; ++j) sum += (p[j] = std::exp(p[j] - mx));
                       for (std::size_t j = 0; j < L; ++j) p[j] /= sum;
                       for (std::size_t d = 0; d < Dh; ++d) {
                         double o = 0;
                         for (std::size_t j = 0; j < L; ++j) o += p[j] * at(b, j, 2, h, d);
                         O[(b * L + i) * D + h * Dh + d] = o;
                       }
                     }
                 for (std::size_t r = 0; r < B * L; ++r) {
                   float lo = 0.0f, hi = 0.0f;  // torchao's range always holds 0
                   for (std::size_t j = 0; j < D; ++j) {
                     lo = std::min(lo, static_cast<float>(O[r * D + j]));
                     hi = std::max(hi, static_cast<float>(O[r * D + j]));
                   }
                   const float qs = std::max((hi - lo) / 255.0f, std::numeric_limits<float>::epsilon());
                   const double zp = std::clamp<double>(-128.0 - std::nearbyint(lo / qs), -128.0, 127.0);
                   const double inv = static_cast<double>(1.0f / qs);
                   for (std::size_t j = 0; j < D; ++j) {
                     const double q = std::nearbyint(O[r * D + j] * inv) + zp;
                     dom[r * D + j] = (q >= -128.0 && q <= 127.0) ? gy[r * D + j] : 0.0;
                   }
                 }
                 for (std::size_t b = 0; b < B; ++b)
                   for (std::size_t h = 0; h < H; ++h) {
                     const double* p = &P[(b * H + h) * L * L];
                     auto g = [&](std::size_t i, std::size_t d) { return dom[(b * L + i) * D + h * Dh + d]; };
                     auto grad = [&](std::size_t i, std::size_t part, std::size_t d) -> double& {
                       return dx[(b * L + i) * W3 + part * D + h * Dh + d];
                     };
                     std::vector<double> ds(L * L);
                     for (std::size_t i = 0; i < L; ++i) {
                       double rowdot = 0;
                       for (std::size_t j = 0; j < L; ++j) {
                         double dp = 0;
                         for (std::size_t d = 0; d < Dh; ++d) dp += g(i, d) * at(b, j, 2, h, d);
                         ds[i * L + j] = dp;
                         rowdot += dp * p[i * L + j];
                       }
                       for (std::size_t j = 0; j < L; ++j) ds[i * L + j] = p[i * L + j] * (ds[i * L + j] - rowdot) * scale;
                     }
                     for (std::size_t j = 0; j < L; ++j)
                       for (std::size_t d = 0; d < Dh; ++d)
                         for (std::size_t i = 0; i < L; ++i) {
                           grad(j, 2, d) += p[i * L + j] * g(i, d);
                           grad(i, 0, d) += ds[i * L + j] * at(b, j, 1, h, d);
                           grad(j, 1, d) += ds[i * L + j] * at(b, i, 0, h, d);
                         }
                   }
                 return std::vector<std::vector<double>>{dx};
               },
               {},
               [](Device d) {
                 const char* op = "packed_attention_fake_quantize_dynamic";
                 const Tensor qkv = some({2, 5, 384}, d);
                 const auto asym = QuantMode::asymmetric;
                 const float fe = std::numeric_limits<float>::epsilon();
                 std::vector<BadInput> c{
                     {op, "qkv", [=] { packed_attention_fake_quantize_dynamic(Tensor(), 4, false, asym, -128, 127, fe); }},
                     {op, "qkv", [=] { packed_attention_fake_quantize_dynamic(some({2, 5, 25}, d), 4, false, asym, -128, 127, fe); }},
                     {op, "heads", [=] { packed_attention_fake_quantize_dynamic(qkv, 0, false, asym, -128, 127, fe); }},
                     {op, "heads", [=] { packed_attention_fake_quantize_dynamic(qkv, 3, false, asym, -128, 127, fe); }},
                     {op, "mode", [=] { packed_attention_fake_quantize_dynamic(qkv, 4, false, static_cast<QuantMode>(5), -128, 127, fe); }},
                     {op, "qmax", [=] { packed_attention_fake_quantize_dynamic(qkv, 4, false, asym, 127, -128, fe); }},
                     {op, "eps", [=] { packed_attention_fake_quantize_dynamic(qkv, 4, false, asym, -128, 127, 0.0); }}};
                 for (DType dt : kNonFloat)
                   c.push_back({op, "qkv", [=] { packed_attention_fake_quantize_dynamic(some({2, 5, 384}, d, dt), 4, false, asym, -128, 127, fe); }});
                 return c;
               }});
  return e;
}

}  // namespace qgrad::registry
