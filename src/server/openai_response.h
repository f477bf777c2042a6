// GenerationResponse: one request's answer in the OpenAI shapes, built from the engine's token outputs.
// The same object serves streaming (each push() returns the SSE chunks to send) and non-streaming
// (result() once done). Each choice (one engine sequence; several for n > 1 or a batch of prompts) owns
// its text pipeline: TextOutput (detokenization, stop strings), then for chat the OutputParser (content /
// reasoning_content / tool_calls), and gathers its finish reason, log-probabilities and, on request,
// token ids; usage adds the choices up, each prompt counted once. With echo, a choice's text (and its
// legacy log-probabilities) starts with its prompt's. With best_of above n, every generated choice runs its
// pipeline and the answer keeps the n of each prompt with the highest cumulative log-probability. vLLM's
// prompt_logprobs come with a choice's first output and go in the whole answer (per choice for completions,
// once for chat, as vLLM places them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/scheduler.h"
#include "server/openai_request.h"
#include "server/text_output.h"
#include "tokenizer/output_parser.h"

namespace hlm {

class GenerationResponse {
 public:
  GenerationResponse(const GenerationRequest& request, const ServingContext& ctx, std::string id,
                     int64_t created);

  int choices() const { return static_cast<int>(choices_.size()); }
  // Streaming chunks this output of choice `c` produces (none when nothing is ready to send).
  std::vector<nlohmann::json> push(int c, const SeqOutput& output);
  // Streaming: the last chunks (usage when asked), once every choice is done.
  std::vector<nlohmann::json> finish_chunks();

  // Ended: the engine finished the choice's sequence or a stop string matched (then the caller cancels it).
  bool done(int c) const { return choices_[c].finish_reason.has_value(); }
  bool done() const;
  bool stopped_by_text(int c) const { return choices_[c].text.stopped(); }
  // Non-streaming: the whole response (call once done()).
  nlohmann::json result();

  int64_t prompt_tokens() const;
  int64_t completion_tokens() const;
  // The choice's finish reason ("" while it runs).
  const std::string& finish_reason(int c) const;
  // The choices' finish reasons, ", "-joined where they differ (for the request's log line).
  std::string finish_reason() const;
  const std::string& id() const { return id_; }

 private:
  struct Choice {
    Choice(const ServingContext& ctx, const GenerationRequest& r, const SeqRequest& seq);
    std::vector<int32_t> prompt;
    TextOutput text;
    std::optional<OutputParser> parser;
    bool sent_role = false;
    std::vector<int32_t> ids;
    double cumulative_logprob = 0.0;  // of the sampled tokens (best_of's ranking)
    std::optional<std::string> finish_reason;
    bool echoed = false;
    int64_t offset_base = 0;  // characters in front of the generated text (the echoed prompt)
    // Non-streaming accumulation.
    std::string content;
    std::string reasoning;
    std::vector<ToolCall> tool_calls;
    nlohmann::json logprobs = nlohmann::json::array();
    nlohmann::json prompt_logprobs = nullptr;  // [null, {id: {logprob, rank, decoded_token}}, ...]
    int tool_call_index = 0;
  };

  // Text released by `text` through the choice's parser (chat) into the delta fields; with parallel tool
  // calls off, a call after the first is dropped.
  nlohmann::json delta_from_text(Choice& c, const std::string& text, bool final);
  nlohmann::json logprobs_entry(const Choice& c, const SampledToken& t) const;
  // vLLM's entry of one scored prompt position: the token with its rank, and prompt_top_ alternatives.
  nlohmann::json prompt_logprobs_entry(const Choice& c, const SampledToken& t) const;
  // Appends one token to the legacy (completions) log-probabilities of the choice and of the chunk `lp`.
  void add_legacy_logprob(Choice& c, nlohmann::json& lp, const nlohmann::json& token,
                          const nlohmann::json& logprob, const nlohmann::json& top, int64_t offset);
  // The echoed prompt's text, and its tokens' log-probabilities into `lp` (from the first output).
  std::string echo_prompt(Choice& c, const SeqOutput& out, nlohmann::json& lp);
  nlohmann::json chunk(nlohmann::json choice) const;
  nlohmann::json usage() const;
  // Generated choice `which` as the answer's choice `index`.
  nlohmann::json choice_result(int which, int64_t index);
  // The generated choices the answer keeps, in its order: per prompt, all of them, or (best_of above n)
  // the n of the highest cumulative log-probability, best first (the lower index on ties).
  std::vector<int> answer_choices() const;
  void end(Choice& c, FinishReason reason);
  bool want_logprobs() const { return reported_top_ >= 0; }

  Endpoint endpoint_;
  bool stream_;
  bool include_usage_;
  bool return_token_ids_;
  bool echo_;
  bool parallel_tool_calls_;
  int32_t reported_top_;  // alternatives the logprobs fields carry (-1: the answer has no logprobs)
  int32_t prompt_top_;    // prompt_logprobs' alternatives (-1: not asked)
  int64_t n_;             // choices per prompt in the answer
  int64_t best_of_;       // choices generated per prompt (GenerationRequest::per_prompt)
  const Tokenizer* tokenizer_;
  std::string id_;
  int64_t created_;
  std::string model_;
  std::vector<Choice> choices_;
};

// SSE framing: "data: {json}\n\n"; invalid UTF-8 in model text is replaced, never thrown on.
std::string sse_event(const nlohmann::json& payload);
std::string dump_json(const nlohmann::json& j);

}  // namespace hlm
