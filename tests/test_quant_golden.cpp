// Parity with PyTorch 2.11: golden inputs, outputs and gradients generated
// by tests/python/gen_golden.py (CPU tensors), compared bit for bit on the
// CPU and, with a GPU present, on CUDA. Reductions whose order PyTorch does
// not fix (LSQ scale/zero-point sums over many elements, broadcast-reduced
// lerp gradients) are compared to a relative tolerance instead.
#include <fstream>
#include <sstream>

#include "golden.h"
#include "test_quant_ref.h"

using namespace qgrad;
using namespace qgrad::testing;
using json = nlohmann::json;

namespace {

const char* kGoldenPath = QGRAD_SOURCE_DIR "/tests/data/golden_quant.json";

#define REQUIRE_GOLDEN(doc) QGRAD_REQUIRE_GOLDEN(doc, kGoldenPath, "gen_golden.py")

Shape shape_of(const json& j) { return golden_shape(j); }

// A floating tensor from hex bit patterns of dtype dt.
Tensor from_hex(const json& arr, const Shape& shape, DType dt, Device dev) {
  const std::size_t w = dtype_size(dt);
  std::vector<unsigned char> bytes(arr.size() * w);
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const std::uint64_t bits = std::stoull(arr[i].get<std::string>(), nullptr, 16);
    std::memcpy(bytes.data() + i * w, &bits, w);  // little endian: low bytes first
  }
  Tensor host = Tensor::empty(shape, TensorOptions{}.with_dtype(dt));
  std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
  return host.to(dev);
}

Tensor from_ints(const json& arr, const Shape& shape, DType dt, Device dev) {
  std::vector<double> v;
  for (const auto& e : arr) v.push_back(static_cast<double>(e.get<std::int64_t>()));
  return Tensor::from_vector(v, shape).to(dt).to(dev);
}

double fhex(const json& j) { return std::strtod(j.get<std::string>().c_str(), nullptr); }

Tensor leaf(const Tensor& t) {
  Tensor l = t.detach().clone();
  l.set_requires_grad(true);
  return l;
}

// Bitwise comparison with a golden array; names the first mismatch.
void check_bits(const Tensor& got, const json& want, const std::string& what) {
  Tensor ref = from_hex(want, got.shape(), got.dtype(), Device::cpu());
  if (bit_equal(got, ref)) {
    CHECK(true);
    return;
  }
  const auto g = values(got), r = values(ref);
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (g[i] == r[i] || (std::isnan(g[i]) && std::isnan(r[i]))) continue;
    FAIL_CHECK(what << ": element " << i << " got " << g[i] << " want " << r[i]);
    return;
  }
  FAIL_CHECK(what << ": bits differ (signed zero or NaN payload)");
}

void check_close(const Tensor& got, const json& want, double rtol, const std::string& what) {
  const auto g = values(got), r = values(from_hex(want, got.shape(), got.dtype(), Device::cpu()));
  for (std::size_t i = 0; i < g.size(); ++i)
    if (std::fabs(g[i] - r[i]) > rtol * std::max(1.0, std::fabs(r[i]))) {
      FAIL_CHECK(what << ": element " << i << " got " << g[i] << " want " << r[i]);
      return;
    }
  CHECK(true);
}

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu()};
  if (has_gpu()) d.push_back(Device::cuda());
  return d;
}

std::string label(const json& c, Device dev) {
  return c["op"].get<std::string>() + "/" + c["name"].get<std::string>() + "/" + c["dtype"].get<std::string>() + " on " +
         dev.str();
}

template <class F>
void for_cases(const json& doc, const std::string& op_prefix, F&& f) {
  int n = 0;
  for (const auto& c : doc["cases"])
    if (c["op"].get<std::string>().rfind(op_prefix, 0) == 0)
      for (Device dev : devices()) {
        INFO(label(c, dev));
        f(c, dev);
        ++n;
      }
  MESSAGE(n, " golden cases for ", op_prefix);
}

}  // namespace

TEST_CASE("golden: fake_quantize_per_tensor (host scalars and tensor qparams)") {
  REQUIRE_GOLDEN(doc);
  for_cases(doc, "fake_quantize_per_tensor", [](const json& c, Device dev) {
    const DType dt = dtype_from_name(c["dtype"]);
    Tensor x = leaf(from_hex(c["x"], shape_of(c["shape"]), dt, dev));
    const double s = fhex(c["scale"]);
    const std::int64_t zp = c["zero_point"], qmin = c["qmin"], qmax = c["qmax"];
    if (c["op"] == "fake_quantize_per_tensor_tensor_qparams") {
      Tensor st = full({1}, s, TensorOptions{}.with_device(dev));
      Tensor zt = full({1}, static_cast<double>(zp), TensorOptions{}.with_dtype(DType::s32).with_device(dev));
      check_bits(fake_quantize_per_tensor(x, st, zt, qmin, qmax), c["y"], "y");
      return;
    }
    Tensor y = fake_quantize_per_tensor(x, s, zp, qmin, qmax);
    y.backward(from_hex(c["dy"], x.shape(), dt, dev));
    check_bits(y, c["y"], "y");
    check_bits(x.grad(), c["dx"], "dx");
  });
}

TEST_CASE("golden: fake_quantize_per_channel") {
  REQUIRE_GOLDEN(doc);
  for_cases(doc, "fake_quantize_per_channel", [](const json& c, Device dev) {
    const DType dt = dtype_from_name(c["dtype"]);
    const Shape shape = shape_of(c["shape"]);
    const std::int64_t axis = c["axis"];
    const Shape cs{shape[static_cast<std::size_t>(axis)]};
    Tensor x = leaf(from_hex(c["x"], shape, dt, dev));
    Tensor s = from_hex(c["scale_t"], cs, DType::f32, dev);
    Tensor z = from_ints(c["zero_point_t"], cs, DType::s32, dev);
    Tensor y = fake_quantize_per_channel(x, s, z, axis, c["qmin"], c["qmax"]);
    y.backward(from_hex(c["dy"], shape, dt, dev));
    check_bits(y, c["y"], "y");
    check_bits(x.grad(), c["dx"], "dx");
    // a negative axis names the same channel axis
    check_bits(fake_quantize_per_channel(x, s, z, axis - static_cast<std::int64_t>(shape.size()), c["qmin"], c["qmax"]),
               c["y"], "y (negative axis)");
  });
}

TEST_CASE("golden: learnable fake quantize (LSQ)") {
  REQUIRE_GOLDEN(doc);
  for_cases(doc, "fake_quantize_learnable", [](const json& c, Device dev) {
    const DType dt = dtype_from_name(c["dtype"]);
    const Shape shape = shape_of(c["shape"]);
    const bool per_tensor = c["op"] == "fake_quantize_learnable_per_tensor";
    const std::int64_t axis = c["axis"];
    const Shape cs{per_tensor ? 1 : shape[static_cast<std::size_t>(axis)]};
    Tensor x = leaf(from_hex(c["x"], shape, dt, dev));
    Tensor s = leaf(from_hex(c["scale_t"], cs, DType::f32, dev));
    Tensor z = leaf(from_hex(c["zero_point_t"], cs, DType::f32, dev));
    const double gf = fhex(c["grad_factor"]);
    Tensor y = per_tensor ? fake_quantize_learnable_per_tensor(x, s, z, c["qmin"], c["qmax"], gf)
                          : fake_quantize_learnable_per_channel(x, s, z, axis, c["qmin"], c["qmax"], gf);
    y.backward(from_hex(c["dy"], shape, dt, dev));
    check_bits(y, c["y"], "y");
    check_bits(x.grad(), c["dx"], "dx");
    if (c["sum_exact"].get<bool>()) {
      check_bits(s.grad(), c["dscale"], "dscale");
      check_bits(z.grad(), c["dzero_point"], "dzero_point");
    } else {
      check_close(s.grad(), c["dscale"], 1e-4, "dscale");
      check_close(z.grad(), c["dzero_point"], 1e-4, "dzero_point");
    }
  });
}

TEST_CASE("golden: quantize / dequantize per tensor, with the documented gradients") {
  REQUIRE_GOLDEN(doc);
  for_cases(doc, "quantize_per_tensor", [](const json& c, Device dev) {
    const DType qt = dtype_from_name(c["qdtype"]);
    const Shape shape = shape_of(c["shape"]);
    Tensor x = leaf(from_hex(c["x"], shape, DType::f32, dev));
    const double s = fhex(c["scale"]);
    const std::int64_t zp = c["zero_point"];
    Tensor q = quantize_per_tensor(x, s, zp, qt);
    CHECK(bit_equal(q, from_ints(c["q"], shape, qt, Device::cpu())));
    Tensor y = dequantize_per_tensor(q, s, zp, DType::f32);
    check_bits(y, c["y"], "y");
    Tensor dy = from_hex(c["dy"], shape, DType::f32, dev);
    check_bits(y.grad_fn()->backward(dy)[0], c["dq"], "dq");
    y.backward(dy);
    check_bits(x.grad(), c["dx"], "dx");
  });
}

TEST_CASE("golden: quantize / dequantize per channel, per token, per group") {
  REQUIRE_GOLDEN(doc);
  for (const char* kind : {"quantize_per_channel", "quantize_per_token", "quantize_per_group"}) {
    for_cases(doc, kind, [kind](const json& c, Device dev) {
      const DType qt = dtype_from_name(c["qdtype"]);
      const Shape shape = shape_of(c["shape"]);
      const std::int64_t axis = c["axis"], group = c["group_size"];
      Tensor x = from_hex(c["x"], shape, DType::f32, dev);
      const std::string k = kind;
      Shape ps;
      if (k == "quantize_per_channel") ps = {shape[static_cast<std::size_t>(axis)]};
      else if (k == "quantize_per_token") ps = {shape[0]};
      else {
        ps = shape;
        ps.back() /= group;
      }
      Tensor s = from_hex(c["scale_t"], ps, DType::f32, dev);
      Tensor z = from_ints(c["zero_point_t"], ps, DType::s32, dev);
      Tensor q, y;
      if (k == "quantize_per_channel") {
        q = quantize_per_channel(x, s, z, axis, qt);
        y = dequantize_per_channel(q, s, z, axis, DType::f32);
      } else if (k == "quantize_per_token") {
        q = quantize_per_token(x, s, z, qt);
        y = dequantize_per_token(q, s, z, DType::f32);
      } else {
        q = quantize_per_group(x, s, z, group, qt);
        y = dequantize_per_group(q, s, z, group, DType::f32);
      }
      CHECK(bit_equal(q, from_ints(c["q"], shape, qt, Device::cpu())));
      check_bits(y, c["y"], "y");
    });
  }
}

TEST_CASE("golden: lerp forward and gradients") {
  REQUIRE_GOLDEN(doc);
  for_cases(doc, "lerp", [](const json& c, Device dev) {
    const DType dt = dtype_from_name(c["dtype"]);
    Tensor a = leaf(from_hex(c["a"], shape_of(c["shape_a"]), dt, dev));
    Tensor b = leaf(from_hex(c["b"], shape_of(c["shape_b"]), dt, dev));
    Tensor w;
    Tensor y;
    if (c.contains("weight_t")) {
      w = leaf(from_hex(c["weight_t"], shape_of(c["shape_w"]), dt, dev));
      y = lerp(a, b, w);
    } else {
      y = lerp(a, b, fhex(c["weight"]));
    }
    check_bits(y, c["y"], "y");
    y.backward(from_hex(c["dy"], y.shape(), dt, dev));
    const bool tol = c["grad_tol"].get<bool>();
    const double rtol = (dt == DType::f16 || dt == DType::bf16) ? 1e-2 : 1e-6;
    auto cmp = [&](const Tensor& g, const char* key) {
      if (tol) check_close(g, c[key], rtol, key);
      else check_bits(g, c[key], key);
    };
    cmp(a.grad(), "da");
    cmp(b.grad(), "db");
    if (w.defined()) cmp(w.grad(), "dw");
  });
}

TEST_CASE("golden: the data names its PyTorch version and what PyTorch does not support") {
  REQUIRE_GOLDEN(doc);
  MESSAGE("torch ", doc["torch_version"].get<std::string>());
  CHECK(doc["torch_version"].get<std::string>().rfind("2.11", 0) == 0);
  for (const auto& u : doc["unsupported"]) MESSAGE("unsupported by PyTorch: ", u.dump());
}
