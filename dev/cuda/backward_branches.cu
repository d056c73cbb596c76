// The MLP QAT step's backward as two graph branches (issue #16 item 2: the
// b256 step is 35 kernel nodes at ~3.6 us each, every one of them in series
// on the library's one stream, most on a few dozen of the GPU's 132 SMs).
// The parameter gradients (dW = dYᵀ · X and db = column sums of dY) are off
// the critical path: only dX = dY · W and the fake quants' masks lead to the
// next layer's backward, and the optimizer needs them all only at its step.
// This program replays the backward of the 784-H-H-10 MLP with the library's
// kinds of calls (cublasGemmEx, default algorithm: cuBLAS's split-K pairs;
// a column-sum kernel; an elementwise mask pass; one SGD-with-momentum
// kernel over the six parameters) captured in a CUDA graph two ways:
//   serial    every call on one stream, in the engine's order per layer
//             (dW, db, dX, mask);
//   branched  dX and the masks on the main stream; each layer's dW and db
//             on a side stream forked (event) once that layer's dY is ready,
//             joined (event) before the SGD kernel;
// and prints µs per backward (50 backwards captured, median of 21 replays),
// the graph's nodes per backward, and whether the two give the same bytes
// (they should: the same calls on the same data). The question: how much of
// the step a second stream in the engine (the parameter passes on a branch)
// could take off the critical path, before building it (the allocator and
// the engine assume one stream per device).
// Run by hand on the GPU machine:  build-gpu/dev/dev_backward_branches [M H]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "graph_timing.cuh"
#include "lt_dev.cuh"

namespace {

constexpr std::size_t kWorkspace = std::size_t(4) << 20;

// Row-major C[m, n] = op(A)[m, k] · op(B)[k, n] (A stored [k, m] when ta, B
// stored [n, k] when tb), through column-major cuBLAS as Cᵀ = op(B)ᵀ · op(A)ᵀ.
void gemm(cublasHandle_t h, bool ta, bool tb, int m, int n, int k, const float* A, const float* B, float* C) {
  const float one = 1.0f, zero = 0.0f;
  DEV_CHECK_BLAS(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, B,
                              CUDA_R_32F, tb ? k : n, A, CUDA_R_32F, ta ? m : k, &zero, C, CUDA_R_32F, n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// db[c] = sum over rows of dy[r, c], a thread per column (the bias gradient).
__global__ void column_sum(const float* dy, float* db, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0;
  for (int r = 0; r < rows; ++r) s += dy[static_cast<long>(r) * cols + c];
  db[c] = s;
}

// dy = dx · mask (the fake quant's straight-through mask, here 0 / 1 floats).
__global__ void apply_mask(const float* dx, const float* mask, float* dy, long n) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dy[i] = dx[i] * mask[i];
}

// SGD with momentum over the parameters, one launch (the library's optim_kernel).
struct Params {
  float *p[6], *buf[6];
  const float* g[6];
  long n[6];
};
__global__ void sgd(Params t, float lr) {
  long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int k = 0; k < 6; ++k) {
    if (i < t.n[k]) {
      const float b = 0.9f * t.buf[k][i] + t.g[k][i];
      t.buf[k][i] = b;
      t.p[k][i] -= lr * b;
      return;
    }
    i -= t.n[k];
  }
}

float* zeros_dev(std::size_t n) {
  float* p = nullptr;
  DEV_CHECK_CUDA(cudaMalloc(&p, n * sizeof(float)));
  DEV_CHECK_CUDA(cudaMemset(p, 0, n * sizeof(float)));
  return p;
}

// 0 / 1 floats, about three quarters ones.
float* mask_dev(std::size_t n, unsigned seed) {
  float* r = dev_random(n, seed);
  std::vector<float> h = to_host(r, n);
  DEV_CHECK_CUDA(cudaFree(r));
  for (auto& v : h) v = v > -0.5f ? 1.0f : 0.0f;
  float* p = nullptr;
  DEV_CHECK_CUDA(cudaMalloc(&p, n * sizeof(float)));
  DEV_CHECK_CUDA(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}

struct Mlp {
  int M, H, K = 784, C = 10;
  float *x1, *x2, *x3, *w1, *w2, *w3, *dy3, *mask1, *mask2;       // inputs of the backward
  float *dw1, *dw2, *dw3, *db1, *db2, *db3, *dx3, *dy2, *dx2, *dy1;  // its results
  float *b1, *b2, *b3;                                             // biases (SGD only)
  float* mom[6];
  Params params() const {
    Params t{};
    float* ps[6] = {w1, b1, w2, b2, w3, b3};
    const float* gs[6] = {dw1, db1, dw2, db2, dw3, db3};
    const long ns[6] = {long(H) * K, H, long(H) * H, H, long(C) * H, C};
    for (int k = 0; k < 6; ++k) t.p[k] = ps[k], t.g[k] = gs[k], t.n[k] = ns[k], t.buf[k] = mom[k];
    return t;
  }
  long param_count() const { return long(H) * K + H + long(H) * H + H + long(C) * H + C; }
};

Mlp make(int M, int H) {
  Mlp m{};
  m.M = M;
  m.H = H;
  m.x1 = dev_random(std::size_t(M) * m.K, 1);
  m.x2 = dev_random(std::size_t(M) * H, 2);
  m.x3 = dev_random(std::size_t(M) * H, 3);
  m.w1 = dev_random(std::size_t(H) * m.K, 4, 0.05f);
  m.w2 = dev_random(std::size_t(H) * H, 5, 0.05f);
  m.w3 = dev_random(std::size_t(m.C) * H, 6, 0.05f);
  m.dy3 = dev_random(std::size_t(M) * m.C, 7, 0.01f);
  m.mask1 = mask_dev(std::size_t(M) * H, 8);
  m.mask2 = mask_dev(std::size_t(M) * H, 9);
  m.dw1 = zeros_dev(std::size_t(H) * m.K);
  m.dw2 = zeros_dev(std::size_t(H) * H);
  m.dw3 = zeros_dev(std::size_t(m.C) * H);
  m.db1 = zeros_dev(H);
  m.db2 = zeros_dev(H);
  m.db3 = zeros_dev(m.C);
  m.dx3 = zeros_dev(std::size_t(M) * H);
  m.dy2 = zeros_dev(std::size_t(M) * H);
  m.dx2 = zeros_dev(std::size_t(M) * H);
  m.dy1 = zeros_dev(std::size_t(M) * H);
  m.b1 = zeros_dev(H);
  m.b2 = zeros_dev(H);
  m.b3 = zeros_dev(m.C);
  const long ns[6] = {long(H) * m.K, H, long(H) * H, H, long(m.C) * H, m.C};
  for (int k = 0; k < 6; ++k) m.mom[k] = zeros_dev(std::size_t(ns[k]));
  return m;
}

unsigned blocks(long n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// One layer's parameter gradients: dW = dYᵀ · X [out, in], db = column sums of dY.
void param_grads(cublasHandle_t h, cudaStream_t s, const float* dy, const float* x, float* dw, float* db, int M,
                 int out, int in) {
  DEV_CHECK_BLAS(cublasSetStream(h, s));
  gemm(h, true, false, out, in, M, dy, x, dw);
  column_sum<<<blocks(out, 128), 128, 0, s>>>(dy, db, M, out);
}

// dY of the layer below: dX = dY · W [M, in], then the mask.
void input_grad(cublasHandle_t h, cudaStream_t s, const float* dy, const float* w, const float* mask, float* dx,
                float* dy_below, int M, int out, int in) {
  DEV_CHECK_BLAS(cublasSetStream(h, s));
  gemm(h, false, false, M, in, out, dy, w, dx);
  apply_mask<<<blocks(long(M) * in, 256), 256, 0, s>>>(dx, mask, dy_below, long(M) * in);
}

struct Streams {
  cublasHandle_t main, side;
  cudaStream_t side_stream;
  cudaEvent_t fork3, fork2, join;
};

void backward_serial(const Mlp& m, Streams& st, cudaStream_t s) {
  param_grads(st.main, s, m.dy3, m.x3, m.dw3, m.db3, m.M, m.C, m.H);
  input_grad(st.main, s, m.dy3, m.w3, m.mask2, m.dx3, m.dy2, m.M, m.C, m.H);
  param_grads(st.main, s, m.dy2, m.x2, m.dw2, m.db2, m.M, m.H, m.H);
  input_grad(st.main, s, m.dy2, m.w2, m.mask1, m.dx2, m.dy1, m.M, m.H, m.H);
  param_grads(st.main, s, m.dy1, m.x1, m.dw1, m.db1, m.M, m.H, m.K);
  sgd<<<blocks(m.param_count(), 256), 256, 0, s>>>(m.params(), 0.01f);
}

void backward_branched(const Mlp& m, Streams& st, cudaStream_t s) {
  cudaStream_t side = st.side_stream;
  DEV_CHECK_CUDA(cudaEventRecord(st.fork3, s));  // dY3 ready
  DEV_CHECK_CUDA(cudaStreamWaitEvent(side, st.fork3, 0));
  param_grads(st.side, side, m.dy3, m.x3, m.dw3, m.db3, m.M, m.C, m.H);
  input_grad(st.main, s, m.dy3, m.w3, m.mask2, m.dx3, m.dy2, m.M, m.C, m.H);
  DEV_CHECK_CUDA(cudaEventRecord(st.fork2, s));  // dY2 ready
  DEV_CHECK_CUDA(cudaStreamWaitEvent(side, st.fork2, 0));
  param_grads(st.side, side, m.dy2, m.x2, m.dw2, m.db2, m.M, m.H, m.H);
  input_grad(st.main, s, m.dy2, m.w2, m.mask1, m.dx2, m.dy1, m.M, m.H, m.H);
  param_grads(st.main, s, m.dy1, m.x1, m.dw1, m.db1, m.M, m.H, m.K);
  DEV_CHECK_CUDA(cudaEventRecord(st.join, side));
  DEV_CHECK_CUDA(cudaStreamWaitEvent(s, st.join, 0));
  sgd<<<blocks(m.param_count(), 256), 256, 0, s>>>(m.params(), 0.01f);
}

// The results of one backward (the gradients, dY1 and the parameters after
// the SGD step), the parameters and momenta put back afterwards, so both
// variants start from the same state.
std::vector<float> results(const Mlp& m, Streams& st, bool branched) {
  const Params t = m.params();
  std::vector<std::vector<float>> saved;
  for (int k = 0; k < 6; ++k) {
    saved.push_back(to_host(t.p[k], std::size_t(t.n[k])));
    DEV_CHECK_CUDA(cudaMemset(t.buf[k], 0, std::size_t(t.n[k]) * sizeof(float)));
  }
  cudaStream_t s;
  DEV_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (branched) backward_branched(m, st, s);
  else backward_serial(m, st, s);
  DEV_CHECK_CUDA(cudaStreamSynchronize(s));
  DEV_CHECK_CUDA(cudaStreamDestroy(s));
  std::vector<float> out;
  auto take = [&](const float* p, long n) {
    const std::vector<float> h = to_host(p, std::size_t(n));
    out.insert(out.end(), h.begin(), h.end());
  };
  for (int k = 0; k < 6; ++k) take(t.g[k], t.n[k]), take(t.p[k], t.n[k]);
  take(m.dy1, long(m.M) * m.H);
  for (int k = 0; k < 6; ++k) {
    DEV_CHECK_CUDA(cudaMemcpy(t.p[k], saved[std::size_t(k)].data(), saved[std::size_t(k)].size() * sizeof(float),
                              cudaMemcpyHostToDevice));
    DEV_CHECK_CUDA(cudaMemset(t.buf[k], 0, std::size_t(t.n[k]) * sizeof(float)));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("{\"bench\":\"backward_branches\",\"skipped\":\"no CUDA device\"}\n");
    return 0;
  }
  std::vector<std::pair<int, int>> shapes = {{256, 256}, {4096, 1024}};
  if (argc == 3) shapes = {{std::atoi(argv[1]), std::atoi(argv[2])}};
  Streams st{};
  DEV_CHECK_BLAS(cublasCreate(&st.main));
  DEV_CHECK_BLAS(cublasCreate(&st.side));
  void *ws_main = nullptr, *ws_side = nullptr;  // fixed workspaces: nothing allocated during capture
  DEV_CHECK_CUDA(cudaMalloc(&ws_main, kWorkspace));
  DEV_CHECK_CUDA(cudaMalloc(&ws_side, kWorkspace));
  DEV_CHECK_BLAS(cublasSetWorkspace(st.main, ws_main, kWorkspace));
  DEV_CHECK_BLAS(cublasSetWorkspace(st.side, ws_side, kWorkspace));
  DEV_CHECK_CUDA(cudaStreamCreateWithFlags(&st.side_stream, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&st.fork3, &st.fork2, &st.join})
    DEV_CHECK_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  for (const auto& [M, H] : shapes) {
    const Mlp m = make(M, H);
    const std::vector<float> a = results(m, st, false), b = results(m, st, true);
    const bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    auto serial = [&](cudaStream_t s) { backward_serial(m, st, s); };
    auto branched = [&](cudaStream_t s) { backward_branched(m, st, s); };
    const std::size_t serial_nodes = nodes_of(serial), branched_nodes = nodes_of(branched);
    // Alternating, two rounds each.
    double us[2][2];
    for (int r = 0; r < 2; ++r) {
      us[0][r] = graph_us(serial);
      us[1][r] = graph_us(branched);
    }
    std::printf(
        "{\"bench\":\"backward_branches\",\"M\":%d,\"H\":%d,\"serial_nodes\":%zu,\"branched_nodes\":%zu,"
        "\"serial_us\":[%.2f,%.2f],\"branched_us\":[%.2f,%.2f],\"results\":\"%s\"}\n",
        M, H, serial_nodes, branched_nodes, us[0][0], us[0][1], us[1][0], us[1][1],
        same ? "same bits" : "DIFFERENT");
  }
  return 0;
}
