#include "qgrad/kernels/activation.h"

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/formulas/activation.h"

namespace qgrad::kernels::cpu {

void relu(const Tensor& in, const Tensor& out, const Tensor& mask) {
  dispatch_floating(out.dtype(), "relu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    const std::int64_t n = out.numel();
    parallel_for(n, [&](std::int64_t i) { y[i] = T(formulas::relu(M(x[i]))); });
    if (!mask.defined()) return;
    auto* words = static_cast<std::uint32_t*>(mask.data_ptr());
    parallel_for(bitmask_words(n), [&](std::int64_t w) {
      words[w] = bitmask_pack_word(w, n, [&](std::int64_t i) { return formulas::relu_mask(M(x[i])); });
    });
  });
}

void relu_backward(const Tensor& g, const Tensor& mask, const Tensor& dx) {
  dispatch_floating(dx.dtype(), "relu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = op_math_t<T>;
    const T* pg = static_cast<const T*>(g.data_ptr());
    const auto* words = static_cast<const std::uint32_t*>(mask.data_ptr());
    T* d = static_cast<T*>(dx.data_ptr());
    parallel_for(dx.numel(), [&](std::int64_t i) { d[i] = bitmask_get(words, i) ? pg[i] : T(M(0)); });
  });
}

}  // namespace qgrad::kernels::cpu
