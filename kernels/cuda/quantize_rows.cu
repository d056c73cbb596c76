// CUDA kernels of LSQ's backward (the scale and zero-point gradients'
// partial sums in a fixed order) and of fake_quantize_dynamic over rows (a
// warp a row: its range, qparams, fake quantize and mask in one launch).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"
#include "qgrad/kernels/cuda/minmax.cuh"
#include "qgrad/kernels/cuda/quant_engine.cuh"
#include "qgrad/kernels/formulas/lowbit.h"
#include "qgrad/kernels/formulas/transformer.h"
#include "qgrad/kernels/observer.h"
#include "qgrad/kernels/quantize.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels::cuda {

namespace {

// The tree p[t] += p[t + s], s = 128, ..., 1, over the block's partials;
// thread 0 gets the result. Same order as kernels/cpu/quantize.cpp.
template <class M>
__device__ void lsq_block_tree(M s, M z, M* sh_s, M* sh_z) {
  const int t = static_cast<int>(threadIdx.x);
  sh_s[t] = s;
  sh_z[t] = z;
  __syncthreads();
  for (int w = formulas::kLsqThreads / 2; w > 0; w >>= 1) {
    if (t < w) {
      sh_s[t] = sh_s[t] + sh_s[t + w];
      sh_z[t] = sh_z[t] + sh_z[t + w];
    }
    __syncthreads();
  }
}

// Stage 1 of the LSQ backward: one block per (channel, chunk), fused with
// dx (x and dy read once). Thread t sums j = t, t + 256, ... in order; the
// loads of four iterations are issued before their sums, to keep enough
// bytes in flight.
template <class T>
__global__ void __launch_bounds__(formulas::kLsqThreads)
    lsq_partial_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                       op_math_t<T>* __restrict__ part_s, op_math_t<T>* __restrict__ part_z,
                       formulas::ParamSource ps, AxisLayout lay, std::int64_t chunks, std::int64_t qmin,
                       std::int64_t qmax, op_math_t<T> g) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  constexpr int kT = formulas::kLsqThreads, kU = 4;
  __shared__ M sh_s[kT];
  __shared__ M sh_z[kT];
  const int t = static_cast<int>(threadIdx.x);
  const std::int64_t per_channel = lay.outer * lay.inner;
  for (std::int64_t blk = blockIdx.x; blk < lay.channels * chunks; blk += gridDim.x) {
    const std::int64_t c = blk / chunks, start = (blk % chunks) * formulas::kLsqChunk;
    const std::int64_t end = start + formulas::kLsqChunk < per_channel ? start + formulas::kLsqChunk : per_channel;
    const formulas::ChannelParams p = ps.get(c);
    M s = M(0), z = M(0);
    for (std::int64_t j0 = start + t; j0 < end; j0 += kU * kT) {
      std::int64_t off[kU];
      T xv[kU], gv[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const std::int64_t j = j0 + u * kT;
        off[u] = j < end ? formulas::lsq_offset(lay, j, c) : -1;
        if (off[u] >= 0) {
          xv[u] = x[off[u]];
          gv[u] = dy[off[u]];
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (off[u] < 0) break;
        const auto r = formulas::lsq_grad<M>(M(xv[u]), M(gv[u]), p, qmin, qmax, g);
        dx[off[u]] = T(r.dx);
        s = s + r.ds;
        z = z + r.dz;
      }
    }
    lsq_block_tree<M>(s, z, sh_s, sh_z);
    if (t == 0) {
      part_s[blk] = sh_s[0];
      part_z[blk] = sh_z[0];
    }
    __syncthreads();
  }
}

// Stage 2: one block per channel combines its chunk sums in fixed order.
template <class M>
__global__ void __launch_bounds__(formulas::kLsqThreads)
    lsq_finish_kernel(const M* __restrict__ part_s, const M* __restrict__ part_z, std::int64_t chunks,
                      M* __restrict__ ds, M* __restrict__ dz) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ M sh_s[formulas::kLsqThreads];
  __shared__ M sh_z[formulas::kLsqThreads];
  const std::int64_t c = blockIdx.x;
  M s = M(0), z = M(0);
  for (std::int64_t k = threadIdx.x; k < chunks; k += formulas::kLsqThreads) {
    s = s + part_s[c * chunks + k];
    z = z + part_z[c * chunks + k];
  }
  lsq_block_tree<M>(s, z, sh_s, sh_z);
  if (threadIdx.x == 0) {
    ds[c] = sh_s[0];
    dz[c] = sh_z[0];
  }
}

template <class T>
void lsq_backward_impl(const LsqArgs& a) {
  using M = op_math_t<T>;
  const int dev = a.dx.device().index;
  const std::int64_t per_channel = a.layout.outer * a.layout.inner;
  const std::int64_t chunks = (per_channel + formulas::kLsqChunk - 1) / formulas::kLsqChunk;
  const std::int64_t total = a.layout.channels * chunks;
  if (a.layout.channels == 0) return;
  Tensor part = Tensor::empty({2 * total}, TensorOptions{}.with_dtype(dtype_of<M>).with_device(a.dx.device()));
  M* part_s = static_cast<M*>(part.data_ptr());
  M* part_z = part_s + total;
  const formulas::ParamSource ps{a.scale.data<float>(), a.zp.data<std::int32_t>(), 1.0f, 0};
  if (total > 0) {
    const unsigned blocks = static_cast<unsigned>(total < 65535LL * 32 ? total : 65535LL * 32);
    ::qgrad::cuda::launch_kernel(dev, lsq_partial_kernel<T>, blocks, formulas::kLsqThreads, 0,
                                 static_cast<const T*>(a.x.data_ptr()), static_cast<const T*>(a.dy.data_ptr()),
                                 static_cast<T*>(a.dx.data_ptr()), part_s, part_z, ps, a.layout, chunks, a.qmin, a.qmax,
                                 static_cast<M>(a.grad_factor));
  }
  // One block per channel (grid x allows 2^31 - 1 blocks).
  ::qgrad::cuda::launch_kernel(dev, lsq_finish_kernel<M>, static_cast<unsigned>(a.layout.channels),
                               formulas::kLsqThreads, 0, part_s, part_z, chunks, static_cast<M*>(a.ds.data_ptr()),
                               static_cast<M*>(a.dz.data_ptr()));
}

// ---- fake_quantize_dynamic over rows (ops/lowbit.h) ----
// A warp per row of D = 128 * kChunks elements (per-token activations,
// per-channel weight rows): the row is loaded once into registers (each lane
// four consecutive elements of each 128-element mask block, as the engine),
// its min/max reduced by shuffles (warp_minmax_values: the observer's
// order-free combine), the qparams formed by formulas::int4_qparams
// (choose_qparams_affine's) in every lane, then fake quantized with
// formulas::FakeQuantOp (the per-token op, f64 product form; its float form
// where exact) and its mask words built by ballots. One launch for
// what the composition does in five (two fills, min/max, qparams, fake quant).
constexpr int kDynamicRowsThreads = 256;

// The row's values after the prologue, in x's dtype (the gelu op's rounding).
template <RowPrologue kPrologue, class T>
__device__ __forceinline__ T row_prologue(T v) {
  if constexpr (kPrologue == RowPrologue::gelu) return T(formulas::gelu_erf(op_math_t<T>(v)));
  else if constexpr (kPrologue == RowPrologue::gelu_tanh) return T(formulas::gelu_tanh(op_math_t<T>(v)));
  else return v;
}

// One warp's row: load, min/max, qparams, fake quant, mask (rows of the
// tensor at x / y / mask, `rows` of them).
template <class T, int kChunks, bool kVec, RowPrologue kPrologue>
__device__ __forceinline__ void fake_quantize_dynamic_row(const T* __restrict__ x, T* __restrict__ y,
                                                          std::uint32_t* __restrict__ mask, std::int64_t row,
                                                          std::int64_t rows, unsigned lane, int qmin, int qmax,
                                                          bool symmetric, float eps) {
  const std::int64_t n = rows * kChunks * kBitmaskBlock;
  T v[kChunks][4];
  float f[kChunks * 4];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    engine_load<T, kVec>(x, row * kChunks + c, lane, n, v[c]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[c][k] = row_prologue<kPrologue>(v[c][k]);
      f[4 * c + k] = formulas::cast_value<float>(v[c][k]);
    }
  }
  float lo, hi;
  warp_minmax_values(f, lo, hi);
  formulas::ChannelParams p;
  formulas::int4_qparams(lo, hi, qmin, qmax, symmetric, eps, p.scale, p.zp);
  p.inv_scale = formulas::inv_scale_of(p.scale);
  const formulas::FakeQuantOp<T, true> op{qmin, qmax};
  const bool float_form = op.float_form_exact(p);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const std::int64_t b = row * kChunks + c, i0 = b * kBitmaskBlock + 4 * static_cast<std::int64_t>(lane);
    T o[4];
    bool bit[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = op.row_value(v[c][k], p, float_form, bit[k]);
    if (kVec) {
      Vec4<T> w;
#pragma unroll
      for (int k = 0; k < 4; ++k) w.v[k] = o[k];
      *reinterpret_cast<Vec4<T>*>(y + i0) = w;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) y[i0 + k] = o[k];
    }
    if (mask) store_mask_block(mask, b, bit, lane);  // uniform across the warp
  }
}

template <class T, int kChunks, bool kVec, RowPrologue kPrologue>
__global__ void __launch_bounds__(kDynamicRowsThreads)
    fake_quantize_dynamic_rows_kernel(const T* __restrict__ x, T* __restrict__ y, std::uint32_t* __restrict__ mask,
                                      std::int64_t rows, int qmin, int qmax, bool symmetric, float eps) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;  // whole warps leave together
  fake_quantize_dynamic_row<T, kChunks, kVec, kPrologue>(x, y, mask, row, rows, threadIdx.x & 31u, qmin, qmax,
                                                         symmetric, eps);
}

// f(std::integral_constant<int, kChunks>) for the row lengths the row
// kernels take (128 * kChunks elements); false for any other length.
template <class F>
bool with_row_chunks(std::int64_t row_len, F f) {
  switch (row_len) {
    case 128: return f(std::integral_constant<int, 1>{});
    case 256: return f(std::integral_constant<int, 2>{});
    case 384: return f(std::integral_constant<int, 3>{});
    case 512: return f(std::integral_constant<int, 4>{});
    case 768: return f(std::integral_constant<int, 6>{});
    case 1024: return f(std::integral_constant<int, 8>{});
    default: return false;
  }
}

// fake_quantize_dynamic_rows_batch: up to kRowsBatchMax tensors of one row
// length in one launch, their rows numbered one after another (tensor t's
// rows from first_row[t]); a warp finds its tensor by a scan of the table
// (uniform across the warp), then does fake_quantize_dynamic_row.
constexpr int kRowsBatchMax = 32;
template <class T>
struct RowsBatchTable {
  const T* x[kRowsBatchMax];
  T* y[kRowsBatchMax];
  std::uint32_t* mask[kRowsBatchMax];
  std::int64_t first_row[kRowsBatchMax + 1];
  int count;
};

template <class T, int kChunks, bool kVec>
__global__ void __launch_bounds__(kDynamicRowsThreads)
    fake_quantize_dynamic_rows_batch_kernel(const RowsBatchTable<T> table, int qmin, int qmax, bool symmetric,
                                            float eps) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (row >= table.first_row[table.count]) return;  // whole warps leave together
  int t = 0;
  while (row >= table.first_row[t + 1]) ++t;
  fake_quantize_dynamic_row<T, kChunks, kVec, RowPrologue::none>(
      table.x[t], table.y[t], table.mask[t], row - table.first_row[t], table.first_row[t + 1] - table.first_row[t],
      threadIdx.x & 31u, qmin, qmax, symmetric, eps);
}

template <class T, int kChunks>
void fake_quantize_dynamic_rows_batch_launch(const std::vector<RowsBatchItem>& items, std::size_t first,
                                             std::size_t count, std::int64_t row_len, int qmin, int qmax,
                                             bool symmetric, float eps) {
  RowsBatchTable<T> table{};
  table.count = static_cast<int>(count);
  bool vec = true;
  for (std::size_t i = 0; i < count; ++i) {
    const RowsBatchItem& it = items[first + i];
    table.x[i] = static_cast<const T*>(it.x.data_ptr());
    table.y[i] = static_cast<T*>(it.y.data_ptr());
    table.mask[i] = it.mask;
    table.first_row[i + 1] = table.first_row[i] + it.x.numel() / row_len;
    vec = vec && vec4_aligned<T>(table.x[i]) && vec4_aligned<T>(table.y[i]);
  }
  constexpr int rows_per_block = kDynamicRowsThreads / 32;
  const auto blocks = static_cast<unsigned>((table.first_row[count] + rows_per_block - 1) / rows_per_block);
  const int dev = items[first].y.device().index;
  if (vec)
    ::qgrad::cuda::launch_kernel(dev, fake_quantize_dynamic_rows_batch_kernel<T, kChunks, true>, blocks,
                                 kDynamicRowsThreads, 0, table, qmin, qmax, symmetric, eps);
  else
    ::qgrad::cuda::launch_kernel(dev, fake_quantize_dynamic_rows_batch_kernel<T, kChunks, false>, blocks,
                                 kDynamicRowsThreads, 0, table, qmin, qmax, symmetric, eps);
}

template <class T>
bool fake_quantize_dynamic_rows_batch_typed(const std::vector<RowsBatchItem>& items, std::int64_t row_len, int qmin,
                                            int qmax, bool symmetric, float eps) {
  auto launch_all = [&](auto chunks) {
    for (std::size_t first = 0; first < items.size(); first += kRowsBatchMax) {
      const std::size_t count = std::min<std::size_t>(kRowsBatchMax, items.size() - first);
      fake_quantize_dynamic_rows_batch_launch<T, decltype(chunks)::value>(items, first, count, row_len, qmin, qmax,
                                                                          symmetric, eps);
    }
    return true;
  };
  return with_row_chunks(row_len, launch_all);
}

template <class T, int kChunks, RowPrologue kPrologue>
void fake_quantize_dynamic_rows_launch(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t rows,
                                       int qmin, int qmax, bool symmetric, float eps) {
  const T* in = static_cast<const T*>(x.data_ptr());
  T* out = static_cast<T*>(y.data_ptr());
  const bool vec = vec4_aligned<T>(in) && vec4_aligned<T>(out);
  constexpr int rows_per_block = kDynamicRowsThreads / 32;
  const auto blocks = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  if (vec)
    ::qgrad::cuda::launch_kernel(y.device().index, fake_quantize_dynamic_rows_kernel<T, kChunks, true, kPrologue>,
                                 blocks, kDynamicRowsThreads, 0, in, out, mask, rows, qmin, qmax, symmetric, eps);
  else
    ::qgrad::cuda::launch_kernel(y.device().index, fake_quantize_dynamic_rows_kernel<T, kChunks, false, kPrologue>,
                                 blocks, kDynamicRowsThreads, 0, in, out, mask, rows, qmin, qmax, symmetric, eps);
}

template <class T, RowPrologue kPrologue>
bool fake_quantize_dynamic_rows_impl(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t row_len,
                                     int qmin, int qmax, bool symmetric, float eps) {
  const std::int64_t rows = x.numel() / row_len;
  auto launch = [&](auto chunks) {
    fake_quantize_dynamic_rows_launch<T, decltype(chunks)::value, kPrologue>(x, y, mask, rows, qmin, qmax, symmetric,
                                                                            eps);
    return true;
  };
  return with_row_chunks(row_len, launch);
}

template <class T>
bool fake_quantize_dynamic_rows_typed(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t row_len,
                                      int qmin, int qmax, bool symmetric, float eps, RowPrologue prologue) {
  switch (prologue) {
    case RowPrologue::none:
      return fake_quantize_dynamic_rows_impl<T, RowPrologue::none>(x, y, mask, row_len, qmin, qmax, symmetric, eps);
    case RowPrologue::gelu:
      return fake_quantize_dynamic_rows_impl<T, RowPrologue::gelu>(x, y, mask, row_len, qmin, qmax, symmetric, eps);
    case RowPrologue::gelu_tanh:
      return fake_quantize_dynamic_rows_impl<T, RowPrologue::gelu_tanh>(x, y, mask, row_len, qmin, qmax, symmetric,
                                                                        eps);
  }
  return false;
}

template <class Z>
void round_zero_point_impl(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax) {
  const Z* z = static_cast<const Z*>(zp.data_ptr());
  std::int32_t* o = out.data<std::int32_t>();
  launch_elementwise(out.device().index, out.numel(),
                     [=] __device__(std::int64_t i) { o[i] = formulas::lsq_zero_point(z[i], qmin, qmax); });
}

}  // namespace

void lsq_backward(const LsqArgs& args) {
  dispatch_floating(args.x.dtype(), "lsq_backward",
                    [&](auto tag) { lsq_backward_impl<typename decltype(tag)::type>(args); });
}

void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax) {
  dispatch_floating(zp.dtype(), "lsq_round_zero_point",
                    [&](auto tag) { round_zero_point_impl<typename decltype(tag)::type>(zp, out, qmin, qmax); });
}

bool fake_quantize_dynamic_rows(const Tensor& x, const Tensor& y, std::uint32_t* mask, std::int64_t row_len, int qmin,
                                int qmax, bool symmetric, float eps, RowPrologue prologue) {
  if (x.numel() == 0 || row_len <= 0 || x.numel() % row_len != 0) return false;
  switch (x.dtype()) {
    case DType::f32:
      return fake_quantize_dynamic_rows_typed<float>(x, y, mask, row_len, qmin, qmax, symmetric, eps, prologue);
    case DType::bf16:
      return fake_quantize_dynamic_rows_typed<bfloat16>(x, y, mask, row_len, qmin, qmax, symmetric, eps, prologue);
    case DType::f16:
      return fake_quantize_dynamic_rows_typed<half>(x, y, mask, row_len, qmin, qmax, symmetric, eps, prologue);
    default: return false;
  }
}

bool fake_quantize_dynamic_rows_batch(const std::vector<RowsBatchItem>& items, std::int64_t row_len, int qmin,
                                      int qmax, bool symmetric, float eps) {
  if (items.empty() || row_len <= 0) return false;
  const DType dt = items[0].x.dtype();
  const Device dev = items[0].x.device();
  for (const RowsBatchItem& it : items)
    if (it.x.dtype() != dt || it.y.dtype() != dt || it.x.device() != dev || it.y.device() != dev ||
        it.x.numel() == 0 || it.x.numel() != it.y.numel() || it.x.numel() % row_len != 0 ||
        it.x.numel() / row_len > (std::int64_t{1} << 31) / 32)
      return false;
  switch (dt) {
    case DType::f32: return fake_quantize_dynamic_rows_batch_typed<float>(items, row_len, qmin, qmax, symmetric, eps);
    case DType::bf16:
      return fake_quantize_dynamic_rows_batch_typed<bfloat16>(items, row_len, qmin, qmax, symmetric, eps);
    case DType::f16: return fake_quantize_dynamic_rows_batch_typed<half>(items, row_len, qmin, qmax, symmetric, eps);
    default: return false;
  }
}

}  // namespace qgrad::kernels::cuda
