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
// cost), all captured in CUDA graphs of 20 products, median of 11 replays.
// Self-contained (cuBLAS only), so it also builds with one nvcc line:
//   nvcc -O3 -arch=sm_90 dev/cuda/tf32_layouts.cu -lcublas -o tf32_layouts
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                                        \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)
#define CHECK_BLAS(x)                                                         \
  do {                                                                        \
    cublasStatus_t s_ = (x);                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                        \
      std::fprintf(stderr, "%s: status %d (%s:%d)\n", #x, static_cast<int>(s_), __FILE__, __LINE__); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

namespace {

// Row-major C[m, n] = op(A) · op(B) over k (A stored [k, m] when ta, B stored
// [n, k] when tb), through column-major cuBLAS as Cᵀ = op(B)ᵀ · op(A)ᵀ.
void gemm(cublasHandle_t h, cublasComputeType_t compute, bool ta, bool tb, int m, int n, int k, const float* A,
          const float* B, float* C) {
  const float one = 1.0f, zero = 0.0f;
  CHECK_BLAS(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, B,
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

// Median µs of one `body` call: 20 calls captured in a graph, 11 replays.
template <class F>
float time_us(cudaStream_t s, F body) {
  body();  // warm-up (cuBLAS picks its kernel, outside capture)
  CHECK_CUDA(cudaStreamSynchronize(s));
  cudaGraph_t g;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) body();
  CHECK_CUDA(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < 12; ++r) {
    CHECK_CUDA(cudaEventRecord(a, s));
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    if (r > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(g));
  return ms[ms.size() / 2] * 1000.0f / 20.0f;
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
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t h;
  CHECK_BLAS(cublasCreate(&h));
  CHECK_BLAS(cublasSetStream(h, s));
  const std::size_t most = std::size_t(4096) * 4096;
  float *A, *B, *C, *At, *Bt;
  for (float** p : {&A, &B, &C, &At, &Bt}) CHECK_CUDA(cudaMalloc(p, most * sizeof(float)));
  std::vector<float> host(most);
  for (std::size_t i = 0; i < most; ++i) host[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  for (float* p : {A, B, At, Bt}) CHECK_CUDA(cudaMemcpy(p, host.data(), most * sizeof(float), cudaMemcpyHostToDevice));
  std::printf("%-12s %6s %6s %6s %6s | %9s %9s %9s %9s %9s\n", "gemm", "m", "n", "k", "layout", "f32_us", "tf32_us",
              "tf32_kmaj", "transp_us", "GFLOP");
  for (const Shape& sh : shapes) {
    const float f32 = time_us(s, [&] { gemm(h, CUBLAS_COMPUTE_32F, sh.ta, sh.tb, sh.m, sh.n, sh.k, A, B, C); });
    const float tf32 =
        time_us(s, [&] { gemm(h, CUBLAS_COMPUTE_32F_FAST_TF32, sh.ta, sh.tb, sh.m, sh.n, sh.k, A, B, C); });
    // K-major: A as [m, k] (no trans), B as [n, k] (trans): the copies At, Bt stand for them.
    const float kmaj =
        time_us(s, [&] { gemm(h, CUBLAS_COMPUTE_32F_FAST_TF32, false, true, sh.m, sh.n, sh.k, At, Bt, C); });
    // The transpose a K-major copy of a non-K-major operand costs (the larger operand).
    float tr = 0;
    if (sh.ta || !sh.tb) {
      const int rows = sh.k, cols = sh.ta ? sh.m : sh.n;
      const dim3 grid((cols + 31) / 32, (rows + 31) / 32), block(32, 8);
      tr = time_us(s, [&] { transpose<<<grid, block, 0, s>>>(A, At, rows, cols); });
    }
    std::printf("%-12s %6d %6d %6d %3s%3s | %9.2f %9.2f %9.2f %9.2f %9.2f\n", sh.name, sh.m, sh.n, sh.k,
                sh.ta ? "T" : "N", sh.tb ? "T" : "N", f32, tf32, kmaj, tr, 2.0 * sh.m * sh.n * sh.k / 1e9);
  }
  return 0;
}
