// export_onnx: a qgrad model as an ONNX graph (docs/export.md).
//
// Two forms, chosen by the model's modules:
//   - a QAT model (prepare_qat): every enabled FakeQuantize becomes a
//     QuantizeLinear -> DequantizeLinear pair ("QDQ": per tensor, or per axis
//     for per-channel weights), around float Gemm (Linear, QATLinear) and Relu;
//   - a converted int8 model (convert): each QuantizedLinear becomes
//     QuantizeLinear(input) -> MatMulInteger(u8/s8 x s8 -> int32) -> Cast ->
//     Mul(input scale * weight scale) -> Add(bias) -> QDQ(output), the
//     operations of qgrad's int8 layer in its order (exact int32 sums, the
//     same f32 epilogue).
// Where qgrad's [qmin, qmax] is narrower than the quantized type's range
// (reduce_range, [-127, 127]), a Max/Min pair clamps the float input to the
// range's real bounds before QuantizeLinear, which alone would saturate only
// to the type's range. Opset 17 (default domain), IR version 8.
//
// The exporter is built only when the ONNX C++ library (libonnx-dev) is
// found; otherwise export_onnx throws qgrad::Error ("built without ONNX").
#pragma once

#include <cstdint>
#include <string>

#include "qgrad/nn/module.h"

namespace qgrad {

struct OnnxExportOptions {
  std::int64_t opset = 17;  // 13 (per-axis QuantizeLinear) .. 17 (what libonnx 1.12 knows)
  // Clamp to [qmin, qmax] before QuantizeLinear where that range is narrower
  // than the type's (off: the graph saturates to the type's range only).
  bool clamp_to_quant_range = true;
  bool dynamic_batch = true;  // the first input dimension is symbolic ("batch")
  std::string input_name = "input";
  std::string output_name = "logits";
  std::string graph_name = "qgrad";
  bool check = true;  // run onnx::checker::check_model before writing
};

// Exports `model` (an nn::Sequential of the supported modules: FakeQuantize,
// Linear, QATLinear, QuantizedLinear, ReLU) for inputs shaped like
// `example_input` ([batch, features], f32) to `path`. Every module or
// setting the exporter cannot express is a qgrad::Error naming it.
void export_onnx(const nn::Module& model, const Tensor& example_input, const std::string& path,
                 const OnnxExportOptions& options = {});

// Whether this build has the exporter (the ONNX library was found).
bool onnx_export_available();

}  // namespace qgrad
