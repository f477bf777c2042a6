// OpenAiService: the model-facing endpoints once the model is loaded: /v1/models, /v1/completions,
// /v1/chat/completions (JSON or SSE), /tokenize, /detokenize. Validation happens on the calling HTTP
// thread (a bad request is answered there and never reaches the engine); generation goes through the
// EngineLoop, and the response is written by a content provider that waits on the request's channel,
// so a client that goes away is noticed within one poll and its sequence is cancelled.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>

#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_request.h"

namespace hlm {

class OpenAiService {
 public:
  OpenAiService(const ServingContext& ctx, EngineLoop& loop, Metrics& metrics);

  void models(const httplib::Request& req, httplib::Response& res);
  void completions(const httplib::Request& req, httplib::Response& res);
  void chat_completions(const httplib::Request& req, httplib::Response& res);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);

 private:
  void generate(const GenerationRequest& request, httplib::Response& res);

  ServingContext ctx_;
  EngineLoop& loop_;
  Metrics& metrics_;
  int64_t created_;
  std::atomic<int64_t> next_response_{0};
};

}  // namespace hlm
