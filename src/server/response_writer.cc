#include "server/response_writer.h"

#include "base/log.h"
#include "server/api_error.h"

namespace hlm {

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// How long one pump waits for tokens before checking the connection again.
constexpr std::chrono::milliseconds kPoll{50};

}  // namespace

ResponseWriter::ResponseWriter(std::shared_ptr<RequestChannel> channel, GenerationResponse response,
                               bool stream, Clock::time_point arrival, EngineLoop& loop, Metrics& metrics)
    : channel_(std::move(channel)),
      response_(std::move(response)),
      stream_(stream),
      arrival_(arrival),
      loop_(loop),
      metrics_(metrics) {}

void ResponseWriter::observe(const TimedOutput& t) {
  if (!t.output.token) return;
  if (tokens_ == 0) {
    first_ = t.time;
    metrics_.observe_ttft(seconds(t.time - arrival_));
  } else {
    metrics_.observe_itl(seconds(t.time - last_));
  }
  last_ = t.time;
  ++tokens_;
}

bool ResponseWriter::write(httplib::DataSink& sink, const std::string& data) {
  return sink.write(data.data(), data.size());
}

bool ResponseWriter::pump(httplib::DataSink& sink) {
  RequestChannel::Events ev = channel_->wait(kPoll);
  for (const TimedOutput& t : ev.outputs) {
    if (response_.done()) break;
    observe(t);
    for (const nlohmann::json& c : response_.push(t.output)) {
      if (stream_ && !write(sink, sse_event(c))) return false;
    }
  }
  if (response_.done()) {
    // A stop string ended the text while the engine still runs the sequence.
    if (response_.stopped_by_text()) loop_.cancel(channel_->id());
    std::string body;
    if (stream_) {
      for (const nlohmann::json& c : response_.finish_chunks()) body += sse_event(c);
      body += "data: [DONE]\n\n";
    } else {
      body = dump_json(response_.result());
    }
    if (!write(sink, body)) return false;
    ended_ = true;
    finish_log(response_.finish_reason().c_str());
    sink.done();
    return true;
  }
  if (ev.error) {
    const nlohmann::json err = error_body(500, *ev.error);
    const std::string body = stream_ ? sse_event(err) + "data: [DONE]\n\n" : dump_json(err);
    write(sink, body);
    ended_ = true;
    finish_log("error");
    sink.done();
    return true;
  }
  // No news: make sure someone is still listening (a closed socket reads as end of file).
  return sink.is_writable();
}

void ResponseWriter::close(bool success) {
  if (ended_ && success) return;
  loop_.cancel(channel_->id());
  if (!ended_) finish_log("abort");
}

void ResponseWriter::finish_log(const char* finish_reason) {
  metrics_.count_finished(finish_reason);
  metrics_.add_tokens(response_.prompt_tokens(), tokens_);
  const Clock::time_point end = tokens_ > 0 ? last_ : Clock::now();
  metrics_.observe_e2e(seconds(end - arrival_));
  const double ttft_ms = tokens_ > 0 ? 1e3 * seconds(first_ - arrival_) : 0.0;
  const double decode_s = seconds(last_ - first_);
  const double tps = tokens_ > 1 && decode_s > 0 ? static_cast<double>(tokens_ - 1) / decode_s : 0.0;
  spdlog::info("request {}: {} prompt + {} generated tokens, TTFT {:.1f} ms, {:.1f} tokens/s, finish {}",
               response_.id(), response_.prompt_tokens(), tokens_, ttft_ms, tps, finish_reason);
}

}  // namespace hlm
