// matmul, linear, transpose: validation, forward, saved state and backward.
#include "qgrad/ops/linalg.h"

#include <atomic>
#include <climits>
#include <optional>

#include "qgrad/autograd/node.h"
#include "qgrad/kernels/activation.h"
#include "qgrad/kernels/bitmask.h"
#include "qgrad/kernels/linalg.h"
#include "qgrad/kernels/reduce.h"
#include "qgrad/kernels/shape.h"
#include "qgrad/ops/check.h"
#include "qgrad/ops/elementwise.h"

namespace qgrad {

using kernels::GemmShape;

namespace {

TensorOptions like(const Tensor& t) { return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device()); }

void fits_int(std::int64_t v, const char* op, const char* arg) {
  QGRAD_CHECK(v <= INT_MAX, op, arg, "dimension ", v, " exceeds the GEMM limit ", INT_MAX);
}

std::atomic<Float32Matmul> g_float32_matmul{Float32Matmul::ieee};

// g with `of`'s math (a backward GEMM takes its forward's f32 setting).
GemmShape math_of(GemmShape g, const GemmShape& of) {
  g.f32_math = of.f32_math;
  return g;
}

// A new tensor of `shape` holding op(a) · op(b).
Tensor gemm_new(const Shape& shape, const GemmShape& s, const Tensor& a, const Tensor& b) {
  Tensor c = Tensor::empty(shape, like(a));
  kernels::gemm(s, a, b, c);
  return c;
}

}  // namespace

void set_float32_matmul(Float32Matmul math) { g_float32_matmul.store(math, std::memory_order_relaxed); }
Float32Matmul float32_matmul() { return g_float32_matmul.load(std::memory_order_relaxed); }
void set_matmul_allow_tf32(bool allow) { set_float32_matmul(allow ? Float32Matmul::tf32 : Float32Matmul::ieee); }
bool matmul_allow_tf32() { return float32_matmul() == Float32Matmul::tf32; }

// [...batch_a, M, K] x [...batch_b, K, N] -> [...broadcast(batch_a, batch_b), M, N]
// (torch.matmul for operands of rank >= 2). Three plans: b one matrix and
// a carrying every batch: one GEMM of (batch * M) rows; one operand a single
// matrix: strided batches with batch stride 0 for it; otherwise the operands
// that do not carry every batch are broadcast by a copy first.
// Backward: dA = dY · Bᵀ, dB = Aᵀ · dY per batch, summed over the batch dims
// an operand was broadcast along (a single matrix's gradient in the folded
// plan is one GEMM over all rows). Saves B when A needs grad and A when B
// needs grad (detached, not broadcast).
Tensor matmul(const Tensor& a, const Tensor& b) {
  constexpr const char* op = "matmul";
  check::floating(a, op, "a");
  check::floating(b, op, "b");
  check::same_dtype(b, a, op, "b");
  check::same_device(b, a, op, "b");
  QGRAD_CHECK(a.dim() >= 2, op, "a", "expected rank >= 2, got shape ", shape_str(a.shape()));
  QGRAD_CHECK(b.dim() >= 2, op, "b", "expected rank >= 2, got shape ", shape_str(b.shape()));
  QGRAD_CHECK(a.size(-1) == b.size(-2), op, "b", "inner dimensions differ: shapes ", shape_str(a.shape()), " and ",
              shape_str(b.shape()));
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = check::broadcast_shapes(batch_a, batch_b, op);
  QGRAD_CHECK(static_cast<std::int64_t>(batch.size()) < kernels::kMaxTransposeDims, op, "a", "more than ",
              kernels::kMaxTransposeDims - 1, " batch dims: shapes ", shape_str(a.shape()), " and ",
              shape_str(b.shape()));
  const std::int64_t nb = shape_numel(batch, op), na = shape_numel(batch_a, op), nbb = shape_numel(batch_b, op);
  GemmShape s;
  s.f32_math = float32_matmul();
  s.m = a.size(-2);
  s.k = a.size(-1);
  s.n = b.size(-1);
  const bool fold = nbb == 1 && na == nb;
  if (fold) {
    s.m = nb * s.m;
  } else {
    s.batch = nb;
    s.broadcast_a = na == 1;
    s.broadcast_b = nbb == 1;
  }
  fits_int(s.batch, op, "a");
  fits_int(s.m, op, "a");
  fits_int(s.k, op, "a");
  fits_int(s.n, op, "b");
  Shape out_shape = batch;
  out_shape.push_back(a.size(-2));
  out_shape.push_back(s.n);
  shape_numel(out_shape, op);
  // An operand that neither carries every batch nor is one matrix: broadcast copy.
  auto full = [batch](const Tensor& t, std::int64_t n, std::int64_t total) {
    if (n == total || n == 1) return t;
    Shape shape = batch;
    shape.push_back(t.size(-2));
    shape.push_back(t.size(-1));
    Tensor e = Tensor::empty(shape, like(t));
    kernels::expand(t, e);
    return e;
  };
  Tensor out = gemm_new(out_shape, s, full(a, na, nb), full(b, nbb, nb));
  if (any_requires_grad({a, b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    Tensor sa = need_b ? a.detach() : Tensor(), sb = need_a ? b.detach() : Tensor();
    record(
        op, out, {a, b},
        [sa, sb, s, fold, na, nbb, nb, full, shape_a = a.shape(), shape_b = b.shape()](const Tensor& g) {
          Tensor ga, gb;
          if (fold) {
            if (sb.defined()) ga = gemm_new(shape_a, math_of({1, s.m, s.k, s.n, false, true}, s), g, sb);
            if (sa.defined()) gb = gemm_new(shape_b, math_of({1, s.k, s.n, s.m, true, false}, s), sa, g);
            return std::vector<Tensor>{ga, gb};
          }
          Shape full_a(g.shape().begin(), g.shape().end() - 1), full_b = full_a;
          full_a.push_back(s.k);
          full_b.back() = s.k;
          full_b.push_back(s.n);
          if (sb.defined()) {
            GemmShape gs = math_of({s.batch, s.m, s.k, s.n, false, true}, s);
            gs.broadcast_b = s.broadcast_b;
            ga = gemm_new(na == nb ? shape_a : full_a, gs, g, full(sb, nbb, nb));
            if (na != nb) ga = sum_to_shape(ga, shape_a);
          }
          if (sa.defined()) {
            GemmShape gs = math_of({s.batch, s.k, s.n, s.m, true, false}, s);
            gs.broadcast_a = s.broadcast_a;
            gb = gemm_new(nbb == nb ? shape_b : full_b, gs, full(sa, na, nb), g);
            if (nbb != nb) gb = sum_to_shape(gb, shape_b);
          }
          return std::vector<Tensor>{ga, gb};
        },
        (need_a ? b.nbytes() : 0) + (need_b ? a.nbytes() : 0));
  }
  return out;
}

namespace {

// Validates linear's arguments and computes y = x · wᵀ + bias; with
// fuse_relu, then relu in place, packing the y > 0 mask into `mask` when
// grad is needed; with a residual (linear_add: non-null, its tensor
// checked), y + residual. Fills in the GEMM shape for the backward.
Tensor linear_forward(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias, bool fuse_relu,
                      const Tensor* residual, GemmShape& s, Tensor& mask) {
  check::floating(x, op, "x");
  check::floating(w, op, "w");
  check::same_dtype(w, x, op, "w");
  check::same_device(w, x, op, "w");
  QGRAD_CHECK(x.dim() >= 1, op, "x", "expected rank >= 1, got a scalar");
  check::rank_is(w, 2, op, "w");
  QGRAD_CHECK(w.size(1) == x.size(-1), op, "w", "expected w of shape [N, ", x.size(-1), "] for x of shape ",
              shape_str(x.shape()), ", got ", shape_str(w.shape()));
  if (bias.defined()) {
    check::floating(bias, op, "bias");
    check::same_dtype(bias, x, op, "bias");
    check::same_device(bias, x, op, "bias");
    QGRAD_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), op, "bias", "expected shape [", w.size(0), "], got ",
                shape_str(bias.shape()));
  }
  Shape out_shape = x.shape();
  out_shape.back() = w.size(0);
  if (residual != nullptr) {
    check::defined(*residual, op, "residual");
    check::floating(*residual, op, "residual");
    check::same_dtype(*residual, x, op, "residual");
    check::same_device(*residual, x, op, "residual");
    QGRAD_CHECK(residual->shape() == out_shape, op, "residual", "expected the output's shape ", shape_str(out_shape),
                ", got ", shape_str(residual->shape()));
  }
  s = GemmShape{};
  s.f32_math = float32_matmul();
  s.k = w.size(1);
  s.n = w.size(0);
  s.m = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1), op);
  s.trans_b = true;
  fits_int(s.m, op, "x");
  fits_int(s.k, op, "x");
  fits_int(s.n, op, "w");
  Tensor out = Tensor::empty(out_shape, like(x));
  if (residual != nullptr) kernels::linear_bias_add(s, x, w, bias, *residual, out);
  else if (bias.defined()) kernels::linear_bias(s, x, w, bias, out);
  else kernels::gemm(s, x, w, out);
  if (fuse_relu) {
    if (any_requires_grad({x, w, bias}))
      mask = Tensor::empty({bitmask_words(out.numel())}, TensorOptions{}.with_dtype(DType::s32).with_device(x.device()));
    // In place: relu(v) > 0 exactly when v > 0, so the mask is the same
    // whether a kernel reads an element before or after rewriting it.
    kernels::relu(out, out, mask);
  }
  return out;
}

// Whether linear's dx GEMM ([m, k]) has a 128 x 128 output tile for every SM.
bool gemm_fills_device(const GemmShape& s, Device device) {
  const std::int64_t tiles = s.batch * ((s.m + 127) / 128) * ((s.k + 127) / 128);
  return tiles >= cuda_multiprocessor_count(device.index);
}

// Records linear's backward: dx = dy · W, dW = dyᵀ · x, db = dy summed over
// rows, with dy first masked by relu's bits when mask is defined; a
// residual's gradient is dy itself. Saves W when x needs grad, x when W
// needs grad (detached), and the mask.
void linear_record(const char* op, Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                   const Tensor& residual, const GemmShape& s, const Tensor& mask) {
  const bool need_x = x.requires_grad(), need_w = w.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  // A leaf bias (or a cast of one: mixed precision) takes its gradient's
  // finishing pass deferred (autograd/node.h deferred_gradient_passes,
  // gradient_deferrable): one launch for every parameter's.
  const bool leaf_bias = need_b && gradient_deferrable(bias);
  Tensor sx = need_w ? x.detach() : Tensor(), sw = need_x ? w.detach() : Tensor();
  const bool need_r = residual.defined() && residual.requires_grad();
  // The weight and bias gradients on the side stream (core/device.h): only
  // dx leads on to the layers before; dW and db wait for the optimizer. Where
  // the dx GEMM alone has an output tile of 128 x 128 for every SM, dW beside
  // it only shares the SMs (measured slower: docs/benchmarks.md,
  // fifty-third session), so the rule forks only below that.
  const bool side = x.is_cuda() && (need_w || need_b) && cuda_side_stream() &&
                    (!need_x || cuda_side_stream_every_linear() || !gemm_fills_device(s, x.device()));
  record(
      op, out, {x, w, bias, residual},
      [sx, sw, s, need_b, need_r, leaf_bias, mask, side, shape_x = x.shape(), shape_w = w.shape()](
          const Tensor& dy) {
        Tensor g = dy;
        if (mask.defined()) {
          g = Tensor::empty(dy.shape(), like(dy));
          kernels::relu_backward(dy, mask, g);
        }
        Tensor gx, gw, gb;
        SideStreamScope parameters(g.device(), side);  // the fork: once g is queued
        if (sx.defined()) gw = gemm_new(shape_w, math_of({1, s.n, s.k, s.m, true, false}, s), g, sx);
        if (need_b) {
          gb = Tensor::empty({s.n}, like(g));
          kernels::sum_axis(g, gb, kernels::AxisLayout{1, s.m, s.n}, false,
                            leaf_bias ? deferred_gradient_passes() : nullptr);
        }
        if (sw.defined()) {
          // dx on the main stream beside them; where this node itself runs on
          // the side stream (g was made there), dx stays there after g.
          std::optional<MainStreamScope> main;
          if (parameters.switched()) main.emplace();
          gx = gemm_new(shape_x, math_of({1, s.m, s.k, s.n, false, false}, s), g, sw);
        }
        return std::vector<Tensor>{gx, gw, gb, need_r ? dy : Tensor()};
      },
      (need_x ? w.nbytes() : 0) + (need_w ? x.nbytes() : 0) + (mask.defined() ? mask.nbytes() : 0));
  if (side) out.grad_fn()->side_inputs = 0b0110u;  // w, bias
}

// residual: null for linear and linear_relu; linear_add's (checked, even undefined).
Tensor linear_op(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias, bool fuse_relu,
                 const Tensor* residual = nullptr) {
  GemmShape s;
  Tensor mask;
  Tensor out = linear_forward(op, x, w, bias, fuse_relu, residual, s, mask);
  const Tensor r = residual != nullptr ? *residual : Tensor();
  if (any_requires_grad({x, w, bias, r})) linear_record(op, out, x, w, bias, r, s, mask);
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) { return linear_op("linear", x, w, bias, false); }

Tensor linear_relu(const Tensor& x, const Tensor& w, const Tensor& bias) {
  return linear_op("linear_relu", x, w, bias, true);
}

Tensor linear_add(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual) {
  return linear_op("linear_add", x, w, bias, false, &residual);
}

// Backward: transpose(dy, dim0, dim1). Saves nothing.
Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1) {
  constexpr const char* op = "transpose";
  check::defined(x, op, "x");
  QGRAD_CHECK(x.dim() <= kernels::kMaxTransposeDims, op, "x", "rank ", x.dim(), " exceeds the limit ",
              kernels::kMaxTransposeDims);
  const std::int64_t d0 = check::axis(dim0, x.dim(), op, "dim0");
  const std::int64_t d1 = check::axis(dim1, x.dim(), op, "dim1");
  Shape out_shape = x.shape();
  std::swap(out_shape[static_cast<std::size_t>(d0)], out_shape[static_cast<std::size_t>(d1)]);
  Tensor out = Tensor::empty(out_shape, like(x));
  kernels::transpose(x, out, d0, d1);
  if (any_requires_grad({x})) {
    record(op, out, {x}, [d0, d1](const Tensor& g) { return std::vector<Tensor>{transpose(g, d0, d1)}; });
  }
  return out;
}

}  // namespace qgrad
