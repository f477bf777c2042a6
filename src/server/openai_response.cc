#include "server/openai_response.h"

namespace hlm {

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& payload) { return "data: " + dump_json(payload) + "\n\n"; }

GenerationResponse::GenerationResponse(const GenerationRequest& r, const ServingContext& ctx, std::string id,
                                       int64_t created)
    : endpoint_(r.endpoint),
      stream_(r.stream),
      include_usage_(r.include_usage),
      return_token_ids_(r.return_token_ids),
      want_logprobs_(r.seq.top_logprobs >= 0),
      id_(std::move(id)),
      created_(created),
      model_(ctx.model_name),
      prompt_(r.seq.prompt),
      text_(ctx.tokenizer, r.stop, r.skip_special_tokens) {
  if (endpoint_ == Endpoint::kChat && ctx.chat) {
    // Kimi Linear: always split <think>; K3: the flag also says whether the prompt opened the think channel.
    const bool reasoning =
        ctx.chat->format() == ChatFormat::kK3 ? ctx.chat->generation_starts_in_reasoning() : true;
    parser_.emplace(ctx.chat->format(), r.parse_tools, reasoning);
  }
  if (endpoint_ == Endpoint::kCompletions) {
    logprobs_ = {{"tokens", nlohmann::json::array()},
                 {"token_logprobs", nlohmann::json::array()},
                 {"top_logprobs", nlohmann::json::array()},
                 {"text_offset", nlohmann::json::array()}};
  }
}

const std::string& GenerationResponse::finish_reason() const {
  static const std::string kNone;
  return finish_reason_ ? *finish_reason_ : kNone;
}

void GenerationResponse::end(FinishReason reason) {
  if (finish_reason_) return;
  if (reason == FinishReason::kLength && !text_.stopped()) {
    finish_reason_ = "length";
  } else if (parser_ && parser_->tool_call_count() > 0) {
    finish_reason_ = "tool_calls";
  } else {
    finish_reason_ = "stop";
  }
}

nlohmann::json GenerationResponse::delta_from_text(const std::string& text, bool final) {
  nlohmann::json delta = nlohmann::json::object();
  if (endpoint_ == Endpoint::kCompletions) {
    content_ += text;
    if (!text.empty()) delta["text"] = text;
    return delta;
  }
  ParsedDelta d = parser_->push(text);
  if (final) {
    ParsedDelta rest = parser_->finish();
    d.content += rest.content;
    d.reasoning_content += rest.reasoning_content;
    d.tool_calls.insert(d.tool_calls.end(), rest.tool_calls.begin(), rest.tool_calls.end());
  }
  content_ += d.content;
  reasoning_ += d.reasoning_content;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
  if (!d.tool_calls.empty()) {
    nlohmann::json calls = nlohmann::json::array();
    for (const ToolCall& c : d.tool_calls) {
      calls.push_back({{"index", tool_call_index_++},
                       {"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      tool_calls_.push_back(c);
    }
    delta["tool_calls"] = calls;
  }
  return delta;
}

nlohmann::json GenerationResponse::logprobs_entry(const SampledToken& t) const {
  // The token's own bytes, not those of its repaired text: a token holding part of a UTF-8 character
  // shows as U+FFFD, and the bytes are what lets a client put the character back together.
  auto bytes = [this](int32_t id) {
    const std::optional<std::string> raw = text_.token_bytes(id);
    if (!raw) return nlohmann::json(nullptr);
    nlohmann::json b = nlohmann::json::array();
    for (unsigned char c : *raw) b.push_back(static_cast<int>(c));
    return b;
  };
  nlohmann::json top = nlohmann::json::array();
  for (const TokenLogprob& a : t.top) {
    top.push_back({{"token", text_.token_text(a.id)}, {"logprob", a.logprob}, {"bytes", bytes(a.id)}});
  }
  return {{"token", text_.token_text(t.id)},
          {"logprob", t.logprob},
          {"bytes", bytes(t.id)},
          {"top_logprobs", top}};
}

nlohmann::json GenerationResponse::chunk(nlohmann::json choice) const {
  nlohmann::json c = {{"id", id_},
                      {"object", endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
                      {"created", created_},
                      {"model", model_},
                      {"choices", nlohmann::json::array({std::move(choice)})}};
  if (include_usage_) c["usage"] = nullptr;
  return c;
}

nlohmann::json GenerationResponse::usage() const {
  return {{"prompt_tokens", prompt_tokens()},
          {"completion_tokens", completion_tokens()},
          {"total_tokens", prompt_tokens() + completion_tokens()}};
}

std::vector<nlohmann::json> GenerationResponse::push(const SeqOutput& out) {
  std::vector<nlohmann::json> chunks;
  if (done()) return chunks;
  std::string text;
  nlohmann::json lp = nullptr;
  if (out.token) {
    ids_.push_back(out.token->id);
    // OpenAI's text_offset: where the token's text starts in the returned text, in characters. Text
    // held back (part of a character, a possible stop string) counts: it is released later, in front.
    const int64_t offset = text_.decoded_chars();
    text = text_.push(out.token->id, out.stop_token);
    if (want_logprobs_) {
      const nlohmann::json e = logprobs_entry(*out.token);
      if (endpoint_ == Endpoint::kChat) {
        logprobs_.push_back(e);
        lp = {{"content", nlohmann::json::array({e})}};
      } else {
        nlohmann::json top = nlohmann::json::object();
        // Keyed by text, so tokens that decode alike share an entry: the likelier one keeps it.
        for (const nlohmann::json& a : e["top_logprobs"]) {
          if (!top.contains(a["token"].get<std::string>())) top[a["token"].get<std::string>()] = a["logprob"];
        }
        logprobs_["tokens"].push_back(e["token"]);
        logprobs_["token_logprobs"].push_back(e["logprob"]);
        logprobs_["top_logprobs"].push_back(top);
        logprobs_["text_offset"].push_back(offset);
        lp = {{"tokens", {e["token"]}},
              {"token_logprobs", {e["logprob"]}},
              {"top_logprobs", {top}},
              {"text_offset", {offset}}};
      }
    }
  }
  const bool final = out.finish != FinishReason::kNone || text_.stopped();
  if (final) text += text_.finish();
  nlohmann::json delta = delta_from_text(text, final);
  if (final) end(out.finish);
  if (!stream_) return chunks;

  nlohmann::json choice = {{"index", 0}, {"logprobs", lp}, {"finish_reason", nullptr}};
  if (final) choice["finish_reason"] = *finish_reason_;
  if (return_token_ids_ && out.token) choice["token_ids"] = {out.token->id};
  if (endpoint_ == Endpoint::kChat) {
    if (!sent_role_) {
      delta["role"] = "assistant";
      if (!delta.contains("content")) delta["content"] = "";
      sent_role_ = true;
    }
    choice["delta"] = delta;
  } else {
    choice["text"] = delta.value("text", "");
  }
  const bool empty = delta.empty() || (endpoint_ == Endpoint::kCompletions && !delta.contains("text"));
  if (!empty || final || !lp.is_null() || choice.contains("token_ids"))
    chunks.push_back(chunk(std::move(choice)));
  return chunks;
}

std::vector<nlohmann::json> GenerationResponse::finish_chunks() {
  std::vector<nlohmann::json> chunks;
  if (include_usage_) {
    nlohmann::json c = chunk(nullptr);
    c["choices"] = nlohmann::json::array();
    c["usage"] = usage();
    chunks.push_back(std::move(c));
  }
  return chunks;
}

nlohmann::json GenerationResponse::result() {
  nlohmann::json choice = {{"index", 0}, {"finish_reason", finish_reason()}};
  nlohmann::json lp = nullptr;
  if (want_logprobs_) lp = endpoint_ == Endpoint::kChat ? nlohmann::json{{"content", logprobs_}} : logprobs_;
  choice["logprobs"] = lp;
  if (endpoint_ == Endpoint::kChat) {
    nlohmann::json message = {{"role", "assistant"}, {"content", content_}};
    if (!reasoning_.empty()) message["reasoning_content"] = reasoning_;
    if (!tool_calls_.empty()) {
      nlohmann::json calls = nlohmann::json::array();
      for (const ToolCall& c : tool_calls_) {
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      message["tool_calls"] = calls;
      // OpenAI sends null content when the turn is only tool calls.
      if (content_.empty()) message["content"] = nullptr;
    }
    choice["message"] = message;
  } else {
    choice["text"] = content_;
  }
  if (return_token_ids_) {
    choice["prompt_token_ids"] = prompt_;
    choice["token_ids"] = ids_;
  }
  return {{"id", id_},
          {"object", endpoint_ == Endpoint::kChat ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", nlohmann::json::array({choice})},
          {"usage", usage()}};
}

}  // namespace hlm
