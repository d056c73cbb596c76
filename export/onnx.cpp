// export_onnx with the ONNX C++ library (libonnx, protobuf). See export/onnx.h
// and docs/export.md.
#include "qgrad/export/onnx.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <vector>

#include "qgrad/core/error.h"
#include "qgrad/nn/layers.h"
#include "qgrad/nn/qat.h"
#include "qgrad/nn/quant.h"

namespace qgrad {
namespace {

namespace ox = ::onnx;
constexpr const char* kOp = "export_onnx";
const char* const kSupported = "supported: Sequential, FakeQuantize, Linear, QATLinear, QuantizedLinear, ReLU";

// The quantized type of a [qmin, qmax] range and a zero point.
struct QType {
  ox::TensorProto_DataType onnx;
  std::int64_t lo, hi;
};
QType quantized_type(DType dtype, const std::string& where) {
  if (dtype == DType::u8) return {ox::TensorProto_DataType_UINT8, 0, 255};
  if (dtype == DType::s8) return {ox::TensorProto_DataType_INT8, -128, 127};
  throw Error(kOp, where, "only u8 and s8 quantization export, got " + std::string(dtype_name(dtype)));
}

std::vector<float> host_f32(const Tensor& t, const std::string& where, const char* what) {
  QGRAD_CHECK(t.defined() && t.dtype() == DType::f32, kOp, where, what, " must be f32");
  return t.cpu().to_vector<float>();
}
std::vector<std::int32_t> host_s32(const Tensor& t, const std::string& where, const char* what) {
  QGRAD_CHECK(t.defined() && t.dtype() == DType::s32, kOp, where, what, " must be s32");
  return t.cpu().to_vector<std::int32_t>();
}

class GraphBuilder {
 public:
  GraphBuilder(ox::GraphProto* graph, const OnnxExportOptions& options) : g_(graph), opt_(options) {}

  std::string name(const std::string& base) { return base + "_" + std::to_string(counter_++); }

  std::string f32(const std::string& base, const std::vector<float>& v, const std::vector<std::int64_t>& dims) {
    return init(base, ox::TensorProto_DataType_FLOAT, v.data(), v.size() * sizeof(float), dims);
  }
  // Zero points (and s8 weights) in the quantized type; values are range-checked by the caller.
  std::string quantized(const std::string& base, QType t, const std::vector<std::int32_t>& v,
                        const std::vector<std::int64_t>& dims) {
    std::string bytes(v.size(), '\0');
    for (std::size_t i = 0; i < v.size(); ++i)
      bytes[i] = t.onnx == ox::TensorProto_DataType_UINT8 ? static_cast<char>(static_cast<std::uint8_t>(v[i]))
                                                          : static_cast<char>(static_cast<std::int8_t>(v[i]));
    return init(base, t.onnx, bytes.data(), bytes.size(), dims);
  }

  ox::NodeProto* node(const std::string& op, const std::vector<std::string>& inputs, const std::string& output) {
    ox::NodeProto* n = g_->add_node();
    n->set_op_type(op);
    n->set_name(name(op));
    for (const auto& i : inputs) n->add_input(i);
    n->add_output(output);
    return n;
  }
  std::string apply(const std::string& op, const std::vector<std::string>& inputs, const std::string& base) {
    const std::string out = name(base);
    node(op, inputs, out);
    return out;
  }
  static void attr(ox::NodeProto* n, const std::string& key, std::int64_t v) {
    ox::AttributeProto* a = n->add_attribute();
    a->set_name(key);
    a->set_type(ox::AttributeProto_AttributeType_INT);
    a->set_i(v);
  }

  struct Quantized {
    std::string q, scale, zero_point;
    std::int64_t axis;
  };
  // qgrad's quantization of x: clamp(nearbyint(x / s) + zp, qmin, qmax). Per
  // tensor (one scale) or per axis `axis` of a rank-`rank` tensor.
  Quantized quantize(const std::string& x, const std::vector<float>& scale, const std::vector<std::int32_t>& zp,
                         std::int64_t qmin, std::int64_t qmax, QType t, std::int64_t axis, std::int64_t rank,
                         const std::string& where) {
    QGRAD_CHECK(!scale.empty() && scale.size() == zp.size(), kOp, where, "scale and zero point sizes differ");
    QGRAD_CHECK(axis >= 0 || scale.size() == 1, kOp, where, "per-tensor quantization with ", scale.size(),
                " scales");
    QGRAD_CHECK(t.lo <= qmin && qmin < qmax && qmax <= t.hi, kOp, where, "quant range [", qmin, ", ", qmax,
                "] does not fit the quantized type's [", t.lo, ", ", t.hi, "]");
    for (std::size_t c = 0; c < scale.size(); ++c) {
      QGRAD_CHECK(scale[c] > 0 && std::isfinite(scale[c]), kOp, where, "scale ", scale[c], " is not finite > 0");
      QGRAD_CHECK(zp[c] >= qmin && zp[c] <= qmax, kOp, where, "zero point ", zp[c], " outside [", qmin, ", ", qmax,
                  "]");
    }
    const bool per_axis = axis >= 0;
    const std::string base = where.empty() ? std::string("fq") : where;
    std::vector<std::int64_t> qdims;  // scalar per tensor, [C] per axis
    if (per_axis) qdims = {static_cast<std::int64_t>(scale.size())};
    std::string in = x;
    if (opt_.clamp_to_quant_range && (qmin > t.lo || qmax < t.hi)) {
      // QuantizeLinear saturates to the type's range only: clamp the input to
      // the real bounds of [qmin, qmax] first (docs/export.md).
      std::vector<std::int64_t> bdims;  // broadcast along `axis`
      if (per_axis) {
        bdims.assign(static_cast<std::size_t>(rank - axis), 1);
        bdims[0] = static_cast<std::int64_t>(scale.size());
      }
      std::vector<float> lo(scale.size()), hi(scale.size());
      for (std::size_t c = 0; c < scale.size(); ++c) {
        lo[c] = static_cast<float>(qmin - zp[c]) * scale[c];
        hi[c] = static_cast<float>(qmax - zp[c]) * scale[c];
      }
      if (qmin > t.lo) in = apply("Max", {in, f32(base + "_qmin_bound", lo, bdims)}, base + "_clamped_lo");
      if (qmax < t.hi) in = apply("Min", {in, f32(base + "_qmax_bound", hi, bdims)}, base + "_clamped");
    }
    const std::string s = f32(base + "_scale", scale, qdims);
    const std::string z = quantized(base + "_zero_point", t, zp, qdims);
    const std::string q = name(base + "_q");
    ox::NodeProto* qn = node("QuantizeLinear", {in, s, z}, q);
    if (per_axis) attr(qn, "axis", axis);
    return {q, s, z, axis};
  }
  // The same, dequantized: qgrad's fake quantization (a QDQ pair).
  std::string fake_quant(const std::string& x, const std::vector<float>& scale, const std::vector<std::int32_t>& zp,
                         std::int64_t qmin, std::int64_t qmax, QType t, std::int64_t axis, std::int64_t rank,
                         const std::string& where) {
    const Quantized q = quantize(x, scale, zp, qmin, qmax, t, axis, rank, where);
    const std::string dq = name((where.empty() ? std::string("fq") : where) + "_dq");
    ox::NodeProto* dn = node("DequantizeLinear", {q.q, q.scale, q.zero_point}, dq);
    if (q.axis >= 0) attr(dn, "axis", q.axis);
    return dq;
  }

 private:
  std::string init(const std::string& base, ox::TensorProto_DataType type, const void* data, std::size_t bytes,
                   const std::vector<std::int64_t>& dims) {
    ox::TensorProto* t = g_->add_initializer();
    const std::string n = name(base);
    t->set_name(n);
    t->set_data_type(type);
    for (auto d : dims) t->add_dims(d);
    t->set_raw_data(std::string(static_cast<const char*>(data), bytes));
    return n;
  }

  ox::GraphProto* g_;
  const OnnxExportOptions& opt_;
  int counter_ = 0;
};

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

class Exporter {
 public:
  Exporter(ox::GraphProto* graph, const OnnxExportOptions& options) : b_(graph, options) {}

  // Appends `m` applied to x ([batch, features]); returns the output's name.
  std::string module(const nn::Module& m, const std::string& where, const std::string& x) {
    if (auto* seq = dynamic_cast<const nn::Sequential*>(&m)) {
      std::string y = x;
      for (const auto& [n, child] : seq->named_children()) y = module(*child, join(where, n), y);
      return y;
    }
    if (dynamic_cast<const nn::ReLU*>(&m)) return b_.apply("Relu", {x}, where.empty() ? "relu" : where);
    if (auto* fq = dynamic_cast<const nn::FakeQuantize*>(&m)) return fake_quantize(*fq, where, x, 2, true);
    if (auto* lin = dynamic_cast<const nn::Linear*>(&m)) {
      const std::string w = weight_f32(lin->weight(), where);
      return gemm(x, w, lin->bias(), lin->in_features(), lin->out_features(), where);
    }
    if (auto* q = dynamic_cast<const nn::QATLinear*>(&m)) {
      const Tensor& wt = q->weight();
      QGRAD_CHECK(wt.dim() == 2, kOp, where, "weight must be 2-d");
      std::string w = weight_f32(wt, where);
      w = fake_quantize(q->weight_fake_quant(), join(where, "weight_fake_quant"), w, 2, false);
      const std::string y = gemm(x, w, q->bias(), wt.size(1), wt.size(0), where);
      return fake_quantize(q->activation_fake_quant(), join(where, "activation_post_process"), y, 2, true);
    }
    if (auto* q = dynamic_cast<const nn::QuantizedLinear*>(&m)) return quantized_linear(*q, where, x);
    throw Error(kOp, where.empty() ? "model" : where,
                "cannot export module of type " + m.type_name() + " (" + kSupported + ")");
  }

  std::int64_t features = 0;  // of the tensor the last appended module produced

 private:
  // `activation`: x is [batch, features] (else a weight).
  std::string fake_quantize(const nn::FakeQuantize& fq, const std::string& where, const std::string& x,
                            std::int64_t rank, bool activation) {
    if (!fq.fake_quant_enabled()) return x;  // the module is then the identity (its observer does not export)
    const nn::ObserverOptions& o = fq.options();
    const QType t = quantized_type(o.dtype, where);
    std::int64_t axis = -1;
    if (nn::is_per_channel(o.qscheme)) {
      axis = o.ch_axis < 0 ? o.ch_axis + rank : o.ch_axis;
      QGRAD_CHECK(axis >= 0 && axis < rank, kOp, where, "channel axis ", o.ch_axis, " of a rank-", rank, " tensor");
      QGRAD_CHECK(!activation || axis > 0, kOp, where,
                  "per-channel fake quantization of an activation along its batch axis does not export");
    }
    return b_.fake_quant(x, host_f32(fq.scale(), where, "scale"), host_s32(fq.zero_point(), where, "zero_point"),
                         fq.qmin(), fq.qmax(), t, axis, rank, where);
  }

  std::string weight_f32(const Tensor& w, const std::string& where) {
    QGRAD_CHECK(w.defined() && w.dim() == 2, kOp, where, "weight must be 2-d");
    return b_.f32(join(where, "weight"), host_f32(w, where, "weight"), {w.size(0), w.size(1)});
  }

  void check_features(std::int64_t in, const std::string& where) {
    QGRAD_CHECK(features == in, kOp, where, "expects ", in, " input features, the graph has ", features, " there");
  }

  // y = x W^T + b
  std::string gemm(const std::string& x, const std::string& w, const Tensor& bias, std::int64_t in, std::int64_t out,
                   const std::string& where) {
    check_features(in, where);
    std::vector<std::string> inputs{x, w};
    if (bias.defined()) inputs.push_back(b_.f32(join(where, "bias"), host_f32(bias, where, "bias"), {out}));
    const std::string y = b_.name(where.empty() ? "gemm" : where);
    GraphBuilder::attr(b_.node("Gemm", inputs, y), "transB", 1);
    features = out;
    return y;
  }

  // qgrad's QuantizedLinear (nn/qat.h, ops/quantized_linear.h):
  //   a = clamp(nearbyint(x / sa) + za, qmin, qmax); acc = sum_k (a - za) w_q   (exact int32)
  //   y = f32(acc) * (sa * sw[n]) + bias[n]; out = fake_quant(y, output qparams, qmin, qmax)
  std::string quantized_linear(const nn::QuantizedLinear& q, const std::string& where, const std::string& x) {
    QGRAD_CHECK(q.input_scale().numel() == 1, kOp, where, "input_scale must have one element");
    const Tensor& wq = q.weight();
    QGRAD_CHECK(wq.dtype() == DType::s8 && wq.dim() == 2, kOp, where, "weight must be s8 [N, K]");
    const std::int64_t n = wq.size(0), k = wq.size(1);
    check_features(k, where);
    const std::int64_t qmin = q.qmin(), qmax = q.qmax();
    // The activations' type: u8 when [qmin, qmax] fits it (PyTorch's quint8), else s8.
    const QType t = qmin >= 0 && qmax <= 255 ? quantized_type(DType::u8, where) : quantized_type(DType::s8, where);
    const std::vector<float> sa = host_f32(q.input_scale(), where, "input_scale");
    const std::vector<std::int32_t> za = host_s32(q.input_zero_point(), where, "input_zero_point");
    // The quantized input goes to MatMulInteger, which subtracts its zero point.
    const GraphBuilder::Quantized xq = b_.quantize(x, sa, za, qmin, qmax, t, -1, 2, join(where, "input"));
    // s8 weight transposed to [K, N] for MatMul's layout.
    const std::vector<std::int8_t> w = wq.cpu().to_vector<std::int8_t>();
    std::vector<std::int32_t> wt(static_cast<std::size_t>(n * k));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < k; ++j) wt[static_cast<std::size_t>(j * n + i)] = w[static_cast<std::size_t>(i * k + j)];
    const std::string wname = b_.quantized(join(where, "weight_t"), quantized_type(DType::s8, where), wt, {k, n});
    const std::string acc = b_.apply("MatMulInteger", {xq.q, wname, xq.zero_point}, join(where, "acc"));
    const std::string accf = b_.name(join(where, "acc_f32"));
    GraphBuilder::attr(b_.node("Cast", {acc}, accf), "to", ox::TensorProto_DataType_FLOAT);
    const std::vector<float> sw = host_f32(q.weight_scale(), where, "weight_scale");
    QGRAD_CHECK(static_cast<std::int64_t>(sw.size()) == n, kOp, where, "weight_scale must have ", n, " elements");
    std::vector<float> s(sw.size());
    for (std::size_t i = 0; i < sw.size(); ++i) s[i] = sa[0] * sw[i];  // f32, as the qgrad epilogue
    std::string y = b_.apply("Mul", {accf, b_.f32(join(where, "out_scale"), s, {n})}, join(where, "scaled"));
    if (q.bias().defined())
      y = b_.apply("Add", {y, b_.f32(join(where, "bias"), host_f32(q.bias(), where, "bias"), {n})}, join(where, "y"));
    features = n;
    return b_.fake_quant(y, host_f32(q.output_scale(), where, "output_scale"),
                         host_s32(q.output_zero_point(), where, "output_zero_point"), qmin, qmax, t, -1, 2,
                         join(where, "output"));
  }

  GraphBuilder b_;
};

void shape(ox::ValueInfoProto* v, const std::string& name, std::int64_t batch, std::int64_t features,
           bool dynamic) {
  v->set_name(name);
  ox::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(ox::TensorProto_DataType_FLOAT);
  ox::TensorShapeProto* s = t->mutable_shape();
  if (dynamic)
    s->add_dim()->set_dim_param("batch");
  else
    s->add_dim()->set_dim_value(batch);
  s->add_dim()->set_dim_value(features);
}

}  // namespace

void export_onnx(const nn::Module& model, const Tensor& example_input, const std::string& path,
                 const OnnxExportOptions& options) {
  QGRAD_CHECK(options.opset >= 13 && options.opset <= 17, kOp, "options.opset",
              "must be in [13, 17] (per-axis QuantizeLinear needs 13; libonnx 1.12 knows up to 17), got ",
              options.opset);
  QGRAD_CHECK(example_input.defined() && example_input.dtype() == DType::f32 && example_input.dim() == 2, kOp,
              "example_input", "expected f32 [batch, features]");
  QGRAD_CHECK(!path.empty(), kOp, "path", "empty path");
  QGRAD_CHECK(!options.input_name.empty() && !options.output_name.empty() &&
                  options.input_name != options.output_name,
              kOp, "options", "input and output names must be non-empty and differ");
  ox::ModelProto mp;
  mp.set_ir_version(8);  // the IR of opset 17 (ONNX 1.12)
  mp.set_producer_name("qgrad");
  mp.set_producer_version("0.1.0");
  ox::OperatorSetIdProto* ops = mp.add_opset_import();
  ops->set_domain("");
  ops->set_version(options.opset);
  ox::GraphProto* g = mp.mutable_graph();
  g->set_name(options.graph_name);
  Exporter e(g, options);
  e.features = example_input.size(1);
  const std::string y = e.module(model, "", options.input_name);
  // The last node's output gets the graph output's name (Identity when the model is empty of nodes).
  if (g->node_size() > 0 && g->node(g->node_size() - 1).output(0) == y)
    g->mutable_node(g->node_size() - 1)->set_output(0, options.output_name);
  else
  {
    ox::NodeProto* n = g->add_node();
    n->set_op_type("Identity");
    n->set_name("output_identity");
    n->add_input(y);
    n->add_output(options.output_name);
  }
  shape(g->add_input(), options.input_name, example_input.size(0), example_input.size(1), options.dynamic_batch);
  shape(g->add_output(), options.output_name, example_input.size(0), e.features, options.dynamic_batch);
  if (options.check) {
    try {
      ox::checker::check_model(mp);
    } catch (const std::exception& ex) {
      throw Error(kOp, "model", std::string("the ONNX checker rejects the exported graph: ") + ex.what());
    }
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  QGRAD_CHECK(out.good(), kOp, "path", "cannot open '", path, "' for writing");
  QGRAD_CHECK(mp.SerializeToOstream(&out) && out.flush().good(), kOp, "path", "cannot write '", path, "'");
}

bool onnx_export_available() { return true; }

}  // namespace qgrad
