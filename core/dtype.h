// Element types and compile-time dispatch over them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "qgrad/core/error.h"
#include "qgrad/core/float8.h"
#include "qgrad/core/half.h"

namespace qgrad {

// s4 / u4: packed 4-bit integers, two per byte (core/float8.h: element 2k
// in the low nibble of byte k). Their shape and numel count elements (4-bit
// values); the storage holds ceil(numel / 2) bytes (dtype_bytes).
// f8e4m3 / f8e5m2: OCP FP8 (torch.float8_e4m3fn / torch.float8_e5m2).
// Neither kind is "floating" (is_floating): they are storage formats that
// the quantization ops (ops/lowbit.h) and Tensor::to write and read.
enum class DType : std::uint8_t { f32, f64, f16, bf16, s8, u8, s32, s64, boolean, s4, u4, f8e4m3, f8e5m2 };

// How CUDA computes f32 matrix products (qgrad::set_float32_matmul,
// ops/linalg.h; the CPU always runs f32 FMAs):
//   ieee:   f32 FMAs (cuBLAS CUBLAS_COMPUTE_32F), the default;
//   tf32:   each operand rounded to TF32 (10 mantissa bits) on the tensor
//           cores, the products summed in f32 (PyTorch's allow_tf32);
//   tf32x3: f32-level accuracy on the TF32 tensor cores: each operand split
//           into a TF32 value and its remainder, three products summed in f32
//           (the small ones first), the remainders' product dropped.
enum class Float32Matmul : std::uint8_t { ieee, tf32, tf32x3 };

constexpr bool is_packed_int4(DType t) { return t == DType::s4 || t == DType::u4; }
constexpr bool is_fp8(DType t) { return t == DType::f8e4m3 || t == DType::f8e5m2; }

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::s64: return 8;
    case DType::f32: case DType::s32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::s8: case DType::u8: case DType::boolean: return 1;
    case DType::f8e4m3: case DType::f8e5m2: return 1;
    case DType::s4: case DType::u4: return 1;  // bytes per two elements: use dtype_bytes
  }
  return 0;
}

// Bytes of storage for n elements: n * dtype_size, or ceil(n / 2) for the
// packed 4-bit dtypes.
constexpr std::size_t dtype_bytes(DType t, std::size_t n) { return is_packed_int4(t) ? (n + 1) / 2 : n * dtype_size(t); }

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::s8: return "s8";
    case DType::u8: return "u8";
    case DType::s32: return "s32";
    case DType::s64: return "s64";
    case DType::boolean: return "bool";
    case DType::s4: return "s4";
    case DType::u4: return "u4";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

DType dtype_from_name(const std::string& name);  // throws qgrad::Error

// C++ type <-> DType.
template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<half> { static constexpr DType value = DType::f16; };
template <> struct DTypeOf<bfloat16> { static constexpr DType value = DType::bf16; };
template <> struct DTypeOf<std::int8_t> { static constexpr DType value = DType::s8; };
template <> struct DTypeOf<std::uint8_t> { static constexpr DType value = DType::u8; };
template <> struct DTypeOf<std::int32_t> { static constexpr DType value = DType::s32; };
template <> struct DTypeOf<std::int64_t> { static constexpr DType value = DType::s64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::boolean; };
template <> struct DTypeOf<float8_e4m3> { static constexpr DType value = DType::f8e4m3; };
template <> struct DTypeOf<float8_e5m2> { static constexpr DType value = DType::f8e5m2; };
template <class T> inline constexpr DType dtype_of = DTypeOf<T>::value;

// A tag carrying a type, so a generic lambda can receive it:
//   dispatch_floating(dt, "op", [&](auto tag) { using T = typename decltype(tag)::type; ... });
template <class T> struct TypeTag { using type = T; };

template <class F>
decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f(TypeTag<float>{});
    case DType::f64: return f(TypeTag<double>{});
    case DType::f16: return f(TypeTag<half>{});
    case DType::bf16: return f(TypeTag<bfloat16>{});
    default: break;
  }
  throw Error(op, "dtype", std::string("expected a floating dtype (f32, f64, f16, bf16), got ") + dtype_name(t));
}

template <class F>
decltype(auto) dispatch_int8(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::s8: return f(TypeTag<std::int8_t>{});
    case DType::u8: return f(TypeTag<std::uint8_t>{});
    default: break;
  }
  throw Error(op, "dtype", std::string("expected s8 or u8, got ") + dtype_name(t));
}

template <class F>
decltype(auto) dispatch_fp8(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f8e4m3: return f(TypeTag<float8_e4m3>{});
    case DType::f8e5m2: return f(TypeTag<float8_e5m2>{});
    default: break;
  }
  throw Error(op, "dtype", std::string("expected f8e4m3 or f8e5m2, got ") + dtype_name(t));
}

// Every dtype with an element type: all but the packed s4 / u4.
template <class F>
decltype(auto) dispatch_all(DType t, const char* op, F&& f) {
  if (is_floating(t)) return dispatch_floating(t, op, std::forward<F>(f));
  switch (t) {
    case DType::s8: return f(TypeTag<std::int8_t>{});
    case DType::u8: return f(TypeTag<std::uint8_t>{});
    case DType::s32: return f(TypeTag<std::int32_t>{});
    case DType::s64: return f(TypeTag<std::int64_t>{});
    case DType::boolean: return f(TypeTag<bool>{});
    case DType::f8e4m3: return f(TypeTag<float8_e4m3>{});
    case DType::f8e5m2: return f(TypeTag<float8_e5m2>{});
    default: break;
  }
  throw Error(op, "dtype", std::string("dtype ") + dtype_name(t) + " has no element type (packed 4-bit)");
}

}  // namespace qgrad
