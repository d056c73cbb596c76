#include "qgrad/kernels/quantize.h"

#include "qgrad/kernels/dispatch.h"
#include "qgrad/kernels/observer.h"

namespace qgrad::kernels {

void affine(const AffineArgs& args) {
  if (args.out.is_cuda()) QGRAD_ON_CUDA(cuda::affine(args));
  else cpu::affine(args);
}
void observe_fake_quant(const AffineArgs& args, const ObserveArgs& obs) {
  if (args.out.is_cuda() && args.in.numel() > 0) {
    QGRAD_ON_CUDA(cuda::observe_fake_quant(args, obs));
    return;
  }
  const ObserverQparams q{obs.scale, obs.zero_point, args.qmin, args.qmax, obs.symmetric, obs.symmetric_zero_point};
  observer_minmax(args.in, obs.run_min, obs.run_max, obs.axis, obs.averaging_constant, &q);
  if (args.in.numel() > 0) affine(args);
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
