// bench_w8a8: per-token dynamic quantization bandwidth and the W8A8 linear
// (activation quantization + int8 tensor-core GEMM + epilogue) against a bf16
// cuBLAS GEMM of the same shape, in one run. JSON lines; the "case" keys
// match bench/peer_w8a8.py (PyTorch), run side by side on the same machine.
//
//   case dynquant_token_<N>x<D>        qgrad per-token symmetric s8 of f32 x (the library's kernel;
//                                     its variants: dev/cuda/dynamic_quant_token.cu)
//   case w8a8_<M>x<N>x<K>             impl qgrad (end to end, bf16 in/out),
//                                     impl qgrad_act_quant (its per-token activation quantization only),
//                                     impl qgrad_int8_gemm (cuBLASLt s8 GEMM only),
//                                     impl cublas_bf16 (cublasGemmEx bf16, f32 accumulate)
// TOPS = 2 M N K / time; int8 fraction against 1979 TOPS (H100 SXM dense).
// bench_w8a8 [substring]: only the cases whose name contains it.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_common.h"
#include "qgrad/kernels/dynamic_quant.h"

#if QGRAD_WITH_CUDA
#include <cublas_v2.h>

#include "qgrad/kernels/cuda/lt_gemm.cuh"
#endif

using namespace qgrad;
using namespace qgrad::bench;

namespace {

#if QGRAD_WITH_CUDA
constexpr double kInt8PeakTops = 1979.0;

void emit_dynquant(const char* impl, std::int64_t N, std::int64_t D, const Timing& t, double copy_gbs) {
  const double bytes = static_cast<double>(N * D) * (4 + 1) + static_cast<double>(N) * 8;
  const double gbs = bytes / (t.median_ms * 1e-3) / 1e9;
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"bench\":\"w8a8\",\"case\":\"dynquant_token_%lldx%lld\",\"impl\":\"%s\",\"ms\":%.4f,"
                "\"min_ms\":%.4f,\"gbs\":%.1f,\"copy_gbs\":%.1f,\"copy_fraction\":%.3f}",
                static_cast<long long>(N), static_cast<long long>(D), impl, t.median_ms, t.min_ms, gbs, copy_gbs,
                gbs / copy_gbs);
  emit(line);
}

void bench_dynquant(std::int64_t N, std::int64_t D, double copy_gbs) {
  Generator g(1);
  Tensor x = randn({N, D}, g, TensorOptions{}.with_device(Device::cuda()));
  auto run = [&](int) { (void)dynamic_range_quantize(x, QuantScope::per_token()); };
  emit_dynquant("qgrad", N, D, time_cuda(run, 30, 3), copy_gbs);
}

void emit_gemm(const char* impl, std::int64_t M, std::int64_t N, std::int64_t K, const Timing& t, bool int8) {
  const double tops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) /
                      (t.median_ms * 1e-3) / 1e12;
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"bench\":\"w8a8\",\"case\":\"w8a8_%lldx%lldx%lld\",\"impl\":\"%s\",\"ms\":%.4f,\"tops\":%.1f%s}",
                static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), impl, t.median_ms, tops,
                int8 ? (",\"int8_peak_fraction\":" + std::to_string(tops / kInt8PeakTops)).c_str() : "");
  emit(line);
}

void bench_w8a8(cublasHandle_t h, std::int64_t M, std::int64_t N, std::int64_t K) {
  Generator g(2);
  const TensorOptions on = TensorOptions{}.with_device(Device::cuda());
  // Decode sizes read their weights from HBM, as a model's successive layers
  // would: they rotate over copies larger than the 50 MB L2 together
  // (N = K = 4096: 4 x 16 MiB s8, 4 x 32 MiB bf16). The large shapes are
  // bound by the tensor cores, not by the weight bytes.
  const int copies = M <= 128 ? 4 : 1;
  Tensor x = randn({M, K}, g, TensorOptions(on).with_dtype(DType::bf16));
  std::vector<Tensor> w, wb;
  for (int i = 0; i < copies; ++i) {
    w.push_back(randint(-127, 128, {N, K}, g, TensorOptions(on).with_dtype(DType::s8)));
    wb.push_back(randn({N, K}, g, TensorOptions(on).with_dtype(DType::bf16)));
  }
  const auto pick = [copies](int rep) { return static_cast<std::size_t>(rep % copies); };
  Tensor sw = rand({N}, g, on, 0.001, 0.01);
  Tensor yb = Tensor::empty({M, N}, TensorOptions(on).with_dtype(DType::bf16));
  const int reps = M * N * K >= (std::int64_t(1) << 36) ? 20 : 100;

  const auto qgrad_call = [&](int rep) {
    (void)quantized_linear(x, w[pick(rep)], sw, Tensor(), ActivationQuant::dynamic(), DType::bf16);
  };
  Timing tq = time_cuda(qgrad_call, reps, 5);
  emit_gemm("qgrad", M, N, K, tq, true);
  // Where a small call's time goes: the host's time to issue one call (no
  // events between calls) against the stream's time per call over the same
  // back-to-back run. Host >= stream: the call is bound by its launches.
  {
    qgrad::cuda_synchronize(0);
    const auto t0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < reps; ++rep) qgrad_call(rep);
    const auto t1 = std::chrono::steady_clock::now();
    qgrad::cuda_synchronize(0);
    const auto t2 = std::chrono::steady_clock::now();
    const double issue_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / reps;
    const double wall_us = std::chrono::duration<double, std::micro>(t2 - t0).count() / reps;
    char line[256];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"w8a8\",\"case\":\"w8a8_call_cost_%lldx%lldx%lld\",\"impl\":\"qgrad\","
                  "\"host_issue_us\":%.2f,\"back_to_back_us\":%.2f,\"event_us\":%.2f}",
                  static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), issue_us, wall_us,
                  tq.median_ms * 1e3);
    emit(line);
  }

  // The activation quantization alone (per-token symmetric s8 of x into a
  // preallocated [M, K] s8 and f32 [M] scales): the end-to-end row's first pass.
  {
    Tensor aq = Tensor::empty({M, K}, TensorOptions(on).with_dtype(DType::s8));
    Tensor sa = Tensor::empty({M}, TensorOptions(on).with_dtype(DType::f32));
    const kernels::QuantSpec spec{true, -128, 127};
    Timing ta = time_cuda([&](int) { kernels::quantize_rows_dynamic(x, K, spec, aq, K, sa, Tensor()); }, reps, 5);
    const double bytes = static_cast<double>(M * K) * (2 + 1) + static_cast<double>(M) * 4;  // bf16 in, s8 + scale out
    char line[256];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"w8a8\",\"case\":\"w8a8_%lldx%lldx%lld\",\"impl\":\"qgrad_act_quant\",\"ms\":%.4f,"
                  "\"gbs\":%.1f}",
                  static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), ta.median_ms,
                  bytes / (ta.median_ms * 1e-3) / 1e9);
    emit(line);
  }

  // The int8 GEMM alone (padded K is K here: the shapes are multiples of 16).
  Tensor a = randint(-127, 128, {M, K}, g, TensorOptions(on).with_dtype(DType::s8));
  Tensor c = Tensor::empty({M, N}, TensorOptions(on).with_dtype(DType::s32));
  Tensor ws = Tensor::empty({static_cast<std::int64_t>(kernels::cuda::kLtWorkspaceBytes)},
                            TensorOptions(on).with_dtype(DType::u8));
  Timing tg = time_cuda(
      [&](int rep) {
        kernels::cuda::lt_int8_gemm(0, a.data<std::int8_t>(), K, w[pick(rep)].data<std::int8_t>(), K,
                                    c.data<std::int32_t>(), N, M, N, K, ws.data_ptr(),
                                    kernels::cuda::kLtWorkspaceBytes);
      },
      reps, 5);
  emit_gemm("qgrad_int8_gemm", M, N, K, tg, true);

  // bf16 reference: y[M, N] = x[M, K] wb[N, K]^T (column-major: y^T = wb x^T).
  const float one = 1.0f, zero = 0.0f;
  QGRAD_CHECK(cublasSetStream(h, qgrad::cuda::stream(0)) == CUBLAS_STATUS_SUCCESS, "bench", "", "cublasSetStream");
  Timing tb = time_cuda(
      [&](int rep) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &one,
                     wb[pick(rep)].data_ptr(), CUDA_R_16BF, static_cast<int>(K), x.data_ptr(), CUDA_R_16BF,
                     static_cast<int>(K), &zero, yb.data_ptr(), CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      },
      reps, 5);
  emit_gemm("cublas_bf16", M, N, K, tb, false);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  // An optional argument keeps the cases whose name contains it (for ncu).
  std::string only;
  CLI::App app{"W8A8: dynamic activation quantization, the int8 GEMM and its epilogue, bf16 cuBLAS (JSON lines)"};
  app.add_option("filter", only, "run only the cases whose name contains this");
  CLI11_PARSE(app, argc, argv);
  const auto wanted = [&](const std::string& name) { return name.find(only) != std::string::npos; };
#if QGRAD_WITH_CUDA
  if (!cuda_available()) {
    std::printf("{\"bench\":\"w8a8\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  const double copy_gbs = copy_bandwidth_gbs(std::size_t(1) << 30);
  if (wanted("dynquant_token_16384x8192")) bench_dynquant(16384, 8192, copy_gbs);
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  for (auto [M, N, K] : {std::tuple{8192, 8192, 8192}, std::tuple{4096, 4096, 4096}, std::tuple{1, 4096, 4096},
                         std::tuple{16, 4096, 4096}, std::tuple{32, 4096, 4096}, std::tuple{64, 4096, 4096},
                         std::tuple{128, 4096, 4096}, std::tuple{512, 4096, 4096}, std::tuple{1024, 4096, 4096}})
    if (wanted("w8a8_" + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K))) bench_w8a8(h, M, N, K);
  cublasDestroy(h);
#else
  (void)wanted;
  std::printf("{\"bench\":\"w8a8\",\"skipped\":\"built without CUDA\"}\n");
#endif
  return 0;
}
