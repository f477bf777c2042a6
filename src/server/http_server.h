// HttpServer: the HTTP side of `helixlm serve` (cpp-httplib). It binds and answers before the model is
// loaded (GET /health says 503 "Loading model" until then, as llama-server does), checks the API key,
// caps the body size (413), turns every refusal into the OpenAI error object, counts responses by status
// for /metrics, and hands the model endpoints to the OpenAiService once attached.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "server/metrics.h"
#include "server/openai_service.h"

namespace hlm {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;                // empty: no authentication
  size_t max_body_bytes = 32u << 20;  // larger bodies get 413
  int threads = 64;                   // concurrent connections served
};

class HttpServer {
 public:
  HttpServer(const HttpOptions& options, Metrics& metrics);
  ~HttpServer();

  // Binds the port (an error names host and port) and starts serving on a thread of its own.
  void start();
  // From now on the model endpoints answer; `service` must outlive stop().
  void attach(OpenAiService* service);
  void stop();

 private:
  void routes();
  bool authorized(const httplib::Request& req) const;

  HttpOptions options_;
  Metrics& metrics_;
  httplib::Server server_;
  std::thread thread_;
  std::atomic<OpenAiService*> service_{nullptr};
  std::atomic<bool> listen_returned_{false};
};

}  // namespace hlm
