// export_onnx (export/onnx.h): the exported QAT (QDQ) and int8 graphs run in
// onnxruntime (tests/python/onnx_run.py) as the qgrad models do; what does
// not export is an error naming the module.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "helpers.h"
#include "test_nn_helpers.h"
#include "qgrad/qgrad.h"

using namespace qgrad;
using namespace qgrad::nn;
using qgrad::testing::error_of;
using qgrad::testing::TempDir;

namespace {

void write_f32(const std::string& path, const Tensor& t) {
  const auto v = t.cpu().to_vector<float>();
  std::ofstream o(path, std::ios::binary);
  o.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
}

// Runs tests/python/onnx_run.py; returns its exit code (77: skipped), its output in `log`.
int onnx_run(const TempDir& d, const std::string& model, const Tensor& x, const Tensor& expected, double step,
             const std::string& extra, std::string& log) {
  write_f32(d.file("x.bin"), x);
  write_f32(d.file("expected.bin"), expected);
  const char* py = QGRAD_PYTHON_EXE;
  std::ostringstream cmd;
  cmd << (py && *py ? py : "python3") << " '" << QGRAD_SOURCE_DIR << "/tests/python/onnx_run.py' '" << model
      << "' '" << d.file("x.bin") << "' " << x.size(0) << ' ' << x.size(1) << " '" << d.file("expected.bin")
      << "' --step " << step << ' ' << extra << " > '" << d.file("log.txt") << "' 2>&1";
  const int rc = std::system(cmd.str().c_str());
  std::ifstream in(d.file("log.txt"));
  log.assign(std::istreambuf_iterator<char>(in), {});
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// A small MLP, prepared for QAT and observed on N(0, 1) inputs; observers then off.
std::shared_ptr<Sequential> qat_mlp(Generator& gen) {
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Linear>(12, 32, gen);
  m->emplace_back<ReLU>();
  m->emplace_back<Linear>(32, 5, gen);
  prepare_qat(*m);
  NoGradGuard no_grad;
  for (int i = 0; i < 4; ++i) (*m)(randn({64, 12}, gen));
  enable_observer(*m, false);
  m->eval();
  return m;
}

float output_step(const Sequential& qat) {
  const auto& last = dynamic_cast<const QATLinear&>(*qat[qat.size() - 1]);
  return last.activation_fake_quant().scale().to_vector<float>()[0];
}

}  // namespace

TEST_CASE("export_onnx: QAT (QDQ) and int8 graphs agree with qgrad in onnxruntime") {
  if (!onnx_export_available()) {
    std::printf("SKIPPED: qgrad was built without ONNX\n");
    return;
  }
  Generator gen(11);
  auto qat = qat_mlp(gen);
  auto int8 = convert(*qat);
  // Inputs twice as wide as the observed ones: many fall outside the input
  // and output quant ranges, whose reduce_range upper bound (127 of u8's 255)
  // the graph must clamp to.
  NoGradGuard no_grad;
  const Tensor x = mul(randn({200, 12}, gen), 2.0);
  const Tensor y_qat = (*qat)(x), y_int8 = (*int8)(x);
  const double step = output_step(*qat);
  TempDir d("qgrad_export");
  export_onnx(*qat, x, d.file("qat.onnx"));
  export_onnx(*int8, x, d.file("int8.onnx"));
  std::string log;
  // int8: exact int32 sums and the same f32 epilogue; only a quantized input
  // may differ (x / s in QuantizeLinear, x * (1/s) in qgrad).
  int rc = onnx_run(d, d.file("int8.onnx"), x, y_int8, step, "--max-steps 1 --min-equal 0.99", log);
  if (rc == 77) {
    std::printf("SKIPPED: %s", log.c_str());
    return;
  }
  MESSAGE("int8: ", log);
  CHECK(rc == 0);
  // Float GEMMs: onnxruntime's sums run in another order than qgrad's, so an
  // output near a rounding boundary may land one step away.
  rc = onnx_run(d, d.file("qat.onnx"), x, y_qat, step, "--max-steps 1 --min-equal 0.95", log);
  MESSAGE("qat: ", log);
  CHECK(rc == 0);
  // Without the clamp, QuantizeLinear saturates at 255, not 127: outputs move.
  OnnxExportOptions no_clamp;
  no_clamp.clamp_to_quant_range = false;
  export_onnx(*qat, x, d.file("qat_no_clamp.onnx"), no_clamp);
  rc = onnx_run(d, d.file("qat_no_clamp.onnx"), x, y_qat, step, "--expect-differ", log);
  MESSAGE("qat without the clamp: ", log);
  CHECK(rc == 0);
}

TEST_CASE("export_onnx: what does not export is an error naming it") {
  Generator gen(3);
  auto m = std::make_shared<Sequential>();
  m->emplace_back<Linear>(4, 3, gen);
  m->push_back("lsq", std::make_shared<LearnableFakeQuantize>(ObserverOptions{}));
  const Tensor x = zeros({2, 4});
  TempDir d("qgrad_export");
  if (!onnx_export_available()) {
    CHECK(error_of([&] { export_onnx(*m, x, d.file("m.onnx")); }).find("built without ONNX") != std::string::npos);
    return;
  }
  const std::string e = error_of([&] { export_onnx(*m, x, d.file("m.onnx")); });
  CHECK(e.find("export_onnx") != std::string::npos);
  CHECK(e.find("'lsq'") != std::string::npos);
  CHECK(e.find("LearnableFakeQuantize") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(d.file("m.onnx")));
  OnnxExportOptions bad;
  bad.opset = 12;
  CHECK(error_of([&] { export_onnx(*m, x, d.file("m.onnx"), bad); }).find("opset") != std::string::npos);
  CHECK(error_of([&] { export_onnx(*m, zeros({2, 5}), d.file("m.onnx")); }).find("input features") !=
        std::string::npos);
  CHECK(error_of([&] { export_onnx(*m, zeros({4}), d.file("m.onnx")); }).find("example_input") !=
        std::string::npos);
  ObserverOptions per_batch;
  per_batch.qscheme = QScheme::per_channel_affine;
  per_batch.ch_axis = 0;
  per_batch.channels = 2;
  Sequential p;
  p.push_back("fq", std::make_shared<FakeQuantize>(per_batch));
  CHECK(error_of([&] { export_onnx(p, x, d.file("m.onnx")); }).find("'fq': per-channel fake quantization of an "
                                                                    "activation along its batch axis") !=
        std::string::npos);
}
