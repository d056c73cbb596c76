// Host references for the quantization tests, written from PyTorch's CPU
// formulas independently of kernels/formulas/quantize.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "helpers.h"

namespace qref {

using namespace qgrad;

// Storage value of a double in T (16-bit types through float).
template <class T>
T to_t(double v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else return T(static_cast<float>(v));
}
template <class T>
double to_d(T v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else return static_cast<double>(static_cast<float>(v));
}

// q = nearbyint(x * (1.0f / s)) + zp in op math; NaN flagged.
template <class T>
long double ref_q(T x, float s, std::int64_t zp, bool& nan) {
  using M = op_math_t<T>;
  const float inv = 1.0f / s;
  const M v = static_cast<M>(to_d(x)) * static_cast<M>(inv);
  nan = std::isnan(v);
  if (nan) return 0;
  return static_cast<long double>(std::nearbyint(v)) + static_cast<long double>(zp);
}

// (qc - zp) * s: in f64 rounded once (PyTorch's per-channel kernel) or as
// float(qc - zp) * s in f32 (its per-tensor kernel and dequantize).
template <class T>
T ref_value(long double k, float s, bool double_product) {
  if (double_product) return to_t<T>(static_cast<double>(k) * static_cast<double>(s));
  return to_t<T>(static_cast<double>(static_cast<float>(k) * s));
}

template <class T>
T ref_fake_quant(T x, float s, std::int64_t zp, std::int64_t qmin, std::int64_t qmax, bool& in,
                 bool double_product = false) {
  bool nan;
  const long double q = ref_q(x, s, zp, nan);
  if (nan) {
    in = false;
    return x;
  }
  in = q >= qmin && q <= qmax;
  const long double qc = std::min<long double>(std::max<long double>(q, qmin), qmax);
  return ref_value<T>(qc - zp, s, double_product);
}

template <class T>
std::int64_t ref_quantize(T x, float s, std::int64_t zp, std::int64_t qmin, std::int64_t qmax, bool& in) {
  bool nan;
  const long double q = ref_q(x, s, zp, nan);
  if (nan) {
    in = false;
    return qmin;
  }
  in = q >= qmin && q <= qmax;
  return static_cast<std::int64_t>(std::min<long double>(std::max<long double>(q, qmin), qmax));
}

template <class T>
std::vector<T> host(const Tensor& t) {
  return t.detach().cpu().to_vector<T>();
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Random values of dtype T: normal * stddev, plus the special values.
inline Tensor random_input(const Shape& shape, DType dt, std::uint64_t seed, double stddev = 3.0) {
  Generator g(seed);
  return randn(shape, g, TensorOptions{}.with_dtype(dt), 0.0, stddev);
}

// x = (k + 0.5) * scale exactly for a power-of-two scale: every element a tie.
inline std::vector<double> halves(int lo, int hi, double scale) {
  std::vector<double> v;
  for (int k = lo; k < hi; ++k) v.push_back((k + 0.5) * scale);
  return v;
}

inline Tensor from_doubles(const std::vector<double>& v, DType dt, Device dev = Device::cpu()) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(dt).to(dev);
}

// A fresh leaf holding t's values.
inline Tensor leaf_of(const Tensor& t) {
  Tensor l = t.detach().clone();
  l.set_requires_grad(true);
  return l;
}

inline TensorOptions f32() { return TensorOptions{}.with_dtype(DType::f32); }
inline TensorOptions s32() { return TensorOptions{}.with_dtype(DType::s32); }

inline const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace qref
