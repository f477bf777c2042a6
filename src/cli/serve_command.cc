// `helixlm serve`: the OpenAI-compatible HTTP server. Rank 0 binds the port first (so /health answers
// "Loading model" while weights load), loads the model like every other command, then runs the engine
// loop on its main thread (the thread MPI belongs to) while HTTP threads parse requests and stream
// answers; the other ranks execute the broadcast step plans in Engine::serve(). SIGINT / SIGTERM drain:
// new requests get 503, the admitted ones finish, then the process exits 0; a second signal fails the
// requests still open (an error event ends each stream, a whole answer gets 503) and exits 1.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "runtime/scheduler.h"
#include "server/engine_loop.h"
#include "server/http_server.h"
#include "server/openai_service.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"
#include "weights/model_source.h"

namespace hlm {

namespace {

struct ServeArgs {
  SessionOptions session;
  HttpOptions http;
  std::string served_model_name;
  std::string api_key_file;
  int32_t max_num_seqs = 8;
  int64_t max_num_batched_tokens = 512;
  int64_t max_model_len = 4096;
  int32_t max_queued = 32;
  int64_t kv_pages = 0;
};

// Signals received; the engine loop reads it between steps.
std::atomic<int> g_stop_requests{0};

void on_signal(int) { g_stop_requests.fetch_add(1); }

// How long answers that are complete on the engine side may take to reach their clients at shutdown.
constexpr std::chrono::seconds kWriteOutGrace{10};

// Every running or queued request may hold an HTTP thread (HttpOptions::threads below): these bounds keep
// that pool creatable. httplib's pool cannot fail cleanly (a thread that cannot be started ends the
// process), so 100,000 sequences must be refused here, not found out there.
constexpr int32_t kMaxNumSeqs = 4096;
constexpr int32_t kMaxQueued = 4096;

// The key of --api-key-file: its first line, without trailing white space.
std::string read_api_key_file(const std::string& path) {
  std::ifstream in(path);
  HLM_CHECK(in.good(), "--api-key-file {}: cannot be read", path);
  std::string key;
  std::getline(in, key);
  key.erase(key.find_last_not_of(" \t\r\n") + 1);
  HLM_CHECK(!key.empty(), "--api-key-file {}: its first line holds no key", path);
  return key;
}

int run_serve(const ServeArgs& a) {
  HLM_CHECK(a.max_num_seqs >= 1 && a.max_num_seqs <= kMaxNumSeqs,
            "--max-num-seqs must be in [1, {}] (got {})", kMaxNumSeqs, a.max_num_seqs);
  HLM_CHECK(a.max_queued >= 0 && a.max_queued <= kMaxQueued,
            "--max-queued-requests must be in [0, {}] (got {})", kMaxQueued, a.max_queued);
  int world = 1, rank = 0;
  mpi_world(&world, &rank);
  // A model that cannot be found fails before the port is taken.
  resolve_model_dir(a.session.model_dir);
  Metrics metrics;
  std::unique_ptr<HttpServer> http;
  if (rank == 0) {
    HttpOptions ho = a.http;
    if (!a.api_key_file.empty()) ho.api_key = read_api_key_file(a.api_key_file);
    // Every running or queued request may hold a connection, and the refused ones need threads to be
    // refused on; idle keep-alive connections hold one too.
    ho.threads = 2 * (a.max_num_seqs + a.max_queued) + 16;
    http = std::make_unique<HttpServer>(ho, metrics);
    http->start();
    spdlog::info("listening on http://{}:{} (loading the model)", ho.host, ho.port);
  }

  SessionOptions so = a.session;
  so.engine.max_batch = a.max_num_seqs;
  so.max_step_tokens = a.max_num_batched_tokens + a.max_num_seqs;
  // A step returns one row of logits per sequence, and the prompt positions of echo requests on top.
  so.max_logit_rows = a.max_num_seqs + kPromptLogprobRowsPerStep;
  so.engine.num_pages = a.kv_pages;
  // The cache holds --max-model-len tokens per sequence, or the warmup sequence where that is longer
  // (Session sizes it so, and its refusals name whichever it was).
  so.batch_option = "--max-num-seqs";
  so.length_option = "--max-model-len";
  Session s(so, a.max_model_len);
  if (!s.is_driver()) {
    s.engine().serve();
    return 0;
  }

  const std::string& dir = s.model_dir();
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat;
  if (std::filesystem::exists(dir + "/tiktoken.model")) {
    tokenizer = Tokenizer::load(dir);
    HLM_CHECK(tokenizer->vocab_size() <= s.config().vocab_size,
              "the tokenizer of {} has ids up to {} but the model's vocabulary is {}", dir,
              tokenizer->vocab_size() - 1, s.config().vocab_size);
    chat.emplace(*tokenizer, detect_chat_format(dir));
  } else {
    spdlog::warn("{} has no tiktoken.model: serving token-id prompts on /v1/completions only", dir);
  }

  Scheduler scheduler(s.engine(), SchedulerOptions{a.max_num_seqs, a.max_num_batched_tokens});
  HLM_CHECK(scheduler.pages_for(a.max_model_len) <= scheduler.pages_total(),
            "--kv-pages {} cannot hold one sequence of --max-model-len {} ({} pages of {} tokens needed)",
            a.kv_pages, a.max_model_len, scheduler.pages_for(a.max_model_len), so.engine.tokens_per_block);
  EngineLoop loop(scheduler, metrics, a.max_num_seqs, a.max_queued, g_stop_requests);
  const std::string name = a.served_model_name.empty() ? a.session.model_dir : a.served_model_name;
  const ServingContext ctx{name,
                           a.max_model_len,
                           s.config().vocab_size,
                           tokenizer ? &*tokenizer : nullptr,
                           chat ? &*chat : nullptr,
                           static_cast<int64_t>(a.max_num_seqs) + a.max_queued,
                           tokenizer ? load_jinja_chat_template(dir) : std::nullopt,
                           tokenizer ? constraint_vocab(*tokenizer, s.config().vocab_size) : nullptr};
  OpenAiService service(ctx, loop, metrics);

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  http->attach(&service);
  spdlog::info(
      "serving '{}' on http://{}:{} ({} sequences, {} tokens per step, max model length {}, {} KV pages)",
      name, a.http.host, a.http.port, a.max_num_seqs, a.max_num_batched_tokens, a.max_model_len,
      scheduler.pages_total());
  // The HTTP server stops only once every answer is out: stopping it ends a stream where it stands.
  auto stop_http = [&] {
    if (!service.wait_responses_written(kWriteOutGrace))
      spdlog::warn("some responses were still being written after {} s; closing anyway",
                   kWriteOutGrace.count());
    http->stop();
  };
  int64_t cut = 0;
  try {
    cut = loop.run();
  } catch (...) {
    stop_http();
    throw;
  }
  spdlog::info("shutting down");
  stop_http();
  s.engine().stop();
  return cut > 0 ? 1 : 0;
}

}  // namespace

CommandRunner add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  add_session_options(*cmd, a->session);
  // The server's own names for these (vLLM's) replace the session's --max-batch / --max-seq-len.
  cmd->remove_option(cmd->get_option("--max-batch"));
  cmd->remove_option(cmd->get_option("--max-seq-len"));
  cmd->add_option("--host", a->http.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->http.port, "Port to listen on")->capture_default_str();
  CLI::Option* key = cmd->add_option("--api-key", a->http.api_key,
                                     "Require 'Authorization: Bearer KEY' on the API endpoints");
  cmd->add_option(
         "--api-key-file", a->api_key_file,
         "--api-key read from this file (its first line), which keeps the key out of the process list")
      ->excludes(key);
  cmd->add_option("--served-model-name", a->served_model_name,
                  "Model name in the API (default: the -m argument)");
  cmd->add_option("--max-num-seqs", a->max_num_seqs, "Sequences running at once")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", a->max_num_batched_tokens,
                  "Tokens per engine step (decode tokens plus prompt chunks)")
      ->capture_default_str();
  cmd->add_option("--max-model-len", a->max_model_len, "Longest prompt + completion of a request, in tokens")
      ->capture_default_str();
  cmd->add_option("--max-queued-requests", a->max_queued,
                  "Requests that may wait beyond the running ones; more get 429 at once")
      ->capture_default_str();
  cmd->add_option("--kv-pages", a->kv_pages,
                  "MLA KV pages per rank (default: room for --max-num-seqs sequences of --max-model-len)");
  cmd->add_option("--max-request-bytes", a->http.max_body_bytes, "Largest request body; larger ones get 413")
      ->capture_default_str();
  return [a] { return run_serve(*a); };
}

}  // namespace hlm
