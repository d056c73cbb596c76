// One rank of the multi-process dist tests (tests/dist/CMakeLists.txt
// starts it under qgrad-run or tests/dist/ranks.sh). Each mode checks its
// own expectations and exits 0 when they hold, else prints what failed and
// exits 1:
//   collectives  every op and dtype against values computed here, errors
//   timeout-join this rank of a world of 2 runs alone: joining must fail
//                within the timeout (QGRAD_DIST_TIMEOUT_MS)
//   timeout-op   rank 1 never calls the collective: rank 0's must fail
//                within the timeout
//   kill         rank 1 is SIGKILLed mid-step: rank 0's next collective
//                must fail with a clear error well within the timeout
//   ddp          a QAT MLP trained with DistributedDataParallel: weights and
//                buffers bit-identical across ranks; rank 0 then trains the
//                same model in one process with the global batch and
//                compares the loss curves (tolerance below)
//   nccl-ddp     the same on CUDA, one GPU per rank (skips without GPUs)
//   nccl-ddp-graph  DDP on NCCL with the whole step (forward with the
//                observer range all-reduces, backward with the bucket
//                all-reduces, SGD) captured once in a CudaGraph and replayed:
//                weights, buffers and momentum bit for bit equal to the same
//                steps run eagerly under DDP, and equal across ranks
//   exit CODE    rank world-1 exits with CODE after 0.2 s, the others sleep
//                (the launcher must stop them and exit with CODE)
//   sleep        sleeps 60 s (the launcher's signal forwarding)
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <qgrad/qgrad.h>

using namespace qgrad;
using dist::ProcessGroup;
using dist::ReduceOp;

namespace {
int g_failures = 0;
int g_rank = -1;

#define EXPECT(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      std::fprintf(stderr, "rank %d: FAILED %s: ", g_rank, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                         \
      std::fprintf(stderr, "\n");                                \
      ++g_failures;                                              \
    }                                                            \
  } while (0)

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Values each rank contributes: small integers, exact in every dtype.
double value(DType t, int rank, std::int64_t i) {
  const double v = static_cast<double>((i * 7 + rank * 13) % 11);
  return t == DType::u8 ? v : v - 5;
}

Device g_dev = Device::cpu();  // where the collectives' tensors live

Tensor make(DType t, const std::vector<double>& v) {
  Tensor f = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())});
  return f.to(t).to(g_dev);
}

std::vector<double> read(const Tensor& t) { return t.to(Device::cpu()).to(DType::f64).to_vector<double>(); }

void check_collectives(ProcessGroup& pg, Device dev) {
  g_dev = dev;
  const int w = pg.world_size(), r = pg.rank();
  const DType dtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                          DType::s8,  DType::u8,  DType::s32, DType::s64};
  for (DType t : dtypes) {
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{37}, std::int64_t{300001}}) {
      if (n > 1000 && t != DType::f32 && t != DType::s64) continue;
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
        if (op == ReduceOp::avg && !is_floating(t)) continue;
        std::vector<double> mine(static_cast<std::size_t>(n)), want(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          mine[i] = value(t, r, i);
          double acc = value(t, 0, i);
          for (int k = 1; k < w; ++k) {
            const double v = value(t, k, i);
            acc = op == ReduceOp::min ? std::min(acc, v) : op == ReduceOp::max ? std::max(acc, v) : acc + v;
          }
          want[i] = op == ReduceOp::avg ? acc / w : acc;
        }
        if (op == ReduceOp::avg && (t == DType::f16 || t == DType::bf16))  // the quotient rounds to the dtype
          for (double& x : want) x = read(make(t, {x}))[0];
        Tensor x = make(t, mine);
        pg.all_reduce(x, op);
        const std::vector<double> got = read(x);
        const double tol = t == DType::f16 || t == DType::bf16 ? 1e-2 : 1e-6;
        std::int64_t bad = 0;
        for (std::int64_t i = 0; i < n; ++i)
          if (got[i] != want[i] && !(op == ReduceOp::avg && std::abs(got[i] - want[i]) <= tol * std::abs(want[i])))
            ++bad;
        EXPECT(bad == 0, "all_reduce %s %s n=%lld: %lld wrong", reduce_op_name(op), dtype_name(t),
               static_cast<long long>(n), static_cast<long long>(bad));
      }
      for (int root = 0; root < w; ++root) {
        std::vector<double> mine(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) mine[i] = value(t, r, i);
        Tensor x = make(t, mine);
        pg.broadcast(x, root);
        const std::vector<double> got = read(x);
        std::int64_t bad = 0;
        for (std::int64_t i = 0; i < n; ++i) bad += got[i] != value(t, root, i);
        EXPECT(bad == 0, "broadcast root %d %s n=%lld: %lld wrong", root, dtype_name(t), static_cast<long long>(n),
               static_cast<long long>(bad));
      }
      {
        std::vector<double> mine(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) mine[i] = value(t, r, i);
        Tensor all = pg.all_gather(make(t, mine));
        EXPECT(all.shape() == (Shape{w, n}), "all_gather shape %s", shape_str(all.shape()).c_str());
        const std::vector<double> got = read(all);
        std::int64_t bad = 0;
        for (int k = 0; k < w; ++k)
          for (std::int64_t i = 0; i < n; ++i) bad += got[k * n + i] != value(t, k, i);
        EXPECT(bad == 0, "all_gather %s n=%lld: %lld wrong", dtype_name(t), static_cast<long long>(n),
               static_cast<long long>(bad));
      }
    }
  }
  // A 2-D tensor keeps its shape; NaN wins min and max (Gloo); +-inf.
  if (dev.is_cpu()) {
    Tensor x = Tensor::from_vector<float>({r == 0 ? NAN : 1.0f, -INFINITY, static_cast<float>(r), INFINITY}, {2, 2});
    Tensor y = x.clone();
    pg.all_reduce(x, ReduceOp::min);
    pg.all_reduce(y, ReduceOp::max);
    const auto a = x.to_vector<float>(), b = y.to_vector<float>();
    EXPECT(x.shape() == (Shape{2, 2}), "shape kept");
    EXPECT(std::isnan(a[0]) && std::isnan(b[0]), "NaN propagates through min and max");
    EXPECT(a[1] == -INFINITY && b[3] == INFINITY && a[2] == 0.0f && b[2] == static_cast<float>(w - 1),
           "inf and ranks: %g %g %g %g", a[1], b[3], a[2], b[2]);
  }
  // all_reduce_async (on CUDA: a side stream forked from qgrad's stream and
  // joined at wait()): each input is written by an op queued just before the
  // call, so the fork must order the collective after it; three are in
  // flight at once while an unrelated op runs on qgrad's stream; after
  // wait() an op reads each result.
  {
    const std::int64_t n = 1 << 20;
    std::vector<Tensor> outs;
    std::vector<std::shared_ptr<dist::Work>> works;
    for (int k = 0; k < 3; ++k) {
      std::vector<double> mine(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) mine[i] = value(DType::f32, r, i + k);
      Tensor x = make(DType::f32, mine) * 2.0;
      works.push_back(pg.all_reduce_async(x, ReduceOp::sum));
      outs.push_back(x);
    }
    Tensor busy = make(DType::f32, std::vector<double>(static_cast<std::size_t>(n), 1.0)) * 3.0;
    for (int k = 0; k < 3; ++k) {
      works[static_cast<std::size_t>(k)]->wait();
      const std::vector<double> got = read(outs[static_cast<std::size_t>(k)] + 1.0);
      std::int64_t bad = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        double want = 1;
        for (int q = 0; q < w; ++q) want += 2 * value(DType::f32, q, i + k);
        bad += got[i] != want;
      }
      EXPECT(bad == 0, "all_reduce_async #%d: %lld of %lld wrong", k, static_cast<long long>(bad),
             static_cast<long long>(n));
    }
    EXPECT(read(busy)[0] == 3.0, "the op between the calls and wait()");
  }
  pg.barrier(dev);
  // Bad arguments throw before anything is sent (so every rank stays in step).
  auto throws = [](const std::function<void()>& f, const char* what) {
    bool thrown = false;
    try {
      f();
    } catch (const Error& e) {
      thrown = true;
      if (g_rank == 0) std::printf("  expected error (%s): %s\n", what, e.what());
    }
    EXPECT(thrown, "%s should throw", what);
  };
  throws([&] { pg.all_reduce(Tensor::from_vector<std::int32_t>({1}, {1}).to(dev), ReduceOp::avg); }, "avg of s32");
  throws([&] { pg.all_reduce(Tensor::from_vector<float>({1}, {1}).to(DType::boolean).to(dev)); }, "bool dtype");
  throws([&] { pg.all_reduce(Tensor()); }, "undefined tensor");
  throws([&] { pg.broadcast(Tensor::from_vector<float>({1}, {1}).to(dev), w); }, "root out of range");
  throws([&] { pg.all_gather(Tensor::empty({1}, TensorOptions{}.with_device(dev)), Tensor::from_vector<float>({1}, {1}).to(dev)); }, "all_gather out shape");
  pg.barrier(dev);
}
}  // namespace

// ---- DDP: a small QAT MLP on synthetic data ----
namespace {
constexpr std::int64_t kIn = 16, kHidden = 32, kClasses = 4, kExamples = 512, kGlobalBatch = 64, kEpochs = 3;

struct Data {
  std::vector<float> x;  // [kExamples, kIn]
  std::vector<std::int64_t> y;
};

Data make_data() {
  std::mt19937 gen(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Data d;
  d.x.resize(kExamples * kIn);
  for (float& v : d.x) v = nd(gen);
  std::vector<float> teacher(kIn * kClasses);
  for (float& v : teacher) v = nd(gen);
  for (std::int64_t i = 0; i < kExamples; ++i) {
    int best = 0;
    float bv = -1e30f;
    for (int c = 0; c < kClasses; ++c) {
      float acc = 0;
      for (int k = 0; k < kIn; ++k) acc += d.x[i * kIn + k] * teacher[k * kClasses + c];
      if (acc > bv) bv = acc, best = c;
    }
    d.y.push_back(best);
  }
  return d;
}

std::shared_ptr<nn::Sequential> make_model() {
  Generator gen(42);
  auto m = std::make_shared<nn::Sequential>();
  m->emplace_back<nn::Linear>(kIn, kHidden, gen);
  m->emplace_back<nn::ReLU>();
  m->emplace_back<nn::Linear>(kHidden, kClasses, gen);
  nn::prepare_qat(*m);
  m->to(g_dev);
  return m;
}

// Rows [begin, begin + count) of the examples in `order`.
void rows(const Data& d, const std::vector<std::int64_t>& order, std::int64_t begin, std::int64_t count, Tensor& x,
          Tensor& y) {
  std::vector<float> xs;
  std::vector<std::int64_t> ys;
  for (std::int64_t i = begin; i < begin + count; ++i) {
    const std::int64_t e = order[static_cast<std::size_t>(i)];
    xs.insert(xs.end(), d.x.begin() + e * kIn, d.x.begin() + (e + 1) * kIn);
    ys.push_back(d.y[static_cast<std::size_t>(e)]);
  }
  x = Tensor::from_vector(xs, {count, kIn}, g_dev);
  y = Tensor::from_vector(ys, {count}, g_dev);
}

// Trains for kEpochs; the batch of step s is the global batch s of a
// DistributedSampler(world 1) order, of which this rank takes rows
// [rank * b, (rank + 1) * b) with b = global / world. Returns the global
// mean loss of every step.
std::vector<double> train(nn::Module& model, const std::function<Tensor(const Tensor&)>& forward, int rank, int world,
                          ProcessGroup* pg) {
  const Data d = make_data();
  nn::SGD opt(model.named_parameters(), nn::SGDOptions{0.1, 0.9, 0.0, 0.0, false});
  dist::DistributedSampler sampler(kExamples, 1, 0, true, 7, true);
  const std::int64_t b = kGlobalBatch / world;
  std::vector<double> losses;
  for (std::int64_t e = 0; e < kEpochs; ++e) {
    sampler.set_epoch(e);
    const std::vector<std::int64_t> order = sampler.indices();
    if (e == kEpochs - 1) nn::enable_observer(model, false);  // freeze the ranges for the last epoch
    for (std::int64_t s = 0; s + kGlobalBatch <= kExamples; s += kGlobalBatch) {
      Tensor x, y;
      rows(d, order, s + rank * b, b, x, y);
      Tensor loss = cross_entropy(forward(x), y);
      loss.backward();
      opt.step();
      opt.zero_grad();
      Tensor l = loss.detach().clone();
      if (pg) pg->all_reduce(l, ReduceOp::avg);
      losses.push_back(l.item());
    }
  }
  return losses;
}

std::vector<float> flat_state(const nn::Module& m) {
  std::vector<float> out;
  for (const auto& [n, t] : m.state_dict()) {
    const std::vector<double> v = t.to(Device::cpu()).to(DType::f64).to_vector<double>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

int run_ddp(ProcessGroup& pg) {
  const int rank = pg.rank(), world = pg.world_size();
  auto model = make_model();
  // Perturb the non-zero ranks' weights: the broadcast must undo it.
  if (rank != 0)
    for (auto& [n, p] : model->named_parameters()) p.copy_(zeros(p.shape(), TensorOptions{}.with_dtype(p.dtype()).with_device(g_dev)));
  dist::DDPOptions o;
  o.bucket_cap_bytes = 1024;  // several buckets even for this small model
  auto ddp = std::make_shared<dist::DistributedDataParallel>(model, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), o);
  EXPECT(ddp->bucket_sizes().size() > 1, "expected several buckets, got %zu", ddp->bucket_sizes().size());
  const std::vector<double> losses = train(*model, [&](const Tensor& x) { return ddp->forward(x); }, rank, world, &pg);
  EXPECT(ddp->sync_count() == static_cast<std::int64_t>(losses.size()), "one gradient sync per step: %lld vs %zu",
         static_cast<long long>(ddp->sync_count()), losses.size());
  // Every parameter and buffer (observer ranges, qparams) bit-identical.
  const std::vector<float> mine = flat_state(*model);
  Tensor all = pg.all_gather(Tensor::from_vector(mine, {static_cast<std::int64_t>(mine.size())}, g_dev));
  const std::vector<float> v = all.to(Device::cpu()).to_vector<float>();
  for (int r = 1; r < world; ++r)
    EXPECT(std::memcmp(v.data(), v.data() + r * mine.size(), mine.size() * sizeof(float)) == 0,
           "rank %d's weights and buffers differ from rank 0's", r);
  if (rank == 0) {
    // Single-process training with the same global batch.
    auto ref = make_model();
    const std::vector<double> ref_losses = train(*ref, [&](const Tensor& x) { return ref->forward(x); }, 0, 1, nullptr);
    double worst = 0, worst_w = 0;
    for (std::size_t i = 0; i < losses.size(); ++i) worst = std::max(worst, std::abs(losses[i] - ref_losses[i]));
    const std::vector<float> rw = flat_state(*ref);
    for (std::size_t i = 0; i < rw.size(); ++i)
      if (std::isfinite(rw[i])) worst_w = std::max(worst_w, static_cast<double>(std::abs(rw[i] - mine[i])));
    std::printf("ddp: %d ranks, %zu steps, loss %.5f -> %.5f (single process %.5f -> %.5f); max |loss diff| %.3g, "
                "max |state diff| %.3g; weights bit-identical across ranks\n",
                world, losses.size(), losses.front(), losses.back(), ref_losses.front(), ref_losses.back(), worst,
                worst_w);
    // The stated tolerance (docs/design.md "Distributed training"): the
    // per-step global loss within 1e-3 of single-process training.
    EXPECT(worst <= 1e-3, "loss curve differs from single-process training by %g > 1e-3", worst);
    EXPECT(losses.back() < losses.front() * 0.8, "the loss did not fall: %g -> %g", losses.front(), losses.back());
  }
  return 0;
}
// The nccl-ddp-graph mode: kWarmup eager steps, then kSteps steps either
// eagerly or as replays of one captured step (static input tensors).
int run_ddp_graph(ProcessGroup& pg) {
  constexpr int kWarmup = 3, kSteps = 6;
  const int rank = pg.rank(), world = pg.world_size();
  const Data d = make_data();
  dist::DistributedSampler sampler(kExamples, 1, 0, true, 7, true);
  const std::vector<std::int64_t> order = sampler.indices();
  const std::int64_t b = kGlobalBatch / world;
  struct Run {
    std::vector<float> state, momentum;
    std::int64_t syncs = 0;
  };
  auto train_run = [&](bool captured) {
    auto model = make_model();
    dist::DDPOptions o;
    o.bucket_cap_bytes = 1024;  // several buckets, as in nccl-ddp
    auto ddp = std::make_shared<dist::DistributedDataParallel>(
        model, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), o);
    nn::SGD opt(model->named_parameters(), nn::SGDOptions{0.1, 0.9, 0.0, 0.0, false});
    Tensor x_static, y_static;
    rows(d, order, rank * b, b, x_static, y_static);
    auto step = [&](const Tensor& x, const Tensor& y) {
      Tensor loss = cross_entropy(ddp->forward(x), y);
      loss.backward();
      opt.step();
      opt.zero_grad();
    };
    CudaGraph graph(g_dev.index);
    for (int i = 0; i < kWarmup + kSteps; ++i) {
      Tensor x, y;
      rows(d, order, (i * kGlobalBatch) % kExamples + rank * b, b, x, y);
      if (!captured || i < kWarmup) {
        step(x, y);
        continue;
      }
      x_static.copy_(x);
      y_static.copy_(y);
      if (!graph.captured()) graph.capture([&] { step(x_static, y_static); });
      graph.replay();
    }
    cuda_synchronize(g_dev.index);
    Run r;
    r.state = flat_state(*model);
    for (const auto& [n, t] : opt.state_dict()) {
      if (n.find("momentum_buffer") == std::string::npos) continue;
      const std::vector<double> v = read(t);
      r.momentum.insert(r.momentum.end(), v.begin(), v.end());
    }
    r.syncs = ddp->sync_count();
    return r;
  };
  const Run eager = train_run(false), graphed = train_run(true);
  EXPECT(eager.syncs == kWarmup + kSteps, "eager: %lld gradient syncs", static_cast<long long>(eager.syncs));
  // Host-side counters move only when host code runs: the warm-up and the capture.
  EXPECT(graphed.syncs == kWarmup + 1, "captured: %lld gradient syncs", static_cast<long long>(graphed.syncs));
  EXPECT(eager.state.size() == graphed.state.size() && eager.momentum.size() == graphed.momentum.size() &&
             !eager.momentum.empty(),
         "state sizes differ");
  EXPECT(std::memcmp(eager.state.data(), graphed.state.data(), eager.state.size() * sizeof(float)) == 0,
         "replayed weights and buffers differ from eager DDP steps");
  EXPECT(std::memcmp(eager.momentum.data(), graphed.momentum.data(), eager.momentum.size() * sizeof(float)) == 0,
         "replayed momentum buffers differ from eager DDP steps");
  const std::vector<float>& mine = graphed.state;
  Tensor all = pg.all_gather(Tensor::from_vector(mine, {static_cast<std::int64_t>(mine.size())}, g_dev));
  const std::vector<float> v = all.to(Device::cpu()).to_vector<float>();
  for (int r = 1; r < world; ++r)
    EXPECT(std::memcmp(v.data(), v.data() + r * mine.size(), mine.size() * sizeof(float)) == 0,
           "rank %d's replayed weights and buffers differ from rank 0's", r);
  if (rank == 0)
    std::printf("ddp graph: %d ranks, %d eager + %d replayed steps: bit for bit as eager DDP, equal across ranks\n",
                world, kWarmup, kSteps);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: dist_worker MODE [ARGS]\n");
    return 2;
  }
  const std::string mode = argv[1];
  g_rank = std::getenv("RANK") ? std::atoi(std::getenv("RANK")) : -1;
  try {
    if (mode == "exit") {
      const int world = std::atoi(std::getenv("WORLD_SIZE"));
      if (g_rank == world - 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return argc > 2 ? std::atoi(argv[2]) : 3;
      }
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    if (mode == "sleep") {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    if (mode == "timeout-join") {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        auto pg = ProcessGroup::from_env();
        EXPECT(false, "joining a group whose peer never starts succeeded");
      } catch (const Error& e) {
        const double s = seconds_since(t0);
        std::printf("rank %d: error after %.2f s: %s\n", g_rank, s, e.what());
        EXPECT(s < 10.0, "the error came after %.2f s (timeout 2 s)", s);
      }
      return g_failures ? 1 : 0;
    }
    // The NCCL modes decide whether to skip before joining the group: a rank
    // that joined and then left at once could close its sockets while a peer
    // is still finishing the mesh's handshake, failing that peer (seen in CI).
    if (mode.rfind("nccl-", 0) == 0) {
      const int world = std::getenv("WORLD_SIZE") ? std::atoi(std::getenv("WORLD_SIZE")) : 1;
      if (!dist::nccl_available() || cuda_device_count() < world) {
        std::printf("SKIPPED: %s needs %d GPUs and an NCCL build (have %d GPUs, NCCL %s)\n", mode.c_str(), world,
                    cuda_device_count(), dist::nccl_available() ? "on" : "off");
        return 0;
      }
    }
    auto pg = ProcessGroup::from_env();
    if (mode == "collectives") {
      check_collectives(*pg, Device::cpu());
    } else if (mode == "nccl-collectives") {
      check_collectives(*pg, Device::cuda(pg->local_rank()));
    } else if (mode == "timeout-op") {
      if (pg->rank() == 1) {  // never joins the collective; exits after the others gave up
        std::this_thread::sleep_for(pg->timeout() + std::chrono::seconds(3));
        return 0;
      }
      const auto t0 = std::chrono::steady_clock::now();
      try {
        Tensor x = Tensor::from_vector<float>({1, 2, 3}, {3});
        pg->all_reduce(x);
        EXPECT(false, "all_reduce without the peer succeeded");
      } catch (const Error& e) {
        const double s = seconds_since(t0);
        std::printf("rank 0: all_reduce failed after %.2f s (timeout %.1f s): %s\n", s, pg->timeout().count() / 1e3,
                    e.what());
        EXPECT(s >= pg->timeout().count() / 1e3 * 0.9 && s < pg->timeout().count() / 1e3 + 5,
               "failed after %.2f s", s);
      }
      // The group is unusable now.
      bool again = false;
      try {
        pg->barrier();
      } catch (const Error& e) {
        again = std::string(e.what()).find("unusable") != std::string::npos;
      }
      EXPECT(again, "a call after the failure should say the group is unusable");
    } else if (mode == "kill") {
      Tensor x = Tensor::from_vector<float>({1, 2, 3}, {3});
      for (int i = 0; i < 3; ++i) pg->all_reduce(x);
      if (pg->rank() == 1) {
        std::printf("rank 1: SIGKILL mid-step\n");
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      const auto t0 = std::chrono::steady_clock::now();
      try {
        for (int i = 0; i < 1000; ++i) {
          pg->all_reduce(x);
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        EXPECT(false, "collectives went on after the peer died");
      } catch (const Error& e) {
        const double s = seconds_since(t0);
        std::printf("rank 0: the peer's death gave an error after %.2f s (timeout %.1f s): %s\n", s,
                    pg->timeout().count() / 1e3, e.what());
        EXPECT(s < pg->timeout().count() / 1e3 + 2, "the error came after %.2f s", s);
      }
    } else if (mode == "ddp") {
      run_ddp(*pg);
    } else if (mode == "nccl-ddp" || mode == "nccl-ddp-graph") {
      g_dev = Device::cuda(pg->local_rank());
      if (mode == "nccl-ddp") run_ddp(*pg);
      else run_ddp_graph(*pg);
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
  if (g_failures == 0) std::printf("rank %d: %s OK\n", g_rank, mode.c_str());
  return g_failures ? 1 : 0;
}
