// The KDA ops of the CUDA backend against the CPU reference on identical inputs: short conv with its cache,
// the forget gate (softplus and K3's bounded form), the gated RMSNorm, the recurrent decode (tiled head
// sizes and the generic kernel) and the chunked prefill (sequences of 1, 63, 64, 65 and 150 tokens in one
// ragged batch, padding spans, rows outside every span, non-zero initial state, gates that drive Γ to
// −1000s), and prefill followed by decode.
//
// Inputs are drawn in F32 and rounded to bf16; the CPU gets the rounded F32 values and the GPU the same
// values as BF16, so the only differences are the GPU's rounding of its outputs and fp32 summation order.
// Tolerances (relative L2 error over the compared tensor):
//  - BF16 outputs (conv, norm, KDA core): 4e-3. Rounding an fp32 result to bf16 (8 significant bits) has a
//    relative error of at most 2^-8 ≈ 3.9e-3 per element and ≈ 1.6e-3 rms over many elements (what a CPU
//    emulation of these kernels measured); everything else the GPU does differently (summation order, expf
//    ulps) is ~1e-6. A wrong index or a missed term gives errors of 1e-1 and more.
//  - F32 results (the recurrent state, the gate): 1e-5 (state) and 1e-6 (gate). Same fp32 formulas on the
//    same inputs; only summation order and 1-2 ulp differences of expf/log1pf remain (~1e-7).
//  - The conv cache holds copies of inputs and must match exactly; slots a call does not use, and rows
//    outside every span (exactly zero), must be bitwise as expected.
// Every op runs in a step whose arena was first filled with NaN bytes, so an output element (or a
// workspace element) that a kernel forgets to write surfaces as NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_test_util.h"

namespace hlm {
namespace {

using test::as_bf16;
using test::random_f32;
using test::rel_l2;
using test::round_bf16;

constexpr double kBf16OutTol = 4e-3;
constexpr double kStateTol = 1e-5;
constexpr double kGateTol = 1e-6;

constexpr int64_t kArenaBytes = int64_t{64} << 20;
constexpr int64_t kPoisonBytes = int64_t{32} << 20;

// The batch as a device op takes it: the host spans and their I32 [S, 3] table on the GPU.
SeqBatch device_batch(Ops& gpu, const std::vector<SeqSpan>& spans) {
  Tensor table = Tensor::empty({static_cast<int64_t>(spans.size()), 3}, DType::kI32);
  int32_t* p = table.data<int32_t>();
  for (size_t i = 0; i < spans.size(); ++i) {
    p[3 * i] = static_cast<int32_t>(spans[i].token_begin);
    p[3 * i + 1] = static_cast<int32_t>(spans[i].token_count);
    p[3 * i + 2] = spans[i].slot;
  }
  SeqBatch batch(spans);
  batch.table = gpu.upload(table);
  return batch;
}

// Runs `op` inside a step whose arena starts with kPoisonBytes of 0xFF (NaN in F32 and BF16) and returns
// its result as host F32. Ops allocate their output first, so it lands on the poison. Call
// gpu.reserve_workspace(kArenaBytes) once before, and upload every input before (outside the step).
Tensor run_poisoned(Ops& gpu, const std::function<Tensor()>& op) {
  gpu.begin_step();
  {
    Tensor poison = Tensor::empty({kPoisonBytes}, DType::kU8);
    std::memset(poison.raw(), 0xFF, poison.nbytes());
    Tensor block = gpu.empty({kPoisonBytes}, DType::kU8);
    gpu.upload_into(poison, block);
  }  // the block returns to the arena
  Tensor result = gpu.to_host_f32(op());
  gpu.end_step();
  return result;
}

// The listed rows of a host tensor [T, ...] are exactly zero.
::testing::AssertionResult rows_are_zero(const Tensor& t, const std::vector<int64_t>& rows) {
  const int64_t width = t.numel() / t.dim(0);
  for (int64_t r : rows) {
    const float* p = t.data<float>() + r * width;
    for (int64_t i = 0; i < width; ++i) {
      if (p[i] != 0.0f)
        return ::testing::AssertionFailure() << "row " << r << " element " << i << " is " << p[i];
    }
  }
  return ::testing::AssertionSuccess();
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::set<int32_t> touched_slots(const std::vector<SeqSpan>& spans) {
  std::set<int32_t> slots;
  for (const SeqSpan& s : spans) {
    if (s.token_count > 0) slots.insert(s.slot);
  }
  return slots;
}

// After one call: every slot the call used agrees with the CPU within `tol` (tol 0: exactly); every other
// slot is bitwise what the GPU held before the call.
void expect_state(const Tensor& gpu_after, const Tensor& gpu_before, const Tensor& cpu_after,
                  const std::vector<SeqSpan>& spans, double tol, const std::string& what) {
  const std::set<int32_t> touched = touched_slots(spans);
  for (int64_t s = 0; s < gpu_after.dim(0); ++s) {
    if (touched.count(static_cast<int32_t>(s)) != 0) {
      if (tol == 0.0) {
        EXPECT_TRUE(bitwise_equal(gpu_after[s], cpu_after[s])) << what << ": slot " << s;
      } else {
        EXPECT_LE(rel_l2(gpu_after[s], cpu_after[s]), tol) << what << ": slot " << s;
      }
    } else {
      EXPECT_TRUE(bitwise_equal(gpu_after[s], gpu_before[s]))
          << what << ": slot " << s << " was not in the batch";
    }
  }
}

// Rows [0, rows) that no span with tokens covers.
std::vector<int64_t> uncovered_rows(const std::vector<SeqSpan>& spans, int64_t rows) {
  std::vector<bool> covered(static_cast<size_t>(rows), false);
  for (const SeqSpan& s : spans) {
    for (int64_t t = 0; t < s.token_count; ++t) covered[s.token_begin + t] = true;
  }
  std::vector<int64_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    if (!covered[r]) out.push_back(r);
  }
  return out;
}

// One short_conv call on both backends from the same cache, checked: output within kBf16OutTol and zero on
// rows of no sequence, the cache exactly the CPU's on the batch's slots and untouched elsewhere. x and w are
// the CPU's inputs (x rounded to bf16; the GPU gets it as BF16), gpu_w the GPU's copy of w. planes > 1
// calls short_conv_planes on both (the CPU's is the reference composition of short_conv and transpose01).
void run_conv_and_compare(Ops& gpu, Ops& cpu, const Tensor& x, const Tensor& w, const Tensor& gpu_w,
                          const std::vector<SeqSpan>& spans, Tensor& gpu_state, Tensor& cpu_state,
                          int64_t planes, const std::string& what) {
  const Tensor gpu_x = gpu.upload(as_bf16(x));
  const SeqBatch batch = device_batch(gpu, spans);
  const Tensor before = gpu.to_host_f32(gpu_state);
  const Tensor y = run_poisoned(gpu, [&] {
    return planes == 1 ? gpu.short_conv(gpu_x, gpu_w, batch, gpu_state)
                       : gpu.short_conv_planes(gpu_x, gpu_w, batch, gpu_state, planes);
  });
  const Tensor ref = planes == 1 ? cpu.short_conv(x, w, spans, cpu_state)
                                 : cpu.short_conv_planes(x, w, spans, cpu_state, planes);
  ASSERT_EQ(y.shape(), ref.shape()) << what;
  EXPECT_LE(rel_l2(y, ref), kBf16OutTol) << what << ": output";
  for (int64_t p = 0; p < (planes == 1 ? 1 : planes); ++p) {
    EXPECT_TRUE(rows_are_zero(planes == 1 ? y : y[p], uncovered_rows(spans, x.dim(0))))
        << what << ", plane " << p;
  }
  expect_state(gpu.to_host_f32(gpu_state), before, cpu_state, spans, 0.0, what + ": conv cache");
}

// ---- short conv ---------------------------------------------------------------------------------------

TEST(CudaKda, ShortConvMatchesCpu) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(21);
  // 302 channels (and 306 as 3 planes of 102; widths not multiples of 4): the kernel of a channel per
  // thread, two CTAs across, the second partial; 2,064: the kernel of 4 channels per thread (512 per CTA),
  // the fifth CTA partial, and as 3 planes of 688 for q, k and v; width 6: the kernel of a channel per thread
  // for widths up to 8. Spans out of row order; a 70-token sequence
  // crosses three 32-row tiles; sequences of 1 and 2 tokens shift the cache partly; a padding span (slot -1),
  // an empty span on slot 2 that must leave it alone, rows 81..83 in no span, slot 6 unused.
  const int64_t slots = 7, rows = 84;
  const std::vector<SeqSpan> prefill = {{8, 70, 4},  {0, 5, 3},  {5, 1, 0}, {6, 2, 5},
                                        {78, 0, -1}, {78, 3, 1}, {81, 0, 2}};
  // Then a decode-shaped call: one token per sequence, one padding span, row 2 in no span.
  const std::vector<SeqSpan> decode = {{0, 1, 3}, {1, 1, 0}, {2, 0, -1}, {3, 1, 4}};
  for (const auto& [channels, planes, width] : {std::tuple<int64_t, int64_t, int64_t>{302, 1, 4},
                                                {2064, 1, 4},
                                                {2064, 3, 4},
                                                {306, 3, 4},
                                                {96, 1, 6}}) {
    for (DType state_dtype : {DType::kF32, DType::kBF16}) {
      const std::string what = std::to_string(channels) + " channels in " + std::to_string(planes) +
                               " planes, width " + std::to_string(width) + ", state " +
                               std::string(dtype_name(state_dtype));
      // BF16 weights with an F32 cache (Kimi-Linear-48B's checkpoint, our allocation), F32 with BF16
      // (K3-like).
      const bool bf16_weights = state_dtype == DType::kF32;
      Tensor w = random_f32({channels, width}, rng);
      if (bf16_weights) w = round_bf16(w);
      Tensor cpu_state = random_f32({slots, channels, width - 1}, rng, -2.0f, 2.0f);
      if (state_dtype == DType::kBF16) cpu_state = round_bf16(cpu_state);
      Tensor gpu_w = gpu->upload(bf16_weights ? as_bf16(w) : w);
      Tensor gpu_state = gpu->upload(state_dtype == DType::kBF16 ? as_bf16(cpu_state) : cpu_state);

      for (const auto& [spans, t] : {std::pair{prefill, rows}, std::pair{decode, int64_t{5}}}) {
        const Tensor x = round_bf16(random_f32({t, channels}, rng, -2.0f, 2.0f));
        run_conv_and_compare(*gpu, *cpu, x, w, gpu_w, spans, gpu_state, cpu_state, planes,
                             what + ", " + std::to_string(spans.size()) + " spans");
      }
    }
  }
}

// ---- gate and gated norm ------------------------------------------------------------------------------

TEST(CudaKda, GateMatchesCpu) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(22);
  // 37 rows: a row per thread (too few rows for 16-row CTAs to fill the GPU); 4,237: 16 rows per thread (on
  // GPUs of up to 132 SMs), the last CTA partial. K = 16: 4 columns per thread; K = 5 (width 15): one.
  const int64_t heads = 3;
  for (const auto& [rows, kd] : {std::pair<int64_t, int64_t>{37, 16}, {37, 5}, {4237, 16}, {4237, 5}}) {
    // Both softplus branches (threshold 20) and saturated sigmoids.
    const Tensor graw = round_bf16(random_f32({rows, heads * kd}, rng, -30.0f, 30.0f));
    const Tensor gpu_graw = gpu->upload(as_bf16(graw));
    for (bool bf16_params : {false, true}) {
      Tensor a_log = random_f32({heads}, rng, -1.0f, 2.0f), dt = random_f32({heads * kd}, rng);
      if (bf16_params) {
        a_log = round_bf16(a_log);
        dt = round_bf16(dt);
      }
      const Tensor gpu_a_log = gpu->upload(bf16_params ? as_bf16(a_log) : a_log);
      const Tensor gpu_dt = gpu->upload(bf16_params ? as_bf16(dt) : dt);
      for (float lower : {0.0f, -5.0f}) {
        const Tensor g =
            run_poisoned(*gpu, [&] { return gpu->kda_gate(gpu_graw, gpu_a_log, gpu_dt, lower); });
        const Tensor ref = cpu->kda_gate(graw, a_log, dt, lower);
        EXPECT_LE(rel_l2(g, ref), kGateTol)
            << rows << " rows, K " << kd << ", lower_bound " << lower << ", bf16 params " << bf16_params;
        for (int64_t i = 0; i < g.numel(); ++i) {
          ASSERT_TRUE(g.data<float>()[i] <= 0.0f && g.data<float>()[i] >= (lower < 0 ? lower : -1e30f)) << i;
        }
      }
    }
  }
}

TEST(CudaKda, GatedRmsNormMatchesCpu) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(23);
  // V = 128 (both models), 16 (fixtures), 40 (lanes past the end of the row), 264 (a second pass, lanes
  // past its end) and 42 (not a multiple of 4: the kernel of an element per lane and pass).
  for (int64_t vd : {128, 16, 40, 264, 42}) {
    for (bool bf16_weight : {true, false}) {  // 48B stores o_norm in bf16, K3 in f32
      const int64_t rows = 5, heads = 4;
      const Tensor o = round_bf16(random_f32({rows, heads, vd}, rng, -2.0f, 2.0f));
      const Tensor gate = round_bf16(random_f32({rows, heads, vd}, rng, -8.0f, 8.0f));
      Tensor w = random_f32({vd}, rng, 0.5f, 1.5f);
      if (bf16_weight) w = round_bf16(w);
      const Tensor gpu_o = gpu->upload(as_bf16(o)), gpu_gate = gpu->upload(as_bf16(gate));
      const Tensor gpu_w = gpu->upload(bf16_weight ? as_bf16(w) : w);
      const Tensor y = run_poisoned(*gpu, [&] { return gpu->gated_rms_norm(gpu_o, gpu_gate, gpu_w, 1e-5f); });
      EXPECT_LE(rel_l2(y, cpu->gated_rms_norm(o, gate, w, 1e-5f)), kBf16OutTol) << "V " << vd;
    }
  }
}

// ---- KDA core -----------------------------------------------------------------------------------------

enum class Gate { kMild, kSoftplus, kBounded };

const char* gate_name(Gate g) {
  switch (g) {
    case Gate::kMild:
      return "mild";
    case Gate::kSoftplus:
      return "softplus";
    default:
      return "bounded";
  }
}

// Host inputs of the core, q/k/v rounded to bf16; g and beta F32.
struct CoreInputs {
  Tensor q, k, v, g, beta;
};

// g per gate kind: mild uniform [-0.5, 0]; softplus through the CPU kda_gate with large A_log, so each
// token decays by about 10..130 nats and Γ reaches −1000s within a chunk; bounded through the K3 gate
// (lower bound −5), g in (−5, 0).
Tensor make_g(Ops& cpu, Gate kind, int64_t rows, int64_t heads, int64_t kd, std::mt19937& rng) {
  if (kind == Gate::kMild) return random_f32({rows, heads, kd}, rng, -0.5f, 0.0f);
  Tensor a_log = Tensor::empty({heads}, DType::kF32);
  for (int64_t h = 0; h < heads; ++h)
    a_log.data<float>()[h] = kind == Gate::kSoftplus ? 3.0f + 0.5f * (h % 2) : -0.5f;
  const Tensor graw = kind == Gate::kSoftplus ? random_f32({rows, heads * kd}, rng, -1.0f, 3.0f)
                                              : random_f32({rows, heads * kd}, rng, -3.0f, 3.0f);
  return cpu.kda_gate(graw, a_log, random_f32({heads * kd}, rng), kind == Gate::kSoftplus ? 0.0f : -5.0f)
      .reshape({rows, heads, kd});
}

CoreInputs make_core_inputs(Ops& cpu, int64_t rows, int64_t heads, int64_t kd, int64_t vd, Gate gate,
                            std::mt19937& rng) {
  return {round_bf16(random_f32({rows, heads, kd}, rng)), round_bf16(random_f32({rows, heads, kd}, rng)),
          round_bf16(random_f32({rows, heads, vd}, rng)), make_g(cpu, gate, rows, heads, kd, rng),
          random_f32({rows, heads}, rng, 0.0f, 1.0f)};
}

struct DeviceCore {
  Tensor q, k, v, g, beta;
};

// q, k, v as BF16 (or F32 when asked), g and beta F32.
DeviceCore upload_core(Ops& gpu, const CoreInputs& in, bool f32_activations = false) {
  auto act = [&](const Tensor& t) { return gpu.upload(f32_activations ? t : as_bf16(t)); };
  return {act(in.q), act(in.k), act(in.v), gpu.upload(in.g), gpu.upload(in.beta)};
}

// One core call on both backends from the same state, checked: output within kBf16OutTol and zero on rows
// of no sequence, state within kStateTol on the batch's slots and untouched elsewhere.
void run_core_and_compare(Ops& gpu, Ops& cpu, bool prefill, const CoreInputs& in,
                          const std::vector<SeqSpan>& spans, Tensor& gpu_state, Tensor& cpu_state,
                          const std::string& what, bool f32_activations = false) {
  const DeviceCore dev = upload_core(gpu, in, f32_activations);
  const SeqBatch batch = device_batch(gpu, spans);
  const Tensor before = gpu.to_host_f32(gpu_state);
  const Tensor out = run_poisoned(gpu, [&] {
    return prefill ? gpu.kda_prefill(dev.q, dev.k, dev.v, dev.g, dev.beta, batch, gpu_state)
                   : gpu.kda_decode(dev.q, dev.k, dev.v, dev.g, dev.beta, batch, gpu_state);
  });
  const Tensor ref = prefill ? cpu.kda_prefill(in.q, in.k, in.v, in.g, in.beta, spans, cpu_state)
                             : cpu.kda_decode(in.q, in.k, in.v, in.g, in.beta, spans, cpu_state);
  EXPECT_LE(rel_l2(out, ref), kBf16OutTol) << what << ": output";
  EXPECT_TRUE(rows_are_zero(out, uncovered_rows(spans, in.q.dim(0)))) << what;
  expect_state(gpu.to_host_f32(gpu_state), before, cpu_state, spans, kStateTol, what + ": state");
}

// Decode: head sizes with a tiled kernel (16, 32, 64, 128) and two that take the generic one.
class CudaKdaDecode : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(CudaKdaDecode, MatchesCpuOverSteps) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  const auto [kd, vd] = GetParam();
  const int64_t heads = 3, slots = 7, rows = 6;
  std::mt19937 rng(static_cast<unsigned>(31 * kd + vd));
  // Spans out of slot order; a padding span (slot -1); an empty span on slot 3; rows 2, 4, 5 in no span.
  const std::vector<SeqSpan> spans = {{0, 1, 2}, {1, 1, 0}, {2, 0, -1}, {3, 1, 5}, {4, 0, 3}};
  Tensor cpu_state = random_f32({slots, heads, kd, vd}, rng);
  Tensor gpu_state = gpu->upload(cpu_state);
  for (int step = 0; step < 3; ++step) {
    const CoreInputs in = make_core_inputs(*cpu, rows, heads, kd, vd, Gate::kMild, rng);
    run_core_and_compare(
        *gpu, *cpu, false, in, spans, gpu_state, cpu_state,
        "K " + std::to_string(kd) + " V " + std::to_string(vd) + " step " + std::to_string(step));
  }
}

INSTANTIATE_TEST_SUITE_P(
    HeadSizes, CudaKdaDecode,
    ::testing::Values(std::pair<int64_t, int64_t>{16, 16}, std::pair<int64_t, int64_t>{32, 32},
                      std::pair<int64_t, int64_t>{64, 64}, std::pair<int64_t, int64_t>{128, 128},
                      std::pair<int64_t, int64_t>{48, 40}, std::pair<int64_t, int64_t>{32, 24}));

// Random per-head parameters of a fused decode for the CPU and their copies on the GPU (o_norm as BF16).
std::pair<KdaHeadParams, KdaHeadParams> random_head_params(Ops& gpu, int64_t heads, int64_t kd, int64_t vd,
                                                           float lower_bound, std::mt19937& rng) {
  KdaHeadParams cpu;
  cpu.a_log = random_f32({heads}, rng, -1.0f, 0.5f);
  cpu.dt_bias = random_f32({heads * kd}, rng);
  cpu.lower_bound = lower_bound;
  cpu.o_norm = round_bf16(random_f32({vd}, rng, 0.5f, 1.5f));
  cpu.eps = 1e-5f;
  KdaHeadParams dev = cpu;
  dev.a_log = gpu.upload(cpu.a_log);
  dev.dt_bias = gpu.upload(cpu.dt_bias);
  dev.o_norm = gpu.upload(as_bf16(cpu.o_norm));
  return {cpu, dev};
}

// The fused decode (kda_decode_gated: gate, beta sigmoid, recurrence and gated norm in one kernel, in
// clusters of CTAs at K = V = 64 and 128) against the CPU's four separate ops, with both gate forms; head
// sizes without a tiled kernel, and batches of more than 256 (row, head) pairs, take the separate ops on
// the GPU too.
class CudaKdaDecodeGated : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, float, int64_t>> {};

TEST_P(CudaKdaDecodeGated, MatchesCpuOpsOverSteps) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  const auto [kd, vd, lower_bound, heads] = GetParam();
  const int64_t slots = 7, rows = 6;
  std::mt19937 rng(static_cast<unsigned>(53 * kd + vd + 7 * heads + (lower_bound < 0 ? 1 : 0)));
  const std::vector<SeqSpan> spans = {{0, 1, 2}, {1, 1, 0}, {2, 0, -1}, {3, 1, 5}, {4, 0, 3}};
  Tensor cpu_state = random_f32({slots, heads, kd, vd}, rng);
  Tensor gpu_state = gpu->upload(cpu_state);
  const auto [hp_cpu, hp_gpu] = random_head_params(*gpu, heads, kd, vd, lower_bound, rng);
  const SeqBatch batch = device_batch(*gpu, spans);
  for (int step = 0; step < 3; ++step) {
    const std::string what = "K " + std::to_string(kd) + " V " + std::to_string(vd) + " lower bound " +
                             std::to_string(lower_bound) + " step " + std::to_string(step);
    const Tensor q = round_bf16(random_f32({rows, heads, kd}, rng));
    const Tensor k = round_bf16(random_f32({rows, heads, kd}, rng));
    const Tensor v = round_bf16(random_f32({rows, heads, vd}, rng));
    const Tensor graw = round_bf16(random_f32({rows, heads * kd}, rng, -2.0f, 2.0f));
    const Tensor beta_logits = round_bf16(random_f32({rows, heads}, rng, -3.0f, 3.0f));
    const Tensor out_gate = round_bf16(random_f32({rows, heads, vd}, rng, -3.0f, 3.0f));
    const Tensor before = gpu->to_host_f32(gpu_state);
    const Tensor out = run_poisoned(*gpu, [&] {
      return gpu->kda_decode_gated(gpu->upload(as_bf16(q)), gpu->upload(as_bf16(k)), gpu->upload(as_bf16(v)),
                                   gpu->upload(as_bf16(graw)), gpu->upload(as_bf16(beta_logits)),
                                   gpu->upload(as_bf16(out_gate)), hp_gpu, batch, gpu_state);
    });
    const Tensor ref = cpu->kda_decode_gated(q, k, v, graw, beta_logits, out_gate, hp_cpu, spans, cpu_state);
    EXPECT_LE(rel_l2(out, ref), kBf16OutTol) << what << ": output";
    EXPECT_TRUE(rows_are_zero(out, uncovered_rows(spans, rows))) << what;
    expect_state(gpu->to_host_f32(gpu_state), before, cpu_state, spans, kStateTol, what + ": state");
  }
}

using GatedCase = std::tuple<int64_t, int64_t, float, int64_t>;  // K, V, lower bound, heads
INSTANTIATE_TEST_SUITE_P(HeadSizesAndGates, CudaKdaDecodeGated,
                         ::testing::Values(GatedCase{16, 16, 0.0f, 3}, GatedCase{32, 32, -5.0f, 3},
                                           GatedCase{64, 64, 0.0f, 3}, GatedCase{128, 128, 0.0f, 3},
                                           GatedCase{128, 128, -5.0f, 3}, GatedCase{48, 40, -5.0f, 3},
                                           GatedCase{128, 128, 0.0f, 48}),
                         [](const auto& info) {
                           return "K" + std::to_string(std::get<0>(info.param)) + "V" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) < 0 ? "Bounded" : "Softplus") + "H" +
                                  std::to_string(std::get<3>(info.param));
                         });

// The whole decode step of a layer from its stacked projection (kda_decode_layer: conv, both gate
// products, gate, beta, recurrence and gated norm in one kernel, in clusters at K = V = 64 and 128)
// against the CPU's separate ops, over three steps that carry the recurrent state and the conv cache.
// The kernel keeps the conv outputs and the gate products in fp32, as the CPU's F32 ops do, so the state
// meets kStateTol and the cache must match exactly. A batch of more than 256 (row, head) pairs takes the
// separate ops on the GPU, which round the conv outputs (q, k, v) to bf16 before the recurrence: there the
// state is held to kBf16OutTol, the bound of that rounding.
struct LayerCase {
  int64_t dim, rank;
  float lower_bound;
  int64_t heads, rows;
  bool full_rank_gate;  // K3: no g_b, the gate columns of the projection are the gate
  DType conv_state;
  bool separate_ops = false;  // more than 256 (row, head) pairs: the GPU takes the separate ops
};

class CudaKdaDecodeLayer : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CudaKdaDecodeLayer, MatchesCpuOpsOverSteps) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  const LayerCase c = GetParam();
  const int64_t hd = c.dim, heads = c.heads, dl = heads * hd, slots = 7, rows = c.rows, width = 4;
  std::mt19937 rng(static_cast<unsigned>(71 * hd + c.rank + 7 * heads + (c.full_rank_gate ? 3 : 0)));
  const std::vector<SeqSpan> spans = {{0, 1, 2}, {1, 1, 0}, {2, 0, -1}, {3, 1, 5}, {4, 0, 3}};
  // The projection's parts after 8 columns of another part, in the layer's order, 5 more columns after.
  KdaProjColumns cols;
  cols.qkv = 8;
  cols.fa = cols.qkv + 3 * dl;
  cols.gate = cols.fa + c.rank;
  cols.beta = cols.gate + (c.full_rank_gate ? dl : c.rank);
  const int64_t proj_width = cols.beta + heads + 5;

  const auto [hp_cpu, hp_gpu] = random_head_params(*gpu, heads, hd, hd, c.lower_bound, rng);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(c.rank));
  const Tensor conv_w = round_bf16(random_f32({3 * dl, width}, rng, -0.6f, 0.6f));
  const Tensor f_b = round_bf16(random_f32({dl, c.rank}, rng, -w_scale, w_scale));
  const Tensor g_b =
      c.full_rank_gate ? Tensor() : round_bf16(random_f32({dl, c.rank}, rng, -w_scale, w_scale));
  const Tensor gpu_conv_w = gpu->upload(as_bf16(conv_w)), gpu_f_b = gpu->upload(as_bf16(f_b));
  const Tensor gpu_g_b = c.full_rank_gate ? Tensor() : gpu->upload(as_bf16(g_b));

  Tensor cpu_state = random_f32({slots, heads, hd, hd}, rng);
  Tensor gpu_state = gpu->upload(cpu_state);
  Tensor cpu_conv = round_bf16(random_f32({slots, 3 * dl, width - 1}, rng, -2.0f, 2.0f));
  Tensor gpu_conv = gpu->upload(c.conv_state == DType::kBF16 ? as_bf16(cpu_conv) : cpu_conv);
  const SeqBatch batch = device_batch(*gpu, spans);
  for (int step = 0; step < 3; ++step) {
    const std::string what = "K " + std::to_string(hd) + " r " + std::to_string(c.rank) + " H " +
                             std::to_string(heads) + (c.full_rank_gate ? " full-rank gate" : "") + " step " +
                             std::to_string(step);
    const Tensor proj = round_bf16(random_f32({rows, proj_width}, rng, -2.0f, 2.0f));
    const Tensor gpu_proj = gpu->upload(as_bf16(proj));
    const Tensor state_before = gpu->to_host_f32(gpu_state), conv_before = gpu->to_host_f32(gpu_conv);
    const Tensor out = run_poisoned(*gpu, [&] {
      return gpu->kda_decode_layer(gpu_proj, cols, gpu_conv_w, gpu_f_b, gpu_g_b, hp_gpu, batch, gpu_conv,
                                   gpu_state);
    });
    const Tensor ref =
        cpu->kda_decode_layer(proj, cols, conv_w, f_b, g_b, hp_cpu, spans, cpu_conv, cpu_state);
    EXPECT_LE(rel_l2(out, ref), kBf16OutTol) << what << ": output";
    EXPECT_TRUE(rows_are_zero(out, uncovered_rows(spans, rows))) << what;
    expect_state(gpu->to_host_f32(gpu_state), state_before, cpu_state, spans,
                 c.separate_ops ? kBf16OutTol : kStateTol, what + ": state");
    expect_state(gpu->to_host_f32(gpu_conv), conv_before, cpu_conv, spans, 0.0, what + ": conv cache");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaKdaDecodeLayer,
                         ::testing::Values(LayerCase{128, 128, 0.0f, 3, 6, false, DType::kF32},
                                           LayerCase{128, 128, -5.0f, 3, 6, true, DType::kBF16},
                                           LayerCase{64, 32, -5.0f, 3, 6, false, DType::kBF16},
                                           LayerCase{32, 64, 0.0f, 3, 6, false, DType::kF32},
                                           LayerCase{16, 32, 0.0f, 3, 6, true, DType::kF32},
                                           LayerCase{128, 128, 0.0f, 48, 6, false, DType::kBF16, true}),
                         [](const auto& info) {
                           const LayerCase& c = info.param;
                           return "K" + std::to_string(c.dim) + "R" + std::to_string(c.rank) + "H" +
                                  std::to_string(c.heads) + "T" + std::to_string(c.rows) +
                                  (c.lower_bound < 0 ? "Bounded" : "Softplus") +
                                  (c.full_rank_gate ? "FullRankGate" : "LowRankGate") +
                                  (c.conv_state == DType::kBF16 ? "Bf16Cache" : "F32Cache");
                         });

// Prefill: every head size with every gate kind, on one ragged batch.
class CudaKdaPrefill : public ::testing::TestWithParam<std::tuple<int64_t, Gate>> {};

TEST_P(CudaKdaPrefill, RaggedBatchMatchesCpu) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  const auto [dim, gate] = GetParam();
  const int64_t heads = 2, slots = 8, rows = 346;
  std::mt19937 rng(static_cast<unsigned>(41 * dim + static_cast<int>(gate)));
  // Sequences of 65, 150, 1, 63 and 64 tokens (partial chunks, several chunks, exact chunks), listed out of
  // row order; a padding span (slot -1); an empty span on slot 2; rows 343..345 in no span; slots 4 and 7
  // unused.
  const std::vector<SeqSpan> spans = {{278, 65, 6}, {0, 150, 3},  {150, 1, 0}, {151, 63, 5},
                                      {214, 0, -1}, {214, 64, 1}, {343, 0, 2}};
  Tensor cpu_state = random_f32({slots, heads, dim, dim}, rng, -0.5f, 0.5f);
  Tensor gpu_state = gpu->upload(cpu_state);
  const CoreInputs in = make_core_inputs(*cpu, rows, heads, dim, dim, gate, rng);
  run_core_and_compare(*gpu, *cpu, true, in, spans, gpu_state, cpu_state,
                       "D " + std::to_string(dim) + ", " + gate_name(gate) + " gate");
}

INSTANTIATE_TEST_SUITE_P(HeadSizesAndGates, CudaKdaPrefill,
                         ::testing::Combine(::testing::Values(int64_t{16}, int64_t{32}, int64_t{64},
                                                              int64_t{128}),
                                            ::testing::Values(Gate::kMild, Gate::kSoftplus, Gate::kBounded)));

// Two prefill calls (the second restarts chunk alignment at its first token, 70 + 61 and 5 + 64 tokens)
// and then decode steps, each against the CPU doing the same.
TEST(CudaKda, PrefillThenDecodeMatchesCpu) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  for (int64_t dim : {16, 128}) {
    const int64_t heads = 2, slots = 2;
    std::mt19937 rng(static_cast<unsigned>(51 + dim));
    Tensor cpu_state = random_f32({slots, heads, dim, dim}, rng, -0.5f, 0.5f);
    Tensor gpu_state = gpu->upload(cpu_state);
    const std::vector<std::pair<bool, std::vector<SeqSpan>>> calls = {{true, {{0, 70, 1}, {70, 5, 0}}},
                                                                      {true, {{0, 61, 1}, {61, 64, 0}}},
                                                                      {false, {{0, 1, 0}, {1, 1, 1}}},
                                                                      {false, {{0, 1, 0}, {1, 1, 1}}},
                                                                      {false, {{0, 1, 1}, {1, 1, 0}}}};
    for (size_t c = 0; c < calls.size(); ++c) {
      const auto& [prefill, spans] = calls[c];
      int64_t rows = 0;
      for (const SeqSpan& s : spans) rows = std::max(rows, s.token_begin + s.token_count);
      const CoreInputs in = make_core_inputs(*cpu, rows, heads, dim, dim, Gate::kMild, rng);
      run_core_and_compare(*gpu, *cpu, prefill, in, spans, gpu_state, cpu_state,
                           "D " + std::to_string(dim) + " call " + std::to_string(c));
    }
  }
}

// More spans than a CTA has threads (the span-table scans loop), decode-shaped: 300 sequences of one token
// in rows 0..299 with every fifth a padding span, through the conv and the decode (64- and 128-thread CTAs).
TEST(CudaKda, LargeBatchMatchesCpu) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  const int64_t seqs = 300, heads = 2;
  std::mt19937 rng(81);
  std::vector<SeqSpan> spans;
  for (int32_t i = 0; i < seqs; ++i) {
    // Slots reversed against rows, so a row's slot is not its index.
    spans.push_back(i % 5 == 4 ? SeqSpan{i, 0, -1} : SeqSpan{i, 1, static_cast<int32_t>(seqs - 1 - i)});
  }
  const int64_t channels = 96;
  const Tensor x = round_bf16(random_f32({seqs, channels}, rng)),
               w = round_bf16(random_f32({channels, 4}, rng));
  Tensor cpu_conv = random_f32({seqs, channels, 3}, rng);
  Tensor gpu_conv = gpu->upload(cpu_conv);
  run_conv_and_compare(*gpu, *cpu, x, w, gpu->upload(as_bf16(w)), spans, gpu_conv, cpu_conv, 3, "conv");
  for (int64_t dim : {16, 128}) {
    Tensor cpu_state = random_f32({seqs, heads, dim, dim}, rng, -0.5f, 0.5f);
    Tensor gpu_state = gpu->upload(cpu_state);
    const CoreInputs in = make_core_inputs(*cpu, seqs, heads, dim, dim, Gate::kBounded, rng);
    run_core_and_compare(*gpu, *cpu, false, in, spans, gpu_state, cpu_state,
                         "decode D " + std::to_string(dim));
  }
}

// The F32-activation instantiations of both core kernels.
TEST(CudaKda, CoreTakesF32Activations) {
  HLM_GPU_OR_SKIP(gpu);
  gpu->reserve_workspace(kArenaBytes);
  auto cpu = make_cpu_ops();
  const int64_t dim = 32, heads = 2;
  std::mt19937 rng(61);
  Tensor cpu_state = random_f32({2, heads, dim, dim}, rng, -0.5f, 0.5f);
  Tensor gpu_state = gpu->upload(cpu_state);
  const CoreInputs pre = make_core_inputs(*cpu, 100, heads, dim, dim, Gate::kBounded, rng);
  run_core_and_compare(*gpu, *cpu, true, pre, {{0, 100, 1}}, gpu_state, cpu_state, "prefill F32", true);
  const CoreInputs dec = make_core_inputs(*cpu, 1, heads, dim, dim, Gate::kBounded, rng);
  run_core_and_compare(*gpu, *cpu, false, dec, {{0, 1, 1}}, gpu_state, cpu_state, "decode F32", true);
}

TEST(CudaKda, RejectsBadArguments) {
  HLM_GPU_OR_SKIP(gpu);
  auto cpu = make_cpu_ops();
  std::mt19937 rng(71);
  const CoreInputs in = make_core_inputs(*cpu, 4, 2, 16, 16, Gate::kMild, rng);
  const DeviceCore dev = upload_core(*gpu, in);
  Tensor state = gpu->zeros({2, 2, 16, 16}, DType::kF32);
  const SeqBatch two_tokens = device_batch(*gpu, {{0, 2, 0}});
  EXPECT_THROW(gpu->kda_decode(dev.q, dev.k, dev.v, dev.g, dev.beta, two_tokens, state), Error);
  const SeqBatch no_table({{0, 4, 0}});
  EXPECT_THROW(gpu->kda_prefill(dev.q, dev.k, dev.v, dev.g, dev.beta, no_table, state), Error);
  const SeqBatch short_table = device_batch(*gpu, {{0, 4, 0}});
  const SeqBatch two_spans({{0, 2, 0}, {2, 2, 1}});
  SeqBatch mismatched = two_spans;
  mismatched.table = short_table.table;  // one table row for two spans
  EXPECT_THROW(gpu->kda_prefill(dev.q, dev.k, dev.v, dev.g, dev.beta, mismatched, state), Error);
  const SeqBatch same_slot = device_batch(*gpu, {{0, 2, 0}, {2, 2, 0}});
  EXPECT_THROW(gpu->kda_prefill(dev.q, dev.k, dev.v, dev.g, dev.beta, same_slot, state), Error);
  EXPECT_THROW(gpu->kda_prefill(dev.q, gpu->upload(in.k), dev.v, dev.g, dev.beta, short_table, state),
               Error);  // k F32, q BF16
  // Head size 48 has no prefill kernel (decode takes it through the generic kernel).
  const CoreInputs odd = make_core_inputs(*cpu, 4, 2, 48, 48, Gate::kMild, rng);
  const DeviceCore dev_odd = upload_core(*gpu, odd);
  Tensor odd_state = gpu->zeros({1, 2, 48, 48}, DType::kF32);
  EXPECT_THROW(
      gpu->kda_prefill(dev_odd.q, dev_odd.k, dev_odd.v, dev_odd.g, dev_odd.beta, short_table, odd_state),
      Error);
  Tensor conv_state = gpu->zeros({2, 32, 4}, DType::kF32);  // W-1 = 4 does not match w's width 4
  const Tensor x = gpu->upload(as_bf16(random_f32({4, 32}, rng))), w = gpu->upload(random_f32({32, 4}, rng));
  EXPECT_THROW(gpu->short_conv(x, w, short_table, conv_state), Error);
  const Tensor gate = gpu->upload(as_bf16(random_f32({4, 2, 17}, rng)));
  EXPECT_THROW(gpu->gated_rms_norm(dev.v, gate, gpu->upload(random_f32({16}, rng)), 1e-5f), Error);
}

}  // namespace
}  // namespace hlm
