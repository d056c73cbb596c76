// conv2d on CUDA through cuDNN's convolution API (cudnn_cnn.h:
// cudnnConvolutionForward / BackwardData / BackwardFilter), NCHW, groups by
// cudnnSetConvolutionGroupCount. Groups of at most 4 input channels first try
// qgrad's direct kernels (conv_direct.cu): both gradients, and the forward
// with at least 4 output channels per group. conv2d may stage a training
// convolution's operands channels-last (kernels/conv.h): then the
// *_channels_last passes, on graph-API plans for those layouts.
//
// Handles: one per device, created on first use, bound to the device's one
// stream (qgrad::cuda::stream), never destroyed (as the cuBLAS handles).
// Workspace: from qgrad's caching allocator, released when the call has been
// queued (the next user of the block is queued after it on the same stream).
//
// Math: f32 with CUDNN_FMA_MATH (no TF32: the CPU computes in f32, and the
// promise across devices is 1e-5) unless the shape allows TF32
// (Conv2dShape::allow_tf32, from qgrad::set_conv_allow_tf32: PyTorch's
// torch.backends.cudnn.allow_tf32, on by default there): then cuDNN's
// default math, TENSOR_CORE engines allowed; f64 with the default math, f16
// and bf16 on tensor cores with f32 accumulation (the convolution's compute
// type is f32).
//
// Engines: chosen once per (device, dtype, shape, direction, pointer
// alignment, accumulation) and cached. Every pass except a forward
// accumulated onto y (beta = 1) first tries cuDNN's graph (backend) API, as
// PyTorch 2.11 calls it: an operation graph of the one convolution, the
// engine configurations of its instant heuristic in order, the first whose
// plan builds and whose numerical notes allow it: never NONDETERMINISTIC, for
// f32 never DOWN_CONVERT_INPUTS, nor TENSOR_CORE (TF32) unless allowed, for f16/bf16 never
// REDUCED_PRECISION_REDUCTION (the accumulation stays f32), never an engine
// that compiles at run time. The legacy API lacks the newer engines: the
// bf16 backward-data pass at 256x32x14x14 took 0.068 ms there against the
// graph engine's 0.034 (H100, 2026-11-24). The beta = 1 forward, and a pass
// no graph engine takes, use the legacy API: cudnnGet*Algorithm_v7 (no
// benchmarking, no host sync), the first result that succeeds, is
// CUDNN_DETERMINISTIC and has the math type above; failing that a fixed
// deterministic algorithm (IMPLICIT_GEMM, BWD_DATA_ALGO_1,
// BWD_FILTER_ALGO_1). Either way no benchmarking: the same inputs give the
// same bits on every run on one GPU model and cuDNN version.
#include <cudnn.h>

#include <array>
#include <cstdlib>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "qgrad/core/memory.h"
#include "qgrad/kernels/cuda/entries.h"
#include "qgrad/kernels/cuda/launch.cuh"

namespace qgrad::kernels::cuda {

namespace {

[[noreturn]] void throw_cudnn(cudnnStatus_t st, const char* what, const char* file, int line) {
  throw Error("conv2d", "", std::string("cuDNN ") + cudnnGetErrorString(st) + " in " + what + " at " + file + ":" +
                                std::to_string(line));
}

#define QGRAD_CUDNN_CHECK(expr)                                              \
  do {                                                                       \
    cudnnStatus_t qgrad_st_ = (expr);                                        \
    if (qgrad_st_ != CUDNN_STATUS_SUCCESS) throw_cudnn(qgrad_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// One handle per device and stream (main, side: core/device.h SideStreamScope).
cudnnHandle_t dnn_handle(int device) {
  static std::mutex mutex;
  static std::vector<cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  const std::size_t slot = ::qgrad::cuda::stream_slot(device);
  if (handles.size() <= slot) handles.resize(slot + 1, nullptr);
  if (handles[slot] == nullptr) {
    ::qgrad::cuda::DeviceGuard guard(device);
    cudnnHandle_t h = nullptr;
    QGRAD_CUDNN_CHECK(cudnnCreate(&h));
    QGRAD_CUDNN_CHECK(cudnnSetStream(h, ::qgrad::cuda::stream(device)));
    handles[slot] = h;
  }
  return handles[slot];
}

cudnnDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}
cudnnMathType_t math_type(DType dt, bool tf32) {
  switch (dt) {
    case DType::f32: return tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    case DType::f16:
    case DType::bf16: return CUDNN_TENSOR_OP_MATH;
    default: return CUDNN_DEFAULT_MATH;
  }
}
// A heuristic result's math type is acceptable: for f32 only FMA (TF32 would
// round the operands to 10 mantissa bits) unless TF32 is allowed.
bool math_ok(DType dt, bool tf32, cudnnMathType_t m) {
  if (dt == DType::f32) return m == CUDNN_FMA_MATH || (tf32 && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
  return m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// The descriptors of one convolution, destroyed with the object.
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  Descriptors(const Conv2dShape& s, DType dt) {
    try {
      init(s, dt);
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~Descriptors() { destroy(); }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

 private:
  void init(const Conv2dShape& s, DType dt) {
    const cudnnDataType_t t = data_type(dt);
    QGRAD_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    QGRAD_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    QGRAD_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    QGRAD_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    auto i = [](std::int64_t v) { return static_cast<int>(v); };
    QGRAD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, t, i(s.n), i(s.c), i(s.h), i(s.w)));
    QGRAD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, t, i(s.n), i(s.o), i(s.oh), i(s.ow)));
    QGRAD_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, t, CUDNN_TENSOR_NCHW, i(s.o), i(s.c_per_group()), i(s.kh), i(s.kw)));
    QGRAD_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, i(s.ph), i(s.pw), i(s.sh), i(s.sw), i(s.dh), i(s.dw),
                                                      CUDNN_CROSS_CORRELATION,
                                                      dt == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
    QGRAD_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, i(s.groups)));
    QGRAD_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math_type(dt, s.allow_tf32)));
  }
  void destroy() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

enum class Direction { forward, backward_data, backward_filter };

struct BackendPlan;  // below: the graph API's plan

// What the first call of a shape chose: a graph-API plan, or else a legacy
// algorithm with its math type.
struct Choice {
  std::shared_ptr<BackendPlan> plan;
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::size_t workspace = 0;
};

using Key = std::tuple<int, int, int, std::vector<std::int64_t>>;  // device, dtype, direction, sizes

Key key_of(const Conv2dShape& s, DType dt, Direction dir, int device, bool accumulate, std::int64_t alignment) {
  return Key{device, static_cast<int>(dt), static_cast<int>(dir),
             std::vector<std::int64_t>{s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, s.oh, s.ow, s.sh, s.sw, s.ph, s.pw, s.dh,
                                       s.dw, s.groups, accumulate ? 1 : 0, alignment, s.allow_tf32 ? 1 : 0}};
}

// The first deterministic heuristic result with an acceptable math type.
template <class Perf>
bool pick(const std::vector<Perf>& perf, int returned, DType dt, bool tf32, Choice& c) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[static_cast<std::size_t>(i)];
    if (p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC && math_ok(dt, tf32, p.mathType)) {
      c.algo = static_cast<int>(p.algo);
      c.math = p.mathType;
      return true;
    }
  }
  return false;
}

Choice choose(cudnnHandle_t h, const Descriptors& d, const Conv2dShape& s, DType dt, Direction dir) {
  Choice c;
  const bool tf32 = s.allow_tf32;
  c.math = math_type(dt, tf32);
  int count = 0, returned = 0;
  if (dir == Direction::forward) {
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(count));
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, count, &returned, perf.data()));
    if (!pick(perf, returned, dt, tf32, c)) c.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  } else if (dir == Direction::backward_data) {
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(count));
    QGRAD_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, count, &returned, perf.data()));
    if (!pick(perf, returned, dt, tf32, c)) c.algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  } else {
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(count));
    QGRAD_CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, count, &returned, perf.data()));
    if (!pick(perf, returned, dt, tf32, c)) c.algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  }
  QGRAD_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math));
  if (dir == Direction::forward)
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y,
                                                              static_cast<cudnnConvolutionFwdAlgo_t>(c.algo),
                                                              &c.workspace));
  else if (dir == Direction::backward_data)
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x,
                                                                   static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
                                                                   &c.workspace));
  else
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, d.x, d.y, d.conv, d.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), &c.workspace));
  return c;
}

// ---- the graph (backend) API ----

// One backend descriptor, destroyed with the object.
struct BackendDescriptor {
  cudnnBackendDescriptor_t d = nullptr;
  explicit BackendDescriptor(cudnnBackendDescriptorType_t type) {
    QGRAD_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d));
  }
  ~BackendDescriptor() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;

  template <class V>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const V* values, std::int64_t count) {
    QGRAD_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, type, count, values));
  }
  template <class V>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const V& value) {
    set(name, type, &value, 1);
  }
  void finalize() { QGRAD_CUDNN_CHECK(cudnnBackendFinalize(d)); }
};

// The tensors' unique ids in the operation graph and the variant pack.
enum : std::int64_t { kUidX = 1, kUidW = 2, kUidY = 3 };

// A finalized execution plan and everything it was built from.
struct BackendPlan {
  std::vector<std::unique_ptr<BackendDescriptor>> parts;  // kept alive with the plan
  std::vector<std::unique_ptr<BackendDescriptor>> configs;
  std::unique_ptr<BackendDescriptor> plan;
  std::size_t workspace = 0;
  std::int64_t engine_index = -1;  // the engine's global index (for QGRAD_CUDNN_LOG)
};

// The staged operands of a pass (kernels/conv.h, channels-last staging): the
// pass's x (dx), w (dw) and y (dy) stored [n, h, w, c] rather than NCHW.
enum Staged : unsigned { kNoneStaged = 0, kXStaged = 1, kWStaged = 2, kYStaged = 4 };

// dims [n, c, h, w]; strides NCHW, or NHWC when channels_last.
std::unique_ptr<BackendDescriptor> backend_tensor(std::int64_t uid, const std::array<std::int64_t, 4>& dims,
                                                  cudnnDataType_t type, std::int64_t alignment, bool channels_last) {
  auto t = std::make_unique<BackendDescriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::array<std::int64_t, 4> strides =
      channels_last ? std::array<std::int64_t, 4>{dims[1] * dims[2] * dims[3], 1, dims[3] * dims[1], dims[1]}
                    : std::array<std::int64_t, 4>{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, type);
  t->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4);
  t->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4);
  t->set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid);
  t->set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, alignment);
  t->finalize();
  return t;
}

// An engine configuration the numerical promise above allows; its engine's
// global index in `index`.
bool engine_allowed(const BackendDescriptor& config, DType dt, bool tf32, std::int64_t& index) {
  BackendDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(config.d, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                               &engine.d) != CUDNN_STATUS_SUCCESS)
    return false;
  if (cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index) !=
      CUDNN_STATUS_SUCCESS)
    index = -1;
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  if (cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<std::int64_t>(notes.size()), &count, notes.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  for (std::int64_t i = 0; i < count; ++i) {
    const cudnnBackendNumericalNote_t n = notes[static_cast<std::size_t>(i)];
    if (n == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
    if (dt == DType::f32 && (n == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS || (!tf32 && n == CUDNN_NUMERICAL_NOTE_TENSOR_CORE)))
      return false;
    if ((dt == DType::f16 || dt == DType::bf16) && n == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) return false;
  }
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behavior{};
  if (cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               static_cast<std::int64_t>(behavior.size()), &count, behavior.data()) !=
      CUDNN_STATUS_SUCCESS)
    return false;
  for (std::int64_t i = 0; i < count; ++i)
    if (behavior[static_cast<std::size_t>(i)] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) return false;
  return true;
}

// The plan of the first allowed engine of the instant heuristic for
// operands laid out as `staged` says; null when none builds (then the legacy
// API, for unstaged operands).
std::shared_ptr<BackendPlan> backend_plan(cudnnHandle_t h, const Conv2dShape& s, DType dt, Direction dir,
                                          bool accumulate, std::int64_t alignment, unsigned staged) {
  auto bp = std::make_shared<BackendPlan>();
  const cudnnDataType_t t = data_type(dt);
  const cudnnDataType_t compute = dt == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  auto x = backend_tensor(kUidX, {s.n, s.c, s.h, s.w}, t, alignment, (staged & kXStaged) != 0);
  auto w = backend_tensor(kUidW, {s.o, s.c_per_group(), s.kh, s.kw}, t, alignment, (staged & kWStaged) != 0);
  auto y = backend_tensor(kUidY, {s.n, s.o, s.oh, s.ow}, t, alignment, (staged & kYStaged) != 0);

  auto conv = std::make_unique<BackendDescriptor>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const std::int64_t dims = 2;
  const std::array<std::int64_t, 2> pad{s.ph, s.pw}, stride{s.sh, s.sw}, dilation{s.dh, s.dw};
  conv->set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, compute);
  conv->set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, CUDNN_CROSS_CORRELATION);
  conv->set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, dims);
  conv->set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pad.data(), 2);
  conv->set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pad.data(), 2);
  conv->set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride.data(), 2);
  conv->set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, dilation.data(), 2);
  conv->finalize();

  cudnnBackendDescriptorType_t op_type = CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR;
  cudnnBackendAttributeName_t a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                              a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                              a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                              a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                              a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                              a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA;
  if (dir == Direction::backward_data) {
    op_type = CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR;
    a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX;
    a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W;
    a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY;
    a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC;
    a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA;
    a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA;
  } else if (dir == Direction::backward_filter) {
    op_type = CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
    a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X;
    a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW;
    a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY;
    a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC;
    a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA;
    a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA;
  }
  auto op = std::make_unique<BackendDescriptor>(op_type);
  op->set(a_x, CUDNN_TYPE_BACKEND_DESCRIPTOR, x->d);
  op->set(a_w, CUDNN_TYPE_BACKEND_DESCRIPTOR, w->d);
  op->set(a_y, CUDNN_TYPE_BACKEND_DESCRIPTOR, y->d);
  op->set(a_conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, conv->d);
  const double beta = accumulate ? 1.0 : 0.0;
  if (dt == DType::f64) {
    op->set(a_alpha, CUDNN_TYPE_DOUBLE, 1.0);
    op->set(a_beta, CUDNN_TYPE_DOUBLE, beta);
  } else {
    op->set(a_alpha, CUDNN_TYPE_FLOAT, 1.0f);
    op->set(a_beta, CUDNN_TYPE_FLOAT, static_cast<float>(beta));
  }
  op->finalize();

  auto graph = std::make_unique<BackendDescriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, op->d);
  graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, h);
  graph->finalize();

  BackendDescriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, graph->d);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, CUDNN_HEUR_MODE_INSTANT);
  heur.finalize();
  std::int64_t count = 0;
  QGRAD_CUDNN_CHECK(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             0, &count, nullptr));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    bp->configs.push_back(std::make_unique<BackendDescriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(bp->configs.back()->d);
  }
  std::int64_t returned = 0;
  QGRAD_CUDNN_CHECK(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             count, &returned, raw.data()));
  for (std::int64_t i = 0; i < returned && i < count; ++i) {
    const BackendDescriptor& config = *bp->configs[static_cast<std::size_t>(i)];
    std::int64_t index = -1;
    if (!engine_allowed(config, dt, s.allow_tf32, index)) continue;
    auto plan = std::make_unique<BackendDescriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, h);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, config.d);
    if (cudnnBackendFinalize(plan->d) != CUDNN_STATUS_SUCCESS) continue;  // this engine cannot run the graph
    std::int64_t ws = 0;
    QGRAD_CUDNN_CHECK(cudnnBackendGetAttribute(plan->d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                               1, &count, &ws));
    bp->workspace = static_cast<std::size_t>(ws);
    bp->engine_index = index;
    bp->plan = std::move(plan);
    bp->parts.push_back(std::move(x));
    bp->parts.push_back(std::move(w));
    bp->parts.push_back(std::move(y));
    bp->parts.push_back(std::move(conv));
    bp->parts.push_back(std::move(op));
    bp->parts.push_back(std::move(graph));
    return bp;
  }
  return nullptr;
}

// Runs the plan on (x, w, y) device pointers (uids kUidX, kUidW, kUidY).
void backend_execute(cudnnHandle_t h, const BackendPlan& bp, void* x, void* w, void* y, void* workspace) {
  BackendDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const std::array<std::int64_t, 3> uids{kUidX, kUidW, kUidY};
  const std::array<void*, 3> ptrs{x, w, y};
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), 3);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), 3);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace);
  pack.finalize();
  QGRAD_CUDNN_CHECK(cudnnBackendExecute(h, bp.plan->d, pack.d));
}

// The largest power of two up to 16 that divides every pointer's address.
std::int64_t common_alignment(std::initializer_list<const void*> ptrs) {
  std::int64_t a = 16;
  for (const void* p : ptrs)
    while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(a) != 0) a /= 2;
  return a;
}

// The cached choice for this shape (made on first use); for a legacy
// algorithm, sets the descriptor's math type to the chosen one.
Choice cached_choice(cudnnHandle_t h, const Descriptors& d, const Conv2dShape& s, DType dt, Direction dir,
                     int device, bool accumulate, std::int64_t alignment) {
  static std::mutex mutex;
  static std::map<Key, Choice> cache;
  const Key key = key_of(s, dt, dir, device, accumulate, alignment);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) {
      if (!it->second.plan) QGRAD_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, it->second.math));
      return it->second;
    }
  }
  Choice c;
  // A forward with beta = 1 (a 16-bit output accumulated onto its filled
  // bias, so that it rounds once) stays on the legacy API: the graph API's
  // engines measured slower there (64x64x56x56 f32 0.450 ms against 0.402,
  // bf16 0.216 against 0.182; H100, 2026-11-24).
  if (dir != Direction::forward || !accumulate) {
    try {
      c.plan = backend_plan(h, s, dt, dir, accumulate, alignment, kNoneStaged);
    } catch (const Error&) {  // the graph API rejects this convolution: the legacy API
      c.plan = nullptr;
    }
  }
  if (c.plan) c.workspace = c.plan->workspace;
  else c = choose(h, d, s, dt, dir);
  if (std::getenv("QGRAD_CUDNN_LOG"))  // which engine each shape got (benchmark diagnosis)
    std::fprintf(stderr, "qgrad conv2d %s %s n%lld c%lld %lldx%lld o%lld k%lldx%lld g%lld: %s %lld, workspace %zu\n",
                 dir == Direction::forward ? "fwd" : dir == Direction::backward_data ? "dx" : "dw", dtype_name(dt),
                 static_cast<long long>(s.n), static_cast<long long>(s.c), static_cast<long long>(s.h),
                 static_cast<long long>(s.w), static_cast<long long>(s.o), static_cast<long long>(s.kh),
                 static_cast<long long>(s.kw), static_cast<long long>(s.groups),
                 c.plan ? "graph engine" : "legacy algo",
                 static_cast<long long>(c.plan ? c.plan->engine_index : c.algo), c.workspace);
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, c);
  return c;
}

// The staged passes' operands (kernels/conv.h): for each direction, which
// of the pass's x, w, y are channels-last.
unsigned staged_operands(Direction dir) {
  switch (dir) {
    case Direction::forward: return kXStaged | kWStaged;          // y NCHW
    case Direction::backward_data: return kWStaged | kYStaged;    // dx NCHW
    default: return kXStaged | kYStaged;                          // dw NCHW
  }
}

// The graph plan of a staged pass, built on first use and cached (null, also
// cached, when no allowed engine builds): a cache hit takes no device switch
// and no handle. Every staged operand and output is a fresh allocation of
// conv2d's (the caching allocator's 256-byte alignment): planned for 16-byte
// alignment, checked at each call.
std::shared_ptr<BackendPlan> staged_plan(const Conv2dShape& s, DType dt, Direction dir, int device) {
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<BackendPlan>> cache;
  const Key key = key_of(s, dt, dir, device, false, 16);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  std::shared_ptr<BackendPlan> plan;
  try {
    ::qgrad::cuda::DeviceGuard guard(device);
    plan = backend_plan(dnn_handle(device), s, dt, dir, false, 16, staged_operands(dir));
  } catch (const Error&) {  // the graph API rejects it: conv2d does not stage this shape
    plan = nullptr;
  }
  if (std::getenv("QGRAD_CUDNN_LOG"))
    std::fprintf(stderr,
                 "qgrad conv2d %s channels-last n%lld c%lld %lldx%lld o%lld k%lldx%lld: %s %lld, workspace %zu\n",
                 dir == Direction::forward ? "fwd" : dir == Direction::backward_data ? "dx" : "dw",
                 static_cast<long long>(s.n), static_cast<long long>(s.c), static_cast<long long>(s.h),
                 static_cast<long long>(s.w), static_cast<long long>(s.o), static_cast<long long>(s.kh),
                 static_cast<long long>(s.kw), plan ? "graph engine" : "none",
                 static_cast<long long>(plan ? plan->engine_index : -1), plan ? plan->workspace : std::size_t{0});
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, plan);
  return plan;
}

// out [a, inner, b] = in [a, b, inner], by 32 x 32 tiles through shared
// memory (both the reads and the writes coalesced); blockIdx.z strides over a.
template <class U>
__global__ void channels_last_kernel(const U* __restrict__ in, U* __restrict__ out, std::int64_t outer,
                                     std::int64_t channels, std::int64_t inner) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ U tile[32][33];
  const std::int64_t j0 = std::int64_t{blockIdx.x} * 32, c0 = std::int64_t{blockIdx.y} * 32;
  for (std::int64_t a = blockIdx.z; a < outer; a += gridDim.z) {
    const U* src = in + a * channels * inner;
    U* dst = out + a * channels * inner;
    for (unsigned r = threadIdx.y; r < 32; r += blockDim.y) {
      const std::int64_t c = c0 + r, j = j0 + threadIdx.x;
      if (c < channels && j < inner) tile[r][threadIdx.x] = src[c * inner + j];
    }
    __syncthreads();
    for (unsigned r = threadIdx.y; r < 32; r += blockDim.y) {
      const std::int64_t j = j0 + r, c = c0 + threadIdx.x;
      if (c < channels && j < inner) dst[j * channels + c] = tile[threadIdx.x][r];
    }
    __syncthreads();
  }
}

// channels_last_kernel for 4-byte elements in 16-byte units (inner and
// channels multiples of 4, both pointers 16-byte aligned): a thread loads
// four consecutive elements of a channel row and stores four consecutive
// channels of an output row, one 16-byte access each where the scalar
// kernel takes four (the copies' loads and stores were its time). 256
// threads; the padded tile keeps both phases free of bank conflicts.
__global__ void channels_last_vec4_kernel(const Vec4<std::uint32_t>* __restrict__ in,
                                          Vec4<std::uint32_t>* __restrict__ out, std::int64_t outer,
                                          std::int64_t channels, std::int64_t inner) {
  ::qgrad::cuda::wait_for_prior_kernels();
  __shared__ std::uint32_t tile[32][33];
  const std::int64_t j0 = std::int64_t{blockIdx.x} * 32, c0 = std::int64_t{blockIdx.y} * 32;
  const unsigned row = threadIdx.x / 8, quad = threadIdx.x % 8;  // 32 rows of 8 quads
  const std::int64_t inner4 = inner / 4, channels4 = channels / 4;
  for (std::int64_t a = blockIdx.z; a < outer; a += gridDim.z) {
    const Vec4<std::uint32_t>* src = in + a * channels * inner4;
    Vec4<std::uint32_t>* dst = out + a * inner * channels4;
    {
      const std::int64_t c = c0 + row, j = j0 + 4 * quad;
      if (c < channels && j < inner) {
        const Vec4<std::uint32_t> v = src[c * inner4 + j / 4];
        QGRAD_UNROLL
        for (int k = 0; k < 4; ++k) tile[row][4 * quad + k] = v.v[k];
      }
    }
    __syncthreads();
    {
      const std::int64_t j = j0 + row, c = c0 + 4 * quad;
      if (c < channels && j < inner) {
        Vec4<std::uint32_t> v;
        QGRAD_UNROLL
        for (int k = 0; k < 4; ++k) v.v[k] = tile[4 * quad + k][row];
        dst[j * channels4 + c / 4] = v;
      }
    }
    __syncthreads();
  }
}

// A staged pass's plan, its pointers' alignment checked.
const BackendPlan& staged_plan_for(const Conv2dShape& s, DType dt, Direction dir, int device,
                                   std::initializer_list<const void*> ptrs) {
  const std::shared_ptr<BackendPlan> plan = staged_plan(s, dt, dir, device);
  if (!plan || common_alignment(ptrs) < 16)
    throw Error("conv2d", "x", "internal: a channels-last pass without its plan or with unaligned operands");
  return *plan;
}

// Workspace from the caching allocator, released when the call is queued.
struct Workspace {
  void* ptr = nullptr;
  Device device;
  Workspace(std::size_t bytes, Device d) : device(d) {
    if (bytes > 0) ptr = memory::allocate(bytes, d);
  }
  ~Workspace() {
    if (ptr) memory::release(ptr, device);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
};

// alpha = 1, beta = 0 or 1 in the scaling type cuDNN expects (double for
// f64, float otherwise).
struct Scaling {
  double d1 = 1.0, d0 = 0.0;
  float f1 = 1.0f, f0 = 0.0f;
  bool dbl;
  explicit Scaling(DType dt) : dbl(dt == DType::f64) {}
  const void* one() const { return dbl ? static_cast<const void*>(&d1) : static_cast<const void*>(&f1); }
  const void* zero() const { return dbl ? static_cast<const void*>(&d0) : static_cast<const void*>(&f0); }
};

// Runs a staged pass on its graph operands x, w, y (dx, dw, dy by
// direction); `out` is the one it writes.
void run_staged(const Conv2dShape& s, Direction dir, const Tensor& x, const Tensor& w, const Tensor& y,
                const Tensor& out) {
  const int dev = out.device().index;
  ::qgrad::cuda::DeviceGuard guard(dev);
  cudnnHandle_t h = dnn_handle(dev);
  const BackendPlan& plan = staged_plan_for(s, out.dtype(), dir, dev, {x.data_ptr(), w.data_ptr(), y.data_ptr()});
  Workspace ws(plan.workspace, out.device());
  backend_execute(h, plan, x.data_ptr(), w.data_ptr(), y.data_ptr(), ws.ptr);
}

void check_dtype(DType dt) {
  if (!is_floating(dt)) throw Error("conv2d", "x", std::string("no cuDNN path for dtype ") + dtype_name(dt));
}

}  // namespace

void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& weight, const Tensor& y, bool accumulate) {
  if (s.n == 0) return;
  const DType dt = y.dtype();
  check_dtype(dt);
  const int dev = y.device().index;
  ::qgrad::cuda::DeviceGuard guard(dev);
  if (conv2d_forward_direct(s, x, weight, y, accumulate)) return;
  cudnnHandle_t h = dnn_handle(dev);
  Descriptors d(s, dt);
  const Choice c = cached_choice(h, d, s, dt, Direction::forward, dev, accumulate,
                                 common_alignment({x.data_ptr(), weight.data_ptr(), y.data_ptr()}));
  Workspace ws(c.workspace, y.device());
  if (c.plan) return backend_execute(h, *c.plan, x.data_ptr(), weight.data_ptr(), y.data_ptr(), ws.ptr);
  const Scaling a(dt);
  QGRAD_CUDNN_CHECK(cudnnConvolutionForward(h, a.one(), d.x, x.data_ptr(), d.w, weight.data_ptr(), d.conv,
                                            static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws.ptr, c.workspace,
                                            accumulate ? a.one() : a.zero(), d.y, y.data_ptr()));
}

void conv2d_backward_input(const Conv2dShape& s, const Tensor& dy, const Tensor& weight, const Tensor& dx) {
  if (s.n == 0) return;
  const DType dt = dx.dtype();
  check_dtype(dt);
  const int dev = dx.device().index;
  ::qgrad::cuda::DeviceGuard guard(dev);
  if (conv2d_backward_input_direct(s, dy, weight, dx)) return;
  cudnnHandle_t h = dnn_handle(dev);
  Descriptors d(s, dt);
  const Choice c = cached_choice(h, d, s, dt, Direction::backward_data, dev, false,
                                 common_alignment({dx.data_ptr(), weight.data_ptr(), dy.data_ptr()}));
  Workspace ws(c.workspace, dx.device());
  if (c.plan) return backend_execute(h, *c.plan, dx.data_ptr(), weight.data_ptr(), dy.data_ptr(), ws.ptr);
  const Scaling a(dt);
  QGRAD_CUDNN_CHECK(cudnnConvolutionBackwardData(h, a.one(), d.w, weight.data_ptr(), d.y, dy.data_ptr(), d.conv,
                                                 static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws.ptr,
                                                 c.workspace, a.zero(), d.x, dx.data_ptr()));
}

void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy, const Tensor& dweight) {
  const DType dt = dweight.dtype();
  check_dtype(dt);
  const int dev = dweight.device().index;
  ::qgrad::cuda::DeviceGuard guard(dev);
  if (s.n == 0) {  // an empty batch: the gradient is zero (cuDNN rejects n = 0)
    QGRAD_CUDA_CHECK(cudaMemsetAsync(dweight.data_ptr(), 0, dweight.nbytes(), ::qgrad::cuda::stream(dev)));
    return;
  }
  if (conv2d_backward_weight_direct(s, x, dy, dweight)) return;
  cudnnHandle_t h = dnn_handle(dev);
  Descriptors d(s, dt);
  const Choice c = cached_choice(h, d, s, dt, Direction::backward_filter, dev, false,
                                 common_alignment({x.data_ptr(), dweight.data_ptr(), dy.data_ptr()}));
  Workspace ws(c.workspace, dweight.device());
  if (c.plan) return backend_execute(h, *c.plan, x.data_ptr(), dweight.data_ptr(), dy.data_ptr(), ws.ptr);
  const Scaling a(dt);
  QGRAD_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, a.one(), d.x, x.data_ptr(), d.y, dy.data_ptr(), d.conv,
                                                   static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws.ptr,
                                                   c.workspace, a.zero(), d.w, dweight.data_ptr()));
}

bool conv2d_stages_channels_last(const Conv2dShape& s, DType dt, int device) {
  if (dt != DType::f32 || !s.allow_tf32 || s.groups != 1 || s.c < 8 || s.c % 4 != 0 || s.o % 4 != 0 || s.n == 0)
    return false;
  for (Direction dir : {Direction::forward, Direction::backward_data, Direction::backward_filter})
    if (!staged_plan(s, dt, dir, device)) return false;
  return true;
}

void to_channels_last(const Tensor& in, const Tensor& out) {
  const std::int64_t a = in.size(0), b = in.size(1), inner = in.size(2) * in.size(3);
  if (a * b * inner == 0) return;
  const int dev = out.device().index;
  const dim3 grid(static_cast<unsigned>((inner + 31) / 32), static_cast<unsigned>((b + 31) / 32),
                  static_cast<unsigned>(a < 65535 ? a : 65535));
  const auto launch = [&](auto unit) {
    using U = decltype(unit);
    ::qgrad::cuda::launch_kernel(dev, channels_last_kernel<U>, grid, dim3(32, 8), 0,
                                 static_cast<const U*>(in.data_ptr()), static_cast<U*>(out.data_ptr()), a, b, inner);
  };
  if (dtype_size(in.dtype()) == 4 && inner % 4 == 0 && b % 4 == 0 &&
      common_alignment({in.data_ptr(), out.data_ptr()}) >= 16) {
    ::qgrad::cuda::launch_kernel(dev, channels_last_vec4_kernel, grid, dim3(256), 0,
                                 static_cast<const Vec4<std::uint32_t>*>(in.data_ptr()),
                                 static_cast<Vec4<std::uint32_t>*>(out.data_ptr()), a, b, inner);
    return;
  }
  switch (dtype_size(in.dtype())) {
    case 1: return launch(std::uint8_t{});
    case 2: return launch(std::uint16_t{});
    case 4: return launch(std::uint32_t{});
    default: return launch(std::uint64_t{});
  }
}

// The staged passes (never for an empty batch: conv2d_stages_channels_last).
void conv2d_forward_channels_last(const Conv2dShape& s, const Tensor& x_cl, const Tensor& w_cl, const Tensor& y) {
  run_staged(s, Direction::forward, x_cl, w_cl, y, y);
}

void conv2d_backward_input_channels_last(const Conv2dShape& s, const Tensor& dy_cl, const Tensor& w_cl,
                                         const Tensor& dx) {
  run_staged(s, Direction::backward_data, dx, w_cl, dy_cl, dx);
}

void conv2d_backward_weight_channels_last(const Conv2dShape& s, const Tensor& x_cl, const Tensor& dy_cl,
                                          const Tensor& dweight) {
  run_staged(s, Direction::backward_filter, x_cl, dweight, dy_cl, dweight);
}

}  // namespace qgrad::kernels::cuda
