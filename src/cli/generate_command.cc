// `helixlm generate`: greedy or sampled continuation of one or more prompts given as token ids. With
// several --prompt-ids the prompts run as one batch; stdout has one line per prompt, the generated ids
// comma-separated, streamed as they are produced (LineStream). SIGINT/SIGTERM end generation after the
// current step with every line complete, so an interrupted run keeps what it generated. A prompt whose
// logits turn non-finite fails alone: its line holds the ids before the failure, the others go on, and
// the exit code is 1.
#include <csignal>

#include <algorithm>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/line_stream.h"
#include "cli/session.h"
#include "runtime/generate.h"

namespace hlm {

namespace {

volatile std::sig_atomic_t g_signal = 0;

// The first SIGINT/SIGTERM asks generation to stop after the current step; SA_RESETHAND makes a second
// one end the process at once, for a step that takes too long.
void on_signal(int sig) { g_signal = sig; }

void catch_interrupts() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

struct GenerateArgs {
  SessionOptions session;
  std::vector<std::string> prompt_ids;
  GenerateOptions gen;
  bool ignore_eos = false;
};

int run_generate(const GenerateArgs& a) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : a.prompt_ids) prompts.push_back(parse_ids(p, "--prompt-ids"));
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));

  check_session_options(a.session);
  check_sampling_options(a.gen.sampling, a.gen.adjust);
  HLM_CHECK(a.gen.max_new_tokens >= 0 && a.gen.max_new_tokens <= kMaxSeqLen - longest,
            "-n must be in [0, {}] for a longest prompt of {} tokens (got {})", kMaxSeqLen - longest, longest,
            a.gen.max_new_tokens);
  SessionOptions so = a.session;
  if (static_cast<int64_t>(prompts.size()) > so.engine.max_batch)
    so.batch_option = "the number of --prompt-ids";
  so.engine.max_batch = std::max<int32_t>(so.engine.max_batch, static_cast<int32_t>(prompts.size()));
  so.max_step_tokens = a.gen.step_tokens + so.engine.max_batch;
  so.max_logit_rows = so.engine.max_batch;
  so.length_option = "-n";
  Session s(so, longest + a.gen.max_new_tokens);
  // Every rank: under mpirun a Ctrl-C reaches all of them, and the others must keep serving until rank 0
  // has finished the step and sent the stop.
  catch_interrupts();
  if (!s.is_driver()) {
    s.engine().serve();
    return 0;
  }
  LineStream lines(std::cout, prompts.size());
  GenerateOptions go = a.gen;
  go.stop_at_eos = !a.ignore_eos;
  go.on_token = [&](size_t i, int32_t t) { lines.token(i, t); };
  go.on_done = [&](size_t i) { lines.done(i); };
  // Output that cannot be written ends generation as an interrupt does: every rank stops after the step.
  go.stop_requested = [] { return g_signal != 0 || !std::cout.good(); };
  const std::vector<Generation> out = generate(s.engine(), prompts, go);
  s.engine().stop();
  lines.finish();
  check_stdout();
  int failed = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].error.empty()) continue;
    std::cerr << fmt::format("helixlm: error: prompt {}: {}; its line holds the {} ids before it\n", i,
                             out[i].error, out[i].ids.size());
    ++failed;
  }
  if (g_signal != 0) {
    std::cerr << fmt::format("helixlm: interrupted by signal {}; each line holds the ids generated so far\n",
                             static_cast<int>(g_signal));
    return 128 + g_signal;
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace

CommandRunner add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens after one or more prompts");
  add_session_options(*cmd, args->session);
  cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, comma-separated; repeat for a batch")
      ->required();
  cmd->add_option("-n,--max-new-tokens", args->gen.max_new_tokens, "Tokens to generate per prompt")
      ->capture_default_str();
  add_sampling_options(*cmd, args->gen.sampling, args->gen.adjust);
  cmd->add_option("--prefill-chunk", args->gen.step_tokens, "Tokens per engine step (prefill chunk size)")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at the end-of-sequence token");
  return [args] { return run_generate(*args); };
}

}  // namespace hlm
