// relu: validation, forward, saved state (a bit mask) and backward.
#include "qgrad/ops/activation.h"

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/activation.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/ops/check.h"

namespace qgrad {

// Backward: dx = dy where x > 0, else 0. Saves the mask bits only.
Tensor relu(const Tensor& x) {
  constexpr const char* op = "relu";
  check::floating(x, op, "x");
  const bool grad = any_requires_grad({x});
  Tensor out = Tensor::empty(x.shape(), TensorOptions{}.with_dtype(x.dtype()).with_device(x.device()));
  Tensor mask;
  if (grad)
    mask = Tensor::empty({bitmask_words(x.numel())}, TensorOptions{}.with_dtype(DType::s32).with_device(x.device()));
  kernels::relu(x, out, mask);
  if (grad) {
    record(
        op, out, {x},
        [mask](const Tensor& g) {
          Tensor dx = Tensor::empty(g.shape(), TensorOptions{}.with_dtype(g.dtype()).with_device(g.device()));
          kernels::relu_backward(g, mask, dx);
          return std::vector<Tensor>{dx};
        },
        mask.nbytes());
  }
  return out;
}

}  // namespace qgrad
