// Registry entries: convolution (conv2d in its stride, padding, dilation,
// groups, depthwise, 1x1 and no-bias forms) and its argument errors.
#include <array>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};
using Tensors = std::vector<Tensor>;
using Pair = std::array<std::int64_t, 2>;

// cuDNN's algorithms (implicit GEMM, Winograd, FFT, ... as its heuristic
// picks) and the CPU's im2col + Eigen GEMM sum the same products in another
// order, both in f32 (f64 for f64) and rounded once (a 16-bit output with
// a bias twice on CUDA, as PyTorch's: the convolution, then the bias add):
// the GEMM tolerances of the arithmetic entries, but 1e-4 for f32, since the
// transform algorithms (Winograd, FFT) add rounding errors of their own.
Promise summation_order() {
  return Promise::within(1e-12, 1e-4, 1e-2, 6e-2,
                         "summation order: cuDNN's algorithms (Winograd, FFT, implicit GEMM) vs im2col + Eigen GEMM");
}

struct Config {
  const char* name;
  Shape x, w;
  bool bias;
  Pair stride, padding, dilation;
  std::int64_t groups;
};

OpEntry conv_entry(const Config& c) {
  return {c.name,
          {"conv2d"},
          kFloat,
          [c](Device d, DType dt, Generator& g) {
            Tensors v{normal(c.x, g, d, dt), normal(c.w, g, d, dt)};
            if (c.bias) v.push_back(normal({c.w[0]}, g, d, dt));
            return v;
          },
          [c](const Tensors& v) {
            return Tensors{conv2d(v[0], v[1], c.bias ? v[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups)};
          },
          summation_order(),
          GradMethod::finite_differences,
          {},
          {},
          nullptr};
}

// Every argument error of conv2d: ranks, dtypes, devices, channels and
// groups, kernels larger than the padded input, stride / padding / dilation
// out of range, bias shape.
std::vector<BadInput> conv2d_errors(Device d) {
  constexpr const char* op = "conv2d";
  const Tensor x = some({2, 4, 5, 5}, d), w = some({6, 4, 3, 3}, d), b = some({6}, d), u;
  auto call = [](const Tensor& xx, const Tensor& ww, const Tensor& bb = Tensor(), Pair s = {1, 1}, Pair p = {0, 0},
                 Pair dl = {1, 1}, std::int64_t g = 1) { conv2d(xx, ww, bb, s, p, dl, g); };
  std::vector<BadInput> c{
      // undefined, non-floating, wrong rank
      {op, "x", [=] { call(u, w); }},
      {op, "weight", [=] { call(x, u); }},
      {op, "x", [=] { call(some({2, 4, 5, 5}, d, DType::s32), w); }},
      {op, "weight", [=] { call(x, some({6, 4, 3, 3}, d, DType::s8)); }},
      {op, "bias", [=] { call(x, w, some({6}, d, DType::s32)); }},
      {op, "x", [=] { call(some({4, 5, 5}, d), w); }},
      {op, "x", [=] { call(some({1, 2, 4, 5, 5}, d), w); }},
      {op, "weight", [=] { call(x, some({6, 4, 9}, d)); }},
      {op, "weight", [=] { call(x, some({1, 6, 4, 3, 3}, d)); }},
      // dtypes differ
      {op, "weight", [=] { call(x, some({6, 4, 3, 3}, d, DType::f64)); }},
      {op, "bias", [=] { call(x, w, some({6}, d, DType::f64)); }},
      // bias shape
      {op, "bias", [=] { call(x, w, some({4}, d)); }},
      {op, "bias", [=] { call(x, w, some({1, 6}, d)); }},
      // channels and groups
      {op, "weight", [=] { call(x, some({6, 3, 3, 3}, d)); }},                          // in channels differ
      {op, "weight", [=] { call(x, some({6, 4, 3, 3}, d), b, {1, 1}, {0, 0}, {1, 1}, 2); }},  // C/groups = 2
      {op, "groups", [=] { call(some({2, 3, 5, 5}, d), some({6, 1, 3, 3}, d), b, {1, 1}, {0, 0}, {1, 1}, 2); }},
      {op, "groups", [=] { call(x, some({5, 2, 3, 3}, d), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2); }},
      {op, "groups", [=] { call(x, w, b, {1, 1}, {0, 0}, {1, 1}, 0); }},
      {op, "groups", [=] { call(x, w, b, {1, 1}, {0, 0}, {1, 1}, -2); }},
      // kernels larger than the padded input (the output would be empty)
      {op, "weight", [=] { call(x, some({6, 4, 6, 3}, d)); }},
      {op, "weight", [=] { call(x, some({6, 4, 3, 8}, d), Tensor(), {1, 1}, {0, 1}); }},
      {op, "weight", [=] { call(x, w, b, {1, 1}, {0, 0}, {3, 1}); }},  // dilated span 7 > 5
      // zero-size inputs
      {op, "x", [=] { call(some({2, 4, 0, 5}, d), w, Tensor(), {1, 1}, {2, 2}); }},
      {op, "x", [=] { call(some({2, 0, 5, 5}, d), some({6, 0, 3, 3}, d)); }},
      {op, "weight", [=] { call(x, some({0, 4, 3, 3}, d), Tensor()); }},
      {op, "weight", [=] { call(x, some({6, 4, 0, 3}, d)); }},
      // stride, padding, dilation out of range
      {op, "stride", [=] { call(x, w, b, {0, 1}); }},
      {op, "stride", [=] { call(x, w, b, {1, -1}); }},
      {op, "padding", [=] { call(x, w, b, {1, 1}, {-1, 0}); }},
      {op, "padding", [=] { call(x, w, b, {1, 1}, {0, std::int64_t{1} << 40}); }},
      {op, "dilation", [=] { call(x, w, b, {1, 1}, {0, 0}, {0, 1}); }},
      {op, "dilation", [=] { call(x, w, b, {1, 1}, {0, 0}, {1, -3}); }},
  };
  // Devices differ (with a GPU present).
  if (cuda_device_count() > 0) {
    const Device other = d.is_cuda() ? Device::cpu() : Device::cuda(0);
    c.push_back({op, "weight", [=] { call(x, some({6, 4, 3, 3}, other)); }});
    c.push_back({op, "bias", [=] { call(x, w, some({6}, other)); }});
  }
  return c;
}

}  // namespace

std::vector<OpEntry> conv_entries() {
  std::vector<OpEntry> e;
  e.push_back(conv_entry({"conv2d", {2, 3, 6, 5}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1}));
  e.back().bad_inputs = conv2d_errors;
  e.push_back(conv_entry(
      {"conv2d stride 2, pad (1, 2), 3x2, no bias", {2, 3, 7, 6}, {4, 3, 3, 2}, false, {2, 2}, {1, 2},
       {1, 1}, 1}));
  e.push_back(conv_entry(
      {"conv2d dilation 2, stride (1, 2), groups 2", {2, 4, 7, 7}, {6, 2, 3, 3}, true, {1, 2}, {1, 1}, {2, 2}, 2}));
  e.push_back(conv_entry({"conv2d depthwise (groups = C, 2 per channel)", {2, 3, 6, 6}, {6, 1, 3, 3}, true, {2, 2},
                          {1, 1}, {1, 1}, 3}));
  e.push_back(conv_entry({"conv2d 1x1", {2, 5, 4, 3}, {3, 5, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 1}));
  return e;
}

}  // namespace qgrad::registry
