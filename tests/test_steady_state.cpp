// Steady state: 10,000 training steps of a small MLP (SGD with momentum)
// must not grow host memory (RSS from /proc/self/statm after a warm-up vs
// at the end) and, on a GPU, must not grow the caching allocator's bytes in
// use, bytes reserved or number of cudaMallocs after the warm-up.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <cstdio>

#include "helpers.h"
#include "qgrad/nn/nn.h"

using namespace qgrad;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;  // ASan's quarantine holds freed memory: RSS grows by design
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

long rss_kib() {
  long pages = 0, resident = 0;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? resident * (::sysconf(_SC_PAGESIZE) / 1024) : -1;
}

struct Trainer {
  Generator gen{77};
  nn::Sequential model;
  std::unique_ptr<nn::SGD> opt;
  Tensor x, y;
  explicit Trainer(Device device) {
    model.emplace_back<nn::Linear>(8, 16, gen);
    model.emplace_back<nn::ReLU>();
    model.emplace_back<nn::Linear>(16, 4, gen);
    model.to(device);
    opt = std::make_unique<nn::SGD>(model.named_parameters(), nn::SGDOptions{.lr = 0.01, .momentum = 0.9});
    x = randn({4, 8}, gen).to(device);
    y = Tensor::from_vector<std::int64_t>({0, 1, 2, 3}, {4}, device);
  }
  void step() {
    opt->zero_grad();
    Tensor loss = cross_entropy(model(x), y);
    loss.backward();
    opt->step();
  }
};

}  // namespace

TEST_CASE("steady state: 10,000 CPU training steps do not grow host memory") {
  Trainer t(Device::cpu());
  const int warmup = 500, steps = 10000;
  for (int i = 0; i < warmup; ++i) t.step();
  const long before = rss_kib();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) t.step();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long after = rss_kib();
  const double loss = cross_entropy(t.model(t.x), t.y).item();
  MESSAGE(steps, " steps in ", secs, " s; RSS after warm-up ", before, " KiB, at the end ", after, " KiB; loss ", loss);
  CHECK(std::isfinite(loss));
  REQUIRE(before > 0);
  if (kAsan) {
    MESSAGE("AddressSanitizer build: its quarantine keeps freed memory, RSS not compared");
  } else {
    CHECK(after - before <= 1024);  // 1 MiB of slack (allocator and stdio noise)
  }
}

TEST_CASE("steady state: 10,000 CUDA training steps do not grow the caching allocator (GPU)") {
  QGRAD_REQUIRE_GPU();
  Trainer t(Device::cuda(0));
  for (int i = 0; i < 500; ++i) t.step();
  (void)cross_entropy(t.model(t.x), t.y).item();  // sync
  const AllocatorStats a = cuda_allocator_stats(0);
  const long rss_before = rss_kib();
  for (int i = 0; i < 10000; ++i) t.step();
  const double loss = cross_entropy(t.model(t.x), t.y).item();
  const AllocatorStats b = cuda_allocator_stats(0);
  const long rss_after = rss_kib();
  MESSAGE("bytes_in_use ", a.bytes_in_use, " -> ", b.bytes_in_use, ", bytes_reserved ", a.bytes_reserved, " -> ",
          b.bytes_reserved, ", device mallocs ", a.num_device_mallocs, " -> ", b.num_device_mallocs, ", RSS ",
          rss_before, " -> ", rss_after, " KiB; loss ", loss);
  CHECK(std::isfinite(loss));
  CHECK(b.bytes_in_use <= a.bytes_in_use);
  CHECK(b.bytes_reserved == a.bytes_reserved);
  CHECK(b.num_device_mallocs == a.num_device_mallocs);
  if (!kAsan) CHECK(rss_after - rss_before <= 4096);
}
