#include "qgrad/kernels/lerp.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

LerpIndex make_lerp_index(const LerpArgs& args, const Shape& out) {
  LerpIndex li;
  const bool w_same = !args.w.defined() || args.w.shape() == out;
  li.same = args.a.shape() == out && args.b.shape() == out && w_same;
  if (!li.same) {
    li.ab = make_broadcast_index(args.a.shape(), args.b.shape(), out);
    // A scalar weight has no tensor: index it as shape [] (offset 0).
    const Shape ws = args.w.defined() ? args.w.shape() : Shape{};
    li.ww = make_broadcast_index(ws, ws, out);
  }
  return li;
}

void lerp_forward(const LerpArgs& args, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::lerp_forward(args, out));
  else cpu::lerp_forward(args, out);
}
void lerp_backward(const LerpArgs& args, const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dw) {
  if (dy.is_cuda()) QGRAD_ON_CUDA(cuda::lerp_backward(args, dy, da, db, dw));
  else cpu::lerp_backward(args, dy, da, db, dw);
}

}  // namespace qgrad::kernels
