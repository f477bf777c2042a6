// ResponseWriter: drives one generation response on its HTTP thread. A stream is written by httplib's
// content provider, which calls pump() repeatedly: each call waits briefly for the request's engine
// outputs, turns them into SSE chunks and checks that the client is still there, so a disconnect cancels
// the sequence within one poll. A non-streaming answer is built by complete(), which waits on the
// handler's thread until the response is whole, so it goes out with its true status and a
// Content-Length, and polls the client's connection meanwhile. A request of several choices (n > 1, a
// batch of prompts) is one response whose chunks carry each choice's index; a choice's stop string cancels
// only its sequence, a departed client or a failure all of them. The writer also times the request (TTFT,
// inter-token latency within each choice) for the metrics and writes the request's log line at the end.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_response.h"

namespace hlm {

// A non-streaming answer: HTTP status and JSON body.
struct CompleteResponse {
  int status = 200;
  std::string body;
};

class ResponseWriter {
 public:
  // cancel: ends one of the request's sequences (an id of the channel's) in the engine: the client left,
  // or a stop string matched.
  ResponseWriter(std::shared_ptr<RequestChannel> channel, GenerationResponse response,
                 Clock::time_point arrival, std::function<void(int64_t)> cancel, Metrics& metrics);

  // Streaming: one turn of the content provider; false ends the response (client gone).
  bool pump(httplib::DataSink& sink);
  // Streaming: httplib's resource releaser; success is false when the connection failed before the end.
  void close(bool success);

  // Non-streaming: the whole answer once the request ends (200, or the failure's status), or nullopt
  // when `client_gone` said so first (the sequence is then cancelled).
  std::optional<CompleteResponse> complete(const std::function<bool()>& client_gone);

 private:
  // Feeds the engine outputs to the response; returns the SSE chunks they make (none when not streaming).
  std::string take(const std::vector<TimedOutput>& outputs);
  void observe(const TimedOutput& t);
  // Cancels the sequences of every choice not yet done.
  void cancel_open();
  // The request's metrics and log line; `reason` overrides the choices' own finish reasons ("error",
  // "abort").
  void finish_log(const std::optional<std::string>& reason);

  std::shared_ptr<RequestChannel> channel_;
  GenerationResponse response_;
  Clock::time_point arrival_;
  std::function<void(int64_t)> cancel_;
  Metrics& metrics_;
  Clock::time_point first_{};
  Clock::time_point last_{};
  std::vector<std::optional<Clock::time_point>> last_of_;  // each choice's last token
  int64_t tokens_ = 0;
  bool ended_ = false;  // the response was written completely
};

}  // namespace hlm
