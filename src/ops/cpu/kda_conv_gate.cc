// The element-wise parts of a KDA layer around the recurrent core (docs/MODEL.md §5.2, §5.3, §5.7): the
// causal depthwise short convolution with its per-slot cache of raw inputs, the forget gate in log space,
// and the sigmoid-gated RMSNorm of the core output. All fp32; rows are split over OpenMP threads.
#include "ops/cpu/cpu_kernels.h"

namespace hlm::cpu {

Tensor short_conv(const Tensor& x, const Tensor& w, const SeqBatch& batch, Tensor& state) {
  const std::vector<SeqSpan>& seqs = batch.spans;
  const char* op = "short_conv";
  expect_tensor(x, op, "x", DType::kF32, 2, "[T, C]");
  expect_tensor(w, op, "w", DType::kF32, 2, "[C, W]");
  expect_tensor(state, op, "state", DType::kF32, 3, "[slots, C, W-1]");
  const int64_t rows = x.dim(0), channels = x.dim(1), width = w.dim(1), hist = width - 1;
  expect_dim(w, 0, channels, op, "w [C, W]", "the channel count of x [T, C]");
  HLM_CHECK(width >= 1, "short_conv: the kernel width of w [C, W] must be at least 1, got {}", w.describe());
  expect_dim(state, 1, channels, op, "state [slots, C, W-1]", "the channel count of x [T, C]");
  expect_dim(state, 2, hist, op, "state [slots, C, W-1]", "the kernel width of w [C, W] minus 1");
  check_seq_spans(seqs, rows, state.dim(0), op);

  // Taps transposed to [W, C] so the inner loop runs over contiguous channels.
  std::vector<float> taps(static_cast<size_t>(width * channels));  // [W, C]
  const float* wp = w.data<float>();
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t j = 0; j < width; ++j) taps[j * channels + c] = wp[c * width + j];
  }
  std::vector<int64_t> row_seq(static_cast<size_t>(rows), -1);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int64_t t = 0; t < seqs[s].token_count; ++t)
      row_seq[seqs[s].token_begin + t] = static_cast<int64_t>(s);
  }

  Tensor y = Tensor::zeros({rows, channels}, DType::kF32);  // [T, C]; rows outside every sequence stay 0
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  float* sp = state.data<float>();
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    if (row_seq[r] < 0) continue;
    const SeqSpan& seq = seqs[row_seq[r]];
    const int64_t t = r - seq.token_begin;
    float* out = yp + r * channels;
    // Tap j reads the input at sequence position t - (W-1) + j; positions before the first new token
    // come from the cached inputs, where cache column W-1+p holds position p < 0.
    for (int64_t j = 0; j < width; ++j) {
      const int64_t p = t - hist + j;
      const float* tap = taps.data() + j * channels;
      if (p >= 0) {
        const float* in = xp + (seq.token_begin + p) * channels;
        for (int64_t c = 0; c < channels; ++c) out[c] += tap[c] * in[c];
      } else {
        const float* cached = sp + seq.slot * channels * hist + hist + p;
        for (int64_t c = 0; c < channels; ++c) out[c] += tap[c] * cached[c * hist];
      }
    }
    for (int64_t c = 0; c < channels; ++c) out[c] = silu(out[c]);
  }

  // The cache becomes the last W-1 inputs of [cache | new inputs]. Column i takes stream position n + i;
  // ascending i reads the old column n + i > i before anything overwrites it.
#pragma omp parallel for
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SeqSpan& seq = seqs[s];
    const int64_t n = seq.token_count;
    if (n == 0) continue;
    float* cache = sp + seq.slot * channels * hist;  // [C, W-1]
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t i = 0; i < hist; ++i) {
        const int64_t p = n + i - hist;  // position relative to the first new token
        cache[c * hist + i] = p >= 0 ? xp[(seq.token_begin + p) * channels + c] : cache[c * hist + n + i];
      }
    }
  }
  return y;
}

Tensor kda_gate(const Tensor& graw, const Tensor& a_log, const Tensor& dt_bias, float lower_bound) {
  const char* op = "kda_gate";
  expect_tensor(graw, op, "graw", DType::kF32, 2, "[T, H*K]");
  expect_tensor(a_log, op, "a_log", DType::kF32, 1, "[H]");
  expect_tensor(dt_bias, op, "dt_bias", DType::kF32, 1, "[H*K]");
  const int64_t rows = graw.dim(0), width = graw.dim(1), heads = a_log.dim(0);
  HLM_CHECK(heads > 0 && width % heads == 0,
            "kda_gate: the width {} of graw [T, H*K] must be a multiple of the head count {} of a_log [H]",
            width, heads);
  expect_dim(dt_bias, 0, width, op, "dt_bias [H*K]", "the width of graw [T, H*K]");
  HLM_CHECK(lower_bound <= 0.0f,
            "kda_gate: lower_bound must be 0 (softplus gate) or negative (bounded gate), got {}",
            lower_bound);
  const int64_t head_dim = width / heads;
  std::vector<float> rate(static_cast<size_t>(heads));  // exp(A_log[h])
  for (int64_t h = 0; h < heads; ++h) rate[h] = std::exp(a_log.data<float>()[h]);

  Tensor g = Tensor::empty({rows, width}, DType::kF32);  // [T, H*K]
  const float* gr = graw.data<float>();
  const float* bias = dt_bias.data<float>();
  float* gp = g.data<float>();
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const float z = gr[r * width + c] + bias[c];
      const float a = rate[c / head_dim];
      float value;
      if (lower_bound == 0.0f) {
        const float softplus = z > 20.0f ? z : std::log1p(std::exp(z));  // torch's threshold 20
        value = -a * softplus;
      } else {
        value = lower_bound * logistic(a * z);
      }
      gp[r * width + c] = value;
    }
  }
  return g;
}

Tensor gated_rms_norm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps) {
  const char* op = "gated_rms_norm";
  expect_tensor(o, op, "o", DType::kF32, 3, "[T, H, V]");
  expect_tensor(gate, op, "gate", DType::kF32, 3, "[T, H, V]");
  expect_same_shape(o, gate, op, "o", "gate", "[T, H, V]");
  expect_tensor(w, op, "w", DType::kF32, 1, "[V]");
  expect_dim(w, 0, o.dim(2), op, "w [V]", "the head dimension of o [T, H, V]");
  const int64_t d = o.dim(2), rows = o.dim(0) * o.dim(1);
  Tensor y = Tensor::empty(o.shape(), DType::kF32);  // [T, H, V]
  const float* o_in = o.data<float>();
  const float* gp = gate.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* orow = o_in + r * d;
    const float inv = inv_rms(orow, d, eps);
    // Weight before gate, no (1 + w), sigmoid gate (docs/MODEL.md §5.7).
    for (int64_t i = 0; i < d; ++i) yp[r * d + i] = wp[i] * (orow[i] * inv) * logistic(gp[r * d + i]);
  }
  return y;
}

}  // namespace hlm::cpu
