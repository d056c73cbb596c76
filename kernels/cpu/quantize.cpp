// CPU kernels of the quantization ops: the same formulas, mask layout and
// reduction order as kernels/cuda/quantize*.cu, so the two agree bit for bit.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include "qgrad/kernels/cpu/simd.h"

#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/cpu/fake_quant_run.h"
#include "qgrad/kernels/cpu/masked_grad.h"
#include "qgrad/kernels/cpu/parallel.h"
#include "qgrad/kernels/quantize.h"

namespace qgrad::kernels::cpu {

namespace {

template <class Op>
inline constexpr bool kIsF32FakeQuant = false;
template <bool kD>
inline constexpr bool kIsF32FakeQuant<formulas::FakeQuantOp<float, kD>> = true;
template <bool kD>
inline constexpr bool kIsF32FakeQuant<formulas::FakeQuantReluOp<float, kD>> = true;
template <class Op>
inline constexpr bool kIsRelu = false;
template <class T, bool kD>
inline constexpr bool kIsRelu<formulas::FakeQuantReluOp<T, kD>> = true;

// Fake quantize of f32 elements of one mask block that share one channel,
// without integer conversions or branches (four SSE2 lanes a step): round half to even by adding and subtracting
// 2^23, clamp in float against lo = qmin - zp and hi = qmax - zp. Each step
// is exact, so values and mask bits equal FakeQuantOp's (formulas/quantize.h)
// whenever |lo|, |hi| <= 2^24 (the caller checks): float(clamp(q) - zp) is
// the clamped rounded value itself (+ 0.0f turns -0 into the +0 the integer
// path gives), NaN passes x through with bit 0, +-inf clamps to hi / lo.
#if QGRAD_CPU_AVX512
// fake_quant_run_f32's SSE2 steps sixteen lanes at a time from k (a
// multiple of 4, so lane e is bit (k >> 2) + e / 4 of word e % 4: BMI2's pext
// gathers each word's four bits of the compare mask). Returns the first
// element not done.
QGRAD_TARGET_AVX512 std::int64_t fake_quant_lanes16_f32(const float* x, float* y, std::int64_t k, std::int64_t end,
                                                        const formulas::ChannelParams& p, float lo, float hi,
                                                        float mask_lo, std::uint32_t (&w)[kBitmaskWordsPerBlock]) {
  const __m512 vbig = _mm512_set1_ps(8388608.0f), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  const __m512 vmlo = _mm512_set1_ps(mask_lo);
  const __m512 vinv = _mm512_set1_ps(p.inv_scale), vscale = _mm512_set1_ps(p.scale), zero = _mm512_setzero_ps();
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  for (; k + 16 <= end; k += 16) {
    const __m512 xv = _mm512_loadu_ps(x + k);
    const __m512 v = _mm512_mul_ps(xv, vinv);
    const __m512 rp = _mm512_sub_ps(_mm512_add_ps(v, vbig), vbig), rn = _mm512_add_ps(_mm512_sub_ps(v, vbig), vbig);
    const __m512 r0 = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, zero, _CMP_GE_OQ), rn, rp);
    const __m512 av = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), absmask));
    const __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(av, vbig, _CMP_LT_OQ), v, r0);
    const __mmask16 in = _mm512_cmp_ps_mask(r, vmlo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(r, vhi, _CMP_LE_OQ);
    const __m512 above = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(r, vhi, _CMP_GT_OQ), r, vhi);
    const __m512 c = _mm512_add_ps(_mm512_mask_blend_ps(_mm512_cmp_ps_mask(r, vlo, _CMP_LT_OQ), above, vlo), zero);
    _mm512_storeu_ps(y + k, _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_EQ_OQ), xv, _mm512_mul_ps(c, vscale)));
    const unsigned m = in;
    for (unsigned j = 0; j < 4; ++j) w[j] |= _pext_u32(m, 0x1111u << j) << (k >> 2);
  }
  return k;
}
#endif

// Elements [begin, end) of the block (x and y at its start), their mask bits
// or-ed into w; the lanes from a multiple of 4 (lane j is word j's bit). The
// values clamp to [lo, hi]; the bit is mask_lo <= r <= hi (mask_lo = lo for
// the fake quantize; fake_quant_block_run_f32 raises both for its relu).
void fake_quant_run_f32(const float* x, float* y, std::int64_t begin, std::int64_t end,
                        const formulas::ChannelParams& p, float lo, float hi, float mask_lo,
                        std::uint32_t (&w)[kBitmaskWordsPerBlock]) {
  constexpr float big = 8388608.0f;
  auto scalar = [&](std::int64_t k) {
    const float xv = x[k];
    const float v = xv * p.inv_scale;
    const float r0 = v >= 0.0f ? (v + big) - big : (v - big) + big;
    const float r = std::fabs(v) < big ? r0 : v;
    w[k & 3] |= static_cast<std::uint32_t>(r >= mask_lo && r <= hi) << (k >> 2);
    const float c = (r < lo ? lo : (r > hi ? hi : r)) + 0.0f;
    y[k] = v == v ? c * p.scale : xv;
  };
  std::int64_t k = begin;
  for (; k < end && (k & 3) != 0; ++k) scalar(k);
#if QGRAD_CPU_AVX512
  if (use_avx512()) k = fake_quant_lanes16_f32(x, y, k, end, p, lo, hi, mask_lo, w);
#endif
#if defined(__SSE2__)
  // The same steps four lanes at a time (SSE2 is in every x86-64 CPU; each
  // instruction is one IEEE single operation, as the scalar code below).
  const __m128 vbig = _mm_set1_ps(big), vlo = _mm_set1_ps(lo), vhi = _mm_set1_ps(hi), vmlo = _mm_set1_ps(mask_lo);
  const __m128 vinv = _mm_set1_ps(p.inv_scale), vscale = _mm_set1_ps(p.scale), zero = _mm_setzero_ps();
  const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  auto blend = [](__m128 m, __m128 a, __m128 b) { return _mm_or_ps(_mm_and_ps(m, a), _mm_andnot_ps(m, b)); };
  for (; k + 4 <= end; k += 4) {
    const __m128 xv = _mm_loadu_ps(x + k);
    const __m128 v = _mm_mul_ps(xv, vinv);
    const __m128 rp = _mm_sub_ps(_mm_add_ps(v, vbig), vbig), rn = _mm_add_ps(_mm_sub_ps(v, vbig), vbig);
    const __m128 r0 = blend(_mm_cmpge_ps(v, zero), rp, rn);
    const __m128 r = blend(_mm_cmplt_ps(_mm_and_ps(v, absmask), vbig), r0, v);
    const __m128 in = _mm_and_ps(_mm_cmpge_ps(r, vmlo), _mm_cmple_ps(r, vhi));
    const __m128 c = _mm_add_ps(blend(_mm_cmplt_ps(r, vlo), vlo, blend(_mm_cmpgt_ps(r, vhi), vhi, r)), zero);
    _mm_storeu_ps(y + k, blend(_mm_cmpeq_ps(v, v), _mm_mul_ps(c, vscale), xv));
    const unsigned m = static_cast<unsigned>(_mm_movemask_ps(in));
    for (unsigned j = 0; j < 4; ++j) w[j] |= ((m >> j) & 1u) << (k >> 2);
  }
#endif
  for (; k < end; ++k) scalar(k);
}

template <class Op>
void engine(const QuantLaunch& a) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const In* in = static_cast<const In*>(a.in.data_ptr());
  Out* out = static_cast<Out*>(a.out.data_ptr());
  const std::int64_t n = a.in.numel();
  const QuantParams& qp = a.params;
  const Op op{qp.qmin, qp.qmax};
  const ChannelIndexer map(qp.layout);
  const formulas::ParamSource ps = qp.source;
  const std::uint32_t* mask_in = a.mask_in;
  std::uint32_t* mask_out = a.mask_out;
  if constexpr (std::is_same_v<Op, formulas::FakeQuantGradOp<float>>) {  // a mask block at a time, the same bits
    masked_grad_f32(MaskedGrad::multiply, in, mask_in, out, n);
    return;
  }
  // One 128-element mask block per iteration, as one warp on CUDA.
  parallel_for(bitmask_blocks(n), [&](std::int64_t b) {
    std::uint32_t words[kBitmaskWordsPerBlock] = {0, 0, 0, 0};
    const std::int64_t end = std::min(n, (b + 1) * kBitmaskBlock);
    if constexpr (kIsF32FakeQuant<Op>) {
      // The block as runs of one channel each: runs of `inner` consecutive
      // elements (one run for a per-tensor layout), each vectorised where its
      // range allows (else, and for runs shorter than 16, the whole block
      // takes the per-element loop below).
      const std::int64_t i0 = b * kBitmaskBlock, inner = qp.layout.channels == 1 ? n : qp.layout.inner;
      if (inner >= 16 || (qp.layout.channels == 1 && inner > 0)) {
        bool fast = true;
        for (std::int64_t i = i0; i < end && fast; i = (i / inner + 1) * inner)
          fast = fake_quant_vector_exact(ps.get(map.channel(i)), qp.qmin, qp.qmax);
        if (fast) {
          for (std::int64_t i = i0; i < end; i = (i / inner + 1) * inner)
            fake_quant_block_run_f32(in + i0, out + i0, i - i0, std::min(end, (i / inner + 1) * inner) - i0,
                                     ps.get(map.channel(i)), qp.qmin, qp.qmax, words, kIsRelu<Op>);
          if (mask_out)
            for (std::int64_t k = 0; k < kBitmaskWordsPerBlock; ++k) mask_out[b * kBitmaskWordsPerBlock + k] = words[k];
          return;
        }
      }
    }
    std::int64_t cached_c = -1;
    formulas::ChannelParams p;
    for (std::int64_t i = b * kBitmaskBlock; i < end; ++i) {
      if constexpr (Op::kParams) {
        const std::int64_t c = map.channel(i);
        if (c != cached_c) {
          p = ps.get(c);
          cached_c = c;
        }
      }
      bool bit_in = false, bit_out = false;
      if constexpr (Op::kReadsMask) bit_in = bitmask_get(mask_in, i);
      out[i] = op(in[i], p, bit_in, bit_out);
      if (bit_out) words[i & 3] |= 1u << bitmask_bit_of(i);
    }
    if constexpr (Op::kWritesMask) {
      if (mask_out)
        for (std::int64_t k = 0; k < kBitmaskWordsPerBlock; ++k) mask_out[b * kBitmaskWordsPerBlock + k] = words[k];
    }
  }, kParallelGrain / kBitmaskBlock);
}

// The tree p[t] += p[t + s], s = 128, ..., 1, over kLsqThreads partials.
template <class M>
void lsq_tree(M* acc_s, M* acc_z) {
  for (int s = formulas::kLsqThreads / 2; s > 0; s >>= 1)
    for (int t = 0; t < s; ++t) {
      acc_s[t] = acc_s[t] + acc_s[t + s];
      acc_z[t] = acc_z[t] + acc_z[t + s];
    }
}

template <class T>
void lsq_backward_impl(const LsqArgs& a) {
  using M = op_math_t<T>;
  constexpr int kT = formulas::kLsqThreads;
  const T* x = static_cast<const T*>(a.x.data_ptr());
  const T* dy = static_cast<const T*>(a.dy.data_ptr());
  T* dx = static_cast<T*>(a.dx.data_ptr());
  M* ds = static_cast<M*>(a.ds.data_ptr());
  M* dz = static_cast<M*>(a.dz.data_ptr());
  const formulas::ParamSource ps{a.scale.data<float>(), a.zp.data<std::int32_t>(), 1.0f, 0};
  const AxisLayout& lay = a.layout;
  const std::int64_t per_channel = lay.outer * lay.inner;
  const std::int64_t chunks = (per_channel + formulas::kLsqChunk - 1) / formulas::kLsqChunk;
  const M g = static_cast<M>(a.grad_factor);
  std::vector<M> part_s(static_cast<std::size_t>(lay.channels * chunks)), part_z(part_s.size());
  // Stage 1: one chunk per iteration, as one thread block on CUDA.
  parallel_for(lay.channels * chunks, [&](std::int64_t blk) {
    const std::int64_t c = blk / chunks, start = (blk % chunks) * formulas::kLsqChunk;
    const std::int64_t end = std::min(per_channel, start + formulas::kLsqChunk);
    const formulas::ChannelParams p = ps.get(c);
    M acc_s[kT], acc_z[kT];
    for (int t = 0; t < kT; ++t) {
      M s = M(0), z = M(0);
      for (std::int64_t j = start + t; j < end; j += kT) {
        const std::int64_t off = formulas::lsq_offset(lay, j, c);
        const auto r = formulas::lsq_grad<M>(M(x[off]), M(dy[off]), p, a.qmin, a.qmax, g);
        dx[off] = T(r.dx);
        s = s + r.ds;
        z = z + r.dz;
      }
      acc_s[t] = s;
      acc_z[t] = z;
    }
    lsq_tree(acc_s, acc_z);
    part_s[static_cast<std::size_t>(blk)] = acc_s[0];
    part_z[static_cast<std::size_t>(blk)] = acc_z[0];
  }, 2);
  // Stage 2: one channel per iteration, as one thread block on CUDA.
  parallel_for(lay.channels, [&](std::int64_t c) {
    M acc_s[kT], acc_z[kT];
    for (int t = 0; t < kT; ++t) {
      M s = M(0), z = M(0);
      for (std::int64_t k = t; k < chunks; k += kT) {
        s = s + part_s[static_cast<std::size_t>(c * chunks + k)];
        z = z + part_z[static_cast<std::size_t>(c * chunks + k)];
      }
      acc_s[t] = s;
      acc_z[t] = z;
    }
    lsq_tree(acc_s, acc_z);
    ds[c] = acc_s[0];
    dz[c] = acc_z[0];
  });
}

}  // namespace

void fake_quant_block_run_f32(const float* x, float* y, std::int64_t begin, std::int64_t end,
                              const formulas::ChannelParams& p, std::int64_t qmin, std::int64_t qmax,
                              std::uint32_t (&w)[kBitmaskWordsPerBlock], bool relu) {
  const float lo = static_cast<float>(qmin - p.zp), hi = static_cast<float>(qmax - p.zp);
  // relu(y) = y for c = clamp(r, lo, hi) > 0 and +0 for c <= 0, so it is the
  // clamp to [max(lo, 0), hi] (0 * scale is +0); its bit also needs c > 0,
  // which for the integer-valued r is r >= 1.
  if (relu) fake_quant_run_f32(x, y, begin, end, p, std::max(lo, 0.0f), hi, std::max(lo, 1.0f), w);
  else fake_quant_run_f32(x, y, begin, end, p, lo, hi, lo, w);
}

void quant_elementwise(const QuantLaunch& l) {
  dispatch_quant_kernel(l, [&]<class Op>() { engine<Op>(l); });
}

void lsq_backward(const LsqArgs& args) {
  dispatch_floating(args.x.dtype(), "lsq_backward",
                    [&](auto tag) { lsq_backward_impl<typename decltype(tag)::type>(args); });
}

void lsq_round_zero_point(const Tensor& zp, const Tensor& out, std::int64_t qmin, std::int64_t qmax) {
  dispatch_floating(zp.dtype(), "lsq_round_zero_point", [&](auto tag) {
    using Z = typename decltype(tag)::type;
    const Z* z = static_cast<const Z*>(zp.data_ptr());
    std::int32_t* o = out.data<std::int32_t>();
    for (std::int64_t i = 0; i < out.numel(); ++i) o[i] = formulas::lsq_zero_point(z[i], qmin, qmax);
  });
}

}  // namespace qgrad::kernels::cpu
