// Registry entries: the in-place ops (the fused optimizer step, the observer
// updates) and the factories. None is differentiable; each is compared
// across devices on every tensor it writes.
#include <cmath>

#include "qgrad/ops/ops.h"
#include "qgrad/ops/registry.h"

namespace qgrad::registry {

namespace {

const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};
using Tensors = std::vector<Tensor>;

Tensor plain(const Shape& shape, Generator& g, Device d, DType dt, double stddev = 1.0) {
  return randn(shape, g, on(d, dt), 0.0, stddev);
}

}  // namespace

std::vector<OpEntry> state_entries() {
  std::vector<OpEntry> e;
  // SGD with Nesterov momentum (first step and a later one), then AdamW.
  e.push_back({"optimizer_step_", {"optimizer_step_"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{plain({5, 7}, g, d, dt), plain({5, 7}, g, d, dt, 0.1), zeros({5, 7}, on(d, dt)),
                                plain({9}, g, d, dt), plain({9}, g, d, dt, 0.1), zeros({9}, on(d, dt)),
                                zeros({9}, on(d, dt))};
               },
               [](const Tensors& v) {
                 OptimizerHyper sgd{OptimizerKind::sgd, 0.05, 0.9, 0.0, 1e-3, true};
                 optimizer_step_(sgd, {{v[0], v[1], v[2], Tensor(), 1, true}});
                 optimizer_step_(sgd, {{v[0], v[1], v[2], Tensor(), 2, false}});
                 OptimizerHyper adamw;
                 adamw.kind = OptimizerKind::adamw;
                 adamw.lr = 1e-2;
                 adamw.weight_decay = 0.01;
                 optimizer_step_(adamw, {{v[3], v[4], v[5], v[6], 1, false}});
                 optimizer_step_(adamw, {{v[3], v[4], v[5], v[6], 2, false}});
                 // With a device grad scale (the clip coefficient), then a
                 // step skipped by a set flag.
                 const Tensor scale = full({1}, 0.375, on(v[0].device(), v[0].dtype()));
                 const Tensor skip = full({1}, 1.0, on(v[0].device(), DType::s32));
                 optimizer_step_(sgd, {{v[0], v[1], v[2], Tensor(), 3, false}}, scale);
                 optimizer_step_(adamw, {{v[3], v[4], v[5], v[6], 3, false}}, scale, zeros_like(skip));
                 optimizer_step_(adamw, {{v[3], v[4], v[5], v[6], 4, false}}, scale, skip);
                 return Tensors{v[0], v[2], v[3], v[5], v[6]};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, [](Device d) {
                 Tensor p = zeros({3}, on(d)), gr = zeros({3}, on(d));
                 OptimizerHyper sgd{OptimizerKind::sgd, 0.1, 0.9};
                 OptimizerHyper bad_lr{OptimizerKind::sgd, -1.0};
                 return std::vector<BadInput>{
                     {"optimizer_step_", "lr", [=] { optimizer_step_(bad_lr, {{p, gr, Tensor(), Tensor(), 1, false}}); }},
                     {"optimizer_step_", "buf1", [=] { optimizer_step_(sgd, {{p, gr, Tensor(), Tensor(), 1, true}}); }},
                     {"optimizer_step_", "grad", [=] { optimizer_step_(sgd, {{p, zeros({4}, on(d)), zeros({3}, on(d)), Tensor(), 1, false}}); }},
                     {"optimizer_step_", "step", [=] { optimizer_step_(sgd, {{p, gr, zeros({3}, on(d)), Tensor(), 0, false}}); }},
                     {"optimizer_step_", "grad_scale",
                      [=] { optimizer_step_(sgd, {{p, gr, zeros({3}, on(d)), Tensor(), 1, true}}, zeros({1}, on(d, DType::f64))); }},
                     {"optimizer_step_", "grad_scale",
                      [=] { optimizer_step_(sgd, {{p, gr, zeros({3}, on(d)), Tensor(), 1, true}}, zeros({2}, on(d))); }},
                     {"optimizer_step_", "skip",
                      [=] { optimizer_step_(sgd, {{p, gr, zeros({3}, on(d)), Tensor(), 1, true}}, Tensor(), zeros({1}, on(d))); }}};
               }});
  // The QAT MLP's forward, loss and backward in one call (8 -> 5 relu -> 3,
  // batch 6): on CUDA the fused kernel, on the CPU the composed ops. The
  // input observer moves an existing range, the others start unobserved;
  // the second layer's weight gradient is added to an existing one.
  e.push_back({"qat_mlp_loss_backward_", {"qat_mlp_loss_backward_", "qat_mlp_fused_available"}, {DType::f32},
               [](Device d, DType dt, Generator& g) {
                 const auto state = [&](std::int64_t c, double lo, double hi) {
                   return Tensors{full({c}, lo, on(d, dt)), full({c}, hi, on(d, dt)), full({c}, 1.0, on(d, dt)),
                                  zeros({c}, on(d, DType::s32))};
                 };
                 Tensors v{plain({6, 8}, g, d, dt), randint(0, 3, {6}, g, on(d, DType::s64)),
                           plain({5, 8}, g, d, dt, 0.5), plain({5}, g, d, dt, 0.1), zeros({5, 8}, on(d, dt)),
                           zeros({5}, on(d, dt)), plain({3, 5}, g, d, dt, 0.5), plain({3}, g, d, dt, 0.1),
                           plain({3, 5}, g, d, dt), zeros({3}, on(d, dt))};
                 for (const Tensors& q : {state(1, -1.0, 1.5), state(5, INFINITY, -INFINITY), state(1, INFINITY, -INFINITY),
                                          state(3, INFINITY, -INFINITY), state(1, INFINITY, -INFINITY)})
                   v.insert(v.end(), q.begin(), q.end());
                 return v;
               },
               [](const Tensors& v) {
                 const auto quant = [&](std::size_t at, bool weight) {
                   QatMlpQuant q;
                   q.run_min = v[at];
                   q.run_max = v[at + 1];
                   q.scale = v[at + 2];
                   q.zero_point = v[at + 3];
                   q.symmetric = weight;
                   q.qmin = weight ? -128 : 0;
                   q.qmax = 127;
                   return q;
                 };
                 std::vector<QatMlpLayer> layers(2);
                 for (std::size_t i = 0; i < 2; ++i) {
                   QatMlpLayer& l = layers[i];
                   l.weight = v[2 + 4 * i];
                   l.bias = v[3 + 4 * i];
                   l.weight_grad = v[4 + 4 * i];
                   l.bias_grad = v[5 + 4 * i];
                   l.accumulate_weight_grad = i == 1;
                   l.relu = i == 0;
                   l.weight_quant = quant(14 + 8 * i, true);
                   l.output_quant = quant(18 + 8 * i, false);
                 }
                 const Tensor loss = qat_mlp_loss_backward_(v[0], v[1], quant(10, false), layers);
                 Tensors out{loss, v[4], v[5], v[8], v[9]};
                 out.insert(out.end(), v.begin() + 10, v.end());
                 return out;
               },
               Promise::within(0, 1e-5, 0, 0,
                               "on CUDA one kernel sums the products in another order than the CPU's GEMM"),
               GradMethod::none, {}, {}, [](Device d) {
                 const auto f32 = on(d, DType::f32);
                 QatMlpQuant q;
                 q.run_min = full({1}, INFINITY, f32);
                 q.run_max = full({1}, -INFINITY, f32);
                 q.scale = full({1}, 1.0, f32);
                 q.zero_point = zeros({1}, on(d, DType::s32));
                 q.qmax = 127;
                 QatMlpLayer l;
                 l.weight = zeros({3, 4}, f32);
                 l.weight_grad = zeros({3, 4}, f32);
                 l.weight_quant = q;
                 l.weight_quant.run_min = full({3}, INFINITY, f32);
                 l.weight_quant.run_max = full({3}, -INFINITY, f32);
                 l.weight_quant.scale = full({3}, 1.0, f32);
                 l.weight_quant.zero_point = zeros({3}, on(d, DType::s32));
                 l.output_quant = q;
                 const Tensor x = zeros({2, 4}, f32), y = zeros({2}, on(d, DType::s64));
                 QatMlpQuant bad_zp = q;
                 bad_zp.zero_point = zeros({1}, f32);
                 QatMlpLayer wide = l;
                 wide.weight = zeros({3, 5}, f32);
                 QatMlpLayer no_bias_grad = l;
                 no_bias_grad.bias = zeros({3}, f32);
                 return std::vector<BadInput>{
                     {"qat_mlp_loss_backward_", "x", [=] { qat_mlp_loss_backward_(zeros({2, 4}, on(d, DType::f64)), y, q, {l}); }},
                     {"qat_mlp_loss_backward_", "labels", [=] { qat_mlp_loss_backward_(x, zeros({3}, on(d, DType::s64)), q, {l}); }},
                     {"qat_mlp_loss_backward_", "layers", [=] { qat_mlp_loss_backward_(x, y, q, {}); }},
                     {"qat_mlp_loss_backward_", "weight", [=] { qat_mlp_loss_backward_(x, y, q, {wide}); }},
                     {"qat_mlp_loss_backward_", "bias_grad", [=] { qat_mlp_loss_backward_(x, y, q, {no_bias_grad}); }},
                     {"qat_mlp_loss_backward_", "input_quant", [=] { qat_mlp_loss_backward_(x, y, bad_zp, {l}); }}};
               }});
  // The global norm of clip_grad_norm in its three orders over tensors of
  // one chunk, two chunks, 34 chunks (step 2 folds lanes) and none, the
  // clip coefficient (clipping, not clipping, zero max_norm), the in-place
  // scale, and a non-finite total (inf: coefficient 0, the flag set).
  e.push_back({"grad_norm, grad_scale_", {"grad_norm", "grad_scale_"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 return Tensors{plain({70, 70}, g, d, dt), plain({5, 3}, g, d, dt, 10.0), zeros({0}, on(d, dt)),
                                plain({300, 451}, g, d, dt, 0.01), plain({1}, g, d, dt)};
               },
               [](const Tensors& v) {
                 const Device d = v[0].device();
                 const Tensors gs{v[0], v[1], v[2], v[3], v[4]};
                 Tensor flag = zeros({1}, on(d, DType::s32));
                 const GradNorm l2 = grad_norm(gs, 5.0, 2.0, flag);
                 const GradNorm l1 = grad_norm(gs, 1e9, 1.0);
                 const GradNorm linf = grad_norm(gs, 0.0, INFINITY, flag);
                 const GradNorm big = grad_norm({v[3]}, 0.5);
                 Tensor inf = full({4}, INFINITY, on(d, v[0].dtype()));
                 const GradNorm bad = grad_norm({v[1], inf}, 1.0, 2.0, flag);
                 grad_scale_(gs, l2.clip_coef);
                 return Tensors{l2.total_norm, l2.clip_coef, l1.total_norm, l1.clip_coef, linf.total_norm,
                                linf.clip_coef, big.total_norm, big.clip_coef, bad.total_norm, bad.clip_coef,
                                flag, v[0], v[1], v[3], v[4]};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, [](Device d) {
                 Tensor a = zeros({3}, on(d)), b = zeros({2, 2}, on(d));
                 Tensor one = full({1}, 0.5, on(d));
                 return std::vector<BadInput>{
                     {"grad_norm", "grads", [=] { grad_norm({}, 1.0); }},
                     {"grad_norm", "grads", [=] { grad_norm({a, b.to(DType::f64)}, 1.0); }},
                     {"grad_norm", "grads", [=] { grad_norm({zeros({3}, on(d, DType::s32))}, 1.0); }},
                     {"grad_norm", "grads", [=] { grad_norm({a, Tensor()}, 1.0); }},
                     {"grad_norm", "norm_type", [=] { grad_norm({a, b}, 1.0, 3.0); }},
                     {"grad_norm", "max_norm", [=] { grad_norm({a, b}, -1.0); }},
                     {"grad_norm", "max_norm", [=] { grad_norm({a, b}, NAN); }},
                     {"grad_norm", "nonfinite", [=] { grad_norm({a, b}, 1.0, 2.0, zeros({1}, on(d))); }},
                     {"grad_scale_", "scale", [=] { grad_scale_({a, b}, zeros({2}, on(d))); }},
                     {"grad_scale_", "scale", [=] { grad_scale_({a, b}, one.to(DType::f64)); }},
                     {"grad_scale_", "tensors", [=] { grad_scale_({a, b.to(DType::f64)}, one); }}};
               }});
  // The observer updates: per tensor with a moving average, per channel as
  // running min/max, then the qparams; SmoothQuant's absmax.
  e.push_back({"observe_minmax_, observe_minmax_qparams_, observer_qparams_, observe_absmax_",
               {"observe_minmax_", "observe_minmax_qparams_", "observer_qparams_", "observe_absmax_"}, kFloat,
               [](Device d, DType dt, Generator& g) {
                 const TensorOptions f = on(d);
                 return Tensors{plain({4, 33}, g, d, dt, 2.0), full({1}, INFINITY, f), full({1}, -INFINITY, f),
                                full({4}, INFINITY, f), full({4}, -INFINITY, f), zeros({4}, f),
                                zeros({4}, on(d, DType::s32)), zeros({1}, f), zeros({1}, on(d, DType::s32)),
                                zeros({33}, f)};
               },
               [](const Tensors& v) {
                 const ObserverUpdate per_tensor{v[1], v[2], 0.01, false, 0}, per_channel{v[3], v[4], -1.0, true, 0};
                 observe_minmax_(v[0], per_tensor, -1);
                 observe_minmax_(v[0], per_tensor, -1);
                 observe_minmax_qparams_(v[0], per_channel, 0, v[5], v[6], -128, 127);
                 observer_qparams_(per_tensor, v[7], v[8], 0, 255);
                 observe_absmax_(v[0], v[9]);
                 return Tensors{v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, [](Device d) {
                 Tensor x = zeros({4, 33}, on(d)), r = full({4}, 1.0, on(d)), r1 = full({1}, 1.0, on(d));
                 return std::vector<BadInput>{
                     {"observe_minmax_", "x", [=] { observe_minmax_(x, {r, r, -1.0, false, 0}, 1); }},
                     {"observe_minmax_", "run_min", [=] { observe_minmax_(x, {r.to(DType::f64), r, -1.0, false, 0}, 0); }},
                     {"observe_minmax_", "averaging_constant", [=] { observe_minmax_(x, {r1, r1, 1.5, false, 0}, -1); }},
                     {"observe_minmax_qparams_", "scale",
                      [=] { observe_minmax_qparams_(x, {r, r, -1.0, false, 0}, 0, r1, zeros({4}, on(d, DType::s32)), -128, 127); }},
                     {"observer_qparams_", "qmax", [=] { observer_qparams_({r1, r1, -1.0, false, 0}, r1, zeros({1}, on(d, DType::s32)), 3, 3); }},
                     {"observe_absmax_", "x", [=] { observe_absmax_(x, zeros({4}, on(d))); }}};
               }});
  e.push_back({"full, zeros, ones, zeros_like, ones_like, arange", {"full", "zeros", "ones", "zeros_like", "ones_like", "arange"},
               kFloat, [](Device d, DType dt, Generator& g) { return Tensors{plain({2, 3}, g, d, dt)}; },
               [](const Tensors& v) {
                 const TensorOptions o = TensorOptions{}.with_dtype(v[0].dtype()).with_device(v[0].device());
                 return Tensors{full({2, 3}, 0.1, o), zeros({4}, o), ones({4}, o), zeros_like(v[0]), ones_like(v[0]),
                                arange(-1.5, 2.0, 0.25, o)};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, [](Device d) {
                 return std::vector<BadInput>{{"arange", "step", [=] { arange(0, 1, 0, on(d)); }},
                                              {"empty", "shape", [=] { zeros({2, -1}, on(d)); }}};
               }});
  e.push_back({"rand, randn, randint", {"rand", "randn", "randint"}, kFloat,
               [](Device d, DType dt, Generator&) { return Tensors{zeros({1}, on(d, dt))}; },
               [](const Tensors& v) {
                 const TensorOptions o = TensorOptions{}.with_dtype(v[0].dtype()).with_device(v[0].device());
                 Generator g(77);
                 return Tensors{rand({300}, g, o, -2.0, 3.0), randn({301}, g, o, 0.5, 2.0),
                                randint(-5, 9, {40}, g, TensorOptions{}.with_dtype(DType::s32).with_device(o.device))};
               },
               Promise::bit_identical(), GradMethod::none, {}, {}, [](Device d) {
                 Generator g(1);
                 return std::vector<BadInput>{{"rand", "low", [=]() mutable { rand({2}, g, on(d), 1.0, 1.0); }},
                                              {"randn", "stddev", [=]() mutable { randn({2}, g, on(d), 0.0, -1.0); }},
                                              {"randint", "high", [=]() mutable { randint(3, 3, {2}, g, on(d)); }}};
               }});
  return e;
}

}  // namespace qgrad::registry
