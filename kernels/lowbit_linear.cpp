#include "qgrad/kernels/lowbit_linear.h"

#include "qgrad/kernels/dispatch.h"

namespace qgrad::kernels {

void w4a16_linear(const Tensor& x, const Tensor& w, const Tensor& scale, const Tensor& zp, std::int64_t group,
                  const Tensor& bias, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::w4a16_linear(x, w, scale, zp, group, bias, out));
  else cpu::w4a16_linear(x, w, scale, zp, group, bias, out);
}

void w4a16_frag_pack(const Tensor& w, const Tensor& frag) {
  if (frag.is_cuda()) QGRAD_ON_CUDA(cuda::w4a16_frag_pack(w, frag));
  else cpu::w4a16_frag_pack(w, frag);
}

void w4a16_frag_unpack(const Tensor& frag, const Tensor& w) {
  if (w.is_cuda()) QGRAD_ON_CUDA(cuda::w4a16_frag_unpack(frag, w));
  else cpu::w4a16_frag_unpack(frag, w);
}

// (The arguments go unused in a build without CUDA.)
bool w4a16_linear_frag([[maybe_unused]] const Tensor& x, [[maybe_unused]] const Tensor& frag,
                       [[maybe_unused]] const Tensor& scale, [[maybe_unused]] const Tensor& zp,
                       [[maybe_unused]] std::int64_t group, [[maybe_unused]] const Tensor& bias, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(return cuda::w4a16_linear_frag(x, frag, scale, zp, group, bias, out));
  return false;  // the CPU kernel reads the plain order
}

void w4a8_linear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& sa, const Tensor& za,
                 const Tensor& w, const Tensor& sw, std::int64_t group, const Tensor& bias, const Tensor& out) {
  if (out.is_cuda()) QGRAD_ON_CUDA(cuda::w4a8_linear(a, lda, K, sa, za, w, sw, group, bias, out));
  else cpu::w4a8_linear(a, lda, K, sa, za, w, sw, group, bias, out);
}

void int4_widen(const Tensor& w, const Tensor& w8) {
  if (w8.is_cuda()) QGRAD_ON_CUDA(cuda::int4_widen(w, w8));
  else cpu::int4_widen(w, w8);
}

}  // namespace qgrad::kernels
