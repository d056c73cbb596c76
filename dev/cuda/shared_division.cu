// formulas::SharedDivisor's fast quotient (kernels/formulas/division.h: the
// reciprocal r = RN(1 / d) taken once, then q0 = RN(x r) and two fma
// corrections) against the IEEE division __fdiv_rn(x, d), bit for bit.
// Within the sequence's range (|d| in [2^-32, 2^32], |x| in [2^-90, 2^90])
// every step scales exactly with the operands' exponents, so the mantissas
// decide: the program takes `divisors` divisor mantissas (every
// 2^23 / divisors-th one, plus 1.0, all ones and their neighbours) and, for
// each, every one of the 2^23 dividend mantissas, both signs, at exponents
// picked to reach the range's ends (x near 2^-90 and 2^90, d near 2^-32 and
// 2^32) as well as its middle. Prints the pairs tried and the mismatches
// (the first few in full). Run by hand on the GPU machine:
//   build-gpu/dev/dev_shared_division [divisors]   (default 65536; 8388608 is every mantissa)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/formulas/division.h"

namespace {

using qgrad::formulas::SharedDivisor;

__device__ float from_bits(std::uint32_t u) { return __uint_as_float(u); }

struct Mismatch {
  float x, d, fast, ieee;
};

// Exponent pairs (of x, of d) every divisor is tried at: the middle and the
// range's four corners (quotients from 2^-122 to 2^122).
__constant__ int kExponents[5][2] = {{0, 0}, {-90, -32}, {-90, 31}, {89, -32}, {89, 31}};

__global__ void check(const std::uint32_t* divisor_mantissas, int divisors, unsigned long long* tried,
                      unsigned long long* mismatches, Mismatch* first, int first_cap) {
  unsigned long long local_tried = 0, local_bad = 0;
  for (int di = blockIdx.y; di < divisors; di += gridDim.y) {
    const std::uint32_t dm = divisor_mantissas[di];
    for (int e = 0; e < 5; ++e) {
      const std::uint32_t xe = static_cast<std::uint32_t>(kExponents[e][0] + 127) << 23;
      const std::uint32_t de = static_cast<std::uint32_t>(kExponents[e][1] + 127) << 23;
      for (std::uint32_t sign = 0; sign < 2; ++sign) {
        const float d = from_bits(de | dm | (sign << 31));
        const SharedDivisor<float> s = SharedDivisor<float>::of(d);
        if (!s.fast) continue;  // not expected inside the range: counted as untried
        for (std::uint32_t xm = blockIdx.x * blockDim.x + threadIdx.x; xm < (1u << 23);
             xm += gridDim.x * blockDim.x) {
          const float x = from_bits(xe | xm);
          const float fast = s.fast_quotient(x), ieee = __fdiv_rn(x, d);
          ++local_tried;
          if (__float_as_uint(fast) != __float_as_uint(ieee)) {
            ++local_bad;
            const unsigned long long k = atomicAdd(mismatches, 1ull);
            if (k < static_cast<unsigned long long>(first_cap)) first[k] = {x, d, fast, ieee};
          }
        }
      }
    }
  }
  atomicAdd(tried, local_tried);
  (void)local_bad;
}

}  // namespace

int main(int argc, char** argv) {
  const int divisors = argc > 1 ? std::atoi(argv[1]) : 65536;
  if (divisors < 1 || divisors > (1 << 23)) {
    std::fprintf(stderr, "divisors: 1 .. 8388608\n");
    return 2;
  }
  std::vector<std::uint32_t> mant;
  const std::uint32_t step = (1u << 23) / static_cast<std::uint32_t>(divisors);
  for (std::uint32_t m = 0; m < (1u << 23) && mant.size() < static_cast<std::size_t>(divisors); m += step)
    mant.push_back(m);
  for (std::uint32_t m : {0u, 1u, 2u, 0x7fffffu, 0x7ffffeu, 0x400000u, 0x3fffffu, 0x555555u, 0x2aaaaau})
    mant.push_back(m);
  std::uint32_t* dm = nullptr;
  unsigned long long *tried = nullptr, *bad = nullptr;
  Mismatch* first = nullptr;
  constexpr int kFirst = 16;
  QGRAD_CUDA_CHECK(cudaMalloc(&dm, mant.size() * sizeof(std::uint32_t)));
  QGRAD_CUDA_CHECK(cudaMalloc(&tried, sizeof(unsigned long long)));
  QGRAD_CUDA_CHECK(cudaMalloc(&bad, sizeof(unsigned long long)));
  QGRAD_CUDA_CHECK(cudaMalloc(&first, kFirst * sizeof(Mismatch)));
  QGRAD_CUDA_CHECK(cudaMemcpy(dm, mant.data(), mant.size() * sizeof(std::uint32_t), cudaMemcpyHostToDevice));
  QGRAD_CUDA_CHECK(cudaMemset(tried, 0, sizeof(unsigned long long)));
  QGRAD_CUDA_CHECK(cudaMemset(bad, 0, sizeof(unsigned long long)));
  cudaEvent_t t0, t1;
  QGRAD_CUDA_CHECK(cudaEventCreate(&t0));
  QGRAD_CUDA_CHECK(cudaEventCreate(&t1));
  QGRAD_CUDA_CHECK(cudaEventRecord(t0));
  check<<<dim3(64, 1024), 256>>>(dm, static_cast<int>(mant.size()), tried, bad, first, kFirst);
  QGRAD_CUDA_CHECK(cudaGetLastError());
  QGRAD_CUDA_CHECK(cudaEventRecord(t1));
  QGRAD_CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  QGRAD_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  unsigned long long n_tried = 0, n_bad = 0;
  QGRAD_CUDA_CHECK(cudaMemcpy(&n_tried, tried, sizeof n_tried, cudaMemcpyDeviceToHost));
  QGRAD_CUDA_CHECK(cudaMemcpy(&n_bad, bad, sizeof n_bad, cudaMemcpyDeviceToHost));
  std::printf("divisor mantissas %zu, pairs tried %llu (expected %llu), mismatches %llu, %.1f ms\n", mant.size(),
              n_tried, static_cast<unsigned long long>(mant.size()) * 5ull * 2ull * (1ull << 23), n_bad, ms);
  Mismatch h[kFirst];
  QGRAD_CUDA_CHECK(cudaMemcpy(h, first, sizeof h, cudaMemcpyDeviceToHost));
  for (unsigned long long k = 0; k < n_bad && k < static_cast<unsigned long long>(kFirst); ++k)
    std::printf("  x %a d %a fast %a ieee %a\n", h[k].x, h[k].d, h[k].fast, h[k].ieee);
  return n_bad == 0 && n_tried == static_cast<unsigned long long>(mant.size()) * 10ull * (1ull << 23) ? 0 : 1;
}
