// Request validation: each wrong field is refused with the status and the field's path, accepted
// requests become the SeqRequest the engine runs (lengths, sampling, stops, logprobs).
#include "server/openai_request.h"

#include <gtest/gtest.h>

#include "server/api_error.h"

namespace hlm {
namespace {

ServingContext id_only() { return ServingContext{"tiny", 64, 512, nullptr, nullptr}; }

// (status, param) of the refusal, or (200, "") when accepted.
std::pair<int, std::string> verdict(const std::string& body) {
  try {
    parse_completion_request(body, id_only());
  } catch (const ApiError& e) {
    return {e.status(), e.param()};
  }
  return {200, ""};
}

TEST(OpenAiRequest, AcceptedCompletionBecomesTheEngineRequest) {
  const GenerationRequest r = parse_completion_request(
      R"({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
          "top_k": 7, "seed": 42, "stop_token_ids": [9], "logprobs": 2, "stream": true,
          "stream_options": {"include_usage": true}, "ignore_eos": true, "n": 1, "frequency_penalty": 0,
          "min_tokens": 0})",
      id_only());
  EXPECT_EQ(r.choices[0].prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.choices[0].max_new_tokens, 5);
  EXPECT_FLOAT_EQ(r.choices[0].sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.choices[0].sampling.top_p, 0.9f);
  EXPECT_EQ(r.choices[0].sampling.top_k, 7);
  EXPECT_EQ(r.choices[0].sampling.seed, 42u);
  EXPECT_EQ(r.choices[0].stop_ids, (std::vector<int32_t>{9}));
  EXPECT_EQ(r.choices[0].top_logprobs, 2);
  EXPECT_FALSE(r.choices[0].stop_at_eos);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequest, DefaultsFollowOpenAi) {
  const GenerationRequest r = parse_completion_request(R"({"prompt": [[4, 5]]})", id_only());
  EXPECT_EQ(r.choices[0].prompt, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(r.choices[0].max_new_tokens, 16);  // the legacy endpoint's default
  EXPECT_FLOAT_EQ(r.choices[0].sampling.temperature, 1.0f);
  EXPECT_EQ(r.choices[0].sampling.top_k, 0);
  EXPECT_EQ(r.choices[0].top_logprobs, -1);
  EXPECT_TRUE(r.choices[0].stop_at_eos);
  EXPECT_FALSE(r.stream);
  // top_k -1 is vLLM's "no limit".
  EXPECT_EQ(parse_completion_request(R"({"prompt": [4], "top_k": -1})", id_only()).choices[0].sampling.top_k,
            0);
}

TEST(OpenAiRequest, WrongFieldsAreRefusedByName) {
  const std::vector<std::tuple<std::string, int, std::string>> cases = {
      {R"({"prompt": [1], "max_tokens": 2.5})", 400, "max_tokens"},
      {R"({"prompt": [1], "max_tokens": true})", 400, "max_tokens"},
      {R"({"prompt": [1], "max_tokens": 18446744073709551615})", 400, "max_tokens"},
      {R"({"prompt": [1], "max_completion_tokens": 0})", 400, "max_completion_tokens"},
      {R"({"prompt": [1], "temperature": "hot"})", 400, "temperature"},
      {R"({"prompt": [1], "top_p": 1.5})", 400, "top_p"},
      {R"({"prompt": [1], "seed": "x"})", 400, "seed"},
      {R"({"prompt": [1], "stop": 3})", 400, "stop"},
      {R"({"prompt": [1], "stop": "x"})", 400, "stop"},  // no tokenizer, no text to match
      {R"({"prompt": [1], "stop_token_ids": [512]})", 400, "stop_token_ids"},
      {R"({"prompt": [1], "stream_options": {"include_usage": 1}})", 400, "stream_options.include_usage"},
      {R"({"prompt": [1], "n": 3})", 400, "n"},
      {R"({"prompt": [1], "best_of": 2})", 400, "best_of"},  // more than the server holds (1)
      {R"({"prompt": [1], "n": 2, "best_of": 1})", 400, "best_of"},
      {R"({"prompt": [1], "best_of": 2, "stream": true})", 400, "best_of"},
      {R"({"prompt": [1], "best_of": 0})", 400, "best_of"},
      {R"({"prompt": [1], "presence_penalty": 2.5})", 400, "presence_penalty"},
      {R"({"prompt": [1], "frequency_penalty": "high"})", 400, "frequency_penalty"},
      {R"({"prompt": [1], "repetition_penalty": 0})", 400, "repetition_penalty"},
      {R"({"prompt": [1], "min_p": 1.5})", 400, "min_p"},
      {R"({"prompt": [1], "min_tokens": 17})", 400, "min_tokens"},  // more than max_tokens (16)
      {R"({"prompt": [1], "min_tokens": -1})", 400, "min_tokens"},
      {R"({"prompt": [1], "min_tokens": 1.5})", 400, "min_tokens"},
      {R"({"prompt": [1], "logit_bias": {"5": 101}})", 400, "logit_bias.5"},
      {R"({"prompt": [1], "logit_bias": {"x5": 1}})", 400, "logit_bias"},
      {R"({"prompt": [1], "logit_bias": {"512": 1}})", 400, "logit_bias"},
      {R"({"prompt": [1], "logit_bias": [5]})", 400, "logit_bias"},
      {R"({"prompt": [1], "response_format": {"type": "json_object"}})", 400,
       "response_format"},  // no tokenizer
      {R"({"prompt": [1], "response_format": {"type": "json_schema"}})", 400,
       "response_format"},  // no tokenizer
      {R"({"prompt": [1], "response_format": {"type": "grammar"}})", 400, "response_format.type"},
      {R"({"prompt": [1], "suffix": "x"})", 400, "suffix"},
      {R"({"prompt": [1], "echo": 1})", 400, "echo"},
      {R"({"prompt": [1], "logprobs": 21})", 400, "logprobs"},
      {R"({"prompt": [1, "a"]})", 400, "prompt"},
      {R"({"prompt": [[1], [2]]})", 400, "prompt"},
      {R"({"prompt": "text"})", 400, "prompt"},  // no tokenizer
      {R"({"prompt": {}})", 400, "prompt"},
      {R"({})", 400, "prompt"},
      {R"({"prompt": [1], "model": "other"})", 404, "model"},
      {R"({"prompt": [1], "model": 5})", 400, "model"},
      {R"({"prompt": [1], "max_tokens": 64})", 400, "max_tokens"},  // 1 + 64 > 64
      {R"({"prompt": [1], "max_tokens": 63})", 200, ""},
      {"{\"prompt\": [1]", 400, ""},
      {"[]", 400, ""},
  };
  for (const auto& [body, status, param] : cases) {
    EXPECT_EQ(verdict(body), std::make_pair(status, param)) << body;
  }
}

TEST(OpenAiRequest, ChoicesAreNPerPromptInOpenAisOrder) {
  ServingContext ctx = id_only();
  ctx.max_choices = 6;
  const GenerationRequest r = parse_completion_request(
      R"({"prompt": [[1, 2], [3, 4, 5, 6]], "n": 3, "seed": 5, "logprobs": 1})", ctx);
  ASSERT_EQ(r.choices.size(), 6u);
  EXPECT_EQ(r.n, 3);
  for (size_t c = 0; c < r.choices.size(); ++c) {
    const SeqRequest& s = r.choices[c];
    EXPECT_EQ(s.prompt, c < 3 ? (std::vector<int32_t>{1, 2}) : (std::vector<int32_t>{3, 4, 5, 6})) << c;
    EXPECT_EQ(s.sampling.seed, 5u);
    EXPECT_EQ(s.sampler_stream, c);  // the same seed, a stream of its own
    EXPECT_EQ(s.max_new_tokens, 16);
    EXPECT_EQ(s.top_logprobs, 1);
  }
  // One request may ask for what the server holds at once, no more: a 400, since a retry cannot help.
  const std::vector<std::tuple<std::string, int, std::string>> cases = {
      {R"({"prompt": [1], "n": 6})", 200, ""},
      {R"({"prompt": [1], "n": 7})", 400, "n"},
      {R"({"prompt": [[1], [2], [3]], "n": 2})", 200, ""},
      {R"({"prompt": [[1], [2], [3], [4]], "n": 2})", 400, "n"},
      {R"({"prompt": [[1], [2], [3], [4], [5], [6], [7]]})", 400, "prompt"},
      {R"({"prompt": [1], "n": 9223372036854775807})", 400, "n"},
      {R"({"prompt": [1], "n": 0})", 400, "n"},
      {R"({"prompt": [1], "n": 2, "best_of": 2})", 200, ""},
      {R"({"prompt": [1], "n": 2, "best_of": 3})", 200, ""},
      {R"({"prompt": [1], "n": 2, "best_of": 7})", 400, "best_of"},
      {R"({"prompt": [[1], [2]], "best_of": 3})", 200, ""},
      {R"({"prompt": [[1], [2], [3]], "n": 1, "best_of": 3})", 400, "best_of"},
      {R"({"prompt": [[1], 2]})", 400, "prompt"},
      {R"({"prompt": [[1], []]})", 400, "prompt"},
      {R"({"prompt": [[1], [1, 600]]})", 400, "prompt"},
      {R"({"prompt": [[1], [1, 2]], "max_tokens": 63})", 400, "max_tokens"},  // the second: 2 + 63 > 64
  };
  for (const auto& [body, status, param] : cases) {
    std::pair<int, std::string> got{200, ""};
    try {
      parse_completion_request(body, ctx);
    } catch (const ApiError& e) {
      got = {e.status(), e.param()};
      if (body.find("[1, 2]], \"max") != std::string::npos) {
        EXPECT_NE(std::string(e.what()).find("'prompt[1]'"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(got, std::make_pair(status, param)) << body;
  }
}

// best_of above n: best_of sequences per prompt in OpenAI's order, each computing its sampled tokens'
// log-probabilities for the ranking; the answer carries them only when logprobs asks.
TEST(OpenAiRequest, BestOfGeneratesMoreChoicesThatComputeLogprobs) {
  ServingContext ctx = id_only();
  ctx.max_choices = 6;
  const GenerationRequest r =
      parse_completion_request(R"({"prompt": [[1, 2], [3]], "n": 2, "best_of": 3, "seed": 4})", ctx);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 3);
  EXPECT_FALSE(r.report_logprobs);
  ASSERT_EQ(r.choices.size(), 6u);
  for (size_t c = 0; c < r.choices.size(); ++c) {
    EXPECT_EQ(r.choices[c].prompt, c < 3 ? (std::vector<int32_t>{1, 2}) : (std::vector<int32_t>{3})) << c;
    EXPECT_EQ(r.choices[c].sampler_stream, c);
    EXPECT_EQ(r.choices[c].top_logprobs, 0);
  }
  const GenerationRequest asked =
      parse_completion_request(R"({"prompt": [1], "n": 1, "best_of": 2, "logprobs": 3})", ctx);
  EXPECT_TRUE(asked.report_logprobs);
  EXPECT_EQ(asked.choices.at(1).top_logprobs, 3);
  const GenerationRequest plain = parse_completion_request(R"({"prompt": [1], "n": 2})", ctx);
  EXPECT_EQ(plain.best_of, 2);
  EXPECT_EQ(plain.choices.at(0).top_logprobs, -1);
}

TEST(OpenAiRequest, PenaltiesBiasMinPAndMinTokensReachTheSequence) {
  const GenerationRequest r = parse_completion_request(
      R"({"prompt": [1], "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
          "min_p": 0.05, "min_tokens": 3, "logit_bias": {"7": -100, "300": 2.5}})",
      id_only());
  const LogitsAdjustments& a = r.choices[0].adjust;
  EXPECT_FLOAT_EQ(a.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(a.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(a.repetition_penalty, 1.2f);
  EXPECT_FLOAT_EQ(a.min_p, 0.05f);
  EXPECT_EQ(a.min_tokens, 3);
  const std::vector<std::pair<int32_t, float>> bias = {{300, 2.5f}, {7, -100.0f}};  // nlohmann's key order
  EXPECT_EQ(a.logit_bias, bias);
  EXPECT_FALSE(
      parse_completion_request(R"({"prompt": [1], "logit_bias": {}, "repetition_penalty": 1})", id_only())
          .choices[0]
          .adjust.active());
}

TEST(OpenAiRequest, AJsonSchemaIsCompiledInTheClientsKeyOrder) {
  ServingContext ctx = id_only();
  ctx.json_vocab =
      std::make_shared<ConstraintVocab>(std::vector<std::string>(512, "x"), std::vector<uint8_t>(512, 1));
  const GenerationRequest r = parse_completion_request(
      R"({"prompt": [1], "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "null"}},
                     "additionalProperties": false}}}})",
      ctx);
  const OutputConstraint& c = r.choices[0].adjust.constraint;
  ASSERT_TRUE(c.json);
  EXPECT_EQ(c.vocab, ctx.json_vocab);
  // The root is an alias of the object, which keeps "zeta" before "alpha" as the request wrote them.
  const JsonSchema::Node& object = c.json->node(c.json->node(JsonSchema::kRoot).branches[0]);
  ASSERT_EQ(object.properties.size(), 2u);
  EXPECT_EQ(object.properties[0].key, "\"zeta\"");
  EXPECT_EQ(object.properties[1].key, "\"alpha\"");
  EXPECT_TRUE(r.choices[0].adjust.active());

  const std::vector<std::tuple<std::string, std::string, std::string>> refused = {
      {R"({"type": "json_schema", "json_schema": {"name": "n"}})", "response_format.json_schema.schema",
       "a JSON schema"},
      {R"({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}})",
       "response_format.json_schema.name", "string"},
      {R"({"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "a"}}})",
       "response_format", "response_format.json_schema.schema: \"pattern\" is not supported"},
  };
  for (const auto& [format, param, message] : refused) {
    try {
      parse_completion_request(R"({"prompt": [1], "response_format": )" + format + "}", ctx);
      ADD_FAILURE() << format << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), param) << format;
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// vLLM's structured outputs and guided_* fields become the same constraints as response_format; one
// constraint per request, and regular expressions and grammars refused by name.
TEST(OpenAiRequest, VllmsStructuredOutputsAndGuidedFieldsConstrainTheOutput) {
  ServingContext ctx = id_only();
  ctx.json_vocab =
      std::make_shared<ConstraintVocab>(std::vector<std::string>(512, "x"), std::vector<uint8_t>(512, 1));
  auto constraint = [&ctx](const std::string& fields) {
    return parse_completion_request(R"({"prompt": [1], )" + fields + "}", ctx).choices[0].adjust.constraint;
  };
  EXPECT_EQ(*constraint(R"("guided_choice": ["b", "a"])").choice, (Choices{"a", "b"}));
  EXPECT_EQ(*constraint(R"("structured_outputs": {"choice": ["x"]})").choice, (Choices{"x"}));
  EXPECT_EQ(constraint(R"("structured_outputs": {"json_object": true})").json, JsonSchema::any_object());
  // A schema as an object (read in the client's key order) or as JSON text.
  for (const std::string& fields :
       {std::string(R"("guided_json": {"properties": {"z": {}, "a": {}}})"),
        std::string(R"("guided_json": "{\"properties\": {\"z\": {}, \"a\": {}}}")"),
        std::string(R"("structured_outputs": {"json": {"properties": {"z": {}, "a": {}}}})")}) {
    const OutputConstraint c = constraint(fields);
    ASSERT_TRUE(c.json) << fields;
    const JsonSchema::Node& object = c.json->node(c.json->node(JsonSchema::kRoot).branches[0]);
    ASSERT_EQ(object.properties.size(), 2u) << fields;
    EXPECT_EQ(object.properties[0].key, "\"z\"") << fields;
  }
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"("guided_regex": "a+")", "guided_regex"},
      {R"("guided_grammar": "root ::= x")", "guided_grammar"},
      {R"("structured_outputs": {"regex": "a+"})", "structured_outputs.regex"},
      {R"("structured_outputs": [1])", "structured_outputs"},
      {R"("guided_choice": [])", "guided_choice"},
      {R"("guided_choice": ["a", 1])", "guided_choice"},
      {R"("guided_json": "{not json")", "guided_json"},
      {R"("guided_json": {"type": "string", "pattern": "a"})", "guided_json"},
      {R"("guided_choice": ["a"], "guided_json": {})", "guided_choice"},
      {R"("response_format": {"type": "json_object"}, "guided_choice": ["a"])", "guided_choice"},
      {R"("guided_choice": ["a"], "ignore_eos": true)", "ignore_eos"},
  };
  for (const auto& [fields, param] : refused) {
    try {
      constraint(fields);
      ADD_FAILURE() << fields << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), param) << fields << ": " << e.what();
    }
  }
}

// A chat context over a fixture tokenizer (Kimi's or K3's markers), with the constraint vocabulary.
struct ChatContext {
  explicit ChatContext(const std::string& name, ChatFormat format)
      : tok(Tokenizer::load(std::string(HLM_FIXTURES_DIR) + "/tokenizer/" + name)), chat(tok, format) {
    ctx = ServingContext{"tiny", 1 << 20, tok.vocab_size(), &tok, &chat};
    ctx.json_vocab = constraint_vocab(tok, tok.vocab_size());
  }
  Tokenizer tok;
  ChatTemplate chat;
  ServingContext ctx;
};

// tool_choice "required" or a named function becomes a tool-call grammar over the declared tools (or the
// named one), in Kimi Linear's format; K3's format is refused for it and for JSON response formats.
TEST(OpenAiRequest, AForcedToolChoiceBecomesAToolCallGrammar) {
  const ChatContext kimi("kimi_sparse", ChatFormat::kKimiLinear);
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "get_time"}}])";
  const std::string head = R"({"messages": [{"role": "user", "content": "hi"}], )" + tools;
  const GenerationRequest required = parse_chat_request(head + R"(, "tool_choice": "required"})", kimi.ctx);
  const OutputConstraint& c = required.choices[0].adjust.constraint;
  ASSERT_TRUE(c.tool_calls);
  EXPECT_FALSE(c.json);
  EXPECT_TRUE(required.parse_tools);
  EXPECT_FALSE(c.tool_calls->one_call);
  ASSERT_EQ(c.tool_calls->tools.size(), 2u);
  EXPECT_EQ(c.tool_calls->id_heads[0], "functions.get_time:");  // sorted by name
  EXPECT_EQ(c.tool_calls->markers.call_begin, *kimi.tok.special_id("<|tool_call_begin|>"));
  const GenerationRequest named = parse_chat_request(
      head + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})", kimi.ctx);
  const auto& grammar = *named.choices[0].adjust.constraint.tool_calls;
  EXPECT_TRUE(grammar.one_call);
  ASSERT_EQ(grammar.tools.size(), 1u);
  EXPECT_EQ(grammar.tools[0].name, "get_weather");
  // parallel_tool_calls false: "required" is one call, to any of the tools.
  const GenerationRequest single =
      parse_chat_request(head + R"(, "tool_choice": "required", "parallel_tool_calls": false})", kimi.ctx);
  EXPECT_FALSE(single.parallel_tool_calls);
  EXPECT_TRUE(single.choices[0].adjust.constraint.tool_calls->one_call);
  EXPECT_EQ(single.choices[0].adjust.constraint.tool_calls->tools.size(), 2u);

  const ChatContext k3("k3_sparse", ChatFormat::kK3);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {head + R"(, "tool_choice": "required"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}})",
       "response_format"},
  };
  for (const auto& [body, param] : refused) {
    try {
      parse_chat_request(body, k3.ctx);
      ADD_FAILURE() << body << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), param) << e.what();
      EXPECT_NE(std::string(e.what()).find("k3"), std::string::npos) << e.what();
    }
  }
}

TEST(OpenAiRequest, EchoWithLogprobsScoresThePrompt) {
  const GenerationRequest scored = parse_completion_request(
      R"({"prompt": [1, 2], "echo": true, "logprobs": 1, "max_tokens": 0})", id_only());
  EXPECT_TRUE(scored.echo);
  EXPECT_EQ(scored.choices[0].prompt_logprobs, 1);
  EXPECT_EQ(scored.choices[0].max_new_tokens, 0);
  const GenerationRequest text_only =
      parse_completion_request(R"({"prompt": [1, 2], "echo": true})", id_only());
  EXPECT_EQ(text_only.choices[0].prompt_logprobs, -1);
  EXPECT_EQ(
      parse_completion_request(R"({"prompt": [1, 2], "logprobs": 1})", id_only()).choices[0].prompt_logprobs,
      -1);
  EXPECT_EQ(verdict(R"({"prompt": [1], "max_tokens": 0})"), std::make_pair(400, std::string("max_tokens")));
}

// vLLM's prompt_logprobs: the prompt scored with that many alternatives (the larger count where echo and
// logprobs ask too), max_tokens 0 allowed, not on a stream, in both endpoints.
TEST(OpenAiRequest, PromptLogprobsScoreThePrompt) {
  const GenerationRequest r =
      parse_completion_request(R"({"prompt": [1, 2], "prompt_logprobs": 2, "max_tokens": 0})", id_only());
  EXPECT_EQ(r.prompt_logprobs, 2);
  EXPECT_EQ(r.choices[0].prompt_logprobs, 2);
  EXPECT_EQ(r.choices[0].top_logprobs, -1);
  EXPECT_FALSE(r.report_logprobs);
  const GenerationRequest both = parse_completion_request(
      R"({"prompt": [1, 2], "prompt_logprobs": 0, "echo": true, "logprobs": 3})", id_only());
  EXPECT_EQ(both.prompt_logprobs, 0);
  EXPECT_EQ(both.choices[0].prompt_logprobs, 3);
  EXPECT_EQ(
      parse_completion_request(R"({"prompt": [1], "prompt_logprobs": null})", id_only()).prompt_logprobs, -1);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"prompt": [1], "prompt_logprobs": 21})", "prompt_logprobs"},
      {R"({"prompt": [1], "prompt_logprobs": -1})", "prompt_logprobs"},
      {R"({"prompt": [1], "prompt_logprobs": 1, "stream": true})", "prompt_logprobs"},
  };
  for (const auto& [body, param] : refused) EXPECT_EQ(verdict(body), std::make_pair(400, param)) << body;
}

TEST(OpenAiRequest, LengthErrorsGiveBothNumbers) {
  std::vector<int32_t> long_prompt(70, 1);
  nlohmann::json body = {{"prompt", long_prompt}};
  try {
    parse_completion_request(body.dump(), id_only());
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("70"), std::string::npos) << e.what();
  }
}

TEST(OpenAiRequest, ChatNeedsATokenizerAndValidatesMessages) {
  try {
    parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}]})", id_only());
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"content": "hi"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "wizard", "content": "hi"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "messages[0].tool_call_id"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "always"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"function": {}}})",
       "tool_choice.function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "web"}})",
       "tool_choice.type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "tools[0].function"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "best_of": 2})", "best_of"},
  };
  for (const auto& [body, param] : cases) {
    try {
      parse_chat_request(body, id_only());
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << body;
      EXPECT_EQ(e.param(), param) << body << ": " << e.what();
    }
  }
}

TEST(OpenAiRequest, MessagesKeepRolesToolCallsAndTextParts) {
  const auto msgs = parse_messages(nlohmann::json::parse(R"([
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "functions.f:0", "type": "function",
        "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "functions.f:0", "content": "42"}])"));
  ASSERT_EQ(msgs.size(), 4u);
  EXPECT_EQ(msgs[0].role, "system");
  EXPECT_EQ(msgs[1].content, "ab");
  ASSERT_EQ(msgs[2].tool_calls.size(), 1u);
  EXPECT_EQ(msgs[2].tool_calls[0].name, "f");
  EXPECT_EQ(msgs[2].tool_calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(msgs[3].tool_call_id, "functions.f:0");
}

}  // namespace
}  // namespace hlm
