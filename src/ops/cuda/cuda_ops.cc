// CudaOps: the Ops interface on one GPU. Memory ops, uploads and graph capture live here; every compute op
// forwards to its implementation in cuda_kernels.h. Weights keep their stored dtype (BF16; F32 where the
// checkpoint stores F32), activations are BF16 with F32 accumulation, and the residual stream, KDA state,
// gates, router and logits are F32 (docs/architecture.md "Numerics").
#include "ops/cuda/cuda_ops.h"

#include <cstring>

#include <cuda_profiler_api.h>

#include "base/half.h"
#include "base/log.h"
#include "ops/backend.h"
#include "ops/cuda/cuda_kernels.h"
#include "ops/cuda/kernel_trace.h"

namespace hlm::cuda {

namespace {

class CudaGraph final : public StepGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaGraph_t graph, cudaStream_t stream)
      : exec_(exec), graph_(graph), stream_(stream) {}
  ~CudaGraph() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void replay() override { HLM_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaGraph_t graph_;
  cudaStream_t stream_;
};

// A host tensor converted element by element to `to` (F32 <-> BF16, F16 -> BF16/F32).
Tensor convert_host(const Tensor& host, DType to) {
  Tensor out = Tensor::empty(host.shape(), to);
  const int64_t n = host.numel();
  auto read = [&](int64_t i) -> float {
    switch (host.dtype()) {
      case DType::kF32:
        return static_cast<const float*>(host.raw())[i];
      case DType::kBF16:
        return bf16_to_f32(static_cast<const uint16_t*>(host.raw())[i]);
      case DType::kF16:
        return f16_to_f32(static_cast<const uint16_t*>(host.raw())[i]);
      default:
        HLM_FAIL("upload: cannot convert {} to {}", host.describe(), dtype_name(to));
    }
  };
  if (to == DType::kF32) {
    float* dst = static_cast<float*>(out.raw());
    for (int64_t i = 0; i < n; ++i) dst[i] = read(i);
  } else if (to == DType::kBF16) {
    uint16_t* dst = static_cast<uint16_t*>(out.raw());
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(read(i));
  } else {
    HLM_FAIL("upload: cannot convert {} to {}", host.describe(), dtype_name(to));
  }
  return out;
}

class CudaOps final : public Ops {
 public:
  explicit CudaOps(int device) : ctx_(device) {}
  ~CudaOps() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::kCuda; }
  Tensor empty(const Shape& shape, DType dtype) override { return ctx_.empty(shape, dtype); }
  Tensor zeros(const Shape& shape, DType dtype) override { return ctx_.zeros(shape, dtype); }
  DType weight_dtype(DType stored) const override { return held_weight_dtype(Device::kCuda, stored); }

  void upload_into(const Tensor& host, Tensor& dst) override {
    HLM_CHECK(host.defined() && host.device() == Device::kCpu,
              "upload_into: the source must be a host tensor");
    expect_cuda(dst, "upload_into", "the destination", {dst.dtype()}, -1, "tensor");
    HLM_CHECK(host.numel() == dst.numel(), "upload_into: source {} and destination {} differ in size",
              host.describe(), dst.describe());
    const Tensor src = host.dtype() == dst.dtype() ? host : convert_host(host, dst.dtype());
    ctx_.upload(src.raw(), dst.raw(), src.nbytes());
  }

  Tensor to_host(const Tensor& t) override {
    expect_cuda(t, "to_host", "t", {t.dtype()}, -1, "tensor");
    Tensor host = Tensor::empty(t.shape(), t.dtype());
    if (t.nbytes() > 0) {
      HLM_CUDA_CHECK(cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, ctx_.stream()));
    }
    HLM_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
    return host;
  }

  Tensor to_host_f32(const Tensor& t) override {
    expect_cuda(t, "to_host_f32", "t", {DType::kF32, DType::kBF16}, -1, "float tensor");
    if (t.dtype() == DType::kF32) return to_host(t);
    return convert_host(to_host(t), DType::kF32);
  }

  void copy(const Tensor& src, Tensor& dst) override {
    expect_cuda(src, "copy", "src", {src.dtype()}, -1, "tensor");
    expect_cuda(dst, "copy", "dst", {src.dtype()}, -1, "tensor of src's dtype");
    HLM_CHECK(src.shape() == dst.shape(), "copy: src {} and dst {} differ in shape", src.describe(),
              dst.describe());
    if (src.nbytes() > 0) {
      HLM_CUDA_CHECK(
          cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, ctx_.stream()));
    }
  }

  void fill_zero(Tensor& t) override {
    expect_cuda(t, "fill_zero", "t", {t.dtype()}, -1, "tensor");
    if (t.nbytes() > 0) HLM_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), ctx_.stream()));
  }

  void random_fill(Tensor& t, const RandomFill& fill) override { cuda::random_fill(ctx_, t, fill); }

  MemoryInfo memory_info() const override {
    size_t free = 0, total = 0;
    HLM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return MemoryInfo{static_cast<int64_t>(free), static_cast<int64_t>(total)};
  }

  void begin_step() override { ctx_.begin_step(); }
  void begin_side() override { ctx_.begin_side(); }
  void end_side() override { ctx_.end_side(); }
  void join_side() override { ctx_.join_side(); }
  void end_step() override { ctx_.end_step(); }
  void reserve_workspace(int64_t bytes) override { ctx_.reserve_workspace(bytes); }
  void synchronize() override { HLM_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream())); }
  void* native_stream() override { return ctx_.stream(); }
  void profiler_recording(bool on) override {
    HLM_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
    HLM_CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop());
    if (trace_path_.empty()) return;
    if (on) {
      KernelTrace::get().start();
    } else {
      write_kernel_trace(trace_path_, KernelTrace::get().stop());
    }
  }
  void trace_kernels(const std::string& path) override {
    KernelTrace::get();  // fails here, before any step, when CUPTI cannot be loaded
    trace_path_ = path;
  }

  // A mark is an event recorded on the stream; inside a capture it becomes an event-record node
  // (cudaEventRecordExternal), which records again on every replay.
  void enable_sections(bool on) override { sections_on_ = on; }
  void section(const char* label) override {
    if (!sections_on_) return;
    const size_t slot = marks_.mark(label);
    while (events_.size() <= slot) {
      cudaEvent_t e = nullptr;
      HLM_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    HLM_CUDA_CHECK(cudaStreamIsCapturing(ctx_.stream(), &capture));
    // The external flag is refused outside a capture (cudaErrorIllegalState).
    HLM_CUDA_CHECK(capture == cudaStreamCaptureStatusActive
                       ? cudaEventRecordWithFlags(events_[slot], ctx_.stream(), cudaEventRecordExternal)
                       : cudaEventRecord(events_[slot], ctx_.stream()));
  }
  std::vector<SectionTime> last_sections() override {
    if (marks_.complete() == 0) return {};
    HLM_CUDA_CHECK(cudaEventSynchronize(events_[marks_.complete() - 1]));
    return marks_.sections([&](size_t a, size_t b) {
      float ms = 0.0f;
      HLM_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[a], events_[b]));
      return 1e-3 * ms;
    });
  }

  std::unique_ptr<StepGraph> capture(const std::function<void()>& body) override {
    cudaGraph_t graph = nullptr;
    HLM_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream(), cudaStreamCaptureModeThreadLocal));
    try {
      body();
    } catch (...) {
      cudaStreamEndCapture(ctx_.stream(), &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    HLM_CUDA_CHECK(cudaStreamEndCapture(ctx_.stream(), &graph));
    size_t nodes = 0;
    HLM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    spdlog::debug("captured a CUDA graph of {} nodes", nodes);
    cudaGraphExec_t exec = nullptr;
    HLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    return std::make_unique<CudaGraph>(exec, graph, ctx_.stream());
  }

  Tensor embedding(const Tensor& table, const Tensor& ids) override {
    return cuda::embedding(ctx_, table, ids);
  }
  Tensor linear(const Tensor& x, const Tensor& w, bool f32_out) override {
    return cuda::linear(ctx_, x, w, f32_out);
  }
  Tensor linear_glu(const Tensor& x, const Tensor& gate_up, const ActivationParams& act) override {
    return cuda::linear_glu(ctx_, x, gate_up, act);
  }
  Tensor rms_norm(const Tensor& x, const Tensor& w, float eps) override {
    return cuda::rms_norm(ctx_, x, w, eps);
  }
  Tensor add_rms_norm(Tensor& h, const Tensor& a, const Tensor& w, float eps) override {
    return cuda::add_rms_norm(ctx_, h, a, w, eps);
  }
  void add_inplace(Tensor& y, const Tensor& x) override { cuda::add_inplace(ctx_, y, x); }
  Tensor glu(const Tensor& gate, const Tensor& up, const ActivationParams& act) override {
    return cuda::glu(ctx_, gate, up, act);
  }
  Tensor glu_packed(const Tensor& gate_up, const ActivationParams& act) override {
    return cuda::glu_packed(ctx_, gate_up, act);
  }
  Tensor sigmoid(const Tensor& x) override { return cuda::sigmoid(ctx_, x); }
  void sigmoid_gate_inplace(Tensor& y, const Tensor& gate) override {
    cuda::sigmoid_gate_inplace(ctx_, y, gate);
  }
  Tensor attn_res(const std::vector<Tensor>& candidates, const Tensor& proj, const Tensor& norm,
                  float eps) override {
    return cuda::attn_res(ctx_, candidates, proj, norm, eps);
  }
  Tensor head_matmul(const Tensor& x, const Tensor& w, bool w_transposed) override {
    return cuda::head_matmul(ctx_, x, w, w_transposed);
  }
  Tensor mla_absorb_queries(const Tensor& q, const Tensor& w_uk) override {
    return cuda::mla_absorb_queries_applies(q, w_uk) ? cuda::mla_absorb_queries(ctx_, q, w_uk)
                                                     : Ops::mla_absorb_queries(q, w_uk);
  }
  Tensor slice_last(const Tensor& x, int64_t begin, int64_t end) override {
    return cuda::slice_last(ctx_, x, begin, end);
  }
  Tensor concat_last(const Tensor& a, const Tensor& b) override { return cuda::concat_last(ctx_, a, b); }
  Tensor gather_rows(const Tensor& x, const Tensor& rows) override {
    return cuda::gather_rows(ctx_, x, rows);
  }
  Tensor transpose01(const Tensor& x) override { return cuda::transpose01(ctx_, x); }

  Tensor short_conv(const Tensor& x, const Tensor& w, const SeqBatch& seqs, Tensor& state) override {
    return cuda::short_conv(ctx_, x, w, seqs, state);
  }
  Tensor short_conv_planes(const Tensor& x, const Tensor& w, const SeqBatch& seqs, Tensor& state,
                           int64_t planes) override {
    return cuda::short_conv(ctx_, x, w, seqs, state, planes);
  }
  Tensor kda_gate(const Tensor& graw, const Tensor& a_log, const Tensor& dt_bias,
                  float lower_bound) override {
    return cuda::kda_gate(ctx_, graw, a_log, dt_bias, lower_bound);
  }
  Tensor kda_prefill(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     const SeqBatch& seqs, Tensor& state) override {
    return cuda::kda_prefill(ctx_, q, k, v, g, beta, seqs, state);
  }
  Tensor kda_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                    const SeqBatch& seqs, Tensor& state) override {
    return cuda::kda_decode(ctx_, q, k, v, g, beta, seqs, state);
  }
  Tensor gated_rms_norm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps) override {
    return cuda::gated_rms_norm(ctx_, o, gate, w, eps);
  }
  Tensor kda_decode_gated(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& graw,
                          const Tensor& beta_logits, const Tensor& out_gate, const KdaHeadParams& hp,
                          const SeqBatch& seqs, Tensor& state) override {
    Tensor out;
    if (cuda::kda_decode_gated(ctx_, q, k, v, graw, beta_logits, out_gate, hp, seqs, state, out)) return out;
    return Ops::kda_decode_gated(q, k, v, graw, beta_logits, out_gate, hp, seqs, state);
  }
  Tensor kda_decode_layer(const Tensor& proj, const KdaProjColumns& cols, const Tensor& conv_w,
                          const Tensor& f_b, const Tensor& g_b, const KdaHeadParams& hp, const SeqBatch& seqs,
                          Tensor& conv_state, Tensor& state) override {
    Tensor out;
    if (cuda::kda_decode_layer(ctx_, proj, cols, conv_w, f_b, g_b, hp, seqs, conv_state, state, out))
      return out;
    return Ops::kda_decode_layer(proj, cols, conv_w, f_b, g_b, hp, seqs, conv_state, state);
  }

  void mla_cache_write(const Tensor& ckv, int64_t latent, const Tensor& norm_w, float eps,
                       const Tensor& slots, Tensor& cache) override {
    cuda::mla_cache_write(ctx_, ckv, latent, norm_w, eps, slots, cache);
  }
  Tensor mla_write_and_absorb(const Tensor& ckv, int64_t latent, const Tensor& norm_w, float eps,
                              const Tensor& slots, Tensor& cache, const Tensor& q,
                              const Tensor& w_uk) override {
    return cuda::mla_absorb_queries_applies(q, w_uk)
               ? cuda::mla_write_and_absorb(ctx_, ckv, latent, norm_w, eps, slots, cache, q, w_uk)
               : Ops::mla_write_and_absorb(ckv, latent, norm_w, eps, slots, cache, q, w_uk);
  }
  void cache_write(const Tensor& entries, const Tensor& slots, Tensor& cache) override {
    cuda::cache_write(ctx_, entries, slots, cache);
  }
  void mla_attention(const Tensor& q, const Tensor& cache, const Tensor& page_table, const MlaBatch& seqs,
                     const Tensor& kv_len, float scale, int64_t v_dim, Tensor& out, Tensor& stats) override {
    cuda::mla_attention(ctx_, q, cache, page_table, seqs, kv_len, scale, v_dim, out, stats);
  }
  Tensor lse_combine(const Tensor& parts, const Tensor& stats) override {
    return cuda::lse_combine(ctx_, parts, stats);
  }
  Tensor mla_gather_keys(const Tensor& cache, const Tensor& page_table, const MlaSeq& seq, int64_t key_begin,
                         int64_t count) override {
    return cuda::mla_gather_keys(ctx_, cache, page_table, seq, key_begin, count);
  }
  void mla_expanded_attention(const Tensor& q, const Tensor& k_nope, const Tensor& v, const Tensor& keys,
                              int64_t latent, const Tensor& kv_len, int64_t key_begin, float scale,
                              bool merge, Tensor& out, Tensor& stats) override {
    cuda::mla_expanded_attention(ctx_, q, k_nope, v, keys, latent, kv_len, key_begin, scale, merge, out,
                                 stats);
  }

  void moe_route(const Tensor& x, const Tensor& w, const Tensor& bias, const RouterParams& p, Tensor& idx,
                 Tensor& weights) override {
    cuda::moe_route(ctx_, x, w, bias, p, idx, weights);
  }
  Tensor moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertWeights& experts,
                     int64_t expert_begin, const ActivationParams& act) override {
    return cuda::moe_experts(ctx_, x, idx, weights, experts, expert_begin, act);
  }
  Tensor moe_experts_add(const Tensor& x, const Tensor& idx, const Tensor& weights,
                         const ExpertWeights& experts, int64_t expert_begin, const ActivationParams& act,
                         const Tensor& addend) override {
    return cuda::moe_experts(ctx_, x, idx, weights, experts, expert_begin, act, &addend);
  }

  std::vector<int32_t> sample(const Tensor& logits, const std::vector<SampleParams>& rows) override {
    return cuda::sample(ctx_, logits, rows);
  }

 private:
  CudaContext ctx_;
  bool sections_on_ = false;
  std::string trace_path_;  // trace_kernels
  SectionMarks marks_;
  std::vector<cudaEvent_t> events_;  // one per mark slot
};

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why != nullptr) *why = fmt::format("no CUDA device is usable: {}", cudaGetErrorString(err));
    cudaGetLastError();  // clear the sticky-free error state of the failed query
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "no CUDA device is visible";
  return n;
}

std::unique_ptr<Ops> make_cuda_ops(int device) { return std::make_unique<CudaOps>(device); }

}  // namespace hlm::cuda
