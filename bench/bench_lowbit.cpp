// bench_lowbit: the int4 linear layers (ops/lowbit_linear.h) against bf16
// cuBLAS and the W8A8 quantized_linear, in one run. JSON lines; the "case"
// keys match bench/peer_lowbit.py (PyTorch), run side by side on the same
// machine.
//
//   case w4a16_<M>x<N>x<K>   impl qgrad (linear_w4a16, bf16 x/out, s4 groups of 128),
//                            impl qgrad_g32 (groups of 32), impl qgrad_u4 (u4 + zero points, groups of 128),
//                            impl qgrad_f16 (f16 x/out, s4 groups of 128); impl qgrad_tscale* the same with
//                            scales of x's dtype (bf16 / f16, as torchao and GPTQ keep them: the packed GEMV),
//                            impl qgrad_kernel_back_to_back (the s4 g128 kernel alone, 24 launches
//                            back to back into a preallocated output: kernel time without the op's host
//                            work, which the per-call rows include when it is the longer),
//                            impl qgrad_packed / qgrad_tscale_packed (s4 g128 weights packed once by
//                            pack_w4a16: the fragment order, loads before the wait; per call, *_chain,
//                            *_chain_l2),
//                            impl cublas_bf16 (cublasGemmEx bf16, f32 accumulate, the same shape);
//                            impl *_chain (N = K: a decode step of 24 layers y_i = W_i y_(i-1) captured in
//                            one CUDA graph, per layer; qgrad's through the op, cuBLAS's through
//                            cublasGemmEx), speedup_vs_cublas_bf16_chain; impl *_chain_l2 (the same
//                            chain over one weight, L2-resident: a layer without its HBM read);
//                            gbs = packed weight + scale bytes / time (the bytes that must move),
//                            copy_fraction against the device-to-device copy of this run,
//                            speedup_vs_cublas_bf16
//   case w4a8_<M>x<N>x<K>    impl qgrad (linear_w4a8 per channel, symmetric activations, bf16 x/out:
//                            widen + cuBLASLt int8 + epilogue), impl qgrad_widen (the s4 -> s8 widening
//                            alone: the per-call cost over W8A8), impl qgrad_cached (linear_w4a8 given
//                            the widened weight w_s8: no widening; extra_bytes = N K kept), impl qgrad_w8a8 (quantized_linear,
//                            dynamic per token, bf16 out), impl qgrad_g128_asym / qgrad_g32_asym
//                            (8da4w: grouped kernel, asymmetric activations), impl cublas_bf16
// TOPS = 2 M N K / time.
#include <cstdio>
#include <string>
#include <tuple>

#include <CLI/CLI.hpp>

#include "bench_common.h"

#if QGRAD_WITH_CUDA
#include <cublas_v2.h>

#include "qgrad/kernels/lowbit_linear.h"
#endif

using namespace qgrad;
using namespace qgrad::bench;

namespace {

#if QGRAD_WITH_CUDA
TensorOptions cuda_opts(DType dt) { return TensorOptions{}.with_device(Device::cuda()).with_dtype(dt); }

Tensor int4_weight(std::int64_t N, std::int64_t K, Generator& g, DType qtype) {
  const bool s = qtype == DType::s4;
  return randint(s ? -8 : 0, s ? 8 : 16, {N, K}, g, cuda_opts(DType::s32)).to(qtype);
}

void emit_row(const char* bench_case, const char* impl, std::int64_t M, std::int64_t N, std::int64_t K,
              const Timing& t, const std::string& extra) {
  const double tops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) /
                      (t.median_ms * 1e-3) / 1e12;
  char line[768];
  std::snprintf(line, sizeof line,
                "{\"bench\":\"lowbit\",\"case\":\"%s_%lldx%lldx%lld\",\"impl\":\"%s\",\"ms\":%.4f,\"min_ms\":%.4f,"
                "\"tops\":%.2f%s}",
                bench_case, static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), impl,
                t.median_ms, t.min_ms, tops, extra.c_str());
  emit(line);
}

// y [M, N] = x [M, K] w^T in bf16 (f32 accumulate) by cublasGemmEx: the bf16 peer.
void gemm_bf16(cublasHandle_t h, std::int64_t M, std::int64_t N, std::int64_t K, const void* w, const void* x,
               void* y) {
  const float one = 1.0f, zero = 0.0f;
  cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &one, w,
               CUDA_R_16BF, static_cast<int>(K), x, CUDA_R_16BF, static_cast<int>(K), &zero, y, CUDA_R_16BF,
               static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

Timing time_cublas_bf16(cublasHandle_t h, const Tensor& x, const Tensor& wb, const Tensor& yb, int reps) {
  QGRAD_CHECK(cublasSetStream(h, qgrad::cuda::stream(0)) == CUBLAS_STATUS_SUCCESS, "bench", "", "cublasSetStream");
  return time_cuda([&](int) { gemm_bf16(h, x.size(0), wb.size(0), x.size(1), wb.data_ptr(), x.data_ptr(), yb.data_ptr()); },
                   reps, 5);
}

// A decode step's layers one after another on the GPU: `chain` (kChain
// layers) captured once into a CUDA graph and replayed; per layer = replay
// time / kChain. No host work between layers (a captured decode step runs
// so), and each layer's input is the previous one's output.
constexpr int kChain = 24;
Timing time_chain(const std::function<void()>& chain) {
  CudaGraph graph;
  graph.capture(chain);
  Timing t = time_cuda([&](int) { graph.replay(); }, 50, 5);
  t.median_ms /= kChain;
  t.min_ms /= kChain;
  return t;
}

// W4A16 at decode sizes. The weights rotate over sets larger than the 50 MB
// L2 together (at N = K = 4096: 12 x 8 MiB packed, 4 x 32 MiB bf16), so each
// call reads them from HBM, as a model's successive layers would.
void bench_w4a16(cublasHandle_t h, std::int64_t M, std::int64_t N, std::int64_t K, double copy_gbs) {
  constexpr int kCopies = 4, kInt4Copies = 12;
  Generator g(3);
  Tensor x = randn({M, K}, g, cuda_opts(DType::bf16));
  double cublas_chain_ms = 0;
  const double bf16_ms = [&] {
    std::vector<Tensor> wb;
    for (int i = 0; i < kCopies; ++i) wb.push_back(randn({N, K}, g, cuda_opts(DType::bf16)));
    Tensor yb = Tensor::empty({M, N}, cuda_opts(DType::bf16));
    QGRAD_CHECK(cublasSetStream(h, qgrad::cuda::stream(0)) == CUBLAS_STATUS_SUCCESS, "bench", "", "cublasSetStream");
    Timing t = time_cuda(
        [&](int rep) { gemm_bf16(h, M, N, K, wb[static_cast<std::size_t>(rep % kCopies)].data_ptr(), x.data_ptr(), yb.data_ptr()); },
        100, 10);
    const double gbs = static_cast<double>(N * K * 2) / (t.median_ms * 1e-3) / 1e9;
    emit_row("w4a16", "cublas_bf16", M, N, K, t,
             ",\"gbs\":" + std::to_string(gbs) + ",\"copy_fraction\":" + std::to_string(gbs / copy_gbs));
    if (N == K) {
      // The decode chain (see time_chain): y_i = W_i y_(i-1), the bf16 weights
      // rotating, or (L2) one weight, which stays in L2 (32 MiB): the layer
      // without its HBM read.
      std::vector<Tensor> ys;
      for (int i = 0; i < 2; ++i) ys.push_back(Tensor::empty({M, N}, cuda_opts(DType::bf16)));
      auto chain = [&](bool rotate) {
        return time_chain([&] {
          for (int i = 0; i < kChain; ++i)
            gemm_bf16(h, M, N, K, wb[rotate ? static_cast<std::size_t>(i % kCopies) : 0].data_ptr(),
                      i == 0 ? x.data_ptr() : ys[static_cast<std::size_t>((i - 1) % 2)].data_ptr(),
                      ys[static_cast<std::size_t>(i % 2)].data_ptr());
        });
      };
      const Timing tc = chain(true);
      cublas_chain_ms = tc.median_ms;
      const double gbs_c = static_cast<double>(N * K * 2) / (tc.median_ms * 1e-3) / 1e9;
      emit_row("w4a16", "cublas_bf16_chain", M, N, K, tc,
               ",\"gbs\":" + std::to_string(gbs_c) + ",\"copy_fraction\":" + std::to_string(gbs_c / copy_gbs));
      emit_row("w4a16", "cublas_bf16_chain_l2", M, N, K, chain(false), "");
    }
    return t.median_ms;
  }();
  const Tensor x16 = x.to(DType::f16);
  // Scales f32, or (t_scale) x's dtype as torchao's and GPTQ's int4 weights keep them.
  for (auto [impl, G, qt, t_scale] :
       {std::tuple{"qgrad", 128, DType::s4, false}, std::tuple{"qgrad_g32", 32, DType::s4, false},
        std::tuple{"qgrad_u4", 128, DType::u4, false}, std::tuple{"qgrad_f16", 128, DType::s4, false},
        std::tuple{"qgrad_tscale", 128, DType::s4, true}, std::tuple{"qgrad_tscale_g32", 32, DType::s4, true},
        std::tuple{"qgrad_tscale_u4", 128, DType::u4, true}, std::tuple{"qgrad_tscale_f16", 128, DType::s4, true}}) {
    const bool f16 = std::string(impl) == "qgrad_f16" || std::string(impl) == "qgrad_tscale_f16";
    std::vector<Tensor> wq, ws, wz;
    for (int i = 0; i < kInt4Copies; ++i) {
      wq.push_back(int4_weight(N, K, g, qt));
      ws.push_back(rand({N, K / G}, g, cuda_opts(DType::f32), 0.01, 0.02)
                       .to(t_scale ? (f16 ? DType::f16 : DType::bf16) : DType::f32));
      wz.push_back(qt == DType::u4 ? randint(0, 16, {N, K / G}, g, cuda_opts(DType::s32)) : Tensor());
    }
    Timing t = time_cuda(
        [&](int rep) {
          const auto i = static_cast<std::size_t>(rep % kInt4Copies);
          (void)linear_w4a16(f16 ? x16 : x, wq[i], ws[i], wz[i], G);
        },
        100, 10);
    const double bytes = static_cast<double>(N * K / 2 + N * (K / G) * ((t_scale ? 2 : 4) + (qt == DType::u4 ? 4 : 0)));
    const double gbs = bytes / (t.median_ms * 1e-3) / 1e9;
    emit_row("w4a16", impl, M, N, K, t,
             ",\"gbs\":" + std::to_string(gbs) + ",\"copy_fraction\":" + std::to_string(gbs / copy_gbs) +
                 ",\"speedup_vs_cublas_bf16\":" + std::to_string(bf16_ms / t.median_ms));
    if (N == K && !f16) {
      // The decode chain: kChain layers y_i = linear_w4a16(y_(i-1), W_i) through
      // the op, the weights rotating or (L2) one weight, L2-resident.
      auto chain = [&](bool rotate) {
        return time_chain([&] {
          Tensor hcur = x;  // layer i's input: layer i - 1's output
          for (int i = 0; i < kChain; ++i) {
            const auto j = rotate ? static_cast<std::size_t>(i % kInt4Copies) : 0;
            hcur = linear_w4a16(hcur, wq[j], ws[j], wz[j], G);
          }
        });
      };
      const Timing tc = chain(true);
      const double gbs_c = bytes / (tc.median_ms * 1e-3) / 1e9;
      emit_row("w4a16", (std::string(impl) + "_chain").c_str(), M, N, K, tc,
               ",\"gbs\":" + std::to_string(gbs_c) + ",\"copy_fraction\":" + std::to_string(gbs_c / copy_gbs) +
                   ",\"speedup_vs_cublas_bf16_chain\":" + std::to_string(cublas_chain_ms / tc.median_ms));
      if (G == 128 && qt == DType::s4) emit_row("w4a16", (std::string(impl) + "_chain_l2").c_str(), M, N, K, chain(false), "");
    }
    if (G != 128 || qt != DType::s4 || f16) continue;
    {
      // The same weights packed once (pack_w4a16: the fragment order, its
      // first loads issued before the kernel waits): per call and the chain.
      std::vector<PackedW4A16> pw;
      for (int i = 0; i < kInt4Copies; ++i) pw.push_back(pack_w4a16(wq[i], ws[i], wz[i], G));
      const std::string pimpl = std::string(impl) + "_packed";
      const Timing tp = time_cuda(
          [&](int rep) { (void)linear_w4a16(x, pw[static_cast<std::size_t>(rep % kInt4Copies)]); }, 100, 10);
      const double gbs_p = bytes / (tp.median_ms * 1e-3) / 1e9;
      emit_row("w4a16", pimpl.c_str(), M, N, K, tp,
               ",\"gbs\":" + std::to_string(gbs_p) + ",\"copy_fraction\":" + std::to_string(gbs_p / copy_gbs) +
                   ",\"speedup_vs_cublas_bf16\":" + std::to_string(bf16_ms / tp.median_ms));
      if (N == K) {
        auto chain = [&](bool rotate) {
          return time_chain([&] {
            Tensor hcur = x;
            for (int i = 0; i < kChain; ++i)
              hcur = linear_w4a16(hcur, pw[rotate ? static_cast<std::size_t>(i % kInt4Copies) : 0]);
          });
        };
        const Timing tc = chain(true);
        const double gbs_c = bytes / (tc.median_ms * 1e-3) / 1e9;
        emit_row("w4a16", (pimpl + "_chain").c_str(), M, N, K, tc,
                 ",\"gbs\":" + std::to_string(gbs_c) + ",\"copy_fraction\":" + std::to_string(gbs_c / copy_gbs) +
                     ",\"speedup_vs_cublas_bf16_chain\":" + std::to_string(cublas_chain_ms / tc.median_ms));
        emit_row("w4a16", (pimpl + "_chain_l2").c_str(), M, N, K, chain(false), "");
      }
    }
    const std::string back_impl = t_scale ? "qgrad_tscale_kernel_back_to_back" : "qgrad_kernel_back_to_back";
    // The kernel alone: kBack launches of kernels::w4a16_linear back to back
    // into a preallocated output (no op-level validation, allocation or
    // host gap between calls), time / kBack. The per-call rows above time one
    // op call between two events, so they include the host's work for the
    // call whenever it exceeds the kernel's (the GPU waits for it).
    constexpr int kBack = 24;
    Tensor y = Tensor::empty({M, N}, cuda_opts(DType::bf16));
    Timing tk = time_cuda(
        [&](int) {
          for (int b = 0; b < kBack; ++b)
            kernels::w4a16_linear(x, wq[static_cast<std::size_t>(b % kInt4Copies)],
                                  ws[static_cast<std::size_t>(b % kInt4Copies)], Tensor(), G, Tensor(), y);
        },
        20, 3);
    tk.median_ms /= kBack;
    tk.min_ms /= kBack;
    const double gbs_k = bytes / (tk.median_ms * 1e-3) / 1e9;
    emit_row("w4a16", back_impl.c_str(), M, N, K, tk,
             ",\"gbs\":" + std::to_string(gbs_k) + ",\"copy_fraction\":" + std::to_string(gbs_k / copy_gbs) +
                 ",\"speedup_vs_cublas_bf16\":" + std::to_string(bf16_ms / tk.median_ms));
  }
}

void bench_w4a8(cublasHandle_t h, std::int64_t M, std::int64_t N, std::int64_t K, bool grouped) {
  Generator g(4);
  const int reps = M * N * K >= (std::int64_t(1) << 36) ? 20 : 50;
  Tensor x = randn({M, K}, g, cuda_opts(DType::bf16));
  Tensor wq = int4_weight(N, K, g, DType::s4);
  Tensor sw = rand({N, 1}, g, cuda_opts(DType::f32), 0.01, 0.02);
  Timing tq = time_cuda(
      [&](int) { (void)linear_w4a8(x, wq, sw, K, Tensor(), QuantMode::symmetric, DType::bf16); }, reps, 5);
  emit_row("w4a8", "qgrad", M, N, K, tq, "");

  Tensor w8 = Tensor::empty({N, K}, cuda_opts(DType::s8));
  Timing tw = time_cuda([&](int) { kernels::int4_widen(wq, w8); }, reps, 5);
  const double widen_gbs = static_cast<double>(N * K / 2 + N * K) / (tw.median_ms * 1e-3) / 1e9;
  emit_row("w4a8", "qgrad_widen", M, N, K, tw, ",\"gbs\":" + std::to_string(widen_gbs));

  Tensor sw1 = sw.reshape({N});
  Timing t8 = time_cuda(
      [&](int) { (void)quantized_linear(x, w8, sw1, Tensor(), ActivationQuant::dynamic(), DType::bf16); }, reps, 5);
  emit_row("w4a8", "qgrad_w8a8", M, N, K, t8, ",\"w4a8_over_w8a8\":" + std::to_string(tq.median_ms / t8.median_ms));
  // The cached widened weight (linear_w4a8's w_s8): no per-call widening, N K more bytes kept.
  Timing tc = time_cuda(
      [&](int) { (void)linear_w4a8(x, wq, sw, K, Tensor(), QuantMode::symmetric, DType::bf16, w8); }, reps, 5);
  emit_row("w4a8", "qgrad_cached", M, N, K, tc,
           ",\"cached_over_w8a8\":" + std::to_string(tc.median_ms / t8.median_ms) +
               ",\"extra_bytes\":" + std::to_string(N * K));

  if (grouped) {
    for (auto [impl, G] : {std::tuple{"qgrad_g128_asym", 128}, std::tuple{"qgrad_g32_asym", 32}}) {
      Tensor swg = rand({N, K / G}, g, cuda_opts(DType::f32), 0.01, 0.02);
      Timing tg = time_cuda(
          [&](int) { (void)linear_w4a8(x, wq, swg, G, Tensor(), QuantMode::asymmetric, DType::bf16); }, reps, 3);
      emit_row("w4a8", impl, M, N, K, tg, "");
    }
  }

  Tensor wb = randn({N, K}, g, cuda_opts(DType::bf16));
  Tensor yb = Tensor::empty({M, N}, cuda_opts(DType::bf16));
  emit_row("w4a8", "cublas_bf16", M, N, K, time_cublas_bf16(h, x, wb, yb, reps), "");
}
#endif

}  // namespace

int main(int argc, char** argv) {
  // "w4a16" runs the W4A16 cases alone; a second argument, M, only that M (for a profiler).
  std::string only;
  std::int64_t only_m = 0;
  CLI::App app{"int4 / int8 low-bit kernels against their peers (JSON lines)"};
  app.add_option("cases", only, "w4a16: the W4A16 cases alone")->check(CLI::IsMember({"w4a16"}));
  app.add_option("m", only_m, "with w4a16: only this M")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const bool only_w4a16 = only == "w4a16";
#if QGRAD_WITH_CUDA
  if (!cuda_available()) {
    std::printf("{\"bench\":\"lowbit\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  const double copy_gbs = copy_bandwidth_gbs(std::size_t(1) << 30);
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  // A workspace of the handle's lifetime, so that cuBLAS allocates nothing
  // while the W4A16 chains are captured into CUDA graphs.
  const Tensor workspace = Tensor::empty({32 << 20}, cuda_opts(DType::u8));
  QGRAD_CHECK(cublasSetWorkspace(h, workspace.data_ptr(), 32 << 20) == CUBLAS_STATUS_SUCCESS, "bench", "",
              "cublasSetWorkspace");
  for (std::int64_t M : {1, 16, 32, 64, 128})
    if (only_m == 0 || M == only_m) bench_w4a16(h, M, 4096, 4096, copy_gbs);
  if (!only_w4a16) {
    bench_w4a8(h, 4096, 4096, 4096, true);
    bench_w4a8(h, 8192, 8192, 8192, false);
    bench_w4a8(h, 16, 4096, 4096, true);
  }
  cublasDestroy(h);
#else
  (void)only_w4a16;
  (void)only_m;
  std::printf("{\"bench\":\"lowbit\",\"skipped\":\"built without CUDA\"}\n");
#endif
  return 0;
}
