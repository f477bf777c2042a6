// Requests of /v1/completions and /v1/chat/completions, validated into what the engine runs. Every
// field is read with its type and range checked (json_fields.h); what helixlm does not implement (suffix,
// JSON Schema keywords outside runtime/json_schema.h's subset, a forced tool call in K3's format) is refused
// by name rather than silently ignored. Prompts are tokenized here, and lengths are checked against
// --max-model-len, so a request the engine would refuse never leaves the HTTP thread. A request becomes one
// engine sequence per choice: n per prompt (best_of with /v1/completions), and /v1/completions takes a batch
// of prompts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/logits_processor.h"
#include "runtime/scheduler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace hlm {

// What a request is checked and rendered against; owned by the server for its lifetime.
struct ServingContext {
  std::string model_name;
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;                // the model's
  const Tokenizer* tokenizer = nullptr;  // null: the model directory has none; only id prompts work
  const ChatTemplate* chat = nullptr;    // null without a tokenizer
  // Choices (prompts times n) one request may ask for: as many sequences as the server runs and queues
  // at once (--max-num-seqs plus --max-queued-requests), so a request that asks more is a 400, not a 429
  // that no retry can cure.
  int64_t max_choices = 1;
  // The model's own Jinja chat template, for clients that render chats themselves (/tokenizer_info).
  std::optional<std::string> jinja_chat_template{};
  // The vocabulary as text, for response_format json_object and json_schema; null without a tokenizer.
  std::shared_ptr<const ConstraintVocab> json_vocab{};
};

enum class Endpoint { kCompletions, kChat };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // One sequence per generated choice (prompt ids, max_new_tokens, sampling, stop ids, logprobs): choice
  // i·best_of + j is the j-th of prompt i (OpenAI's order). The choices of a prompt share its seed, each on
  // a random stream of its own.
  std::vector<SeqRequest> choices;
  int64_t n = 1;  // choices per prompt in the answer
  // Choices generated per prompt (completions' best_of; n otherwise). Above n the answer holds the n of
  // the highest cumulative log-probability of their sampled tokens, best first (vLLM's and OpenAI's
  // best_of), so every choice computes its tokens' log-probabilities and the answer is not streamed.
  int64_t best_of = 1;
  int64_t per_prompt() const { return best_of > n ? best_of : n; }  // choices generated per prompt
  bool report_logprobs = false;  // the answer carries log-probabilities (logprobs / top_logprobs asked)
  // vLLM's prompt_logprobs: each prompt position's log-probability given the tokens before it, with its
  // rank and this many alternatives (-1: not asked); not on a stream.
  int32_t prompt_logprobs = -1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;  // vLLM's: the matched stop string (or stop id's text) stays
  bool return_token_ids = false;            // vLLM's extension: prompt and output ids in the response
  // Completions only: the prompt comes back in front of each choice's text (with its tokens'
  // log-probabilities when logprobs is asked for, the first token's null).
  bool echo = false;
  // Chat only.
  bool parse_tools = false;  // tools given and tool_choice is not "none"
  // OpenAI's parallel_tool_calls false: at most one tool call. A forced tool_choice constrains the output to
  // one call; under "auto" the answer keeps the first and drops the rest.
  bool parallel_tool_calls = true;
};

// The model's vocabulary as text for constrained decoding: each id's bytes, the tokenizer's added tokens
// (special or not) and ids it lacks excluded.
std::shared_ptr<const ConstraintVocab> constraint_vocab(const Tokenizer& tok, int64_t model_vocab);

// `body`: the raw request body (chat re-reads `tools` in the client's key order for the template).
GenerationRequest parse_completion_request(const std::string& body, const ServingContext& ctx);
GenerationRequest parse_chat_request(const std::string& body, const ServingContext& ctx);

// The OpenAI `messages` array as chat messages (content parts of type "text" are joined).
std::vector<ChatMessage> parse_messages(const nlohmann::json& messages);

}  // namespace hlm
