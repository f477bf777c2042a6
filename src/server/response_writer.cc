#include "server/response_writer.h"

#include <algorithm>

#include "base/error.h"
#include "base/log.h"
#include "server/api_error.h"

namespace hlm {

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// How long one wait for tokens lasts before the connection is checked again.
constexpr std::chrono::milliseconds kPoll{50};

std::string error_json(const RequestFailure& f) { return dump_json(error_body(f.status, f.message)); }

}  // namespace

ResponseWriter::ResponseWriter(std::shared_ptr<RequestChannel> channel, GenerationResponse response,
                               Clock::time_point arrival, std::function<void(int64_t)> cancel,
                               Metrics& metrics)
    : channel_(std::move(channel)),
      response_(std::move(response)),
      arrival_(arrival),
      cancel_(std::move(cancel)),
      metrics_(metrics),
      last_of_(static_cast<size_t>(response_.choices())) {
  HLM_CHECK(channel_->choices() == response_.choices(),
            "a response of {} choices on a request of {} sequences", response_.choices(),
            channel_->choices());
}

void ResponseWriter::observe(const TimedOutput& t) {
  if (!t.output.token) return;
  if (tokens_ == 0) {
    first_ = t.time;
    metrics_.observe_ttft(seconds(t.time - arrival_));
  }
  std::optional<Clock::time_point>& last_of_choice = last_of_[t.choice];
  if (last_of_choice) metrics_.observe_itl(seconds(t.time - *last_of_choice));
  last_of_choice = t.time;
  last_ = std::max(last_, t.time);
  ++tokens_;
}

std::string ResponseWriter::take(const std::vector<TimedOutput>& outputs) {
  std::string sse;
  for (const TimedOutput& t : outputs) {
    if (response_.done(t.choice)) continue;
    observe(t);
    for (const nlohmann::json& c : response_.push(t.choice, t.output)) sse += sse_event(c);
    // A stop string ended the text while the engine still runs the sequence.
    if (response_.done(t.choice) && response_.stopped_by_text(t.choice)) cancel_(channel_->id(t.choice));
  }
  return sse;
}

void ResponseWriter::cancel_open() {
  for (int c = 0; c < response_.choices(); ++c) {
    if (!response_.done(c)) cancel_(channel_->id(c));
  }
}

bool ResponseWriter::pump(httplib::DataSink& sink) {
  const RequestChannel::Events ev = channel_->wait(kPoll);
  std::string data = take(ev.outputs);
  std::optional<std::string> ending;  // the finish reason once the stream is over
  if (response_.done()) {
    for (const nlohmann::json& c : response_.finish_chunks()) data += sse_event(c);
    ending = "";
  } else if (ev.error) {
    // The status line went out with the first chunk: the failure travels as an event.
    data += "data: " + error_json(*ev.error) + "\n\n";
    ending = "error";
  }
  if (ending) data += "data: [DONE]\n\n";
  // No news: make sure someone is still listening (a closed socket reads as end of file).
  if (data.empty()) return sink.is_writable();
  if (!sink.write(data.data(), data.size())) return false;
  if (ending) {
    ended_ = true;
    finish_log(ending->empty() ? std::nullopt : ending);
    sink.done();
  }
  return true;
}

void ResponseWriter::close(bool success) {
  if (ended_ && success) return;
  cancel_open();
  if (!ended_) finish_log("abort");
}

std::optional<CompleteResponse> ResponseWriter::complete(const std::function<bool()>& client_gone) {
  for (;;) {
    const RequestChannel::Events ev = channel_->wait(kPoll);
    take(ev.outputs);
    if (response_.done()) {
      finish_log(std::nullopt);
      return CompleteResponse{200, dump_json(response_.result())};
    }
    if (ev.error) {
      finish_log("error");
      return CompleteResponse{ev.error->status, error_json(*ev.error)};
    }
    if (client_gone()) {
      cancel_open();
      finish_log("abort");
      return std::nullopt;
    }
  }
}

void ResponseWriter::finish_log(const std::optional<std::string>& reason) {
  // One count per choice: a request of n choices is n sequences to the engine.
  for (int c = 0; c < response_.choices(); ++c)
    metrics_.count_finished(reason.value_or(response_.finish_reason(c)));
  const std::string finish_reason = reason.value_or(response_.finish_reason());
  metrics_.add_tokens(response_.prompt_tokens(), tokens_);
  const Clock::time_point end = tokens_ > 0 ? last_ : Clock::now();
  metrics_.observe_e2e(seconds(end - arrival_));
  const double ttft_ms = tokens_ > 0 ? 1e3 * seconds(first_ - arrival_) : 0.0;
  const double decode_s = seconds(last_ - first_);
  const double tps = tokens_ > 1 && decode_s > 0 ? static_cast<double>(tokens_ - 1) / decode_s : 0.0;
  const std::string choices =
      response_.choices() > 1 ? fmt::format(" in {} choices", response_.choices()) : std::string();
  spdlog::info("request {}: {} prompt + {} generated tokens{}, TTFT {:.1f} ms, {:.1f} tokens/s, finish {}",
               response_.id(), response_.prompt_tokens(), tokens_, choices, ttft_ms, tps, finish_reason);
}

}  // namespace hlm
