#include "qgrad/nn/data.h"

#include <zlib.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <sys/stat.h>

#include "qgrad/core/random.h"
#include "qgrad/nn/checkpoint.h"

namespace qgrad::nn {

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

[[noreturn]] void fail(const char* op, const std::string& path, const std::string& what) {
  throw Error(op, "path", "'" + path + "': " + what);
}

// Reads the whole (decompressed) file.
std::vector<unsigned char> read_all(const char* op, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(op, path, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(op, path, "not a regular file");
  GzPtr f(gzopen(path.c_str(), "rb"));
  if (!f) fail(op, path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<unsigned char> out;
  unsigned char buf[1 << 16];
  for (;;) {
    const int n = gzread(f.get(), buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(f.get(), &code);
      fail(op, path, std::string("read error: ") + (msg ? msg : "unknown"));
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  int code = 0;
  const char* msg = gzerror(f.get(), &code);
  if (code != Z_OK && code != Z_STREAM_END) fail(op, path, std::string("corrupt gzip stream: ") + msg);
  return out;
}

std::uint32_t be32(const std::vector<unsigned char>& b, std::size_t at) {
  return (std::uint32_t(b[at]) << 24) | (std::uint32_t(b[at + 1]) << 16) | (std::uint32_t(b[at + 2]) << 8) |
         std::uint32_t(b[at + 3]);
}

// Parses the IDX header: magic 0x000008NN (unsigned bytes, NN = dim count).
std::vector<std::int64_t> idx_header(const char* op, const std::string& path, const std::vector<unsigned char>& b,
                                     std::uint32_t magic, std::size_t ndim) {
  if (b.empty()) fail(op, path, "empty file");
  const std::size_t header = 4 + 4 * ndim;
  if (b.size() < 4) fail(op, path, "truncated: no magic number");
  const std::uint32_t m = be32(b, 0);
  if (m != magic) {
    char got[16], want[16];
    std::snprintf(got, sizeof got, "0x%08x", m);
    std::snprintf(want, sizeof want, "0x%08x", magic);
    fail(op, path, std::string("bad magic number ") + got + ", expected " + want);
  }
  if (b.size() < header) fail(op, path, "truncated header");
  std::vector<std::int64_t> dims(ndim);
  std::int64_t total = 1;
  for (std::size_t d = 0; d < ndim; ++d) {
    dims[d] = be32(b, 4 + 4 * d);
    if (dims[d] == 0) fail(op, path, "dimension " + std::to_string(d) + " is zero");
    if (total > INT64_MAX / dims[d]) fail(op, path, "dimensions overflow");
    total *= dims[d];
  }
  const std::uint64_t need = static_cast<std::uint64_t>(total);
  const std::uint64_t have = b.size() - header;
  if (have < need)
    fail(op, path, "truncated: header promises " + std::to_string(need) + " bytes of data, file has " +
                       std::to_string(have));
  if (have > need) fail(op, path, std::to_string(have - need) + " unexpected bytes after the data");
  return dims;
}

}  // namespace

namespace {
void check_norm(const char* op, const Normalize& norm) {
  if (norm.enabled)
    QGRAD_CHECK(std::isfinite(norm.mean) && std::isfinite(norm.std) && norm.std > 0, op, "norm",
                "std must be finite and > 0, got ", norm.std);
}
}  // namespace

Tensor read_idx_images(const std::string& path, const Normalize& norm, std::int64_t expect_rows,
                       std::int64_t expect_cols) {
  check_norm("read_idx_images", norm);
  return parse_idx_images(read_all("read_idx_images", path), path, norm, expect_rows, expect_cols);
}

Tensor parse_idx_images(const std::vector<unsigned char>& bytes, const std::string& path, const Normalize& norm,
                        std::int64_t expect_rows, std::int64_t expect_cols) {
  const char* op = "read_idx_images";
  check_norm(op, norm);
  const auto dims = idx_header(op, path, bytes, 0x00000803u, 3);
  if ((expect_rows > 0 && dims[1] != expect_rows) || (expect_cols > 0 && dims[2] != expect_cols))
    fail(op, path, "images are " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]) + ", expected " +
                       std::to_string(expect_rows) + "x" + std::to_string(expect_cols));
  const std::int64_t n = dims[0], pixels = dims[1] * dims[2];
  Tensor out = Tensor::empty({n, pixels});
  float* o = out.data<float>();
  const unsigned char* src = bytes.data() + 16;
  const float mean = static_cast<float>(norm.mean), inv_std = static_cast<float>(1.0 / norm.std);
  for (std::int64_t i = 0; i < n * pixels; ++i) {
    const float v = static_cast<float>(src[i]) / 255.0f;
    o[i] = norm.enabled ? (v - mean) * inv_std : v;
  }
  return out;
}

Tensor read_idx_labels(const std::string& path, std::int64_t num_classes) {
  return parse_idx_labels(read_all("read_idx_labels", path), path, num_classes);
}

Tensor parse_idx_labels(const std::vector<unsigned char>& bytes, const std::string& path, std::int64_t num_classes) {
  const char* op = "read_idx_labels";
  const auto dims = idx_header(op, path, bytes, 0x00000801u, 1);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(dims[0]));
  for (std::size_t i = 0; i < labels.size(); ++i) {
    labels[i] = bytes[8 + i];
    if (labels[i] >= num_classes)
      fail(op, path, "label " + std::to_string(labels[i]) + " at index " + std::to_string(i) + " is not < " +
                         std::to_string(num_classes));
  }
  return Tensor::from_vector(labels, {dims[0]});
}

Dataset load_fashion_mnist(const std::string& split, const std::string& folder, const Normalize& norm) {
  const char* op = "load_fashion_mnist";
  std::string prefix = split;
  if (prefix == "test") prefix = "t10k";
  QGRAD_CHECK(prefix == "train" || prefix == "t10k", op, "split", "expected 'train' or 't10k', got '", split, "'");
  const std::string images = folder + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels = folder + "/" + prefix + "-labels-idx1-ubyte.gz";
  Dataset d;
  d.images = read_idx_images(images, norm);
  d.labels = read_idx_labels(labels);
  d.rows = 28;
  d.cols = 28;
  QGRAD_CHECK(d.images.size(0) == d.labels.size(0), op, "path", "'", labels, "' has ", d.labels.size(0),
              " labels but '", images, "' has ", d.images.size(0), " images");
  return d;
}

DataLoader::DataLoader(const Dataset& data, std::int64_t batch_size, bool shuffle, std::uint64_t seed,
                       bool drop_last, Device device)
    : data_(data), batch_size_(batch_size), shuffle_(shuffle), drop_last_(drop_last), device_(device), gen_(seed) {
  const char* op = "DataLoader";
  QGRAD_CHECK(batch_size > 0, op, "batch_size", "must be > 0, got ", batch_size);
  QGRAD_CHECK(data.images.defined() && data.labels.defined() && data.images.dim() == 2 &&
                  data.images.size(0) == data.labels.numel() && !data.images.is_cuda() && !data.labels.is_cuda(),
              op, "data", "expected host images [N, D] and labels [N]");
  start_epoch();
}

void DataLoader::start_epoch() {
  const std::int64_t n = data_.size();
  order_.resize(static_cast<std::size_t>(n));
  std::iota(order_.begin(), order_.end(), 0);
  if (shuffle_ && n > 1) {
    const std::uint64_t base = gen_.advance(static_cast<std::uint64_t>(n));
    for (std::int64_t i = n - 1; i > 0; --i) {
      const std::uint64_t r = formulas::random_bits(gen_.seed(), base + static_cast<std::uint64_t>(i));
      const std::int64_t j = static_cast<std::int64_t>(r % static_cast<std::uint64_t>(i + 1));
      std::swap(order_[static_cast<std::size_t>(i)], order_[static_cast<std::size_t>(j)]);
    }
  }
  pos_ = 0;
  batch_index_ = 0;
  ++epoch_;
}

std::int64_t DataLoader::num_batches() const {
  const std::int64_t n = data_.size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

bool DataLoader::next(Batch& batch) {
  const std::int64_t n = data_.size();
  const std::int64_t remaining = n - pos_;
  if (remaining <= 0 || (drop_last_ && remaining < batch_size_)) return false;
  const std::int64_t b = std::min(batch_size_, remaining);
  const std::int64_t d = data_.images.size(1);
  Tensor xi = Tensor::empty({b, d});
  std::vector<std::int64_t> yl(static_cast<std::size_t>(b));
  const float* src = data_.images.data<float>();
  const std::int64_t* lab = data_.labels.data<std::int64_t>();
  float* dst = xi.data<float>();
  for (std::int64_t i = 0; i < b; ++i) {
    const std::int64_t k = order_[static_cast<std::size_t>(pos_ + i)];
    std::memcpy(dst + i * d, src + k * d, static_cast<std::size_t>(d) * sizeof(float));
    yl[static_cast<std::size_t>(i)] = lab[k];
  }
  batch.images = xi.to(device_);
  batch.labels = Tensor::from_vector(yl, {b}, device_);
  batch.index = batch_index_++;
  pos_ += b;
  return true;
}

NamedTensors DataLoader::state_dict() const {
  NamedTensors out;
  out.emplace_back("order", Tensor::from_vector(order_, {static_cast<std::int64_t>(order_.size())}));
  out.emplace_back("position", Tensor::from_vector(std::vector<std::int64_t>{pos_, batch_index_, epoch_}, {3}));
  out.emplace_back("generator", generator_state(gen_));
  return out;
}

void DataLoader::load_state_dict(const NamedTensors& state) {
  const char* op = "DataLoader::load_state_dict";
  const std::int64_t n = data_.size();
  const Tensor *order = nullptr, *position = nullptr, *generator = nullptr;
  for (const auto& [name, t] : state) {
    const Tensor** slot = name == "order" ? &order : name == "position" ? &position : name == "generator" ? &generator : nullptr;
    QGRAD_CHECK(slot != nullptr, op, name, "is not a DataLoader state entry (order, position, generator)");
    QGRAD_CHECK(*slot == nullptr, op, name, "duplicate entry");
    QGRAD_CHECK(t.defined() && !t.is_cuda() && t.dtype() == DType::s64 && t.dim() == 1, op, name,
                "expected a host s64 vector");
    *slot = &t;
  }
  QGRAD_CHECK(order && position && generator, op, "state", "needs order, position and generator");
  QGRAD_CHECK(order->numel() == n, op, "order", "has ", order->numel(), " entries, the data set ", n);
  auto ord = order->to_vector<std::int64_t>();
  std::vector<char> seen(static_cast<std::size_t>(n), 0);
  for (std::int64_t k : ord) {
    QGRAD_CHECK(k >= 0 && k < n && !seen[static_cast<std::size_t>(k)], op, "order", "is not a permutation of 0..",
                n - 1);
    seen[static_cast<std::size_t>(k)] = 1;
  }
  QGRAD_CHECK(position->numel() == 3, op, "position", "expected 3 entries, got ", position->numel());
  const auto pv = position->to_vector<std::int64_t>();
  QGRAD_CHECK(pv[0] >= 0 && pv[0] <= n && pv[1] >= 0 && pv[1] <= num_batches() && pv[2] >= 0, op, "position",
              "out of range: example ", pv[0], ", batch ", pv[1], ", epoch ", pv[2], " (", n, " examples, ",
              num_batches(), " batches)");
  Generator g;
  set_generator_state(g, *generator);
  order_ = std::move(ord);
  pos_ = pv[0];
  batch_index_ = pv[1];
  epoch_ = pv[2];
  gen_ = g;
}

}  // namespace qgrad::nn
