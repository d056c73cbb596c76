// The single-process parts of dist/ and its hooks: the engine's
// post-accumulate grad hooks, DistributedSampler (torch's split), the TCP
// store, a world of one, the observer range sync, DDP in a world of one.
// The multi-process tests (Gloo on loopback, NCCL) are in tests/dist/.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <thread>

#include "helpers.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}
}  // namespace

TEST_CASE("post-accumulate hook: once per backward, after the last contribution") {
  Tensor w = Tensor::from_vector<double>({1, 2, 3}, {3});
  w.set_requires_grad(true);
  Tensor v = Tensor::from_vector<double>({4, 5, 6}, {3});
  v.set_requires_grad(true);
  std::vector<std::string> fired;
  std::vector<double> seen;
  const auto hw = add_post_accumulate_grad_hook(w, [&] {
    fired.push_back("w");
    seen = w.grad().to_vector<double>();
  });
  add_post_accumulate_grad_hook(v, [&] { fired.push_back("v"); });
  // w is used twice: its hook fires once, with both contributions summed.
  Tensor y = sum(add(mul(w, w), mul(w, v)));
  y.backward();
  CHECK(fired.size() == 2);
  CHECK(std::count(fired.begin(), fired.end(), "w") == 1);
  CHECK(seen == std::vector<double>{2 * 1 + 4, 2 * 2 + 5, 2 * 3 + 6});
  // Removed: no longer fires; the other one still does (and grads accumulate).
  remove_post_accumulate_grad_hook(w, hw);
  fired.clear();
  sum(mul(w, v)).backward();
  CHECK(fired == std::vector<std::string>{"v"});
  // A leaf as the root of backward fires too.
  Tensor s = Tensor::from_vector<double>({1}, {});
  s.set_requires_grad(true);
  int n = 0;
  add_post_accumulate_grad_hook(s, [&] { ++n; });
  s.backward();
  CHECK(n == 1);
  // Errors.
  CHECK_THROWS_AS(add_post_accumulate_grad_hook(Tensor::from_vector<double>({1}, {1}), [] {}), Error);
  CHECK_THROWS_AS(add_post_accumulate_grad_hook(w, nullptr), Error);
  CHECK_THROWS_AS(add_post_accumulate_grad_hook(y, [] {}), Error);  // not a leaf
}

TEST_CASE("post-accumulate hook: fires for a leaf whose branch has no gradient") {
  Tensor w = Tensor::from_vector<double>({1, 2}, {2});
  w.set_requires_grad(true);
  int n = 0;
  add_post_accumulate_grad_hook(w, [&] { ++n; });
  // relu(-w) has zero gradient, still a defined one; the hook fires once.
  sum(relu(neg(w))).backward();
  CHECK(n == 1);
}

TEST_CASE("DistributedSampler: torch's split, padding and drop_last") {
  // torch: N=10, W=3, shuffle=False: num_samples 4, total 12, padded with 0, 1.
  dist::DistributedSampler a0(10, 3, 0, false), a1(10, 3, 1, false), a2(10, 3, 2, false);
  CHECK(a0.num_samples() == 4);
  CHECK(a0.indices() == std::vector<std::int64_t>{0, 3, 6, 9});
  CHECK(a1.indices() == std::vector<std::int64_t>{1, 4, 7, 0});
  CHECK(a2.indices() == std::vector<std::int64_t>{2, 5, 8, 1});
  // drop_last: ceil((10 - 3) / 3) = 3 each, total 9.
  dist::DistributedSampler d2(10, 3, 2, false, 0, true);
  CHECK(d2.num_samples() == 3);
  CHECK(d2.indices() == std::vector<std::int64_t>{2, 5, 8});
  // Fewer examples than ranks: padding repeats cyclically.
  dist::DistributedSampler p3(2, 5, 4, false);
  CHECK(p3.indices() == std::vector<std::int64_t>{0});
  CHECK(dist::DistributedSampler(2, 5, 4, false, 0, true).num_samples() == 0);
  // Shuffled: the ranks partition one permutation; epochs differ; seeds repeat.
  std::vector<std::int64_t> all;
  for (int r = 0; r < 4; ++r) {
    dist::DistributedSampler s(100, 4, r, true, 9);
    s.set_epoch(3);
    auto ix = s.indices();
    CHECK(ix.size() == 25);
    all.insert(all.end(), ix.begin(), ix.end());
  }
  std::sort(all.begin(), all.end());
  for (std::int64_t i = 0; i < 100; ++i) CHECK(all[static_cast<std::size_t>(i)] == i);
  dist::DistributedSampler e(100, 4, 0, true, 9);
  const auto first = e.indices();
  e.set_epoch(1);
  CHECK(e.indices() != first);
  e.set_epoch(0);
  CHECK(e.indices() == first);
  CHECK_THROWS_AS(dist::DistributedSampler(10, 0, 0), Error);
  CHECK_THROWS_AS(dist::DistributedSampler(10, 2, 2), Error);
  CHECK_THROWS_AS(dist::DistributedSampler(-1, 2, 0), Error);
  CHECK_THROWS_AS(e.set_epoch(-1), Error);
}

TEST_CASE("TcpStore: set/get/wait/add across clients, a missing key times out") {
  const int port = free_port();
  dist::TcpStore server("127.0.0.1", port, true, std::chrono::milliseconds(2000));
  dist::TcpStore client("127.0.0.1", port, false, std::chrono::milliseconds(2000));
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    client.set("late", {'x', 'y'});
  });
  CHECK(server.get("late") == std::vector<char>{'x', 'y'});  // parked until set
  late.join();
  server.set("k", {'1'});
  CHECK(client.get("k") == std::vector<char>{'1'});
  CHECK(client.add("n", 2) == 2);
  CHECK(server.add("n", 3) == 5);
  client.wait({"k", "n"}, std::chrono::milliseconds(500));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(client.get("never", std::chrono::milliseconds(300)), doctest::Contains("timed out"), Error);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  // No server: connecting gives up after the timeout.
  CHECK_THROWS_AS(dist::TcpStore("127.0.0.1", free_port(), false, std::chrono::milliseconds(300)), Error);
  CHECK_THROWS_AS(dist::TcpStore("127.0.0.1", 70000, false, std::chrono::milliseconds(300)), Error);
}

TEST_CASE("ProcessGroup: argument errors, a world of one") {
  CHECK_THROWS_AS(dist::ProcessGroup(2, 2, "127.0.0.1", 0), Error);
  CHECK_THROWS_AS(dist::ProcessGroup(0, 0, "127.0.0.1", 0), Error);
  CHECK_THROWS_AS(dist::ProcessGroup(0, 1, "", 0), Error);
  dist::ProcessGroup pg(0, 1, "127.0.0.1", 0, {std::chrono::milliseconds(5000)});
  CHECK(pg.rank() == 0);
  CHECK(pg.world_size() == 1);
  if (!dist::gloo_available()) {
    std::printf("SKIPPED: this build has no Gloo\n");
    CHECK_THROWS_AS(pg.all_reduce(Tensor::from_vector<float>({1}, {1})), Error);
    return;
  }
  Tensor x = Tensor::from_vector<float>({1, -2, 3}, {3});
  for (auto op : {dist::ReduceOp::sum, dist::ReduceOp::avg, dist::ReduceOp::min, dist::ReduceOp::max}) {
    pg.all_reduce(x, op);
    CHECK(x.to_vector<float>() == std::vector<float>{1, -2, 3});
  }
  pg.broadcast(x, 0);
  CHECK(pg.all_gather(x).shape() == Shape{1, 3});
  pg.barrier();
  if (!dist::nccl_available() || !cuda_available()) {
    CHECK_THROWS_AS(pg.all_reduce(Tensor::from_vector<float>({1}, {1}).to(Device::cuda(0))), Error);
  }
}

TEST_CASE("Observer range sync: runs after each update, before the qparams") {
  nn::FakeQuantize fq(nn::default_qat_qconfig().activation);
  auto& obs = const_cast<nn::Observer&>(fq.observer());
  int calls = 0;
  // A stand-in for the all-reduce: widen the range to [-10, 10].
  obs.set_range_sync([&](const Tensor& lo, const Tensor& hi) {
    ++calls;
    Tensor(lo).copy_(Tensor::from_vector<float>({-10}, {1}));
    Tensor(hi).copy_(Tensor::from_vector<float>({10}, {1}));
  });
  Tensor x = Tensor::from_vector<float>({0.5f, -0.25f, 1.0f}, {3});
  Tensor y = fq(x);
  CHECK(calls == 1);
  // The qparams come from the synced range: scale = 20 / 127 (reduce_range u8).
  CHECK(fq.scale().item() == doctest::Approx(20.0 / 127).epsilon(1e-6));
  // The same as an unsynced FakeQuantize that saw [-10, 10] itself.
  nn::FakeQuantize ref(nn::default_qat_qconfig().activation);
  ref(Tensor::from_vector<float>({-10, 10}, {2}));
  CHECK(ref.scale().item() == fq.scale().item());
  CHECK(ref.zero_point().item() == fq.zero_point().item());
  ref.enable_observer(false);
  CHECK(ref(x).to_vector<float>() == y.to_vector<float>());
  obs.set_range_sync(nullptr);
  fq(x);
  CHECK(calls == 1);
}

TEST_CASE("DistributedDataParallel in a world of one: buckets, one sync per backward, unused parameters") {
  if (!dist::gloo_available()) {
    std::printf("SKIPPED: this build has no Gloo\n");
    return;
  }
  auto pg = std::make_shared<dist::ProcessGroup>(0, 1, "127.0.0.1", 0);
  Generator gen(3);
  auto model = std::make_shared<nn::Sequential>();
  model->emplace_back<nn::Linear>(8, 16, gen);
  model->emplace_back<nn::ReLU>();
  model->emplace_back<nn::Linear>(16, 2, gen);
  dist::DDPOptions o;
  o.bucket_cap_bytes = 16 * 2 * 4 + 2 * 4;  // the last layer's weight and bias fill one bucket
  dist::DistributedDataParallel ddp(model, pg, o);
  CHECK(ddp.bucket_sizes() == std::vector<std::size_t>{2, 1, 1});
  Tensor x = randn({4, 8}, gen);
  Tensor loss = sum(ddp(x));
  loss.backward();
  CHECK(ddp.sync_count() == 1);
  // Averaging over one rank leaves the gradients as they were.
  auto ref = std::make_shared<nn::Sequential>();
  Generator gen2(3);
  ref->emplace_back<nn::Linear>(8, 16, gen2);
  ref->emplace_back<nn::ReLU>();
  ref->emplace_back<nn::Linear>(16, 2, gen2);
  sum(ref->forward(x)).backward();
  const auto p = model->parameters(), q = ref->parameters();
  for (std::size_t i = 0; i < p.size(); ++i) CHECK(p[i].grad().to_vector<float>() == q[i].grad().to_vector<float>());
  // A parameter requiring grad that gets no gradient: the next forward says so.
  model->zero_grad();
  Tensor h = model->named_children()[0].second->forward(x);  // only the first layer
  sum(h).backward();
  CHECK(ddp.sync_count() == 1);
  CHECK_THROWS_WITH_AS(ddp(x), doctest::Contains("got no gradient"), Error);
  // After the error the state is reset: training goes on.
  sum(ddp(x)).backward();
  CHECK(ddp.sync_count() == 2);
}
