// CUDA reductions over one axis, deterministic: short rows (n <= 128) use
// one thread per output summing in the CPU's order (bit-identical to the
// CPU); long rows use one block per output, each thread summing a fixed
// strided subset, then a fixed shared-memory tree. No float atomics.
#include "kernels/cuda/launch.cuh"
#include "kernels/reduce.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr std::int64_t kThreadPerRowMax = 128;
constexpr unsigned kReduceThreads = 256;

template <class T>
__global__ void sum_rows_block_kernel(const T* x, T* out, AxisView v, bool mean) {
  using M = op_math_t<T>;
  __shared__ M buf[kReduceThreads];
  const std::int64_t outputs = v.outer * v.inner;
  for (std::int64_t idx = blockIdx.x; idx < outputs; idx += gridDim.x) {
    const T* row = x + v.base(idx);
    M acc = M(0);
    for (std::int64_t r = threadIdx.x; r < v.n; r += kReduceThreads) acc += M(row[r * v.inner]);
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = kReduceThreads / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[idx] = T(mean ? buf[0] / M(v.n) : buf[0]);
    __syncthreads();
  }
}

template <class T>
void sum_axis_impl(const Tensor& in, const Tensor& out, const AxisView& v, bool mean) {
  using M = op_math_t<T>;
  const T* x = static_cast<const T*>(in.data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  const int dev = out.device().index;
  const std::int64_t outputs = v.outer * v.inner;
  if (outputs == 0) return;
  if (v.n <= kThreadPerRowMax) {
    launch_elementwise(dev, outputs, [=] __device__(std::int64_t idx) {
      const M acc = sum_strided(x + v.base(idx), v.n, v.inner);
      o[idx] = T(mean ? acc / M(v.n) : acc);
    });
    return;
  }
  const unsigned blocks = ::qgrad::cuda::blocks_for(outputs, 1, ::qgrad::cuda::fill_blocks(dev, kReduceThreads) * 8LL);
  sum_rows_block_kernel<T><<<blocks, kReduceThreads, 0, ::qgrad::cuda::stream(dev)>>>(x, o, v, mean);
  QGRAD_LAUNCH_CHECK();
}

template <class T>
void expand_axis_impl(const Tensor& in, const Tensor& out, const AxisView& v, double scale) {
  using M = op_math_t<T>;
  const T* x = static_cast<const T*>(in.data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  const M s = M(scale);
  launch_elementwise(out.device().index, out.numel(), [=] __device__(std::int64_t i) {
    o[i] = T(M(x[(i / (v.n * v.inner)) * v.inner + i % v.inner]) * s);
  });
}

template <class T>
void argmax_axis_impl(const Tensor& in, const Tensor& out, const AxisView& v) {
  const T* x = static_cast<const T*>(in.data_ptr());
  auto* o = static_cast<std::int64_t*>(out.data_ptr());
  launch_elementwise(out.device().index, v.outer * v.inner,
                     [=] __device__(std::int64_t idx) { o[idx] = argmax_strided(x + v.base(idx), v.n, v.inner); });
}

}  // namespace

void sum_axis(const Tensor& in, const Tensor& out, const AxisView& v, bool mean) {
  dispatch_floating(out.dtype(), "sum", [&](auto tag) { sum_axis_impl<typename decltype(tag)::type>(in, out, v, mean); });
}

void expand_axis(const Tensor& in, const Tensor& out, const AxisView& v, double scale) {
  dispatch_floating(out.dtype(), "expand_axis",
                    [&](auto tag) { expand_axis_impl<typename decltype(tag)::type>(in, out, v, scale); });
}

void argmax_axis(const Tensor& in, const Tensor& out, const AxisView& v) {
  dispatch_floating(in.dtype(), "argmax", [&](auto tag) { argmax_axis_impl<typename decltype(tag)::type>(in, out, v); });
}

}  // namespace qgrad::kernels::cuda
