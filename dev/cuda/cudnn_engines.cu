// Every engine cuDNN's graph API offers for one convolution pass, timed
// (dev program, run by hand on the GPU machine). For each shape, pass
// (fwd, dx, dw), tensor layouts (NCHW as qgrad stores activations, NHWC, and
// mixed: the inputs NHWC, the output NCHW) and
// heuristic mode (instant, as qgrad and PyTorch ask; B; fallback): the
// engine configurations in the heuristic's order with their numerical notes
// (D deterministic or N not, T tensor cores / TF32, C down-converts inputs,
// R reduced-precision reduction, J compiled at run time: skipped), the
// workspace and the time of one call (50 calls captured in a CUDA graph).
// f32 tensors; an engine qgrad's f32 + TF32 rule allows is marked "ok".
//
//   dev_cudnn_engines [n c h w o k pad]...   (default: the CNN's two layers)
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "graph_timing.cuh"

#define DNN_CHECK(x)                                                                          \
  do {                                                                                        \
    const cudnnStatus_t s_ = (x);                                                             \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                         \
      std::printf("cuDNN %s at %s:%d (%s)\n", cudnnGetErrorString(s_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

struct Desc {
  cudnnBackendDescriptor_t d = nullptr;
  explicit Desc(cudnnBackendDescriptorType_t t) { DNN_CHECK(cudnnBackendCreateDescriptor(t, &d)); }
  ~Desc() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  template <class V>
  void set(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, const V* v, std::int64_t count) {
    DNN_CHECK(cudnnBackendSetAttribute(d, n, t, count, v));
  }
  template <class V>
  void set(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, const V& v) {
    set(n, t, &v, 1);
  }
};

struct Shape {
  std::int64_t n, c, h, w, o, k, pad;
  std::int64_t oh() const { return h + 2 * pad - k + 1; }
  std::int64_t ow() const { return w + 2 * pad - k + 1; }
};

enum Pass { kFwd, kDx, kDw };
const char* pass_name(int p) { return p == kFwd ? "fwd" : p == kDx ? "dx" : "dw"; }

// dims [n, c, h, w]; strides NCHW or NHWC.
cudnnBackendDescriptor_t make_tensor(std::vector<Desc*>& keep, std::int64_t uid, std::array<std::int64_t, 4> dims,
                                     bool nhwc) {
  auto* t = new Desc(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  keep.push_back(t);
  const std::int64_t c = dims[1], h = dims[2], w = dims[3];
  const std::array<std::int64_t, 4> strides =
      nhwc ? std::array<std::int64_t, 4>{c * h * w, 1, w * c, c} : std::array<std::int64_t, 4>{c * h * w, h * w, w, 1};
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  const std::int64_t align = 16;
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, f);
  t->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4);
  t->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4);
  t->set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid);
  t->set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, align);
  DNN_CHECK(cudnnBackendFinalize(t->d));
  return t->d;
}

std::string notes_of(cudnnBackendDescriptor_t config, std::int64_t& index, bool& ok, bool& runtime) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  std::int64_t count = 0;
  DNN_CHECK(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                                     &engine.d));
  DNN_CHECK(cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index));
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  DNN_CHECK(cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     static_cast<std::int64_t>(notes.size()), &count, notes.data()));
  bool det = true;
  std::string s;
  ok = true;
  for (std::int64_t i = 0; i < count; ++i) {
    switch (notes[static_cast<std::size_t>(i)]) {
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC: det = false; ok = false; break;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE: s += 'T'; break;
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: s += 'C'; ok = false; break;
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: s += 'R'; break;
      default: break;
    }
  }
  s = (det ? "D" : "N") + s;
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behavior{};
  DNN_CHECK(cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                     static_cast<std::int64_t>(behavior.size()), &count, behavior.data()));
  runtime = false;
  for (std::int64_t i = 0; i < count; ++i)
    if (behavior[static_cast<std::size_t>(i)] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) runtime = true;
  if (runtime) s += 'J';
  return s;
}

// layout: one letter per tensor x, w, y: N (NCHW) or H (NHWC).
void list(cudnnHandle_t h, const Shape& sh, int pass, const char* layout, cudnnBackendHeurMode_t mode,
          const char* mode_name, float* x, float* w, float* y, int shown) {
  std::vector<Desc*> keep;
  const cudnnBackendDescriptor_t tx = make_tensor(keep, 1, {sh.n, sh.c, sh.h, sh.w}, layout[0] == 'H');
  const cudnnBackendDescriptor_t tw = make_tensor(keep, 2, {sh.o, sh.c, sh.k, sh.k}, layout[1] == 'H');
  const cudnnBackendDescriptor_t ty = make_tensor(keep, 3, {sh.n, sh.o, sh.oh(), sh.ow()}, layout[2] == 'H');
  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const std::int64_t dims = 2;
  const std::array<std::int64_t, 2> pad{sh.pad, sh.pad}, one{1, 1};
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, CUDNN_CROSS_CORRELATION);
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, dims);
  conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pad.data(), 2);
  conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pad.data(), 2);
  conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, one.data(), 2);
  conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, one.data(), 2);
  DNN_CHECK(cudnnBackendFinalize(conv.d));
  const cudnnBackendDescriptorType_t types[] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                                CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                                CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
  const cudnnBackendAttributeName_t attrs[3][6] = {
      {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
      {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
      {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA}};
  Desc op(types[pass]);
  op.set(attrs[pass][0], CUDNN_TYPE_BACKEND_DESCRIPTOR, tx);
  op.set(attrs[pass][1], CUDNN_TYPE_BACKEND_DESCRIPTOR, tw);
  op.set(attrs[pass][2], CUDNN_TYPE_BACKEND_DESCRIPTOR, ty);
  op.set(attrs[pass][3], CUDNN_TYPE_BACKEND_DESCRIPTOR, conv.d);
  op.set(attrs[pass][4], CUDNN_TYPE_FLOAT, 1.0f);
  op.set(attrs[pass][5], CUDNN_TYPE_FLOAT, 0.0f);
  DNN_CHECK(cudnnBackendFinalize(op.d));
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, op.d);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, h);
  DNN_CHECK(cudnnBackendFinalize(graph.d));
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, graph.d);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, mode);
  if (cudnnBackendFinalize(heur.d) != CUDNN_STATUS_SUCCESS) {
    std::printf("  %s: the heuristic does not finalize\n", mode_name);
    return;
  }
  std::int64_t count = 0;
  DNN_CHECK(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                     nullptr));
  std::vector<Desc*> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.push_back(new Desc(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(configs.back()->d);
  }
  std::int64_t returned = 0;
  DNN_CHECK(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                     &returned, raw.data()));
  std::printf("  %s x,w,y %s %s: %lld configs\n", pass_name(pass), layout, mode_name, static_cast<long long>(returned));
  for (std::int64_t i = 0; i < returned && i < shown; ++i) {
    std::int64_t index = -1;
    bool ok = false, runtime = false;
    const std::string notes = notes_of(raw[static_cast<std::size_t>(i)], index, ok, runtime);
    if (runtime) {
      std::printf("    #%-2lld engine %-4lld %-6s (run-time compiled: skipped)\n", static_cast<long long>(i),
                  static_cast<long long>(index), notes.c_str());
      continue;
    }
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, h);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, raw[static_cast<std::size_t>(i)]);
    if (cudnnBackendFinalize(plan.d) != CUDNN_STATUS_SUCCESS) {
      std::printf("    #%-2lld engine %-4lld %-6s (plan does not build)\n", static_cast<long long>(i),
                  static_cast<long long>(index), notes.c_str());
      continue;
    }
    std::int64_t ws = 0, got = 0;
    DNN_CHECK(cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                       &ws));
    void* workspace = nullptr;
    if (ws > 0) DEV_CHECK_CUDA(cudaMalloc(&workspace, static_cast<std::size_t>(ws)));
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    const std::array<std::int64_t, 3> uids{1, 2, 3};
    const std::array<void*, 3> ptrs{x, w, y};
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), 3);
    pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), 3);
    pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace);
    DNN_CHECK(cudnnBackendFinalize(pack.d));
    const double us = graph_us([&](cudaStream_t s) {
      DNN_CHECK(cudnnSetStream(h, s));
      DNN_CHECK(cudnnBackendExecute(h, plan.d, pack.d));
    });
    if (workspace) DEV_CHECK_CUDA(cudaFree(workspace));
    const bool tf32_ok = ok;  // f32 with TF32 allowed: deterministic, no down-conversion
    std::printf("    #%-2lld engine %-4lld %-6s ws %9lld  %8.2f us %s\n", static_cast<long long>(i),
                static_cast<long long>(index), notes.c_str(), static_cast<long long>(ws), us, tf32_ok ? "ok" : "");
  }
  for (Desc* c : configs) delete c;
  for (Desc* t : keep) delete t;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  for (int i = 1; i + 6 < argc; i += 7)
    shapes.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2]), std::atoll(argv[i + 3]),
                      std::atoll(argv[i + 4]), std::atoll(argv[i + 5]), std::atoll(argv[i + 6])});
  if (shapes.empty()) shapes = {{256, 32, 14, 14, 64, 3, 1}, {256, 1, 28, 28, 32, 3, 1}};
  cudnnHandle_t h;
  DNN_CHECK(cudnnCreate(&h));
  std::printf("cuDNN %zu\n", cudnnGetVersion());
  const std::pair<cudnnBackendHeurMode_t, const char*> modes[] = {
      {CUDNN_HEUR_MODE_INSTANT, "instant"}, {CUDNN_HEUR_MODE_B, "B"}, {CUDNN_HEUR_MODE_FALLBACK, "fallback"}};
  for (const Shape& s : shapes) {
    std::printf("shape n%lld c%lld %lldx%lld o%lld k%lld pad%lld\n", static_cast<long long>(s.n),
                static_cast<long long>(s.c), static_cast<long long>(s.h), static_cast<long long>(s.w),
                static_cast<long long>(s.o), static_cast<long long>(s.k), static_cast<long long>(s.pad));
    float* x = dev_random(static_cast<std::size_t>(s.n * s.c * s.h * s.w), 1);
    float* w = dev_random(static_cast<std::size_t>(s.o * s.c * s.k * s.k), 2);
    float* y = dev_random(static_cast<std::size_t>(s.n * s.o * s.oh() * s.ow()), 3);
    for (int pass = 0; pass < 3; ++pass) {
      for (const char* layout : {"NNN", "HHH"})
        for (const auto& [mode, name] : modes) list(h, s, pass, layout, mode, name, x, w, y, 24);
      // Mixed: the inputs channels-last, the output NCHW; and the weight NCHW.
      const char* mixed[3][2] = {{"HHN", "HNN"}, {"NHH", "NNH"}, {"HNH", "HHH"}};
      for (const char* layout : mixed[pass]) list(h, s, pass, layout, modes[0].first, modes[0].second, x, w, y, 8);
    }
    DEV_CHECK_CUDA(cudaFree(x));
    DEV_CHECK_CUDA(cudaFree(w));
    DEV_CHECK_CUDA(cudaFree(y));
  }
  DNN_CHECK(cudnnDestroy(h));
  return 0;
}
