// Shared helpers of the CPU backend (see cpu_kernels.h): argument checks with messages that name the op
// and the tensor, the ragged-batch validation, the KDA l2norm and the one place that calls cblas_sgemm.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <string>

#include "ops/cpu/cpu_kernels.h"

namespace hlm::cpu {

void expect_tensor(const Tensor& t, const char* op, const char* name, DType dtype, int rank,
                   const char* layout) {
  HLM_CHECK(t.defined(), "{}: {} must be {}{}, got an undefined tensor", op, name, dtype_name(dtype), layout);
  HLM_CHECK(t.device() == Device::kCpu, "{}: {} must be a host tensor for the CPU backend", op, name);
  HLM_CHECK(t.dtype() == dtype && t.rank() == rank, "{}: {} must be {}{}, got {}", op, name,
            dtype_name(dtype), layout, t.describe());
}

void expect_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* a_name,
                       const char* b_name, const char* layout) {
  HLM_CHECK(a.shape() == b.shape(), "{}: {} {} and {} must have the same shape, got {} and {}", op, a_name,
            layout, b_name, a.describe(), b.describe());
}

void expect_dim(const Tensor& t, int dim, int64_t expected, const char* op, const char* name,
                const char* meaning) {
  HLM_CHECK(t.dim(dim) == expected, "{}: dimension {} of {} is {} and must be {} ({}), got {}", op, dim, name,
            t.dim(dim), expected, meaning, t.describe());
}

void prepare_output(Tensor& out, const Shape& shape, DType dtype, const char* op, const char* name) {
  if (!out.defined()) {
    out = Tensor::empty(shape, dtype);
    return;
  }
  HLM_CHECK(out.device() == Device::kCpu && out.dtype() == dtype && out.shape() == shape,
            "{}: output {} must be {}{} (or undefined), got {}", op, name, dtype_name(dtype),
            shape_str(shape), out.describe());
}

void check_seq_spans(const std::vector<SeqSpan>& seqs, int64_t rows, int64_t slots, const char* op) {
  std::vector<const SeqSpan*> by_begin;
  std::vector<char> slot_used(static_cast<size_t>(std::max<int64_t>(slots, 0)), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqSpan& s = seqs[i];
    HLM_CHECK(s.token_begin >= 0 && s.token_count >= 0 && s.token_begin + s.token_count <= rows,
              "{}: sequence {} covers rows [{}, {}), outside the {} rows of the batch", op, i, s.token_begin,
              s.token_begin + s.token_count, rows);
    if (s.token_count == 0 && s.slot == -1) continue;  // padding
    HLM_CHECK(s.slot >= 0 && s.slot < slots, "{}: sequence {} uses state slot {}, but the state has {} slots",
              op, i, s.slot, slots);
    HLM_CHECK(!slot_used[s.slot], "{}: state slot {} is used by two sequences of one batch", op, s.slot);
    slot_used[s.slot] = 1;
    if (s.token_count > 0) by_begin.push_back(&s);  // an empty span covers no rows
  }
  std::sort(by_begin.begin(), by_begin.end(),
            [](const SeqSpan* a, const SeqSpan* b) { return a->token_begin < b->token_begin; });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const SeqSpan& prev = *by_begin[i - 1];
    HLM_CHECK(prev.token_begin + prev.token_count <= by_begin[i]->token_begin,
              "{}: sequences overlap: rows [{}, {}) and a sequence starting at row {}", op, prev.token_begin,
              prev.token_begin + prev.token_count, by_begin[i]->token_begin);
  }
}

MemoryInfo host_memory_info() {
  MemoryInfo info;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") info.free = kib * 1024;
    if (key == "MemTotal:") info.total = kib * 1024;
  }
  return info;
}

void l2_normalize(const float* x, int64_t n, float scale, float* out) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  float factor = static_cast<float>(scale / std::sqrt(sum_sq + 1e-6));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * factor;
}

void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          bool trans_b, float* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    }
    return;
  }
  // OpenBLAS takes 32-bit sizes (the distribution's build has no 64-bit interface).
  HLM_CHECK(std::max({m, n, k, lda, ldb, ldc}) <= INT_MAX,
            "gemm: dimensions {}x{}x{} exceed the BLAS int range", m, n, k);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
}

}  // namespace hlm::cpu
