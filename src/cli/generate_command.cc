// `helixlm generate`: greedy or sampled continuation of one or more prompts given as token ids. With
// several --prompt-ids the prompts run as one batch; stdout has one line per prompt, the generated ids
// comma-separated.
#include <algorithm>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "cli/session.h"
#include "runtime/generate.h"

namespace hlm {

namespace {

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

  SessionOptions so = a.session;
  so.engine.max_batch = std::max<int32_t>(so.engine.max_batch, static_cast<int32_t>(prompts.size()));
  so.max_step_tokens = a.gen.step_tokens + so.engine.max_batch;
  so.max_logit_rows = so.engine.max_batch;
  Session s(so, longest + a.gen.max_new_tokens);
  if (!s.is_driver()) {
    s.engine().serve();
    return 0;
  }
  GenerateOptions go = a.gen;
  go.stop_at_eos = !a.ignore_eos;
  std::vector<std::vector<int32_t>> out = generate(s.engine(), prompts, go);
  s.engine().stop();
  for (const auto& ids : out) std::cout << fmt::format("{}", fmt::join(ids, ",")) << "\n";
  std::cout.flush();
  return 0;
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
  cmd->add_option("--temperature", args->gen.sampling.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", args->gen.sampling.top_k, "Keep the k most likely tokens (0 = all)")
      ->capture_default_str();
  cmd->add_option("--top-p", args->gen.sampling.top_p, "Nucleus sampling threshold")->capture_default_str();
  cmd->add_option("--seed", args->gen.sampling.seed, "Random seed for sampling")->capture_default_str();
  cmd->add_option("--prefill-chunk", args->gen.step_tokens, "Tokens per engine step (prefill chunk size)")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at the end-of-sequence token");
  return [args] { return run_generate(*args); };
}

}  // namespace hlm
