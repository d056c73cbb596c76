// CUDA out-of-memory inside a training step: qgrad::OutOfMemory, and the
// program goes on once memory is freed.
#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

// One SGD step of a small MLP; returns the loss (a host sync, outside any capture).
double train_step(Tensor& w1, Tensor& w2, const Tensor& x, const Tensor& labels) {
  Tensor loss = cross_entropy(linear(relu(linear(x, w1)), w2), labels);
  loss.backward();
  {
    NoGradGuard no_grad;
    w1.copy_(sub(w1, mul(w1.grad(), 0.1)));
    w2.copy_(sub(w2, mul(w2.grad(), 0.1)));
  }
  w1.zero_grad();
  w2.zero_grad();
  return loss.item();
}

}  // namespace

TEST_CASE("CUDA: out of memory in a training step throws OutOfMemory and the program continues") {
  QGRAD_REQUIRE_GPU();
  Generator g(77);
  const TensorOptions on_gpu = TensorOptions{}.with_device(Device::cuda());
  Tensor w1 = randn({64, 32}, g, on_gpu, 0.0, 0.2), w2 = randn({10, 64}, g, on_gpu, 0.0, 0.2);
  w1.set_requires_grad(true);
  w2.set_requires_grad(true);
  Tensor x = randn({128, 32}, g, on_gpu);
  Tensor labels = randint(0, 10, {128}, g, TensorOptions{}.with_dtype(DType::s64).with_device(Device::cuda()));
  const double first = train_step(w1, w2, x, labels);  // warm-up: handles and workspaces exist
  REQUIRE(std::isfinite(first));

  // Take every byte the device will give, in shrinking chunks.
  std::vector<Tensor> hog;
  int ooms = 0;
  for (std::int64_t chunk = std::int64_t(1) << 31; chunk >= (1 << 16); chunk /= 4) {
    for (;;) {
      try {
        hog.push_back(Tensor::empty({chunk}, on_gpu));
      } catch (const OutOfMemory&) {
        ++ooms;
        break;
      }
    }
  }
  REQUIRE(ooms > 0);
  MESSAGE("held ", hog.size(), " blocks, ", cuda_allocator_stats().bytes_in_use >> 20, " MiB");
  // A bigger batch needs fresh memory: the step fails with OutOfMemory.
  Tensor big_x = Tensor();
  CHECK_THROWS_AS(
      {
        Tensor bx = randn({1 << 16, 32}, g, TensorOptions{});
        big_x = bx.to(Device::cuda());
        (void)train_step(w1, w2, big_x, randint(0, 10, {1 << 16}, g, TensorOptions{}.with_dtype(DType::s64)).cuda());
      },
      OutOfMemory);
  // Free the memory: training goes on, with finite losses.
  hog.clear();
  big_x = Tensor();
  w1.zero_grad();
  w2.zero_grad();
  cuda_empty_cache();
  double loss = 0;
  for (int i = 0; i < 5; ++i) loss = train_step(w1, w2, x, labels);
  CHECK(std::isfinite(loss));
  CHECK(loss < first);
}
