// CPU kernels of lerp (formulas: kernels/formulas/lerp.h).
#include "kernels/cpu/parallel.h"
#include "kernels/lerp.h"

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
    const T* g = static_cast<const T*>(dy.data_ptr());
    T* pa = data_or_null<T>(da);
    T* pb = data_or_null<T>(db);
    T* pw = data_or_null<T>(dw);
    parallel_for(dy.numel(), [&](std::int64_t i) {
      std::int64_t ia, ib, iw;
      li.offsets(i, ia, ib, iw);
      if (pa) pa[i] = e.grad_a(g[i], iw);
      if (pb) pb[i] = e.grad_b(g[i], iw);
      if (pw) pw[i] = e.grad_w(g[i], ia, ib);
    });
  });
}

}  // namespace qgrad::kernels::cpu
