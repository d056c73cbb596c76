// The W8A8 linear on Hopper with its epilogue fused (w8a8_wgmma.cuh): the
// output formula (qlinear_out.cuh) applied to the int32 accumulators in
// registers, so the op writes y once and never an int32 matrix (the cuBLASLt
// path of qlinear.cu writes and reads back 4 M N bytes of int32 in a second
// pass, and costs the host about 15 us more a call: docs/benchmarks.md,
// thirtieth session).
//
// Built only as sm_90a (wgmma, setmaxnreg: CMakeLists.txt compiles the
// *_sm90a.cu files apart for compute_90a where the architectures include 90)
// and taken only on a device of compute capability 9.0, from an eighth of a
// wave of 128 x 128 tiles up (below, cuBLASLt splits K over the idle SMs).
#include <climits>

#include "qgrad/core/device.h"
#include "qgrad/kernels/cuda/w8a8_wgmma.cuh"

namespace qgrad::kernels::cuda {

using hopper_w8a8::Config;
using hopper_w8a8::kBM;
using hopper_w8a8::launch;

template <class T>
bool qlinear_sm90a(int device, const std::int8_t* a, std::int64_t lda, const std::int8_t* w, std::int64_t ldw,
                   std::int64_t M, std::int64_t N, std::int64_t K, const QLinearOut<T>& out, bool w_ready) {
  if (cuda_compute_capability(device) != 90 || device >= 64) return false;
  // int coordinates for TMA and the tile grid; 16-byte aligned rows for TMA.
  if (M <= 0 || N <= 0 || K <= 0 || M > INT_MAX / 2 || N > INT_MAX / 2 || K > INT_MAX / 2) return false;
  if (lda % 16 != 0 || ldw % 16 != 0 || reinterpret_cast<std::uintptr_t>(a) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(w) % 16 != 0)
    return false;
  // Which kernel (docs/benchmarks.md, thirtieth session, call 1, H200,
  // N = K = 4096 unless named: each fused kernel alone, ms):
  // - up to a quarter of a wave of 128 x 128 tiles with M > 64, 128 x 32
  //   tiles, cooperative, 10 stages (thirty-second session): M = 128 0.0098
  //   against 0.0110 (128 x 64). Their main loop takes as long (7.9 us in
  //   the probe); the gain is each CTA's shorter epilogue (0.48 us after the
  //   last wgmma against 1.26) and first stage. At M = 32 and 64 they
  //   measured slower end to end (0.0199 and 0.0188 against 0.0172 and
  //   0.0158 with 128 x 64 tiles), so those keep 128 x 64;
  // - up to half a wave of 128 x 128 tiles, 128 x 64 tiles, cooperative, 8
  //   stages (thirty-first session): at M = 16 ... 128 the 32 CTAs of 128 x
  //   128 tiles spent about 590 cycles a step of K, bound by their tensor
  //   cores (512 cycles a 128 x 128 x 128 step), 9.5 of their 13-14 us;
  //   twice the CTAs halve that work a CTA without split K's exchange of
  //   partial sums: M = 128 0.0101 against 0.0146 (cuBLASLt's GEMM alone
  //   0.0115);
  // - up to one wave of 128 x 128 tiles, cooperative (both consumers on each
  //   tile): M = 128 0.0143, 256 0.0146, 512 0.0164 (ping-pong 0.0160,
  //   0.0171); cuBLASLt's GEMM alone 0.0112, 0.0188, 0.0279 before its
  //   epilogue pass;
  // - past one wave, 128 x 128 tiles in ping-pong (one consumer's epilogue
  //   under the other's main loop) with y stored by TMA from shared memory,
  //   6 stages: M = 1024 0.0269, 2048 0.0499, 4096 0.0976 (128 x 256 by TMA:
  //   0.0264, 0.0514, 0.0996);
  // - where 128 x 256 tiles fill the SMs 8 times over, those (a stage of
  //   48 KiB feeds twice the wgmma work of 32 KiB), y by TMA: 8192^3 0.7155
  //   (ping-pong 0.7483; cuBLASLt's GEMM alone 0.7239).
  // TMA needs 16-byte rows of y; launch() stores directly where they are not.
  using hopper_w8a8::Schedule;
  const std::int64_t tiles = ((M + kBM - 1) / kBM) * ((N + 127) / 128);
  const std::int64_t wide_tiles = ((M + kBM - 1) / kBM) * ((N + 255) / 256);
  const int sms = ::qgrad::cuda::multiprocessor_count(device);
  if (tiles * 8 < sms) return false;
  // A weight the kernel just before does not write: each CTA's first stages
  // of it load before the wait, and where the grid is one wave (each CTA's
  // only tile) and the weight takes at most a quarter of L2, the rest of its
  // rows go to L2 too: the weight streams from HBM while the activations are
  // quantized (docs/benchmarks.md, thirty-second session).
  hopper_w8a8::EarlyWeight early;
  early.stages = w_ready;
  early.l2 = w_ready && tiles <= sms && N * K <= ::qgrad::cuda::l2_cache_bytes(device) / 4;
  if (tiles * 4 <= sms && M > 64) return launch<T, Config<32, 1, 10>>(device, a, lda, w, ldw, M, N, K, out, early);
  if (tiles * 2 <= sms) return launch<T, Config<64, 1, 8>>(device, a, lda, w, ldw, M, N, K, out, early);
  if (tiles <= sms) return launch<T, Config<128, 1, 7>>(device, a, lda, w, ldw, M, N, K, out, early);
  constexpr bool kProbe = false, kTmaStore = true;
  if (wide_tiles >= 8 * static_cast<std::int64_t>(sms))
    return launch<T, Config<256, 1, 4, Schedule::cooperative, kProbe, kTmaStore>>(device, a, lda, w, ldw, M, N, K,
                                                                                  out, early);
  return launch<T, Config<128, 1, 6, Schedule::ping_pong, kProbe, kTmaStore>>(device, a, lda, w, ldw, M, N, K, out,
                                                                              early);
}

template bool qlinear_sm90a<float>(int, const std::int8_t*, std::int64_t, const std::int8_t*, std::int64_t,
                                   std::int64_t, std::int64_t, std::int64_t, const QLinearOut<float>&, bool);
template bool qlinear_sm90a<double>(int, const std::int8_t*, std::int64_t, const std::int8_t*, std::int64_t,
                                    std::int64_t, std::int64_t, std::int64_t, const QLinearOut<double>&, bool);
template bool qlinear_sm90a<bfloat16>(int, const std::int8_t*, std::int64_t, const std::int8_t*, std::int64_t,
                                      std::int64_t, std::int64_t, std::int64_t, const QLinearOut<bfloat16>&, bool);
template bool qlinear_sm90a<half>(int, const std::int8_t*, std::int64_t, const std::int8_t*, std::int64_t,
                                  std::int64_t, std::int64_t, std::int64_t, const QLinearOut<half>&, bool);

}  // namespace qgrad::kernels::cuda
