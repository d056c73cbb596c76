// Benchmarks of the quantization ops and lerp on CUDA: median device time,
// GB/s (bytes each kernel must read + write), and the fraction of the
// device-to-device copy bandwidth measured in the same run. Inputs are
// random (never zeros). JSON lines on stdout; bench/peer_quant.py measures
// PyTorch under the same "case" keys.
//
// Targets (issue 3): per-tensor and per-channel fake quantize forward and
// the lerp backward >= 90% of copy bandwidth on 256M-element f32 tensors;
// per-channel fake quantize >= 3x torch.fake_quantize_per_channel_affine.
#include <cstdio>
#include <string>

#include "qgrad/autograd/node.h"
#include "bench_common.h"

using namespace qgrad;
using namespace qgrad::bench;

namespace {

constexpr std::int64_t kRows = 4096, kCols = 65536, kN = kRows * kCols;  // 256M elements

struct Ctx {
  double copy_gbs = 0;
  std::string device;
};

void report(const Ctx& ctx, const std::string& name, const Timing& t, double bytes) {
  const double gbs = bytes / (t.median_ms * 1e-3) / 1e9;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"bench\":\"quant\",\"impl\":\"qgrad\",\"case\":\"%s\",\"n\":%lld,\"ms\":%.4f,\"min_ms\":%.4f,"
                "\"gbs\":%.1f,\"copy_gbs\":%.1f,\"frac_copy\":%.3f,\"device\":\"%s\"}",
                name.c_str(), static_cast<long long>(kN), t.median_ms, t.min_ms, gbs, ctx.copy_gbs,
                gbs / ctx.copy_gbs, ctx.device.c_str());
  emit(buf);
}

TensorOptions on_gpu(DType dt = DType::f32) { return TensorOptions{}.with_dtype(dt).with_device(Device::cuda()); }

}  // namespace

int main() {
  if (!cuda_available()) {
    std::printf("bench_quant: no CUDA device present; nothing measured\n");
    return 0;
  }
  Ctx ctx;
  ctx.device = cuda_device_name(0);
  ctx.copy_gbs = copy_bandwidth_gbs(static_cast<std::size_t>(kN) * 4);
  const double n = static_cast<double>(kN), f4 = 4.0 * n, mask = n / 8.0;
  Generator gen(0xbe);
  Tensor x = randn({kRows, kCols}, gen, on_gpu(), 0.0, 2.0);
  Tensor dy = randn({kRows, kCols}, gen, on_gpu());
  Tensor scale_c = rand({kRows}, gen, on_gpu(), 0.01, 0.05);
  Tensor zp_c = randint(-10, 10, {kRows}, gen, on_gpu(DType::s32));
  {
    NoGradGuard ng;
    report(ctx, "fq_per_tensor_fw", time_cuda([&](int) { fake_quantize_per_tensor(x, 0.02, 3, -128, 127); }), 2 * f4);
    Tensor st = full({1}, 0.02, on_gpu()), zt = full({1}, 3, on_gpu(DType::s32));
    report(ctx, "fq_per_tensor_fw_device_qparams",
           time_cuda([&](int) { fake_quantize_per_tensor(x, st, zt, -128, 127); }), 2 * f4);
    report(ctx, "fq_per_channel_fw",
           time_cuda([&](int) { fake_quantize_per_channel(x, scale_c, zp_c, 0, -128, 127); }), 2 * f4);
    report(ctx, "quantize_per_tensor", time_cuda([&](int) { quantize_per_tensor(x, 0.02, 3, DType::s8); }), f4 + n);
    Tensor q = quantize_per_tensor(x, 0.02, 3, DType::s8);
    report(ctx, "dequantize_per_tensor", time_cuda([&](int) { dequantize_per_tensor(q, 0.02, 3); }), n + f4);
  }
  Tensor xl = x.detach();
  xl.set_requires_grad(true);
  // forward + backward through the tape: fw writes y and the bit mask, bw
  // reads dy and the mask and writes dx.
  report(ctx, "fq_per_tensor_fwbw", time_cuda([&](int) {
           Tensor y = fake_quantize_per_tensor(xl, 0.02, 3, -128, 127);
           y.grad_fn()->backward(dy);
         }, 20, 3),
         2 * f4 + mask + 2 * f4 + mask);
  report(ctx, "fq_per_channel_fwbw", time_cuda([&](int) {
           Tensor y = fake_quantize_per_channel(xl, scale_c, zp_c, 0, -128, 127);
           y.grad_fn()->backward(dy);
         }, 20, 3),
         2 * f4 + mask + 2 * f4 + mask);
  {
    Tensor s = full({kRows}, 0.02, on_gpu()), z = full({kRows}, 1.0, on_gpu());
    s.set_requires_grad(true);
    z.set_requires_grad(true);
    Tensor y = fake_quantize_learnable_per_channel(xl, s, z, 0, -128, 127);
    report(ctx, "lsq_per_channel_bw", time_cuda([&](int) { y.grad_fn()->backward(dy); }, 20, 3), 3 * f4);
    Tensor s1 = full({1}, 0.02, on_gpu()), z1 = full({1}, 1.0, on_gpu());
    s1.set_requires_grad(true);
    Tensor y1 = fake_quantize_learnable_per_tensor(xl, s1, z1, -128, 127);
    report(ctx, "lsq_per_tensor_bw", time_cuda([&](int) { y1.grad_fn()->backward(dy); }, 20, 3), 3 * f4);
  }
  {
    Tensor ql = quantize_per_channel(xl, scale_c, zp_c, 0, DType::s8);  // carries a graph
    Tensor y = dequantize_per_channel(ql, scale_c, zp_c, 0);
    report(ctx, "dequantize_per_channel_bw", time_cuda([&](int) { y.grad_fn()->backward(dy); }), 2 * f4);
  }
  {
    Tensor a = randn({kRows, kCols}, gen, on_gpu()), b = randn({kRows, kCols}, gen, on_gpu());
    {
      NoGradGuard ng;
      report(ctx, "lerp_fw", time_cuda([&](int) { lerp(a, b, 0.3); }), 3 * f4);
      Tensor w = rand({kRows, kCols}, gen, on_gpu());
      report(ctx, "lerp_fw_tensor_weight", time_cuda([&](int) { lerp(a, b, w); }), 4 * f4);
    }
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    Tensor y = lerp(a, b, 0.3);
    report(ctx, "lerp_bw", time_cuda([&](int) { y.grad_fn()->backward(dy); }), 3 * f4);
  }
  return 0;
}
