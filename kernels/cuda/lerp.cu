// The vectorised CUDA kernels of lerp: when every operand has the output's
// shape, each thread handles four consecutive elements with 16-byte (f32)
// loads and stores. Other shapes take the generic loop of kernels/lerp.cpp.
#include <cstdint>

#include "qgrad/core/cuda/common.cuh"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/vec4.h"

namespace qgrad::kernels::cuda {

namespace {

template <class T>
__device__ __forceinline__ Vec4<T> load4(const T* p) {
  return *reinterpret_cast<const Vec4<T>*>(p);
}
template <class T>
__device__ __forceinline__ void store4(T* p, const Vec4<T>& v) {
  *reinterpret_cast<Vec4<T>*>(p) = v;
}

bool aligned16(const void* p, std::size_t elem) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % (4 * elem) == 0;
}

// One vector of four per thread on a grid that covers the tensor once (at
// most blocks_for's cap, then grid-stride): an H100 sweep (2026-11-24,
// docs/benchmarks.md) put this shape at the copy rate, 1.0526 ms for 256M
// f32, where two vectors per thread on 8 waves of resident blocks took 1.096.
unsigned vec_blocks(std::int64_t n) { return ::qgrad::cuda::blocks_for((n + 3) / 4, 256); }

template <class T>
__global__ void __launch_bounds__(256) lerp_fw_vec(LerpElems<T> e, T* __restrict__ out, std::int64_t n) {
  ::qgrad::cuda::wait_for_prior_kernels();
  using M = op_math_t<T>;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t full = n / 4;  // whole vectors
  for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < full; v += stride) {
    const Vec4<T> a = load4(e.a + 4 * v), b = load4(e.b + 4 * v);
    Vec4<T> w;
    if (e.w) w = load4(e.w + 4 * v);
    Vec4<T> o;
#pragma unroll
    for (int k = 0; k < 4; ++k) o.v[k] = T(formulas::lerp_value<M>(M(a.v[k]), M(b.v[k]), e.w ? M(w.v[k]) : e.wm));
    store4(out + 4 * v, o);
  }
  // The last n % 4 elements.
  const std::int64_t tail = 4 * full + static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tail < n) out[tail] = e.forward(tail, tail, tail);
}

template <class T>
__global__ void lerp_bw_vec(LerpElems<T> e, LerpGradOut<T> go, std::int64_t n) {
  ::qgrad::cuda::wait_for_prior_kernels();
  const T* __restrict__ dy = go.g;
  T* __restrict__ da = go.da;
  T* __restrict__ db = go.db;
  T* __restrict__ dw = go.dw;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; 4 * v < n; v += stride) {
    const std::int64_t i0 = 4 * v;
    if (i0 + 3 < n) {
      const Vec4<T> g = load4(dy + i0);
      Vec4<T> w;
      if (e.w) w = load4(e.w + i0);
      if (da) {
        Vec4<T> o;
#pragma unroll
        for (int k = 0; k < 4; ++k)
          o.v[k] = e.w ? formulas::mul_round(g.v[k], formulas::lerp_one_minus(w.v[k]))
                       : T(op_math_t<T>(g.v[k]) * e.one_minus_wm);
        store4(da + i0, o);
      }
      if (db) {
        Vec4<T> o;
#pragma unroll
        for (int k = 0; k < 4; ++k)
          o.v[k] = e.w ? formulas::mul_round(g.v[k], w.v[k]) : T(op_math_t<T>(g.v[k]) * e.wm);
        store4(db + i0, o);
      }
      if (dw) {
        const Vec4<T> a = load4(e.a + i0), b = load4(e.b + i0);
        Vec4<T> o;
#pragma unroll
        for (int k = 0; k < 4; ++k) o.v[k] = formulas::mul_round(g.v[k], formulas::sub_round(b.v[k], a.v[k]));
        store4(dw + i0, o);
      }
    } else {
      for (std::int64_t i = i0; i < n; ++i) go.write(e, i, i, i, i);
    }
  }
}

template <class T>
bool lerp_forward_vec_impl(const LerpArgs& args, const Tensor& out) {
  const LerpElems<T> e = make_lerp_elems<T>(args);
  const LerpIndex li = make_lerp_index(args, out.shape());
  T* o = static_cast<T*>(out.data_ptr());
  const int dev = out.device().index;
  const std::int64_t n = out.numel();
  if (n == 0) return true;
  if (!(li.same && aligned16(e.a, sizeof(T)) && aligned16(e.b, sizeof(T)) && aligned16(e.w, sizeof(T)) &&
        aligned16(o, sizeof(T))))
    return false;
  ::qgrad::cuda::launch_kernel(dev, lerp_fw_vec<T>, vec_blocks(n), 256, 0, e, o, n);
  return true;
}

template <class T>
bool lerp_backward_vec_impl(const LerpArgs& args, const Tensor& dy, const Tensor& da, const Tensor& db,
                            const Tensor& dw) {
  const LerpElems<T> e = make_lerp_elems<T>(args);
  const LerpIndex li = make_lerp_index(args, dy.shape());
  const LerpGradOut<T> go = make_lerp_grad_out<T>(dy, da, db, dw);
  const int dev = dy.device().index;
  const std::int64_t n = dy.numel();
  if (n == 0) return true;
  const std::size_t sz = sizeof(T);
  if (!(li.same && aligned16(e.a, sz) && aligned16(e.b, sz) && aligned16(e.w, sz) && aligned16(go.g, sz) &&
        aligned16(go.da, sz) && aligned16(go.db, sz) && aligned16(go.dw, sz)))
    return false;
  ::qgrad::cuda::launch_kernel(dev, lerp_bw_vec<T>, vec_blocks(n), 256, 0, e, go, n);
  return true;
}

}  // namespace

bool lerp_forward_vec(const LerpArgs& args, const Tensor& out) {
  return dispatch_floating(out.dtype(), "lerp",
                           [&](auto tag) { return lerp_forward_vec_impl<typename decltype(tag)::type>(args, out); });
}

bool lerp_backward_vec(const LerpArgs& args, const Tensor& dy, const Tensor& da, const Tensor& db, const Tensor& dw) {
  return dispatch_floating(dy.dtype(), "lerp_backward", [&](auto tag) {
    return lerp_backward_vec_impl<typename decltype(tag)::type>(args, dy, da, db, dw);
  });
}

}  // namespace qgrad::kernels::cuda
