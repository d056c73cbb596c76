// Builds a small graph with the installed qgrad, runs backward and checks the
// gradient: d/dx sum((x + x) * x) = 4x.
#include <cstdio>
#include <vector>

#include <qgrad/qgrad.h>

int main() {
  using namespace qgrad;
  Tensor x = Tensor::from_vector<float>({1.5f, -2.0f, 0.25f}, {3});
  x.set_parameter("x");
  Tensor y = mul(add(x, x), x);
  y.backward(ones({3}));
  const std::vector<float> g = x.grad().to_vector<float>();
  const std::vector<float> want{6.0f, -8.0f, 1.0f};
  std::printf("qgrad consumer: y = [%g, %g, %g], dy/dx = [%g, %g, %g] (CUDA backend %s, devices %d)\n",
              static_cast<double>(y.to_vector<float>()[0]), static_cast<double>(y.to_vector<float>()[1]),
              static_cast<double>(y.to_vector<float>()[2]), static_cast<double>(g[0]), static_cast<double>(g[1]),
              static_cast<double>(g[2]), QGRAD_WITH_CUDA ? "on" : "off", cuda_device_count());
  if (g != want) {
    std::printf("qgrad consumer: FAILED, expected dy/dx = [6, -8, 1]\n");
    return 1;
  }
  try {
    (void)add(x, ones({4}));
    std::printf("qgrad consumer: FAILED, a shape mismatch did not throw\n");
    return 1;
  } catch (const Error& e) {
    std::printf("qgrad consumer: errors arrive as qgrad::Error (%s)\n", e.what());
  }
  std::printf("qgrad consumer: OK\n");
  return 0;
}
