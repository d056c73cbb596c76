#include "qgrad/nn/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "qgrad/nn/quant.h"

namespace qgrad::nn {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

constexpr std::uint64_t kMaxHeader = 100u << 20;  // the safetensors library's limit

[[noreturn]] void fail(const char* op, const std::string& path, const std::string& what) {
  throw Error(op, "path", "'" + path + "': " + what);
}

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::s8: return "I8";
    case DType::u8: return "U8";
    case DType::s32: return "I32";
    case DType::s64: return "I64";
    case DType::boolean: return "BOOL";
    case DType::f8e4m3: return "F8_E4M3";
    case DType::f8e5m2: return "F8_E5M2";
    case DType::s4: case DType::u4: return "U8";  // packed bytes; the metadata says so (int4_keys)
  }
  return "?";
}

bool parse_st_dtype(const std::string& s, DType& out) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::s8, DType::u8, DType::s32, DType::s64,
                  DType::boolean, DType::f8e4m3, DType::f8e5m2})
    if (s == st_dtype(t)) {
      out = t;
      return true;
    }
  return false;
}

void write_all(int fd, const char* data, std::size_t n, const char* op, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(op, path, std::string("write failed: ") + std::strerror(errno));
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Unlinks dir/<prefix><pid>.XXXXXX files left by processes that no longer
// exist. Best effort: errors are ignored (the save itself reports its own).
void remove_stale_temps(const std::filesystem::path& dir, const std::string& prefix) {
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const std::size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos || rest.find_first_not_of("0123456789") != dot) continue;
    const long pid = std::strtol(rest.substr(0, dot).c_str(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::unlink(it->path().c_str());
  }
}

// Packed int4 tensors are stored as U8 bytes; three metadata keys per tensor
// say what the bytes are (docs/checkpoint section of nn/checkpoint.h).
struct Int4Keys {
  std::string dtype, shape, packing;
};
Int4Keys int4_keys(const std::string& name) { return {name + ".dtype", name + ".shape", name + ".packing"}; }
constexpr const char* kInt4Packing = "int4x2-low-first";

// The byte shape of a packed tensor: [..., D/2] for an even last dim, else
// the flat [ceil(n/2)].
Shape int4_byte_shape(const Shape& shape, std::int64_t numel) {
  if (!shape.empty() && shape.back() % 2 == 0) {
    Shape b = shape;
    b.back() /= 2;
    return b;
  }
  return {(numel + 1) / 2};
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  const char* op = "save_safetensors";
  // Validate and build the header before touching the file system.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<Tensor> host;
  std::uint64_t offset = 0;
  Metadata meta_all = metadata;
  for (const auto& [name, t] : tensors) {
    QGRAD_CHECK(!name.empty() && name != "__metadata__", op, "tensors", "invalid tensor name '", name, "'");
    QGRAD_CHECK(!header.contains(name), op, "tensors", "duplicate tensor name '", name, "'");
    QGRAD_CHECK(t.defined(), op, "tensors", "tensor '", name, "' is undefined");
    host.push_back(t.detach().cpu());
    const std::uint64_t n = t.nbytes();
    Shape shape = t.shape();
    if (is_packed_int4(t.dtype())) {
      const Int4Keys k = int4_keys(name);
      meta_all[k.dtype] = dtype_name(t.dtype());
      meta_all[k.shape] = nlohmann::json(t.shape()).dump();
      meta_all[k.packing] = kInt4Packing;
      shape = int4_byte_shape(t.shape(), t.numel());
    }
    header[name] = {{"dtype", st_dtype(t.dtype())}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  if (!meta_all.empty()) {  // the metadata first, as before the int4 keys existed
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : meta_all) meta[k] = v;
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    h["__metadata__"] = meta;
    for (auto it = header.begin(); it != header.end(); ++it) h[it.key()] = it.value();
    header = std::move(h);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  char len[8];
  const std::uint64_t hl = text.size();
  std::memcpy(len, &hl, 8);

  namespace fs = std::filesystem;
  const fs::path target(path);
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  // Temporary files are named .<target>.tmp.<pid>.XXXXXX: a process killed
  // while saving leaves one behind, and the next save removes those whose
  // process is gone (never one of a live process, which may be writing it).
  const std::string tmp_prefix = "." + target.filename().string() + ".tmp.";
  remove_stale_temps(dir, tmp_prefix);
  std::string tmpl = (dir / (tmp_prefix + std::to_string(::getpid()) + ".XXXXXX")).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) fail(op, path, std::string("cannot create a temporary file in ") + dir.string() + ": " + std::strerror(errno));
  try {
    write_all(fd, len, 8, op, path);
    write_all(fd, text.data(), text.size(), op, path);
    for (const Tensor& t : host) write_all(fd, static_cast<const char*>(t.data_ptr()), t.nbytes(), op, path);
    if (::fsync(fd) != 0) fail(op, path, std::string("fsync failed: ") + std::strerror(errno));
    if (::close(fd) != 0) fail(op, path, std::string("close failed: ") + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmpl.c_str());
    throw;
  }
  ::chmod(tmpl.c_str(), 0644);
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmpl.c_str());
    fail(op, path, std::string("rename failed: ") + std::strerror(err));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

SafetensorsFile load_safetensors(const std::string& path) {
  const char* op = "load_safetensors";
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(op, path, std::string("cannot open: ") + std::strerror(errno));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_safetensors(bytes.data(), bytes.size(), path);
}

SafetensorsFile parse_safetensors(const char* bytes, std::size_t size, const std::string& path) {
  const char* op = "load_safetensors";
  if (size < 8) fail(op, path, "file too small (" + std::to_string(size) + " bytes) for the header length");
  std::uint64_t hl = 0;
  std::memcpy(&hl, bytes, 8);
  if (hl == 0 || hl > kMaxHeader) fail(op, path, "invalid header length " + std::to_string(hl));
  if (hl > size - 8)
    fail(op, path, "header length " + std::to_string(hl) + " exceeds the file size " + std::to_string(size));
  const char* hb = bytes + 8;
  nlohmann::json header = nlohmann::json::parse(hb, hb + hl, nullptr, false);
  if (header.is_discarded()) fail(op, path, "header is not valid JSON");
  if (!header.is_object()) fail(op, path, "header is not a JSON object");
  const std::uint64_t data_size = size - 8 - hl;
  const char* data = hb + hl;

  SafetensorsFile out;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(op, path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(op, path, "__metadata__ value of '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!v.is_object()) fail(op, path, where + "entry is not an object");
    Entry e{name, DType::f32, {}, 0, 0};
    if (!v.contains("dtype") || !v["dtype"].is_string() || !parse_st_dtype(v["dtype"].get<std::string>(), e.dtype))
      fail(op, path, where + "missing or unsupported dtype");
    if (!v.contains("shape") || !v["shape"].is_array()) fail(op, path, where + "missing shape");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
        fail(op, path, where + "shape entries must be non-negative integers");
      e.shape.push_back(d.get<std::int64_t>());
    }
    const auto& off = v.contains("data_offsets") ? v["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(op, path, where + "data_offsets must be two non-negative integers");
    e.begin = off[0].get<std::uint64_t>();
    e.end = off[1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      fail(op, path, where + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                         "] out of range (data has " + std::to_string(data_size) + " bytes)");
    // The non-zero dims' product must fit int64 (as Tensor shapes require),
    // also when a zero dim makes the element count 0.
    std::uint64_t numel = 1, nonzero = 1;
    for (std::int64_t d : e.shape) {
      const auto ud = static_cast<std::uint64_t>(d);
      if (ud != 0 && nonzero > static_cast<std::uint64_t>(INT64_MAX) / ud) fail(op, path, where + "shape overflows");
      nonzero *= ud != 0 ? ud : 1;
      numel *= ud;
    }
    const std::uint64_t es = dtype_size(e.dtype);
    if (numel > UINT64_MAX / es || numel > static_cast<std::uint64_t>(INT64_MAX)) fail(op, path, where + "size overflows");
    if (numel * es != e.end - e.begin)
      fail(op, path, where + "dtype " + st_dtype(e.dtype) + " and shape " + shape_str(e.shape) + " need " +
                         std::to_string(numel * es) + " bytes, data_offsets give " + std::to_string(e.end - e.begin));
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t pos = 0;
  for (const Entry& e : entries) {
    if (e.begin != pos)
      fail(op, path, "tensor '" + e.name + "' " + (e.begin < pos ? "overlaps the previous tensor" : "leaves a gap") +
                         " (starts at " + std::to_string(e.begin) + ", expected " + std::to_string(pos) + ")");
    pos = e.end;
  }
  if (pos != data_size)
    fail(op, path, "tensors cover " + std::to_string(pos) + " of " + std::to_string(data_size) + " data bytes");
  for (Entry& e : entries) {
    // A U8 tensor the metadata marks as packed int4 becomes s4 / u4 of the
    // recorded shape (its byte count checked against ceil(numel / 2)).
    const Int4Keys keys = int4_keys(e.name);
    const auto kd = out.metadata.find(keys.dtype);
    if (kd != out.metadata.end() && (kd->second == "s4" || kd->second == "u4")) {
      const std::string where = "tensor '" + e.name + "': ";
      const auto ks = out.metadata.find(keys.shape), kp = out.metadata.find(keys.packing);
      if (e.dtype != DType::u8) fail(op, path, where + "packed int4 must be stored as U8");
      if (kp == out.metadata.end() || kp->second != kInt4Packing)
        fail(op, path, where + "unknown int4 packing (expected " + kInt4Packing + ")");
      if (ks == out.metadata.end()) fail(op, path, where + "packed int4 without its shape (" + keys.shape + ")");
      const nlohmann::json js = nlohmann::json::parse(ks->second, nullptr, false);
      Shape shape;
      bool ok = js.is_array();
      if (ok)
        for (const auto& d : js) {
          if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (std::uint64_t{1} << 62)) {
            ok = false;
            break;
          }
          shape.push_back(d.get<std::int64_t>());
        }
      // As for any shape: the product of the non-zero dims must fit (here
      // 2^62), also when a zero dim makes the count 0.
      std::uint64_t numel = 1, nonzero = 1;
      for (std::int64_t d : shape) {
        const auto ud = static_cast<std::uint64_t>(d);
        if (ok && ud != 0 && nonzero > (std::uint64_t{1} << 62) / ud) ok = false;
        if (ud != 0) nonzero *= ud;
        numel *= ud;
      }
      if (!ok) fail(op, path, where + "invalid int4 shape '" + ks->second + "'");
      if ((numel + 1) / 2 != e.end - e.begin)
        fail(op, path, where + "int4 shape " + shape_str(shape) + " needs " + std::to_string((numel + 1) / 2) +
                           " bytes, the tensor has " + std::to_string(e.end - e.begin));
      e.shape = shape;
      e.dtype = kd->second == "s4" ? DType::s4 : DType::u4;
    }
    Tensor t = Tensor::empty(e.shape, TensorOptions{}.with_dtype(e.dtype));
    if (e.dtype == DType::boolean)
      for (std::uint64_t k = e.begin; k < e.end; ++k)
        if (static_cast<unsigned char>(data[k]) > 1) fail(op, path, "tensor '" + e.name + "': BOOL byte is not 0 or 1");
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data + e.begin, e.end - e.begin);
    out.tensors.emplace_back(e.name, t);
  }
  return out;
}

void save_checkpoint(const std::string& path, const Module& model, const Optimizer* optimizer,
                     const Metadata& metadata) {
  NamedTensors all;
  for (const auto& [n, t] : model.state_dict()) all.emplace_back("model." + n, t);
  Metadata meta = metadata;
  meta["format"] = "qgrad-checkpoint";
  if (optimizer) {
    for (const auto& [n, t] : optimizer->state_dict()) all.emplace_back("optim." + n, t);
    meta["optimizer"] = optimizer->kind();
  }
  save_safetensors(path, all, meta);
}

Metadata load_checkpoint(const std::string& path, Module& model, Optimizer* optimizer) {
  const char* op = "load_checkpoint";
  SafetensorsFile f = load_safetensors(path);
  NamedTensors m, o;
  for (auto& [n, t] : f.tensors) {
    if (n.rfind("model.", 0) == 0) m.emplace_back(n.substr(6), t);
    else if (n.rfind("optim.", 0) == 0) o.emplace_back(n.substr(6), t);
    else fail(op, path, "unexpected tensor '" + n + "' (expected model.* or optim.*)");
  }
  if (optimizer) {
    auto it = f.metadata.find("optimizer");
    if (o.empty() || it == f.metadata.end()) fail(op, path, "holds no optimizer state");
    if (it->second != optimizer->kind())
      fail(op, path, "optimizer state is for " + it->second + ", not " + optimizer->kind());
  }
  // The model's load validates before writing; the optimizer's is checked
  // after it, so keep a copy of the model's state to restore if it fails:
  // a failed load leaves both untouched.
  NamedTensors backup;
  if (optimizer)
    for (const auto& [n, t] : model.state_dict()) backup.emplace_back(n, t.detach().clone());
  try {
    model.load_state_dict(m);
  } catch (const Error& e) {
    fail(op, path, e.what());
  }
  try {
    if (optimizer) optimizer->load_state_dict(o);
  } catch (const Error& e) {
    model.load_state_dict(backup);
    fail(op, path, e.what());
  }
  return f.metadata;
}

Tensor generator_state(const Generator& gen) {
  return Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(gen.seed()),
                                                       static_cast<std::int64_t>(gen.offset())},
                             {2});
}

void set_generator_state(Generator& gen, const Tensor& state) {
  const char* op = "set_generator_state";
  QGRAD_CHECK(state.defined() && !state.is_cuda() && state.dtype() == DType::s64 && state.shape() == Shape{2}, op,
              "state", "expected a host s64 [2] tensor (seed, offset)");
  const auto v = state.to_vector<std::int64_t>();
  gen.set_state(static_cast<std::uint64_t>(v[0]), static_cast<std::uint64_t>(v[1]));
}

void save_train_state(const std::string& path, const Module& model, const Optimizer* optimizer,
                      const NamedGenerators& generators, const NamedTensors& extra, const std::string& state_json) {
  const char* op = "save_train_state";
  NamedTensors all;
  for (const auto& [n, t] : model.state_dict()) all.emplace_back("model." + n, t);
  for (const auto& [n, t] : quant_flags(model)) all.emplace_back("quant." + n, t);
  if (optimizer)
    for (const auto& [n, t] : optimizer->state_dict()) all.emplace_back("optim." + n, t);
  for (const auto& [n, g] : generators) {
    QGRAD_CHECK(g != nullptr, op, "generators", "generator '", n, "' is null");
    all.emplace_back("rng." + n, generator_state(*g));
  }
  for (const auto& [n, t] : extra) all.emplace_back("extra." + n, t);
  Metadata meta{{"format", "qgrad-train-state"},
                {"optimizer", optimizer ? optimizer->kind() : "none"},
                {"state", state_json}};
  save_safetensors(path, all, meta);  // validates names (unique, non-empty) before writing
}

TrainStateFile read_train_state(const std::string& path) {
  const char* op = "read_train_state";
  TrainStateFile out{path, {}, load_safetensors(path)};
  const auto& meta = out.file.metadata;
  auto format = meta.find("format");
  if (format == meta.end() || format->second != "qgrad-train-state")
    fail(op, path, "is not a training state (metadata format is not \"qgrad-train-state\")");
  auto state = meta.find("state");
  if (state == meta.end()) fail(op, path, "has no \"state\" metadata");
  if (meta.find("optimizer") == meta.end()) fail(op, path, "has no \"optimizer\" metadata");
  out.state_json = state->second;
  for (const auto& [n, t] : out.file.tensors) {
    bool known = false;
    for (const char* prefix : {"model.", "quant.", "optim.", "rng.", "extra."})
      known = known || n.rfind(prefix, 0) == 0;
    if (!known) fail(op, path, "unexpected tensor '" + n + "' (expected model.*, quant.*, optim.*, rng.* or extra.*)");
  }
  return out;
}

NamedTensors restore_train_state(const TrainStateFile& state, Module& model, Optimizer* optimizer,
                                 const NamedGenerators& generators) {
  const char* op = "restore_train_state";
  const std::string& path = state.path;
  NamedTensors m, q, o, extra;
  std::map<std::string, Tensor> rng;
  for (const auto& [n, t] : state.file.tensors) {
    const auto dot = n.find('.');
    const std::string group = n.substr(0, dot), rest = n.substr(dot + 1);
    if (group == "model") m.emplace_back(rest, t);
    else if (group == "quant") q.emplace_back(rest, t);
    else if (group == "optim") o.emplace_back(rest, t);
    else if (group == "rng") rng.emplace(rest, t);
    else extra.emplace_back(rest, t);
  }
  const std::string kind = state.file.metadata.at("optimizer");
  if (optimizer && kind != optimizer->kind())
    fail(op, path, "optimizer state is for " + kind + ", not " + optimizer->kind());
  if (!optimizer && (kind != "none" || !o.empty())) fail(op, path, "holds optimizer state but no optimizer was given");
  for (const auto& [n, g] : generators) {
    auto it = rng.find(n);
    if (it == rng.end()) fail(op, path, "holds no state of generator '" + n + "'");
    try {
      Generator probe;
      set_generator_state(probe, it->second);
    } catch (const Error& e) {
      fail(op, path, "generator '" + n + "': " + e.what());
    }
  }
  if (rng.size() != generators.size())
    fail(op, path, "holds " + std::to_string(rng.size()) + " generator states, " +
                       std::to_string(generators.size()) + " generators were given");
  NamedTensors backup;
  for (const auto& [n, t] : model.state_dict()) backup.emplace_back(n, t.detach().clone());
  const NamedTensors flags_backup = quant_flags(model);
  try {
    model.load_state_dict(m);
  } catch (const Error& e) {
    fail(op, path, e.what());
  }
  try {
    load_quant_flags(model, q);
    if (optimizer) optimizer->load_state_dict(o);
  } catch (const Error& e) {
    model.load_state_dict(backup);
    load_quant_flags(model, flags_backup);
    fail(op, path, e.what());
  }
  for (const auto& [n, g] : generators) set_generator_state(*g, rng.at(n));
  return extra;
}

}  // namespace qgrad::nn
