// `helixlm bench`: decode latency and throughput at a chosen context length and batch size, and prefill
// speed. Each repeat starts `batch` sequences at `context` tokens and times `steps` decode steps of the
// whole batch (greedy sampling on the backend, as `generate` runs them); the report gives medians over all
// timed steps and the ratio of the measured step time to a physical floor: the bytes one decode step must
// move (this rank's weights as the backend holds them, counting only the routed experts a step is expected
// to touch and one embedding row per token, plus each sequence's KV cache and KDA state read and written)
// over the copy bandwidth measured in the same process.
//
// Contexts reach their length by a real prefill, or, with --synthetic-context (the default with
// --random-weights), by starting the sequences at `context` tokens over caches filled with random values:
// a decode step then reads exactly the bytes a real context of that length holds, without the prefill
// time of a million-token prompt. Prefill speed is then measured on a separate prompt (--prefill-tokens).
//
// --host-sampling takes each step's logits back to the host and samples there (runtime/sampler.h), the path a
// server's sequence takes when it asks for log-probabilities, penalties, logit_bias or a structured output:
// the step then includes the copy of every row's logits (640 KB at Kimi's 163,840 ids) and the host's pass
// over them, which this measures against the default on-device sampling.
//
// On several GPUs (mpirun) with --no-cuda-graphs the report also splits the decode step on rank 0 into
// communication (device time inside the collectives, waits for the other ranks included) and the rest.
//
// --layer-split times the sections of every decode step (the embedding, each KDA / MLA attention and
// dense / MoE FFN, the head; model/step_sections.h) on rank 0's device, graph replays included, and
// reports each kind per layer against its own floor: the bytes that section must move. `plan
// --layer-times` extrapolates a whole model from this report. The marks add graph nodes, so the step time
// of such a run is reported too but is not the plain step time.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "cli/session.h"
#include "model/memory_plan.h"
#include "model/step_sections.h"
#include "runtime/sampler.h"

namespace hlm {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchArgs {
  SessionOptions session;
  int64_t context = 512;
  int32_t batch = 1;
  int64_t steps = 32;
  int repeats = 3;
  int64_t prefill_chunk = 0;    // 0: 512 on the CPU, 8192 on a GPU
  int64_t prefill_tokens = -1;  // synthetic contexts: the prompt timed for prefill (-1: min(context, 8192))
  int synthetic = -1;           // -1: on with --random-weights
  bool json = false;
  int64_t profile_steps = 0;     // decode steps of the last repeat bracketed for a device profiler
  bool profile_prefill = false;  // also bracket the last repeat's timed prefill (synthetic contexts)
  std::string kernel_trace;      // a kernel timeline of the bracketed steps (Ops::trace_kernels)
  bool layer_split = false;      // time the step sections (model/step_sections.h)
  bool host_sampling = false;    // logits to the host, sampled there (runtime/sampler.h)
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Copy bandwidth (bytes read + written per second) of the backend's memory, over buffers far larger than
// the caches: 1 GiB on the host, 2 GiB on a GPU.
double measure_bandwidth(Ops& ops) {
  const int64_t bytes = ops.device() == Device::kCuda ? int64_t{2} << 30 : int64_t{1} << 30;
  Tensor a = ops.zeros({bytes}, DType::kU8), b = ops.zeros({bytes}, DType::kU8);
  ops.copy(a, b);  // first touch
  ops.synchronize();
  std::vector<double> rates;
  for (int i = 0; i < 5; ++i) {
    const auto t = Clock::now();
    ops.copy(a, b);
    ops.synchronize();
    rates.push_back(2.0 * static_cast<double>(bytes) / seconds_since(t));
  }
  return median(rates);
}

// The sections of one timed step, summed by kind into `times` (a kind absent from the step adds 0).
void add_sections(const std::vector<SectionTime>& step,
                  std::array<std::vector<double>, kNumStepSections>& times) {
  std::array<double, kNumStepSections> sum{};
  for (const SectionTime& t : step) {
    const auto it = std::find(kStepSectionNames.begin(), kStepSectionNames.end(), t.label);
    HLM_CHECK(it != kStepSectionNames.end(), "bench: the model marked an unknown section '{}'", t.label);
    sum[static_cast<size_t>(it - kStepSectionNames.begin())] += t.seconds;
  }
  for (int i = 0; i < kNumStepSections; ++i) times[i].push_back(sum[i]);
}

struct SectionReport {
  std::string name;
  int layers = 0;            // sections of this kind in one step
  double seconds = 0;        // median per step, all of them
  double floor_bytes = 0;    // per step, all of them
  double floor_seconds = 0;  // floor_bytes over the copy bandwidth
};

// One row per kind the model has, in step order.
std::vector<SectionReport> section_reports(const ModelConfig& cfg,
                                           const std::array<std::vector<double>, kNumStepSections>& times,
                                           const StepBytes& bytes, double bandwidth) {
  const std::array<int, kNumStepSections> layers = step_section_counts(cfg);
  std::vector<SectionReport> out;
  for (int i = 0; i < kNumStepSections; ++i) {
    if (layers[i] == 0) continue;
    SectionReport r{kStepSectionNames[i], layers[i], median(times[i]), bytes.section[i],
                    bytes.section[i] / bandwidth};
    out.push_back(r);
  }
  return out;
}

void print_sections(const std::vector<SectionReport>& sections, double step) {
  double sum = 0;
  std::cout << fmt::format("{:<14} {:>6} {:>12} {:>13} {:>16} {:>8}\n", "section", "layers", "ms/step",
                           "ms/layer", "floor ms/layer", "/floor");
  for (const SectionReport& r : sections) {
    sum += r.seconds;
    std::cout << fmt::format("{:<14} {:>6} {:>12.4f} {:>13.4f} {:>16.4f} {:>8.2f}\n", r.name, r.layers,
                             r.seconds * 1e3, r.seconds * 1e3 / r.layers, r.floor_seconds * 1e3 / r.layers,
                             r.seconds / r.floor_seconds);
  }
  std::cout << fmt::format(
      "sections sum to {:.3f} ms of the {:.3f} ms step (the rest: planning, uploads, sampling, gaps)\n",
      sum * 1e3, step * 1e3);
}

int run_bench(const BenchArgs& a) {
  HLM_CHECK(a.context > 0 && a.batch > 0 && a.steps > 0 && a.repeats > 0 && a.prefill_chunk >= 0,
            "--context, --batch, --steps and --repeats must be positive, --prefill-chunk >= 0");
  HLM_CHECK(a.profile_steps >= 0 && a.profile_steps < a.steps, "--profile-steps must be in [0, --steps)");
  // A kernel trace records the steps --profile-steps brackets: one, unless more are asked for.
  const int64_t profile_steps =
      a.kernel_trace.empty() ? a.profile_steps : std::max<int64_t>(a.profile_steps, 1);
  HLM_CHECK(profile_steps < a.steps, "--kernel-trace records one of the decode steps: it needs --steps >= 2");
  check_session_options(a.session);
  // Without --random-weights bench runs the checkpoint of -m, whole: these would be ignored.
  HLM_CHECK(a.session.random_weights || a.session.config_path.empty(),
            "--config {} applies only with --random-weights (without it bench runs the checkpoint of -m "
            "{}); add --random-weights, or drop --config",
            a.session.config_path, a.session.model_dir);
  HLM_CHECK(a.session.random_weights || a.session.num_layers == 0,
            "--num-layers {} applies only with --random-weights (a checkpoint of -m runs with all its "
            "layers); add --random-weights and --config, or drop --num-layers",
            a.session.num_layers);
  SessionOptions so = a.session;
  so.section_timing = a.layer_split;
  const bool synthetic = a.synthetic < 0 ? so.random_weights : a.synthetic != 0;
  const Device device = resolve_device(so.device);
  const int64_t chunk = a.prefill_chunk > 0 ? a.prefill_chunk : (device == Device::kCuda ? 8192 : 512);
  const int64_t prefill_tokens =
      a.prefill_tokens >= 0 ? a.prefill_tokens : std::min<int64_t>(a.context, 8192);
  HLM_CHECK(
      !a.profile_prefill || (synthetic && prefill_tokens > 0),
      "--profile-prefill records the timed prompt of a synthetic context: it needs --synthetic-context 1 "
      "(the default with --random-weights) and --prefill-tokens > 0");
  // The engine holds the batch and nothing more: at long contexts every extra slot would be sized for a
  // whole context of KV pages.
  so.batch_option = "--batch";
  so.engine.max_batch = a.batch;
  so.length_option = "--context";
  HLM_CHECK(std::max(a.context, prefill_tokens) <= kMaxSeqLen - a.steps,
            "--context {} + --steps {} exceeds the {} tokens a sequence may hold", a.context, a.steps,
            kMaxSeqLen);
  so.max_step_tokens = std::max<int64_t>(chunk, a.batch);
  so.max_logit_rows = a.batch;
  Session s(so, std::max(a.context, prefill_tokens) + a.steps);
  if (!s.is_driver()) {
    s.engine().serve();
    return 0;
  }
  const ModelConfig& cfg = s.config();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(cfg.vocab_size - 1));
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = token(rng);
    return t;
  };
  if (synthetic) s.model().randomize_caches(99);
  if (!a.kernel_trace.empty()) s.ops().trace_kernels(a.kernel_trace);

  // The compute/communication split of decode steps, from the collectives' device time on this rank
  // (eager steps only: a graph replay runs no host code per collective).
  const bool split = s.comm().size() > 1 && s.device() == Device::kCuda;
  s.comm().enable_timing(split);
  std::vector<double> prefill_rates, step_times, comm_times;
  std::array<std::vector<double>, kNumStepSections> section_times;  // per timed step, seconds
  int64_t next_id = 0;
  Sampler greedy(SamplingParams{}, 0);  // --host-sampling: the default parameters are greedy
  // Prefill of `n` tokens of a new sequence in chunks; returns tokens/s and leaves the sequence alive.
  auto prefill = [&](int64_t id, int64_t n, std::vector<int32_t>* last) {
    const std::vector<int32_t> tokens = random_tokens(n);
    const auto t = Clock::now();
    for (int64_t done = 0; done < n;) {
      const int64_t take = std::min(chunk, n - done);
      StepPlan plan;
      plan.entries.push_back(StepEntry{
          id, done == 0, false, std::vector<int32_t>(tokens.begin() + done, tokens.begin() + done + take)});
      const std::vector<int32_t> ids = s.engine().step_sample(plan, {SampleParams{}});
      if (last != nullptr) last->push_back(ids[0]);
      done += take;
    }
    return static_cast<double>(n) / seconds_since(t);
  };
  for (int rep = 0; rep < a.repeats; ++rep) {
    std::vector<int64_t> ids;
    std::vector<int32_t> next;
    if (synthetic) {
      if (prefill_tokens > 0) {
        const int64_t id = next_id++;
        const bool profiled = a.profile_prefill && rep == a.repeats - 1;
        if (profiled) s.ops().profiler_recording(true);
        prefill_rates.push_back(prefill(id, prefill_tokens, nullptr));
        if (profiled) s.ops().profiler_recording(false);
        StepPlan release;
        release.release.push_back(id);
        s.engine().step(release);
      }
      StepPlan start;
      for (int32_t b = 0; b < a.batch; ++b) {
        ids.push_back(next_id++);
        start.synthetic.push_back(SyntheticSeq{ids.back(), a.context});
        next.push_back(token(rng));
      }
      s.engine().step(start);
    } else {
      const auto t = Clock::now();
      for (int32_t b = 0; b < a.batch; ++b) {
        ids.push_back(next_id++);
        prefill(ids.back(), a.context, &next);
      }
      prefill_rates.push_back(static_cast<double>(a.context * a.batch) / seconds_since(t));
    }
    s.comm().take_collective_seconds();  // drop the prefill's
    for (int64_t step = 0; step < a.steps; ++step) {
      StepPlan decode;
      for (size_t b = 0; b < ids.size(); ++b)
        decode.entries.push_back(StepEntry{ids[b], false, false, {next[b]}});
      if (step == a.steps - 1) decode.release = ids;
      // The middle of the last repeat: caches warm, graphs captured, the sequences not released.
      const int64_t profile_from = (a.steps - profile_steps) / 2;
      const bool profiled =
          rep == a.repeats - 1 && step >= profile_from && step < profile_from + profile_steps;
      if (profiled && step == profile_from) s.ops().profiler_recording(true);
      const auto t = Clock::now();
      if (a.host_sampling) {
        const std::vector<Tensor> logits = s.engine().step(decode);  // per entry [1, vocab], host F32
        for (size_t b = 0; b < logits.size(); ++b) next[b] = greedy.sample(logits[b][0]);
      } else {
        next = s.engine().step_sample(decode, std::vector<SampleParams>(ids.size()));
      }
      step_times.push_back(seconds_since(t));
      if (profiled && step == profile_from + profile_steps - 1) s.ops().profiler_recording(false);
      if (split) comm_times.push_back(s.comm().take_collective_seconds());
      if (a.layer_split) add_sections(s.ops().last_sections(), section_times);
      for (int32_t& x : next) x = std::max(x, 0);  // a non-finite row must not stop a benchmark
    }
    spdlog::info("bench: repeat {}/{} done", rep + 1, a.repeats);
  }
  s.engine().stop();

  const double step = median(step_times);
  const double comm = median(comm_times);  // 0 without a split, or when decode steps were graph replays
  const double bandwidth = measure_bandwidth(s.ops());
  const Mapping& m = s.model().mapping();
  Ops& ops = s.ops();
  const int64_t kv_elem = static_cast<int64_t>(dtype_size(ops.weight_dtype(DType::kBF16)));
  const StepBytes bytes = decode_step_bytes(
      cfg, m, a.context, a.batch, so.engine.tokens_per_block,
      [&](const WeightSpec& spec) {
        const DType stored = s.stored_dtype(spec);
        return stored == DType::kU8 ? stored : ops.weight_dtype(stored);
      },
      kv_elem, kv_elem);
  const double floor = bytes.total() / bandwidth;
  const std::vector<SectionReport> sections =
      a.layer_split ? section_reports(cfg, section_times, bytes, bandwidth) : std::vector<SectionReport>{};
  const std::string model = so.random_weights ? so.config_path + " (random weights)" : so.model_dir;
  if (a.json) {
    nlohmann::json j;
    j["device"] = s.device() == Device::kCuda ? "cuda" : "cpu";
    j["model"] = model;
    j["layers"] = cfg.num_layers;
    j["tp"] = m.tp;
    j["cp"] = m.cp;
    j["context"] = a.context;
    j["synthetic_context"] = synthetic;
    j["batch"] = a.batch;
    j["steps"] = a.steps;
    j["host_sampling"] = a.host_sampling;
    j["repeats"] = a.repeats;
    j["decode_ms_per_step"] = step * 1e3;
    j["tokens_per_s"] = a.batch / step;
    j["prefill_tokens_per_s"] = median(prefill_rates);
    j["prefill_chunk"] = chunk;
    j["copy_bandwidth_gb_s"] = bandwidth / 1e9;
    j["floor_bytes"] = bytes.total();
    j["floor_bytes_weights"] = bytes.weights;
    j["floor_bytes_kv"] = bytes.kv;
    j["floor_bytes_state"] = bytes.state;
    j["floor_ms"] = floor * 1e3;
    j["floor_ratio"] = step / floor;
    if (comm > 0) {
      j["comm_ms_per_step"] = comm * 1e3;
      j["compute_ms_per_step"] = (step - comm) * 1e3;
    }
    if (a.layer_split) {
      // What `plan --layer-times` checks against the model it extrapolates.
      j["model_type"] = cfg.model_type;
      j["hidden_size"] = cfg.hidden_size;
      j["num_experts"] = cfg.num_experts;
      j["kv_bytes_per_value"] = kv_elem;
      j["sections"] = nlohmann::json::array();
      for (const SectionReport& r : sections) {
        j["sections"].push_back({{"name", r.name},
                                 {"layers", r.layers},
                                 {"ms_per_step", r.seconds * 1e3},
                                 {"ms_per_layer", r.seconds * 1e3 / r.layers},
                                 {"floor_bytes", r.floor_bytes},
                                 {"floor_ms_per_layer", r.floor_seconds * 1e3 / r.layers},
                                 {"floor_ratio", r.seconds / r.floor_seconds}});
      }
    }
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "model: {}  layout: tp={} cp={}  context {}{}  batch {}  ({} steps x {} repeats){}\n", model, m.tp,
      m.cp, a.context, synthetic ? " (synthetic)" : "", a.batch, a.steps, a.repeats,
      a.host_sampling ? "  sampled on the host" : "");
  std::cout << fmt::format("prefill: {:.0f} tokens/s (median, chunks of {})\n", median(prefill_rates), chunk);
  std::cout << fmt::format("decode: {:.3f} ms/step median, {:.1f} tokens/s\n", step * 1e3, a.batch / step);
  std::cout << fmt::format(
      "floor: {} B/step on rank 0 (weights {}, KV {}, KDA state {}) at {:.1f} GB/s copy bandwidth = {:.4f} "
      "ms; "
      "measured/floor = {:.2f}\n",
      grouped(static_cast<int64_t>(bytes.total())), grouped(static_cast<int64_t>(bytes.weights)),
      grouped(static_cast<int64_t>(bytes.kv)), grouped(static_cast<int64_t>(bytes.state)), bandwidth / 1e9,
      floor * 1e3, step / floor);
  if (comm > 0) {
    std::cout << fmt::format(
        "split on rank 0: communication {:.3f} ms/step (device time inside collectives, waits for peers "
        "included), compute and launch {:.3f} ms/step\n",
        comm * 1e3, (step - comm) * 1e3);
  } else if (split) {
    std::cout << "split: decode steps ran as CUDA graphs, which are not timed per collective; run with "
                 "--no-cuda-graphs for the compute/communication split\n";
  }
  if (a.layer_split) print_sections(sections, step);
  return 0;
}

}  // namespace

CommandRunner add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Time prefill and decode at a context length and batch size");
  add_session_options(*cmd, a->session);
  cmd->add_option("--config", a->session.config_path, "config.json of the model (with --random-weights)");
  cmd->add_flag("--random-weights", a->session.random_weights,
                "Build the model of --config with random weights on the backend (no checkpoint)");
  cmd->add_option("--num-layers", a->session.num_layers, "Only the first N layers of the model (0: all)");
  cmd->add_option("--context", a->context, "Tokens per sequence before decoding")->capture_default_str();
  cmd->add_option("--batch", a->batch, "Sequences decoded together")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Timed decode steps per repeat")->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Repeats")->capture_default_str();
  cmd->add_option("--prefill-chunk", a->prefill_chunk,
                  "Tokens per prefill step (default: 512 CPU, 8192 GPU)");
  cmd->add_option("--prefill-tokens", a->prefill_tokens,
                  "With a synthetic context: prompt length timed for prefill (default: min(context, 8192))");
  cmd->add_option(
      "--synthetic-context", a->synthetic,
      "1: start sequences at --context over random caches instead of prefilling them (default with "
      "--random-weights); 0: prefill");
  cmd->add_flag("--json", a->json, "Print one JSON object instead of the report");
  cmd->add_option("--profile-steps", a->profile_steps,
                  "Record N decode steps of the last repeat for a device profiler started with recording "
                  "off (ncu --profile-from-start off)");
  cmd->add_option(
         "--kernel-trace", a->kernel_trace,
         "Write the kernels of the decode steps --profile-steps records (one if not given) to FILE as "
         "a Chrome trace (CUPTI; CUDA only) and log their busy and idle time")
      ->type_name("FILE");
  cmd->add_flag("--layer-split", a->layer_split,
                "Time each decode step's sections (embedding, KDA / MLA attention, dense / MoE FFN, head) "
                "and report each per layer against its floor (the marks add graph nodes)");
  cmd->add_flag("--host-sampling", a->host_sampling,
                "Sample each step on the host from logits copied back (the path of requests with "
                "log-probabilities, penalties, logit_bias or structured outputs) instead of on the device");
  cmd->add_flag(
      "--profile-prefill", a->profile_prefill,
      "Record the last repeat's timed prefill (--prefill-tokens) for a device profiler started with "
      "recording off");
  return [a] { return run_bench(*a); };
}

}  // namespace hlm
