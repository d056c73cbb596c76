// The CUDA block reduction over one axis, deterministic. Short rows
// (n <= kSumThreadPerRowMax) take the generic loop of kernels/reduce.cpp, one
// thread per output summing in the CPU's order (bit-identical to the CPU);
// long rows use one block per output (or per fixed chunk of a row,
// then a second pass over the chunk sums), each thread summing a fixed
// strided subset, then a fixed shared-memory tree. Long strided lines
// (inner > 1: column sums such as a bias gradient over [rows, features])
// go to the column-sum kernel in lane_sum's order: whole when at most
// kColumnOnePassMax long, else fixed chunks of kColumnChunkRows rows per
// output, then the chunks
// (kernels/cuda/column_sum.cuh), whose warps read adjacent outputs of one row
// (a block per output read one element per 32-byte sector). No float atomics.
#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/column_sum.cuh"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/loop.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr unsigned kReduceThreads = kSumBlockThreads;
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
__global__ void sum_block_kernel(const In* x, Out* out, AxisLayout v, std::int64_t chunk, std::int64_t chunks,
                                 std::int64_t mean_n) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<In>;
  __shared__ M buf[kReduceThreads];
  const std::int64_t tasks = v.outer * v.inner * chunks;
  for (std::int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const In* row = x + v.base(task / chunks);
    const std::int64_t begin = (task % chunks) * chunk;
    const std::int64_t end = begin + chunk < v.channels ? begin + chunk : v.channels;
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
void launch_sum_blocks(int dev, const In* x, Out* out, const AxisLayout& v, std::int64_t chunk, std::int64_t chunks,
                       std::int64_t mean_n) {
  const std::int64_t tasks = v.outer * v.inner * chunks;
  const unsigned blocks = ::qgrad::cuda::blocks_for(tasks, 1, ::qgrad::cuda::fill_blocks(dev, kReduceThreads) * 8LL);
  ::qgrad::cuda::launch_kernel(dev, sum_block_kernel<In, Out>, blocks, kReduceThreads, 0, x, out, v, chunk, chunks,
                               mean_n);
}

constexpr std::int64_t kColumnChunkRows = 64;
// Lines at most this long are summed whole by the column-sum kernel (32
// lanes of at most 64 elements each: one launch); longer ones in chunks of
// kColumnChunkRows, then the chunks.
constexpr std::int64_t kColumnOnePassMax = 32 * kColumnChunkRows;

// Column i = (chunk c, output j) sums elements [c * rows, (c + 1) * rows)
// of line j into dst[i] (divided by mean_n if > 0: the one-pass case).
// Chunked, stage 2 is ChunkSumsFinish.
template <class T, class Out>
struct ColumnChunkSum {
  using Acc = op_math_t<T>;
  const T* x;
  Out* dst;
  AxisLayout v;
  std::int64_t rows, mean_n;
  __device__ std::int64_t count(std::int64_t i) const {
    const std::int64_t r0 = i / (v.outer * v.inner) * rows;
    return v.channels - r0 < rows ? v.channels - r0 : rows;
  }
  __device__ Acc term(std::int64_t k, std::int64_t i) const {
    const std::int64_t lines = v.outer * v.inner, j = i % lines, r = i / lines * rows + k;
    return Acc(x[v.base(j) + r * v.inner]);
  }
  __device__ void write(std::int64_t i, Acc s) const { dst[i] = Out(mean_n > 0 ? s / Acc(mean_n) : s); }
};
// The chunked case's stage 1: at most kColumnChunkRows terms a sum, so
// column_sum.cuh's short kernel (four threads a sum, lanes in registers).
template <class T, class Out>
struct ColumnChunkPartial : ColumnChunkSum<T, Out> {
  static constexpr std::int64_t kMaxCount = kColumnChunkRows;
};
template <class T>
void sum_axis_blocks_impl(const Tensor& in, const Tensor& out, const AxisLayout& v, bool mean, DeferredPasses* defer) {
  using M = op_math_t<T>;
  const T* x = static_cast<const T*>(in.data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  const int dev = out.device().index;
  const std::int64_t outputs = v.outer * v.inner;
  const std::int64_t mean_n = mean ? v.channels : 0;
  if (outputs == 0) return;
  if (v.inner > 1 && v.channels <= kColumnOnePassMax) {
    launch_column_sum(dev, outputs, ColumnChunkSum<T, T>{x, o, v, v.channels, mean_n});
    return;
  }
  if (v.inner > 1) {
    if (defer != nullptr && mean_n == 0 && v.outer == 1) {
      // The kernel that wrote `in` may have left its chunk partials (the norms').
      const Tensor known = defer->column_partials(in, outputs, kColumnChunkRows);
      if (known.defined()) {
        defer->column_sums_finish(known, out);
        return;
      }
    }
    const std::int64_t chunks = (v.channels + kColumnChunkRows - 1) / kColumnChunkRows;
    Tensor partial =
        Tensor::empty({chunks, outputs}, TensorOptions{}.with_dtype(dtype_of<M>).with_device(out.device()));
    M* p = static_cast<M*>(partial.data_ptr());
    launch_column_sum(dev, chunks * outputs, ColumnChunkPartial<T, M>{{x, p, v, kColumnChunkRows, 0}});
    if (defer != nullptr && mean_n == 0) defer->column_sums_finish(partial, out);
    else launch_column_sum(dev, outputs, ChunkSumsFinish<T>{p, o, chunks, outputs, mean_n});  // kernels/loop.h
    return;
  }
  if (v.channels <= kChunk || outputs >= kChunkedMaxOutputs) {
    launch_sum_blocks(dev, x, o, v, v.channels, 1, mean_n);
    return;
  }
  const std::int64_t chunks = (v.channels + kChunk - 1) / kChunk;
  Tensor partial = Tensor::empty({outputs, chunks}, TensorOptions{}.with_dtype(dtype_of<M>).with_device(out.device()));
  M* p = static_cast<M*>(partial.data_ptr());
  launch_sum_blocks(dev, x, p, v, kChunk, chunks, 0);
  launch_sum_blocks(dev, static_cast<const M*>(p), o, AxisLayout{outputs, chunks, 1}, chunks, 1, mean_n);
}

}  // namespace

void sum_axis_blocks(const Tensor& in, const Tensor& out, const AxisLayout& v, bool mean, DeferredPasses* defer) {
  dispatch_floating(out.dtype(), "sum",
                    [&](auto tag) { sum_axis_blocks_impl<typename decltype(tag)::type>(in, out, v, mean, defer); });
}

}  // namespace qgrad::kernels::cuda
