// Division by a divisor that many dividends share (a channel's): x / d, the
// IEEE quotient rounded to nearest, with d's reciprocal taken once.
//
// Why: on CUDA an f32 x / d is ~10 issued instructions (a reciprocal
// approximation, its Newton step, the quotient and its correction, a range
// check and the slow-path branch), ~12 of the ~50 an element in batch norm's
// statistics, its backward passes and the fused pooling, which are
// instruction-bound. With r = RN(1 / d) taken once, five instructions give the
// same quotient wherever the operands are well inside the normal range:
//   q0 = RN(x r)                   (within ~1.5 ulp of x / d)
//   q1 = RN(q0 + RN(x - d q0) r)   (fma; within 1/2 ulp + 2^-22 ulp: faithful)
//   q  = RN(q1 + (x - d q1) r)     (fma; the residual is exact)
// The last step is Markstein's theorem (Russinoff's ACL2 proof,
// "markstein-lemma": |1 - d r| < 2^-24 holds for r = RN(1 / d), and q1 is
// within one ulp of x / d), so q = RN(x / d), the bits of the division.
// Its conditions (quotients in the normal range, every residual
// representable) hold for |d| in [2^-32, 2^32] and |x| in [2^-90, 2^90]:
// the quotient is then within [2^-122, 2^122] and every residual a multiple
// of at least 2^-137 (exact even where subnormal). Anything else (0,
// subnormals, infinities, NaN, huge or tiny operands) is not covered: the
// caller learns so and divides. dev/cuda/shared_division.cu checks the
// sequence against __fdiv_rn (2.2e13 pairs on an H200, no mismatch).
//
// Use: a kernel runs its body with FastDivision, whose in_range() is false
// where a dividend was outside the sequence's range; the body is then run
// again with ExactDivision (x / d itself) and its results overwrite the
// first run's (with_shared_division). On the host both are x / d (the CPU
// kernels divide; the sequence is a CUDA instruction count matter).
#pragma once

#include <cmath>

#include "qgrad/core/half.h"

namespace qgrad::formulas {

template <class M>
struct SharedDivisor {
  M d = M(1);
  M recip = M(1);     // RN(1 / d), where `fast`
  bool fast = false;  // f32 with |d| in [2^-32, 2^32]
  QGRAD_HD static SharedDivisor of(M d) {
    SharedDivisor s;
    s.d = d;
    if constexpr (sizeof(M) == 4) {
      const M a = d < M(0) ? -d : d;
      s.fast = a >= M(0x1p-32f) && a <= M(0x1p32f);
      s.recip = s.fast ? M(1) / d : M(1);
    }
    return s;
  }
  // x / d, the division itself.
  QGRAD_HD M exact(M x) const { return x / d; }
  // x / d by the sequence above, for a divisor with `fast` and x in its
  // range (FastDivision checks x); on the host, the division.
  QGRAD_HD M fast_quotient(M x) const {
#if defined(__CUDA_ARCH__)
    if constexpr (sizeof(M) == 4) {
      const float q0 = __fmul_rn(x, recip);
      const float q1 = __fmaf_rn(__fmaf_rn(-d, q0, x), recip, q0);
      return __fmaf_rn(__fmaf_rn(-d, q1, x), recip, q1);
    }
#endif
    return x / d;
  }
};

// How a kernel body divides by a SharedDivisor (see the header comment).
struct ExactDivision {
  template <class M>
  QGRAD_HD M divide(const SharedDivisor<M>& s, M x) {
    return s.exact(x);
  }
};
struct FastDivision {
  // The smallest and largest |x| divided (NaN kept by the largest): two
  // instructions an element, where a flag and its tests were four.
  float lo = INFINITY, hi = 0.0f;
  template <class M>
  QGRAD_HD M divide(const SharedDivisor<M>& s, M x) {
#if defined(__CUDA_ARCH__)
    if constexpr (sizeof(M) == 4) {
      const float a = fabsf(x);
      lo = fminf(lo, a);
      asm("max.NaN.f32 %0, %0, %1;" : "+f"(hi) : "f"(a));
    }
#endif
    return s.fast_quotient(x);
  }
  // Every x divided was in the sequence's range: its quotients were x / d.
  QGRAD_HD bool in_range() const { return lo >= 0x1p-90f && hi <= 0x1p90f; }
};

// body(division) with FastDivision where `fast` (every divisor the body
// uses has SharedDivisor::fast), then, where one of its quotients was
// outside the fast sequence's range, again with ExactDivision; without
// `fast`, with ExactDivision only. The body must be safe to run twice (its
// writes overwritten by the second run).
template <class Body>
QGRAD_HD void with_shared_division(bool fast, Body&& body) {
  if (fast) {
    FastDivision division;
    body(division);
    if (division.in_range()) return;
  }
  ExactDivision division;
  body(division);
}

}  // namespace qgrad::formulas
