// Why tf32x3 (core/dtype.h Float32Matmul) gained little on the b4096 MLP
// step: under ncu (thirty-eighth session) the parameter-gradient GEMMs
// dW = dyᵀ · x, whose reduction runs over the batch (the rows of both
// operands, neither K-major), took cuBLAS's sm80 `cutlass_80_tensorop_s1688gemm`
// kernels (45-50 us each), the forward's K-major products the sm90 wgmma ones
// (30-38 us). Hopper's wgmma reads TF32 operands K-major only. This program
// times, at the step's GEMM shapes, one cuBLAS product three ways: f32 FMAs
// (the ieee path), TF32 in the library's layout, and TF32 on K-major copies
// of the operands (what a split pass that writes its parts transposed would
// hand cuBLAS), plus a tiled transpose of an operand (that pass's extra
// cost), each call_us below (graph_timing.cuh: 50 calls captured in a
// graph, median of 21 replays; the thirty-eighth session's table in
// docs/benchmarks.md was taken with 20 calls and 11 replays). It needs only
// cuBLAS and the dev headers, so it also builds with one nvcc line:
//   nvcc -O3 -arch=sm_90 dev/cuda/tf32_layouts.cu -lcublas -o tf32_layouts
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "graph_timing.cuh"
#include "lt_dev.cuh"

namespace {

// Row-major C[m, n] = op(A) · op(B) over k (A stored [k, m] when ta, B stored
// [n, k] when tb), through column-major cuBLAS as Cᵀ = op(B)ᵀ · op(A)ᵀ.
void gemm(cublasHandle_t h, cublasComputeType_t compute, bool ta, bool tb, int m, int n, int k, const float* A,
          const float* B, float* C) {
  const float one = 1.0f, zero = 0.0f;
  DEV_CHECK_BLAS(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, B,
                          CUDA_R_32F, tb ? k : n, A, CUDA_R_32F, ta ? m : k, &zero, C, CUDA_R_32F, n, compute,
                          CUBLAS_GEMM_DEFAULT));
}

// out [cols, rows] = in [rows, cols]ᵀ through 32 x 32 shared-memory tiles.
__global__ void transpose(const float* in, float* out, int rows, int cols) {
  __shared__ float tile[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  for (int dy = threadIdx.y; dy < 32; dy += 8) {
    const int r = blockIdx.y * 32 + dy;
    if (r < rows && c < cols) tile[dy][threadIdx.x] = in[static_cast<long>(r) * cols + c];
  }
  __syncthreads();
  const int r_out = blockIdx.x * 32;  // out row = in column
  for (int dy = threadIdx.y; dy < 32; dy += 8) {
    const int oc = blockIdx.y * 32 + threadIdx.x, orow = r_out + dy;
    if (orow < cols && oc < rows) out[static_cast<long>(orow) * rows + oc] = tile[threadIdx.x][dy];
  }
}

// µs of one `body(stream)` call (graph_timing.cuh: 50 calls captured, median
// of 21 replays), after one call outside capture (cuBLAS picks its kernel).
template <class F>
double call_us(F body) {
  body(static_cast<cudaStream_t>(nullptr));
  DEV_CHECK_CUDA(cudaDeviceSynchronize());
  return graph_us(body);
}

struct Shape {
  const char* name;
  int m, n, k;
  bool ta, tb;  // the library's layout (kernels::GemmShape)
};

}  // namespace

int main() {
  // The b4096 h1024 MLP step's f32 GEMMs of at least 2^27 multiply-adds.
  const Shape shapes[] = {
      {"fwd1 x·W1ᵀ", 4096, 1024, 784, false, true},   {"fwd2 h·W2ᵀ", 4096, 1024, 1024, false, true},
      {"dx2 dy·W2", 4096, 1024, 1024, false, false},  {"dW2 dyᵀ·h", 1024, 1024, 4096, true, false},
      {"dW1 dyᵀ·x", 1024, 784, 4096, true, false},
  };
  cublasHandle_t h;
  DEV_CHECK_BLAS(cublasCreate(&h));
  const std::size_t most = std::size_t(4096) * 4096;
  float* A = dev_random(most, 1);
  float* B = dev_random(most, 2);
  float* At = dev_random(most, 3);
  float* Bt = dev_random(most, 4);
  float* C = dev_random(most, 5);
  std::printf("%-12s %6s %6s %6s %6s | %9s %9s %9s %9s %9s\n", "gemm", "m", "n", "k", "layout", "f32_us", "tf32_us",
              "tf32_kmaj", "transp_us", "GFLOP");
  for (const Shape& sh : shapes) {
    // One product on stream st: in the library's layout, or (kmajor) on the K-major copies At
    // ([m, k], no trans) and Bt ([n, k], trans).
    auto product = [&](cublasComputeType_t compute, bool kmajor) {
      return [&, compute, kmajor](cudaStream_t st) {
        DEV_CHECK_BLAS(cublasSetStream(h, st));
        if (kmajor) gemm(h, compute, false, true, sh.m, sh.n, sh.k, At, Bt, C);
        else gemm(h, compute, sh.ta, sh.tb, sh.m, sh.n, sh.k, A, B, C);
      };
    };
    const double f32 = call_us(product(CUBLAS_COMPUTE_32F, false));
    const double tf32 = call_us(product(CUBLAS_COMPUTE_32F_FAST_TF32, false));
    const double kmaj = call_us(product(CUBLAS_COMPUTE_32F_FAST_TF32, true));
    // The transpose a K-major copy of a non-K-major operand costs (the larger operand).
    double tr = 0;
    if (sh.ta || !sh.tb) {
      const int rows = sh.k, cols = sh.ta ? sh.m : sh.n;
      const dim3 grid((cols + 31) / 32, (rows + 31) / 32), block(32, 8);
      tr = call_us([&](cudaStream_t st) { transpose<<<grid, block, 0, st>>>(A, At, rows, cols); });
    }
    std::printf("%-12s %6d %6d %6d %3s%3s | %9.2f %9.2f %9.2f %9.2f %9.2f\n", sh.name, sh.m, sh.n, sh.k,
                sh.ta ? "T" : "N", sh.tb ? "T" : "N", f32, tf32, kmaj, tr, 2.0 * sh.m * sh.n * sh.k / 1e9);
  }
  return 0;
}
