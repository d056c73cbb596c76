// Tensor core: dtypes, shapes, views, conversions, factories, generator.
#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

TEST_CASE("dtype sizes and names") {
  CHECK(dtype_size(DType::f32) == 4);
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::s64) == 8);
  CHECK(dtype_size(DType::boolean) == 1);
  CHECK(dtype_from_name("u8") == DType::u8);
  CHECK_THROWS_AS(dtype_from_name("f8"), Error);
}

TEST_CASE("half and bfloat16 round to nearest even, specials kept") {
  CHECK(float(half(1.0f)) == 1.0f);
  CHECK(half(65504.0f).bits == 0x7bff);
  CHECK(half(65520.0f).bits == 0x7c00);            // rounds up to inf
  CHECK(half(1.0f + 1.0f / 2048).bits == 0x3c00);  // tie, to even
  CHECK(half(1.0f + 3.0f / 2048).bits == 0x3c02);  // tie, to even (up)
  CHECK(half(5.9604644775390625e-8f).bits == 0x0001);
  CHECK(half(2.98023223876953125e-8f).bits == 0x0000);  // exactly half the smallest subnormal: to even
  CHECK(std::isnan(float(half(NAN))));
  CHECK(float(half(-INFINITY)) == -INFINITY);
  CHECK(bfloat16(1.00390625f).bits == 0x3f80);  // tie to even
  CHECK(bfloat16(1.01171875f).bits == 0x3f82);
  CHECK(std::isnan(float(bfloat16(NAN))));
  // Every half value survives a round trip through float.
  for (unsigned b = 0; b < 0x10000; ++b) {
    const half h = half::from_bits(static_cast<std::uint16_t>(b));
    const float f = float(h);
    if (std::isnan(f)) continue;
    REQUIRE(half(f).bits == b);
  }
}

TEST_CASE("from_vector / to_vector round trip and shape checks") {
  auto t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.numel() == 6);
  CHECK(t.size(-1) == 3);
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK_THROWS_AS(Tensor::from_vector<float>({1, 2}, {3}), Error);
  CHECK_THROWS_AS(t.to_vector<double>(), Error);
  CHECK_THROWS_AS(t.size(2), Error);
}

TEST_CASE("reshape is a view, infers -1 and rejects bad shapes") {
  auto t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto r = t.reshape({3, -1});
  CHECK(r.shape() == Shape{3, 2});
  CHECK(r.data_ptr() == t.data_ptr());
  CHECK(t.flatten().shape() == Shape{6});
  CHECK_THROWS_AS(t.reshape({4, -1}), Error);
  CHECK_THROWS_AS(t.reshape({-1, -1}), Error);
  CHECK_THROWS_AS(t.reshape({7}), Error);
}

TEST_CASE("shape element counts that overflow int64 are rejected") {
  CHECK_THROWS_AS(Tensor::empty({1LL << 40, 1LL << 40}), Error);
  CHECK_THROWS_AS(Tensor::empty({-1}), Error);
}

TEST_CASE("dtype conversion: float to integer truncates, saturates, NaN to 0") {
  auto t = Tensor::from_vector<float>({1.7f, -1.7f, 300.f, -300.f, NAN, INFINITY}, {6});
  CHECK(t.to(DType::s8).to_vector<std::int8_t>() == std::vector<std::int8_t>{1, -1, 127, -128, 0, 127});
  CHECK(t.to(DType::u8).to_vector<std::uint8_t>() == std::vector<std::uint8_t>{1, 0, 255, 0, 0, 255});
  auto b = Tensor::from_vector<float>({0.f, 2.f}, {2}).to(DType::boolean).to_vector<bool>();
  CHECK(b == std::vector<bool>{false, true});
  auto h = Tensor::from_vector<float>({1.f / 3}, {1}).to(DType::f16).to(DType::f32).to_vector<float>();
  CHECK(h[0] == float(half(1.f / 3)));
}

TEST_CASE("factories: zeros, ones, full, arange") {
  CHECK(zeros({3}).to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(ones({2}, TensorOptions{}.with_dtype(DType::s32)).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 1});
  CHECK(full({2}, 2.5, TensorOptions{}.with_dtype(DType::f64)).to_vector<double>() == std::vector<double>{2.5, 2.5});
  CHECK(arange(0, 5, 2).to_vector<float>() == std::vector<float>{0, 2, 4});
  CHECK(arange(3, 0, -1, TensorOptions{}.with_dtype(DType::s64)).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{3, 2, 1});
  CHECK_THROWS_AS(arange(0, 1, 0), Error);
}

TEST_CASE("generator: seeded, reproducible, advancing, in range") {
  Generator g1(42), g2(42), g3(43);
  auto a = rand({1000}, g1);
  auto b = rand({1000}, g2);
  auto c = rand({1000}, g3);
  CHECK(bit_equal(a, b));
  CHECK(!bit_equal(a, c));
  auto a2 = rand({1000}, g1);
  CHECK(!bit_equal(a, a2));
  auto v = a.to_vector<float>();
  double mean = 0;
  for (float x : v) {
    REQUIRE(x >= 0.f);
    REQUIRE(x < 1.f);
    mean += x;
  }
  CHECK(mean / 1000 == doctest::Approx(0.5).epsilon(0.05));
  Generator gn(7);
  auto n = randn({4000}, gn, TensorOptions{}.with_dtype(DType::f64)).to_vector<double>();
  double m = 0, s = 0;
  for (double x : n) m += x;
  m /= 4000;
  for (double x : n) s += (x - m) * (x - m);
  CHECK(m == doctest::Approx(0).epsilon(0.05).scale(1));
  CHECK(std::sqrt(s / 4000) == doctest::Approx(1).epsilon(0.05));
  Generator gi(1);
  for (auto x : randint(-3, 4, {500}, gi, TensorOptions{}.with_dtype(DType::s64)).to_vector<std::int64_t>()) {
    REQUIRE(x >= -3);
    REQUIRE(x < 4);
  }
}

TEST_CASE("CUDA: transfers round trip and the generator matches the CPU") {
  QGRAD_REQUIRE_GPU();
  Generator g1(5), g2(5);
  auto cpu = rand({4097}, g1, TensorOptions{}, -2, 3);
  auto gpu = rand({4097}, g2, TensorOptions{}.with_device(Device::cuda()), -2, 3);
  CHECK(gpu.device() == Device::cuda());
  CHECK(bit_equal(cpu, gpu));
  CHECK(bit_equal(gpu.cpu(), cpu));
  Generator g3(9), g4(9);
  CHECK(bit_equal(randn({999}, g3), randn({999}, g4, TensorOptions{}.with_device(Device::cuda()))));
  // Every dtype conversion agrees bit for bit between the devices.
  Tensor wide = rand({4097}, g1, TensorOptions{}, -300, 300);
  for (DType dt : {DType::f64, DType::f16, DType::bf16, DType::s8, DType::u8, DType::s32, DType::s64, DType::boolean}) {
    Tensor on_gpu = wide.cuda().to(dt);
    CHECK(on_gpu.device() == Device::cuda());
    CHECK(bit_equal(on_gpu, wide.to(dt)));
  }
}

TEST_CASE("CUDA: allocator caches blocks and keeps statistics") {
  QGRAD_REQUIRE_GPU();
  cuda_synchronize();
  { Tensor warm = zeros({1 << 20}, TensorOptions{}.with_device(Device::cuda())); }
  const AllocatorStats before = cuda_allocator_stats();
  for (int i = 0; i < 100; ++i) {
    Tensor t = zeros({1 << 20}, TensorOptions{}.with_device(Device::cuda()));
    REQUIRE(cuda_allocator_stats().bytes_in_use >= (4 << 20));
  }
  const AllocatorStats after = cuda_allocator_stats();
  CHECK(after.num_device_mallocs == before.num_device_mallocs);  // steady state: no cudaMalloc
  CHECK(after.num_cache_hits >= before.num_cache_hits + 100);
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.peak_bytes_in_use >= (4 << 20));
}

TEST_CASE("CUDA: the side stream: launches go there in its scope, blocks freed before the join are held") {
  // core/device.h SideStreamScope: between a fork and its join a freed block
  // is not handed out again (a side kernel may still read it); at the join
  // it is, and its bytes leave bytes_in_use only then. A kernel on the side
  // stream sees what the main stream queued before the fork, and the main
  // stream sees the side's work after the join.
  QGRAD_REQUIRE_GPU();
  SideStream side_stream(true);
  const auto on = TensorOptions{}.with_device(Device::cuda());
  cuda_synchronize();
  Tensor a = full({1 << 20}, 3.0, on);  // main stream
  const std::uint64_t forks = cuda_side_stream_fork_count();
  void* freed = nullptr;
  Tensor b;
  long long in_use = 0;
  {
    SideStreamScope side(Device::cuda());
    CHECK(cuda_side_stream_fork_count() == forks + 1);
    b = mul(a, a);  // on the side stream, after a's fill
    Tensor scratch = full({1 << 20}, 1.0, on);
    freed = scratch.data_ptr();
    in_use = cuda_allocator_stats().bytes_in_use;
  }  // scratch freed: held
  CHECK(cuda_allocator_stats().bytes_in_use == in_use);
  {
    Tensor again = Tensor::empty({1 << 20}, on);
    CHECK(again.data_ptr() != freed);
  }
  cuda_join_side_streams();
  CHECK(cuda_allocator_stats().bytes_in_use < in_use);
  Tensor c = add(b, a);  // main stream, after the join
  CHECK(values(c) == std::vector<double>(1 << 20, 12.0));
  // Off: the scope does nothing.
  cuda_set_side_stream(false);
  { SideStreamScope side(Device::cuda()); }
  CHECK(cuda_side_stream_fork_count() == forks + 1);
}
