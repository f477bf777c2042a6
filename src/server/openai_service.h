// OpenAiService: the model-facing endpoints once the model is loaded: /v1/models, /v1/completions,
// /v1/chat/completions (JSON or SSE), /tokenize, /detokenize, /tokenizer_info, /apply-template. Validation
// happens on the calling HTTP thread (a bad request is answered there and never reaches the engine);
// generation goes through the EngineLoop, and a ResponseWriter waits on the request's channel (a stream from
// httplib's content provider, a whole answer on the handler's thread), so a client that goes away is noticed
// within one poll and its sequence is cancelled. At shutdown, wait_responses_written() tells when the last
// answer has gone out.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_request.h"

namespace hlm {

class OpenAiService {
 public:
  OpenAiService(const ServingContext& ctx, EngineLoop& loop, Metrics& metrics);

  // `body`: the request body, read by the HTTP layer.
  void models(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void completions(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void chat_completions(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void tokenize(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void detokenize(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // vLLM's GET /tokenizer_info: the special tokens and the chat template, for clients that tokenize
  // through the server (lm-eval's tokenizer_backend=remote).
  void tokenizer_info(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // llama-server's POST /apply-template: {messages} -> {prompt}, the text a chat request would run on.
  void apply_template(const httplib::Request& req, const std::string& body, httplib::Response& res);

  // The engine loop has begun to shut down: generation requests get 503.
  bool shutting_down() const { return loop_.shutting_down(); }
  // Waits until every generation response has been handed to its connection whole (at most `timeout`);
  // false on timeout. Stopping the HTTP server before that would cut streams short.
  bool wait_responses_written(std::chrono::milliseconds timeout) const;

 private:
  void generate(const httplib::Request& req, const GenerationRequest& request, httplib::Response& res);

  ServingContext ctx_;
  EngineLoop& loop_;
  Metrics& metrics_;
  int64_t created_;
  std::atomic<int64_t> next_response_{0};
  std::atomic<int64_t> open_responses_{0};
};

}  // namespace hlm
