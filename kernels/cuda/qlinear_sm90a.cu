// The W8A8 linear on Hopper with its epilogue fused (w8a8_wgmma.cuh): the
// output formula (qlinear_out.cuh) applied to the int32 accumulators in
// registers, so the op writes y once and never an int32 matrix (the cuBLASLt
// path of qlinear.cu writes and reads back 4 M N bytes of int32 in a second
// pass).
//
// Built only as sm_90a (wgmma, setmaxnreg: CMakeLists.txt compiles the
// *_sm90a.cu files apart for compute_90a where the architectures include 90)
// and taken only on a device of compute capability 9.0, for the shapes where
// it was measured faster than cuBLASLt's GEMM + the epilogue pass (below:
// half a wave to one wave of 128 x 128 tiles). Where the SMs are full,
// cuBLASLt's int8 GEMM runs at 1.7-1.9x this kernel's rate
// (docs/benchmarks.md, twenty-eighth session: the profile and what was
// tried), so large shapes stay on cuBLASLt.
#include <climits>

#include "qgrad/core/device.h"
#include "qgrad/kernels/cuda/w8a8_wgmma.cuh"

namespace qgrad::kernels::cuda {

using hopper_w8a8::Config;
using hopper_w8a8::kBM;
using hopper_w8a8::launch;

template <class T>
bool qlinear_sm90a(int device, const std::int8_t* a, std::int64_t lda, const std::int8_t* w, std::int64_t ldw,
                   std::int64_t M, std::int64_t N, std::int64_t K, const QLinearOut<T>& out) {
  if (cuda_compute_capability(device) != 90 || device >= 64) return false;
  // int coordinates for TMA and the tile grid; 16-byte aligned rows for TMA.
  if (M <= 0 || N <= 0 || K <= 0 || M > INT_MAX / 2 || N > INT_MAX / 2 || K > INT_MAX / 2) return false;
  if (lda % 16 != 0 || ldw % 16 != 0 || reinterpret_cast<std::uintptr_t>(a) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(w) % 16 != 0)
    return false;
  // Which kernel (docs/benchmarks.md, twenty-ninth session, call 4, H200,
  // N = K = 4096: the fused kernels alone against cuBLASLt's GEMM alone; the
  // fused path also saves the epilogue pass):
  // - below half a wave of 128 x 128 tiles, cuBLASLt (it splits K over idle
  //   SMs; the fused kernel's time per tile is fixed);
  // - then 128 x 128 tiles in ping-pong, which hides the epilogue behind the
  //   other consumer's main loop (M = 512: 0.0168 ms vs 0.0276; M = 1024:
  //   0.0292 vs 0.0379);
  // - where 128 x 256 tiles fill the SMs, those, cooperative: a stage of
  //   48 KiB feeds twice the wgmma work of a 128 x 128 stage of 32 KiB, and
  //   the stage fill bounds the narrower tile (4096^3: 0.1113 vs 0.0922 +
  //   the pass; 8192^3: 0.7968 vs 0.7540 + the pass).
  // This dispatch ran end to end in that call; the dev numbers say the
  // cooperative 128 x 128 kernel would also win from a quarter wave to one
  // wave (M = 128: 0.0144 vs 0.0147; M = 256: 0.0148 vs 0.0186), and ping-pong
  // at M = 2048 (0.0562 vs 0.0589): not yet taken, not yet run end to end.
  using hopper_w8a8::Schedule;
  const std::int64_t tiles = ((M + kBM - 1) / kBM) * ((N + 127) / 128);
  const std::int64_t wide_tiles = ((M + kBM - 1) / kBM) * ((N + 255) / 256);
  const int sms = ::qgrad::cuda::multiprocessor_count(device);
  if (tiles < sms / 2) return false;
  if (wide_tiles >= sms) return launch<T, Config<256, 1, 4>>(device, a, lda, w, ldw, M, N, K, out);
  return launch<T, Config<128, 1, 7, Schedule::ping_pong>>(device, a, lda, w, ldw, M, N, K, out);
}

template bool qlinear_sm90a<float>(int, const std::int8_t*, std::int64_t, const std::int8_t*, std::int64_t,
                                   std::int64_t, std::int64_t, std::int64_t, const QLinearOut<float>&);
template bool qlinear_sm90a<double>(int, const std::int8_t*, std::int64_t, const std::int8_t*, std::int64_t,
                                    std::int64_t, std::int64_t, std::int64_t, const QLinearOut<double>&);
template bool qlinear_sm90a<bfloat16>(int, const std::int8_t*, std::int64_t, const std::int8_t*, std::int64_t,
                                      std::int64_t, std::int64_t, std::int64_t, const QLinearOut<bfloat16>&);
template bool qlinear_sm90a<half>(int, const std::int8_t*, std::int64_t, const std::int8_t*, std::int64_t,
                                  std::int64_t, std::int64_t, std::int64_t, const QLinearOut<half>&);

}  // namespace qgrad::kernels::cuda
