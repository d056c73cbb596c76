// safetensors checkpoints: C++ round trip, corrupt files, atomic writes,
// and a Python round trip through the `safetensors` package.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "helpers.h"
#include "test_nn_helpers.h"
#include "qgrad/nn/checkpoint.h"
#include "qgrad/nn/layers.h"

using namespace qgrad;
using namespace qgrad::nn;
using qgrad::testing::error_of;
using qgrad::testing::TempDir;
using qgrad::testing::bit_equal;
namespace fs = std::filesystem;

namespace {

// The tensors tests/python/roundtrip_safetensors.py expects.
NamedTensors sample() {
  std::vector<float> f32(12);
  for (int i = 0; i < 12; ++i) f32[i] = static_cast<float>(i) * 0.5f - 1.0f;
  return {
      {"f32", Tensor::from_vector(f32, {3, 4})},
      {"f64", Tensor::from_vector<double>({1.5, -2.25, 1e300}, {3})},
      {"f16", Tensor::from_vector<float>({1.0f, -0.5f, 1000.0f}, {3}).to(DType::f16)},
      {"bf16", Tensor::from_vector<float>({1.0f, -2.0f, 0.5f}, {3}).to(DType::bf16)},
      {"i8", Tensor::from_vector<std::int8_t>({-128, 0, 127}, {3})},
      {"u8", Tensor::from_vector<std::uint8_t>({0, 7, 255}, {3})},
      {"i32", Tensor::from_vector<std::int32_t>({INT32_MIN, 5, INT32_MAX}, {3})},
      {"i64", Tensor::from_vector<std::int64_t>({-1, 1LL << 40, -(1LL << 62)}, {3})},
      {"bool", Tensor::from_vector<bool>({true, false, true}, {3})},
      {"scalar", Tensor::scalar<float>(3.25f)},
      {"empty", zeros({0, 4})},
  };
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void spit(const std::string& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}
// A file from a header text and data bytes.
std::string make_file(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  return s + header + data;
}

}  // namespace

TEST_CASE("safetensors: C++ round trip of every dtype, shapes and metadata") {
  TempDir d;
  const std::string p = d.file("a.safetensors");
  auto s = sample();
  save_safetensors(p, s, {{"producer", "qgrad"}, {"note", "x"}});
  const std::string raw = slurp(p);
  std::uint64_t hl = 0;
  std::memcpy(&hl, raw.data(), 8);
  CHECK(hl % 8 == 0);
  CHECK(raw[8] == '{');
  SafetensorsFile f = load_safetensors(p);
  CHECK(f.metadata.at("producer") == "qgrad");
  REQUIRE(f.tensors.size() == s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    CHECK(f.tensors[i].first == s[i].first);
    CHECK(bit_equal(f.tensors[i].second, s[i].second));
  }
  // No temporary files left behind.
  int files = 0;
  for (auto& e : fs::directory_iterator(d.path)) files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("safetensors: an overwrite replaces the file atomically; failures keep the old file") {
  TempDir d;
  const std::string p = d.file("c.safetensors");
  save_safetensors(p, {{"a", ones({2})}});
  save_safetensors(p, {{"b", zeros({3})}});
  auto f = load_safetensors(p);
  REQUIRE(f.tensors.size() == 1);
  CHECK(f.tensors[0].first == "b");
  // Invalid input is rejected before the file system is touched.
  CHECK_THROWS_AS(save_safetensors(p, {{"x", ones({1})}, {"x", ones({1})}}), qgrad::Error);
  CHECK_THROWS_AS(save_safetensors(p, {{"__metadata__", ones({1})}}), qgrad::Error);
  CHECK_THROWS_AS(save_safetensors(p, {{"u", Tensor()}}), qgrad::Error);
  CHECK(load_safetensors(p).tensors[0].first == "b");
  // An unwritable directory: error naming the file; nothing created.
  CHECK(error_of([&] { save_safetensors(d.file("no/such/dir/x.st"), {{"a", ones({1})}}); }).find("x.st") !=
        std::string::npos);
}

TEST_CASE("safetensors: corrupt and truncated files give errors naming the file") {
  TempDir d;
  const std::string p = d.file("bad.safetensors");
  auto expect_error = [&](const std::string& contents, const std::string& fragment) {
    spit(p, contents);
    const std::string e = error_of([&] { load_safetensors(p); });
    CHECK_MESSAGE(e.find(fragment) != std::string::npos, "got: ", e, " wanted: ", fragment);
    CHECK(e.find(p) != std::string::npos);
  };
  expect_error("", "too small");
  expect_error(std::string("\x05\0\0", 3), "too small");
  expect_error(make_file("{}", "").substr(0, 9), "exceeds the file size");
  {
    std::string s(8, '\xff');
    expect_error(s + "{}", "invalid header length");
  }
  expect_error(make_file("{not json", ""), "not valid JSON");
  expect_error(make_file("[1,2]", ""), "not a JSON object");
  const std::string data(8, 'x');
  expect_error(make_file(R"({"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", data), "unsupported dtype");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "non-negative");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data), "out of range");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,0]}})", data), "out of range");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data), "need 12 bytes");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                         data),
               "overlaps");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "gap");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data), "cover 4 of 8");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", data),
               "overflow");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2]}})", data), "data_offsets");
  expect_error(make_file(R"({"__metadata__":{"k":1}})", ""), "not a string");
  expect_error(make_file(R"({"b":{"dtype":"BOOL","shape":[8],"data_offsets":[0,8]}})", data), "BOOL byte");
  // A valid file cut short.
  save_safetensors(p, {{"w", ones({16})}});
  std::string full = slurp(p);
  spit(p, full.substr(0, full.size() - 3));
  CHECK(error_of([&] { load_safetensors(p); }).find("out of range") != std::string::npos);
  CHECK(error_of([&] { load_safetensors(d.file("missing")); }).find("cannot open") != std::string::npos);
}

TEST_CASE("checkpoint: model and optimizer state round trip, training continues identically") {
  TempDir d;
  const std::string p = d.file("ckpt.safetensors");
  Generator g1(1), g2(2);
  Sequential a, b;
  a.emplace_back<Linear>(4, 3, g1);
  b.emplace_back<Linear>(4, 3, g2);
  SGD oa(a.named_parameters(), SGDOptions{0.1, 0.9});
  SGD ob(b.named_parameters(), SGDOptions{0.1, 0.9});
  Generator gg(3);
  for (auto& p2 : a.parameters()) p2.set_grad(randn(p2.shape(), gg));
  oa.step();
  save_checkpoint(p, a, &oa, {{"epoch", "1"}});
  Metadata meta = load_checkpoint(p, b, &ob);
  CHECK(meta.at("epoch") == "1");
  CHECK(meta.at("optimizer") == "SGD");
  for (std::size_t i = 0; i < a.parameters().size(); ++i) CHECK(bit_equal(a.parameters()[i], b.parameters()[i]));
  CHECK(ob.step_count() == 1);
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    Tensor g = randn(a.parameters()[i].shape(), gg);
    a.parameters()[i].set_grad(g);
    b.parameters()[i].set_grad(g);
  }
  oa.step();
  ob.step();
  for (std::size_t i = 0; i < a.parameters().size(); ++i) CHECK(bit_equal(a.parameters()[i], b.parameters()[i]));
  // Mismatches.
  Sequential wrong;
  wrong.emplace_back<Linear>(5, 3, g1);
  CHECK(error_of([&] { load_checkpoint(p, wrong); }).find("shape") != std::string::npos);
  AdamW adam(b.named_parameters(), AdamWOptions{});
  CHECK(error_of([&] { load_checkpoint(p, b, &adam); }).find("not AdamW") != std::string::npos);
  save_checkpoint(p, a);
  CHECK(error_of([&] { load_checkpoint(p, b, &ob); }).find("no optimizer state") != std::string::npos);
  load_checkpoint(p, b);
}

TEST_CASE("safetensors: Python round trip (safetensors package)") {
  TempDir d;
  const std::string in = d.file("from_cpp.safetensors"), out = d.file("from_py.safetensors"),
                    log = d.file("log.txt");
  save_safetensors(in, sample(), {{"producer", "qgrad"}});
  const std::string py = QGRAD_PYTHON_EXE;  // the CMake cache variable QGRAD_PYTHON, the one way
  if (py.empty()) {
    std::printf("SKIPPED: no Python (configure with -DQGRAD_PYTHON=/path/to/python)\n");
    return;
  }
  const std::string script = std::string(QGRAD_SOURCE_DIR) + "/tests/python/roundtrip_safetensors.py";
  const std::string cmd = "'" + py + "' '" + script + "' '" + in + "' '" + out + "' > '" + log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string text = slurp(log);
  if (text.find("SKIPPED:") != std::string::npos) {
    std::printf("SKIPPED: python safetensors not installed\n");
    return;
  }
  INFO("python output: ", text);
  REQUIRE(rc == 0);
  SafetensorsFile f = load_safetensors(out);
  CHECK(f.metadata.at("written_by") == "python");
  std::map<std::string, Tensor> got(f.tensors.begin(), f.tensors.end());
  for (const auto& row : sample()) {
    const auto& n = std::get<0>(row);
    const auto& t = std::get<1>(row);
    if (n == "bf16") {
      CHECK(got.count(n) == 0);
      continue;
    }
    REQUIRE(got.count(n) == 1);
    const Tensor want = is_floating(t.dtype()) ? mul(t, 2.0) : t;
    CHECK_MESSAGE(bit_equal(got[n], want), n);
  }
  REQUIRE(got.count("py_new") == 1);
  CHECK(got["py_new"].to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
}
