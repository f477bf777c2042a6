// `helixlm logits`: the logits at every position of a token sequence as a float32 .npy [len, vocab].
// Positions before --prefill-len come from prefill (in chunks of --prefill-chunk), the rest are fed one
// token at a time through the decode path, so one file checks both paths against a reference.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "base/npy.h"
#include "cli/commands.h"
#include "cli/session.h"

namespace hlm {

namespace {

// The output is written after the whole computation; an unwritable path is refused before it. Opening
// for append creates nothing that was not there (the probe file is removed) and truncates nothing.
void check_writable(const std::string& path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  std::FILE* f = std::fopen(path.c_str(), "ab");
  HLM_CHECK(f != nullptr, "-o {}: cannot write there: {}", path, std::strerror(errno));
  std::fclose(f);
  if (!existed) std::filesystem::remove(path, ec);
}

struct LogitsArgs {
  SessionOptions session;
  std::string ids;
  int64_t prefill_len = -1;
  int64_t prefill_chunk = 0;
  std::string output;
};

int run_logits(const LogitsArgs& a) {
  std::vector<int32_t> ids = parse_ids(a.ids, "--ids");
  const auto len = static_cast<int64_t>(ids.size());
  HLM_CHECK(a.prefill_len >= -1, "--prefill-len must be >= 0, or -1 for all the ids (got {})", a.prefill_len);
  const int64_t prefill = a.prefill_len < 0 ? len : a.prefill_len;
  HLM_CHECK(prefill <= len, "--prefill-len {} exceeds the {} ids given", prefill, len);
  HLM_CHECK(a.prefill_chunk >= 0, "--prefill-chunk must be >= 0 (got {})", a.prefill_chunk);
  const int64_t chunk = a.prefill_chunk > 0 ? a.prefill_chunk : std::max<int64_t>(prefill, 1);
  int world = 1, rank = 0;
  mpi_world(&world, &rank);
  if (rank == 0) check_writable(a.output);  // only rank 0 writes it
  SessionOptions so = a.session;
  so.length_option = "--ids";
  so.max_step_tokens = chunk;
  so.max_logit_rows = chunk;
  Session s(so, len);
  if (!s.is_driver()) {
    s.engine().serve();
    return 0;
  }
  const ModelConfig& cfg = s.config();
  for (int32_t t : ids) {
    HLM_CHECK(t < cfg.vocab_size, "--ids: token id {} is outside the vocabulary [0, {})", t, cfg.vocab_size);
  }
  Tensor out = Tensor::empty({len, cfg.vocab_size}, DType::kF32);
  int64_t done = 0;
  auto run = [&](int64_t n) {
    StepPlan plan;
    plan.entries.push_back(
        StepEntry{0, done == 0, true, std::vector<int32_t>(ids.begin() + done, ids.begin() + done + n)});
    Tensor logits = s.engine().step(plan)[0];  // [n, vocab]
    std::copy_n(logits.data<float>(), logits.numel(), out.data<float>() + done * cfg.vocab_size);
    done += n;
  };
  while (done < prefill) run(std::min(chunk, prefill - done));
  while (done < len) run(1);
  s.engine().stop();
  write_npy(a.output, out);
  return 0;
}

}  // namespace

CommandRunner add_logits_command(CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* cmd =
      app.add_subcommand("logits", "Write the logits at every position of a token sequence (.npy)");
  add_session_options(*cmd, args->session);
  cmd->add_option("--ids", args->ids, "Token ids, comma-separated")->required();
  cmd->add_option("--prefill-len", args->prefill_len,
                  "Positions fed by prefill; the rest go one token at a time through decode (default, -1: "
                  "all)");
  cmd->add_option("--prefill-chunk", args->prefill_chunk,
                  "Prefill in chunks of this many tokens (default: one)");
  cmd->add_option("-o,--output", args->output, "Output .npy path")->required();
  return [args] { return run_logits(*args); };
}

}  // namespace hlm
