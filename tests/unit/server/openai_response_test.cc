// The response builder fed scripted engine outputs (no model): stream chunks and the whole response
// agree, finish reasons, usage, token ids and log-probabilities take OpenAI's shapes.
#include "server/openai_response.h"

#include <gtest/gtest.h>

namespace hlm {
namespace {

ServingContext id_only() { return ServingContext{"tiny", 64, 512, nullptr, nullptr}; }

SeqOutput out(int32_t id, FinishReason finish = FinishReason::kNone, bool stop_token = false) {
  SeqOutput o;
  o.token = SampledToken{id, -0.5f, {{id, -0.5f}, {id + 1, -1.5f}}};
  o.finish = finish;
  o.stop_token = stop_token;
  return o;
}

GenerationRequest request(bool stream) {
  GenerationRequest r;
  r.endpoint = Endpoint::kCompletions;
  r.choices = {SeqRequest{}};
  r.choices[0].prompt = {1, 2, 3};
  r.stream = stream;
  r.include_usage = true;
  r.return_token_ids = true;
  return r;
}

TEST(GenerationResponse, StreamAndWholeResponseAgree) {
  GenerationResponse streamed(request(true), id_only(), "cmpl-1", 100);
  GenerationResponse whole(request(false), id_only(), "cmpl-1", 100);
  const std::vector<SeqOutput> script = {out(7), out(8), out(2, FinishReason::kStop, true)};
  std::vector<int32_t> ids;
  std::vector<nlohmann::json> chunks;
  for (const SeqOutput& o : script) {
    for (auto& c : streamed.push(0, o)) chunks.push_back(c);
    EXPECT_TRUE(whole.push(0, o).empty());
  }
  ASSERT_TRUE(streamed.done());
  ASSERT_TRUE(whole.done());
  for (auto& c : streamed.finish_chunks()) chunks.push_back(c);
  ASSERT_EQ(chunks.size(), 4u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(chunks[i]["object"], "text_completion");
    EXPECT_TRUE(chunks[i]["usage"].is_null());
    ids.push_back(chunks[i]["choices"][0]["token_ids"][0]);
    EXPECT_EQ(chunks[i]["choices"][0]["finish_reason"],
              i == 2 ? nlohmann::json("stop") : nlohmann::json(nullptr));
  }
  EXPECT_TRUE(chunks[3]["choices"].empty());
  const nlohmann::json usage = {{"prompt_tokens", 3}, {"completion_tokens", 3}, {"total_tokens", 6}};
  EXPECT_EQ(chunks[3]["usage"], usage);

  const nlohmann::json r = whole.result();
  EXPECT_EQ(r["id"], "cmpl-1");
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["usage"], usage);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["token_ids"], ids);
  EXPECT_EQ(r["choices"][0]["prompt_token_ids"], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r["choices"][0]["text"], "");
}

TEST(GenerationResponse, LengthFinishAndLegacyLogprobs) {
  GenerationRequest req = request(false);
  req.choices[0].top_logprobs = 2;
  GenerationResponse g(req, id_only(), "cmpl-2", 1);
  g.push(0, out(7));
  g.push(0, out(9, FinishReason::kLength));
  const nlohmann::json r = g.result();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  const nlohmann::json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], (std::vector<std::string>{"token_id:7", "token_id:9"}));
  EXPECT_EQ(lp["token_logprobs"][1], -0.5);
  EXPECT_EQ(lp["top_logprobs"][1]["token_id:10"], -1.5);
  EXPECT_EQ(lp["top_logprobs"][1].size(), 2u);
}

TEST(GenerationResponse, NothingIsAcceptedAfterTheEnd) {
  GenerationResponse g(request(true), id_only(), "cmpl-3", 1);
  EXPECT_EQ(g.push(0, out(4, FinishReason::kLength)).size(), 1u);
  EXPECT_TRUE(g.push(0, out(5)).empty());
  EXPECT_EQ(g.completion_tokens(), 1);
}

TEST(Sse, FramesAndReplacesInvalidUtf8) {
  EXPECT_EQ(sse_event({{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(dump_json(std::string("\xff")), "\"\xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace hlm
