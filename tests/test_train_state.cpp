// Training state for resume (nn::save_train_state, docs/design.md
// "Checkpoints and resume"): generator state, DataLoader position, fake-quant
// flags and the whole file round trip, where training continued from the
// restored state must match the uninterrupted training bit for bit.
#include <filesystem>

#include "helpers.h"
#include "test_nn_helpers.h"
#include "qgrad/nn/checkpoint.h"
#include "qgrad/nn/data.h"
#include "qgrad/nn/layers.h"
#include "qgrad/nn/qat.h"
#include "qgrad/ops/loss.h"

using namespace qgrad;
using namespace qgrad::nn;
using qgrad::testing::bit_equal;
using qgrad::testing::error_of;
using qgrad::testing::TempDir;

namespace {

Dataset synthetic(std::int64_t n, std::int64_t features, std::uint64_t seed) {
  Generator g(seed);
  Dataset d;
  d.images = randn({n, features}, g);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = (i * 7 + 3) % 4;
  d.labels = Tensor::from_vector(labels, {n});
  return d;
}

// A prepared (fake-quant) 8-16-4 MLP on `dev`, initialised from `seed`.
std::shared_ptr<Sequential> qat_mlp(std::uint64_t seed, Device dev) {
  Generator g(seed);
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Linear>(8, 16, g);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(16, 4, g);
  m->to(dev);
  prepare_qat(*m);
  return m;
}

void train_steps(Sequential& model, Optimizer& opt, DataLoader& loader, int steps) {
  Batch b;
  for (int s = 0; s < steps; ++s) {
    if (!loader.next(b)) {
      loader.start_epoch();
      REQUIRE(loader.next(b));
    }
    Tensor loss = cross_entropy(model(b.images), b.labels);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

void check_same_state(const Module& a, const Module& b) {
  const NamedTensors sa = a.state_dict(), sb = b.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    CAPTURE(sa[i].first);
    CHECK(sa[i].first == sb[i].first);
    CHECK(bit_equal(sa[i].second.cpu(), sb[i].second.cpu()));
  }
  const NamedTensors fa = quant_flags(a), fb = quant_flags(b);
  REQUIRE(fa.size() == fb.size());
  for (std::size_t i = 0; i < fa.size(); ++i) CHECK(bit_equal(fa[i].second, fb[i].second));
}

// Trains 5 steps (observers on), saves, freezes observers, trains 7 more; a
// second model restored from the file must end bit-identical.
void round_trip(Device dev, bool adamw) {
  TempDir d;
  const std::string path = d.file("train_state.safetensors");
  const Dataset data = synthetic(40, 8, 3);
  auto make_opt = [&](Sequential& m) -> std::unique_ptr<Optimizer> {
    if (adamw) return std::make_unique<AdamW>(m.named_parameters(), AdamWOptions{0.01});
    return std::make_unique<SGD>(m.named_parameters(), SGDOptions{0.05, 0.9, 0.0, 5e-4, true});
  };
  auto a = qat_mlp(1, dev);
  auto oa = make_opt(*a);
  DataLoader la(data, 6, true, 11, false, dev);
  Generator extra_gen(99);
  extra_gen.advance(5);
  train_steps(*a, *oa, la, 5);
  NamedTensors extra;
  for (const auto& [n, t] : la.state_dict()) extra.emplace_back("loader." + n, t);
  extra.emplace_back("note", Tensor::scalar<float>(2.5f));
  save_train_state(path, *a, oa.get(), {{"extra", &extra_gen}}, extra, R"({"step": 5})");
  enable_observer(*a, false);
  train_steps(*a, *oa, la, 7);

  // Different initialisation, loader seed and generator: all overwritten.
  auto b = qat_mlp(2, dev);
  auto ob = make_opt(*b);
  DataLoader lb(data, 6, true, 12, false, dev);
  Generator gb(1);
  const TrainStateFile f = read_train_state(path);
  CHECK(f.state_json == R"({"step": 5})");
  const NamedTensors got = restore_train_state(f, *b, ob.get(), {{"extra", &gb}});
  CHECK(gb.seed() == 99);
  CHECK(gb.offset() == 5);
  NamedTensors loader_state;
  bool note = false;
  for (const auto& [n, t] : got) {
    if (n.rfind("loader.", 0) == 0) loader_state.emplace_back(n.substr(7), t);
    if (n == "note") note = t.item() == 2.5;
  }
  CHECK(note);
  lb.load_state_dict(loader_state);
  CHECK(ob->step_count() == 5);
  enable_observer(*b, false);
  train_steps(*b, *ob, lb, 7);
  check_same_state(*a, *b);
  CHECK(ob->step_count() == oa->step_count());
  const NamedTensors sa = oa->state_dict(), sb = ob->state_dict();
  REQUIRE(sa.size() == sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) CHECK(bit_equal(sa[i].second.cpu(), sb[i].second.cpu()));
}

}  // namespace

TEST_CASE("generator state round trip: the restored generator continues the sequence") {
  Generator g(1234);
  (void)randn({17}, g);
  const Tensor st = generator_state(g);
  CHECK(st.dtype() == DType::s64);
  CHECK(st.shape() == Shape{2});
  const Tensor next = randn({33}, g);
  Generator h(5);
  (void)rand({3}, h);
  set_generator_state(h, st);
  CHECK(h.seed() == 1234);
  CHECK(bit_equal(randn({33}, h), next));
  // Seeds above INT64_MAX survive the s64 reinterpretation.
  Generator big(~0ull - 2);
  big.advance(7);
  Generator back;
  set_generator_state(back, generator_state(big));
  CHECK(back.seed() == ~0ull - 2);
  CHECK(back.offset() == 7);
  // Errors leave the generator unchanged.
  CHECK(error_of([&] { set_generator_state(back, Tensor::from_vector<std::int64_t>({1, 2, 3}, {3})); })
            .find("s64 [2]") != std::string::npos);
  CHECK(error_of([&] { set_generator_state(back, Tensor::from_vector<float>({1, 2}, {2})); }).find("state") !=
        std::string::npos);
  CHECK(back.seed() == ~0ull - 2);
}

TEST_CASE("DataLoader state round trip mid-epoch, and its errors") {
  const Dataset data = synthetic(23, 4, 8);
  DataLoader a(data, 5, true, 3), b(data, 5, true, 77);
  Batch x, y;
  a.start_epoch();
  REQUIRE(a.next(x));
  REQUIRE(a.next(x));
  b.load_state_dict(a.state_dict());
  CHECK(b.order() == a.order());
  CHECK(b.epoch() == a.epoch());
  // The rest of this epoch and the next two epochs match batch for batch.
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (;;) {
      const bool more = a.next(x);
      CHECK(more == b.next(y));
      if (!more) break;
      CHECK(x.index == y.index);
      CHECK(bit_equal(x.images, y.images));
      CHECK(bit_equal(x.labels, y.labels));
    }
    a.start_epoch();
    b.start_epoch();
    CHECK(a.order() == b.order());
  }
  NamedTensors bad = a.state_dict();
  bad[0].second = Tensor::from_vector<std::int64_t>(std::vector<std::int64_t>(23, 0), {23});
  CHECK(error_of([&] { b.load_state_dict(bad); }).find("not a permutation") != std::string::npos);
  bad = a.state_dict();
  bad[1].second = Tensor::from_vector<std::int64_t>({24, 0, 0}, {3});
  CHECK(error_of([&] { b.load_state_dict(bad); }).find("out of range") != std::string::npos);
  bad = a.state_dict();
  bad.pop_back();
  CHECK(error_of([&] { b.load_state_dict(bad); }).find("needs order, position and generator") != std::string::npos);
  CHECK(b.order() == a.order());
}

TEST_CASE("quant_flags round trip and errors") {
  auto m = qat_mlp(4, Device::cpu());
  const NamedTensors on = quant_flags(*m);
  CHECK(on.size() == 2 * 5);  // quant, and weight + output fake quant of both layers
  CHECK(on[0].first == "quant.observer_enabled");
  enable_observer(*m, false);
  const NamedTensors off = quant_flags(*m);
  load_quant_flags(*m, on);
  for (const auto& [n, t] : quant_flags(*m)) CHECK(t.item() == 1);
  NamedTensors missing(off.begin() + 1, off.end());
  CHECK(error_of([&] { load_quant_flags(*m, missing); }).find("missing") != std::string::npos);
  NamedTensors two = off;
  two[3].second = Tensor::scalar<std::uint8_t>(2);
  CHECK(error_of([&] { load_quant_flags(*m, two); }).find("0 or 1") != std::string::npos);
  NamedTensors extra = off;
  extra.emplace_back("9.observer_enabled", Tensor::scalar<std::uint8_t>(0));
  CHECK(error_of([&] { load_quant_flags(*m, extra); }).find("name no fake quant") != std::string::npos);
  for (const auto& [n, t] : quant_flags(*m)) CHECK(t.item() == 1);  // failed loads changed nothing
}

TEST_CASE("train state round trip (CPU): SGD Nesterov and AdamW continue bit for bit") {
  round_trip(Device::cpu(), false);
  round_trip(Device::cpu(), true);
}

TEST_CASE("train state round trip (CUDA): SGD Nesterov and AdamW continue bit for bit") {
  QGRAD_REQUIRE_GPU();
  round_trip(Device::cuda(0), false);
  round_trip(Device::cuda(0), true);
}

TEST_CASE("train state: errors name the file and leave the model unchanged") {
  TempDir d;
  const std::string path = d.file("state.safetensors");
  auto a = qat_mlp(1, Device::cpu());
  SGD oa(a->named_parameters(), SGDOptions{0.1, 0.9});
  Generator g(3);
  save_train_state(path, *a, &oa, {{"init", &g}}, {}, "{}");
  auto b = qat_mlp(2, Device::cpu());
  const NamedTensors before = b->state_dict();
  std::vector<Tensor> copy;
  for (const auto& [n, t] : before) copy.push_back(t.clone());
  const TrainStateFile f = read_train_state(path);
  AdamW adam(b->named_parameters(), AdamWOptions{});
  CHECK(error_of([&] { restore_train_state(f, *b, &adam, {{"init", &g}}); }).find("not AdamW") != std::string::npos);
  SGD ob(b->named_parameters(), SGDOptions{0.1, 0.9});
  Generator other;
  CHECK(error_of([&] { restore_train_state(f, *b, &ob, {{"other", &other}}); }).find("generator 'other'") !=
        std::string::npos);
  CHECK(error_of([&] { restore_train_state(f, *b, nullptr, {{"init", &g}}); }).find("no optimizer was given") !=
        std::string::npos);
  // A float model cannot take a prepared model's state.
  Generator gi(1);
  Sequential plain;
  plain.emplace_back<Linear>(8, 16, gi);
  SGD op(plain.named_parameters(), SGDOptions{0.1});
  CHECK(error_of([&] { restore_train_state(f, plain, &op, {{"init", &g}}); }).find(path) != std::string::npos);
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(bit_equal(b->state_dict()[i].second, copy[i]));
  // Not a training state.
  save_checkpoint(d.file("model.safetensors"), *a);
  CHECK(error_of([&] { read_train_state(d.file("model.safetensors")); }).find("not a training state") !=
        std::string::npos);
  CHECK(error_of([&] { read_train_state(d.file("absent.safetensors")); }).find("cannot open") != std::string::npos);
}
