// Shared by the dev programs (compiled anywhere with nvcc, run by hand on the
// GPU machine): a CUDA error check that exits, f32 test data to and from the
// device, the median of 21 replays of a captured graph (the first replay is
// dropped), and with it the time of one call of `launch`, 50 calls captured
// in a CUDA graph, and the nodes one call adds to a captured graph.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define DEV_CHECK_CUDA(x)                                                                  \
  do {                                                                                     \
    const cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// n uniform floats in [-scale, scale) from seed, on the device (cudaFree them).
inline float* dev_random(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> h(n);
  for (auto& v : h) v = d(rng);
  float* p = nullptr;
  DEV_CHECK_CUDA(cudaMalloc(&p, n * sizeof(float)));
  DEV_CHECK_CUDA(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}

inline std::vector<float> to_host(const float* p, std::size_t n) {
  std::vector<float> h(n);
  DEV_CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// Median ms of 21 replays on stream s (one more first, dropped): replay()
// enqueues one replay of a captured graph.
template <class R>
double replay_median_ms(cudaStream_t s, R replay) {
  cudaEvent_t a, b;
  DEV_CHECK_CUDA(cudaEventCreate(&a));
  DEV_CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int rep = 0; rep < 22; ++rep) {
    DEV_CHECK_CUDA(cudaEventRecord(a, s));
    replay();
    DEV_CHECK_CUDA(cudaEventRecord(b, s));
    DEV_CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    DEV_CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    if (rep > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  DEV_CHECK_CUDA(cudaEventDestroy(a));
  DEV_CHECK_CUDA(cudaEventDestroy(b));
  return ms[ms.size() / 2];
}

// The nodes one launch(s) adds to a captured graph.
template <class F>
std::size_t nodes_of(F launch) {
  cudaStream_t s;
  DEV_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  DEV_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  launch(s);
  DEV_CHECK_CUDA(cudaStreamEndCapture(s, &g));
  std::size_t n = 0;
  DEV_CHECK_CUDA(cudaGraphGetNodes(g, nullptr, &n));
  DEV_CHECK_CUDA(cudaGraphDestroy(g));
  DEV_CHECK_CUDA(cudaStreamDestroy(s));
  return n;
}

// launch(stream) enqueues one call; returns microseconds a call.
template <class F>
double graph_us(F launch) {
  cudaStream_t s;
  DEV_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr int kCalls = 50;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  DEV_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kCalls; ++i) launch(s);
  DEV_CHECK_CUDA(cudaStreamEndCapture(s, &g));
  DEV_CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
  const double ms = replay_median_ms(s, [&] { DEV_CHECK_CUDA(cudaGraphLaunch(ge, s)); });
  DEV_CHECK_CUDA(cudaGraphExecDestroy(ge));
  DEV_CHECK_CUDA(cudaGraphDestroy(g));
  DEV_CHECK_CUDA(cudaStreamDestroy(s));
  return ms * 1000.0 / kCalls;
}
