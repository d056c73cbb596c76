// Fashion-MNIST IDX reader and DataLoader, on small generated files.
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "helpers.h"
#include "test_nn_helpers.h"
#include "qgrad/nn/data.h"

using namespace qgrad;
using namespace qgrad::nn;
using qgrad::testing::error_of;
using qgrad::testing::TempDir;
namespace fs = std::filesystem;

namespace {

void be32(std::vector<unsigned char>& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}

std::vector<unsigned char> images_bytes(std::uint32_t n, std::uint32_t rows, std::uint32_t cols, std::size_t data,
                                        std::uint32_t magic = 0x803) {
  std::vector<unsigned char> b;
  be32(b, magic);
  be32(b, n);
  be32(b, rows);
  be32(b, cols);
  for (std::size_t i = 0; i < data; ++i) b.push_back(static_cast<unsigned char>((i * 37) % 256));
  return b;
}

std::vector<unsigned char> labels_bytes(std::uint32_t n, std::size_t data, std::uint32_t magic = 0x801) {
  std::vector<unsigned char> b;
  be32(b, magic);
  be32(b, n);
  for (std::size_t i = 0; i < data; ++i) b.push_back(static_cast<unsigned char>(i % 10));
  return b;
}

void write_gz(const std::string& path, const std::vector<unsigned char>& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!b.empty()) REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  gzclose(f);
}

// Write a valid 5-image set under the Debian file names.
void write_set(const TempDir& d, const std::string& prefix, std::uint32_t n_img, std::uint32_t n_lab) {
  write_gz(d.file(prefix + "-images-idx3-ubyte.gz"), images_bytes(n_img, 28, 28, std::size_t(n_img) * 784));
  write_gz(d.file(prefix + "-labels-idx1-ubyte.gz"), labels_bytes(n_lab, n_lab));
}

}  // namespace

TEST_CASE("IDX: valid files load, normalized with the Fashion-MNIST mean/std") {
  TempDir d;
  write_set(d, "train", 5, 5);
  Dataset ds = load_fashion_mnist("train", d.path.string());
  CHECK(ds.size() == 5);
  CHECK(ds.images.shape() == Shape{5, 784});
  CHECK(ds.images.dtype() == DType::f32);
  CHECK(ds.labels.dtype() == DType::s64);
  CHECK(ds.labels.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  auto v = ds.images.to_vector<float>();
  for (std::size_t i : {0u, 1u, 100u, 3919u}) {
    const double raw = static_cast<double>((i * 37) % 256) / 255.0;
    CHECK(v[i] == doctest::Approx((raw - 0.2860) / 0.3530).epsilon(1e-6));
  }
  Normalize off;
  off.enabled = false;
  Tensor raw = read_idx_images(d.file("train-images-idx3-ubyte.gz"), off);
  CHECK(raw.to_vector<float>()[1] == 37.0f / 255.0f);
  Normalize custom{true, 0.5, 0.25};
  Tensor c = read_idx_images(d.file("train-images-idx3-ubyte.gz"), custom);
  CHECK(c.to_vector<float>()[0] == doctest::Approx(-2.0));
}

TEST_CASE("IDX errors name the file and the fault") {
  TempDir d;
  const std::string f = d.file("x.gz");
  write_gz(f, images_bytes(2, 28, 28, 2 * 784, 0x802));
  std::string e = error_of([&] { read_idx_images(f); });
  CHECK(e.find("bad magic") != std::string::npos);
  CHECK(e.find(f) != std::string::npos);
  write_gz(f, images_bytes(2, 28, 28, 2 * 784 - 1));
  CHECK(error_of([&] { read_idx_images(f); }).find("truncated") != std::string::npos);
  write_gz(f, images_bytes(100, 28, 28, 5 * 784));  // lying count
  CHECK(error_of([&] { read_idx_images(f); }).find("truncated") != std::string::npos);
  write_gz(f, images_bytes(2, 27, 28, 2 * 27 * 28));  // not 28x28
  CHECK(error_of([&] { read_idx_images(f); }).find("expected 28x28") != std::string::npos);
  CHECK_NOTHROW(read_idx_images(f, {}, 27, 28));
  write_gz(f, images_bytes(0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 10));
  CHECK(error_of([&] { read_idx_images(f, {}, 0, 0); }).find("overflow") != std::string::npos);
  write_gz(f, images_bytes(0, 28, 28, 0));
  CHECK(error_of([&] { read_idx_images(f); }).find("zero") != std::string::npos);
  write_gz(f, images_bytes(1, 28, 28, 784 + 3));
  CHECK(error_of([&] { read_idx_images(f); }).find("unexpected bytes") != std::string::npos);
  write_gz(f, {});
  CHECK(error_of([&] { read_idx_images(f); }).find("empty file") != std::string::npos);
  write_gz(f, {0, 0, 8});
  CHECK(error_of([&] { read_idx_images(f); }).find("truncated") != std::string::npos);
  write_gz(f, {0, 0, 8, 3, 0, 0});
  CHECK(error_of([&] { read_idx_images(f); }).find("truncated header") != std::string::npos);
  CHECK(error_of([&] { read_idx_images(d.file("missing.gz")); }).find("cannot open") != std::string::npos);
  CHECK(error_of([&] { read_idx_images(d.path.string()); }).find("not a regular file") != std::string::npos);
  Normalize bad{true, 0.0, 0.0};
  CHECK_THROWS_AS(read_idx_images(f, bad), qgrad::Error);
  // Labels: bad magic, label out of range.
  write_gz(f, labels_bytes(3, 3, 0x803));
  CHECK(error_of([&] { read_idx_labels(f); }).find("bad magic") != std::string::npos);
  auto lb = labels_bytes(3, 3);
  lb.back() = 10;
  write_gz(f, lb);
  CHECK(error_of([&] { read_idx_labels(f); }).find("not < 10") != std::string::npos);
}

TEST_CASE("IDX: a truncated gzip stream is an error") {
  TempDir d;
  const std::string f = d.file("cut.gz");
  write_gz(f, images_bytes(20, 28, 28, 20 * 784));
  const auto size = fs::file_size(f);
  fs::resize_file(f, size / 2);
  CHECK_THROWS_AS(read_idx_images(f), qgrad::Error);
}

TEST_CASE("load_fashion_mnist: label count must equal image count; split names") {
  TempDir d;
  write_set(d, "t10k", 4, 3);
  std::string e = error_of([&] { load_fashion_mnist("test", d.path.string()); });
  CHECK(e.find("3 labels") != std::string::npos);
  CHECK_THROWS_AS(load_fashion_mnist("validation", d.path.string()), qgrad::Error);
  CHECK_THROWS_AS(load_fashion_mnist("train", d.path.string()), qgrad::Error);  // missing files
}

TEST_CASE("DataLoader: seeded shuffle, same seed same order, epochs differ, drop_last") {
  Dataset ds;
  const std::int64_t n = 23;
  std::vector<float> img(n * 3);
  std::vector<std::int64_t> lab(n);
  for (std::int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 3; ++k) img[i * 3 + k] = static_cast<float>(i * 10 + k);
    lab[i] = i % 10;
  }
  ds.images = Tensor::from_vector(img, {n, 3});
  ds.labels = Tensor::from_vector(lab, {n});
  DataLoader a(ds, 5, true, 42), b(ds, 5, true, 42), c(ds, 5, true, 43);
  CHECK(a.order() == b.order());
  CHECK(a.order() != c.order());
  std::set<std::int64_t> seen(a.order().begin(), a.order().end());
  CHECK(seen.size() == static_cast<std::size_t>(n));
  CHECK(a.num_batches() == 5);
  Batch batch;
  std::int64_t count = 0, batches = 0;
  while (a.next(batch)) {
    auto x = batch.images.to_vector<float>();
    auto y = batch.labels.to_vector<std::int64_t>();
    for (std::int64_t i = 0; i < batch.images.size(0); ++i) {
      const std::int64_t k = a.order()[static_cast<std::size_t>(count + i)];
      CHECK(x[i * 3 + 1] == static_cast<float>(k * 10 + 1));
      CHECK(y[i] == k % 10);
    }
    CHECK(batch.index == batches);
    count += batch.images.size(0);
    ++batches;
  }
  CHECK(count == n);
  CHECK(batches == 5);
  const auto first = a.order();
  a.start_epoch();
  b.start_epoch();
  CHECK(a.order() != first);
  CHECK(a.order() == b.order());
  DataLoader dl(ds, 5, false, 0, true);
  CHECK(dl.num_batches() == 4);
  int k = 0;
  while (dl.next(batch)) ++k;
  CHECK(k == 4);
  CHECK(dl.order()[3] == 3);  // no shuffle
  CHECK_THROWS_AS(DataLoader(ds, 0), qgrad::Error);
}

TEST_CASE("DataLoader batches on CUDA") {
  QGRAD_REQUIRE_GPU();
  Dataset ds;
  ds.images = ones({7, 4});
  ds.labels = zeros({7}, TensorOptions{}.with_dtype(DType::s64));
  DataLoader dl(ds, 3, true, 1, false, Device::cuda(0));
  Batch b;
  REQUIRE(dl.next(b));
  CHECK(b.images.is_cuda());
  CHECK(b.labels.is_cuda());
}

TEST_CASE("The real Debian Fashion-MNIST test split, when installed") {
  if (!fs::exists(std::string(kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz")) {
    std::printf("SKIPPED: dataset-fashion-mnist not installed\n");
    return;
  }
  Dataset ds = load_fashion_mnist("t10k");
  CHECK(ds.size() == 10000);
  CHECK(ds.images.shape() == Shape{10000, 784});
  auto l = ds.labels.to_vector<std::int64_t>();
  std::vector<int> per(10, 0);
  for (auto v : l) ++per[static_cast<std::size_t>(v)];
  for (int c : per) CHECK(c == 1000);
}
