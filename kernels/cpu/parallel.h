// A parallel loop for CPU kernels: OpenMP over large ranges, serial below
// a grain so small tensors skip the fork cost. Element order within each
// index is fixed, so results never depend on the thread count.
#pragma once

#include <cstdint>

namespace qgrad::kernels::cpu {

inline constexpr std::int64_t kParallelGrain = 32768;

// `grain`: the fewest iterations worth a thread team; pass a smaller one
// when each iteration is a block of many elements.
template <class F>
void parallel_for(std::int64_t n, F&& body, std::int64_t grain = kParallelGrain) {
#if defined(_OPENMP)
  if (n >= grain && n > 1) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#else
  (void)grain;
#endif
  for (std::int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace qgrad::kernels::cpu
