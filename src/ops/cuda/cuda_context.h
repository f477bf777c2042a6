// CudaContext: what every CUDA op needs besides its arguments: the device and its stream, where tensors
// come from (a step-scoped arena inside begin_step/end_step, cudaMalloc outside), the cuBLASLt handle and
// its workspace, and argument checks that name the op and the tensor. One per CudaOps; ops run in order on
// its stream, which is also the stream graphs are captured from, except inside a side region of a step
// (begin_side .. join_side), whose ops run on a second stream concurrently with the main stream's.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>

#include "base/tensor.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_arena.h"

namespace hlm::cuda {

using bf16 = __nv_bfloat16;

class CudaContext {
 public:
  explicit CudaContext(int device);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  // The stream ops enqueue on: the main stream, or the side stream between begin_side() and end_side().
  cudaStream_t stream() const { return current_; }
  int sm_count() const { return sm_count_; }

  // A device tensor: from the step arena inside a step, from cudaMalloc otherwise. Never zeroed.
  Tensor empty(const Shape& shape, DType dtype);
  Tensor zeros(const Shape& shape, DType dtype);  // zeroed on the stream

  void begin_step();
  void end_step();
  // Ops::begin_side/end_side/join_side inside a step: the side stream starts after the main stream's work
  // so far, and the main stream waits for the side's work at join_side(). Arena releases are held from
  // begin_side() to join_side(). Outside a step they change nothing (the ops stay on the main stream).
  void begin_side();
  void end_side();
  void join_side();
  bool in_step() const { return in_step_; }
  void reserve_workspace(int64_t bytes);
  DeviceArena& arena() { return *arena_; }

  cublasLtHandle_t cublaslt() const { return cublaslt_; }
  // One per stream: cuBLASLt calls on the two streams may run at once.
  void* gemm_workspace() const { return current_ == side_stream_ ? side_gemm_workspace_ : gemm_workspace_; }
  size_t gemm_workspace_bytes() const { return gemm_workspace_bytes_; }

  // Pinned host buffers for uploads: two halves used alternately, so the copy of one chunk into pinned
  // memory overlaps the DMA of the previous one.
  void upload(const void* host, void* device, size_t bytes);

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;  // main
  cudaStream_t side_stream_ = nullptr;
  cudaStream_t current_ = nullptr;
  enum class Side { kNone, kOpen, kUnjoined } side_ = Side::kNone;
  cudaEvent_t side_fork_ = nullptr, side_done_ = nullptr;
  void* side_gemm_workspace_ = nullptr;
  int sm_count_ = 0;
  bool in_step_ = false;
  std::unique_ptr<DeviceArena> arena_;
  cublasLtHandle_t cublaslt_ = nullptr;
  void* gemm_workspace_ = nullptr;
  size_t gemm_workspace_bytes_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // false once destroyed (tensor deleters)
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  cudaEvent_t pinned_free_[2] = {nullptr, nullptr};
};

// --- argument checks (throw hlm::Error naming the op and the tensor) -------------------------------------
// t must be a defined CUDA tensor of one of `dtypes` and of rank `rank` (-1: any); `layout` spells the
// expected shape for the message, e.g. "[T, H, K]".
void expect_cuda(const Tensor& t, const char* op, const char* name, std::initializer_list<DType> dtypes,
                 int rank, const char* layout);
void expect_dim(const Tensor& t, int dim, int64_t expected, const char* op, const char* name,
                const char* meaning);
void expect_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* a_name,
                       const char* b_name);
// An output passed by reference: allocated when undefined, otherwise checked (device, shape, dtype).
void prepare_output(CudaContext& ctx, Tensor& out, const Shape& shape, DType dtype, const char* op,
                    const char* name);

// Rows of a tensor over its last dimension (numel / last dim; 0 for an empty tensor).
inline int64_t leading_rows(const Tensor& t) { return t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1); }

// Whether a device pointer is a multiple of `bytes` (a vector load's width), and the 16-byte case.
inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
inline bool aligned16(const void* p) { return aligned_to(p, 16); }

// Grid size for `n` items at `per_block` items per block.
inline unsigned blocks_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace hlm::cuda
