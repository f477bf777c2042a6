// GenerationResponse: one request's answer in the OpenAI shapes, built from the engine's token outputs.
// The same object serves streaming (each push() returns the SSE chunks to send) and non-streaming
// (result() once done). It owns the text pipeline: TextOutput (detokenization, stop strings), then for
// chat the OutputParser (content / reasoning_content / tool_calls), and it gathers usage, finish reason,
// log-probabilities and, on request, token ids.
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

  // Streaming chunks this output produces (none when nothing is ready to send).
  std::vector<nlohmann::json> push(const SeqOutput& output);
  // Streaming: the last chunks (held-back text, finish reason, usage when asked).
  std::vector<nlohmann::json> finish_chunks();

  // Ended: the engine finished the sequence or a stop string matched (then the caller cancels it).
  bool done() const { return finish_reason_.has_value(); }
  bool stopped_by_text() const { return text_.stopped(); }
  // Non-streaming: the whole response (call once done()).
  nlohmann::json result();

  int64_t prompt_tokens() const { return static_cast<int64_t>(prompt_.size()); }
  int64_t completion_tokens() const { return static_cast<int64_t>(ids_.size()); }
  const std::string& finish_reason() const;
  const std::string& id() const { return id_; }

 private:
  // Text released by `text` through the parser (chat) into the delta fields.
  nlohmann::json delta_from_text(const std::string& text, bool final);
  nlohmann::json logprobs_entry(const SampledToken& t) const;
  nlohmann::json chunk(nlohmann::json choice) const;
  nlohmann::json usage() const;
  void end(FinishReason reason);

  Endpoint endpoint_;
  bool stream_;
  bool include_usage_;
  bool return_token_ids_;
  bool want_logprobs_;
  std::string id_;
  int64_t created_;
  std::string model_;
  std::vector<int32_t> prompt_;
  TextOutput text_;
  std::optional<OutputParser> parser_;
  bool sent_role_ = false;

  std::vector<int32_t> ids_;
  std::optional<std::string> finish_reason_;
  // Non-streaming accumulation.
  std::string content_;
  std::string reasoning_;
  std::vector<ToolCall> tool_calls_;
  nlohmann::json logprobs_ = nlohmann::json::array();
  int tool_call_index_ = 0;
};

// SSE framing: "data: {json}\n\n"; invalid UTF-8 in model text is replaced, never thrown on.
std::string sse_event(const nlohmann::json& payload);
std::string dump_json(const nlohmann::json& j);

}  // namespace hlm
