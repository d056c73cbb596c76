// Registry entries: the int8 convolution (quantized_conv2d, ops/quantized_conv.h)
// in its stride, padding, dilation, groups, depthwise and 1x1 forms, host and
// device qparams, every output dtype, and its argument errors.
#include <array>
#include <cmath>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

using Tensors = std::vector<Tensor>;
using Pair = std::array<std::int64_t, 2>;

const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};

Tensor f32_vec(const std::vector<float>& v, Device d) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, d);
}
Tensor s32_vec(const std::vector<std::int32_t>& v, Device d) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, d);
}

struct Config {
  const char* name;
  Shape x, w;
  Pair stride, padding, dilation;
  std::int64_t groups;
};

constexpr double kScale = 0.05;
constexpr std::int32_t kZero = 5;

// Inputs: x over the quantization grid and past it (ties, clamp edges, +-0,
// +-1e30), w_q random s8 (both ends included), w_scale, bias, and the
// activation qparams on the device (the call also passes host copies).
OpEntry entry(const Config& c) {
  return {c.name,
          {"quantized_conv2d"},
          kFloat,
          [c](Device d, DType dt, Generator& g) {
            const std::int64_t O = c.w[0];
            return Tensors{quant_input(c.x, g, d, dt, kScale, kZero, 0, 127),
                           randint(-128, 128, c.w, g, on(d, DType::s8)),
                           rand({O}, g, on(d), 0.001, 0.02),
                           randn({O}, g, on(d)),
                           f32_vec({static_cast<float>(kScale)}, d),
                           s32_vec({kZero}, d)};
          },
          [c](const Tensors& v) {
            const Tensor x = v[0].detach();
            const ActivationQuant host =
                ActivationQuant::fixed(f32_vec({static_cast<float>(kScale)}, Device::cpu()), s32_vec({kZero}, Device::cpu()), 0, 127);
            const ActivationQuant dev = ActivationQuant::fixed(v[4], v[5], 0, 127);
            return Tensors{
                quantized_conv2d(x, v[1], v[2], v[3], host, c.stride, c.padding, c.dilation, c.groups),
                quantized_conv2d(x, v[1], v[2], Tensor(), dev, c.stride, c.padding, c.dilation, c.groups, x.dtype()),
                quantized_conv2d(x, v[1], v[2], v[3].to(x.dtype()), dev, c.stride, c.padding, c.dilation, c.groups,
                                 DType::bf16)};
          },
          Promise::bit_identical(),
          GradMethod::none,
          {},
          {},
          nullptr};
}

// Every argument error: ranks, dtypes, devices, channels and groups, kernels
// larger than the padded input, zero sizes, stride / padding / dilation,
// w_scale and bias shapes and values, the activation quantization, out_dtype.
std::vector<BadInput> errors(Device d) {
  constexpr const char* op = "quantized_conv2d";
  const Tensor x = some({2, 4, 5, 5}, d), w = some({6, 4, 3, 3}, d, DType::s8), s = full({6}, 0.01, on(d)),
               b = some({6}, d), u;
  const ActivationQuant a = ActivationQuant::fixed(f32_vec({0.1f}, d), s32_vec({0}, d), -127, 127);
  auto call = [a](const Tensor& xx, const Tensor& ww, const Tensor& ss, const Tensor& bb = Tensor(), Pair st = {1, 1},
                  Pair p = {0, 0}, Pair dl = {1, 1}, std::int64_t g = 1) {
    quantized_conv2d(xx, ww, ss, bb, a, st, p, dl, g);
  };
  auto with_act = [=](const ActivationQuant& aa) { quantized_conv2d(x, w, s, b, aa); };
  auto s6 = [=](std::int64_t o) { return full({o}, 0.01, on(d)); };
  std::vector<BadInput> c{
      // undefined, wrong dtype, wrong rank
      {op, "x", [=] { call(u, w, s); }},
      {op, "x", [=] { call(some({2, 4, 5, 5}, d, DType::s8), w, s); }},
      {op, "x", [=] { call(some({4, 5, 5}, d), w, s); }},
      {op, "x", [=] { call(some({1, 2, 4, 5, 5}, d), w, s); }},
      {op, "w_q", [=] { call(x, u, s); }},
      {op, "w_q", [=] { call(x, some({6, 4, 3, 3}, d), s); }},                 // float weight
      {op, "w_q", [=] { call(x, some({6, 4, 3, 3}, d, DType::u8), s); }},      // unsigned weight
      {op, "w_q", [=] { call(x, some({6, 36}, d, DType::s8), s); }},           // rank 2
      {op, "w_scale", [=] { call(x, w, u); }},
      {op, "w_scale", [=] { call(x, w, some({6}, d, DType::f64)); }},
      {op, "w_scale", [=] { call(x, w, s6(5)); }},
      {op, "w_scale", [=] { call(x, w, full({6, 1}, 0.01, on(d))); }},
      {op, "w_scale", [=] { call(x, w, f32_vec({0.1f, 0.1f, 0.0f, 0.1f, 0.1f, 0.1f}, d)); }, true},
      {op, "w_scale", [=] { call(x, w, f32_vec({0.1f, NAN, 0.1f, 0.1f, 0.1f, 0.1f}, d)); }, true},
      {op, "bias", [=] { call(x, w, s, some({6}, d, DType::s32)); }},
      {op, "bias", [=] { call(x, w, s, some({4}, d)); }},
      {op, "out_dtype", [=] { quantized_conv2d(x, w, s, b, a, {1, 1}, {0, 0}, {1, 1}, 1, DType::s8); }},
      // channels and groups
      {op, "w_q", [=] { call(x, some({6, 3, 3, 3}, d, DType::s8), s); }},
      {op, "w_q", [=] { call(x, w, s, b, {1, 1}, {0, 0}, {1, 1}, 2); }},  // C / groups = 2, w has 4
      {op, "groups", [=] { call(some({2, 3, 5, 5}, d), some({6, 1, 3, 3}, d, DType::s8), s, b, {1, 1}, {0, 0}, {1, 1}, 2); }},
      {op, "groups", [=] { call(x, some({5, 2, 3, 3}, d, DType::s8), s6(5), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2); }},
      {op, "groups", [=] { call(x, w, s, b, {1, 1}, {0, 0}, {1, 1}, 0); }},
      // kernels larger than the padded input (the output would be empty)
      {op, "w_q", [=] { call(x, some({6, 4, 6, 3}, d, DType::s8), s); }},
      {op, "w_q", [=] { call(x, some({6, 4, 3, 8}, d, DType::s8), s, Tensor(), {1, 1}, {0, 1}); }},
      {op, "w_q", [=] { call(x, w, s, b, {1, 1}, {0, 0}, {3, 1}); }},
      // zero sizes
      {op, "x", [=] { call(some({2, 4, 0, 5}, d), w, s, Tensor(), {1, 1}, {2, 2}); }},
      {op, "x", [=] { call(some({2, 0, 5, 5}, d), some({6, 0, 3, 3}, d, DType::s8), s); }},
      {op, "w_q", [=] { call(x, some({0, 4, 3, 3}, d, DType::s8), full({0}, 0.01, on(d))); }},
      {op, "w_q", [=] { call(x, some({6, 4, 0, 3}, d, DType::s8), s); }},
      // stride, padding, dilation
      {op, "stride", [=] { call(x, w, s, b, {0, 1}); }},
      {op, "padding", [=] { call(x, w, s, b, {1, 1}, {-1, 0}); }},
      {op, "dilation", [=] { call(x, w, s, b, {1, 1}, {0, 0}, {1, 0}); }},
      // the activation quantization
      {op, "act.kind", [=] { with_act(ActivationQuant::dynamic()); }},
      {op, "act.scale", [=] { with_act(ActivationQuant::fixed(f32_vec({0.1f, 0.2f}, d), s32_vec({0}, d), -127, 127)); }},
      {op, "act.scale", [=] { with_act(ActivationQuant::fixed(s32_vec({1}, d), s32_vec({0}, d), -127, 127)); }},
      {op, "act.zero_point", [=] { with_act(ActivationQuant::fixed(f32_vec({0.1f}, d), f32_vec({0}, d), -127, 127)); }},
      {op, "act.qmin", [=] { with_act(ActivationQuant::fixed(f32_vec({0.1f}, d), s32_vec({0}, d), 5, 5)); }},
      {op, "act.qmin/qmax", [=] { with_act(ActivationQuant::fixed(f32_vec({0.1f}, d), s32_vec({0}, d), -300, 0)); }},
      {op, "act.scale", [=] { with_act(ActivationQuant::fixed(f32_vec({0.0f}, d), s32_vec({0}, d), -127, 127)); }, true},
      {op, "act.zero_point", [=] { with_act(ActivationQuant::fixed(f32_vec({0.1f}, d), s32_vec({300}, d), 0, 255)); }, true},
      {op, "act.zero_point", [=] { with_act(ActivationQuant::fixed(f32_vec({0.1f}, d), s32_vec({0}, d), 0, 255)); }, true},
  };
  if (cuda_device_count() > 0) {
    const Device o = d.is_cuda() ? Device::cpu() : Device::cuda(0);
    c.push_back({op, "w_q", [=] { call(x, some({6, 4, 3, 3}, o, DType::s8), s); }});
    c.push_back({op, "w_scale", [=] { call(x, w, full({6}, 0.01, on(o))); }});
    c.push_back({op, "bias", [=] { call(x, w, s, some({6}, o)); }});
    // act qparams may live on the host; on another GPU they may not (a CPU x with CUDA qparams).
    if (d.is_cpu())
      c.push_back({op, "act.scale", [=] {
                     with_act(ActivationQuant::fixed(f32_vec({0.1f}, o), s32_vec({0}, Device::cpu()), -127, 127));
                   }});
  }
  return c;
}

}  // namespace

std::vector<OpEntry> quantized_conv_entries() {
  std::vector<OpEntry> e;
  e.push_back(entry({"quantized_conv2d", {2, 3, 6, 5}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1}));
  e.back().bad_inputs = errors;
  e.push_back(entry({"quantized_conv2d stride 2, pad (1, 2), 3x2", {2, 3, 7, 6}, {5, 3, 3, 2}, {2, 2}, {1, 2}, {1, 1}, 1}));
  e.push_back(entry({"quantized_conv2d dilation 2, stride (1, 2), groups 2", {2, 4, 7, 7}, {6, 2, 3, 3}, {1, 2}, {1, 1},
                     {2, 2}, 2}));
  e.push_back(entry({"quantized_conv2d depthwise (2 per channel)", {2, 3, 6, 6}, {6, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 3}));
  e.push_back(entry({"quantized_conv2d 1x1, K = 32", {2, 32, 4, 3}, {7, 32, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1}));
  return e;
}

}  // namespace qgrad::registry
