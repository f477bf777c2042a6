// ResponseWriter on a scripted request channel (no engine): a whole answer goes out once complete with
// its true status (a failure after submission is not a 200), a client that leaves cancels the sequence,
// a stream that fails ends with an error event and [DONE], and a request of several choices interleaves
// them and ends when the last one does.
#include "server/response_writer.h"

#include <gtest/gtest.h>

#include <map>

#include "base/error.h"

namespace hlm {
namespace {

ServingContext id_only() { return ServingContext{"tiny", 64, 512, nullptr, nullptr}; }

GenerationRequest request(bool stream) {
  GenerationRequest r;
  r.endpoint = Endpoint::kCompletions;
  r.choices = {SeqRequest{}};
  r.choices[0].prompt = {1, 2, 3};
  r.stream = stream;
  r.return_token_ids = true;
  return r;
}

SeqOutput out(int32_t id, FinishReason finish = FinishReason::kNone) {
  SeqOutput o;
  o.token = SampledToken{id, -0.5f, {}};
  o.finish = finish;
  return o;
}

// Collects what a stream writes.
struct Sink {
  httplib::DataSink sink;
  std::string written;
  bool done = false;
  Sink() {
    sink.write = [this](const char* d, size_t n) {
      written.append(d, n);
      return true;
    };
    sink.done = [this] { done = true; };
    sink.is_writable = [] { return true; };
  }
};

class ResponseWriterTest : public ::testing::Test {
 protected:
  std::unique_ptr<ResponseWriter> writer(bool stream) {
    return std::make_unique<ResponseWriter>(
        channel_, GenerationResponse(request(stream), id_only(), "cmpl-1", 1), Clock::now(),
        [this](int64_t) { ++cancels_; }, metrics_);
  }

  std::shared_ptr<RequestChannel> channel_ = std::make_shared<RequestChannel>(0, 1);
  Metrics metrics_;
  int cancels_ = 0;
};

TEST_F(ResponseWriterTest, AWholeAnswerComesOnceComplete) {
  auto w = writer(false);
  channel_->push(out(7), Clock::now());
  channel_->push(out(8, FinishReason::kLength), Clock::now());
  const std::optional<CompleteResponse> r = w->complete([] { return false; });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const nlohmann::json body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["choices"][0]["token_ids"], (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(cancels_, 0);
}

TEST_F(ResponseWriterTest, AFailureAfterSubmissionKeepsItsStatus) {
  for (const int status : {500, 503}) {
    channel_ = std::make_shared<RequestChannel>(0, 1);
    auto w = writer(false);
    channel_->push(out(7), Clock::now());
    channel_->fail(status, "step 2 of its generation gave non-finite logits");
    const std::optional<CompleteResponse> r = w->complete([] { return false; });
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status);
    const nlohmann::json body = nlohmann::json::parse(r->body);
    EXPECT_EQ(body["error"]["code"], status);
    EXPECT_EQ(body["error"]["message"], "step 2 of its generation gave non-finite logits");
  }
}

TEST_F(ResponseWriterTest, AClientThatLeftCancelsTheSequence) {
  auto w = writer(false);
  channel_->push(out(7), Clock::now());
  int polls = 0;
  EXPECT_FALSE(w->complete([&] { return ++polls == 3; }));
  EXPECT_EQ(cancels_, 1);
  EXPECT_NE(metrics_.render().find("finish_reason=\"abort\"} 1"), std::string::npos) << metrics_.render();
}

TEST_F(ResponseWriterTest, AFailedStreamEndsWithAnErrorEventAndDone) {
  auto w = writer(true);
  Sink s;
  channel_->push(out(7), Clock::now());
  EXPECT_TRUE(w->pump(s.sink));
  EXPECT_FALSE(s.done);
  EXPECT_EQ(s.written.rfind("data: {", 0), 0u) << s.written;
  s.written.clear();
  channel_->fail(503, "the server was stopped before this request finished");
  EXPECT_TRUE(w->pump(s.sink));
  EXPECT_TRUE(s.done);
  const std::string done = "\n\ndata: [DONE]\n\n";
  ASSERT_GT(s.written.size(), done.size() + 6);
  EXPECT_EQ(s.written.substr(s.written.size() - done.size()), done);
  const nlohmann::json err = nlohmann::json::parse(s.written.substr(6, s.written.size() - 6 - done.size()));
  EXPECT_EQ(err["error"]["code"], 503);
  EXPECT_EQ(err["error"]["type"], "service_unavailable_error");
  w->close(true);
  EXPECT_EQ(cancels_, 0);
}

// Two prompts with n = 2: four sequences, engine ids 10..13, their outputs arriving interleaved.
TEST_F(ResponseWriterTest, ChoicesInterleaveAndTheRequestEndsWithItsLastChoice) {
  GenerationRequest r = request(true);
  r.n = 2;
  r.include_usage = true;
  r.choices.assign(4, SeqRequest{});
  r.choices[0].prompt = r.choices[1].prompt = {1, 2, 3};
  r.choices[2].prompt = r.choices[3].prompt = {4, 5};
  channel_ = std::make_shared<RequestChannel>(10, 4);
  std::vector<int64_t> cancelled;
  ResponseWriter w(
      channel_, GenerationResponse(r, id_only(), "cmpl-4", 1), Clock::now(),
      [&](int64_t id) { cancelled.push_back(id); }, metrics_);
  auto of = [](int64_t id, int32_t token, FinishReason finish = FinishReason::kNone) {
    SeqOutput o = out(token, finish);
    o.id = id;
    return o;
  };
  channel_->push(of(12, 30, FinishReason::kLength), Clock::now());
  channel_->push(of(10, 7), Clock::now());
  channel_->push(of(11, 8, FinishReason::kLength), Clock::now());
  channel_->push(of(13, 40, FinishReason::kLength), Clock::now());
  channel_->push(of(10, 9, FinishReason::kLength), Clock::now());
  // A sequence not of this request is a bug, not a token for some choice.
  EXPECT_THROW(channel_->push(of(14, 1), Clock::now()), Error);
  Sink s;
  EXPECT_TRUE(w.pump(s.sink));
  ASSERT_TRUE(s.done) << s.written;
  std::map<int, std::vector<int32_t>> ids;
  int usage_chunks = 0;
  for (size_t at = 0; (at = s.written.find("data: {", at)) != std::string::npos; ++at) {
    const nlohmann::json c =
        nlohmann::json::parse(s.written.substr(at + 6, s.written.find("\n\n", at) - at - 6));
    if (c["choices"].empty()) {
      ++usage_chunks;
      EXPECT_EQ(c["usage"]["prompt_tokens"], 5);  // each prompt once
      EXPECT_EQ(c["usage"]["completion_tokens"], 5);
      continue;
    }
    const int index = c["choices"][0]["index"];
    for (int32_t id : c["choices"][0]["token_ids"]) ids[index].push_back(id);
  }
  EXPECT_EQ(usage_chunks, 1);
  const std::map<int, std::vector<int32_t>> expected = {{0, {7, 9}}, {1, {8}}, {2, {30}}, {3, {40}}};
  EXPECT_EQ(ids, expected);
  EXPECT_TRUE(cancelled.empty());
  EXPECT_NE(metrics_.render().find("finish_reason=\"length\"} 4"), std::string::npos) << metrics_.render();
}

TEST_F(ResponseWriterTest, AClientThatLeftCancelsEveryOpenChoice) {
  GenerationRequest r = request(false);
  r.n = 3;
  r.choices.assign(3, r.choices[0]);
  channel_ = std::make_shared<RequestChannel>(20, 3);
  std::vector<int64_t> cancelled;
  ResponseWriter w(
      channel_, GenerationResponse(r, id_only(), "cmpl-5", 1), Clock::now(),
      [&](int64_t id) { cancelled.push_back(id); }, metrics_);
  SeqOutput done = out(5, FinishReason::kLength);
  done.id = 21;
  channel_->push(done, Clock::now());
  int polls = 0;
  EXPECT_FALSE(w.complete([&] { return ++polls == 2; }));
  EXPECT_EQ(cancelled, (std::vector<int64_t>{20, 22}));  // 21 had ended
}

}  // namespace
}  // namespace hlm
