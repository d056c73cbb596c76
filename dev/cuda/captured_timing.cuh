// For the dev programs that time library ops: `calls` calls of call()
// captured in one qgrad::CudaGraph (on the device's stream, the library's
// allocations from the graph's pool), median of 21 replays, µs a call.
#pragma once

#include "graph_timing.cuh"
#include "qgrad/core/cuda/common.cuh"
#include "qgrad/core/device.h"

template <class F>
double captured_us(F call, int calls = 20) {
  qgrad::CudaGraph g(0);
  g.capture([&] {
    for (int i = 0; i < calls; ++i) call();
  });
  return replay_median_ms(::qgrad::cuda::stream(0), [&] { g.replay(); }) * 1000.0 / calls;
}
