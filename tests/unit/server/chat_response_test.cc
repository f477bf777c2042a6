// Chat responses from scripted model output (token ids the Kimi tokenizer gives for a known text, fed
// as if sampled): tool calls and <think> reasoning come out in OpenAI's fields, streamed and whole,
// with finish_reason "tool_calls" when the turn calls tools; a malformed call is none, streamed or whole;
// a marker split across steps never leaks.
#include <gtest/gtest.h>

#include "server/openai_response.h"

namespace hlm {
namespace {

const std::string kTokenizerDir = std::string(HLM_FIXTURES_DIR) + "/tokenizer/kimi_sparse";

class ChatResponseTest : public ::testing::Test {
 protected:
  ChatResponseTest()
      : tok_(Tokenizer::load(kTokenizerDir)),
        chat_(tok_, ChatFormat::kKimiLinear),
        ctx_{"kimi", 4096, tok_.vocab_size(), &tok_, &chat_} {}

  GenerationRequest request(bool stream, bool tools) const {
    GenerationRequest r;
    r.endpoint = Endpoint::kChat;
    r.choices = {SeqRequest{}};
    r.choices[0].prompt = {1, 2};
    r.stream = stream;
    r.parse_tools = tools;
    r.parallel_tool_calls = parallel_;
    return r;
  }
  // The model "says" `text` token by token, then the turn's end id.
  std::vector<SeqOutput> script(const std::string& text) const {
    std::vector<SeqOutput> outs;
    for (int32_t id : tok_.encode(text, /*allow_special=*/true)) {
      SeqOutput o;
      o.token = SampledToken{id, 0.0f, {}};
      outs.push_back(o);
    }
    SeqOutput end;
    end.token = SampledToken{*tok_.special_id("<|im_end|>"), 0.0f, {}};
    end.stop_token = true;
    end.finish = FinishReason::kStop;
    outs.push_back(end);
    return outs;
  }
  // (whole response, concatenated stream deltas by field).
  std::pair<nlohmann::json, nlohmann::json> run(const std::string& text, bool tools) {
    GenerationResponse whole(request(false, tools), ctx_, "chatcmpl-1", 1);
    GenerationResponse streamed(request(true, tools), ctx_, "chatcmpl-1", 1);
    nlohmann::json deltas = {
        {"content", ""}, {"reasoning_content", ""}, {"tool_calls", nlohmann::json::array()}};
    for (const SeqOutput& o : script(text)) {
      whole.push(0, o);
      for (const nlohmann::json& c : streamed.push(0, o)) {
        const nlohmann::json& d = c["choices"][0]["delta"];
        for (const char* f : {"content", "reasoning_content"}) {
          if (d.contains(f)) deltas[f] = deltas[f].get<std::string>() + d[f].get<std::string>();
        }
        if (d.contains("tool_calls")) {
          for (const nlohmann::json& call : d["tool_calls"]) deltas["tool_calls"].push_back(call);
        }
        if (!c["choices"][0]["finish_reason"].is_null())
          deltas["finish_reason"] = c["choices"][0]["finish_reason"];
      }
    }
    EXPECT_TRUE(whole.done());
    return {whole.result(), deltas};
  }

  Tokenizer tok_;
  ChatTemplate chat_;
  ServingContext ctx_;
  bool parallel_ = true;
};

const char* kToolTurn =
    "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    "<|tool_call_argument_begin|>{\"city\": "
    "\"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1"
    "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";

TEST_F(ChatResponseTest, ToolCallsBecomeOpenAiToolCalls) {
  const auto [whole, deltas] = run(kToolTurn, /*tools=*/true);
  const nlohmann::json& choice = whole["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const nlohmann::json& msg = choice["message"];
  EXPECT_EQ(msg["content"], "Let me check.");
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][0]["id"], "functions.get_weather:0");
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(nlohmann::json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            nlohmann::json({{"city", "Paris"}}));
  EXPECT_EQ(msg["tool_calls"][1]["function"]["name"], "get_time");

  EXPECT_EQ(deltas["content"], "Let me check.");
  EXPECT_EQ(deltas["finish_reason"], "tool_calls");
  ASSERT_EQ(deltas["tool_calls"].size(), 2u);
  EXPECT_EQ(deltas["tool_calls"][0]["index"], 0);
  EXPECT_EQ(deltas["tool_calls"][1]["index"], 1);
  EXPECT_EQ(deltas["tool_calls"][1]["function"]["name"], "get_time");
}

// parallel_tool_calls false under tool_choice "auto": the answer keeps the first call, streamed or whole.
TEST_F(ChatResponseTest, WithParallelToolCallsOffOnlyTheFirstCallIsReturned) {
  parallel_ = false;
  const auto [whole, deltas] = run(kToolTurn, /*tools=*/true);
  const nlohmann::json& msg = whole["choices"][0]["message"];
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_EQ(deltas["tool_calls"].size(), 1u);
  EXPECT_EQ(deltas["tool_calls"][0]["index"], 0);
}

TEST_F(ChatResponseTest, AMalformedCallIsNoToolCallStreamedOrWhole) {
  // No argument marker, then an id of another shape: neither is a call, and their text is not content.
  const auto [whole, deltas] =
      run("Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0 {\"city\": "
          "\"Paris\"}<|tool_call_end|><|tool_call_begin|>get weather<|tool_call_argument_begin|>{}"
          "<|tool_call_end|><|tool_calls_section_end|>",
          /*tools=*/true);
  const nlohmann::json& choice = whole["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(choice["message"]["content"], "Let me check.");
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_EQ(deltas["content"], "Let me check.");
  EXPECT_TRUE(deltas["tool_calls"].empty());
  EXPECT_EQ(deltas["finish_reason"], "stop");
}

TEST_F(ChatResponseTest, WithoutToolsTheMarkersAreNotParsedAsCalls) {
  const auto [whole, deltas] = run(kToolTurn, /*tools=*/false);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(whole["choices"][0]["message"].contains("tool_calls"));
  EXPECT_TRUE(deltas["tool_calls"].empty());
}

TEST_F(ChatResponseTest, ThinkIsReasoningContent) {
  const auto [whole, deltas] = run("<think>The user greets.</think>Hello!", /*tools=*/false);
  const nlohmann::json& msg = whole["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "The user greets.");
  EXPECT_EQ(msg["content"], "Hello!");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(deltas["reasoning_content"], "The user greets.");
  EXPECT_EQ(deltas["content"], "Hello!");
}

}  // namespace
}  // namespace hlm
