// Capturing a step into a CUDA graph: replay equals eager execution, the
// graph's memory is private, and host syncs are refused with a clear error.
#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

TEST_CASE("CudaGraph is unavailable without a device") {
  if (has_gpu()) return;
  CHECK_THROWS_AS(CudaGraph(0), Error);
}

TEST_CASE("CUDA: a captured step replays to the eager result") {
  QGRAD_REQUIRE_GPU();
  Generator g(21);
  const TensorOptions on_gpu = TensorOptions{}.with_device(Device::cuda());
  Tensor a = randn({1000}, g, on_gpu), b = randn({1000}, g, on_gpu);
  Tensor out = zeros({1000}, on_gpu);
  auto step = [&] { out.copy_(add(mul(a, b), a)); };
  CudaGraph graph;
  graph.capture(step);
  CHECK(graph.captured());
  poison(out);
  graph.replay();
  CHECK(bit_equal(out, add(mul(a, b), a)));
  // New inputs are picked up by copying into the captured tensors.
  Tensor a2 = randn({1000}, g, on_gpu);
  a.copy_(a2);
  graph.replay();
  CHECK(bit_equal(out, add(mul(a2, b), a2)));
  CHECK_THROWS_AS(graph.capture(step), Error);  // one capture per graph
}

TEST_CASE("CUDA: memory freed inside a capture is not handed to eager code") {
  QGRAD_REQUIRE_GPU();
  Generator g(22);
  const TensorOptions on_gpu = TensorOptions{}.with_device(Device::cuda());
  Tensor a = randn({4096}, g, on_gpu);
  Tensor out = zeros({4096}, on_gpu);
  void* temp_ptr = nullptr;
  CudaGraph graph;
  graph.capture([&] {
    Tensor temp = mul(a, 3.0);  // freed at the end of the step, inside the capture
    temp_ptr = temp.data_ptr();
    out.copy_(add(temp, a));
  });
  Tensor eager = randn({4096}, g, on_gpu);  // same size: must not reuse the graph's block
  CHECK(eager.data_ptr() != temp_ptr);
  Tensor keep = eager.clone();
  graph.replay();
  cuda_synchronize();
  CHECK(bit_equal(eager, keep));
  CHECK(bit_equal(out, add(mul(a, 3.0), a)));
}

TEST_CASE("CUDA: a host sync inside a captured step is a clear error") {
  QGRAD_REQUIRE_GPU();
  Tensor a = ones({8}, TensorOptions{}.with_device(Device::cuda()));
  CudaGraph graph;
  CHECK_THROWS_WITH_AS(graph.capture([&] { (void)a.to_vector<float>(); }), doctest::Contains("captured"), Error);
  CHECK(!graph.captured());
  CHECK(!cuda_is_capturing());
  // The device is usable afterwards.
  CHECK(add(a, a).to_vector<float>()[0] == 2.0f);
}
