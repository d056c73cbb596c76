// dev/cuda/attention_masked_backward.cu: the attention output's fake-quant
// mask in packed_attention's backward (issue #13 item 5, the ViT step). Two
// ways to the same dqkv bits at the ViT's shape (B = 256, L = 49, 4 heads of
// 32, f32), from the same saved state and mask:
//   composed  kernels::masked_gradient (dy * bit into a temporary), then
//             packed_attention_backward reading that temporary (the graph
//             before packed_attention_fake_quantize_dynamic);
//   fused     packed_attention_backward reading dy through the mask (dout_mask).
// Checks the two give the same bytes, then times each (10 back-to-back a
// rep, median of 30 reps, CUDA events). Run by hand on the GPU machine:
//   build-gpu/dev/dev_attention_masked_backward
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../../bench/bench_common.h"
#include "qgrad/kernels/attention.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/deferred.h"
#include "qgrad/kernels/lowbit.h"

using namespace qgrad;

int main() {
  if (cuda_device_count() == 0) {
    std::printf("dev_attention_masked_backward: no CUDA device\n");
    return 0;
  }
  const std::int64_t B = 256, L = 49, H = 4, Dh = 32, W = H * Dh;
  const kernels::PackedAttention a{.batch = B, .L = L, .heads = H, .head_dim = Dh, .scale = 1.0 / std::sqrt(32.0)};
  Generator g(7);
  const TensorOptions f32 = TensorOptions{}.with_dtype(DType::f32).with_device(Device::cuda());
  Tensor qkv = randn({B, L, 3 * W}, g, f32), dy = randn({B, L, W}, g, f32);
  Tensor out = Tensor::empty({B, L, W}, f32), fq = Tensor::empty({B, L, W}, f32);
  Tensor row_max = Tensor::empty({B, H, L}, f32), row_sum = Tensor::empty({B, H, L}, f32);
  Tensor mask = Tensor::empty({bitmask_words(B * L * W)}, TensorOptions{}.with_dtype(DType::s32).with_device(Device::cuda()));
  auto* words = static_cast<std::uint32_t*>(mask.data_ptr());
  kernels::packed_attention_forward(qkv, out, row_max, row_sum, a);
  // A mask with clipped elements: the per-token fake quant over a narrow range.
  if (!kernels::fake_quantize_dynamic_rows(out, fq, words, W, -16, 15, false, 1e-7f)) {
    std::printf("dev_attention_masked_backward: no row kernel\n");
    return 1;
  }
  Tensor masked = Tensor::empty({B, L, W}, f32), d0 = Tensor::empty(qkv.shape(), f32), d1 = Tensor::empty(qkv.shape(), f32);
  auto composed = [&] {
    kernels::masked_gradient(dy, mask, masked, nullptr);
    kernels::packed_attention_backward(qkv, masked, row_max, row_sum, d0, a);
  };
  auto fused = [&] { kernels::packed_attention_backward(qkv, dy, row_max, row_sum, d1, a, words); };
  composed();
  fused();
  const std::vector<float> h0 = d0.cpu().to_vector<float>(), h1 = d1.cpu().to_vector<float>();
  const bool same = std::memcmp(h0.data(), h1.data(), h0.size() * sizeof(float)) == 0;
  std::printf("same bytes: %s\n", same ? "yes" : "NO");
  for (int round = 0; round < 2; ++round) {
    const bench::Timing tc = bench::time_cuda([&](int) { for (int i = 0; i < 10; ++i) composed(); }, 30, 3);
    const bench::Timing tf = bench::time_cuda([&](int) { for (int i = 0; i < 10; ++i) fused(); }, 30, 3);
    std::printf("round %d: composed %.2f us, fused %.2f us a backward (median; min %.2f / %.2f)\n", round,
                tc.median_ms * 100.0, tf.median_ms * 100.0, tc.min_ms * 100.0, tf.min_ms * 100.0);
  }
  return same ? 0 : 1;
}
