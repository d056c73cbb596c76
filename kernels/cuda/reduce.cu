// CUDA reductions over one axis, deterministic: short rows (n <= 128) use
// one thread per output summing in the CPU's order (bit-identical to the
// CPU); long rows use one block per output (or per fixed chunk of a row,
// then a second pass over the chunk sums), each thread summing a fixed
// strided subset, then a fixed shared-memory tree. No float atomics.
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/reduce.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr std::int64_t kThreadPerRowMax = 128;
constexpr unsigned kReduceThreads = 256;
// Rows longer than kChunk, when there are fewer than kChunkedMaxOutputs of
// them, are summed in two passes: fixed chunks of kChunk elements into
// partial sums (op math), then the partials. The split depends only on the
// shape, never on the device, so results are reproducible.
constexpr std::int64_t kChunk = 16384;
constexpr std::int64_t kChunkedMaxOutputs = 1024;

// Block per task: task = (row idx, chunk c) sums row elements
// [c * chunk, min(n, (c + 1) * chunk)) with per-thread strided partials and a
// fixed shared-memory tree, then writes out[task] (divided by mean_n if > 0).
template <class In, class Out>
__global__ void sum_block_kernel(const In* x, Out* out, AxisView v, std::int64_t chunk, std::int64_t chunks,
                                 std::int64_t mean_n) {
  using M = op_math_t<In>;
  __shared__ M buf[kReduceThreads];
  const std::int64_t tasks = v.outer * v.inner * chunks;
  for (std::int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const In* row = x + v.base(task / chunks);
    const std::int64_t begin = (task % chunks) * chunk;
    const std::int64_t end = begin + chunk < v.n ? begin + chunk : v.n;
    M acc = M(0);
    for (std::int64_t r = begin + threadIdx.x; r < end; r += kReduceThreads) acc += M(row[r * v.inner]);
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = kReduceThreads / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[task] = Out(mean_n > 0 ? buf[0] / M(mean_n) : buf[0]);
    __syncthreads();
  }
}

template <class In, class Out>
void launch_sum_blocks(int dev, const In* x, Out* out, const AxisView& v, std::int64_t chunk, std::int64_t chunks,
                       std::int64_t mean_n) {
  const std::int64_t tasks = v.outer * v.inner * chunks;
  const unsigned blocks = ::qgrad::cuda::blocks_for(tasks, 1, ::qgrad::cuda::fill_blocks(dev, kReduceThreads) * 8LL);
  sum_block_kernel<In, Out><<<blocks, kReduceThreads, 0, ::qgrad::cuda::stream(dev)>>>(x, out, v, chunk, chunks, mean_n);
  QGRAD_LAUNCH_CHECK();
}

template <class T>
void sum_axis_impl(const Tensor& in, const Tensor& out, const AxisView& v, bool mean) {
  using M = op_math_t<T>;
  const T* x = static_cast<const T*>(in.data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  const int dev = out.device().index;
  const std::int64_t outputs = v.outer * v.inner;
  const std::int64_t mean_n = mean ? v.n : 0;
  if (outputs == 0) return;
  if (v.n <= kThreadPerRowMax) {
    launch_elementwise(dev, outputs, [=] __device__(std::int64_t idx) {
      const M acc = sum_strided(x + v.base(idx), v.n, v.inner);
      o[idx] = T(mean ? acc / M(v.n) : acc);
    });
    return;
  }
  if (v.n <= kChunk || outputs >= kChunkedMaxOutputs) {
    launch_sum_blocks(dev, x, o, v, v.n, 1, mean_n);
    return;
  }
  const std::int64_t chunks = (v.n + kChunk - 1) / kChunk;
  Tensor partial = Tensor::empty({outputs, chunks}, TensorOptions{}.with_dtype(dtype_of<M>).with_device(out.device()));
  M* p = static_cast<M*>(partial.data_ptr());
  launch_sum_blocks(dev, x, p, v, kChunk, chunks, 0);
  launch_sum_blocks(dev, static_cast<const M*>(p), o, AxisView{outputs, chunks, 1}, chunks, 1, mean_n);
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
