// bench_conv: conv2d forward and backward (cuDNN through qgrad) and the int8
// quantized_conv2d (quantized im2col + cuBLASLt int8 GEMM + epilogue) at the
// ResNet-18 stage shape, the Fashion-MNIST CNN's two convolutions and a
// MobileNetV2 depthwise convolution (float rows only). JSON
// lines; the "case" keys match bench/peer_conv.py (PyTorch F.conv2d on cuDNN),
// run side by side on the same machine.
//
//   case conv2d_fwd_<shape>_<dtype>   impl qgrad: conv2d(x, w, b) (f32: FMA math, no TF32; bf16: tensor cores)
//   case conv2d_dx_<shape>_<dtype>    impl qgrad: the input gradient alone (cuDNN backward data, or the
//                                     direct kernel for groups of <= 4 input channels, conv_direct.cu)
//   case conv2d_dw_<shape>_<dtype>    impl qgrad: the weight gradient alone (cuDNN backward filter, or
//                                     the direct kernel as above)
//                                     (f32 also impl qgrad_tf32: the three with set_conv_allow_tf32)
//   case qconv2d_<shape>              impl qgrad: quantized_conv2d, f32 x in, f32 out (static qparams on
//                                     the host), impl qgrad_conv2d_f32 / qgrad_conv2d_bf16: the float
//                                     forward of the same shape, for comparison in one place
// <shape> = <N>x<C>x<H>x<W>_o<O>_k3[_g<groups>]: 3x3, stride 1, padding 1.
// TFLOP/s (TOPS for int8) = 2 N O OH OW (C / groups) kh kw / time.
#include <cstdio>
#include <string>

#include "bench_common.h"
#include "qgrad/kernels/conv.h"

using namespace qgrad;
using namespace qgrad::bench;

namespace {

#if QGRAD_WITH_CUDA
struct Shape4 {
  std::int64_t n, c, h, w, o, groups = 1;
  std::string tag() const {
    return std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w) + "_o" +
           std::to_string(o) + "_k3" + (groups > 1 ? "_g" + std::to_string(groups) : "");
  }
  double flops() const { return 2.0 * double(n) * double(o) * double(h) * double(w) * double(c / groups) * 9.0; }
};

void emit_row(const std::string& c, const char* impl, const Timing& t, double flops, bool int8) {
  char line[512];
  std::snprintf(line, sizeof line, "{\"bench\":\"conv\",\"case\":\"%s\",\"impl\":\"%s\",\"ms\":%.4f,\"min_ms\":%.4f,\"%s\":%.2f}",
                c.c_str(), impl, t.median_ms, t.min_ms, int8 ? "tops" : "tflops", flops / (t.median_ms * 1e-3) / 1e12);
  emit(line);
}

int reps_for(double flops) { return flops > 1e11 ? 20 : 50; }

void bench_shape(const Shape4& sh) {
  Generator g(3);
  const TensorOptions on = TensorOptions{}.with_device(Device::cuda());
  kernels::Conv2dShape s;
  s.n = sh.n, s.c = sh.c, s.h = sh.h, s.w = sh.w, s.o = sh.o, s.kh = 3, s.kw = 3, s.oh = sh.h, s.ow = sh.w;
  s.ph = 1, s.pw = 1, s.groups = sh.groups;
  const std::int64_t cg = sh.c / sh.groups;
  const int reps = reps_for(sh.flops());
  Timing float_fwd[2];
  int which = 0;
  for (DType dt : {DType::f32, DType::bf16}) {
    const TensorOptions od = TensorOptions(on).with_dtype(dt);
    Tensor x = randn({sh.n, sh.c, sh.h, sh.w}, g, od), w = randn({sh.o, cg, 3, 3}, g, od, 0.0, 0.1);
    Tensor b = randn({sh.o}, g, od), dy = randn({sh.n, sh.o, sh.h, sh.w}, g, od);
    Tensor dx = empty_like(x), dw = empty_like(w);
    const std::string d = dtype_name(dt);
    const auto forward = [&](int) { (void)conv2d(x, w, b, {1, 1}, {1, 1}, {1, 1}, sh.groups); };
    Timing tf = time_cuda(forward, reps, 5);
    float_fwd[which++] = tf;
    emit_row("conv2d_fwd_" + sh.tag() + "_" + d, "qgrad", tf, sh.flops(), false);
    emit_row("conv2d_dx_" + sh.tag() + "_" + d, "qgrad",
             time_cuda([&](int) { kernels::conv2d_backward_input(s, dy, w, dx); }, reps, 5), sh.flops(), false);
    emit_row("conv2d_dw_" + sh.tag() + "_" + d, "qgrad",
             time_cuda([&](int) { kernels::conv2d_backward_weight(s, x, dy, dw); }, reps, 5), sh.flops(), false);
    if (dt == DType::f32) {  // TF32 allowed (set_conv_allow_tf32), as the peer's torch_tf32 rows
      set_conv_allow_tf32(true);
      kernels::Conv2dShape t = s;
      t.allow_tf32 = true;
      emit_row("conv2d_fwd_" + sh.tag() + "_" + d, "qgrad_tf32", time_cuda(forward, reps, 5), sh.flops(), false);
      emit_row("conv2d_dx_" + sh.tag() + "_" + d, "qgrad_tf32",
               time_cuda([&](int) { kernels::conv2d_backward_input(t, dy, w, dx); }, reps, 5), sh.flops(), false);
      emit_row("conv2d_dw_" + sh.tag() + "_" + d, "qgrad_tf32",
               time_cuda([&](int) { kernels::conv2d_backward_weight(t, x, dy, dw); }, reps, 5), sh.flops(), false);
      set_conv_allow_tf32(false);
    }
  }
  if (sh.groups > 1) return;  // the int8 rows: groups of 1
  Tensor x = randn({sh.n, sh.c, sh.h, sh.w}, g, on);
  Tensor wq = randint(-127, 128, {sh.o, sh.c, 3, 3}, g, TensorOptions(on).with_dtype(DType::s8));
  Tensor sw = rand({sh.o}, g, on, 0.001, 0.01), b = randn({sh.o}, g, on);
  const ActivationQuant act = ActivationQuant::fixed(Tensor::from_vector(std::vector<float>{0.05f}, {1}),
                                                     Tensor::from_vector(std::vector<std::int32_t>{0}, {1}), -127, 127);
  const std::string c = "qconv2d_" + sh.tag();
  emit_row(c, "qgrad", time_cuda([&](int) { (void)quantized_conv2d(x, wq, sw, b, act, {1, 1}, {1, 1}); }, reps, 5),
           sh.flops(), true);
  emit_row(c, "qgrad_conv2d_f32", float_fwd[0], sh.flops(), false);
  emit_row(c, "qgrad_conv2d_bf16", float_fwd[1], sh.flops(), false);
}
#endif

}  // namespace

int main() {
#if QGRAD_WITH_CUDA
  if (!cuda_available()) {
    std::printf("{\"bench\":\"conv\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  bench_shape({64, 64, 56, 56, 64});   // ResNet-18 stage (conv2_x)
  bench_shape({256, 1, 28, 28, 32});   // Fashion-MNIST CNN, first convolution
  bench_shape({256, 32, 14, 14, 64});  // Fashion-MNIST CNN, second convolution
  bench_shape({64, 96, 56, 56, 96, 96});  // MobileNetV2, depthwise 3x3 of a 56x56 block
#else
  std::printf("{\"bench\":\"conv\",\"skipped\":\"built without CUDA\"}\n");
#endif
  return 0;
}
