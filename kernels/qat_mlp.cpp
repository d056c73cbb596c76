#include "qgrad/kernels/qat_mlp.h"

#include "qgrad/kernels/dispatch.h"
#if QGRAD_WITH_CUDA
#include "qgrad/kernels/cuda/entries.h"
#endif

namespace qgrad::kernels {

bool qat_mlp_available(int device) {
#if QGRAD_WITH_CUDA
  return cuda::qat_mlp_available(device);
#else
  (void)device;
  return false;
#endif
}

bool qat_mlp_plan(QatMlpArgs& a) {
#if QGRAD_WITH_CUDA
  return cuda::qat_mlp_plan(a);
#else
  (void)a;
  return false;
#endif
}

void qat_mlp_forward_backward([[maybe_unused]] const QatMlpArgs& a) { QGRAD_ON_CUDA(cuda::qat_mlp_forward_backward(a)); }

}  // namespace qgrad::kernels
