// The bad-input matrix: every documented error of every public op and
// reader (docs/ops.md "Errors" lines and the ops' QGRAD_CHECKs) is provoked.
// Each case must throw a qgrad::Error (nothing else) whose op() and arg()
// name the op (or reader) and the argument at fault; cases with a
// destination (in-place copies, optimizer steps, state loads, checkpoint
// loads, observers) also check that the destination is bit-identical after
// the failed call. Each TEST_CASE prints how many cases it tried.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "helpers.h"
#include "qgrad/nn/nn.h"
#include "qgrad/ops/registry.h"

using namespace qgrad;
using namespace qgrad::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::int64_t kBig = std::int64_t{1} << 40;

// Runs each case as it is added (lambdas capture loop variables by
// reference): each must throw qgrad::Error naming op and arg.
class Matrix {
 public:
  void add(const std::string& op, const std::string& arg, const std::function<void()>& run, int line) {
    ++count_;
    INFO("case at line ", line, " (op ", op, ", arg ", arg, ")");
    bool threw = false;
    try {
      run();
    } catch (const Error& e) {
      threw = true;
      const std::string what = e.what();
      INFO("message: ", what);
      CHECK(e.op().find(op) != std::string::npos);
      CHECK((e.arg().find(arg) != std::string::npos || what.find(arg) != std::string::npos));
    } catch (const std::exception& e) {
      FAIL_CHECK("threw a non-qgrad exception: ", std::string(e.what()));
      threw = true;
    }
    if (!threw) FAIL_CHECK("no exception");
  }
  std::size_t run_all(const char* name) {
    MESSAGE(std::string(name), ": ", count_, " bad-input cases tried");
    total() += count_;
    return count_;
  }
  static std::size_t& total() {
    static std::size_t n = 0;
    return n;
  }

 private:
  std::size_t count_ = 0;
};

#define BAD(m, op, arg, ...) (m).add(op, arg, [&] { (void)(__VA_ARGS__); }, __LINE__)

Generator& gen() {
  static Generator g(2024);
  return g;
}
Tensor rnd(const Shape& s, DType d = DType::f32) {
  if (is_floating(d)) return randn(s, gen(), TensorOptions{}.with_dtype(d));
  if (d == DType::boolean) return randint(0, 2, s, gen(), TensorOptions{}.with_dtype(DType::s32)).to(d);
  return randint(1, 5, s, gen(), TensorOptions{}.with_dtype(d));
}
Tensor f32(const std::vector<float>& v) { return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}); }
Tensor s32(const std::vector<std::int32_t>& v) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())});
}

// A copy of a tensor's bytes, to check a destination is untouched.
struct Snapshot {
  std::vector<Tensor> copies, originals;
  explicit Snapshot(const std::vector<Tensor>& ts) {
    for (const Tensor& t : ts) {
      originals.push_back(t);
      copies.push_back(t.detach().clone());
    }
  }
  bool unchanged() const {
    for (std::size_t i = 0; i < copies.size(); ++i)
      if (!bit_equal(copies[i], originals[i])) return false;
    return true;
  }
};

struct TmpDir {
  std::filesystem::path path;
  TmpDir() {
    std::string t = "/tmp/qgrad_bad_XXXXXX";
    path = ::mkdtemp(t.data());
  }
  ~TmpDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& n, const std::string& bytes) const {
    const std::string p = (path / n).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
};

std::string be32(std::uint32_t v) {
  return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}
std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(v >> (8 * i));
  return s;
}
std::string safetensors(const std::string& header, const std::string& data) {
  std::string h = header;
  h.append((8 - h.size() % 8) % 8, ' ');
  return le64(h.size()) + h + data;
}

}  // namespace

// The documented errors of every op: the bad-input lists of the registry
// entries (ops/registry.h, ops/registry/*.cpp), so an op added there is in
// this matrix without a case here. The cases below are not ops (factories'
// shapes, copy_, optimizer and module state, files, nn) or need state
// checks (destinations untouched).
TEST_CASE("bad inputs: every registry entry's documented errors") {
  Matrix m;
  for (const registry::OpEntry& e : registry::op_registry())
    if (e.bad_inputs)
      for (const registry::BadInput& b : e.bad_inputs(Device::cpu())) m.add(b.op, b.arg, b.run, __LINE__);
  CHECK(m.run_all("registry entries") >= registry::op_registry().size());
}

TEST_CASE("bad inputs: SmoothQuant (nn)") {
  Matrix m;
  BAD(m, "smoothquant_factors", "alpha", smoothquant_factors(f32({1, 1, 1, 1, 1, 1}), rnd({5, 6}), 0.0));
  BAD(m, "smoothquant_factors", "alpha", smoothquant_factors(f32({1, 1, 1, 1, 1, 1}), rnd({5, 6}), 1.0));
  BAD(m, "smoothquant_factors", "alpha", smoothquant_factors(f32({1, 1, 1, 1, 1, 1}), rnd({5, 6}), kNaN));
  BAD(m, "smoothquant_factors", "weight", smoothquant_factors(f32({1, 1, 1, 1, 1, 1}), rnd({5, 4}), 0.5));
  BAD(m, "SmoothQuantCalibrator", "in_features", SmoothQuantCalibrator(0));
  SmoothQuantCalibrator calib(6);
  BAD(m, "SmoothQuantCalibrator", "x", calib.observe(rnd({2, 5})));
  BAD(m, "SmoothQuantCalibrator", "x", calib.observe(rnd({2, 6}, DType::s8)));
  BAD(m, "SmoothQuantLinear", "calib", SmoothQuantLinear::from_float(rnd({5, 6}), Tensor(), calib));
  m.run_all("SmoothQuant");
}

TEST_CASE("bad inputs: factories, shapes, conversions, in-place copy leave the destination untouched") {
  Matrix m;
  const std::int64_t i64max = std::numeric_limits<std::int64_t>::max();
  const Shape overflow{kBig, kBig}, negative{2, -3};
  // Zero-element shapes whose other dims overflow (found by fuzz_ops: their
  // strides overflowed int64) are rejected too.
  const Shape zero_overflow{0, 16, i64max};
  for (const Shape& s : {overflow, negative, Shape{i64max, 2}, Shape{3, i64max, i64max}, zero_overflow}) {
    BAD(m, "empty", "shape", Tensor::empty(s));
    BAD(m, "", "shape", zeros(s));
    BAD(m, "", "shape", full(s, 1.0));
    BAD(m, "", "shape", randn(s, gen()));
    BAD(m, "", "shape", rand(s, gen()));
    BAD(m, "", "shape", randint(0, 3, s, gen()));
    BAD(m, "reshape", "shape", rnd({2, 3}).reshape(s));
  }
  // Addressable element counts whose bytes cannot exist: OutOfMemory, not bad_alloc.
  BAD(m, "allocate", "bytes", Tensor::empty({(std::int64_t{1} << 61) - 1}, TensorOptions{}.with_dtype(DType::f64)));
  BAD(m, "allocate", "bytes", Tensor::empty({std::int64_t{1} << 45}, TensorOptions{}.with_dtype(DType::f64)));
  BAD(m, "empty", "shape", Tensor::empty({std::int64_t{1} << 62}, TensorOptions{}.with_dtype(DType::f64)));
  CHECK_THROWS_AS(Tensor::empty({std::int64_t{1} << 50}), OutOfMemory);
  BAD(m, "reshape", "shape", rnd({2, 3}).reshape({4, 2}));
  BAD(m, "reshape", "shape", rnd({2, 3}).reshape({-1, -1}));
  BAD(m, "reshape", "shape", rnd({2, 3}).reshape({-1, 4}));
  BAD(m, "reshape", "shape", rnd({2, 3}).reshape({0, -1}));
  // Huge but int64-valid requests: qgrad::Error/OutOfMemory, not std::bad_alloc
  // (randn/randint used to build a std::vector first) nor UB (arange's count).
  BAD(m, "allocate", "bytes", randn({std::int64_t{1} << 45}, gen()));
  BAD(m, "allocate", "bytes", randint(0, 5, {std::int64_t{1} << 45}, gen()));
  BAD(m, "arange", "end", arange(0, 1e300, 1e-300));
  BAD(m, "arange", "step", arange(0, 10, 0));
  BAD(m, "arange", "", arange(0, kInf, 1));
  BAD(m, "arange", "", arange(kNaN, 1, 1));
  BAD(m, "randint", "", randint(5, 5, {3}, gen()));
  BAD(m, "randint", "", randint(5, 1, {3}, gen()));
  BAD(m, "from_vector", "values", Tensor::from_vector<float>({1, 2, 3}, {2, 2}));
  BAD(m, "Tensor::data", "T", rnd({2}).data<double>());
  BAD(m, "item", "", rnd({2}).item());
  m.run_all("factories and shapes");

  // In-place copy_: every failure leaves the destination bit-identical.
  Matrix mc;
  const Tensor dst = rnd({2, 3});
  Snapshot snap({dst});
  BAD(mc, "copy_", "src", Tensor(dst).copy_(Tensor()));
  BAD(mc, "copy_", "src", Tensor(dst).copy_(rnd({3, 2})));
  BAD(mc, "copy_", "src", Tensor(dst).copy_(rnd({6})));
  for (DType d : {DType::f64, DType::f16, DType::bf16, DType::s8, DType::u8, DType::s32, DType::s64, DType::boolean})
    BAD(mc, "copy_", "src", Tensor(dst).copy_(rnd({2, 3}, d)));
  BAD(mc, "copy_", "tensor", Tensor().copy_(dst));
  mc.run_all("copy_");
  CHECK(snap.unchanged());
}

TEST_CASE("bad inputs: optimizers, modules and observers leave their state untouched") {
  Matrix m;
  Generator g(5);
  nn::Linear lin(3, 2, g);
  auto params = lin.named_parameters();
  // Constructors.
  BAD(m, "SGD", "params", nn::SGD({}, {}));
  BAD(m, "SGD", "lr", nn::SGD(params, {.lr = -1.0}));
  BAD(m, "SGD", "lr", nn::SGD(params, {.lr = kNaN}));
  BAD(m, "SGD", "momentum", nn::SGD(params, {.lr = 0.1, .momentum = -0.5}));
  BAD(m, "SGD", "weight_decay", nn::SGD(params, {.lr = 0.1, .weight_decay = -1}));
  BAD(m, "SGD", "nesterov", nn::SGD(params, {.lr = 0.1, .nesterov = true}));
  BAD(m, "AdamW", "beta1", nn::AdamW(params, {.beta1 = 1.0}));
  BAD(m, "AdamW", "beta2", nn::AdamW(params, {.beta2 = -0.1}));
  BAD(m, "SGD", "params", nn::SGD({{"a", params[0].second}, {"a", params[1].second}}, {}));
  BAD(m, "SGD", "params", nn::SGD({{"c", rnd({2})}}, {}));
  BAD(m, "SGD", "params", nn::SGD({{"c", rnd({2}, DType::s32)}}, {}));

  // step() with a bad gradient: parameters and buffers unchanged.
  nn::SGD sgd(params, {.lr = 0.1, .momentum = 0.9});
  for (auto& [n, p] : params) p.set_grad(ones_like(p));
  sgd.step();  // creates momentum buffers
  std::vector<Tensor> state;
  for (auto& [n, t] : sgd.state_dict()) state.push_back(t);
  for (auto& [n, p] : params) state.push_back(p);
  Snapshot snap(state);
  BAD(m, "set_grad", "grad", params[1].second.set_grad(rnd({5})));
  BAD(m, "set_grad", "grad", params[1].second.set_grad(rnd({2, 2})));
  params[1].second.set_grad(rnd({2}, DType::f64));
  BAD(m, "", "grad", sgd.step());
  params[1].second.set_grad(ones_like(params[1].second));

  // Optimizer::load_state_dict: missing, extra, wrong shape / dtype, negative steps.
  nn::NamedTensors good = sgd.state_dict();
  auto edited = [&](const std::string& name, Tensor t) {
    nn::NamedTensors s;
    for (auto& [n, v] : good) s.emplace_back(n, n == name ? t : v.detach().clone());
    return s;
  };
  nn::NamedTensors missing(good.begin() + 1, good.end());
  BAD(m, "Optimizer::load_state_dict", "step", sgd.load_state_dict(missing));
  BAD(m, "Optimizer::load_state_dict", "step", sgd.load_state_dict(edited("step", Tensor::scalar<std::int64_t>(-1))));
  BAD(m, "Optimizer::load_state_dict", "step", sgd.load_state_dict(edited("step", Tensor::scalar<float>(1))));
  BAD(m, "Optimizer::load_state_dict", "momentum_buffer",
      sgd.load_state_dict(edited(good.back().first, rnd({7}))));
  nn::NamedTensors extra = good;
  extra.emplace_back("bogus", rnd({1}));
  BAD(m, "Optimizer::load_state_dict", "state", sgd.load_state_dict(extra));
  nn::NamedTensors dup = good;
  dup.push_back(good.front());
  BAD(m, "Optimizer::load_state_dict", "step", sgd.load_state_dict(dup));

  // Module::load_state_dict.
  nn::NamedTensors ms = lin.state_dict();
  BAD(m, "Module::load_state_dict", "weight", lin.load_state_dict({{"bias", rnd({2})}}));
  BAD(m, "Module::load_state_dict", "weight", lin.load_state_dict({{"weight", rnd({3, 2})}, {"bias", rnd({2})}}));
  BAD(m, "Module::load_state_dict", "bias", lin.load_state_dict({{"weight", rnd({2, 3})}, {"bias", rnd({2}, DType::f64)}}));
  BAD(m, "Module::load_state_dict", "extra",
      lin.load_state_dict({{"weight", rnd({2, 3})}, {"bias", rnd({2})}, {"extra", rnd({1})}}));
  BAD(m, "Module::load_state_dict", "weight", lin.load_state_dict({{"weight", Tensor()}, {"bias", rnd({2})}}));

  // Observers.
  nn::ObserverOptions oo;
  oo.dtype = DType::s32;
  BAD(m, "", "dtype", nn::Observer(oo));
  oo = {};
  oo.quant_range = std::make_pair(std::int64_t{5}, std::int64_t{10});
  BAD(m, "", "quant_range", nn::Observer(oo));
  oo = {};
  oo.averaging_constant = 2.0;
  BAD(m, "", "averaging_constant", nn::Observer(oo));
  oo = {};
  oo.qscheme = nn::QScheme::per_channel_affine;
  oo.channels = 0;
  BAD(m, "", "channels", nn::Observer(oo));
  nn::PerChannelMinMaxObserver obs(3, 1);
  obs.forward(rnd({2, 3}));
  std::vector<Tensor> obs_state;
  for (auto& [n, t] : obs.state_dict()) obs_state.push_back(t);
  Snapshot obs_snap(obs_state);
  BAD(m, "", "x", obs.forward(rnd({2, 4})));
  BAD(m, "", "x", obs.forward(rnd({2, 3}, DType::s32)));
  BAD(m, "", "x", obs.forward(Tensor()));
  const Tensor qs = f32({7, 7, 7}), qz = s32({9, 9, 9});
  Snapshot q_snap({qs, qz});
  BAD(m, "", "scale", obs.calculate_qparams(f32({1, 1}), qz));
  BAD(m, "", "zero_point", obs.calculate_qparams(qs, f32({1, 1, 1})));
  m.run_all("optimizers, modules, observers");
  CHECK(snap.unchanged());
  CHECK(obs_snap.unchanged());
  CHECK(q_snap.unchanged());
}

TEST_CASE("bad inputs: IDX and safetensors files that are missing, empty, truncated or lie about sizes") {
  Matrix m;
  TmpDir d;
  const std::string img_header = be32(0x803) + be32(2) + be32(28) + be32(28);
  const std::string good_images = img_header + std::string(2 * 784, '\x10');
  const std::string lab_header = be32(0x801) + be32(3);
  for (auto [name, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"empty", ""},
           {"short_magic", "\0\0\x08"},
           {"bad_magic", be32(0x801) + be32(2) + be32(28) + be32(28)},
           {"short_header", be32(0x803) + be32(2)},
           {"truncated", good_images.substr(0, good_images.size() - 1)},
           {"trailing", good_images + "xx"},
           {"zero_dim", be32(0x803) + be32(0) + be32(28) + be32(28)},
           {"lies_huge", be32(0x803) + be32(0xffffffff) + be32(0xffffffff) + be32(0xffffffff) + "abc"},
           {"wrong_size", be32(0x803) + be32(1) + be32(2) + be32(2) + "abcd"},
           {"gz_garbage", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage", 18)}}) {
    const std::string p = d.file(name, bytes);
    BAD(m, "read_idx_images", p, nn::read_idx_images(p));
  }
  BAD(m, "read_idx_images", "missing", nn::read_idx_images(d.path.string() + "/missing.gz"));
  BAD(m, "read_idx_images", "not a regular file", nn::read_idx_images(d.path.string()));
  BAD(m, "read_idx_images", "norm", nn::read_idx_images(d.file("ok", good_images), {true, 0.0, 0.0}));
  for (auto [name, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"l_empty", ""},
           {"l_truncated", lab_header + "\x01\x02"},
           {"l_trailing", lab_header + "\x01\x02\x03\x04"},
           {"l_class", lab_header + "\x01\x02\x0a"},
           {"l_images", good_images}}) {
    const std::string p = d.file(name, bytes);
    BAD(m, "read_idx_labels", p, nn::read_idx_labels(p));
  }
  BAD(m, "load_fashion_mnist", "split", nn::load_fashion_mnist("valid", d.path.string()));
  BAD(m, "read_idx_images", "cannot open", nn::load_fashion_mnist("train", d.path.string()));

  const std::string w_hdr = R"({"weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
  const std::string data24(24, '\0');
  for (auto [name, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"st_empty", ""},
           {"st_short", "\x08\0\0"},
           {"st_zero_header", le64(0)},
           {"st_huge_header", le64(std::uint64_t{1} << 40) + "{}"},
           {"st_header_past_end", le64(100) + "{}"},
           {"st_not_json", safetensors("{not json", "")},
           {"st_not_object", safetensors("[1,2]", "")},
           {"st_truncated", safetensors(w_hdr, data24.substr(0, 20))},
           {"st_trailing", safetensors(w_hdr, data24 + "zz")},
           {"st_bad_dtype", safetensors(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", std::string(16, 0))},
           {"st_neg_shape", safetensors(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "a")},
           {"st_overflow_shape",
            safetensors(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
                        std::string(8, 0))},
           {"st_zero_overflow_shape",
            safetensors(R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", "")},
           {"st_size_lie", safetensors(R"({"w":{"dtype":"F32","shape":[7],"data_offsets":[0,24]}})", data24)},
           {"st_offsets_reversed", safetensors(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[5,4]}})", "abcde")},
           {"st_offsets_past_end", safetensors(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[30,34]}})", "abcd")},
           {"st_overlap", safetensors(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                      R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", "abcdef")},
           {"st_gap", safetensors(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", "abcd")},
           {"st_bool", safetensors(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x07")},
           {"st_meta", safetensors(R"({"__metadata__":{"k":1}})", "")},
           {"st_no_offsets", safetensors(R"({"a":{"dtype":"U8","shape":[2]}})", "ab")}}) {
    const std::string p = d.file(name, bytes);
    BAD(m, "load_safetensors", p, nn::load_safetensors(p));
  }
  BAD(m, "load_safetensors", "cannot open", nn::load_safetensors(d.path.string() + "/none.safetensors"));
  BAD(m, "save_safetensors", "tensors", nn::save_safetensors(d.path.string() + "/x", {{"", rnd({1})}}));
  BAD(m, "save_safetensors", "tensors", nn::save_safetensors(d.path.string() + "/x", {{"a", rnd({1})}, {"a", rnd({1})}}));
  BAD(m, "save_safetensors", "tensors", nn::save_safetensors(d.path.string() + "/x", {{"__metadata__", rnd({1})}}));
  BAD(m, "save_safetensors", "tensors", nn::save_safetensors(d.path.string() + "/x", {{"a", Tensor()}}));
  BAD(m, "save_safetensors", "cannot create", nn::save_safetensors(d.path.string() + "/no/dir/x", {{"a", rnd({1})}}));
  const std::string regular = d.file("regular", "x");
  BAD(m, "save_safetensors", "cannot create", nn::save_safetensors(regular + "/x", {{"a", rnd({1})}}));

  // Checkpoint loads into a model (and optimizer): a failure leaves both untouched.
  Generator g(3);
  nn::Linear lin(3, 2, g), other(4, 2, g);
  nn::SGD sgd(lin.named_parameters(), {.lr = 0.1, .momentum = 0.9});
  for (auto& p : lin.parameters()) p.set_grad(ones_like(p));
  sgd.step();
  nn::AdamW adam(lin.named_parameters(), {});
  const std::string ck_other = d.path.string() + "/other.ckpt", ck_noopt = d.path.string() + "/noopt.ckpt";
  nn::save_checkpoint(ck_other, other, nullptr);
  nn::save_checkpoint(ck_noopt, lin, nullptr);
  const std::string ck_sgd = d.path.string() + "/sgd.ckpt";
  nn::save_checkpoint(ck_sgd, lin, &sgd);
  std::vector<Tensor> state;
  for (auto& [n, t] : lin.state_dict()) state.push_back(t);
  for (auto& [n, t] : sgd.state_dict()) state.push_back(t);
  // Perturb the live state so a load that wrote anything would be visible.
  for (auto& t : lin.parameters()) Tensor(t).copy_(rnd(t.shape()));
  Snapshot snap(state);
  BAD(m, "load_checkpoint", "other.ckpt", nn::load_checkpoint(ck_other, lin));
  BAD(m, "load_checkpoint", "holds no optimizer", nn::load_checkpoint(ck_noopt, lin, &sgd));
  BAD(m, "load_checkpoint", "optimizer state is for", nn::load_checkpoint(ck_sgd, lin, &adam));
  // An optimizer state that fails validation after the model part was fine.
  nn::SGD sgd_other(lin.named_parameters(), {.lr = 0.1});
  nn::NamedTensors bad_state;
  for (auto& [n, t] : lin.state_dict()) bad_state.emplace_back("model." + n, add(t.detach().clone(), 1.0));
  bad_state.emplace_back("optim.step", Tensor::scalar<std::int64_t>(-4));
  const std::string ck_bad = d.path.string() + "/bad.ckpt";
  nn::save_safetensors(ck_bad, bad_state, {{"format", "qgrad-checkpoint"}, {"optimizer", sgd.kind()}});
  BAD(m, "load_checkpoint", "step", nn::load_checkpoint(ck_bad, lin, &sgd));
  BAD(m, "load_safetensors", "missing", nn::load_checkpoint(d.path.string() + "/missing.ckpt", lin));
  const std::string ck_stray = d.path.string() + "/stray.ckpt";
  nn::save_safetensors(ck_stray, {{"weight", rnd({2, 3})}});
  BAD(m, "load_checkpoint", "unexpected tensor", nn::load_checkpoint(ck_stray, lin));
  m.run_all("files");
  CHECK(snap.unchanged());
  MESSAGE("bad-input cases so far: ", Matrix::total());
}

TEST_CASE("bad inputs: mixed devices (GPU)") {
  QGRAD_REQUIRE_GPU();
  Matrix m;
  const Tensor a = rnd({2, 3}), ga = rnd({2, 3}).cuda();
  BAD(m, "add", "b", add(a, ga));
  BAD(m, "mul", "b", mul(ga, a));
  BAD(m, "matmul", "b", matmul(ga, rnd({3, 2})));
  BAD(m, "linear", "w", linear(ga, rnd({4, 3})));
  BAD(m, "linear", "bias", linear(ga, rnd({4, 3}).cuda(), rnd({4})));
  BAD(m, "lerp", "b", lerp(a, ga, 0.5));
  BAD(m, "cross_entropy", "labels", cross_entropy(ga, Tensor::from_vector<std::int64_t>({0, 1}, {2})));
  BAD(m, "fake_quantize_per_tensor", "scale", fake_quantize_per_tensor(ga, f32({0.1f}), s32({0}).cuda(), 0, 255));
  BAD(m, "fake_quantize_per_tensor", "zero_point", fake_quantize_per_tensor(ga, f32({0.1f}).cuda(), s32({0}), 0, 255));
  BAD(m, "quantized_linear", "w_q", quantized_linear(ga, rnd({5, 3}, DType::s8), f32({1, 1, 1, 1, 1}).cuda(), Tensor(),
                                                     ActivationQuant::dynamic()));
  m.run_all("mixed devices");
}

TEST_CASE("regression: randint over the whole int64 range stays in range (high - low overflowed)") {
  Generator g(9);
  const std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::int64_t> v = randint(lo, hi, {1000}, g, TensorOptions{}.with_dtype(DType::s64)).to_vector<std::int64_t>();
  int negative = 0;
  for (std::int64_t x : v) {
    CHECK(x < hi);
    negative += x < 0;
  }
  CHECK(negative > 400);
  CHECK(negative < 600);
  // Ordinary ranges are unchanged: values in [low, high).
  for (std::int64_t x : randint(-3, 4, {1000}, g, TensorOptions{}.with_dtype(DType::s64)).to_vector<std::int64_t>()) {
    CHECK(x >= -3);
    CHECK(x < 4);
  }
}
