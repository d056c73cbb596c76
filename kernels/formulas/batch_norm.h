// Scalar formulas of batch_norm's forward, shared by its kernels
// (kernels/batch_norm.cpp) and by the fused pooling that reads the
// normalised tensor where it needs it (kernels/pool.cpp): one definition of
// the value batch_norm_apply writes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "qgrad/core/half.h"
#include "qgrad/kernels/formulas/activation.h"
#include "qgrad/kernels/formulas/division.h"

namespace qgrad::formulas {

// The input of the normalisation: x itself, or, fused with the
// channel_div_add before it (channel_div_add_batch_norm), channel_div_add's
// value T(T(x / divisor[c]) + shift[c]) recomputed from its input x: the
// same bits as the tensor channel_div_add writes.
template <class T>
struct Unscale {
  const T* divisor = nullptr;  // null: identity
  const T* shift = nullptr;    // null: none (with divisor)
  // Channel c's parameters, read once (at, shared): a kernel that binds them
  // before its loop over the channel's elements holds them in registers,
  // where a per-element read is repeated after every division (the
  // compiler does not reuse a load across the division's slow-path call).
  // shared(c) also takes the divisor's reciprocal, for a kernel that
  // divides many of c's elements under a Division (formulas/division.h).
  struct At {
    SharedDivisor<op_math_t<T>> div;
    op_math_t<T> shift = 0;
    bool divides = false, shifts = false;
    template <class Division = ExactDivision>
    QGRAD_HD T value(T x, Division&& division = {}) const {
      using M = op_math_t<T>;
      if (!divides) return x;
      const T q = T(division.divide(div, M(x)));
      return shifts ? T(M(q) + shift) : q;
    }
    // Whether value() under FastDivision applies (formulas::with_shared_division).
    QGRAD_HD bool fast() const { return !divides || div.fast; }
    // Both a divisor and a shift (the Conv-BN blocks' case); every(): this
    // At with its flags set where the caller knows them, so that a kernel
    // specialised on that (formulas::for_every) tests no flag per element.
    QGRAD_HD bool is_every() const { return divides && shifts; }
    QGRAD_HD At every() const {
      At a = *this;
      a.divides = a.shifts = true;
      return a;
    }
    QGRAD_HD op_math_t<T> operator()(T x) const { return op_math_t<T>(value(x)); }
    template <class Division>
    QGRAD_HD op_math_t<T> operator()(T x, Division& division) const {
      return op_math_t<T>(value(x, division));
    }
  };
  QGRAD_HD At at(std::int64_t c) const {
    using M = op_math_t<T>;
    At a;
    if (divisor) {
      a.divides = true;
      a.div.d = M(divisor[c]);
      if (shift) {
        a.shifts = true;
        a.shift = M(shift[c]);
      }
    }
    return a;
  }
  QGRAD_HD At shared(std::int64_t c) const {
    At a = at(c);
    if (a.divides) a.div = SharedDivisor<op_math_t<T>>::of(a.div.d);
    return a;
  }
  QGRAD_HD T value(T x, std::int64_t c) const { return at(c).value(x); }
  QGRAD_HD op_math_t<T> operator()(T x, std::int64_t c) const { return op_math_t<T>(value(x, c)); }
};

// The normalised value of x in channel c, rounded to T: batch_norm's output.
template <class T>
struct Normalize {
  const op_math_t<T>* mean;
  const op_math_t<T>* invstd;
  const T* weight;  // null: 1
  const T* bias;    // null: 0
  // Channel c's parameters, read once (see Unscale::At).
  struct At {
    op_math_t<T> mean, invstd, weight = 1, bias = 0;
    bool scales = false, shifts = false;
    // Weight and bias both given; every(): see Unscale::At.
    QGRAD_HD bool is_every() const { return scales && shifts; }
    QGRAD_HD At every() const {
      At a = *this;
      a.scales = a.shifts = true;
      return a;
    }
    QGRAD_HD T operator()(op_math_t<T> x) const {
      using M = op_math_t<T>;
      M r = (x - mean) * invstd;
      if (scales) r = r * weight;
      if (shifts) r = r + bias;
      return T(r);
    }
  };
  QGRAD_HD At at(std::int64_t c) const {
    using M = op_math_t<T>;
    At a{mean[c], invstd[c]};
    if (weight) {
      a.scales = true;
      a.weight = M(weight[c]);
    }
    if (bias) {
      a.shifts = true;
      a.bias = M(bias[c]);
    }
    return a;
  }
  QGRAD_HD T operator()(op_math_t<T> x, std::int64_t c) const { return at(c)(x); }
};

// body(At-flag-constant tag): body(std::true_type{}) where `every` (the
// kernel's channel parameters have every optional part, and the body takes
// their every() copies), else body(std::false_type{}): two instantiations,
// the first without a flag test per element (3-8 instructions an element
// in batch norm's passes).
template <class Body>
QGRAD_HD void for_every(bool every, Body&& body) {
  if (every) body(std::true_type{});
  else body(std::false_type{});
}

// batch_norm's output with relu (batch_norm_relu, and
// channel_div_add_batch_norm with relu) at an element x of channel c:
// relu of the normalised value as the relu op computes it, rounded to T.
template <class T>
QGRAD_HD T normalize_relu(const typename Normalize<T>::At& norm, op_math_t<T> x) {
  return T(relu(op_math_t<T>(norm(x))));
}
template <class T>
QGRAD_HD T normalize_relu(const Normalize<T>& norm, op_math_t<T> x, std::int64_t c) {
  return normalize_relu<T>(norm.at(c), x);
}

// Numeric min / max with NaN winning, for the range of a channel's
// normalisation inputs. Signed zeros need no order here: every step from
// that input to relu's output maps -0 and +0 to equal values, and relu never
// returns -0.
template <class M>
QGRAD_HD M range_min(M a, M b) {
  return (a != a || b != b) ? (a != a ? a : b) : (b < a ? b : a);
}
template <class M>
QGRAD_HD M range_max(M a, M b) {
  return (a != a || b != b) ? (a != a ? a : b) : (b > a ? b : a);
}

}  // namespace qgrad::formulas
