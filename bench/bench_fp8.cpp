// bench_fp8: the FP8 linear (ops/fp8_linear.h) end to end against a bf16
// cuBLAS GEMM of the same shape, in one run. JSON lines; the "case" keys
// match bench/peer_fp8.py (PyTorch's torch._scaled_mm), run side by side on
// the same machine.
//
//   case fp8_<M>x<N>x<K>   impl qgrad              fp8_linear, bf16 x and out, dynamic per-tensor
//                                                  activation scale (amax + quantize + cuBLASLt FP8 GEMM)
//                          impl qgrad_given_scale  fp8_linear with a given x_scale (quantize + GEMM)
//                          impl qgrad_fp8_gemm     the cuBLASLt FP8 GEMM alone (pre-quantized x)
//                          impl cublas_bf16        cublasGemmEx bf16, f32 accumulate
// TFLOP/s = 2 M N K / time; "vs_cublas_bf16" = bf16 ms / this ms (the issue's
// target: >= 1.5 for qgrad at 8192^3); fp8 fraction against 1979 TFLOP/s
// (H100 SXM dense FP8).
#include <cstdio>
#include <string>
#include <tuple>

#include "bench_common.h"

#if QGRAD_WITH_CUDA
#include <cublas_v2.h>

#include "qgrad/kernels/fp8_linear.h"
#endif

using namespace qgrad;
using namespace qgrad::bench;

namespace {

#if QGRAD_WITH_CUDA
constexpr double kFp8PeakTflops = 1979.0;

void emit_gemm(const char* impl, std::int64_t M, std::int64_t N, std::int64_t K, const Timing& t, double bf16_ms,
               bool fp8) {
  const double tflops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) /
                        (t.median_ms * 1e-3) / 1e12;
  char extra[192] = "";
  if (fp8)
    std::snprintf(extra, sizeof extra, ",\"fp8_peak_fraction\":%.3f,\"vs_cublas_bf16\":%.3f,\"note\":\"%.2fx cublas_bf16\"",
                  tflops / kFp8PeakTflops, bf16_ms / t.median_ms, bf16_ms / t.median_ms);
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"bench\":\"fp8\",\"case\":\"fp8_%lldx%lldx%lld\",\"impl\":\"%s\",\"ms\":%.4f,\"min_ms\":%.4f,"
                "\"tflops\":%.1f%s}",
                static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), impl, t.median_ms,
                t.min_ms, tflops, extra);
  emit(line);
}

void bench_fp8(cublasHandle_t h, std::int64_t M, std::int64_t N, std::int64_t K) {
  Generator g(3);
  const TensorOptions on = TensorOptions{}.with_device(Device::cuda());
  Tensor x = randn({M, K}, g, TensorOptions(on).with_dtype(DType::bf16));
  Tensor w = randn({N, K}, g, on, 0.0, 64.0).to(DType::f8e4m3);
  Tensor sw = full({1}, 0.002, on);
  Tensor sx = full({1}, 0.01, on);
  Tensor wb = randn({N, K}, g, TensorOptions(on).with_dtype(DType::bf16));
  Tensor yb = Tensor::empty({M, N}, TensorOptions(on).with_dtype(DType::bf16));
  const int reps = M * N * K >= (std::int64_t(1) << 36) ? 20 : 50;

  // bf16 reference first (its time is the ratio's numerator): y[M, N] = x wb^T.
  const float one = 1.0f, zero = 0.0f;
  QGRAD_CHECK(cublasSetStream(h, qgrad::cuda::stream(0)) == CUBLAS_STATUS_SUCCESS, "bench", "", "cublasSetStream");
  Timing tb = time_cuda(
      [&](int) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &one,
                     wb.data_ptr(), CUDA_R_16BF, static_cast<int>(K), x.data_ptr(), CUDA_R_16BF, static_cast<int>(K),
                     &zero, yb.data_ptr(), CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      },
      reps, 5);
  emit_gemm("cublas_bf16", M, N, K, tb, tb.median_ms, false);

  Timing td = time_cuda([&](int) { (void)fp8_linear(x, w, sw, Tensor(), DType::bf16); }, reps, 5);
  emit_gemm("qgrad", M, N, K, td, tb.median_ms, true);
  Timing tg = time_cuda([&](int) { (void)fp8_linear(x, w, sw, Tensor(), DType::bf16, sx); }, reps, 5);
  emit_gemm("qgrad_given_scale", M, N, K, tg, tb.median_ms, true);

  // The GEMM alone on pre-quantized activations (K is a multiple of 16: no pad).
  Tensor q = Tensor::empty({M, K}, TensorOptions(on).with_dtype(DType::f8e4m3));
  kernels::fp8_quantize_rows(x, K, sx, false, q, K);
  Tensor y = Tensor::empty({M, N}, TensorOptions(on).with_dtype(DType::bf16));
  Timing tq = time_cuda([&](int) { kernels::fp8_gemm(q, K, K, w, sx, sw, Tensor(), y); }, reps, 5);
  emit_gemm("qgrad_fp8_gemm", M, N, K, tq, tb.median_ms, true);
}
#endif

}  // namespace

int main() {
#if QGRAD_WITH_CUDA
  if (!cuda_available()) {
    std::printf("{\"bench\":\"fp8\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  if (cuda_compute_capability(0) < 89) {
    std::printf("{\"bench\":\"fp8\",\"skipped\":\"no FP8 tensor cores (compute capability < 8.9)\"}\n");
    return 0;
  }
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  for (auto [M, N, K] : {std::tuple{8192, 8192, 8192}, std::tuple{4096, 4096, 4096}}) bench_fp8(h, M, N, K);
  cublasDestroy(h);
#else
  std::printf("{\"bench\":\"fp8\",\"skipped\":\"built without CUDA\"}\n");
#endif
  return 0;
}
