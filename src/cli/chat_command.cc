// `helixlm chat`: an interactive conversation in the terminal, without HTTP. Each line read from stdin is
// a user turn; the whole history is rendered with the model's chat format and run through the same
// Scheduler as the server, and the answer is printed as it is generated (reasoning in brackets). An empty
// line or end of input ends the session. Under mpirun, rank 0 talks and the other ranks run the steps.
// --json-schema and --json constrain every answer as the server's response_format does.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/session.h"
#include "parallel/placement.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "server/openai_request.h"
#include "server/text_output.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/output_parser.h"

namespace hlm {

namespace {

struct ChatArgs {
  SessionOptions session;
  std::string system;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  LogitsAdjustments adjust;
  std::string json_schema;  // a file
  bool json_object = false;
};

// The schema every answer follows (--json-schema, --json), or null; errors name the file.
std::shared_ptr<const JsonSchema> answer_schema(const ChatArgs& a) {
  if (a.json_object) return JsonSchema::any_object();
  if (a.json_schema.empty()) return nullptr;
  std::ifstream in(a.json_schema);
  HLM_CHECK(in.good(), "--json-schema: cannot read {}", a.json_schema);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::ordered_json doc =
      nlohmann::ordered_json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  HLM_CHECK(!doc.is_discarded(), "--json-schema: {} is not JSON", a.json_schema);
  return JsonSchema::compile(doc, a.json_schema);
}

// Prints what the parser releases; returns the assistant message for the history.
void show(const ParsedDelta& d, ChatMessage& reply) {
  if (!d.reasoning_content.empty()) std::cout << "[" << d.reasoning_content << "]";
  std::cout << d.content;
  for (const ToolCall& c : d.tool_calls) std::cout << "\n(tool call " << c.name << " " << c.arguments << ")";
  check_stdout();
  reply.content += d.content;
  reply.reasoning_content += d.reasoning_content;
  reply.tool_calls.insert(reply.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
}

int run_chat(const ChatArgs& a) {
  // Before the model loads and a line is read.
  check_session_options(a.session);
  HLM_CHECK(a.max_tokens >= 0 && a.max_tokens <= kMaxSeqLen, "-n/--max-tokens must be in [0, {}] (got {})",
            kMaxSeqLen, a.max_tokens);
  check_sampling_options(a.sampling, a.adjust);
  const std::shared_ptr<const JsonSchema> schema = answer_schema(a);
  Session s(a.session, 0);
  if (!s.is_driver()) {
    s.engine().serve();
    return 0;
  }
  const std::string& dir = s.model_dir();
  HLM_CHECK(std::filesystem::exists(dir + "/tiktoken.model"),
            "{} has no tiktoken.model: chat needs a tokenizer", dir);
  const Tokenizer tok = Tokenizer::load(dir);
  const ChatTemplate chat(tok, detect_chat_format(dir));
  LogitsAdjustments adjust = a.adjust;
  if (schema) {
    adjust.constraint.vocab = constraint_vocab(tok, s.config().vocab_size);
    adjust.constraint.json = schema;
  }
  Scheduler scheduler(s.engine(), SchedulerOptions{1, 512});
  const int64_t max_len = s.engine().options().max_seq_len;
  const bool interactive = isatty(STDIN_FILENO);

  std::vector<ChatMessage> history;
  if (!a.system.empty()) history.push_back(ChatMessage{"system", a.system, "", {}, "", ""});
  std::string line;
  for (int64_t turn = 0;; ++turn) {
    if (interactive) std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line) || line.empty()) break;
    history.push_back(ChatMessage{"user", line, "", {}, "", ""});
    SeqRequest r;
    r.prompt = chat.render(history, nullptr, /*add_generation_prompt=*/true);
    const auto room = max_len - static_cast<int64_t>(r.prompt.size());
    HLM_CHECK(room > 0, "the conversation ({} tokens) no longer fits --max-seq-len {}", r.prompt.size(),
              max_len);
    r.max_new_tokens = std::min(a.max_tokens, room);
    r.sampling = a.sampling;
    r.adjust = adjust;
    r.sampler_stream = static_cast<uint64_t>(turn);
    r.stop_ids = chat.stop_ids();
    scheduler.add(turn, std::move(r));

    TextOutput text(&tok, {}, /*skip_special_tokens=*/true);
    OutputParser parser(chat.format(), /*parse_tools=*/false,
                        chat.format() == ChatFormat::kK3 ? chat.generation_starts_in_reasoning() : true);
    ChatMessage reply{"assistant", "", "", {}, "", ""};
    while (scheduler.has_work()) {
      for (const SeqOutput& o : scheduler.step()) {
        if (o.token) show(parser.push(text.push(o.token->id, o.stop_token)), reply);
      }
    }
    show(parser.push(text.finish()), reply);
    show(parser.finish(), reply);
    std::cout << "\n";
    history.push_back(std::move(reply));
  }
  s.engine().stop();
  return 0;
}

}  // namespace

CommandRunner add_chat_command(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* cmd = app.add_subcommand("chat", "Talk to the model in the terminal (one user turn per line)");
  add_session_options(*cmd, a->session);
  cmd->add_option("--system", a->system, "System prompt");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "Longest answer, in tokens")->capture_default_str();
  add_sampling_options(*cmd, a->sampling, a->adjust);
  cmd->add_option("--json-schema", a->json_schema,
                  "Answer with one instance of the JSON schema in this file (the server's response_format "
                  "subset)");
  cmd->add_flag("--json", a->json_object, "Answer with one JSON object")->excludes("--json-schema");
  return [a] { return run_chat(*a); };
}

}  // namespace hlm
