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
  EXPECT_EQ(r.seq.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.seq.max_new_tokens, 5);
  EXPECT_FLOAT_EQ(r.seq.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.seq.sampling.top_p, 0.9f);
  EXPECT_EQ(r.seq.sampling.top_k, 7);
  EXPECT_EQ(r.seq.sampling.seed, 42u);
  EXPECT_EQ(r.seq.stop_ids, (std::vector<int32_t>{9}));
  EXPECT_EQ(r.seq.top_logprobs, 2);
  EXPECT_FALSE(r.seq.stop_at_eos);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequest, DefaultsFollowOpenAi) {
  const GenerationRequest r = parse_completion_request(R"({"prompt": [[4, 5]]})", id_only());
  EXPECT_EQ(r.seq.prompt, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(r.seq.max_new_tokens, 16);  // the legacy endpoint's default
  EXPECT_FLOAT_EQ(r.seq.sampling.temperature, 1.0f);
  EXPECT_EQ(r.seq.sampling.top_k, 0);
  EXPECT_EQ(r.seq.top_logprobs, -1);
  EXPECT_TRUE(r.seq.stop_at_eos);
  EXPECT_FALSE(r.stream);
  // top_k -1 is vLLM's "no limit".
  EXPECT_EQ(parse_completion_request(R"({"prompt": [4], "top_k": -1})", id_only()).seq.sampling.top_k, 0);
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
      {R"({"prompt": [1], "best_of": 2})", 400, "best_of"},
      {R"({"prompt": [1], "presence_penalty": 1})", 400, "presence_penalty"},
      {R"({"prompt": [1], "repetition_penalty": 1.1})", 400, "repetition_penalty"},
      {R"({"prompt": [1], "min_tokens": 4})", 400, "min_tokens"},  // not silently ignored
      {R"({"prompt": [1], "min_tokens": -1})", 400, "min_tokens"},
      {R"({"prompt": [1], "min_tokens": 1.5})", 400, "min_tokens"},
      {R"({"prompt": [1], "logit_bias": {"5": 1}})", 400, "logit_bias"},
      {R"({"prompt": [1], "response_format": {"type": "json_object"}})", 400, "response_format.type"},
      {R"({"prompt": [1], "echo": true})", 400, "echo"},
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
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "tools[0].function"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
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
