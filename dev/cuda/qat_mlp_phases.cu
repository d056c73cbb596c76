// Where the fused QAT MLP kernel (kernels/cuda/qat_mlp.cu) spends its time:
// block 0 stamps %globaltimer after each grid barrier (qat_mlp_record_phases),
// so each phase's figure includes the barrier that ends it. Runs the
// benchmark's model (bench/qat_mlp.h with the fused step) eagerly and prints
// the median µs of each phase over 50 steps, and the kernel's total.
// Run by hand on the GPU machine:  build-gpu/dev/dev_qat_mlp_phases [B H]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../bench/qat_mlp.h"

// kernels/cuda/entries.h's declaration (that header's formulas clash with
// qgrad.h's ops in one translation unit).
namespace qgrad::kernels::cuda {
void qat_mlp_record_phases(std::uint64_t* device_words);
}

using namespace qgrad;

int main(int argc, char** argv) {
  const std::int64_t batch = argc > 1 ? std::atoll(argv[1]) : 256, hidden = argc > 2 ? std::atoll(argv[2]) : 256;
  const Device dev = Device::cuda();
  Generator gen(1);
  bench::QatMlp t(dev, hidden, gen, 0.01, true);
  const Tensor x = randn({batch, 784}, gen, TensorOptions{}.with_device(dev));
  const Tensor y = randint(0, 10, {batch}, gen, TensorOptions{}.with_dtype(DType::s64).with_device(dev));
  for (int i = 0; i < 5; ++i) t.step(x, y);
  constexpr int kStamps = 9, kSteps = 50;  // 2L + 3 for three layers
  std::uint64_t* words = nullptr;
  cudaMalloc(&words, kStamps * sizeof(std::uint64_t));
  kernels::cuda::qat_mlp_record_phases(words);
  std::vector<std::vector<double>> us(kStamps);
  for (int s = 0; s < kSteps; ++s) {
    cudaMemset(words, 0, kStamps * sizeof(std::uint64_t));
    t.step(x, y);
    cudaDeviceSynchronize();
    std::uint64_t h[kStamps];
    cudaMemcpy(h, words, sizeof h, cudaMemcpyDeviceToHost);
    for (int k = 1; k < kStamps; ++k) us[k].push_back(static_cast<double>(h[k] - h[k - 1]) / 1000.0);
    us[0].push_back(static_cast<double>(h[kStamps - 1] - h[0]) / 1000.0);
  }
  kernels::cuda::qat_mlp_record_phases(nullptr);
  const char* names[kStamps] = {"total", "weights + x range", "layer 1", "layer 2", "layer 3", "loss",
                                "backward 3", "backward 2", "backward 1 (no barrier)"};
  std::printf("qat_mlp phases, b%lld h%lld, median of %d steps (us):\n", static_cast<long long>(batch),
              static_cast<long long>(hidden), kSteps);
  for (int k = 0; k < kStamps; ++k) {
    std::sort(us[k].begin(), us[k].end());
    std::printf("  %-26s %8.2f\n", names[k], us[k][us[k].size() / 2]);
  }
  cudaFree(words);
  return 0;
}
