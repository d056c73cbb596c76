// lerp, one source for both devices (kernels/loop.h); on CUDA the vectorised
// same-shape kernels of kernels/cuda/lerp.cu come first.
#include "qgrad/kernels/lerp.h"

#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/loop.h"

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

namespace {

template <class T>
struct LerpForward {
  LerpElems<T> e;
  LerpIndex li;
  T* o;
  QGRAD_HD void operator()(std::int64_t i) const {
    std::int64_t ia, ib, iw;
    li.offsets(i, ia, ib, iw);
    o[i] = e.forward(ia, ib, iw);
  }
};

template <class T>
struct LerpBackward {
  LerpElems<T> e;
  LerpIndex li;
  LerpGradOut<T> go;
  QGRAD_HD void operator()(std::int64_t i) const {
    std::int64_t ia, ib, iw;
    li.offsets(i, ia, ib, iw);
    go.write(e, i, ia, ib, iw);
  }
};

}  // namespace

void lerp_forward(const LerpArgs& args, const Tensor& out) {
  if (out.is_cuda()) {
    bool done = false;
    QGRAD_ON_CUDA(done = cuda::lerp_forward_vec(args, out));
    if (done) return;
  }
  dispatch_floating(out.dtype(), "lerp", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(out.device(), out.numel(),
                   LerpForward<T>{make_lerp_elems<T>(args), make_lerp_index(args, out.shape()),
                                  static_cast<T*>(out.data_ptr())},
                   "lerp");
  });
}

void lerp_backward(const LerpArgs& args, const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dw) {
  if (dy.is_cuda()) {
    bool done = false;
    QGRAD_ON_CUDA(done = cuda::lerp_backward_vec(args, dy, da, db, dw));
    if (done) return;
  }
  dispatch_floating(dy.dtype(), "lerp_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_index(dy.device(), dy.numel(),
                   LerpBackward<T>{make_lerp_elems<T>(args), make_lerp_index(args, dy.shape()),
                                   make_lerp_grad_out<T>(dy, da, db, dw)},
                   "lerp_backward");
  });
}

}  // namespace qgrad::kernels
