// conv2d on CUDA through cuDNN's convolution API (cudnn_cnn.h:
// cudnnConvolutionForward / BackwardData / BackwardFilter), NCHW, groups by
// cudnnSetConvolutionGroupCount.
//
// Handles: one per device, created on first use, bound to the device's one
// stream (qgrad::cuda::stream), never destroyed (as the cuBLAS handles).
// Workspace: from qgrad's caching allocator, released when the call has been
// queued (the next user of the block is queued after it on the same stream).
//
// Math: f32 with CUDNN_FMA_MATH (no TF32: the CPU computes in f32, and the
// promise across devices is 1e-5), f64 with the default math, f16 and bf16 on
// tensor cores with f32 accumulation (the convolution's compute type is f32).
//
// Algorithms: chosen once per (device, dtype, shape, direction) and cached,
// from cuDNN's heuristic (cudnnGet*Algorithm_v7: no benchmarking, no host
// sync), taking the first result, in the heuristic's order, whose status is
// success, whose determinism is CUDNN_DETERMINISTIC and whose math type is the
// one above (for f32: CUDNN_FMA_MATH). If none qualifies, a fixed
// deterministic algorithm: IMPLICIT_GEMM (forward), BWD_DATA_ALGO_1,
// BWD_FILTER_ALGO_1. So the same inputs give the same bits on every run on
// one GPU model and cuDNN version (the backward-data ALGO_0 and
// backward-filter ALGO_0 / ALGO_3, which add with atomics, are never used).
#include <cudnn.h>

#include <map>
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

cudnnHandle_t dnn_handle(int device) {
  static std::mutex mutex;
  static std::vector<cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  const auto d = static_cast<std::size_t>(device);
  if (handles.size() <= d) handles.resize(d + 1, nullptr);
  if (handles[d] == nullptr) {
    ::qgrad::cuda::DeviceGuard guard(device);
    cudnnHandle_t h = nullptr;
    QGRAD_CUDNN_CHECK(cudnnCreate(&h));
    QGRAD_CUDNN_CHECK(cudnnSetStream(h, ::qgrad::cuda::stream(device)));
    handles[d] = h;
  }
  return handles[d];
}

cudnnDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}
cudnnMathType_t math_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDNN_FMA_MATH;
    case DType::f16:
    case DType::bf16: return CUDNN_TENSOR_OP_MATH;
    default: return CUDNN_DEFAULT_MATH;
  }
}
// A heuristic result's math type is acceptable: for f32 only FMA (TF32 would
// round the operands to 10 mantissa bits).
bool math_ok(DType dt, cudnnMathType_t m) {
  if (dt == DType::f32) return m == CUDNN_FMA_MATH;
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
    QGRAD_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math_type(dt)));
  }
  void destroy() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

enum class Direction { forward, backward_data, backward_filter };

// What the first call of a shape chose.
struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::size_t workspace = 0;
};

using Key = std::tuple<int, int, int, std::vector<std::int64_t>>;  // device, dtype, direction, sizes

Key key_of(const Conv2dShape& s, DType dt, Direction dir, int device) {
  return Key{device, static_cast<int>(dt), static_cast<int>(dir),
             std::vector<std::int64_t>{s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, s.oh, s.ow, s.sh, s.sw, s.ph, s.pw, s.dh,
                                       s.dw, s.groups}};
}

// The first deterministic heuristic result with an acceptable math type.
template <class Perf>
bool pick(const std::vector<Perf>& perf, int returned, DType dt, Choice& c) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[static_cast<std::size_t>(i)];
    if (p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC && math_ok(dt, p.mathType)) {
      c.algo = static_cast<int>(p.algo);
      c.math = p.mathType;
      return true;
    }
  }
  return false;
}

Choice choose(cudnnHandle_t h, const Descriptors& d, DType dt, Direction dir) {
  Choice c;
  c.math = math_type(dt);
  int count = 0, returned = 0;
  if (dir == Direction::forward) {
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(count));
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, count, &returned, perf.data()));
    if (!pick(perf, returned, dt, c)) c.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  } else if (dir == Direction::backward_data) {
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(count));
    QGRAD_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, count, &returned, perf.data()));
    if (!pick(perf, returned, dt, c)) c.algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  } else {
    QGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(count));
    QGRAD_CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, count, &returned, perf.data()));
    if (!pick(perf, returned, dt, c)) c.algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
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

// The cached choice for this shape (made on first use); sets the
// descriptor's math type to the chosen one.
Choice cached_choice(cudnnHandle_t h, const Descriptors& d, const Conv2dShape& s, DType dt, Direction dir,
                     int device) {
  static std::mutex mutex;
  static std::map<Key, Choice> cache;
  const Key key = key_of(s, dt, dir, device);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) {
      QGRAD_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, it->second.math));
      return it->second;
    }
  }
  const Choice c = choose(h, d, dt, dir);
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, c);
  return c;
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
  cudnnHandle_t h = dnn_handle(dev);
  Descriptors d(s, dt);
  const Choice c = cached_choice(h, d, s, dt, Direction::forward, dev);
  Workspace ws(c.workspace, y.device());
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
  cudnnHandle_t h = dnn_handle(dev);
  Descriptors d(s, dt);
  const Choice c = cached_choice(h, d, s, dt, Direction::backward_data, dev);
  Workspace ws(c.workspace, dx.device());
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
  cudnnHandle_t h = dnn_handle(dev);
  Descriptors d(s, dt);
  const Choice c = cached_choice(h, d, s, dt, Direction::backward_filter, dev);
  Workspace ws(c.workspace, dweight.device());
  const Scaling a(dt);
  QGRAD_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, a.one(), d.x, x.data_ptr(), d.y, dy.data_ptr(), d.conv,
                                                   static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws.ptr,
                                                   c.workspace, a.zero(), d.w, dweight.data_ptr()));
}

}  // namespace qgrad::kernels::cuda
