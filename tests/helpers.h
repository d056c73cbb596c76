// Shared test helpers: GPU presence, seeded inputs, poisoning, comparison.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "qgrad/qgrad.h"
#include "qgrad/kernels/broadcast.h"
#include "qgrad/ops/check.h"

namespace qgrad::testing {

// A process-wide switch (Get / Set) held at a value for the scope.
template <bool (*Get)(), void (*Set)(bool)>
struct ScopedSwitch {
  bool before = Get();
  explicit ScopedSwitch(bool on) { Set(on); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;
  ~ScopedSwitch() { Set(before); }
};
using SideStream = ScopedSwitch<cuda_side_stream, cuda_set_side_stream>;
using ConvTf32 = ScopedSwitch<conv_allow_tf32, set_conv_allow_tf32>;

// f() throws a qgrad::Error whose op and argument contain `op` and `arg`.
template <class F>
void check_error(F&& f, const std::string& op, const std::string& arg) {
  try {
    f();
    FAIL("expected qgrad::Error from ", op, " naming ", arg);
  } catch (const Error& e) {
    CHECK_MESSAGE(e.op().find(op) != std::string::npos, e.what());
    CHECK_MESSAGE(e.arg().find(arg) != std::string::npos, e.what());
  }
}

// True when a CUDA device is present; otherwise prints the skip message
// ctest looks for (SKIPPED:) once per call site.
inline bool has_gpu() { return cuda_available(); }

// The CPU, and CUDA device 0 when one is present (for tests that run on
// every device without skipping).
inline std::vector<Device> test_devices() {
  std::vector<Device> d{Device::cpu()};
  if (has_gpu()) d.push_back(Device::cuda(0));
  return d;
}

#define QGRAD_REQUIRE_GPU()                                                   \
  do {                                                                        \
    if (!::qgrad::testing::has_gpu()) {                                       \
      std::printf("SKIPPED: no CUDA device present; this test needs a GPU\n"); \
      return;                                                                 \
    }                                                                         \
  } while (0)

// Bitwise equality of two tensors' contents (any dtype; both copied to host).
inline bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ha = a.detach().cpu(), hb = b.detach().cpu();
  return std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

// Values as doubles (host copy).
inline std::vector<double> values(const Tensor& t) {
  Tensor h = t.detach().to(DType::f64).cpu();
  return h.to_vector<double>();
}

// Max |a - b| over elements (NaN-aware: NaN in one only counts as infinite).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto va = values(a), vb = values(b);
  REQUIRE(va.size() == vb.size());
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) && std::isnan(vb[i])) continue;
    if (va[i] == vb[i]) continue;
    const double d = std::fabs(va[i] - vb[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

// Relative Frobenius error ||a - b|| / ||b|| of two value lists.
inline double rel_fro(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// Fills a tensor with NaN (floating) or a 0x5A byte pattern (integers) so an
// element a kernel forgot to write is caught.
inline void poison(const Tensor& t) {
  if (is_floating(t.dtype())) {
    Tensor p = full(t.shape(), NAN, TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()));
    const_cast<Tensor&>(t).copy_(p);
  } else {
    std::vector<unsigned char> bytes(t.nbytes(), 0x5A);
    Tensor host = Tensor::empty(t.shape(), TensorOptions{}.with_dtype(t.dtype()));
    std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
    const_cast<Tensor&>(t).copy_(host);
  }
}

}  // namespace qgrad::testing
