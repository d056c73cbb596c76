// Registry entries: fake quantize (straight-through), the observer-fused
// fake quantize, LSQ, quantize/dequantize in every scope, dynamic-range
// quantization and the W8A8 quantized linear.
#include <algorithm>
#include <cmath>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};
using Tensors = std::vector<Tensor>;
using Grads = std::vector<std::vector<double>>;

std::vector<double> host(const Tensor& t) { return t.detach().to(DType::f64).cpu().to_vector<double>(); }

// q before clamping, as docs/ops.md "Quantization: shared conventions" gives
// it: nearbyint(x * float(1 / scale)) + zp, the product in op math (f64 for
// an f64 x, else f32; x is exact in both).
double unclamped_q(double x, float scale, double zp, bool f64) {
  const float inv = 1.0f / scale;
  const double v = f64 ? x * static_cast<double>(inv) : static_cast<double>(static_cast<float>(x) * inv);
  return std::nearbyint(v) + zp;
}

// Straight-through: dx = dy where qmin <= q <= qmax, else 0; `channel(i)`
// picks the element's scale and zero point; `times` counts the calls summed.
Grads straight_through(const Tensor& x, const Tensor& dy, const std::vector<double>& scales,
                       const std::vector<double>& zps, std::int64_t qmin, std::int64_t qmax,
                       const std::function<std::size_t(std::size_t)>& channel, double times = 1.0) {
  const auto xs = host(x), gs = host(dy);
  std::vector<double> dx(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::size_t c = channel(i);
    const double q = unclamped_q(xs[i], static_cast<float>(scales[c]), zps[c], x.dtype() == DType::f64);
    dx[i] = (q >= static_cast<double>(qmin) && q <= static_cast<double>(qmax)) ? gs[i] * times : 0.0;
  }
  return {dx};
}

// relu(fake quantize) per tensor: y = max((clamp(q) - zp) * scale, 0) (the
// product in f32, as the per-tensor fake quantize takes it) and dx = dy
// where qmin <= q <= qmax and y > 0, else 0.
std::vector<double> fake_quant_relu_values(const Tensor& x, float scale, double zp, std::int64_t qmin,
                                           std::int64_t qmax) {
  const auto xs = host(x);
  std::vector<double> y(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double q = unclamped_q(xs[i], scale, zp, x.dtype() == DType::f64);
    const double c = std::clamp(q, static_cast<double>(qmin), static_cast<double>(qmax));
    y[i] = std::max(static_cast<double>(static_cast<float>(c - zp) * scale), 0.0);
  }
  return y;
}
Grads straight_through_relu(const Tensor& x, const Tensor& dy, float scale, double zp, std::int64_t qmin,
                            std::int64_t qmax) {
  const auto y = fake_quant_relu_values(x, scale, zp, qmin, qmax);
  Grads g = straight_through(x, dy, {scale}, {zp}, qmin, qmax, [](std::size_t) { return 0; });
  for (std::size_t i = 0; i < y.size(); ++i)
    if (!(y[i] > 0)) g[0][i] = 0.0;
  return g;
}

Tensor f32_on(const std::vector<float>& v, Device d) { return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, d); }
Tensor s32_on(const std::vector<std::int32_t>& v, Device d) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, d);
}

// The scale / zero point errors every quantization op shares.
std::vector<BadInput> qparam_errors(const char* op, const std::function<void(const Tensor&, const Tensor&)>& call,
                                    Device d, std::int64_t channels) {
  Tensor s = full({channels}, 0.25, on(d)), z = zeros({channels}, on(d, DType::s32));
  return {{op, "scale", [=] { call(s.to(DType::f64), z); }},
          {op, "zero_point", [=] { call(s, z.to(DType::f32)); }},
          {op, "scale", [=] { call(full({channels + 1}, 0.25, on(d)), zeros({channels + 1}, on(d, DType::s32))); }}};
}


// The argument errors of the quantization entries beyond their common ones:
// host scalars, qparam tensors (dtype, numel, values), axes, group sizes.
// Values inside qparam tensors are checked on the CPU only (cpu_only).
void add_argument_errors(std::vector<OpEntry>& e) {
  const DType non_float[] = {DType::s8, DType::u8, DType::s32, DType::s64, DType::boolean};
  constexpr double kInf = INFINITY, kNaN = NAN;
  constexpr std::int64_t kBig = std::int64_t{1} << 40;
  const std::vector<double> bad_scales = {0.0, -0.1, kInf, -kInf, kNaN, 1e-300, 1e300};
  extend_bad_inputs(e, "fake_quantize_per_tensor", [=](Device d) {
    const Tensor x = some({4, 6}, d), u, s1 = f32_on({0.1f}, d), z1 = s32_on({3}, d);
    const Tensor sc = f32_on({0.1f, 0.2f, 0.3f, 0.4f}, d), zc = s32_on({0, 1, 2, 3}, d);
    const char* op = "fake_quantize_per_tensor";
    std::vector<BadInput> c;
    for (double s : bad_scales) c.push_back({op, "scale", [=] { fake_quantize_per_tensor(x, s, 0, -128, 127); }});
    c.push_back({op, "zero_point", [=] { fake_quantize_per_tensor(x, 0.1, 128, -128, 127); }});
    c.push_back({op, "zero_point", [=] { fake_quantize_per_tensor(x, 0.1, -1, 0, 255); }});
    c.push_back({op, "qmax", [=] { fake_quantize_per_tensor(x, 0.1, 0, 5, 5); }});
    c.push_back({op, "qmax", [=] { fake_quantize_per_tensor(x, 0.1, 0, 10, -10); }});
    c.push_back({op, "qmin", [=] { fake_quantize_per_tensor(x, 0.1, 0, -kBig, 10); }});
    c.push_back({op, "qmax", [=] { fake_quantize_per_tensor(x, 0.1, 0, 0, kBig); }});
    c.push_back({op, "x", [=] { fake_quantize_per_tensor(u, 0.1, 0, 0, 255); }});
    for (DType dt : non_float) c.push_back({op, "x", [=] { fake_quantize_per_tensor(some({3}, d, dt), 0.1, 0, 0, 255); }});
    c.push_back({op, "scale", [=] { fake_quantize_per_tensor(x, u, z1, 0, 255); }});
    c.push_back({op, "zero_point", [=] { fake_quantize_per_tensor(x, s1, u, 0, 255); }});
    c.push_back({op, "scale", [=] { fake_quantize_per_tensor(x, s1.to(DType::f64), z1, 0, 255); }});
    c.push_back({op, "zero_point", [=] { fake_quantize_per_tensor(x, s1, z1.to(DType::s64), 0, 255); }});
    c.push_back({op, "scale", [=] { fake_quantize_per_tensor(x, sc, z1, 0, 255); }});
    c.push_back({op, "zero_point", [=] { fake_quantize_per_tensor(x, s1, zc, 0, 255); }});
    for (float s : {0.0f, -1.0f, INFINITY, NAN})
      c.push_back({op, "scale", [=] { fake_quantize_per_tensor(x, f32_on({s}, d), z1, 0, 255); }, true});
    c.push_back({op, "zero_point", [=] { fake_quantize_per_tensor(x, s1, s32_on({-5}, d), 0, 255); }, true});
    return c;
  });
  extend_bad_inputs(e, "quantize_per_tensor -> dequantize_per_tensor", [=](Device d) {
    const Tensor x = some({4, 6}, d), u, s1 = f32_on({0.1f}, d), z1 = s32_on({3}, d);
    std::vector<BadInput> c;
    for (double s : bad_scales) {
      c.push_back({"quantize_per_tensor", "scale", [=] { quantize_per_tensor(x, s, 0, DType::s8); }});
      c.push_back({"dequantize_per_tensor", "scale", [=] { dequantize_per_tensor(some({4}, d, DType::s8), s, 0); }});
    }
    c.push_back({"quantize_per_tensor", "zero_point", [=] { quantize_per_tensor(x, 0.1, 300, DType::u8); }});
    c.push_back({"quantize_per_tensor", "zero_point", [=] { quantize_per_tensor(x, 0.1, -129, DType::s8); }});
    for (DType dt : {DType::f32, DType::s32, DType::s64, DType::boolean, DType::f16})
      c.push_back({"quantize_per_tensor", "dtype", [=] { quantize_per_tensor(x, 0.1, 0, dt); }});
    c.push_back({"quantize_per_tensor", "x", [=] { quantize_per_tensor(some({3}, d, DType::s32), 0.1, 0, DType::s8); }});
    c.push_back({"quantize_per_tensor", "scale", [=] { quantize_per_tensor(x, f32_on({0.0f}, d), z1, DType::u8); }, true});
    c.push_back({"quantize_per_tensor", "zero_point", [=] { quantize_per_tensor(x, s1, s32_on({1000}, d), DType::u8); }, true});
    c.push_back({"dequantize_per_tensor", "q", [=] { dequantize_per_tensor(x, s1, z1); }});
    c.push_back({"dequantize_per_tensor", "q", [=] { dequantize_per_tensor(u, 0.1, 0); }});
    c.push_back({"dequantize_per_tensor", "out_dtype",
                 [=] { dequantize_per_tensor(some({3}, d, DType::u8), 0.1, 0, DType::s32); }});
    c.push_back({"dequantize_per_tensor", "zero_point", [=] { dequantize_per_tensor(some({3}, d, DType::u8), 0.1, 256); }});
    return c;
  });
  extend_bad_inputs(e, "fake_quantize_per_channel", [](Device d) {
    const Tensor x = some({4, 6}, d), s1 = f32_on({0.1f}, d), z1 = s32_on({3}, d);
    const Tensor sc = f32_on({0.1f, 0.2f, 0.3f, 0.4f}, d), zc = s32_on({0, 1, 2, 3}, d);
    const char* op = "fake_quantize_per_channel";
    return std::vector<BadInput>{
        {op, "axis", [=] { fake_quantize_per_channel(x, sc, zc, 2, 0, 255); }},
        {op, "axis", [=] { fake_quantize_per_channel(x, sc, zc, -3, 0, 255); }},
        {op, "x", [=] { fake_quantize_per_channel(Tensor::scalar(1.0f, d), s1, z1, 0, 0, 255); }},
        {op, "scale", [=] { fake_quantize_per_channel(x, sc, zc, 1, 0, 255); }},
        {op, "zero_point", [=] { fake_quantize_per_channel(x, sc, s32_on({0, 1}, d), 0, 0, 255); }},
        {op, "scale", [=] { fake_quantize_per_channel(x, f32_on({0.1f, 0.0f, 0.1f, 0.1f}, d), zc, 0, 0, 255); }, true},
        {op, "scale", [=] { fake_quantize_per_channel(x, f32_on({0.1f, NAN, 0.1f, 0.1f}, d), zc, 0, 0, 255); }, true},
        {op, "zero_point", [=] { fake_quantize_per_channel(x, sc, s32_on({0, 1, 2, 300}, d), 0, 0, 255); }, true},
        {op, "qmax", [=] { fake_quantize_per_channel(x, sc, zc, 0, 3, 3); }}};
  });
  extend_bad_inputs(e, "quantize_per_channel -> dequantize_per_channel", [](Device d) {
    const Tensor x = some({4, 6}, d);
    const Tensor sc = f32_on({0.1f, 0.2f, 0.3f, 0.4f}, d), zc = s32_on({0, 1, 2, 3}, d);
    return std::vector<BadInput>{
        {"quantize_per_channel", "dtype", [=] { quantize_per_channel(x, sc, zc, 0, DType::s32); }},
        {"quantize_per_channel", "axis", [=] { quantize_per_channel(x, sc, zc, 5, DType::u8); }},
        {"quantize_per_channel", "zero_point", [=] { quantize_per_channel(x, sc, s32_on({0, 0, 0, -1}, d), 0, DType::u8); }, true},
        {"dequantize_per_channel", "q", [=] { dequantize_per_channel(x, sc, zc, 0); }},
        {"dequantize_per_channel", "scale", [=] { dequantize_per_channel(some({4, 6}, d, DType::s8), f32_on({1, 2}, d), zc, 0); }}};
  });
  extend_bad_inputs(e, "quantize_per_token -> dequantize_per_token", [](Device d) {
    const Tensor x = some({4, 6}, d);
    const Tensor sc = f32_on({0.1f, 0.2f, 0.3f, 0.4f}, d), zc = s32_on({0, 1, 2, 3}, d);
    return std::vector<BadInput>{
        {"quantize_per_token", "x", [=] { quantize_per_token(some({4}, d), sc, zc, DType::s8); }},
        {"quantize_per_token", "scale", [=] { quantize_per_token(x, f32_on({1, 2}, d), zc, DType::s8); }},
        {"quantize_per_token", "zero_point", [=] { quantize_per_token(x, sc, s32_on({1}, d), DType::s8); }},
        {"dequantize_per_token", "q", [=] { dequantize_per_token(x, sc, zc); }}};
  });
  extend_bad_inputs(e, "quantize_per_group -> dequantize_per_group", [](Device d) {
    const Tensor x = some({4, 6}, d), sg = full({4, 2}, 0.5, on(d)), zg = zeros({4, 2}, on(d, DType::s32));
    return std::vector<BadInput>{
        {"quantize_per_group", "group_size", [=] { quantize_per_group(x, sg, zg, 0, DType::s8); }},
        {"quantize_per_group", "group_size", [=] { quantize_per_group(x, sg, zg, -3, DType::s8); }},
        {"quantize_per_group", "group_size", [=] { quantize_per_group(x, sg, zg, 4, DType::s8); }},
        {"quantize_per_group", "scale", [=] { quantize_per_group(x, sg, zg, 2, DType::s8); }},
        {"quantize_per_group", "x", [=] { quantize_per_group(Tensor::scalar(1.0f, d), sg, zg, 3, DType::s8); }},
        {"dequantize_per_group", "out_dtype",
         [=] { dequantize_per_group(some({4, 6}, d, DType::s8), sg, zg, 3, DType::u8); }}};
  });
  extend_bad_inputs(e, "fake_quantize_learnable_per_tensor", [](Device d) {
    const Tensor x = some({4, 6}, d), u, ls = f32_on({0.1f}, d), lz = f32_on({2.0f}, d);
    const char* op = "fake_quantize_learnable_per_tensor";
    return std::vector<BadInput>{
        {op, "scale", [=] { fake_quantize_learnable_per_tensor(x, u, lz, 0, 255); }},
        {op, "zero_point", [=] { fake_quantize_learnable_per_tensor(x, ls, u, 0, 255); }},
        {op, "scale", [=] { fake_quantize_learnable_per_tensor(x, s32_on({1}, d), lz, 0, 255); }},
        {op, "scale", [=] { fake_quantize_learnable_per_tensor(x, f32_on({0.0f}, d), lz, 0, 255); }, true},
        {op, "zero_point", [=] { fake_quantize_learnable_per_tensor(x, ls, f32_on({NAN}, d), 0, 255); }, true},
        {op, "grad_factor", [=] { fake_quantize_learnable_per_tensor(x, ls, lz, 0, 255, kInf); }},
        {op, "qmax", [=] { fake_quantize_learnable_per_tensor(x, ls, lz, 9, 1); }},
        {op, "x", [=] { fake_quantize_learnable_per_tensor(some({2}, d, DType::u8), ls, lz, 0, 255); }}};
  });
  extend_bad_inputs(e, "fake_quantize_learnable_per_channel", [](Device d) {
    const Tensor x = some({4, 6}, d), ls = f32_on({0.1f}, d), sc = f32_on({0.1f, 0.2f, 0.3f, 0.4f}, d);
    const char* op = "fake_quantize_learnable_per_channel";
    return std::vector<BadInput>{
        {op, "axis", [=] { fake_quantize_learnable_per_channel(x, sc, sc, 3, 0, 255); }},
        {op, "scale", [=] { fake_quantize_learnable_per_channel(x, ls, sc, 0, 0, 255); }},
        {op, "grad_factor", [=] { fake_quantize_learnable_per_channel(x, sc, sc, 0, 0, 255, kNaN); }}};
  });
  extend_bad_inputs(e, "dynamic_range_quantize", [](Device d) {
    const Tensor x = some({4, 6}, d), u;
    const char* op = "dynamic_range_quantize";
    const QuantScope tensor = QuantScope::per_tensor();
    return std::vector<BadInput>{
        {op, "x", [=] { dynamic_range_quantize(u, tensor); }},
        {op, "x", [=] { dynamic_range_quantize(some({3}, d, DType::s32), tensor); }},
        {op, "out_dtype", [=] { dynamic_range_quantize(x, tensor, QuantMode::symmetric, DType::f32); }},
        {op, "q", [=] { dynamic_range_quantize(x, tensor, QuantMode::symmetric, DType::s8, -129, 127); }},
        {op, "q", [=] { dynamic_range_quantize(x, tensor, QuantMode::asymmetric, DType::u8, 10, 10); }},
        {op, "q", [=] { dynamic_range_quantize(x, tensor, QuantMode::symmetric, DType::s8, -10, 0); }},
        {op, "axis", [=] { dynamic_range_quantize(x, QuantScope::per_channel(2)); }},
        {op, "group_size", [=] { dynamic_range_quantize(x, QuantScope::per_group(1, 0)); }},
        {op, "group_size", [=] { dynamic_range_quantize(x, QuantScope::per_group(1, 4)); }},
        {op, "x", [=] { dynamic_range_quantize(Tensor::scalar(1.0f, d), QuantScope::per_token()); }}};
  });
  extend_bad_inputs(e, "quantized_linear", [](Device d) {
    const Tensor x = some({4, 6}, d), u, wq = some({5, 6}, d, DType::s8), ws = f32_on({1, 1, 1, 1, 1}, d);
    const Tensor s1 = f32_on({0.1f}, d), sc = f32_on({0.1f, 0.2f, 0.3f, 0.4f}, d), z0 = s32_on({0}, d);
    const ActivationQuant dyn = ActivationQuant::dynamic();
    ActivationQuant bad_dyn = dyn;
    bad_dyn.qmin = 0;
    const char* op = "quantized_linear";
    auto ql = [=](const Tensor& xx, const Tensor& w, const Tensor& s, const Tensor& b, const ActivationQuant& a) {
      quantized_linear(xx, w, s, b, a);
    };
    return std::vector<BadInput>{
        {op, "x", [=] { ql(u, wq, ws, Tensor(), dyn); }},
        {op, "x", [=] { ql(some({4, 6}, d, DType::s32), wq, ws, Tensor(), dyn); }},
        {op, "x", [=] { ql(Tensor::scalar(1.0f, d), wq, ws, Tensor(), dyn); }},
        {op, "x", [=] { ql(some({4, 0}, d), some({5, 0}, d, DType::s8), ws, Tensor(), dyn); }},
        {op, "w_q", [=] { ql(x, some({5, 6}, d, DType::u8), ws, Tensor(), dyn); }},
        {op, "w_q", [=] { ql(x, some({5, 4}, d, DType::s8), ws, Tensor(), dyn); }},
        {op, "w_scale", [=] { ql(x, wq, f32_on({1, 1}, d), Tensor(), dyn); }},
        {op, "w_scale", [=] { ql(x, wq, f32_on({1, 1, 0, 1, 1}, d), Tensor(), dyn); }, true},
        {op, "w_scale", [=] { ql(x, wq, f32_on({1, 1, NAN, 1, 1}, d), Tensor(), dyn); }, true},
        {op, "bias", [=] { ql(x, wq, ws, f32_on({1, 2}, d), dyn); }},
        {op, "bias", [=] { ql(x, wq, ws, some({5}, d, DType::s32), dyn); }},
        {op, "out_dtype", [=] { quantized_linear(x, wq, ws, Tensor(), dyn, DType::s8); }},
        {op, "act", [=] { ql(x, wq, ws, Tensor(), bad_dyn); }},
        {op, "act", [=] { ql(x, wq, ws, Tensor(), ActivationQuant::fixed(f32_on({0.0f}, d), z0, -127, 127)); }, true},
        {op, "act", [=] { ql(x, wq, ws, Tensor(), ActivationQuant::fixed(s1, z0, 5, 5)); }},
        {op, "act", [=] { ql(x, wq, ws, Tensor(), ActivationQuant::fixed(s1, z0, -300, 0)); }},
        {op, "act", [=] { ql(x, wq, ws, Tensor(), ActivationQuant::fixed(s1, s32_on({300}, d), 0, 255)); }, true},
        {op, "act", [=] { ql(x, wq, ws, Tensor(), ActivationQuant::fixed(sc, z0, -127, 127)); }},
        {op, "act", [=] {
           ActivationQuant a = ActivationQuant::dynamic(QuantMode::asymmetric);
           a.weight_row_sums = s32_on({0, 0}, d);
           ql(x, wq, ws, Tensor(), a);
         }}};
  });
}

}  // namespace

std::vector<OpEntry> quantization_entries() {
  std::vector<OpEntry> e;
  // fake_quantize_per_tensor, host scalars and tensor qparams (summed).
  e.push_back({"fake_quantize_per_tensor", {"fake_quantize_per_tensor"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{quant_input({200}, g, d, dt, 0.125, 3, -128, 127), f32_on({0.125f}, d), s32_on({3}, d)};
               },
               [](const Tensors& v) {
                 return Tensors{add(fake_quantize_per_tensor(v[0], 0.125, 3, -128, 127),
                                    fake_quantize_per_tensor(v[0], v[1], v[2], -128, 127))};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 return straight_through(v[0], dy, {0.125}, {3}, -128, 127, [](std::size_t) { return 0; }, 2.0);
               },
               {}, [](Device d) {
                 Tensor x = zeros({8}, on(d));
                 auto call = [x](const Tensor& s, const Tensor& z) { fake_quantize_per_tensor(x, s, z, -128, 127); };
                 auto errors = qparam_errors("fake_quantize_per_tensor", call, d, 1);
                 errors.push_back({"fake_quantize_per_tensor", "scale", [=] { fake_quantize_per_tensor(x, 0.0, 0, -128, 127); }});
                 errors.push_back({"fake_quantize_per_tensor", "qmax", [=] { fake_quantize_per_tensor(x, 0.1, 0, 5, 5); }});
                 errors.push_back({"fake_quantize_per_tensor", "zero_point", [=] { fake_quantize_per_tensor(x, 0.1, 300, -128, 127); }});
                 errors.push_back({"fake_quantize_per_tensor", "x", [=] { fake_quantize_per_tensor(x.to(DType::s32), 0.1, 0, -128, 127); }});
                 return errors;
               }});
  // relu(fake_quantize_per_tensor) as one op (u8 with zero point 100: values
  // on both sides of the relu, and past both clamp bounds).
  {
    OpEntry r;
    r.name = r.covers.emplace_back("fake_quantize_relu_per_tensor");
    r.dtypes = kFloat;
    r.inputs = [](Device d, DType dt, Generator& g) {
      return Tensors{quant_input({300}, g, d, dt, 0.0625, 100, 0, 255), f32_on({0.0625f}, d), s32_on({100}, d)};
    };
    r.call = [](const Tensors& v) { return Tensors{fake_quantize_relu_per_tensor(v[0], v[1], v[2], 0, 255)}; };
    r.promise = Promise::bit_identical();
    r.grad = GradMethod::host_reference;
    r.grad_reference = [](const Tensors& v, const Tensor& dy) {
      return straight_through_relu(v[0], dy, 0.0625f, 100, 0, 255);
    };
    r.forward_reference = [](const Tensors& v) { return fake_quant_relu_values(v[0], 0.0625f, 100, 0, 255); };
    r.bad_inputs = [](Device d) {
      Tensor x = zeros({8}, on(d));
      const char* op = "fake_quantize_relu_per_tensor";
      auto call = [x](const Tensor& s, const Tensor& z) { fake_quantize_relu_per_tensor(x, s, z, 0, 255); };
      auto errors = qparam_errors(op, call, d, 1);
      const Tensor s1 = f32_on({0.1f}, d), z1 = s32_on({3}, d);
      errors.push_back({op, "qmax", [=] { fake_quantize_relu_per_tensor(x, s1, z1, 5, 5); }});
      errors.push_back({op, "x", [=] { fake_quantize_relu_per_tensor(x.to(DType::s32), s1, z1, 0, 255); }});
      errors.push_back({op, "scale", [=] { fake_quantize_relu_per_tensor(x, f32_on({0.0f}, d), z1, 0, 255); }, true});
      errors.push_back({op, "zero_point", [=] { fake_quantize_relu_per_tensor(x, s1, s32_on({300}, d), 0, 255); }, true});
      return errors;
    };
    e.push_back(r);
  }
  // fake_quantize over a QuantScope (here per token: one row of x [4, 50] a qparam).
  e.push_back({"fake_quantize (QuantScope)", {"fake_quantize"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{quant_input({4, 50}, g, d, dt, 0.0625, 0, 0, 255),
                                f32_on({0.0625f, 0.03f, 0.5f, 0.011f}, d), s32_on({0, 7, 128, 255}, d)};
               },
               [](const Tensors& v) { return Tensors{fake_quantize(v[0], v[1], v[2], QuantScope::per_token(), 0, 255)}; },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 return straight_through(v[0], dy, host(v[1]), host(v[2]), 0, 255, [](std::size_t i) { return i / 50; });
               },
               {}, [](Device d) {
                 Tensor x = zeros({4, 6}, on(d));
                 auto call = [x](const Tensor& s, const Tensor& z) {
                   fake_quantize(x, s, z, QuantScope::per_token(), -128, 127);
                 };
                 auto errors = qparam_errors("fake_quantize", call, d, 4);
                 Tensor s = full({4, 3}, 0.25, on(d)), z = zeros({4, 3}, on(d, DType::s32));
                 errors.push_back({"fake_quantize", "scope", [=] { fake_quantize(x, s, z, QuantScope::per_group(0, 2), -128, 127); }});
                 errors.push_back({"fake_quantize", "qmax", [=] { fake_quantize(x, s, z, QuantScope::per_group(1, 2), 5, 5); }});
                 return errors;
               }});
  e.push_back({"fake_quantize_per_channel", {"fake_quantize_per_channel"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{quant_input({4, 50}, g, d, dt, 0.0625, 0, 0, 255),
                                f32_on({0.0625f, 0.03f, 0.5f, 0.011f}, d), s32_on({0, 7, 128, 255}, d)};
               },
               [](const Tensors& v) { return Tensors{fake_quantize_per_channel(v[0], v[1], v[2], 0, 0, 255)}; },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {
                 return straight_through(v[0], dy, host(v[1]), host(v[2]), 0, 255, [](std::size_t i) { return i / 50; });
               },
               {}, [](Device d) {
                 Tensor x = zeros({4, 6}, on(d));
                 auto call = [x](const Tensor& s, const Tensor& z) { fake_quantize_per_channel(x, s, z, 0, -128, 127); };
                 auto errors = qparam_errors("fake_quantize_per_channel", call, d, 4);
                 Tensor s = full({4}, 0.25, on(d)), z = zeros({4}, on(d, DType::s32));
                 errors.push_back({"fake_quantize_per_channel", "axis", [=] { fake_quantize_per_channel(x, s, z, 2, -128, 127); }});
                 return errors;
               }});
  // The observer-fused forms: the range is updated in place, the qparams
  // written, then x fake quantized with them.
  for (const bool per_channel : {false, true}) {
    const char* name = per_channel ? "observe_fake_quantize_per_channel" : "observe_fake_quantize_per_tensor";
    const std::int64_t c = per_channel ? 4 : 1;
    e.push_back({name, {name}, kFloat,
                 [c](Device d, DType dt, Generator& g) {
                   Tensor run_min = full({c}, 0.5, on(d)), run_max = full({c}, 1.0, on(d));
                   return Tensors{normal({4, 30}, g, d, dt, 3.0), run_min, run_max, zeros({c}, on(d)),
                                  zeros({c}, on(d, DType::s32))};
                 },
                 [per_channel](const Tensors& v) {
                   const ObserverUpdate u{v[1], v[2], 0.25, false, 0};
                   Tensor y = per_channel ? observe_fake_quantize_per_channel(v[0], v[3], v[4], 0, -128, 127, u)
                                          : observe_fake_quantize_per_tensor(v[0], v[3], v[4], -128, 127, u);
                   return Tensors{y, v[1], v[2], v[3], v[4]};
                 },
                 Promise::bit_identical(), GradMethod::host_reference,
                 [per_channel](const Tensors& v, const Tensor& dy) {  // scale / zp as the op wrote them
                   return straight_through(v[0], dy, host(v[3]), host(v[4]), -128, 127,
                                           [per_channel](std::size_t i) { return per_channel ? i / 30 : 0; });
                 },
                 {}, [name, per_channel, c](Device d) {
                   Tensor x = zeros({4, 30}, on(d)), s = zeros({c}, on(d)), z = zeros({c}, on(d, DType::s32));
                   auto call = [=](const ObserverUpdate& u) {
                     if (per_channel) observe_fake_quantize_per_channel(x, s, z, 0, -128, 127, u);
                     else observe_fake_quantize_per_tensor(x, s, z, -128, 127, u);
                   };
                   Tensor r = full({c}, 1.0, on(d));
                   return std::vector<BadInput>{
                       {name, "averaging_constant", [=] { call({r, r, 2.0, false, 0}); }},
                       {name, "run_min", [=] { call({r.to(DType::f64), r, 0.1, false, 0}); }},
                       {name, "run_max", [=] { call({r, full({c + 1}, 1.0, on(d)), 0.1, false, 0}); }}};
                 }});
  }
  // The observer-fused relu form: u8, so the zero point the observer writes
  // is inside the range and the relu cuts there.
  e.push_back({"observe_fake_quantize_relu_per_tensor", {"observe_fake_quantize_relu_per_tensor"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 Tensor run_min = full({1}, -0.5, on(d)), run_max = full({1}, 1.0, on(d));
                 return Tensors{normal({4, 30}, g, d, dt, 3.0), run_min, run_max, zeros({1}, on(d)),
                                zeros({1}, on(d, DType::s32))};
               },
               [](const Tensors& v) {
                 const ObserverUpdate u{v[1], v[2], 0.25, false, 0};
                 return Tensors{observe_fake_quantize_relu_per_tensor(v[0], v[3], v[4], 0, 255, u), v[1], v[2], v[3],
                                v[4]};
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {  // scale / zp as the op wrote them
                 return straight_through_relu(v[0], dy, static_cast<float>(host(v[3])[0]), host(v[4])[0], 0, 255);
               },
               {}, [](Device d) {
                 const char* op = "observe_fake_quantize_relu_per_tensor";
                 Tensor x = zeros({4, 30}, on(d)), s = zeros({1}, on(d)), z = zeros({1}, on(d, DType::s32));
                 auto call = [=](const ObserverUpdate& u) { observe_fake_quantize_relu_per_tensor(x, s, z, 0, 255, u); };
                 Tensor r = full({1}, 1.0, on(d));
                 return std::vector<BadInput>{
                     {op, "averaging_constant", [=] { call({r, r, 2.0, false, 0}); }},
                     {op, "run_min", [=] { call({r.to(DType::f64), r, 0.1, false, 0}); }},
                     {op, "run_max", [=] { call({r, full({2}, 1.0, on(d)), 0.1, false, 0}); }},
                     {op, "x", [=] { observe_fake_quantize_relu_per_tensor(x.to(DType::s32), s, z, 0, 255,
                                                                            {r, r, 0.1, false, 0}); }},
                     {op, "scale", [=] { observe_fake_quantize_relu_per_tensor(x, full({2}, 1.0, on(d)), z, 0, 255,
                                                                                {r, r, 0.1, false, 0}); }}};
               }});
  // observe_fake_quantize_per_channel_batch: x [4, 30] (4 channels), a view
  // of it [12, 10] (12 channels; x's gradient is the two straight-throughs
  // summed) and a detached view [2, 60] observed as running min/max (another
  // averaging constant: on CUDA its own launch, the other two one batch
  // launch). The states as the ops wrote them are outputs too.
  e.push_back({"observe_fake_quantize_per_channel_batch", {"observe_fake_quantize_per_channel_batch"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 Tensors v{normal({4, 30}, g, d, dt, 3.0)};
                 for (const std::int64_t c : {4, 12, 2}) {
                   v.push_back(full({c}, -0.5, on(d)));  // run_min
                   v.push_back(full({c}, 1.0, on(d)));   // run_max
                   v.push_back(zeros({c}, on(d)));       // scale
                   v.push_back(zeros({c}, on(d, DType::s32)));
                 }
                 return v;
               },
               [](const Tensors& v) {
                 const std::vector<Tensor> y = observe_fake_quantize_per_channel_batch(
                     {{v[0], v[3], v[4], 0, -128, 127, {v[1], v[2], 0.25, true, 0}},
                      {v[0].reshape({12, 10}), v[7], v[8], 0, -128, 127, {v[5], v[6], 0.25, true, 0}},
                      {v[0].detach().reshape({2, 60}), v[11], v[12], 0, 0, 255, {v[9], v[10], -1.0, false, 0}}});
                 Tensors out{add(y[0], y[1].reshape({4, 30})), y[2]};
                 out.insert(out.end(), v.begin() + 1, v.end());
                 return out;
               },
               Promise::bit_identical(), GradMethod::host_reference,
               [](const Tensors& v, const Tensor& dy) {  // scale / zp as the op wrote them
                 Grads a = straight_through(v[0], dy, host(v[3]), host(v[4]), -128, 127,
                                            [](std::size_t i) { return i / 30; });
                 const Grads b = straight_through(v[0], dy, host(v[7]), host(v[8]), -128, 127,
                                                  [](std::size_t i) { return i / 10; });
                 for (std::size_t i = 0; i < a[0].size(); ++i) a[0][i] += b[0][i];
                 return a;
               },
               {}, [](Device d) {
                 const char* op = "observe_fake_quantize_per_channel_batch";
                 const Tensor x = zeros({4, 30}, on(d)), r = full({4}, 1.0, on(d));
                 const auto item = [x, d](const Tensor& run_min, const Tensor& scale) {  // by value: the cases outlive this scope
                   return ChannelObserveArgs{x, scale, zeros({4}, on(d, DType::s32)), 0, -128, 127,
                                             {run_min, full({4}, 1.0, on(d)), 0.1, true, 0}};
                 };
                 const ChannelObserveArgs ok = item(full({4}, 1.0, on(d)), zeros({4}, on(d)));
                 ChannelObserveArgs no_x = item(r, zeros({4}, on(d)));
                 no_x.x = Tensor();
                 ChannelObserveArgs axis = item(full({4}, 1.0, on(d)), zeros({4}, on(d)));
                 axis.axis = 2;
                 ChannelObserveArgs average = item(full({4}, 1.0, on(d)), zeros({4}, on(d)));
                 average.observer.averaging_constant = 2.0;
                 const auto batch = [](std::vector<ChannelObserveArgs> items) {
                   observe_fake_quantize_per_channel_batch(items);
                 };
                 return std::vector<BadInput>{
                     {op, "items", [=] { batch({}); }},
                     {op, "items[1].x", [=] { batch({ok, no_x}); }},
                     {op, "items[1].axis", [=] { batch({ok, axis}); }},
                     {op, "items[1].averaging_constant", [=] { batch({ok, average}); }},
                     {op, "items[0].run_min", [=] { batch({item(r.to(DType::f64), zeros({4}, on(d)))}); }},
                     {op, "items[0].scale", [=] { batch({item(r, zeros({5}, on(d)))}); }},
                     // Shared observer state: the second item's run_min is the first's.
                     {op, "items[1].run_min", [=] { batch({item(r, zeros({4}, on(d))), item(r, zeros({4}, on(d)))}); }},
                     {op, "items[1].scale", [=] {
                        const Tensor s = zeros({4}, on(d));
                        batch({item(full({4}, 1.0, on(d)), s), item(full({4}, 1.0, on(d)), s)});
                      }}};
               }});
  // LSQ: gradients for x, scale and zero point with PyTorch's formulas
  // (not the derivative of the step function), transcribed on the host.
  for (const bool per_channel : {false, true}) {
    const char* name = per_channel ? "fake_quantize_learnable_per_channel" : "fake_quantize_learnable_per_tensor";
    const std::int64_t c = per_channel ? 4 : 1;
    OpEntry lsq;
    lsq.name = name;
    lsq.covers = {name};
    lsq.dtypes = kFloat;
    lsq.promise = Promise::bit_identical();  // the sums' order is fixed on both devices (docs/ops.md)
    lsq.grad = GradMethod::host_reference;
    lsq.inputs = [c](Device d, DType dt, Generator& g) {
      return Tensors{normal({4, 6}, g, d, dt), leaf(rand({c}, g, on(d, dt), 0.05, 0.2)),
                     leaf(rand({c}, g, on(d, dt), -3.0, 3.0))};
    };
    lsq.call = [per_channel](const Tensors& v) {
      return Tensors{per_channel ? fake_quantize_learnable_per_channel(v[0], v[1], v[2], 0, -8, 7, 0.7)
                                 : fake_quantize_learnable_per_tensor(v[0], v[1], v[2], -8, 7, 0.7)};
    };
    lsq.grad_reference = [per_channel, c](const Tensors& v, const Tensor& dy) {
      const auto xs = host(v[0]), gs = host(dy), ss = host(v[1]), zs = host(v[2]);
      const double gf = 0.7, qmin = -8, qmax = 7;
      std::vector<double> dx(xs.size()), ds(static_cast<std::size_t>(c)), dz(static_cast<std::size_t>(c));
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const std::size_t ch = per_channel ? i / 6 : 0;
        const float s = static_cast<float>(ss[ch]);
        const double z = std::clamp<double>(std::nearbyint(static_cast<float>(zs[ch])), qmin, qmax);
        const float inv = 1.0f / s;
        const double q = std::nearbyint(xs[i] * static_cast<double>(inv)) + z;
        if (q < qmin || q > qmax) {
          ds[ch] += (gs[i] * ((q < qmin ? qmin : qmax) - z)) * gf;
          dz[ch] += ((gs[i] * -1.0) * s) * gf;
        } else {
          dx[i] = gs[i];
          ds[ch] += ((gs[i] * ((q - z) * s - xs[i])) * static_cast<double>(inv)) * gf;
        }
      }
      return Grads{dx, ds, dz};
    };
    lsq.forward_reference = [per_channel](const Tensors& v) {
      const auto xs = host(v[0]), ss = host(v[1]), zs = host(v[2]);
      const double qmin = -8, qmax = 7;
      std::vector<double> y(xs.size());
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const std::size_t ch = per_channel ? i / 6 : 0;
        const float s = static_cast<float>(ss[ch]);
        const double z = std::clamp<double>(std::nearbyint(static_cast<float>(zs[ch])), qmin, qmax);
        const double q = std::nearbyint(xs[i] * static_cast<double>(1.0f / s)) + z;
        // Per tensor the product is f32 (as fake_quantize_per_tensor), per channel f64.
        const double qz = std::clamp<double>(q, qmin, qmax) - z;
        y[i] = per_channel ? qz * static_cast<double>(s) : static_cast<double>(static_cast<float>(qz) * s);
      }
      return y;
    };
    lsq.bad_inputs = [name, per_channel, c](Device d) {
      Tensor x = zeros({4, 6}, on(d)), s = full({c}, 0.1, on(d)), z = zeros({c}, on(d));
      auto call = [=](const Tensor& sc, const Tensor& zp, double gf) {
        if (per_channel) fake_quantize_learnable_per_channel(x, sc, zp, 0, -8, 7, gf);
        else fake_quantize_learnable_per_tensor(x, sc, zp, -8, 7, gf);
      };
      std::vector<BadInput> errors{{name, "grad_factor", [=] { call(s, z, NAN); }},
                                   {name, "scale", [=] { call(zeros({c + 1}, on(d)), z, 1.0); }}};
      // Qparam values are checked on the CPU only (docs/ops.md: no host sync on CUDA).
      if (d.is_cpu()) errors.push_back({name, "zero_point", [=] { call(s, full({c}, NAN, on(d)), 1.0); }});
      return errors;
    };
    e.push_back(lsq);
  }
  // quantize -> dequantize in each scope: the integer tensor and the values
  // are compared across devices; the gradient reaching x is straight-through
  // (power-of-two scales, so dq / scale * scale is exact).
  struct Scope {
    const char* name;
    std::vector<std::string> covers;
    Shape shape;
    std::vector<float> scales;
    std::vector<std::int32_t> zps;
    DType qtype;
    std::function<std::size_t(std::size_t)> channel;
    std::function<Tensors(const Tensor&, const Tensor&, const Tensor&)> roundtrip;  // -> {y, q}
  };
  const std::vector<Scope> scopes = {
      {"quantize_per_tensor -> dequantize_per_tensor", {"quantize_per_tensor", "dequantize_per_tensor"}, {3, 40},
       {0.25f}, {3}, DType::s8, [](std::size_t) { return std::size_t{0}; },
       [](const Tensor& x, const Tensor& s, const Tensor& z) {
         Tensor q = quantize_per_tensor(x, 0.25, 3, DType::s8), qt = quantize_per_tensor(x, s, z, DType::s8);
         return Tensors{add(dequantize_per_tensor(q, 0.25, 3, x.dtype()), dequantize_per_tensor(qt, s, z, x.dtype())), q, qt};
       }},
      {"quantize_per_channel -> dequantize_per_channel", {"quantize_per_channel", "dequantize_per_channel"}, {3, 40},
       {0.25f, 0.5f, 0.125f}, {0, -2, 5}, DType::s8, [](std::size_t i) { return i / 40; },
       [](const Tensor& x, const Tensor& s, const Tensor& z) {
         Tensor q = quantize_per_channel(x, s, z, 0, DType::s8);
         return Tensors{dequantize_per_channel(q, s, z, 0, x.dtype()), q};
       }},
      {"quantize_per_token -> dequantize_per_token", {"quantize_per_token", "dequantize_per_token"}, {3, 40},
       {0.25f, 0.5f, 0.125f}, {100, 120, 128}, DType::u8, [](std::size_t i) { return i / 40; },
       [](const Tensor& x, const Tensor& s, const Tensor& z) {
         Tensor q = quantize_per_token(x, s, z, DType::u8);
         return Tensors{dequantize_per_token(q, s, z, x.dtype()), q};
       }},
      {"quantize_per_group -> dequantize_per_group", {"quantize_per_group", "dequantize_per_group"}, {3, 40},
       {0.25f, 0.5f, 0.125f, 1.0f, 0.25f, 0.5f}, {0, 1, -1, 2, 0, 3}, DType::s8,
       [](std::size_t i) { return (i / 40) * 2 + (i % 40) / 20; },
       [](const Tensor& x, const Tensor& s, const Tensor& z) {
         Tensor q = quantize_per_group(x, s.reshape({3, 2}), z.reshape({3, 2}), 20, DType::s8);
         return Tensors{dequantize_per_group(q, s.reshape({3, 2}), z.reshape({3, 2}), 20, x.dtype()), q};
       }},
      {"quantize -> dequantize (QuantScope)", {"quantize", "dequantize"}, {3, 40},
       {0.25f, 0.5f, 0.125f, 1.0f, 0.25f, 0.5f}, {0, 1, -1, 2, 0, 3}, DType::s8,
       [](std::size_t i) { return (i / 40) * 2 + (i % 40) / 20; },
       [](const Tensor& x, const Tensor& s, const Tensor& z) {
         const QuantScope scope = QuantScope::per_group(-1, 20);
         Tensor q = quantize(x, s.reshape({3, 2}), z.reshape({3, 2}), scope, DType::s8);
         return Tensors{dequantize(q, s.reshape({3, 2}), z.reshape({3, 2}), scope, x.dtype()), q};
       }},
  };
  for (const Scope& sc : scopes) {
    const double times = sc.covers[0] == "quantize_per_tensor" ? 2.0 : 1.0;
    const std::int64_t qmin = quant_min_of(sc.qtype), qmax = quant_max_of(sc.qtype);
    e.push_back({sc.name, sc.covers, kFloat,
                 [sc, qmin, qmax](Device d, DType dt, Generator& g) {
                   return Tensors{quant_input(sc.shape, g, d, dt, 0.25, sc.zps[0], qmin, qmax), f32_on(sc.scales, d),
                                  s32_on(sc.zps, d)};
                 },
                 [sc](const Tensors& v) { return sc.roundtrip(v[0], v[1], v[2]); }, Promise::bit_identical(),
                 GradMethod::host_reference,
                 [sc, qmin, qmax, times](const Tensors& v, const Tensor& dy) {
                   return straight_through(v[0], dy, host(v[1]), host(v[2]), qmin, qmax, sc.channel, times);
                 },
                 {}, [sc](Device d) {
                   const char* op = sc.covers[0].c_str();
                   Tensor x = zeros(sc.shape, on(d)), s = f32_on(sc.scales, d), z = s32_on(sc.zps, d);
                   return std::vector<BadInput>{
                       {op, "x", [=] { sc.roundtrip(x.to(DType::s32), s, z); }},
                       {op, "scale", [=] { sc.roundtrip(x, s.to(DType::f64), z); }},
                       {op, "zero_point", [=] { sc.roundtrip(x, s, z.to(DType::s64)); }}};
                 }});
  }
  e.push_back({"dynamic_range_quantize", {"dynamic_range_quantize"}, kFloat,
               [](Device d, DType dt, Generator& g) { return Tensors{normal({6, 32}, g, d, dt, 2.0)}; },
               [](const Tensors& v) {
                 Tensors out;
                 for (const QuantScope scope : {QuantScope::per_tensor(), QuantScope::per_channel(1),
                                                QuantScope::per_token(), QuantScope::per_group(1, 8)})
                   for (const QuantMode mode : {QuantMode::symmetric, QuantMode::asymmetric}) {
                     const DynamicQuantized r = dynamic_range_quantize(
                         v[0].detach(), scope, mode, mode == QuantMode::symmetric ? DType::s8 : DType::u8);
                     out.insert(out.end(), {r.q, r.scale, r.zero_point});
                   }
                 return out;
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, [](Device d) {
                 Tensor x = zeros({6, 32}, on(d));
                 return std::vector<BadInput>{
                     {"dynamic_range_quantize", "group_size", [=] { dynamic_range_quantize(x, QuantScope::per_group(1, 5)); }},
                     {"dynamic_range_quantize", "out_dtype",
                      [=] { dynamic_range_quantize(x, QuantScope::per_tensor(), QuantMode::symmetric, DType::s32); }},
                     {"dynamic_range_quantize", "axis", [=] { dynamic_range_quantize(x, QuantScope::per_channel(3)); }}};
               }});
  e.push_back({"quantized_linear", {"quantized_linear"}, {DType::f32, DType::f16, DType::bf16},
               [](Device d, DType dt, Generator& g) {
                 Tensor w = randint(-127, 128, {24, 32}, g, on(d, DType::s8));
                 return Tensors{normal({5, 32}, g, d, dt), w, rand({24}, g, on(d), 0.001, 0.01),
                                normal({24}, g, d, DType::f32), f32_on({0.05f}, d), s32_on({0}, d)};
               },
               [](const Tensors& v) {
                 const Tensor x = v[0].detach();
                 return Tensors{quantized_linear(x, v[1], v[2], v[3].detach(), ActivationQuant::dynamic()),
                                quantized_linear(x, v[1], v[2], Tensor(), ActivationQuant::fixed(v[4], v[5], -127, 127)),
                                quantized_linear(x, v[1], v[2], v[3].detach(), ActivationQuant::dynamic(QuantMode::asymmetric))};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, [](Device d) {
                 Tensor x = zeros({5, 32}, on(d)), w = zeros({24, 32}, on(d, DType::s8)), s = full({24}, 0.01, on(d));
                 return std::vector<BadInput>{
                     {"quantized_linear", "w_q", [=] { quantized_linear(x, w.to(DType::u8), s, Tensor(), ActivationQuant::dynamic()); }},
                     {"quantized_linear", "w_scale", [=] { quantized_linear(x, w, full({23}, 0.01, on(d)), Tensor(), ActivationQuant::dynamic()); }},
                     {"quantized_linear", "bias", [=] { quantized_linear(x, w, s, zeros({3}, on(d)), ActivationQuant::dynamic()); }}};
               }});
  add_argument_errors(e);
  return e;
}

}  // namespace qgrad::registry
