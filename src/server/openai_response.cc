#include "server/openai_response.h"

#include <algorithm>

#include "base/error.h"

namespace hlm {

namespace {

// The legacy format keys alternatives by text, so tokens that decode alike share an entry: the likelier
// one keeps it.
nlohmann::json legacy_top(const nlohmann::json& entry) {
  nlohmann::json top = nlohmann::json::object();
  for (const nlohmann::json& a : entry["top_logprobs"]) {
    if (!top.contains(a["token"].get<std::string>())) top[a["token"].get<std::string>()] = a["logprob"];
  }
  return top;
}

}  // namespace

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& payload) { return "data: " + dump_json(payload) + "\n\n"; }

GenerationResponse::Choice::Choice(const ServingContext& ctx, const GenerationRequest& r,
                                   const SeqRequest& seq)
    : prompt(seq.prompt), text(ctx.tokenizer, r.stop, r.skip_special_tokens, r.include_stop_str_in_output) {
  if (r.endpoint == Endpoint::kChat && ctx.chat) {
    // Kimi Linear: always split <think>; K3: the flag also says whether the prompt opened the think channel.
    const bool reasoning =
        ctx.chat->format() == ChatFormat::kK3 ? ctx.chat->generation_starts_in_reasoning() : true;
    parser.emplace(ctx.chat->format(), r.parse_tools, reasoning);
  }
  if (r.endpoint == Endpoint::kCompletions) {
    logprobs = {{"tokens", nlohmann::json::array()},
                {"token_logprobs", nlohmann::json::array()},
                {"top_logprobs", nlohmann::json::array()},
                {"text_offset", nlohmann::json::array()}};
  }
}

GenerationResponse::GenerationResponse(const GenerationRequest& r, const ServingContext& ctx, std::string id,
                                       int64_t created)
    : endpoint_(r.endpoint),
      stream_(r.stream),
      include_usage_(r.include_usage),
      return_token_ids_(r.return_token_ids),
      echo_(r.echo),
      parallel_tool_calls_(r.parallel_tool_calls),
      reported_top_(r.report_logprobs ? std::max(r.choices.front().top_logprobs, 0) : -1),
      prompt_top_(r.prompt_logprobs),
      n_(r.n),
      best_of_(r.per_prompt()),
      tokenizer_(ctx.tokenizer),
      id_(std::move(id)),
      created_(created),
      model_(ctx.model_name) {
  HLM_CHECK(!r.choices.empty() && r.n >= 1 && r.choices.size() % r.per_prompt() == 0,
            "a generation request has {} choices, not a whole number of prompts with {} each",
            r.choices.size(), r.per_prompt());
  HLM_CHECK(!r.stream || r.per_prompt() == r.n,
            "a streamed request generates best_of = {} choices for n = {}", r.best_of, r.n);
  choices_.reserve(r.choices.size());
  for (const SeqRequest& seq : r.choices) choices_.emplace_back(ctx, r, seq);
}

bool GenerationResponse::done() const {
  for (int c = 0; c < choices(); ++c) {
    if (!done(c)) return false;
  }
  return true;
}

const std::string& GenerationResponse::finish_reason(int c) const {
  static const std::string kNone;
  return choices_[c].finish_reason ? *choices_[c].finish_reason : kNone;
}

std::string GenerationResponse::finish_reason() const {
  std::string joined;
  for (const Choice& c : choices_) {
    const std::string reason = c.finish_reason.value_or("");
    if (joined.find(reason) == std::string::npos) joined += (joined.empty() ? "" : ", ") + reason;
  }
  return joined;
}

void GenerationResponse::end(Choice& c, FinishReason reason) {
  if (c.finish_reason) return;
  if (reason == FinishReason::kLength && !c.text.stopped()) {
    c.finish_reason = "length";
  } else if (c.parser && c.parser->tool_call_count() > 0) {
    c.finish_reason = "tool_calls";
  } else {
    c.finish_reason = "stop";
  }
}

nlohmann::json GenerationResponse::delta_from_text(Choice& c, const std::string& text, bool final) {
  nlohmann::json delta = nlohmann::json::object();
  if (endpoint_ == Endpoint::kCompletions) {
    c.content += text;
    if (!text.empty()) delta["text"] = text;
    return delta;
  }
  ParsedDelta d = c.parser->push(text);
  if (final) {
    ParsedDelta rest = c.parser->finish();
    d.content += rest.content;
    d.reasoning_content += rest.reasoning_content;
    d.tool_calls.insert(d.tool_calls.end(), rest.tool_calls.begin(), rest.tool_calls.end());
  }
  c.content += d.content;
  c.reasoning += d.reasoning_content;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
  if (!d.tool_calls.empty()) {
    nlohmann::json calls = nlohmann::json::array();
    for (const ToolCall& call : d.tool_calls) {
      if (!parallel_tool_calls_ && c.tool_call_index > 0) continue;
      calls.push_back({{"index", c.tool_call_index++},
                       {"id", call.id},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      c.tool_calls.push_back(call);
    }
    if (!calls.empty()) delta["tool_calls"] = calls;
  }
  return delta;
}

nlohmann::json GenerationResponse::logprobs_entry(const Choice& c, const SampledToken& t) const {
  // The token's own bytes, not those of its repaired text: a token holding part of a UTF-8 character
  // shows as U+FFFD, and the bytes are what lets a client put the character back together.
  auto bytes = [&c](int32_t id) {
    const std::optional<std::string> raw = c.text.token_bytes(id);
    if (!raw) return nlohmann::json(nullptr);
    nlohmann::json b = nlohmann::json::array();
    for (unsigned char ch : *raw) b.push_back(static_cast<int>(ch));
    return b;
  };
  nlohmann::json top = nlohmann::json::array();
  for (const TokenLogprob& a : t.top) {
    top.push_back({{"token", c.text.token_text(a.id)}, {"logprob", a.logprob}, {"bytes", bytes(a.id)}});
  }
  return {{"token", c.text.token_text(t.id)},
          {"logprob", t.logprob},
          {"bytes", bytes(t.id)},
          {"top_logprobs", top}};
}

nlohmann::json GenerationResponse::prompt_logprobs_entry(const Choice& c, const SampledToken& t) const {
  // As vLLM builds it: the token first, then the alternatives, which take its place (rank by position)
  // where it is one of them.
  nlohmann::json entry = nlohmann::json::object();
  entry[std::to_string(t.id)] = {
      {"logprob", t.logprob}, {"rank", t.rank}, {"decoded_token", c.text.token_text(t.id)}};
  for (size_t i = 0; i < t.top.size() && static_cast<int64_t>(i) < prompt_top_; ++i) {
    const TokenLogprob& a = t.top[i];
    entry[std::to_string(a.id)] = {{"logprob", a.logprob},
                                   {"rank", static_cast<int64_t>(i) + 1},
                                   {"decoded_token", c.text.token_text(a.id)}};
  }
  return entry;
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

int64_t GenerationResponse::prompt_tokens() const {
  // The choices of a prompt read it once.
  int64_t sum = 0;
  for (size_t i = 0; i < choices_.size(); i += static_cast<size_t>(best_of_)) {
    sum += static_cast<int64_t>(choices_[i].prompt.size());
  }
  return sum;
}

int64_t GenerationResponse::completion_tokens() const {
  int64_t sum = 0;
  for (const Choice& c : choices_) sum += static_cast<int64_t>(c.ids.size());
  return sum;
}

nlohmann::json GenerationResponse::usage() const {
  return {{"prompt_tokens", prompt_tokens()},
          {"completion_tokens", completion_tokens()},
          {"total_tokens", prompt_tokens() + completion_tokens()}};
}

void GenerationResponse::add_legacy_logprob(Choice& c, nlohmann::json& lp, const nlohmann::json& token,
                                            const nlohmann::json& logprob, const nlohmann::json& top,
                                            int64_t offset) {
  if (lp.is_null()) {
    lp = {{"tokens", nlohmann::json::array()},
          {"token_logprobs", nlohmann::json::array()},
          {"top_logprobs", nlohmann::json::array()},
          {"text_offset", nlohmann::json::array()}};
  }
  for (nlohmann::json* target : {&lp, &c.logprobs}) {
    (*target)["tokens"].push_back(token);
    (*target)["token_logprobs"].push_back(logprob);
    (*target)["top_logprobs"].push_back(top);
    (*target)["text_offset"].push_back(offset);
  }
}

std::string GenerationResponse::echo_prompt(Choice& c, const SeqOutput& out, nlohmann::json& lp) {
  // Decoded as the output is (a character split across tokens waits for its end), special tokens kept:
  // they are part of what was sent.
  TextOutput prompt_text(tokenizer_, {}, /*skip_special_tokens=*/false);
  std::string text;
  const bool scored = want_logprobs() && endpoint_ == Endpoint::kCompletions;
  HLM_CHECK(!scored || out.prompt_logprobs.size() + 1 == c.prompt.size(),
            "echo: {} prompt log-probabilities for a prompt of {} tokens", out.prompt_logprobs.size(),
            c.prompt.size());
  for (size_t i = 0; i < c.prompt.size(); ++i) {
    const int64_t offset = prompt_text.decoded_chars();
    text += prompt_text.push(c.prompt[i], false);
    if (!scored) continue;
    if (i == 0) {
      add_legacy_logprob(c, lp, c.text.token_text(c.prompt[0]), nullptr, nullptr, offset);
    } else {
      SampledToken t = out.prompt_logprobs[i - 1];  // computed with the larger of logprobs, prompt_logprobs
      t.top.resize(std::min(t.top.size(), static_cast<size_t>(reported_top_)));
      const nlohmann::json e = logprobs_entry(c, t);
      add_legacy_logprob(c, lp, e["token"], e["logprob"], legacy_top(e), offset);
    }
  }
  text += prompt_text.finish();
  c.offset_base = prompt_text.decoded_chars();
  return text;
}

std::vector<nlohmann::json> GenerationResponse::push(int index, const SeqOutput& out) {
  HLM_CHECK(index >= 0 && index < choices(), "an output for choice {} of a response with {}", index,
            choices());
  Choice& c = choices_[index];
  std::vector<nlohmann::json> chunks;
  if (done(index)) return chunks;
  std::string text;
  nlohmann::json lp = nullptr;
  // The first output (a token, or the end of a choice of no tokens) brings the prompt's log-probabilities.
  if (echo_ && !c.echoed && out.finish != FinishReason::kError) {
    c.echoed = true;
    text = echo_prompt(c, out, lp);
  }
  if (prompt_top_ >= 0 && c.prompt_logprobs.is_null() && out.finish != FinishReason::kError) {
    HLM_CHECK(out.prompt_logprobs.size() + 1 == c.prompt.size(),
              "prompt_logprobs: {} log-probabilities for a prompt of {} tokens", out.prompt_logprobs.size(),
              c.prompt.size());
    c.prompt_logprobs = nlohmann::json::array({nullptr});
    for (const SampledToken& t : out.prompt_logprobs)
      c.prompt_logprobs.push_back(prompt_logprobs_entry(c, t));
  }
  if (out.token) {
    c.ids.push_back(out.token->id);
    c.cumulative_logprob += out.token->logprob;
    // OpenAI's text_offset: where the token's text starts in the returned text, in characters. Text
    // held back (part of a character, a possible stop string) counts: it is released later, in front.
    const int64_t offset = c.offset_base + c.text.decoded_chars();
    text += c.text.push(out.token->id, out.stop_token);
    if (want_logprobs()) {
      const nlohmann::json e = logprobs_entry(c, *out.token);
      if (endpoint_ == Endpoint::kChat) {
        c.logprobs.push_back(e);
        lp = {{"content", nlohmann::json::array({e})}};
      } else {
        add_legacy_logprob(c, lp, e["token"], e["logprob"], legacy_top(e), offset);
      }
    }
  }
  const bool final = out.finish != FinishReason::kNone || c.text.stopped();
  if (final) text += c.text.finish();
  nlohmann::json delta = delta_from_text(c, text, final);
  if (final) end(c, out.finish);
  if (!stream_) return chunks;

  nlohmann::json choice = {{"index", index}, {"logprobs", lp}, {"finish_reason", nullptr}};
  if (final) choice["finish_reason"] = *c.finish_reason;
  if (return_token_ids_ && out.token) choice["token_ids"] = {out.token->id};
  if (endpoint_ == Endpoint::kChat) {
    if (!c.sent_role) {
      delta["role"] = "assistant";
      if (!delta.contains("content")) delta["content"] = "";
      c.sent_role = true;
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

std::vector<int> GenerationResponse::answer_choices() const {
  std::vector<int> order;
  for (int first = 0; first < choices(); first += static_cast<int>(best_of_)) {
    std::vector<int> prompt(static_cast<size_t>(best_of_));
    for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = first + static_cast<int>(j);
    if (best_of_ > n_) {
      std::stable_sort(prompt.begin(), prompt.end(), [this](int a, int b) {
        return choices_[a].cumulative_logprob > choices_[b].cumulative_logprob;
      });
    }
    order.insert(order.end(), prompt.begin(), prompt.begin() + n_);
  }
  return order;
}

nlohmann::json GenerationResponse::choice_result(int which, int64_t index) {
  const Choice& c = choices_[which];
  nlohmann::json choice = {{"index", index}, {"finish_reason", c.finish_reason.value_or("")}};
  nlohmann::json lp = nullptr;
  if (want_logprobs())
    lp = endpoint_ == Endpoint::kChat ? nlohmann::json{{"content", c.logprobs}} : c.logprobs;
  choice["logprobs"] = lp;
  if (endpoint_ == Endpoint::kChat) {
    nlohmann::json message = {{"role", "assistant"}, {"content", c.content}};
    if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      nlohmann::json calls = nlohmann::json::array();
      for (const ToolCall& call : c.tool_calls) {
        calls.push_back({{"id", call.id},
                         {"type", "function"},
                         {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      }
      message["tool_calls"] = calls;
      // OpenAI sends null content when the turn is only tool calls.
      if (c.content.empty()) message["content"] = nullptr;
    }
    choice["message"] = message;
  } else {
    choice["text"] = c.content;
  }
  if (return_token_ids_) {
    choice["prompt_token_ids"] = c.prompt;
    choice["token_ids"] = c.ids;
  }
  if (prompt_top_ >= 0 && endpoint_ == Endpoint::kCompletions) choice["prompt_logprobs"] = c.prompt_logprobs;
  return choice;
}

nlohmann::json GenerationResponse::result() {
  nlohmann::json choices = nlohmann::json::array();
  const std::vector<int> order = answer_choices();
  for (size_t i = 0; i < order.size(); ++i)
    choices.push_back(choice_result(order[i], static_cast<int64_t>(i)));
  nlohmann::json r = {{"id", id_},
                      {"object", endpoint_ == Endpoint::kChat ? "chat.completion" : "text_completion"},
                      {"created", created_},
                      {"model", model_},
                      {"choices", std::move(choices)},
                      {"usage", usage()}};
  // A chat's choices share one prompt: vLLM gives its log-probabilities once, beside the choices.
  if (prompt_top_ >= 0 && endpoint_ == Endpoint::kChat)
    r["prompt_logprobs"] = choices_.front().prompt_logprobs;
  return r;
}

}  // namespace hlm
