#include "server/openai_request.h"

#include <algorithm>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "base/error.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace hlm {

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxLogprobs = 20;

void check_model(const JsonFields& f, const ServingContext& ctx) {
  const std::optional<std::string> model = f.string("model");
  if (model && *model != ctx.model_name) {
    throw ApiError(
        404, fmt::format("The model '{}' does not exist; this server serves '{}'", *model, ctx.model_name),
        "model");
  }
}

// best_of: completions only (chat has none; a value equal to n is accepted), at least n, and above n not
// on a stream, whose chunks would go out before the best are known (OpenAI's rule).
void parse_best_of(const JsonFields& f, GenerationRequest& r) {
  const std::optional<int64_t> b = f.integer("best_of", 1, kMaxInt);
  if (!b || *b == r.n) return;
  if (r.endpoint == Endpoint::kChat) {
    f.fail("best_of", fmt::format("absent or equal to n, {} (chat completions have no best_of)", r.n));
  }
  if (*b < r.n) f.fail("best_of", fmt::format("at least n, {}", r.n));
  if (r.stream) {
    f.fail("best_of", fmt::format("equal to n, {}, on a stream (the best are known only once every sequence "
                                  "has ended)",
                                  r.n));
  }
  r.best_of = *b;
}

// Checks that `what` (a response format, a guided choice) can constrain this sequence, and gives the
// constraint its vocabulary; `param` names the field in errors.
void constrain_output(const ServingContext& ctx, SeqRequest& seq, const std::string& what,
                      const std::string& param) {
  if (seq.adjust.constraint) {
    throw ApiError(400,
                   fmt::format("{}: a request constrains its output one way (response_format, "
                               "structured_outputs or a guided_* field), not two",
                               what),
                   param);
  }
  if (!ctx.json_vocab) {
    throw ApiError(
        400, fmt::format("{} needs the model's tokenizer (no tiktoken.model in its directory)", what), param);
  }
  if (!seq.stop_at_eos && seq.stop_ids.empty()) {
    throw ApiError(400,
                   fmt::format("{} ends the output at the end of sequence once it is complete: it cannot be "
                               "combined with ignore_eos",
                               what),
                   "ignore_eos");
  }
  seq.adjust.constraint.vocab = ctx.json_vocab;
}

// response_format: "text"; "json_object" (the output is one JSON object); or "json_schema" (one instance of
// json_schema.schema, in the subset runtime/json_schema.h follows; strict or not, the output follows it).
// body: the raw request, re-read in the client's key order, which fixes the order of the properties.
void parse_response_format(const JsonFields& f, const std::string& body, const ServingContext& ctx,
                           SeqRequest& seq) {
  const nlohmann::json* rf = f.find("response_format");
  if (!rf || rf->is_null()) return;
  const JsonFields r(*rf, f.path("response_format"));
  const std::string type = r.string("type").value_or("text");
  if (type == "text") return;
  if (type != "json_object" && type != "json_schema") {
    r.fail("type", fmt::format("\"text\", \"json_object\" or \"json_schema\" (got \"{}\")", type));
  }
  constrain_output(ctx, seq, "response_format " + type, "response_format");
  if (type == "json_object") {
    seq.adjust.constraint.json = JsonSchema::any_object();
    return;
  }
  const nlohmann::json* js = r.find("json_schema");
  if (!js || !js->is_object()) r.fail("json_schema", "an object with the schema under \"schema\"");
  const JsonFields spec(*js, r.path("json_schema"));
  spec.string("name");
  spec.boolean("strict");
  const nlohmann::json* schema = spec.find("schema");
  if (!schema || !(schema->is_object() || schema->is_boolean()))
    spec.fail("schema", "a JSON schema (an object)");
  const nlohmann::ordered_json ordered =
      nlohmann::ordered_json::parse(body)["response_format"]["json_schema"]["schema"];
  try {
    seq.adjust.constraint.json = JsonSchema::compile(ordered, spec.path("schema"));
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "response_format");
  }
}

// vLLM's structured outputs: structured_outputs {"json": a schema, "json_object": true, "choice": [strings]},
// and its older guided_json and guided_choice fields. The regular expressions and grammars of both forms
// are refused by name. A schema given as an object is re-read from `body` in the client's key order.
void parse_structured_outputs(const JsonFields& f, const std::string& body, const ServingContext& ctx,
                              SeqRequest& seq) {
  for (const char* key : {"guided_regex", "guided_grammar"}) {
    if (f.find(key)) f.fail(key, "absent (regular expressions and grammars are not supported)");
  }
  const nlohmann::ordered_json ordered =
      f.find("guided_json") || f.find("structured_outputs") ? nlohmann::ordered_json::parse(body) : nullptr;
  // A schema as JSON (an object) or as JSON text, under `path`.
  auto json_schema = [&](const nlohmann::ordered_json& v, const std::string& path, const std::string& param) {
    constrain_output(ctx, seq, path, param);
    nlohmann::ordered_json schema = v;
    if (v.is_string()) {
      schema = nlohmann::ordered_json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded())
        throw ApiError(400, fmt::format("'{}' is a string that is not JSON", path), param);
    }
    try {
      seq.adjust.constraint.json = JsonSchema::compile(schema, path);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), param);
    }
  };
  auto choice = [&](const nlohmann::json& v, const std::string& path, const std::string& param) {
    if (!v.is_array()) throw ApiError(400, fmt::format("'{}' must be an array of strings", path), param);
    std::vector<std::string> choices;
    for (const nlohmann::json& c : v) {
      if (!c.is_string()) throw ApiError(400, fmt::format("'{}' must be an array of strings", path), param);
      choices.push_back(c.get<std::string>());
    }
    constrain_output(ctx, seq, path, param);
    try {
      seq.adjust.constraint.choice = make_choices(std::move(choices), path);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), param);
    }
  };
  if (f.find("guided_json")) json_schema(ordered["guided_json"], "guided_json", "guided_json");
  if (const nlohmann::json* c = f.find("guided_choice")) choice(*c, "guided_choice", "guided_choice");
  const nlohmann::json* so = f.find("structured_outputs");
  if (!so) return;
  if (!so->is_object()) f.fail("structured_outputs", "an object");
  const JsonFields s(*so, "structured_outputs");
  for (const char* key : {"regex", "grammar", "structural_tag", "whitespace_pattern"}) {
    if (s.find(key))
      s.fail(key, "absent (regular expressions, grammars and structural tags are not supported)");
  }
  if (s.find("json"))
    json_schema(ordered["structured_outputs"]["json"], s.path("json"), "structured_outputs");
  if (const nlohmann::json* c = s.find("choice")) choice(*c, s.path("choice"), "structured_outputs");
  if (s.boolean("json_object").value_or(false)) {
    constrain_output(ctx, seq, s.path("json_object"), "structured_outputs");
    seq.adjust.constraint.json = JsonSchema::any_object();
  }
}

std::vector<int32_t> int_array(const JsonFields& f, const std::string& key, int64_t vocab) {
  const nlohmann::json* v = f.find(key);
  std::vector<int32_t> ids;
  if (!v) return ids;
  if (!v->is_array()) f.fail(key, "an array of token ids");
  for (size_t i = 0; i < v->size(); ++i) {
    const nlohmann::json& x = (*v)[i];
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab) {
      throw ApiError(
          400,
          fmt::format("'{}[{}]' must be a token id in [0, {}) (got {})", f.path(key), i, vocab, x.dump()),
          f.path(key));
    }
    ids.push_back(x.get<int32_t>());
  }
  return ids;
}

std::vector<std::string> stop_strings(const JsonFields& f) {
  const nlohmann::json* v = f.find("stop");
  std::vector<std::string> stop;
  if (!v) return stop;
  if (v->is_string()) {
    stop.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const nlohmann::json& s : *v) {
      if (!s.is_string()) f.fail("stop", "a string or an array of strings");
      stop.push_back(s.get<std::string>());
    }
  } else {
    f.fail("stop", "a string or an array of strings");
  }
  for (const std::string& s : stop) {
    if (s.empty()) f.fail("stop", "made of non-empty strings");
  }
  return stop;
}

// Penalties, logit_bias, min_p and min_tokens (runtime/logits_processor.h), with OpenAI's and vLLM's ranges.
LogitsAdjustments logits_adjustments(const JsonFields& f, const ServingContext& ctx) {
  LogitsAdjustments a;
  a.presence_penalty = static_cast<float>(f.number("presence_penalty", -2.0, 2.0).value_or(0.0));
  a.frequency_penalty = static_cast<float>(f.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
  a.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 0.0, 1e4).value_or(1.0));
  if (a.repetition_penalty <= 0.0f) f.fail("repetition_penalty", "greater than 0 (1: no penalty)");
  a.min_p = static_cast<float>(f.number("min_p", 0.0, 1.0).value_or(0.0));
  a.min_tokens = f.integer("min_tokens", 0, kMaxInt).value_or(0);
  if (const nlohmann::json* bias = f.find("logit_bias"); bias && !bias->is_null()) {
    if (!bias->is_object()) f.fail("logit_bias", "an object mapping token ids to biases in [-100, 100]");
    const JsonFields b(*bias, f.path("logit_bias"));
    for (const auto& [key, value] : bias->items()) {
      // OpenAI's keys are token ids written as strings.
      int64_t id = -1;
      size_t used = 0;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != key.size() || id < 0 || id >= ctx.vocab_size) {
        throw ApiError(400,
                       fmt::format("'{}' has the key \"{}\", which is not a token id in [0, {})",
                                   f.path("logit_bias"), key, ctx.vocab_size),
                       "logit_bias");
      }
      const auto v = b.number(key, -100.0, 100.0);
      a.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(*v));
    }
  }
  return a;
}

// Fields shared by both endpoints, into r and the sequence every choice starts from; max_new_tokens is
// settled once the prompt length is known.
void parse_common(const JsonFields& f, const std::string& body, const ServingContext& ctx,
                  GenerationRequest& r, SeqRequest& seq, std::optional<int64_t>& max_tokens) {
  check_model(f, ctx);
  r.n = f.integer("n", 1, kMaxInt).value_or(1);
  r.stream = f.boolean("stream").value_or(false);
  if (const nlohmann::json* so = f.find("stream_options")) {
    r.include_usage = JsonFields(*so, f.path("stream_options")).boolean("include_usage").value_or(false);
  }
  r.best_of = r.n;
  parse_best_of(f, r);
  // 0 is for scoring an echoed prompt only (completions with echo); the endpoints check.
  max_tokens = f.integer("max_tokens", 0, kMaxInt);
  if (auto m = f.integer("max_completion_tokens", 0, kMaxInt)) max_tokens = m;

  SamplingParams& s = seq.sampling;
  // OpenAI's default temperature is 1; greedy is temperature 0.
  s.temperature = static_cast<float>(f.number("temperature", 0.0, 1e4).value_or(1.0));
  s.top_p = static_cast<float>(f.number("top_p", 0.0, 1.0).value_or(1.0));
  if (s.top_p <= 0.0f) f.fail("top_p", "in (0, 1]");
  // vLLM's convention: -1 (or 0) means no top-k cut.
  s.top_k = std::max<int64_t>(0, f.integer("top_k", -1, kMaxInt).value_or(0));
  if (auto seed = f.integer("seed", std::numeric_limits<int64_t>::min(), kMaxInt)) {
    s.seed = static_cast<uint64_t>(*seed);
  } else {
    s.seed = std::random_device{}();
  }

  r.stop = stop_strings(f);
  if (!r.stop.empty() && !ctx.tokenizer)
    f.fail("stop", "absent: the model has no tokenizer, so there is no text to match");
  seq.stop_ids = int_array(f, "stop_token_ids", ctx.vocab_size);
  seq.stop_at_eos = !f.boolean("ignore_eos").value_or(false);
  seq.adjust = logits_adjustments(f, ctx);
  parse_response_format(f, body, ctx, seq);
  parse_structured_outputs(f, body, ctx, seq);
  r.prompt_logprobs = static_cast<int32_t>(f.integer("prompt_logprobs", 0, kMaxLogprobs).value_or(-1));
  if (r.prompt_logprobs >= 0 && r.stream) f.fail("prompt_logprobs", "absent on a stream");
  seq.prompt_logprobs = r.prompt_logprobs;
  r.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  r.include_stop_str_in_output = f.boolean("include_stop_str_in_output").value_or(false);
  r.return_token_ids = f.boolean("return_token_ids").value_or(false);
}

// max_new_tokens from max_tokens and the prompt, or the OpenAI-style 400 that gives both numbers.
// prompt_path: where the prompt is in the request ("prompt[2]" in a batch); prompt_field: its key.
void settle_lengths(SeqRequest& seq, std::optional<int64_t> max_tokens, const ServingContext& ctx,
                    const std::string& prompt_path, const char* prompt_field) {
  const auto prompt = static_cast<int64_t>(seq.prompt.size());
  if (prompt == 0) throw ApiError(400, fmt::format("'{}' is empty", prompt_path), prompt_field);
  if (prompt >= ctx.max_model_len) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens, but '{}' has {} tokens "
                               "(at least one token must be left to generate)",
                               ctx.max_model_len, prompt_path, prompt),
                   prompt_field);
  }
  if (max_tokens && prompt + *max_tokens > ctx.max_model_len) {
    throw ApiError(
        400,
        fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                    "({} in '{}', {} for the completion)",
                    ctx.max_model_len, prompt + *max_tokens, prompt, prompt_path, *max_tokens),
        "max_tokens");
  }
  seq.max_new_tokens = max_tokens.value_or(ctx.max_model_len - prompt);
  if (seq.adjust.min_tokens > seq.max_new_tokens) {
    throw ApiError(400,
                   fmt::format("'min_tokens' ({}) must not exceed the tokens the completion may have ({})",
                               seq.adjust.min_tokens, seq.max_new_tokens),
                   "min_tokens");
  }
}

// max_tokens 0 asks for no completion: only an echoed prompt with log-probabilities makes that useful.
void refuse_zero_tokens(const JsonFields& f, std::optional<int64_t> max_tokens, const std::string& what) {
  if (max_tokens != 0) return;
  f.fail(f.find("max_completion_tokens") ? "max_completion_tokens" : "max_tokens", what);
}

// Refuses a request of more choices than the server holds at once, before any prompt is tokenized.
void check_choices(const ServingContext& ctx, int64_t prompts, const GenerationRequest& r) {
  const int64_t each = r.per_prompt();
  if (each <= ctx.max_choices && prompts <= ctx.max_choices / each) return;
  const char* field = r.best_of > r.n ? "best_of" : "n";
  const std::string asked = prompts == 1 ? fmt::format("{} = {} choices", field, each)
                                         : fmt::format("{} prompts with {} = {} each", prompts, field, each);
  throw ApiError(400,
                 fmt::format("this request asks for {}; the server runs and queues at most {} sequences at "
                             "once (--max-num-seqs plus --max-queued-requests)",
                             asked, ctx.max_choices),
                 each > 1 ? field : "prompt");
}

// The choices generated for one prompt (best_of of them): `seq` with a random stream each (the choice's
// index).
void add_choices(GenerationRequest& r, const SeqRequest& seq) {
  for (int64_t j = 0; j < r.per_prompt(); ++j) {
    r.choices.push_back(seq);
    r.choices.back().sampler_stream = r.choices.size() - 1;
  }
}

// Whether `prompt` is a batch: an array of texts or of id arrays (an array of ids is one prompt).
bool is_prompt_batch(const nlohmann::json& p) {
  return p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array());
}

// The prompts of a completion request: a text, token ids, or a batch of either (an array of texts or of
// id arrays).
std::vector<std::vector<int32_t>> completion_prompts(const JsonFields& f, const ServingContext& ctx) {
  const nlohmann::json* p = f.find("prompt");
  if (!p) f.fail("prompt", "given (a string, an array of token ids, or an array of either)");
  auto from_ids = [&](const nlohmann::json& arr, const std::string& path) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < arr.size(); ++i) {
      const nlohmann::json& x = arr[i];
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= ctx.vocab_size) {
        throw ApiError(
            400,
            fmt::format("'{}[{}]' must be a token id in [0, {}) (got {})", path, i, ctx.vocab_size, x.dump()),
            "prompt");
      }
      ids.push_back(x.get<int32_t>());
    }
    return ids;
  };
  auto from_text = [&](const std::string& text) {
    if (!ctx.tokenizer) {
      throw ApiError(
          400, "this model has no tokenizer (no tiktoken.model in its directory): give 'prompt' as token ids",
          "prompt");
    }
    // The client wrote the whole prompt: special-token strings in it are those tokens (what the Kimi
    // tokenizer's encode, vLLM and llama-server do). Chat messages are the other case: there a user's
    // "<|im_end|>" stays text (chat_template.h).
    return ctx.tokenizer->encode(text, /*allow_special=*/true);
  };
  if (p->is_string()) return {from_text(p->get<std::string>())};
  if (!p->is_array()) f.fail("prompt", "a string, an array of token ids, or an array of either");
  if (!is_prompt_batch(*p)) return {from_ids(*p, "prompt")};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < p->size(); ++i) {
    const nlohmann::json& one = (*p)[i];
    const std::string path = fmt::format("prompt[{}]", i);
    if (one.is_string()) {
      prompts.push_back(from_text(one.get<std::string>()));
    } else if (one.is_array()) {
      prompts.push_back(from_ids(one, path));
    } else {
      throw ApiError(
          400, fmt::format("'{}' must be a string or an array of token ids (a batch holds prompts)", path),
          "prompt");
    }
  }
  return prompts;
}

std::string message_content(const nlohmann::json& content, const std::string& path) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw ApiError(400, fmt::format("'{}' must be a string or an array of parts", path), path);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part_path = fmt::format("{}[{}]", path, i);
    const JsonFields part(content[i], part_path);
    const std::string type = part.string("type").value_or("");
    if (type != "text") part.fail("type", "\"text\" (only text content is supported)");
    text += part.string("text").value_or("");
  }
  return text;
}

}  // namespace

std::vector<ChatMessage> parse_messages(const nlohmann::json& messages) {
  if (!messages.is_array() || messages.empty()) {
    throw ApiError(400, "'messages' must be a non-empty array", "messages");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string path = fmt::format("messages[{}]", i);
    const JsonFields m(messages[i], path);
    ChatMessage msg;
    const std::optional<std::string> role = m.string("role");
    if (!role) m.fail("role", "one of system, developer, user, assistant, tool");
    // OpenAI's "developer" role is the newer name of "system".
    msg.role = *role == "developer" ? "system" : *role;
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool") {
      m.fail("role", fmt::format("one of system, developer, user, assistant, tool (got '{}')", *role));
    }
    if (const nlohmann::json* c = m.find("content")) msg.content = message_content(*c, m.path("content"));
    msg.name = m.string("name").value_or("");
    msg.reasoning_content = m.string("reasoning_content").value_or("");
    msg.tool_call_id = m.string("tool_call_id").value_or("");
    if (msg.role == "tool" && msg.tool_call_id.empty()) m.fail("tool_call_id", "given for a tool message");
    if (const nlohmann::json* calls = m.find("tool_calls")) {
      if (!calls->is_array()) m.fail("tool_calls", "an array");
      for (size_t j = 0; j < calls->size(); ++j) {
        const JsonFields c((*calls)[j], fmt::format("{}.tool_calls[{}]", path, j));
        const nlohmann::json* fn = c.find("function");
        if (!fn) c.fail("function", "an object with name and arguments");
        const JsonFields ff(*fn, c.path("function"));
        ToolCall call;
        call.id = c.string("id").value_or("");
        const std::optional<std::string> name = ff.string("name");
        if (!name || name->empty()) ff.fail("name", "a non-empty string");
        call.name = *name;
        // OpenAI sends arguments as a JSON string; an object is accepted and serialized.
        if (const nlohmann::json* args = fn->contains("arguments") ? &(*fn)["arguments"] : nullptr;
            args && args->is_object()) {
          call.arguments = args->dump();
        } else {
          call.arguments = ff.string("arguments").value_or("{}");
        }
        msg.tool_calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::shared_ptr<const ConstraintVocab> constraint_vocab(const Tokenizer& tok, int64_t model_vocab) {
  std::vector<std::string> bytes(static_cast<size_t>(model_vocab));
  std::vector<uint8_t> is_text(static_cast<size_t>(model_vocab), 0);
  for (int32_t id = 0; id < model_vocab; ++id) {
    if (!tok.contains(id) || tok.is_added(id)) continue;
    bytes[id] = std::string(tok.token_bytes(id));
    is_text[id] = 1;
  }
  return std::make_shared<ConstraintVocab>(std::move(bytes), std::move(is_text));
}

// tool_choice: "auto" (the default) or "none"; "required" or {"type": "function", "function": {"name"}}
// force a tool call, and set `forced` to "required" or the name.
std::string parse_tool_choice(const JsonFields& f, std::string& forced) {
  const nlohmann::json* tc = f.find("tool_choice");
  if (!tc) return "auto";
  constexpr const char* kExpected =
      "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";
  if (tc->is_object()) {
    const JsonFields c(*tc, f.path("tool_choice"));
    if (c.string("type").value_or("function") != "function") c.fail("type", "\"function\"");
    const nlohmann::json* fn = c.find("function");
    if (!fn || !fn->is_object()) c.fail("function", "an object with the tool's name");
    const JsonFields named(*fn, c.path("function"));
    forced = named.string("name").value_or("");
    if (forced.empty()) named.fail("name", "a non-empty string");
    return "function";
  }
  if (!tc->is_string()) f.fail("tool_choice", kExpected);
  const std::string choice = tc->get<std::string>();
  if (choice != "auto" && choice != "none" && choice != "required") {
    f.fail("tool_choice", fmt::format("{} (got \"{}\")", kExpected, choice));
  }
  if (choice == "required") forced = choice;
  return choice;
}

// tool_choice "required" or a named function: the output is constrained to a tool-call section of the
// declared tools (or the named one), each call's arguments following the tool's parameters schema
// (runtime/tool_call_prefix.h), in Kimi Linear's format.
void force_tool_calls(const nlohmann::ordered_json& tools, const std::string& forced, bool parallel,
                      const ServingContext& ctx, SeqRequest& seq) {
  if (ctx.chat->format() != ChatFormat::kKimiLinear) {
    throw ApiError(400,
                   fmt::format("tool_choice \"required\" or a named function is supported in Kimi Linear's "
                               "tool-call format; this model's chat format is {}",
                               chat_format_name(ctx.chat->format())),
                   "tool_choice");
  }
  if (seq.adjust.constraint) {
    throw ApiError(400,
                   "tool_choice \"required\" or a named function cannot be combined with a constrained "
                   "response_format, structured_outputs or guided_* field: both constrain the output",
                   "tool_choice");
  }
  ToolCallGrammar::Markers m;
  const std::pair<int32_t*, const char*> markers[] = {{&m.section_begin, "<|tool_calls_section_begin|>"},
                                                      {&m.call_begin, "<|tool_call_begin|>"},
                                                      {&m.argument_begin, "<|tool_call_argument_begin|>"},
                                                      {&m.call_end, "<|tool_call_end|>"},
                                                      {&m.section_end, "<|tool_calls_section_end|>"}};
  for (const auto& [id, text] : markers) {
    const std::optional<int32_t> found = ctx.tokenizer->special_id(text);
    if (!found) {
      throw ApiError(400, fmt::format("tool_choice: the model's tokenizer has no {} token", text),
                     "tool_choice");
    }
    *id = *found;
  }
  std::vector<ToolCallGrammar::Tool> chosen;
  try {
    for (size_t i = 0; i < tools.size(); ++i) {
      const nlohmann::ordered_json& fn = tools[i]["function"];
      const std::string name = fn["name"].get<std::string>();
      if (forced != "required" && name != forced) continue;
      // No parameters: a function of none, so its arguments are {}.
      const nlohmann::ordered_json none = {{"type", "object"}, {"additionalProperties", false}};
      const std::string path = fmt::format("tools[{}].function.parameters", i);
      chosen.push_back(
          {name, JsonSchema::compile(fn.contains("parameters") ? fn["parameters"] : none, path)});
    }
    if (chosen.empty()) {
      throw ApiError(400, fmt::format("tool_choice names \"{}\", which is not among the tools", forced),
                     "tool_choice");
    }
    seq.adjust.constraint.vocab = ctx.json_vocab;
    seq.adjust.constraint.tool_calls = std::make_shared<ToolCallGrammar>(
        m, std::move(chosen), /*one_call=*/forced != "required" || !parallel);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "tools");
  }
}

GenerationRequest parse_completion_request(const std::string& body, const ServingContext& ctx) {
  const nlohmann::json j = parse_json_object(body);
  const JsonFields f(j, "");
  GenerationRequest r;
  r.endpoint = Endpoint::kCompletions;
  SeqRequest seq;
  std::optional<int64_t> max_tokens;
  parse_common(f, body, ctx, r, seq, max_tokens);
  if (f.string("suffix")) f.fail("suffix", "absent (suffix is not supported)");
  // Completions: logprobs is the number of alternatives (0 = the sampled token's only).
  seq.top_logprobs = static_cast<int32_t>(f.integer("logprobs", 0, kMaxLogprobs).value_or(-1));
  r.report_logprobs = seq.top_logprobs >= 0;
  r.echo = f.boolean("echo").value_or(false);
  // Echoed with log-probabilities, the prompt's tokens get theirs too (how evaluation harnesses score text).
  if (r.echo) seq.prompt_logprobs = std::max(seq.prompt_logprobs, seq.top_logprobs);
  // best_of ranks the sequences by their sampled tokens' log-probabilities, asked for or not.
  if (r.best_of > r.n) seq.top_logprobs = std::max(seq.top_logprobs, 0);
  if (!r.echo && r.prompt_logprobs < 0) {
    refuse_zero_tokens(f, max_tokens,
                       "at least 1 (0 only with echo or prompt_logprobs: the prompt alone, scored)");
  }
  // The legacy endpoint's default is 16 tokens (OpenAI), not "up to the context length".
  if (!max_tokens) max_tokens = 16;
  const nlohmann::json* p = f.find("prompt");
  const bool batch = p && is_prompt_batch(*p);
  check_choices(ctx, batch ? static_cast<int64_t>(p->size()) : 1, r);
  const std::vector<std::vector<int32_t>> prompts = completion_prompts(f, ctx);
  for (size_t i = 0; i < prompts.size(); ++i) {
    seq.prompt = prompts[i];
    settle_lengths(seq, max_tokens, ctx, batch ? fmt::format("prompt[{}]", i) : "prompt", "prompt");
    add_choices(r, seq);
  }
  return r;
}

GenerationRequest parse_chat_request(const std::string& body, const ServingContext& ctx) {
  const nlohmann::json j = parse_json_object(body);
  const JsonFields f(j, "");
  GenerationRequest r;
  r.endpoint = Endpoint::kChat;
  SeqRequest seq;
  std::optional<int64_t> max_tokens;
  parse_common(f, body, ctx, r, seq, max_tokens);
  refuse_zero_tokens(f, max_tokens, "at least 1");
  check_choices(ctx, 1, r);
  if (f.boolean("logprobs").value_or(false)) {
    seq.top_logprobs = static_cast<int32_t>(f.integer("top_logprobs", 0, kMaxLogprobs).value_or(0));
  } else if (f.find("top_logprobs")) {
    f.fail("top_logprobs", "used only with \"logprobs\": true");
  }
  r.report_logprobs = seq.top_logprobs >= 0;
  const nlohmann::json* messages = f.find("messages");
  if (!messages) f.fail("messages", "a non-empty array");
  const std::vector<ChatMessage> msgs = parse_messages(*messages);

  std::string forced;  // "required", or the name of the function tool_choice names
  const std::string tool_choice = parse_tool_choice(f, forced);
  // The client's key order, which the Kimi template reproduces (chat_template.h, render_ordered).
  nlohmann::ordered_json tools = nullptr;
  if (const nlohmann::json* t = f.find("tools")) {
    if (!t->is_array()) f.fail("tools", "an array of {\"type\": \"function\", \"function\": {...}}");
    for (size_t i = 0; i < t->size(); ++i) {
      const JsonFields tool((*t)[i], fmt::format("tools[{}]", i));
      if (tool.string("type").value_or("function") != "function") tool.fail("type", "\"function\"");
      const nlohmann::json* fn = tool.find("function");
      if (!fn) tool.fail("function", "an object with a name");
      const std::optional<std::string> name = JsonFields(*fn, tool.path("function")).string("name");
      if (!name || name->empty()) JsonFields(*fn, tool.path("function")).fail("name", "a non-empty string");
    }
    if (!t->empty()) tools = nlohmann::ordered_json::parse(body)["tools"];
  }
  r.parse_tools = !tools.is_null() && tool_choice != "none";
  if (!forced.empty() && tools.is_null()) {
    f.fail("tools", "a non-empty array (tool_choice \"required\" or a named function calls one of them)");
  }

  if (!ctx.tokenizer || !ctx.chat) {
    throw ApiError(
        400,
        "this model has no tokenizer (no tiktoken.model in its directory): use /v1/completions with "
        "token ids");
  }
  r.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
  if (!forced.empty()) force_tool_calls(tools, forced, r.parallel_tool_calls, ctx, seq);
  // The constraint starts at the first generated token, which K3's generation prompt puts in its think
  // channel: the JSON would be reasoning, and the answer empty.
  if ((seq.adjust.constraint.json || seq.adjust.constraint.choice) &&
      ctx.chat->generation_starts_in_reasoning()) {
    throw ApiError(
        400,
        "a constrained output (response_format json_object or json_schema, structured_outputs, "
        "guided_json, guided_choice) is not supported with K3's chat format (kimi_k3) yet: its answer "
        "starts in the think channel, which the constraint would fill",
        "response_format");
  }
  try {
    // A tool list with tool_choice "none" is still declared: the model may mention the tools but not call
    // them.
    seq.prompt = ctx.chat->render_ordered(msgs, tools, /*add_generation_prompt=*/true);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages");
  }
  const std::vector<int32_t> turn_end = ctx.chat->stop_ids();
  seq.stop_ids.insert(seq.stop_ids.end(), turn_end.begin(), turn_end.end());
  settle_lengths(seq, max_tokens, ctx, "messages", "messages");
  add_choices(r, seq);
  return r;
}

}  // namespace hlm
