// CPU kernels of lerp (formulas: kernels/formulas/lerp.h).
#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/lerp.h"

namespace qgrad::kernels::cpu {

void lerp_forward(const LerpArgs& args, const Tensor& out) {
  dispatch_floating(out.dtype(), "lerp", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const LerpElems<T> e = make_lerp_elems<T>(args);
    const LerpIndex li = make_lerp_index(args, out.shape());
    T* o = static_cast<T*>(out.data_ptr());
    parallel_for(out.numel(), [&](std::int64_t i) {
      std::int64_t ia, ib, iw;
      li.offsets(i, ia, ib, iw);
      o[i] = e.forward(ia, ib, iw);
    });
  });
}

void lerp_backward(const LerpArgs& args, const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dw) {
  dispatch_floating(dy.dtype(), "lerp_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const LerpElems<T> e = make_lerp_elems<T>(args);
    const LerpIndex li = make_lerp_index(args, dy.shape());
    const LerpGradOut<T> go = make_lerp_grad_out<T>(dy, da, db, dw);
    parallel_for(dy.numel(), [&](std::int64_t i) {
      std::int64_t ia, ib, iw;
      li.offsets(i, ia, ib, iw);
      go.write(e, i, ia, ib, iw);
    });
  });
}

}  // namespace qgrad::kernels::cpu
