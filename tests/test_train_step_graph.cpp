// The QAT training steps of bench/bench_train_step.cpp (784-H-H-10 MLP and
// the Conv-BN-ReLU CNN, prepare_qat with the default QAT qconfig,
// cross-entropy, SGD with momentum, gradients set to none) captured in a CudaGraph. Capture throws
// on any host synchronisation, so a successful capture proves the step
// never waits for the device; replaying it must then give the parameters,
// observer ranges and qparams of the same steps run eagerly, bit for bit.
#include <cmath>
#include <cstring>

#include "../bench/qat_cnn.h"
#include "../bench/qat_mlp.h"
#include "helpers.h"
#include "qgrad/kernels/conv.h"
#include "qgrad/kernels/formulas/observer.h"
#include "qgrad/kernels/observer.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

// bench/qat_mlp.h: the benchmark's model, optimizer and step; every
// instance built here starts from the same seed.
bench::QatMlp make_trainer(Device dev, std::int64_t hidden) {
  Generator gen(0x51a);
  return bench::QatMlp(dev, hidden, gen, 0.05);
}

// The CNN of bench/qat_cnn.h (ConvBnReLU2d blocks), 4 and 8 channels.
bench::QatCnn make_cnn_trainer(Device dev) {
  Generator gen(0x51b);
  return bench::QatCnn(dev, 4, gen, 0.05);
}

struct Batches {
  std::vector<Tensor> xs, ys;
  Batches(int count, std::int64_t batch, Device dev, const Shape& example = {784}) {
    Generator gen(0xba7);
    Shape shape{batch};
    shape.insert(shape.end(), example.begin(), example.end());
    for (int i = 0; i < count; ++i) {
      xs.push_back(randn(shape, gen, TensorOptions{}.with_device(dev)));
      ys.push_back(randint(0, 10, {batch}, gen, TensorOptions{}.with_dtype(DType::s64).with_device(dev)));
    }
  }
};

}  // namespace

TEST_CASE("the CNN QAT step changes the model and the running statistics (CPU)") {
  bench::QatCnn t = make_cnn_trainer(Device::cpu());
  Batches b(2, 8, Device::cpu(), {1, 28, 28});
  const nn::NamedTensors before = t.model->state_dict();
  std::vector<Tensor> copies;
  for (const auto& [n, v] : before) copies.push_back(v.clone());
  t.step(b.xs[0], b.ys[0]);
  t.step(b.xs[1], b.ys[1]);
  const nn::NamedTensors after = t.model->state_dict();
  int seen = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    const std::string& n = after[i].first;
    if (n == "0.weight" || n == "0.bn.running_mean" || n == "4.bn.running_var") {
      INFO(n);
      CHECK_FALSE(bit_equal(copies[i], after[i].second));
      ++seen;
    }
  }
  CHECK(seen == 3);
}

TEST_CASE("the QAT step changes the model (CPU)") {
  // The CPU half of the comparison below: the step trains at all.
  bench::QatMlp t = make_trainer(Device::cpu(), 32);
  Batches b(2, 16, Device::cpu());
  const Tensor w0 = t.model->named_parameters().front().second.clone();
  t.step(b.xs[0], b.ys[0]);
  t.step(b.xs[1], b.ys[1]);
  CHECK_FALSE(bit_equal(w0, t.model->named_parameters().front().second));
}

namespace {

using ProgrammaticLaunch = ScopedSwitch<cuda_programmatic_launch, cuda_set_programmatic_launch>;

// Eager steps against the same steps captured once and replayed: the
// parameters, buffers (observer ranges, qparams, batch-norm running
// statistics) and momentum buffers end bit for bit equal. With
// eager_in_order, the eager steps launch without programmatic dependent
// launch (plain stream order) and the graph is captured with it; with
// eager_one_stream, the eager steps run every gradient on the main stream
// and the graph's take the side stream.
template <class Make>
void check_capture_matches_eager(Make make, std::int64_t batch, const Shape& example, bool eager_in_order = false,
                                 bool eager_one_stream = false) {
  const Device dev = Device::cuda();
  struct EagerLaunch {
    ProgrammaticLaunch order;
    SideStream side;
  };
  const auto eager_launch = [&] {
    return EagerLaunch{ProgrammaticLaunch(eager_in_order ? false : cuda_programmatic_launch()),
                       SideStream(eager_one_stream ? false : cuda_side_stream())};
  };
  constexpr int kWarmup = 3, kSteps = 6;
  Batches b(kWarmup + kSteps, batch, dev, example);
  auto eager = make(dev), graphed = make(dev);
  Tensor x_static = empty_like(b.xs[0]), y_static = empty_like(b.ys[0]);
  // Warm-up, eagerly, on both: momentum buffers exist and the observers
  // have seen data, so no host-side branch changes after this point.
  for (int i = 0; i < kWarmup; ++i) {
    {
      const auto in_order = eager_launch();
      eager.step(b.xs[static_cast<std::size_t>(i)], b.ys[static_cast<std::size_t>(i)]);
    }
    x_static.copy_(b.xs[static_cast<std::size_t>(i)]);
    y_static.copy_(b.ys[static_cast<std::size_t>(i)]);
    graphed.step(x_static, y_static);
  }
  CudaGraph graph;
  const std::uint64_t forks = cuda_side_stream_fork_count();
  graph.capture([&] { graphed.step(x_static, y_static); });  // throws on a host sync
  REQUIRE(graph.captured());
  if (eager_one_stream) CHECK(cuda_side_stream_fork_count() > forks);  // the captured step forked
  for (int i = kWarmup; i < kWarmup + kSteps; ++i) {
    const auto k = static_cast<std::size_t>(i);
    {
      const auto in_order = eager_launch();
      eager.step(b.xs[k], b.ys[k]);
    }
    x_static.copy_(b.xs[k]);
    y_static.copy_(b.ys[k]);
    graph.replay();
  }
  cuda_synchronize();
  eager.opt->check_finite();  // the device flags of clip_grad_norm's error_if_nonfinite, where set
  graphed.opt->check_finite();
  const nn::NamedTensors se = eager.model->state_dict(), sg = graphed.model->state_dict();
  REQUIRE(se.size() == sg.size());
  for (std::size_t i = 0; i < se.size(); ++i) {
    INFO(se[i].first);
    CHECK(se[i].first == sg[i].first);
    CHECK(bit_equal(se[i].second, sg[i].second));
  }
  // The momentum buffers too.
  const nn::NamedTensors oe = eager.opt->state_dict(), og = graphed.opt->state_dict();
  REQUIRE(oe.size() == og.size());
  for (std::size_t i = 0; i < oe.size(); ++i) {
    if (oe[i].first.find("momentum_buffer") == std::string::npos) continue;
    INFO(oe[i].first);
    CHECK(bit_equal(oe[i].second, og[i].second));
  }
}

}  // namespace

TEST_CASE("CUDA: the QAT step captures with no host sync and replays bit for bit like eager steps") {
  QGRAD_REQUIRE_GPU();
  check_capture_matches_eager([](Device d) { return make_trainer(d, 64); }, 64, {784});
}

TEST_CASE("CUDA: the fused QAT MLP step (one kernel) captures and replays bit for bit like eager fused steps") {
  // nn::qat_mlp_loss_backward: the persistent kernel's split-K parts are
  // summed in part order by whichever block arrives last, so every run gives
  // the same bits; its tile counters are left at zero for the next launch.
  QGRAD_REQUIRE_GPU();
  const auto fused = [](Device d) {
    Generator gen(0x51a);
    return bench::QatMlp(d, 64, gen, 0.05, true);
  };
  check_capture_matches_eager(fused, 64, {784});
  check_capture_matches_eager(fused, 256, {784}, true);
}

TEST_CASE("CUDA: the CNN QAT step (ConvBnReLU2d, batch norm) captures and replays bit for bit like eager steps") {
  QGRAD_REQUIRE_GPU();
  check_capture_matches_eager([](Device d) { return make_cnn_trainer(d); }, 16, {1, 28, 28});
}

TEST_CASE("CUDA: the QAT step with gradient clipping captures with no host sync and replays like eager steps") {
  // nn::clip_grad_norm on the optimizer (error_if_nonfinite on: the device
  // flag, no sync): the norm's reduction, its last-block finish and the
  // coefficient read by the fused step all replay bit for bit.
  QGRAD_REQUIRE_GPU();
  check_capture_matches_eager(
      [](Device d) {
        bench::QatMlp t = make_trainer(d, 64);
        t.clip_grad_norm = 0.5;
        return t;
      },
      64, {784});
}

TEST_CASE("CUDA: steps captured with programmatic dependent launch equal eager steps in plain stream order") {
  // Every kernel may be dispatched while the one before it finishes and
  // waits for it before touching memory (core/cuda/common.cuh): the same
  // bits as launches in plain stream order, across the allocator's reuse of
  // blocks, the last-block counters of the reductions and the optimizer.
  QGRAD_REQUIRE_GPU();
  const ProgrammaticLaunch on(true);
  check_capture_matches_eager([](Device d) { return make_cnn_trainer(d); }, 16, {1, 28, 28}, true);
  check_capture_matches_eager(
      [](Device d) {
        bench::QatMlp t = make_trainer(d, 64);
        t.clip_grad_norm = 0.5;
        return t;
      },
      64, {784}, true);
}

TEST_CASE("CUDA: the TF32 CNN step, its second convolution staged channels-last, captured with programmatic launch "
          "equals eager steps in stream order") {
  // With TF32 allowed, conv2d copies the 8 -> 16 convolution's x and weight
  // to NHWC in the forward and dy in the backward (kernels::to_channels_last)
  // between the kernels producing them and cuDNN's passes: under
  // programmatic dependent launch each copy must wait for its producer, or
  // it reads a half-written tensor and the replayed steps drift from the
  // eager ones.
  QGRAD_REQUIRE_GPU();
  kernels::Conv2dShape s;
  s.n = 16, s.c = 8, s.h = 14, s.w = 14, s.o = 16, s.kh = 3, s.kw = 3, s.oh = 14, s.ow = 14, s.ph = 1, s.pw = 1;
  s.allow_tf32 = true;
  REQUIRE(kernels::conv2d_stages_channels_last(s, DType::f32, Device::cuda()));
  const ConvTf32 tf32(true);
  const ProgrammaticLaunch on(true);
  check_capture_matches_eager(
      [](Device d) {
        Generator gen(0x51c);
        return bench::QatCnn(d, 8, gen, 0.05);
      },
      16, {1, 28, 28}, true);
}

TEST_CASE("CUDA: steps whose parameter gradients run on the side stream equal steps on one stream") {
  // A linear's and a conv2d's dW and db, and what they reach (the weight fake
  // quant's backward; the CNN's folded Conv-BN weight, whose scale factor's
  // gradient sums a side and a main term on the side stream), joined before
  // the deferred passes and the optimizer (core/device.h SideStreamScope);
  // the allocator holds every block freed meanwhile. The same kernels on the
  // same data: the same bits.
  QGRAD_REQUIRE_GPU();
  const SideStream on(true);
  check_capture_matches_eager([](Device d) { return make_trainer(d, 64); }, 64, {784}, false, true);
  check_capture_matches_eager([](Device d) { return make_cnn_trainer(d); }, 16, {1, 28, 28}, false, true);
  check_capture_matches_eager(
      [](Device d) {
        bench::QatMlp t = make_trainer(d, 64);
        t.clip_grad_norm = 0.5;
        return t;
      },
      64, {784}, false, true);
}

TEST_CASE("CUDA: replaying the captured QAT step allocates no device memory") {
  QGRAD_REQUIRE_GPU();
  const Device dev = Device::cuda();
  Batches b(2, 32, dev);
  bench::QatMlp t = make_trainer(dev, 32);
  Tensor x = b.xs[0].clone(), y = b.ys[0].clone();
  for (int i = 0; i < 2; ++i) t.step(x, y);
  CudaGraph graph;
  graph.capture([&] { t.step(x, y); });
  cuda_synchronize();
  const AllocatorStats before = cuda_allocator_stats();
  for (int i = 0; i < 5; ++i) {
    x.copy_(b.xs[static_cast<std::size_t>(i % 2)]);
    y.copy_(b.ys[static_cast<std::size_t>(i % 2)]);
    graph.replay();
  }
  cuda_synchronize();
  const AllocatorStats after = cuda_allocator_stats();
  CHECK(after.num_device_mallocs == before.num_device_mallocs);
  CHECK(after.num_allocations == before.num_allocations);
}

// The CPU observer splits a channel into chunks and reduces f32 four lanes
// at a time; its min/max must stay the sequential min_combine / max_combine
// (NaN wins, -0 < +0) on every kind of input.
TEST_CASE("observer min/max: chunked SIMD reduction equals the sequential combine") {
  Generator gen(0x0b5);
  const std::int64_t n = 40003;  // three chunks and a tail that is not a multiple of 4
  for (int variant = 0; variant < 5; ++variant) {
    std::vector<float> v = randn({n}, gen).to_vector<float>();
    if (variant == 1) for (auto& f : v) f = std::fabs(f);    // min near +0
    if (variant == 2) for (auto& f : v) f = -std::fabs(f);   // max near -0
    if (variant >= 1) {
      v[17] = 0.0f;
      v[20001] = -0.0f;
      v[40002] = variant == 2 ? 0.0f : -0.0f;
    }
    if (variant == 3) v[30000] = NAN;
    if (variant == 4) v[40001] = NAN;  // in the scalar tail
    float lo = INFINITY, hi = -INFINITY;
    for (float f : v) {
      lo = formulas::min_combine(lo, f);
      hi = formulas::max_combine(hi, f);
    }
    Tensor x = Tensor::from_vector(v, {n});
    Tensor mn = full({1}, INFINITY), mx = full({1}, -INFINITY);
    kernels::observer_minmax(x, mn, mx, -1, -1.0);
    const float got_lo = mn.to_vector<float>()[0], got_hi = mx.to_vector<float>()[0];
    INFO("variant " << variant);
    if (std::isnan(lo)) {
      CHECK(std::isnan(got_lo));
      CHECK(std::isnan(got_hi));
    } else {
      CHECK(std::memcmp(&got_lo, &lo, 4) == 0);
      CHECK(std::memcmp(&got_hi, &hi, 4) == 0);
    }
  }
}

// mul/add with a host scalar take a fast path (one kernel, no scalar
// tensor); its values must stay those of the op with the scalar tensor
// full({}, s), in every floating dtype, and on CUDA those of the CPU.
TEST_CASE("scalar fast path of mul/add equals the scalar-tensor op") {
  Generator gen(0x5ca);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const Tensor a = randn({3, 37}, gen, TensorOptions{}.with_dtype(dt));
    for (double s : {0.1, -3.7, 1e-3, 65504.0}) {
      INFO(dtype_name(dt) << " " << s);
      const Tensor st = full({}, s, TensorOptions{}.with_dtype(dt));
      CHECK(bit_equal(mul(a, s), mul(a, st)));
      CHECK(bit_equal(add(a, s), add(a, st)));
      CHECK(bit_equal(neg(a), mul(a, full({}, -1.0, TensorOptions{}.with_dtype(dt)))));
      if (has_gpu()) {
        const Tensor ag = a.cuda();
        CHECK(bit_equal(mul(ag, s), mul(a, s)));
        CHECK(bit_equal(add(ag, s), add(a, s)));
      }
    }
  }
  // Gradients: d(a*s) = g*s, d(a+s) = g.
  Tensor x = randn({5}, gen, TensorOptions{}.with_dtype(DType::f64));
  x.set_requires_grad(true);
  add(mul(x, 2.5), 1.0).backward(ones({5}, TensorOptions{}.with_dtype(DType::f64)));
  CHECK(bit_equal(x.grad(), full({5}, 2.5, TensorOptions{}.with_dtype(DType::f64))));
}
