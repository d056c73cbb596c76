// Fuzzes the public ops' argument validation on the CPU. The input is
// decoded into an op choice and its arguments: tensors of any dtype and
// rank with small (or zero, negative, overflowing) dims and values that
// include non-finite ones, axes, scales (non-finite, negative, tiny, huge),
// zero points and qmin / qmax. A qgrad::Error is a valid outcome; a crash,
// sanitizer report, leak, other exception or hang is a finding. Tensors
// that would need more than a few MB are not built (libFuzzer treats a
// large malloc as a finding), but shapes that overflow int64 or cannot be
// addressed are still passed to the factories, which must reject them.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fuzz_common.h"
#include "qgrad/ops/ops.h"
#include "qgrad/nn/smoothquant.h"
#include "qgrad/ops/registry.h"

using namespace qgrad;

namespace {

// Small enough that broadcasting two such tensors (up to kMaxElems^2
// elements) and their backward stay far below the 2 GB RSS limit.
constexpr std::int64_t kMaxElems = 1 << 9;

const DType kDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::s8,
                         DType::u8,  DType::s32, DType::s64, DType::boolean};

DType pick_dtype(FuzzedDataProvider& p) {
  // Mostly f32 so that most inputs get past the dtype checks.
  const std::uint8_t b = p.ConsumeIntegral<std::uint8_t>();
  return b < 128 ? DType::f32 : kDTypes[b % 9];
}

double pick_double(FuzzedDataProvider& p) {
  static const double special[] = {0.0, -0.0, 1.0, -1.0, 0.5, 1e-3, 1e-45, 1e-300, 3e38, 1e300, 65504.0,
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(),
                                   std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::denorm_min(), 127.0, -128.0, 255.0, 2.5, -2.5};
  const std::uint8_t b = p.ConsumeIntegral<std::uint8_t>();
  if (b < 160) return special[b % (sizeof special / sizeof special[0])];
  return p.ConsumeFloatingPoint<double>();
}

std::int64_t pick_int(FuzzedDataProvider& p) {
  static const std::int64_t special[] = {0, 1, -1, 2, -2, 3, 127, -128, 255, 256, -129, 4, 16,
                                         std::numeric_limits<std::int32_t>::max(),
                                         std::numeric_limits<std::int32_t>::min(),
                                         std::numeric_limits<std::int64_t>::max(),
                                         std::numeric_limits<std::int64_t>::min()};
  const std::uint8_t b = p.ConsumeIntegral<std::uint8_t>();
  if (b < 200) return special[b % (sizeof special / sizeof special[0])];
  return p.ConsumeIntegral<std::int64_t>();
}

std::int64_t pick_dim(FuzzedDataProvider& p) {
  static const std::int64_t dims[] = {1, 2, 3, 4, 5, 8, 1, 2, 3, 0, 16, 7};
  const std::uint8_t b = p.ConsumeIntegral<std::uint8_t>();
  if (b < 250) return dims[b % 12];
  if (b == 250) return -1;
  if (b == 251) return std::numeric_limits<std::int64_t>::max();
  if (b == 252) return std::int64_t{1} << 32;
  return p.ConsumeIntegral<std::int64_t>();
}

Shape pick_shape(FuzzedDataProvider& p) {
  Shape s(p.ConsumeIntegralInRange<std::size_t>(0, 4));
  for (auto& d : s) d = pick_dim(p);
  return s;
}

// Element count, or -1 when negative / overflowing.
std::int64_t count(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

// Product of the non-zero dims (what an op reducing a zero-size axis may
// allocate), or -1 when negative / overflowing.
std::int64_t count_nonzero(const Shape& s) {
  Shape nz;
  for (std::int64_t d : s)
    if (d != 0) nz.push_back(d);
  return count(nz);
}

// A tensor with fuzzed values, or an undefined one. Shapes too large to
// build (or whose zero-size reductions would be) are shrunk to one element.
Tensor make_tensor(FuzzedDataProvider& p, DType dtype, Shape shape) {
  if (p.ConsumeIntegral<std::uint8_t>() == 0) return Tensor();
  const std::int64_t n = count_nonzero(shape);
  if (n < 0 || n > kMaxElems) shape.assign(shape.size(), 1);
  const std::int64_t m = count(shape);
  std::vector<double> v(static_cast<std::size_t>(m));
  for (auto& x : v) x = p.remaining_bytes() ? pick_double(p) : 1.25;
  Tensor t = Tensor::from_vector(v, shape);
  if (dtype != DType::f64) {
    if (!is_floating(dtype)) {
      // Integer conversions of non-finite / huge doubles are not defined:
      // build integers from integer values.
      std::vector<std::int64_t> iv(v.size());
      for (std::size_t i = 0; i < v.size(); ++i)
        iv[i] = std::isfinite(v[i]) ? static_cast<std::int64_t>(std::fmod(v[i], 100.0)) : 1;
      t = Tensor::from_vector(iv, shape);
    }
    if (dtype != t.dtype()) t = t.to(dtype);
  }
  if (is_floating(dtype) && p.ConsumeBool()) t.set_requires_grad(true);
  return t;
}

Tensor tensor(FuzzedDataProvider& p) { return make_tensor(p, pick_dtype(p), pick_shape(p)); }
Tensor tensor_like(FuzzedDataProvider& p, const Tensor& ref) {
  if (!ref.defined() || p.ConsumeIntegral<std::uint8_t>() < 32) return tensor(p);
  return make_tensor(p, ref.dtype(), ref.shape());
}
Tensor scale_tensor(FuzzedDataProvider& p, std::int64_t n) {
  const DType d = p.ConsumeIntegral<std::uint8_t>() < 200 ? DType::f32 : pick_dtype(p);
  return make_tensor(p, d, p.ConsumeBool() ? Shape{n} : pick_shape(p));
}
Tensor zp_tensor(FuzzedDataProvider& p, std::int64_t n, DType want) {
  const DType d = p.ConsumeIntegral<std::uint8_t>() < 200 ? want : pick_dtype(p);
  return make_tensor(p, d, p.ConsumeBool() ? Shape{n} : pick_shape(p));
}
DType qdtype(FuzzedDataProvider& p) {
  const std::uint8_t b = p.ConsumeIntegral<std::uint8_t>();
  return b < 100 ? DType::s8 : b < 200 ? DType::u8 : kDTypes[b % 9];
}
DType out_dtype(FuzzedDataProvider& p) {
  const std::uint8_t b = p.ConsumeIntegral<std::uint8_t>();
  return b < 200 ? DType::f32 : kDTypes[b % 9];
}
std::int64_t size_at(const Tensor& t, std::int64_t axis) {
  if (!t.defined() || t.dim() == 0) return 1;
  const std::int64_t r = t.dim();
  return (axis >= -r && axis < r) ? t.size(axis) : 1;
}

Tensor run_op(FuzzedDataProvider& p) {
  const int op = p.ConsumeIntegralInRange<int>(0, 40);
  Tensor x = tensor(p);
  switch (op) {
    case 0: return add(x, tensor_like(p, x));
    case 1: return sub(x, tensor_like(p, x));
    case 2: return mul(x, tensor_like(p, x));
    case 3: return div(x, tensor_like(p, x));
    case 4: return add(x, pick_double(p));
    case 5: return mul(x, pick_double(p));
    case 6: return neg(x);
    case 7: return sum_to_shape(x, pick_shape(p));
    case 8: return relu(x);
    case 9: return matmul(x, tensor(p));
    case 10: {
      Tensor w = tensor(p);
      return linear(x, w, p.ConsumeBool() ? Tensor() : tensor(p));
    }
    case 11: return transpose(x, pick_int(p), pick_int(p));
    case 12: return log_softmax(x, pick_int(p));
    case 13: return cross_entropy(x, tensor(p));
    case 14: return sum(x);
    case 15: return mean(x);
    case 16: return sum(x, pick_int(p), p.ConsumeBool());
    case 17: return mean(x, pick_int(p), p.ConsumeBool());
    case 18: return argmax(x, pick_int(p));
    case 19: return lerp(x, tensor_like(p, x), pick_double(p));
    case 20: {
      Tensor b = tensor_like(p, x);
      return lerp(x, b, tensor_like(p, x));
    }
    case 21: return fake_quantize_per_tensor(x, pick_double(p), pick_int(p), pick_int(p), pick_int(p));
    case 22: {
      Tensor s = scale_tensor(p, 1);
      Tensor z = zp_tensor(p, 1, DType::s32);
      return fake_quantize_per_tensor(x, s, z, pick_int(p), pick_int(p));
    }
    case 23: {
      const std::int64_t axis = pick_int(p);
      Tensor s = scale_tensor(p, size_at(x, axis));
      Tensor z = zp_tensor(p, size_at(x, axis), DType::s32);
      return fake_quantize_per_channel(x, s, z, axis, pick_int(p), pick_int(p));
    }
    case 24: {
      Tensor s = scale_tensor(p, 1);
      Tensor z = scale_tensor(p, 1);
      return fake_quantize_learnable_per_tensor(x, s, z, pick_int(p), pick_int(p), pick_double(p));
    }
    case 25: {
      const std::int64_t axis = pick_int(p);
      Tensor s = scale_tensor(p, size_at(x, axis));
      Tensor z = scale_tensor(p, size_at(x, axis));
      return fake_quantize_learnable_per_channel(x, s, z, axis, pick_int(p), pick_int(p), pick_double(p));
    }
    case 26: return quantize_per_tensor(x, pick_double(p), pick_int(p), qdtype(p));
    case 27: {
      Tensor s = scale_tensor(p, 1);
      Tensor z = zp_tensor(p, 1, DType::s32);
      return quantize_per_tensor(x, s, z, qdtype(p));
    }
    case 28: return dequantize_per_tensor(x, pick_double(p), pick_int(p), out_dtype(p));
    case 29: {
      Tensor s = scale_tensor(p, 1);
      Tensor z = zp_tensor(p, 1, DType::s32);
      return dequantize_per_tensor(x, s, z, out_dtype(p));
    }
    case 30: case 31: {
      const std::int64_t axis = pick_int(p);
      Tensor s = scale_tensor(p, size_at(x, axis));
      Tensor z = zp_tensor(p, size_at(x, axis), DType::s32);
      return op == 30 ? quantize_per_channel(x, s, z, axis, qdtype(p))
                      : dequantize_per_channel(x, s, z, axis, out_dtype(p));
    }
    case 32: case 33: {
      Tensor s = scale_tensor(p, size_at(x, 0));
      Tensor z = zp_tensor(p, size_at(x, 0), DType::s32);
      return op == 32 ? quantize_per_token(x, s, z, qdtype(p)) : dequantize_per_token(x, s, z, out_dtype(p));
    }
    case 34: case 35: {
      const std::int64_t g = pick_int(p);
      Tensor s = scale_tensor(p, 1);
      Tensor z = zp_tensor(p, 1, DType::s32);
      return op == 34 ? quantize_per_group(x, s, z, g, qdtype(p)) : dequantize_per_group(x, s, z, g, out_dtype(p));
    }
    case 36: {
      const std::uint8_t k = p.ConsumeIntegral<std::uint8_t>() % 4;
      const std::int64_t a = pick_int(p), g = pick_int(p);
      const QuantScope scope = k == 0 ? QuantScope::per_tensor() : k == 1 ? QuantScope::per_channel(a)
                               : k == 2 ? QuantScope::per_token() : QuantScope::per_group(a, g);
      const QuantMode mode = p.ConsumeBool() ? QuantMode::symmetric : QuantMode::asymmetric;
      if (p.ConsumeBool()) return dynamic_range_quantize(x, scope, mode, qdtype(p)).q;
      const DType d = qdtype(p);
      return dynamic_range_quantize(x, scope, mode, d, pick_int(p), pick_int(p)).q;
    }
    case 37: {
      Tensor wq = make_tensor(p, qdtype(p), pick_shape(p));
      Tensor ws = scale_tensor(p, wq.defined() && wq.dim() > 0 ? wq.size(0) : 1);
      Tensor bias = p.ConsumeBool() ? Tensor() : scale_tensor(p, wq.defined() && wq.dim() > 0 ? wq.size(0) : 1);
      ActivationQuant act = ActivationQuant::dynamic();
      if (p.ConsumeBool()) {
        Tensor s = scale_tensor(p, 1);
        Tensor z = zp_tensor(p, 1, DType::s32);
        act = ActivationQuant::fixed(s, z, pick_int(p), pick_int(p));
      } else {
        act.qmin = pick_int(p);
        act.qmax = pick_int(p);
      }
      return quantized_linear(x, wq, ws, bias, act, out_dtype(p));
    }
    case 38: {
      Tensor w = tensor(p);
      return smoothquant_factors(x, w, pick_double(p));
    }
    case 39: {
      // Factories and views with arbitrary shapes: only shapes that are
      // invalid (negative, overflowing, unaddressable) or small are tried.
      const Shape s = pick_shape(p);
      const std::int64_t n = count_nonzero(s);
      if (n > kMaxElems && static_cast<std::uint64_t>(n) <= (std::uint64_t{1} << 47) / 8) return x;
      switch (p.ConsumeIntegral<std::uint8_t>() % 5) {
        case 0: return Tensor::empty(s, TensorOptions{}.with_dtype(pick_dtype(p)));
        case 1: return full(s, pick_double(p), TensorOptions{}.with_dtype(pick_dtype(p)));
        case 2: { Generator gen(7); return randn(s, gen); }
        case 3: { Generator gen(7); return randint(pick_int(p), pick_int(p), s, gen, TensorOptions{}.with_dtype(pick_dtype(p))); }
        default: return x.defined() ? x.reshape(s) : x;
      }
    }
    default: {
      // Conversions and in-place copies.
      if (!x.defined()) return x;
      if (p.ConsumeBool()) return x.to(pick_dtype(p));
      Tensor dst = tensor_like(p, x);
      if (dst.defined()) dst.detach().copy_(x);
      return dst;
    }
  }
}

// Every op of the registry (ops/registry.h), so an op added there is fuzzed
// without a case here: its inputs are made with a fuzzed dtype and seed, then
// one of them may be replaced by a fuzzed tensor (any dtype, rank, dims,
// values) before the call; and its documented bad inputs are run too.
Tensor run_registry_op(FuzzedDataProvider& p) {
  const auto& entries = registry::op_registry();
  const registry::OpEntry& e = entries[p.ConsumeIntegralInRange<std::size_t>(0, entries.size() - 1)];
  const DType dt = e.dtypes[p.ConsumeIntegralInRange<std::size_t>(0, e.dtypes.size() - 1)];
  Generator g(p.ConsumeIntegral<std::uint64_t>());
  std::vector<Tensor> in = e.inputs(Device::cpu(), dt, g);
  if (!in.empty() && p.ConsumeBool()) in[p.ConsumeIntegralInRange<std::size_t>(0, in.size() - 1)] = tensor(p);
  if (e.bad_inputs && p.ConsumeBool()) {
    for (const registry::BadInput& b : e.bad_inputs(Device::cpu())) fuzz::expect_ok_or_error(b.run);
  }
  const std::vector<Tensor> out = e.call(in);
  return out.empty() ? Tensor() : out[0];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider p(data, size);
  fuzz::expect_ok_or_error([&] {
    // Half the inputs drive a registry entry, half the argument-level cases
    // (host scalars, axes, qparams) of run_op.
    Tensor y = p.ConsumeBool() ? run_registry_op(p) : run_op(p);
    // Backward through whatever was recorded (the gradient rules run too).
    if (y.defined() && y.requires_grad() && is_floating(y.dtype()) && y.numel() > 0) sum(y).backward();
  });
  return 0;
}
