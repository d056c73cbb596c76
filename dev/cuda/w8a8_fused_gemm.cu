// The Hopper W8A8 GEMM with its epilogue fused (kernels/cuda/w8a8_wgmma.cuh)
// in every configuration measured, against cuBLASLt's int8 GEMM alone (the
// int32 product the unfused path then reads back in its epilogue pass), per
// shape: which shapes the library's configuration should take
// (kernels/cuda/qlinear_sm90a.cu), and how far each is from cuBLASLt's
// kernel. Each fused output (bf16, NaN-poisoned before the launch) is checked
// against cuBLASLt's int32 sums through the same formula on the host, bit for
// bit. Compiled for sm_90a (dev/CMakeLists.txt). Run by hand on the GPU
// machine: build/dev/dev_w8a8_fused_gemm [M N K]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <vector>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/core/device.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/dynamic_quant.h"
#include "qgrad/kernels/cuda/lt_gemm.cuh"
#include "qgrad/kernels/cuda/qlinear_out.cuh"
#include "qgrad/kernels/cuda/w8a8_wgmma.cuh"
#include "qgrad/qgrad.h"

#ifdef QGRAD_HAVE_SM90A
using namespace qgrad;

namespace {

// Median over 7 batches of `reps` back-to-back calls, ms per call.
template <class F>
double time_ms(F call, int reps) {
  cudaStream_t s = ::qgrad::cuda::stream(0);
  cudaEvent_t a, b;
  QGRAD_CUDA_CHECK(cudaEventCreate(&a));
  QGRAD_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) call(i);
  std::vector<float> ms;
  for (int batch = 0; batch < 7; ++batch) {
    QGRAD_CUDA_CHECK(cudaEventRecord(a, s));
    for (int r = 0; r < reps; ++r) call(r);
    QGRAD_CUDA_CHECK(cudaEventRecord(b, s));
    QGRAD_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    QGRAD_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / static_cast<float>(reps));
  }
  std::sort(ms.begin(), ms.end());
  QGRAD_CUDA_CHECK(cudaEventDestroy(a));
  QGRAD_CUDA_CHECK(cudaEventDestroy(b));
  return ms[3];
}

namespace hw = kernels::cuda::hopper_w8a8;
using Launcher = bool (*)(int, const std::int8_t*, std::int64_t, const std::int8_t*, std::int64_t, std::int64_t,
                          std::int64_t, std::int64_t, const kernels::cuda::QLinearOut<bfloat16>&, unsigned long long*);
struct Variant {
  const char* name;
  Launcher launch;
  int tile_n;
};
// Split K's workspace for the current shape (run_shape sets it; configurations
// without split K ignore it).
hw::SplitK g_split;
template <class C>
bool launch_dev(int device, const std::int8_t* a, std::int64_t lda, const std::int8_t* w, std::int64_t ldw,
                std::int64_t M, std::int64_t N, std::int64_t K, const kernels::cuda::QLinearOut<bfloat16>& ep,
                unsigned long long* probe) {
  return hw::launch<bfloat16, C>(device, a, lda, w, ldw, M, N, K, ep, {}, probe, g_split);
}

// "(library)": the configurations kernels/cuda/qlinear_sm90a.cu takes
// (cooperative 128 x 64 up to half a wave of 128 x 128 tiles, cooperative
// 128 x 128 up to one wave, ping-pong by TMA past it, 128 x 256 by TMA where
// those tiles fill the SMs 8 times).
using hw::Schedule;
constexpr Schedule kCoop = Schedule::cooperative, kPing = Schedule::ping_pong;
const Variant kVariants[] = {
    {"128x32 cooperative, 10 stages (library)", launch_dev<hw::Config<32, 1, 10>>, 32},
    {"128x64 cooperative, 8 stages (library)", launch_dev<hw::Config<64, 1, 8>>, 64},
    {"128x128 cooperative, 7 stages (library)", launch_dev<hw::Config<128, 1, 7>>, 128},
    {"128x128 ping-pong, 7 stages", launch_dev<hw::Config<128, 1, 7, kPing>>, 128},
    {"128x128, pairs sharing W by multicast", launch_dev<hw::Config<128, 2, 7>>, 128},
    {"128x256 cooperative, 4 stages", launch_dev<hw::Config<256, 1, 4>>, 256},
    {"128x256, pairs sharing W by multicast", launch_dev<hw::Config<256, 2, 4>>, 256},
    {"128x256, y stored by TMA (library)", launch_dev<hw::Config<256, 1, 4, kCoop, false, true>>, 256},
    {"128x128 ping-pong, 6 stages, y stored by TMA (library)", launch_dev<hw::Config<128, 1, 6, kPing, false, true>>,
     128},
    {"128x128 cooperative, split K (units fill the SMs once)",
     launch_dev<hw::Config<128, 1, 7, kCoop, false, false, true>>, 128},
};
// The same kernels counting their waits (clock64 around each barrier wait,
// wgmma group wait and epilogue; run twice after the timings, the second counted; and each CTA's global times).
const Variant kProbed[] = {
    {"128x32 cooperative, 10 stages (library)", launch_dev<hw::Config<32, 1, 10, kCoop, true>>, 32},
    {"128x64 cooperative, 8 stages (library)", launch_dev<hw::Config<64, 1, 8, kCoop, true>>, 64},
    {"128x128 cooperative, 7 stages (library)", launch_dev<hw::Config<128, 1, 7, kCoop, true>>, 128},
    {"128x128 ping-pong, 7 stages", launch_dev<hw::Config<128, 1, 7, kPing, true>>, 128},
    {"128x256 cooperative, 4 stages", launch_dev<hw::Config<256, 1, 4, kCoop, true>>, 256},
    {"128x256, y stored by TMA (library)", launch_dev<hw::Config<256, 1, 4, kCoop, true, true>>, 256},
    {"128x128 ping-pong, 6 stages, y stored by TMA (library)", launch_dev<hw::Config<128, 1, 6, kPing, true, true>>,
     128},
    {"128x128 cooperative, split K", launch_dev<hw::Config<128, 1, 7, kCoop, true, false, true>>, 128},
};

// Cycles per step of K (mean over the CTAs): where the producer and the
// first consumer thread spend a step.
void report_probe(const Variant& v, const std::int8_t* ap, const std::int8_t* wp, std::int64_t M, std::int64_t N,
                  std::int64_t K, const kernels::cuda::QLinearOut<bfloat16>& out) {
  const int ctas = 2 * ::qgrad::cuda::multiprocessor_count(0);  // a grid never exceeds 2 CTAs a SM
  const TensorOptions on = TensorOptions{}.with_device(Device::cuda()).with_dtype(DType::s64);
  Tensor probe = zeros({ctas, hw::kProbeSlots}, on);
  auto* pp = reinterpret_cast<unsigned long long*>(probe.data_ptr());
  // Twice: the second launch (code and descriptors warm, as in the timings) overwrites the first's counts.
  if (!v.launch(0, ap, K, wp, K, M, N, K, out, pp) || !v.launch(0, ap, K, wp, K, M, N, K, out, pp)) return;
  const Tensor h = probe.cpu();
  const auto* c = h.data<std::int64_t>();
  double sum[hw::kProbeSlots] = {};
  int used = 0;
  for (int b = 0; b < ctas; ++b) {
    if (c[b * hw::kProbeSlots + hw::kConsumerTotal] == 0) continue;
    ++used;
    for (int i = 0; i < hw::kProbeSlots; ++i) sum[i] += static_cast<double>(c[b * hw::kProbeSlots + i]);
  }
  if (used == 0) return;
  // The CTAs' global times (ns): how the kernel's span divides into the
  // CTAs' start spread, their wait for the first stage, main loop and epilogue.
  std::uint64_t first_entry = ~std::uint64_t{0}, last_entry = 0, last_exit = 0;
  double to_data = 0, main_loop = 0, tail = 0;
  for (int b = 0; b < ctas; ++b) {
    const auto* s = reinterpret_cast<const std::uint64_t*>(c + b * hw::kProbeSlots);
    if (s[hw::kConsumerTotal] == 0) continue;
    first_entry = std::min(first_entry, s[hw::kEntryNs]);
    last_entry = std::max(last_entry, s[hw::kEntryNs]);
    last_exit = std::max(last_exit, s[hw::kExitNs]);
    to_data += static_cast<double>(s[hw::kFirstDataNs] - s[hw::kEntryNs]);
    main_loop += static_cast<double>(s[hw::kMainLoopEndNs] - s[hw::kFirstDataNs]);
    tail += static_cast<double>(s[hw::kExitNs] - s[hw::kMainLoopEndNs]);
  }
  const double tiles = static_cast<double>((M + 127) / 128) * static_cast<double>((N + v.tile_n - 1) / v.tile_n);
  const double steps = static_cast<double>((K + 127) / 128) * tiles / used;  // 128-byte steps of K a CTA
  std::printf("\n  probe %s: %d CTAs, per CTA %.0f cycles; per step of K: producer waits %.0f, consumer waits"
              " for data %.0f, for its wgmma group %.0f; epilogues %.0f a CTA",
              v.name, used, sum[hw::kConsumerTotal] / used, sum[hw::kProducerWait] / used / steps,
              sum[hw::kFullWait] / used / steps, sum[hw::kGroupWait] / used / steps, sum[hw::kEpilogue] / used);
  std::printf("\n    global times: first entry to last exit %.2f us, entries spread over %.2f us; per CTA (mean) entry"
              " to first data %.2f us, first data to last wgmma %.2f us, then to exit %.2f us",
              static_cast<double>(last_exit - first_entry) * 1e-3, static_cast<double>(last_entry - first_entry) * 1e-3,
              to_data / used * 1e-3, main_loop / used * 1e-3, tail / used * 1e-3);
}

__global__ void noop_kernel() { ::qgrad::cuda::wait_for_prior_kernels(); }

// Host microseconds per call (issue only: `calls` back to back, then one
// sync outside the clock) of what quantized_linear's call is made of.
template <class F>
double host_us(F call, int calls = 400) {
  for (int i = 0; i < 20; ++i) call();
  ::qgrad::cuda_synchronize(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) call();
  const auto t1 = std::chrono::steady_clock::now();
  ::qgrad::cuda_synchronize(0);
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
}

void host_costs(std::int64_t M, std::int64_t N, std::int64_t K) {
  Generator g(9);
  const TensorOptions on = TensorOptions{}.with_device(Device::cuda());
  Tensor x = randn({M, K}, g, TensorOptions(on).with_dtype(DType::bf16));
  Tensor w = randint(-127, 128, {N, K}, g, TensorOptions(on).with_dtype(DType::s8));
  Tensor sw = rand({N}, g, on, 0.001, 0.01);
  Tensor aq = Tensor::empty({M, K}, TensorOptions(on).with_dtype(DType::s8));
  Tensor sa = Tensor::empty({M}, on);
  Tensor y = Tensor::empty({M, N}, TensorOptions(on).with_dtype(DType::bf16));
  kernels::QLinearEpilogue ep;
  ep.sa = sa;
  ep.sw = sw;
  const auto out = kernels::cuda::qlinear_out<bfloat16>(ep, y);
  const kernels::QuantSpec spec{true, -128, 127};
  const auto* ap = aq.data<std::int8_t>();
  const auto* wp = w.data<std::int8_t>();
  const double op =
      host_us([&] { (void)quantized_linear(x, w, sw, Tensor(), ActivationQuant::dynamic(), DType::bf16); });
  const double alloc = host_us([&] {
    Tensor o = Tensor::empty({M, N}, TensorOptions(on).with_dtype(DType::bf16));
    Tensor a = Tensor::empty({M, K}, TensorOptions(on).with_dtype(DType::s8));
    Tensor s = Tensor::empty({M}, on);
  });
  const double quant = host_us([&] { kernels::quantize_rows_dynamic(x, K, spec, aq, K, sa, Tensor()); });
  const double gemm =
      host_us([&] { (void)kernels::cuda::qlinear_sm90a<bfloat16>(0, ap, K, wp, K, M, N, K, out, true); });
  CUtensorMap m1, m2, m3;
  const double maps = host_us([&] {
    (void)hw::encode(m1, ap, M, K, K, hw::kBM);
    (void)hw::encode(m2, wp, N, K, K, 64);
    (void)hw::encode_out(m3, out.out, M, N);
  });
  const double empty_launch = host_us([&] { ::qgrad::cuda::launch_kernel(0, noop_kernel, 1, 32, 0); });
  std::printf("\n  host us per call: quantized_linear %.2f; three Tensor::empty %.2f; quantize_rows_dynamic %.2f;"
              " qlinear_sm90a %.2f; three tensor maps encoded %.2f; an empty kernel launched %.2f",
              op, alloc, quant, gemm, maps, empty_launch);
}

void run_shape(std::int64_t M, std::int64_t N, std::int64_t K) {
  Generator g(5);
  const TensorOptions on = TensorOptions{}.with_device(Device::cuda());
  // Weights rotate over copies past the 50 MB L2 where one copy is small.
  const int copies = N * K < (std::int64_t(64) << 20) ? 4 : 1;
  Tensor a = randint(-127, 128, {M, K}, g, TensorOptions(on).with_dtype(DType::s8));
  std::vector<Tensor> w;
  for (int i = 0; i < copies; ++i) w.push_back(randint(-127, 128, {N, K}, g, TensorOptions(on).with_dtype(DType::s8)));
  Tensor sa = rand({M}, g, on, 0.01, 0.02);
  Tensor sw = rand({N}, g, on, 0.001, 0.01);
  Tensor bias = randn({N}, g, on);
  Tensor c = Tensor::empty({M, N}, TensorOptions(on).with_dtype(DType::s32));
  Tensor y = Tensor::empty({M, N}, TensorOptions(on).with_dtype(DType::bf16));
  Tensor ws = Tensor::empty({static_cast<std::int64_t>(kernels::cuda::kLtWorkspaceBytes)},
                            TensorOptions(on).with_dtype(DType::u8));
  kernels::QLinearEpilogue ep;
  ep.sa = sa;
  ep.sw = sw;
  ep.bias = bias;
  const auto out = kernels::cuda::qlinear_out<bfloat16>(ep, y);
  const auto* ap = a.data<std::int8_t>();
  const int reps = M * N * K >= (std::int64_t(1) << 36) ? 10 : 50;
  // Split K: as many splits of each 128 x 128 tile's steps of K as fill the
  // SMs once (1 ... 8).
  const std::int64_t tiles = ((M + 127) / 128) * ((N + 127) / 128), ksteps = (K + 127) / 128;
  const std::int64_t splits =
      std::max<std::int64_t>(1, std::min({std::int64_t(8), ksteps, ::qgrad::cuda::multiprocessor_count(0) / tiles}));
  Tensor partials = Tensor::empty({tiles * splits * 128 * 128}, TensorOptions(on).with_dtype(DType::s32));
  Tensor semaphores = zeros({tiles}, TensorOptions(on).with_dtype(DType::s32));
  g_split = hw::SplitK{static_cast<int>(splits), partials.data<std::int32_t>(), semaphores.data<std::int32_t>()};
  std::printf("(split K: %lld splits) ", static_cast<long long>(splits));
  const double flop = 2.0 * static_cast<double>(M) * N * K;

  const double t_lt = time_ms(
      [&](int r) {
        kernels::cuda::lt_int8_gemm(0, ap, K, w[r % copies].data<std::int8_t>(), K, c.data<std::int32_t>(), N, M, N, K,
                                    ws.data_ptr(), kernels::cuda::kLtWorkspaceBytes);
      },
      reps);
  std::printf("M=%lld N=%lld K=%lld  cublaslt int8 gemm alone %.4f ms (%.0f TOPS)", static_cast<long long>(M),
              static_cast<long long>(N), static_cast<long long>(K), t_lt, flop / t_lt * 1e-9);
  // Check: the fused bf16 output against the formula over cuBLASLt's sums (copy 0).
  kernels::cuda::lt_int8_gemm(0, ap, K, w[0].data<std::int8_t>(), K, c.data<std::int32_t>(), N, M, N, K, ws.data_ptr(),
                              kernels::cuda::kLtWorkspaceBytes);
  const Tensor c_host = c.cpu(), sa_h = sa.cpu(), sw_h = sw.cpu(), b_h = bias.cpu();
  // Mismatched outputs of one poisoned launch (-1: not launched). Run before
  // and after the timings: split K's semaphores must have reset themselves.
  auto check = [&](const Variant& v) -> std::int64_t {
    QGRAD_CUDA_CHECK(cudaMemset(y.data_ptr(), 0xff, static_cast<std::size_t>(M * N) * 2));  // NaN poison
    if (!v.launch(0, ap, K, w[0].data<std::int8_t>(), K, M, N, K, out, nullptr)) return -1;
    const Tensor yh = y.cpu();
    std::int64_t bad = 0;
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        const float ref_f = formulas::qlinear_epilogue<float>(c_host.data<std::int32_t>()[m * N + n],
                                                              sa_h.data<float>()[m], sw_h.data<float>()[n],
                                                              b_h.data<float>()[n], true);
        const bfloat16 ref(ref_f), got = yh.data<bfloat16>()[m * N + n];
        if (ref.bits != got.bits) ++bad;
      }
    return bad;
  };
  for (const Variant& v : kVariants) {
    const std::int64_t bad_before = check(v);
    if (bad_before < 0) {
      std::printf("\n  %s: not launched", v.name);
      continue;
    }
    const double t = time_ms(
        [&](int r) {
          (void)v.launch(0, ap, K, w[r % copies].data<std::int8_t>(), K, M, N, K, out, nullptr);
        },
        reps);
    const std::int64_t bad = bad_before + check(v);
    std::printf("\n  %s %.4f ms (%.0f TOPS, %.2fx lt)%s", v.name, t, flop / t * 1e-9, t_lt / t,
                bad ? " MISMATCH" : " exact");
    if (bad) std::printf(" (%lld of 2 x %lld differ)", static_cast<long long>(bad), static_cast<long long>(M * N));
  }
  for (const Variant& v : kProbed) report_probe(v, ap, w[0].data<std::int8_t>(), M, N, K, out);

  // End to end as quantized_linear runs it: bf16 x quantized per token into
  // a (and sa), then the library's GEMM, with the weight loaded after the
  // wait for the quantization kernel or before it (EarlyWeight, the
  // library's choice for this shape); both outputs compared bit for bit.
  if (K % 16 == 0) {
    Tensor x = randn({M, K}, g, TensorOptions(on).with_dtype(DType::bf16));
    Tensor aq = Tensor::empty({M, K}, TensorOptions(on).with_dtype(DType::s8));
    const kernels::QuantSpec spec{true, -128, 127};
    auto e2e = [&](int r, bool early) {
      kernels::quantize_rows_dynamic(x, K, spec, aq, K, sa, Tensor());
      (void)kernels::cuda::qlinear_sm90a<bfloat16>(0, aq.data<std::int8_t>(), K, w[r % copies].data<std::int8_t>(), K,
                                                   M, N, K, out, early);
    };
    Tensor y_late, y_early;
    for (const bool early : {false, true}) {
      QGRAD_CUDA_CHECK(cudaMemset(y.data_ptr(), 0xff, static_cast<std::size_t>(M * N) * 2));
      e2e(0, early);
      (early ? y_early : y_late) = y.cpu();
    }
    const bfloat16* late_p = y_late.data<bfloat16>();
    const bfloat16* early_p = y_early.data<bfloat16>();
    bool same = true;
    for (std::int64_t i = 0; i < M * N; ++i) same = same && late_p[i].bits == early_p[i].bits;
    const double t_quant = time_ms([&](int) { kernels::quantize_rows_dynamic(x, K, spec, aq, K, sa, Tensor()); }, reps);
    double t_late = 0, t_early = 0;
    for (int round = 0; round < 3; ++round) {  // alternating: the machine's drift falls on both
      t_late += time_ms([&](int r) { e2e(r, false); }, reps) / 3;
      t_early += time_ms([&](int r) { e2e(r, true); }, reps) / 3;
    }
    std::printf("\n  end to end (bf16 x quantized, library GEMM): quantization alone %.4f ms; weight after the wait "
                "%.4f ms, weight early %.4f ms (%.2fx)%s",
                t_quant, t_late, t_early, t_late / t_early, same ? " same bits" : " MISMATCH");
  }
  host_costs(M, N, K);
  std::printf("\n");
}

}  // namespace

// No arguments: every shape below; M N K: that shape alone (for ncu).
int main(int argc, char** argv) {
  if (!qgrad::cuda_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // each line out as it is measured
  if (argc == 4) {
    run_shape(std::atoll(argv[1]), std::atoll(argv[2]), std::atoll(argv[3]));
    return 0;
  }
  for (std::int64_t M : {16, 64, 128, 256, 512, 1024, 2048, 4096}) run_shape(M, 4096, 4096);
  run_shape(8192, 8192, 8192);
  return 0;
}
#else
int main() {
  std::printf("built without sm_90a kernels (CUDA architectures without 90)\n");
  return 0;
}
#endif
