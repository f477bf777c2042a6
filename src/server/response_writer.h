// ResponseWriter: drives one generation response on its HTTP thread. httplib calls pump() repeatedly
// from the response's content provider; each call waits briefly for the request's engine outputs,
// turns them into SSE chunks (stream) or keeps them for one JSON body (otherwise), and checks that the
// client is still there, so a disconnect cancels the sequence within one poll. It also times the
// request (TTFT, inter-token latency) for the metrics and writes the request's log line at the end.
#pragma once

#include <httplib.h>

#include <memory>

#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_response.h"

namespace hlm {

class ResponseWriter {
 public:
  ResponseWriter(std::shared_ptr<RequestChannel> channel, GenerationResponse response, bool stream,
                 Clock::time_point arrival, EngineLoop& loop, Metrics& metrics);

  // One turn of the content provider; false ends the response (client gone).
  bool pump(httplib::DataSink& sink);
  // httplib's resource releaser: success is false when the connection failed before the end.
  void close(bool success);

 private:
  void observe(const TimedOutput& t);
  bool write(httplib::DataSink& sink, const std::string& data);
  void finish_log(const char* finish_reason);

  std::shared_ptr<RequestChannel> channel_;
  GenerationResponse response_;
  bool stream_;
  Clock::time_point arrival_;
  EngineLoop& loop_;
  Metrics& metrics_;
  Clock::time_point first_{};
  Clock::time_point last_{};
  int64_t tokens_ = 0;
  bool ended_ = false;  // the response was written completely
};

}  // namespace hlm
