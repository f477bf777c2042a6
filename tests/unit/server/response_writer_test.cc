// ResponseWriter on a scripted request channel (no engine): a whole answer goes out once complete with
// its true status (a failure after submission is not a 200), a client that leaves cancels the sequence,
// and a stream that fails ends with an error event and [DONE].
#include "server/response_writer.h"

#include <gtest/gtest.h>

namespace hlm {
namespace {

ServingContext id_only() { return ServingContext{"tiny", 64, 512, nullptr, nullptr}; }

GenerationRequest request(bool stream) {
  GenerationRequest r;
  r.endpoint = Endpoint::kCompletions;
  r.seq.prompt = {1, 2, 3};
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
        [this] { ++cancels_; }, metrics_);
  }

  std::shared_ptr<RequestChannel> channel_ = std::make_shared<RequestChannel>(1);
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
    channel_ = std::make_shared<RequestChannel>(1);
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

}  // namespace
}  // namespace hlm
