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
  req.report_logprobs = true;
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

// best_of 3, n 2 over two prompts: each prompt's two choices of the highest cumulative log-probability,
// best first and numbered in the answer's order (the lower index on a tie); usage counts every token
// generated, each prompt once; log-probabilities computed for the ranking only stay out of the answer.
TEST(GenerationResponse, BestOfKeepsTheNMostLikelyChoicesOfEachPrompt) {
  GenerationRequest req = request(false);
  req.n = 2;
  req.best_of = 3;
  req.return_token_ids = true;
  req.choices.assign(6, req.choices[0]);
  req.choices[3].prompt = {4, 5};
  GenerationResponse g(req, id_only(), "cmpl-4", 1);
  auto token = [](int32_t id, float logprob, FinishReason finish = FinishReason::kNone) {
    SeqOutput o;
    o.token = SampledToken{id, logprob, {}};
    o.finish = finish;
    return o;
  };
  // Prompt 0: sums -3.0, -1.0, -1.0 (a tie: choice 1 before 2). Prompt 1: -0.5, -4.0, -2.0.
  const std::vector<std::vector<float>> logprobs = {{-1.0f, -2.0f}, {-1.0f}, {-0.5f, -0.5f},
                                                    {-0.5f},        {-4.0f}, {-1.0f, -1.0f}};
  for (int c = 0; c < 6; ++c) {
    for (size_t t = 0; t < logprobs[c].size(); ++t) {
      const bool last = t + 1 == logprobs[c].size();
      g.push(c, token(10 * c + static_cast<int32_t>(t), logprobs[c][t],
                      last ? FinishReason::kLength : FinishReason::kNone));
    }
  }
  ASSERT_TRUE(g.done());
  const nlohmann::json r = g.result();
  ASSERT_EQ(r["choices"].size(), 4u);
  const std::vector<std::vector<int32_t>> ids = {{10}, {20, 21}, {30}, {50, 51}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["token_ids"], ids[i]) << i;
    EXPECT_TRUE(r["choices"][i]["logprobs"].is_null()) << i;
  }
  EXPECT_EQ(r["choices"][2]["prompt_token_ids"], (std::vector<int32_t>{4, 5}));
  const nlohmann::json usage = {{"prompt_tokens", 5}, {"completion_tokens", 9}, {"total_tokens", 14}};
  EXPECT_EQ(r["usage"], usage);
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
