// relu, one source for both devices (kernels/loop.h). The forward on CUDA
// writes its mask with map_elements_masked's warp ballots; the CPU writes the
// values in one vectorised loop and then the mask a word at a time.
#include "qgrad/kernels/activation.h"

#include <type_traits>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cpu/masked_grad.h"
#include "qgrad/kernels/formulas/activation.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels {

namespace {

template <class T>
struct Relu {
  const T* x;
  T* y;
  QGRAD_HD void operator()(std::int64_t i) const {
    using M = op_math_t<T>;
    y[i] = T(formulas::relu(M(x[i])));
  }
};

// map_elements_masked's body: the value and its x > 0 bit.
template <class T>
struct ReluBit {
  QGRAD_HD T operator()(std::int64_t, T x, bool& bit) const {
    using M = op_math_t<T>;
    bit = formulas::relu_mask(M(x));
    return T(formulas::relu(M(x)));
  }
};

// map_elements' body: dy where the saved bit is set, else +0.
template <class T>
struct ReluBackward {
  const std::uint32_t* words;
  QGRAD_HD T operator()(std::int64_t i, T g) const { return bitmask_get(words, i) ? g : T(op_math_t<T>(0)); }
};

}  // namespace

void relu(const Tensor& in, const Tensor& out, const Tensor& mask) {
  dispatch_floating(out.dtype(), "relu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.data_ptr());
    const std::int64_t n = out.numel();
    if (out.is_cuda()) {
      map_elements_masked(out.device(), n, x, static_cast<T*>(out.data_ptr()),
                          mask.defined() ? static_cast<std::uint32_t*>(mask.data_ptr()) : nullptr, ReluBit<T>{},
                          "relu");
      return;
    }
    for_each_index(out.device(), n, Relu<T>{x, static_cast<T*>(out.data_ptr())}, "relu");
    if (!mask.defined()) return;
    // CPU only (CUDA took the kernel above): one mask word per index.
    auto* words = static_cast<std::uint32_t*>(mask.data_ptr());
    cpu::parallel_for(bitmask_words(n), [&](std::int64_t w) {
      words[w] = bitmask_pack_word(w, n, [&](std::int64_t i) { return formulas::relu_mask(op_math_t<T>(x[i])); });
    });
  });
}

void relu_backward(const Tensor& g, const Tensor& mask, const Tensor& dx) {
  dispatch_floating(dx.dtype(), "relu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) {
      if (!dx.is_cuda()) {  // the CPU's f32: a mask block at a time (kernels/cpu/masked_grad.h), the same bits
        cpu::masked_grad_f32(cpu::MaskedGrad::select, static_cast<const float*>(g.data_ptr()),
                             static_cast<const std::uint32_t*>(mask.data_ptr()), static_cast<float*>(dx.data_ptr()),
                             dx.numel());
        return;
      }
    }
    map_elements(dx.device(), dx.numel(), static_cast<const T*>(g.data_ptr()), static_cast<T*>(dx.data_ptr()),
                 ReluBackward<T>{static_cast<const std::uint32_t*>(mask.data_ptr())}, "relu_backward");
  });
}

}  // namespace qgrad::kernels
