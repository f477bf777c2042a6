// The CPU backend's Ops class: memory ops and the dense ops live here; KDA, MLA and MoE are forwarded to
// their own files (cpu_kernels.h). Everything is fp32. Elementwise and row-wise ops split rows over
// OpenMP threads, each output element computed by one thread in a fixed order, so results do not depend
// on the thread count; `linear` and `head_matmul` are OpenBLAS GEMMs (deterministic for a fixed thread
// count).
#include "ops/cpu/cpu_ops.h"

#include <chrono>
#include <cstring>

#include "base/half.h"
#include "ops/backend.h"
#include "ops/cpu/cpu_kernels.h"
#include "ops/random_hash.h"

namespace hlm {
namespace {

using cpu::expect_dim;
using cpu::expect_same_shape;
using cpu::expect_tensor;

// Product of the dimensions before the last: the number of rows a last-dimension op runs over.
int64_t leading_rows(const Tensor& t) { return t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1); }

void expect_host(const Tensor& t, const char* op, const char* name) {
  HLM_CHECK(t.defined() && t.device() == Device::kCpu, "{}: {} must be a defined host tensor", op, name);
}

void expect_rank_at_least(const Tensor& t, int rank, const char* op, const char* name) {
  expect_host(t, op, name);
  HLM_CHECK(t.rank() >= rank, "{}: {} must have at least {} dimension(s), got {}", op, name, rank,
            t.describe());
}

// 16-bit float checkpoints and F32 become F32; index tensors are copied unchanged.
Tensor to_f32_copy(const Tensor& t, const char* op) {
  expect_host(t, op, "the input");
  switch (t.dtype()) {
    case DType::kF32:
    case DType::kI32:
    case DType::kI64:
      return t.clone();
    case DType::kBF16:
    case DType::kF16: {
      Tensor out = Tensor::empty(t.shape(), DType::kF32);
      const uint16_t* src = t.data<uint16_t>();
      float* dst = out.data<float>();
      const bool bf16 = t.dtype() == DType::kBF16;
      const int64_t n = t.numel();
#pragma omp parallel for
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
      return out;
    }
    case DType::kU8:
      break;
  }
  HLM_FAIL("{}: {} is not a float or index tensor; the CPU backend has no quantized weights", op,
           t.describe());
}

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::kCpu; }

  Tensor empty(const Shape& shape, DType dtype) override { return Tensor::empty(shape, dtype); }
  Tensor zeros(const Shape& shape, DType dtype) override { return Tensor::zeros(shape, dtype); }
  DType weight_dtype(DType stored) const override { return held_weight_dtype(Device::kCpu, stored); }

  void upload_into(const Tensor& host, Tensor& dst) override {
    expect_host(host, "upload_into", "the source");
    expect_host(dst, "upload_into", "the destination");
    HLM_CHECK(host.shape() == dst.shape(), "upload_into: source {} and destination {} differ in shape",
              host.describe(), dst.describe());
    if (host.dtype() == dst.dtype()) {
      if (host.nbytes() > 0) std::memmove(dst.raw(), host.raw(), host.nbytes());
      return;
    }
    HLM_CHECK(dst.dtype() == DType::kF32, "upload_into: cannot convert {} into {}", host.describe(),
              dst.describe());
    Tensor converted = to_f32_copy(host, "upload_into");
    std::memcpy(dst.raw(), converted.raw(), converted.nbytes());
  }

  Tensor to_host(const Tensor& t) override {
    expect_host(t, "to_host", "t");
    return t.clone();
  }

  void random_fill(Tensor& t, const RandomFill& fill) override {
    expect_host(t, "random_fill", "t");
    const int64_t n = t.numel();
    if (t.dtype() == DType::kU8) {
      HLM_CHECK(fill.byte_lo <= fill.byte_hi, "random_fill: empty byte range [{}, {}]", fill.byte_lo,
                fill.byte_hi);
      uint8_t* p = t.data<uint8_t>();
      const uint64_t span = static_cast<uint64_t>(fill.byte_hi) - fill.byte_lo + 1;
#pragma omp parallel for
      for (int64_t i = 0; i < n; ++i)
        p[i] = static_cast<uint8_t>(fill.byte_lo + hash3(fill.seed, static_cast<uint64_t>(i), 1) % span);
      return;
    }
    HLM_CHECK(t.dtype() == DType::kF32, "random_fill: the CPU backend holds float weights as F32, got {}",
              t.describe());
    float* p = t.data<float>();
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i)
      p[i] = fill.offset + fill.scale * (2.0f * uniform01(fill.seed, static_cast<uint64_t>(i), 0) - 1.0f);
  }

  MemoryInfo memory_info() const override { return cpu::host_memory_info(); }

  // The ops run synchronously here: a section's time is the host time between its marks.
  void enable_sections(bool on) override { sections_on_ = on; }
  void section(const char* label) override {
    if (!sections_on_) return;
    const size_t slot = marks_.mark(label);
    if (times_.size() <= slot) times_.resize(slot + 1);
    times_[slot] = std::chrono::steady_clock::now();
  }
  std::vector<SectionTime> last_sections() override {
    return marks_.sections(
        [&](size_t a, size_t b) { return std::chrono::duration<double>(times_[b] - times_[a]).count(); });
  }

  Tensor to_host_f32(const Tensor& t) override {
    HLM_CHECK(t.defined() && t.dtype() != DType::kI32 && t.dtype() != DType::kI64,
              "to_host_f32: expected a float tensor, got {}",
              t.defined() ? t.describe() : "an undefined tensor");
    return to_f32_copy(t, "to_host_f32");
  }

  void fill_zero(Tensor& t) override {
    expect_host(t, "fill_zero", "t");
    std::memset(t.raw(), 0, t.nbytes());
  }
  void copy(const Tensor& src, Tensor& dst) override {
    expect_host(src, "copy", "src");
    expect_host(dst, "copy", "dst");
    HLM_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(),
              "copy: src and dst must have the same shape and dtype, got {} and {}", src.describe(),
              dst.describe());
    if (src.nbytes() > 0) std::memmove(dst.raw(), src.raw(), src.nbytes());
  }

  Tensor embedding(const Tensor& table, const Tensor& ids) override {
    expect_tensor(table, "embedding", "table", DType::kF32, 2, "[V, D]");
    expect_tensor(ids, "embedding", "ids", DType::kI32, 1, "[T]");
    const int64_t vocab = table.dim(0), d = table.dim(1), t_len = ids.dim(0);
    const int32_t* id = ids.data<int32_t>();
    for (int64_t t = 0; t < t_len; ++t) {
      HLM_CHECK(id[t] >= 0 && id[t] < vocab,
                "embedding: token id {} at position {} is outside the vocabulary [0, {})", id[t], t, vocab);
    }
    Tensor out = Tensor::empty({t_len, d}, DType::kF32);  // [T, D]
    const float* src = table.data<float>();
    float* dst = out.data<float>();
#pragma omp parallel for
    for (int64_t t = 0; t < t_len; ++t) std::memcpy(dst + t * d, src + id[t] * d, d * sizeof(float));
    return out;
  }

  Tensor linear(const Tensor& x, const Tensor& w, bool /*f32_out: always F32 here*/) override {
    expect_tensor(x, "linear", "x", DType::kF32, 2, "[T, in]");
    expect_tensor(w, "linear", "w", DType::kF32, 2, "[out, in]");
    expect_dim(w, 1, x.dim(1), "linear", "w [out, in]", "the input width of x [T, in]");
    const int64_t t_len = x.dim(0), in = x.dim(1), out_dim = w.dim(0);
    Tensor y = Tensor::empty({t_len, out_dim}, DType::kF32);  // [T, out]
    cpu::gemm(t_len, out_dim, in, x.data<float>(), in, w.data<float>(), in, /*trans_b=*/true, y.data<float>(),
              out_dim, /*accumulate=*/false);
    return y;
  }

  Tensor rms_norm(const Tensor& x, const Tensor& w, float eps) override {
    expect_rank_at_least(x, 1, "rms_norm", "x [..., D]");
    HLM_CHECK(x.dtype() == DType::kF32, "rms_norm: x must be F32, got {}", x.describe());
    expect_tensor(w, "rms_norm", "w", DType::kF32, 1, "[D]");
    expect_dim(w, 0, x.dim(-1), "rms_norm", "w [D]", "the last dimension of x");
    const int64_t rows = leading_rows(x), d = x.dim(-1);
    Tensor y = Tensor::empty(x.shape(), DType::kF32);
    const float* xp = x.data<float>();
    const float* wp = w.data<float>();
    float* yp = y.data<float>();
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = xp + r * d;
      const float inv = cpu::inv_rms(xr, d, eps);
      for (int64_t i = 0; i < d; ++i) yp[r * d + i] = wp[i] * (xr[i] * inv);
    }
    return y;
  }

  void add_inplace(Tensor& y, const Tensor& x) override {
    expect_host(y, "add_inplace", "y");
    expect_host(x, "add_inplace", "x");
    HLM_CHECK(y.dtype() == DType::kF32 && x.dtype() == DType::kF32,
              "add_inplace: y and x must be F32, got {} and {}", y.describe(), x.describe());
    expect_same_shape(y, x, "add_inplace", "y", "x", "[...]");
    float* yp = y.data<float>();
    const float* xp = x.data<float>();
    const int64_t n = y.numel();
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) yp[i] += xp[i];
  }

  Tensor glu(const Tensor& gate, const Tensor& up, const ActivationParams& act) override {
    expect_tensor(gate, "glu", "gate", DType::kF32, 2, "[T, I]");
    expect_tensor(up, "glu", "up", DType::kF32, 2, "[T, I]");
    expect_same_shape(gate, up, "glu", "gate", "up", "[T, I]");
    Tensor y = Tensor::empty(gate.shape(), DType::kF32);  // [T, I]
    const float* g = gate.data<float>();
    const float* u = up.data<float>();
    float* yp = y.data<float>();
    const int64_t n = y.numel();
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) yp[i] = cpu::glu_value(g[i], u[i], act);
    return y;
  }

  void sigmoid_gate_inplace(Tensor& y, const Tensor& gate) override {
    expect_host(y, "sigmoid_gate_inplace", "y");
    expect_host(gate, "sigmoid_gate_inplace", "gate");
    HLM_CHECK(y.dtype() == DType::kF32 && gate.dtype() == DType::kF32,
              "sigmoid_gate_inplace: y and gate must be F32, got {} and {}", y.describe(), gate.describe());
    expect_same_shape(y, gate, "sigmoid_gate_inplace", "y", "gate", "[...]");
    float* yp = y.data<float>();
    const float* gp = gate.data<float>();
    const int64_t n = y.numel();
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) yp[i] *= cpu::logistic(gp[i]);
  }
  Tensor attn_res(const std::vector<Tensor>& candidates, const Tensor& proj, const Tensor& norm,
                  float eps) override {
    return cpu::attn_res(candidates, proj, norm, eps);
  }
  Tensor sigmoid(const Tensor& x) override {
    expect_host(x, "sigmoid", "x");
    HLM_CHECK(x.dtype() == DType::kF32, "sigmoid: x must be F32, got {}", x.describe());
    Tensor y = Tensor::empty(x.shape(), DType::kF32);
    const float* xp = x.data<float>();
    float* yp = y.data<float>();
    const int64_t n = x.numel();
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) yp[i] = cpu::logistic(xp[i]);
    return y;
  }

  Tensor head_matmul(const Tensor& x, const Tensor& w, bool w_transposed) override {
    expect_tensor(x, "head_matmul", "x", DType::kF32, 3, "[T, H, a]");
    expect_tensor(w, "head_matmul", "w", DType::kF32, 3, w_transposed ? "[H, b, a]" : "[H, a, b]");
    expect_dim(w, 0, x.dim(1), "head_matmul", "w", "the head count of x [T, H, a]");
    expect_dim(w, w_transposed ? 2 : 1, x.dim(2), "head_matmul", "w", "the last dimension of x [T, H, a]");
    const int64_t t_len = x.dim(0), heads = x.dim(1), a = x.dim(2), b = w_transposed ? w.dim(1) : w.dim(2);
    Tensor y = Tensor::empty({t_len, heads, b}, DType::kF32);  // [T, H, b]
    // One GEMM per head: rows of head h are strided by H·a in x and H·b in y.
    for (int64_t h = 0; h < heads; ++h) {
      cpu::gemm(t_len, b, a, x.data<float>() + h * a, heads * a, w.data<float>() + h * a * b,
                w_transposed ? a : b, w_transposed, y.data<float>() + h * b, heads * b, /*accumulate=*/false);
    }
    return y;
  }

  Tensor slice_last(const Tensor& x, int64_t begin, int64_t end) override {
    expect_rank_at_least(x, 1, "slice_last", "x [..., C]");
    const int64_t cols = x.dim(-1);
    HLM_CHECK(0 <= begin && begin <= end && end <= cols,
              "slice_last: columns [{}, {}) are outside [0, {}) of {}", begin, end, cols, x.describe());
    Shape shape = x.shape();
    shape.back() = end - begin;
    Tensor y = Tensor::empty(shape, x.dtype());  // [..., end - begin]
    const size_t elem = dtype_size(x.dtype());
    const int64_t rows = leading_rows(x);
    const auto* src = static_cast<const std::byte*>(x.raw());
    auto* dst = static_cast<std::byte*>(y.raw());
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + r * (end - begin) * elem, src + (r * cols + begin) * elem, (end - begin) * elem);
    }
    return y;
  }

  Tensor concat_last(const Tensor& a, const Tensor& b) override {
    expect_rank_at_least(a, 1, "concat_last", "a [..., Ca]");
    expect_rank_at_least(b, 1, "concat_last", "b [..., Cb]");
    Shape lead_a(a.shape().begin(), a.shape().end() - 1), lead_b(b.shape().begin(), b.shape().end() - 1);
    HLM_CHECK(lead_a == lead_b && a.dtype() == b.dtype(),
              "concat_last: a and b must agree in dtype and all but the last dimension, got {} and {}",
              a.describe(), b.describe());
    const int64_t ca = a.dim(-1), cb = b.dim(-1);
    Shape shape = a.shape();
    shape.back() = ca + cb;
    Tensor y = Tensor::empty(shape, a.dtype());  // [..., Ca + Cb]
    const size_t elem = dtype_size(a.dtype());
    const int64_t rows = shape_numel(lead_a);
    const auto* pa = static_cast<const std::byte*>(a.raw());
    const auto* pb = static_cast<const std::byte*>(b.raw());
    auto* dst = static_cast<std::byte*>(y.raw());
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + r * (ca + cb) * elem, pa + r * ca * elem, ca * elem);
      std::memcpy(dst + (r * (ca + cb) + ca) * elem, pb + r * cb * elem, cb * elem);
    }
    return y;
  }

  Tensor gather_rows(const Tensor& x, const Tensor& rows) override {
    expect_rank_at_least(x, 1, "gather_rows", "x [T, ...]");
    expect_tensor(rows, "gather_rows", "rows", DType::kI32, 1, "[N]");
    const int64_t t_len = x.dim(0), n = rows.dim(0);
    const int32_t* r = rows.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      HLM_CHECK(r[i] >= 0 && r[i] < t_len,
                "gather_rows: row index {} at position {} is outside [0, {}) of {}", r[i], i, t_len,
                x.describe());
    }
    Shape shape = x.shape();
    shape[0] = n;
    Tensor y = Tensor::empty(shape, x.dtype());  // [N, ...]
    const size_t row_bytes = t_len == 0 ? 0 : x.nbytes() / static_cast<size_t>(t_len);
    const auto* src = static_cast<const std::byte*>(x.raw());
    auto* dst = static_cast<std::byte*>(y.raw());
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * row_bytes, src + r[i] * row_bytes, row_bytes);
    return y;
  }

  Tensor transpose01(const Tensor& x) override {
    expect_rank_at_least(x, 2, "transpose01", "x [A, B, ...]");
    const int64_t a = x.dim(0), b = x.dim(1);
    Shape shape = x.shape();
    std::swap(shape[0], shape[1]);
    Tensor y = Tensor::empty(shape, x.dtype());  // [B, A, ...]
    const size_t inner = a * b == 0 ? 0 : x.nbytes() / static_cast<size_t>(a * b);
    const auto* src = static_cast<const std::byte*>(x.raw());
    auto* dst = static_cast<std::byte*>(y.raw());
#pragma omp parallel for collapse(2)
    for (int64_t i = 0; i < a; ++i) {
      for (int64_t j = 0; j < b; ++j)
        std::memcpy(dst + (j * a + i) * inner, src + (i * b + j) * inner, inner);
    }
    return y;
  }

  Tensor short_conv(const Tensor& x, const Tensor& w, const SeqBatch& seqs, Tensor& state) override {
    return cpu::short_conv(x, w, seqs, state);
  }
  Tensor kda_gate(const Tensor& graw, const Tensor& a_log, const Tensor& dt_bias,
                  float lower_bound) override {
    return cpu::kda_gate(graw, a_log, dt_bias, lower_bound);
  }
  Tensor kda_prefill(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     const SeqBatch& seqs, Tensor& state) override {
    return cpu::kda_prefill(q, k, v, g, beta, seqs, state);
  }
  Tensor kda_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                    const SeqBatch& seqs, Tensor& state) override {
    return cpu::kda_decode(q, k, v, g, beta, seqs, state);
  }
  Tensor gated_rms_norm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps) override {
    return cpu::gated_rms_norm(o, gate, w, eps);
  }

  void cache_write(const Tensor& entries, const Tensor& slots, Tensor& cache) override {
    cpu::cache_write(entries, slots, cache);
  }
  void mla_attention(const Tensor& q, const Tensor& cache, const Tensor& page_table, const MlaBatch& seqs,
                     const Tensor& kv_len, float scale, int64_t v_dim, Tensor& out, Tensor& stats) override {
    cpu::mla_attention(q, cache, page_table, seqs, kv_len, scale, v_dim, out, stats);
  }
  Tensor lse_combine(const Tensor& parts, const Tensor& stats) override {
    return cpu::lse_combine(parts, stats);
  }
  Tensor mla_gather_keys(const Tensor& cache, const Tensor& page_table, const MlaSeq& seq, int64_t key_begin,
                         int64_t count) override {
    return cpu::mla_gather_keys(cache, page_table, seq, key_begin, count);
  }
  void mla_expanded_attention(const Tensor& q, const Tensor& k_nope, const Tensor& v, const Tensor& keys,
                              int64_t latent, const Tensor& kv_len, int64_t key_begin, float scale,
                              bool merge, Tensor& out, Tensor& stats) override {
    cpu::mla_expanded_attention(q, k_nope, v, keys, latent, kv_len, key_begin, scale, merge, out, stats);
  }

  void moe_route(const Tensor& x, const Tensor& w, const Tensor& bias, const RouterParams& p, Tensor& idx,
                 Tensor& weights) override {
    cpu::moe_route(x, w, bias, p, idx, weights);
  }
  Tensor moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertWeights& experts,
                     int64_t expert_begin, const ActivationParams& act) override {
    return cpu::moe_experts(x, idx, weights, experts, expert_begin, act);
  }

  std::vector<int32_t> sample(const Tensor& logits, const std::vector<SampleParams>& rows) override {
    return cpu::sample(logits, rows);
  }

 private:
  bool sections_on_ = false;
  SectionMarks marks_;
  std::vector<std::chrono::steady_clock::time_point> times_;  // one per mark slot
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

}  // namespace hlm
