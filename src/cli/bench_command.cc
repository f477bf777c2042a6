// `helixlm bench`: decode latency and throughput at a chosen context length and batch size. Each repeat
// prefills `batch` sequences of `context` random tokens, then times `steps` decode steps of the whole
// batch (prefilled in steps of at most --prefill-chunk tokens); the report gives medians over all timed steps
// and repeats, and the ratio of the measured step time to a physical floor: the bytes one decode step must
// move (this rank's weights as the backend holds them, with only the routed experts a step can touch, plus
// each sequence's KV cache and KDA state) over the memory bandwidth measured here by a large copy.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "cli/session.h"
#include "model/memory_plan.h"
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
  int64_t prefill_chunk = 512;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Copy bandwidth (bytes read + written per second) over buffers far larger than the caches.
double measure_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> rates;
  for (int i = 0; i < 3; ++i) {
    const auto t = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    rates.push_back(2.0 * static_cast<double>(bytes) / seconds_since(t));
  }
  return median(rates);
}

int run_bench(const BenchArgs& a) {
  HLM_CHECK(a.context > 0 && a.batch > 0 && a.steps > 0 && a.repeats > 0 && a.prefill_chunk > 0,
            "--context, --batch, --steps, --repeats and --prefill-chunk must be positive");
  check_session_options(a.session);
  SessionOptions so = a.session;
  if (a.batch >= so.engine.max_batch) so.batch_option = "--batch";
  so.engine.max_batch = std::max(so.engine.max_batch, a.batch);
  so.length_option = "--context";
  HLM_CHECK(a.context <= kMaxSeqLen - a.steps,
            "--context {} + --steps {} exceeds the {} tokens a sequence may hold", a.context, a.steps,
            kMaxSeqLen);
  Session s(so, a.context + a.steps);
  if (!s.is_driver()) {
    s.engine().serve();
    return 0;
  }
  const ModelConfig& cfg = s.config();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<double> prefill_rates, step_times;
  int64_t next_id = 0;
  for (int rep = 0; rep < a.repeats; ++rep) {
    std::vector<int64_t> ids;
    for (int32_t b = 0; b < a.batch; ++b) ids.push_back(next_id++);
    // Prefill in steps of at most --prefill-chunk tokens, as generate does: one step of batch x context
    // tokens would need activations in proportion to it.
    std::vector<int32_t> next(a.batch);  // each sequence's next input token
    int32_t seq = 0;
    int64_t sent = 0;  // tokens of `seq` already prefilled
    auto t = Clock::now();
    while (seq < a.batch) {
      StepPlan prefill;
      std::vector<int32_t> ends;  // per entry: the sequence whose prompt it completes, or -1
      for (int64_t budget = a.prefill_chunk; seq < a.batch && budget > 0;) {
        const int64_t n = std::min(budget, a.context - sent);
        std::vector<int32_t> tokens(n);
        for (int32_t& tok : tokens) tok = token(rng);
        prefill.entries.push_back(StepEntry{ids[seq], sent == 0, false, std::move(tokens)});
        sent += n;
        budget -= n;
        ends.push_back(sent == a.context ? seq : -1);
        if (sent == a.context) {
          ++seq;
          sent = 0;
        }
      }
      const std::vector<Tensor> logits = s.engine().step(prefill);
      for (size_t i = 0; i < ends.size(); ++i) {
        if (ends[i] >= 0) next[ends[i]] = argmax(logits[i].data<float>(), cfg.vocab_size);
      }
    }
    prefill_rates.push_back(static_cast<double>(a.context * a.batch) / seconds_since(t));
    for (int64_t step = 0; step < a.steps; ++step) {
      StepPlan decode;
      for (size_t b = 0; b < ids.size(); ++b)
        decode.entries.push_back(StepEntry{ids[b], false, false, {next[b]}});
      if (step == a.steps - 1) decode.release = ids;
      t = Clock::now();
      const std::vector<Tensor> logits = s.engine().step(decode);
      step_times.push_back(seconds_since(t));
      for (size_t b = 0; b < ids.size(); ++b) next[b] = argmax(logits[b].data<float>(), cfg.vocab_size);
    }
    spdlog::info("bench: repeat {}/{} done", rep + 1, a.repeats);
  }
  s.engine().stop();

  const double step = median(step_times);
  const double bandwidth = measure_bandwidth();
  const Mapping& m = s.model().mapping();
  const double bytes = decode_step_bytes(cfg, m, a.context, a.batch, so.engine.tokens_per_block);
  const double floor = bytes / bandwidth;
  std::cout << fmt::format("model: {}  layout: tp={} cp={}  context {}  batch {}  ({} steps x {} repeats)\n",
                           so.model_dir, m.tp, m.cp, a.context, a.batch, a.steps, a.repeats);
  std::cout << fmt::format("prefill: {:.0f} tokens/s (median)\n", median(prefill_rates));
  std::cout << fmt::format("decode: {:.3f} ms/step median, {:.1f} tokens/s\n", step * 1e3, a.batch / step);
  std::cout << fmt::format(
      "floor: {} B/step on rank 0 at {:.1f} GB/s copy bandwidth = {:.4f} ms; measured/floor = {:.1f}\n",
      grouped(static_cast<int64_t>(bytes)), bandwidth / 1e9, floor * 1e3, step / floor);
  return 0;
}

}  // namespace

CommandRunner add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Time prefill and decode at a context length and batch size");
  add_session_options(*cmd, a->session);
  cmd->add_option("--context", a->context, "Prompt tokens per sequence before decoding")
      ->capture_default_str();
  cmd->add_option("--batch", a->batch, "Sequences decoded together")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Timed decode steps per repeat")->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Repeats")->capture_default_str();
  cmd->add_option("--prefill-chunk", a->prefill_chunk,
                  "Tokens per prefill step (the batch's prompts in chunks)")
      ->capture_default_str();
  return [a] { return run_bench(*a); };
}

}  // namespace hlm
