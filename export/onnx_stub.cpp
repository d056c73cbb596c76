// export_onnx in a build without the ONNX C++ library (see export/onnx.h).
#include "qgrad/core/error.h"
#include "qgrad/export/onnx.h"

namespace qgrad {

void export_onnx(const nn::Module&, const Tensor&, const std::string& path, const OnnxExportOptions&) {
  throw Error("export_onnx", "", "qgrad was built without ONNX (install libonnx-dev and libprotobuf-dev and "
                                 "reconfigure); cannot write '" + path + "'");
}

bool onnx_export_available() { return false; }

}  // namespace qgrad
