// CPU GEMM through Eigen (row-major maps, no transposed copies); 16-bit
// types are widened to float, multiplied, and rounded back once.
//
// Eigen's own OpenMP GEMM is off in this file: on small products its thread
// team costs far more than the math, and its blocking depends on the thread
// count. Instead C is cut into fixed blocks of kRowBlock rows, each an
// independent Eigen product, run in parallel only when the product is large.
// The blocks never depend on the thread count, so neither do the results.
#define EIGEN_DONT_PARALLELIZE 1
#include "qgrad/kernels/cpu/gemm.h"

#include <Eigen/Core>
#include <vector>

#include "qgrad/kernels/cpu/parallel.h"

namespace qgrad::kernels::cpu {

namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr std::int64_t kRowBlock = 128;
constexpr std::int64_t kParallelMacs = std::int64_t{1} << 22;
// The fewest multiply-adds over all batches worth a thread team over batches.
constexpr std::int64_t kParallelBatchMacs = std::int64_t{1} << 18;

// Batches run in parallel (OpenMP over batches) when there are several and
// each product is below the parallel size; otherwise each large product
// runs its row blocks in parallel. Each batch computes the same blocks in
// the same order either way, so results never depend on the thread count.
template <class T>
void gemm_native(const GemmShape& s, const T* a, const T* b, T* c, bool accumulate) {
  using Eigen::Index;
  const Index m = s.m, n = s.n, k = s.k;
  const std::int64_t blocks = (m + kRowBlock - 1) / kRowBlock;
  const bool large = blocks > 1 && m * n * k >= kParallelMacs;
  auto one = [&](std::int64_t i, bool parallel_blocks) {
    Eigen::Map<const RowMat<T>> A(a + (s.broadcast_a ? 0 : i * m * k), s.trans_a ? k : m, s.trans_a ? m : k);
    Eigen::Map<const RowMat<T>> B(b + (s.broadcast_b ? 0 : i * k * n), s.trans_b ? n : k, s.trans_b ? k : n);
    Eigen::Map<RowMat<T>> C(c + i * m * n, m, n);
    if (k == 0) {
      if (!accumulate) C.setZero();
      return;
    }
    auto run = [&](const auto& opa, const auto& opb) {
      auto block = [&](std::int64_t blk) {
        const Index r0 = blk * kRowBlock, rows = std::min<Index>(kRowBlock, m - r0);
        if (accumulate) C.middleRows(r0, rows).noalias() += opa.middleRows(r0, rows) * opb;
        else C.middleRows(r0, rows).noalias() = opa.middleRows(r0, rows) * opb;
      };
      if (parallel_blocks) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
        for (std::int64_t blk = 0; blk < blocks; ++blk) block(blk);
      } else {
        for (std::int64_t blk = 0; blk < blocks; ++blk) block(blk);
      }
    };
    if (!s.trans_a && !s.trans_b) run(A, B);
    else if (!s.trans_a) run(A, B.transpose());
    else if (!s.trans_b) run(A.transpose(), B);
    else run(A.transpose(), B.transpose());
  };
  if (!large && s.batch > 1 && s.batch * m * n * std::max<Index>(k, 1) >= kParallelBatchMacs) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
    for (std::int64_t i = 0; i < s.batch; ++i) one(i, false);
  } else {
    for (std::int64_t i = 0; i < s.batch; ++i) one(i, large);
  }
}

template <class T>
std::vector<float> widen(const Tensor& t) {
  const T* p = static_cast<const T*>(t.data_ptr());
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  parallel_for(t.numel(), [&](std::int64_t i) { v[static_cast<std::size_t>(i)] = float(p[i]); });
  return v;
}

template <class T>
void gemm_impl(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    gemm_native<T>(s, static_cast<const T*>(a.data_ptr()), static_cast<const T*>(b.data_ptr()),
                   static_cast<T*>(c.data_ptr()), accumulate);
  } else {
    const std::vector<float> fa = widen<T>(a), fb = widen<T>(b);
    std::vector<float> fc = accumulate ? widen<T>(c) : std::vector<float>(static_cast<std::size_t>(c.numel()));
    gemm_native<float>(s, fa.data(), fb.data(), fc.data(), accumulate);
    T* o = static_cast<T*>(c.data_ptr());
    parallel_for(c.numel(), [&](std::int64_t i) { o[i] = T(fc[static_cast<std::size_t>(i)]); });
  }
}

}  // namespace

void gemm_raw(const GemmShape& s, const float* a, const float* b, float* c, bool accumulate) {
  gemm_native<float>(s, a, b, c, accumulate);
}
void gemm_raw(const GemmShape& s, const double* a, const double* b, double* c, bool accumulate) {
  gemm_native<double>(s, a, b, c, accumulate);
}

void gemm(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, bool accumulate) {
  dispatch_floating(c.dtype(), "gemm",
                    [&](auto tag) { gemm_impl<typename decltype(tag)::type>(s, a, b, c, accumulate); });
}

}  // namespace qgrad::kernels::cpu
