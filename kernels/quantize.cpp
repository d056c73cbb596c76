#include "qgrad/kernels/quantize.h"

#include "qgrad/kernels/dispatch.h"
#include "qgrad/kernels/observer.h"

namespace qgrad::kernels {

namespace {
void run(const QuantLaunch& l) {
  if (l.in.numel() == 0) return;
  if (l.out.is_cuda()) QGRAD_ON_CUDA(cuda::quant_elementwise(l));
  else cpu::quant_elementwise(l);
}
}  // namespace

void fake_quantize(const Tensor& x, const Tensor& y, const QuantParams& p, std::uint32_t* mask, bool relu) {
  run({relu ? QuantKernel::fake_quantize_relu : QuantKernel::fake_quantize, x, y, nullptr, mask, p});
}
void quantize(const Tensor& x, const Tensor& q, const QuantParams& p, std::uint32_t* mask) {
  run({QuantKernel::quantize, x, q, nullptr, mask, p});
}
void dequantize(const Tensor& q, const Tensor& y, const QuantParams& p) {
  run({QuantKernel::dequantize, q, y, nullptr, nullptr, p});
}
void fake_quantize_backward(const Tensor& dy, const Tensor& dx, const std::uint32_t* mask) {
  run({QuantKernel::fake_quantize_backward, dy, dx, mask, nullptr, QuantParams{}});
}
void quantize_backward(const Tensor& dy, const Tensor& dx, const QuantParams& p, const std::uint32_t* mask) {
  run({QuantKernel::quantize_backward, dy, dx, mask, nullptr, p});
}
void dequantize_backward(const Tensor& dy, const Tensor& dq, const QuantParams& p) {
  run({QuantKernel::dequantize_backward, dy, dq, nullptr, nullptr, p});
}

void observe_fake_quantize(const Tensor& x, const Tensor& y, const QuantParams& p, std::uint32_t* mask,
                           const ObserveArgs& obs, bool relu) {
  if (y.is_cuda() && x.numel() > 0) {
    QGRAD_ON_CUDA(cuda::observe_fake_quantize(
        {relu ? QuantKernel::fake_quantize_relu : QuantKernel::fake_quantize, x, y, nullptr, mask, p}, obs));
    return;
  }
  const ObserverQparams q{obs.scale, obs.zero_point, p.qmin, p.qmax, obs.symmetric, obs.symmetric_zero_point};
  observer_minmax(x, obs.run_min, obs.run_max, obs.axis, obs.averaging_constant, &q);
  fake_quantize(x, y, p, mask, relu);
}

void observe_fake_quantize_batch(const std::vector<ObserveLaunch>& items) {
  std::vector<ObserveLaunch> on_cuda;
  for (const ObserveLaunch& it : items) {
    if (it.fq.in.numel() == 0) continue;
    if (it.fq.out.is_cuda()) on_cuda.push_back(it);
    else observe_fake_quantize(it.fq.in, it.fq.out, it.fq.params, it.fq.mask_out, it.obs,
                               it.fq.kernel == QuantKernel::fake_quantize_relu);
  }
  if (!on_cuda.empty()) QGRAD_ON_CUDA(cuda::observe_fake_quantize_batch(on_cuda));
}

void lsq_backward(const LsqArgs& args) {
  if (args.dx.is_cuda()) QGRAD_ON_CUDA(cuda::lsq_backward(args));
  else cpu::lsq_backward(args);
}
void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::lsq_round_zero_point(zp, out, qmin, qmax));
  else cpu::lsq_round_zero_point(zp, out, qmin, qmax);
}

}  // namespace qgrad::kernels
