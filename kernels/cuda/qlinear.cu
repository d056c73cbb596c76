// CUDA W8A8 linear: the int8 GEMM on the tensor cores through cuBLASLt
// (lt_gemm.cuh) into an int32 [M, ldc] buffer, then one epilogue kernel that
// reads it once and writes the output (formulas/qlinear.h).
//
// Why not cuBLASLt's own epilogue: its per-row alpha vector
// (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO) covers only the
// output-channel scale sw[n]; the per-token scale sa[m] would still need a
// pass over the output, and cuBLASLt's float rounding of acc * alpha is not
// specified, so the CPU could not reproduce it bit for bit. Bytes moved by
// the epilogue: 4 M N (int32 read) + sizeof(out) M N (write) + 4 N + 4 M.
// Shapes cuBLASLt does not take (it has no algorithm, or the status is not
// success) run a SIMT dp4a fallback GEMM with the same int32 result.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/lt_gemm.cuh"
#include "kernels/formulas/qlinear.h"
#include "kernels/qlinear.h"

namespace qgrad::kernels::cuda {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Exact int32 fallback: one thread per output, 4 int8 lanes per dp4a (K is a
// multiple of 16 and rows are 16-byte aligned).
__global__ void fallback_gemm_kernel(const std::int8_t* __restrict__ a, std::int64_t lda,
                                     const std::int8_t* __restrict__ w, std::int64_t ldw, std::int32_t* __restrict__ c,
                                     std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K) {
  const std::int64_t total = M * N;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t m = i / N, n = i % N;
    const int* ar = reinterpret_cast<const int*>(a + m * lda);
    const int* wr = reinterpret_cast<const int*>(w + n * ldw);
    int acc = 0;
    for (std::int64_t k = 0; k < K / 4; ++k) acc = __dp4a(ar[k], wr[k], acc);
    c[m * ldc + n] = acc;
  }
}

template <class T>
void epilogue_impl(const Tensor& c, std::int64_t ldc, const QLinearEpilogue& ep, const Tensor& out) {
  using M = op_math_t<T>;
  const std::int64_t N = out.shape()[1];
  const std::int32_t* cp = static_cast<const std::int32_t*>(c.data_ptr());
  const float* sw = static_cast<const float*>(ep.sw.data_ptr());
  const M* bias = ep.bias.defined() ? static_cast<const M*>(ep.bias.data_ptr()) : nullptr;
  const bool sa_dev = ep.sa.is_cuda();
  const float* sa32 = sa_dev && ep.sa.dtype() == DType::f32 ? static_cast<const float*>(ep.sa.data_ptr()) : nullptr;
  const double* sa64 = sa_dev && ep.sa.dtype() == DType::f64 ? static_cast<const double*>(ep.sa.data_ptr()) : nullptr;
  // A host scalar (static scale kept on the host): read here.
  const double sa_host_d = sa_dev ? 0.0 : (ep.sa.dtype() == DType::f64 ? static_cast<const double*>(ep.sa.data_ptr())[0]
                                                                       : static_cast<const float*>(ep.sa.data_ptr())[0]);
  const bool host_is_f64 = !sa_dev && ep.sa.dtype() == DType::f64;
  const std::int64_t stride = ep.per_row ? 1 : 0;
  T* o = static_cast<T*>(out.data_ptr());
  launch_elementwise(out.device().index, out.numel(), [=] __device__(std::int64_t i) {
    const std::int64_t m = i / N, n = i % N;
    M sa;
    if (sa32) sa = M(sa32[m * stride]);
    else if (sa64) sa = M(sa64[m * stride]);
    else sa = host_is_f64 ? M(sa_host_d) : M(static_cast<float>(sa_host_d));
    o[i] = T(formulas::qlinear_epilogue<M>(cp[m * ldc + n], sa, M(sw[n]), bias ? bias[n] : M(0), bias != nullptr));
  });
}

}  // namespace

void qlinear(const Tensor& a, std::int64_t lda, std::int64_t K, const Tensor& w, const QLinearEpilogue& ep,
             const Tensor& out) {
  const Device dev = out.device();
  const int d = dev.index;
  const std::int64_t M = out.shape()[0], N = out.shape()[1];
  const TensorOptions on = TensorOptions{}.with_device(dev);
  // Weight rows padded to lda (a multiple of 16) and 16-byte aligned.
  Tensor wpad = w;
  std::int64_t ldw = K;
  if (K != lda || !aligned16(w.data_ptr())) {
    wpad = Tensor::empty({N, lda}, TensorOptions(on).with_dtype(DType::s8));
    const std::int8_t* src = static_cast<const std::int8_t*>(w.data_ptr());
    std::int8_t* dst = static_cast<std::int8_t*>(wpad.data_ptr());
    launch_elementwise(d, N * lda, [=] __device__(std::int64_t i) {
      const std::int64_t n = i / lda, k = i % lda;
      dst[i] = k < K ? src[n * K + k] : std::int8_t(0);
    });
    ldw = lda;
  }
  const std::int64_t ldc = (N + 3) / 4 * 4;
  Tensor c = Tensor::empty({M, ldc}, TensorOptions(on).with_dtype(DType::s32));
  Tensor ws = Tensor::empty({static_cast<std::int64_t>(kLtWorkspaceBytes)}, TensorOptions(on).with_dtype(DType::u8));
  const auto* ap = static_cast<const std::int8_t*>(a.data_ptr());
  const auto* wp = static_cast<const std::int8_t*>(wpad.data_ptr());
  auto* cp = static_cast<std::int32_t*>(c.data_ptr());
  if (!lt_int8_gemm(d, ap, lda, wp, ldw, cp, ldc, M, N, lda, ws.data_ptr(), kLtWorkspaceBytes)) {
    constexpr unsigned threads = 256;
    fallback_gemm_kernel<<<::qgrad::cuda::blocks_for(M * N, threads), threads, 0, ::qgrad::cuda::stream(d)>>>(
        ap, lda, wp, ldw, cp, ldc, M, N, lda);
    QGRAD_LAUNCH_CHECK();
  }
  dispatch_floating(out.dtype(), "quantized_linear",
                    [&](auto tag) { epilogue_impl<typename decltype(tag)::type>(c, ldc, ep, out); });
}

}  // namespace qgrad::kernels::cuda
