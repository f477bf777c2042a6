#include "ops/cuda/cuda_context.h"

#include <algorithm>
#include <cstring>

#include "base/log.h"

namespace hlm::cuda {

namespace {
constexpr size_t kGemmWorkspace = size_t{32} << 20;  // cuBLASLt's recommendation for Hopper
constexpr size_t kPinnedHalf = size_t{64} << 20;     // one upload chunk
}  // namespace

CudaContext::CudaContext(int device) : device_(device) {
  HLM_CUDA_CHECK(cudaSetDevice(device));
  HLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  HLM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
  current_ = stream_;
  HLM_CUDA_CHECK(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming));
  HLM_CUDA_CHECK(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming));
  HLM_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  HLM_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  gemm_workspace_bytes_ = kGemmWorkspace;
  HLM_CUDA_CHECK(cudaMalloc(&gemm_workspace_, gemm_workspace_bytes_));
  HLM_CUDA_CHECK(cudaMalloc(&side_gemm_workspace_, gemm_workspace_bytes_));
  arena_ = std::make_unique<DeviceArena>(0);
}

CudaContext::~CudaContext() {
  cudaStreamSynchronize(side_stream_);
  cudaStreamSynchronize(stream_);
  *alive_ = false;
  arena_.reset();
  for (cudaEvent_t e : pinned_free_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (gemm_workspace_ != nullptr) cudaFree(gemm_workspace_);
  if (side_gemm_workspace_ != nullptr) cudaFree(side_gemm_workspace_);
  for (cudaEvent_t e : {side_fork_, side_done_}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (side_stream_ != nullptr) cudaStreamDestroy(side_stream_);
  if (cublaslt_ != nullptr) cublasLtDestroy(cublaslt_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Tensor CudaContext::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) HLM_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  std::shared_ptr<void> storage;
  if (in_step_) {
    storage = arena_->allocate(bytes);
  } else {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (err != cudaSuccess) {
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      HLM_FAIL("GPU out of memory: cannot allocate {} for a {}{} tensor ({} free of {}): {}",
               human_bytes(static_cast<int64_t>(bytes)), dtype_name(dtype), shape_str(shape),
               human_bytes(static_cast<int64_t>(free)), human_bytes(static_cast<int64_t>(total)),
               cudaGetErrorString(err));
    }
    // cudaFree does not wait for kernels still queued on a non-blocking stream: an op's temporaries, freed
    // as the op returns, could be read after their memory was gone (compute-sanitizer on an H200 caught
    // the routed experts' down GEMM reading one, with 1,024 local experts). So the deleter first waits for
    // this context's stream, which every op of the context runs on (not during a capture, which a wait
    // would end).
    std::shared_ptr<bool> alive = alive_;
    cudaStream_t stream = stream_;
    storage = std::shared_ptr<void>(p, [alive, stream](void* q) {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (*alive && cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
          capture == cudaStreamCaptureStatusNone) {
        cudaStreamSynchronize(stream);
      }
      cudaFree(q);
    });
  }
  void* data = storage.get();
  return Tensor::wrap(data, shape, dtype, Device::kCuda, std::move(storage));
}

Tensor CudaContext::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.nbytes() > 0) HLM_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), current_));
  return t;
}

void CudaContext::begin_step() {
  HLM_CHECK(!in_step_, "begin_step inside a step");
  in_step_ = true;
}

void CudaContext::end_step() {
  in_step_ = false;
  HLM_CHECK(side_ == Side::kNone, "end_step with side work that was never joined (Ops::join_side)");
  HLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaContext::begin_side() {
  HLM_CHECK(side_ == Side::kNone, "begin_side: the previous side work was not joined");
  if (!in_step_) return;
  arena_->hold_releases();
  HLM_CUDA_CHECK(cudaEventRecord(side_fork_, stream_));
  HLM_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, side_fork_, 0));
  current_ = side_stream_;
  side_ = Side::kOpen;
}

void CudaContext::end_side() {
  if (side_ == Side::kNone && !in_step_) return;
  HLM_CHECK(side_ == Side::kOpen, "end_side without begin_side");
  HLM_CUDA_CHECK(cudaEventRecord(side_done_, side_stream_));
  current_ = stream_;
  side_ = Side::kUnjoined;
}

void CudaContext::join_side() {
  if (side_ == Side::kNone && !in_step_) return;
  HLM_CHECK(side_ == Side::kUnjoined, "join_side without end_side");
  HLM_CUDA_CHECK(cudaStreamWaitEvent(stream_, side_done_, 0));
  arena_->resume_releases();
  side_ = Side::kNone;
}

void CudaContext::reserve_workspace(int64_t bytes) {
  HLM_CHECK(!in_step_ && arena_->in_use() == 0, "the step workspace can only be resized between steps");
  arena_.reset();
  arena_ = std::make_unique<DeviceArena>(static_cast<size_t>(bytes));
}

void CudaContext::upload(const void* host, void* device, size_t bytes) {
  if (bytes == 0) return;
  if (pinned_ == nullptr) {
    HLM_CUDA_CHECK(cudaMallocHost(&pinned_, 2 * kPinnedHalf));
    pinned_bytes_ = 2 * kPinnedHalf;
    for (cudaEvent_t& e : pinned_free_) HLM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t e : pinned_free_) HLM_CUDA_CHECK(cudaEventRecord(e, current_));
  }
  // Inside a captured graph a host buffer's contents at replay time are what counts, so graph inputs
  // are copied from pageable memory synchronously (they are small); outside, chunks go through the two
  // pinned halves so that filling one overlaps the DMA of the other.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  HLM_CUDA_CHECK(cudaStreamIsCapturing(current_, &capture));
  HLM_CHECK(capture == cudaStreamCaptureStatusNone, "host-to-device upload while capturing a CUDA graph");
  const auto* src = static_cast<const std::byte*>(host);
  auto* dst = static_cast<std::byte*>(device);
  for (size_t done = 0, half = 0; done < bytes; half ^= 1) {
    const size_t n = std::min(kPinnedHalf, bytes - done);
    HLM_CUDA_CHECK(cudaEventSynchronize(pinned_free_[half]));
    std::byte* stage = static_cast<std::byte*>(pinned_) + half * kPinnedHalf;
    std::memcpy(stage, src + done, n);
    HLM_CUDA_CHECK(cudaMemcpyAsync(dst + done, stage, n, cudaMemcpyHostToDevice, current_));
    HLM_CUDA_CHECK(cudaEventRecord(pinned_free_[half], current_));
    done += n;
  }
}

void expect_cuda(const Tensor& t, const char* op, const char* name, std::initializer_list<DType> dtypes,
                 int rank, const char* layout) {
  HLM_CHECK(t.defined(), "{}: {} must be a {} tensor, got an undefined tensor", op, name, layout);
  HLM_CHECK(t.device() == Device::kCuda, "{}: {} must be a CUDA tensor, got a host tensor {}", op, name,
            t.describe());
  bool ok = false;
  std::string allowed;
  for (DType d : dtypes) {
    ok = ok || t.dtype() == d;
    allowed += (allowed.empty() ? "" : "/") + std::string(dtype_name(d));
  }
  HLM_CHECK(ok && (rank < 0 || t.rank() == rank), "{}: {} must be {}{}, got {}", op, name, allowed, layout,
            t.describe());
}

void expect_dim(const Tensor& t, int dim, int64_t expected, const char* op, const char* name,
                const char* meaning) {
  HLM_CHECK(t.dim(dim) == expected, "{}: dimension {} of {} is {} and must be {} ({}), got {}", op, dim, name,
            t.dim(dim), expected, meaning, t.describe());
}

void expect_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* a_name,
                       const char* b_name) {
  HLM_CHECK(a.shape() == b.shape(), "{}: {} and {} must have the same shape, got {} and {}", op, a_name,
            b_name, a.describe(), b.describe());
}

void prepare_output(CudaContext& ctx, Tensor& out, const Shape& shape, DType dtype, const char* op,
                    const char* name) {
  if (!out.defined()) {
    out = ctx.empty(shape, dtype);
    return;
  }
  HLM_CHECK(out.device() == Device::kCuda && out.dtype() == dtype && out.shape() == shape,
            "{}: output {} must be a CUDA {}{} (or undefined), got {}", op, name, dtype_name(dtype),
            shape_str(shape), out.describe());
}

}  // namespace hlm::cuda
