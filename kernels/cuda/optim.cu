// Multi-tensor fused optimizer step: up to kOptimChunk parameters per
// launch; blockIdx.y picks the parameter, a grid-stride loop over x covers
// its elements. The pointer table is a kernel argument (like PyTorch's
// TensorListMetadata), so nothing is copied to the device and the host
// never waits.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels::cuda {

namespace {

constexpr int kOptimChunk = 32;

template <class T>
struct OptimTable {
  OptimElems<T> elems[kOptimChunk];
  std::int64_t numel[kOptimChunk];
};

// grad_scale / skip: optimizer_step_'s optional device scalars (read here,
// on the device: the host never waits for them).
template <class T>
__global__ void optim_kernel(OptimTable<T> table, formulas::OptimScalars<op_math_t<T>> s, const T* grad_scale,
                             const std::int32_t* skip) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  if (skip && *skip != 0) return;
  const bool scaled = grad_scale != nullptr;
  const M scale = scaled ? M(*grad_scale) : M(1);
  const int t = static_cast<int>(blockIdx.y);
  const std::int64_t n = table.numel[t];
  const OptimElems<T> e = table.elems[t];
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (std::is_same_v<T, float>) {
    // Four elements an index where every buffer is 16-byte aligned: a
    // thread's loads of p, g and the state issue together (one element at a
    // time, SGD with momentum over the b4096 MLP's 1.86M parameters took
    // 21 us, half the bandwidth, H200); update_values is the formula of
    // update(), so the same bits.
    if (vec4_aligned<float>(e.p) && vec4_aligned<float>(e.g) && vec4_aligned<float>(e.b1) &&
        vec4_aligned<float>(e.b2)) {
      const std::int64_t n4 = n / 4;
      for (std::int64_t q = first; q < n4; q += stride) {
        float4 p4 = reinterpret_cast<const float4*>(e.p)[q];
        const float4 g4 = reinterpret_cast<const float4*>(e.g)[q];
        float4 b4 = e.b1 ? reinterpret_cast<const float4*>(e.b1)[q] : float4{};
        float4 v4 = e.b2 ? reinterpret_cast<const float4*>(e.b2)[q] : float4{};
        e.update_values(p4.x, g4.x, b4.x, v4.x, s, scaled, scale);
        e.update_values(p4.y, g4.y, b4.y, v4.y, s, scaled, scale);
        e.update_values(p4.z, g4.z, b4.z, v4.z, s, scaled, scale);
        e.update_values(p4.w, g4.w, b4.w, v4.w, s, scaled, scale);
        reinterpret_cast<float4*>(e.p)[q] = p4;
        if (e.b1) reinterpret_cast<float4*>(e.b1)[q] = b4;
        if (e.b2) reinterpret_cast<float4*>(e.b2)[q] = v4;
      }
      for (std::int64_t i = 4 * n4 + first; i < n; i += stride) e.update(i, s, scaled, scale);  // n % 4 left
      return;
    }
  }
  for (std::int64_t i = first; i < n; i += stride) e.update(i, s, scaled, scale);
}

template <class T>
void optim_impl(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots, const Tensor& grad_scale,
                const Tensor& skip) {
  using M = op_math_t<T>;
  const T* gs = grad_scale.defined() ? static_cast<const T*>(grad_scale.data_ptr()) : nullptr;
  const std::int32_t* sk = skip.defined() ? static_cast<const std::int32_t*>(skip.data_ptr()) : nullptr;
  const formulas::OptimScalars<M> s = optim_scalars<M>(hyper);
  const int dev = slots.front().param.device().index;
  constexpr unsigned threads = 256;
  const std::int64_t max_x = ::qgrad::cuda::fill_blocks(dev, threads) * 2LL;
  for (std::size_t first = 0; first < slots.size(); first += kOptimChunk) {
    OptimTable<T> table{};
    int count = 0;
    std::int64_t largest = 0;
    for (std::size_t k = first; k < slots.size() && count < kOptimChunk; ++k, ++count) {
      const OptimizerSlot& slot = slots[k];
      table.elems[count] = optim_elems<T>(hyper, slot);
      table.numel[count] = slot.param.numel();
      largest = std::max(largest, slot.param.numel());
    }
    if (largest == 0) continue;
    // f32 takes four elements an index (optim_kernel): a quarter of the grid.
    const std::int64_t indices = std::is_same_v<T, float> ? (largest + 3) / 4 : largest;
    const dim3 grid(::qgrad::cuda::blocks_for(indices, threads, max_x), static_cast<unsigned>(count));
    ::qgrad::cuda::launch_kernel(dev, optim_kernel<T>, grid, threads, 0, table, s, gs, sk);
  }
}

// ---- grad_norm: formulas::NormKind's order, one launch per kNormTensors
// tensors. Block b reduces one chunk (step 1) and writes its partial; the
// last block of the launch to finish (block_counters[0]) reduces each of the
// launch's tensors over its partials (step 2, one warp per tensor) and, in
// the final launch, the per-tensor values of every launch (step 3). ----

constexpr int kNormTensors = 128;

template <class T>
struct NormTable {
  const T* ptr[kNormTensors];
  std::int64_t numel[kNormTensors];
  std::int64_t chunk_start[kNormTensors + 1];  // launch-relative chunk offsets
  int count;
  std::int64_t partial_base;  // the launch's first partial
  std::int64_t tensor_base;   // the launch's first tensor
};

template <class M>
__device__ M warp_tree(formulas::NormKind k, M v, int lanes) {
  for (int s = lanes / 2; s >= 1; s /= 2) v = formulas::norm_combine(k, v, __shfl_down_sync(0xffffffffu, v, s));
  return v;
}

template <class T>
__global__ void __launch_bounds__(formulas::kNormLanes)
    grad_norm_kernel(NormTable<T> table, formulas::NormKind k, op_math_t<T>* partial, op_math_t<T>* acc,
                     std::uint32_t* counter, bool final_launch, std::int64_t tensors, op_math_t<T> max_norm, T* total,
                     T* coef, std::int32_t* nonfinite) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  using namespace formulas;
  __shared__ M groups[kNormLanes / kNormGroup];
  __shared__ bool last;
  const int lane = static_cast<int>(threadIdx.x) % kNormGroup, warp = static_cast<int>(threadIdx.x) / kNormGroup;
  // Step 1: this block's chunk.
  const std::int64_t b = blockIdx.x;
  int t = 0;
  while (table.chunk_start[t + 1] <= b) ++t;
  const std::int64_t begin = (b - table.chunk_start[t]) * kNormChunk;
  const std::int64_t rest = table.numel[t] - begin;
  const std::int64_t len = rest < kNormChunk ? rest : kNormChunk;
  const T* x = table.ptr[t] + begin;
  M v = M(0);
  for (std::int64_t i = threadIdx.x; i < len; i += kNormLanes) v = norm_fold(k, v, M(x[i]));
  v = warp_tree(k, v, kNormGroup);
  if (lane == 0) groups[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_tree(k, lane < kNormLanes / kNormGroup ? groups[lane] : M(0), kNormLanes / kNormGroup);
    if (lane == 0) {
      partial[table.partial_base + b] = v;
      __threadfence();  // the partial is visible before the count says so
      last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Step 2: one warp per tensor of this launch.
  for (int i = warp; i < table.count; i += kNormLanes / kNormGroup) {
    const std::int64_t first = table.partial_base + table.chunk_start[i];
    const std::int64_t chunks = table.chunk_start[i + 1] - table.chunk_start[i];
    M a = M(0);
    for (std::int64_t c = lane; c < chunks; c += kNormGroup) a = norm_combine(k, a, partial[first + c]);
    a = warp_tree(k, a, kNormGroup);
    if (lane == 0) acc[table.tensor_base + i] = a;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    *counter = 0;  // ready for the next launch
    if (final_launch) norm_result<T, M>(k, acc, tensors, max_norm, total, coef, nonfinite);
  }
}

template <class T>
void grad_norm_impl(const std::vector<Tensor>& tensors, formulas::NormKind kind, double max_norm,
                    const Tensor& total, const Tensor& coef, const Tensor& nonfinite) {
  using M = op_math_t<T>;
  using formulas::kNormChunk;
  const int dev = total.device().index;
  const auto n = static_cast<std::int64_t>(tensors.size());  // >= 1 (the op checks)
  const std::int64_t launches = (n + kNormTensors - 1) / kNormTensors;
  std::int64_t chunks = 0;
  for (const Tensor& t : tensors) chunks += (t.numel() + kNormChunk - 1) / kNormChunk;
  // Partials (and an empty chunk per launch at most), then the per-tensor values.
  Tensor work = Tensor::empty({chunks + launches + n},
                              TensorOptions{}.with_dtype(dtype_of<M>).with_device(total.device()));
  M* partial = static_cast<M*>(work.data_ptr());
  M* acc = partial + chunks + launches;
  std::int64_t partial_base = 0;
  for (std::int64_t first = 0; first < n; first += kNormTensors) {
    NormTable<T> table{};
    table.partial_base = partial_base;
    table.tensor_base = first;
    for (std::int64_t k = first; k < n && table.count < kNormTensors; ++k, ++table.count) {
      const Tensor& t = tensors[static_cast<std::size_t>(k)];
      table.ptr[table.count] = static_cast<const T*>(t.data_ptr());
      table.numel[table.count] = t.numel();
      table.chunk_start[table.count + 1] =
          table.chunk_start[table.count] + (t.numel() + kNormChunk - 1) / kNormChunk;
    }
    // A launch needs a block; one over an empty tensor folds nothing (an
    // extra empty chunk of the last tensor; its partial is the identity).
    std::int64_t blocks = table.chunk_start[table.count];
    if (blocks == 0) table.chunk_start[table.count] = blocks = 1;
    const bool final_launch = first + kNormTensors >= n;
    ::qgrad::cuda::launch_kernel(dev, grad_norm_kernel<T>, static_cast<unsigned>(blocks), formulas::kNormLanes, 0,
                                 table, kind, partial, acc, ::qgrad::cuda::block_counters(dev), final_launch, n,
                                 static_cast<M>(max_norm), static_cast<T*>(total.data_ptr()),
                                 static_cast<T*>(coef.data_ptr()),
                                 nonfinite.defined() ? static_cast<std::int32_t*>(nonfinite.data_ptr()) : nullptr);
    partial_base += blocks;
  }
}

// ---- grad_scale: one launch per kScaleTensors tensors ----

constexpr int kScaleTensors = 128;

template <class T>
struct ScaleTable {
  T* ptr[kScaleTensors];
  std::int64_t numel[kScaleTensors];
};

template <class T>
__global__ void grad_scale_kernel(ScaleTable<T> table, const T* scale) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  const M s = M(*scale);
  const int t = static_cast<int>(blockIdx.y);
  const std::int64_t n = table.numel[t];
  T* p = table.ptr[t];
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = T(M(p[i]) * s);
}

template <class T>
void grad_scale_impl(const std::vector<Tensor>& tensors, const Tensor& scale) {
  const int dev = scale.device().index;
  constexpr unsigned threads = 256;
  const std::int64_t max_x = ::qgrad::cuda::fill_blocks(dev, threads) * 2LL;
  for (std::size_t first = 0; first < tensors.size(); first += kScaleTensors) {
    ScaleTable<T> table{};
    unsigned count = 0;
    std::int64_t largest = 0;
    for (std::size_t k = first; k < tensors.size() && count < kScaleTensors; ++k, ++count) {
      table.ptr[count] = static_cast<T*>(tensors[k].data_ptr());
      table.numel[count] = tensors[k].numel();
      largest = std::max(largest, tensors[k].numel());
    }
    if (largest == 0) continue;
    const dim3 grid(::qgrad::cuda::blocks_for(largest, threads, max_x), count);
    ::qgrad::cuda::launch_kernel(dev, grad_scale_kernel<T>, grid, threads, 0, table,
                                 static_cast<const T*>(scale.data_ptr()));
  }
}

}  // namespace

void optim_step(const OptimizerHyper& hyper, const std::vector<OptimizerSlot>& slots, const Tensor& grad_scale,
                const Tensor& skip) {
  dispatch_floating(slots.front().param.dtype(), "optim_step",
                    [&](auto tag) { optim_impl<typename decltype(tag)::type>(hyper, slots, grad_scale, skip); });
}

void grad_norm(const std::vector<Tensor>& tensors, formulas::NormKind kind, double max_norm, const Tensor& total,
               const Tensor& coef, const Tensor& nonfinite) {
  dispatch_floating(total.dtype(), "grad_norm", [&](auto tag) {
    grad_norm_impl<typename decltype(tag)::type>(tensors, kind, max_norm, total, coef, nonfinite);
  });
}

void grad_scale(const std::vector<Tensor>& tensors, const Tensor& scale) {
  dispatch_floating(scale.dtype(),
                    "grad_scale", [&](auto tag) { grad_scale_impl<typename decltype(tag)::type>(tensors, scale); });
}

}  // namespace qgrad::kernels::cuda
