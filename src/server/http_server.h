// HttpServer: the HTTP side of `helixlm serve` (cpp-httplib). It binds and answers before the model is
// loaded (GET /health says 503 "Loading model" until then, as llama-server does), checks the API key,
// reads request bodies itself (JSON whatever the Content-Type says, capped by --max-request-bytes: 413),
// answers a known path asked with another method 405 with an Allow header, turns every refusal into the
// OpenAI error object, counts responses by status for /metrics, and hands the model endpoints to the
// OpenAiService once attached.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

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

// The token of an `Authorization: Bearer <token>` header value, or nullopt for another scheme or none.
// The scheme name is case-insensitive (RFC 7235, section 2.1).
std::optional<std::string> bearer_token(std::string_view header);

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
  // A route's handler, given the body as read by read_body ("" for GET).
  using Handler = std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;

  void routes();
  // Registers `handler` for `method` ("GET" or "POST") on `path`.
  void route(const std::string& method, const std::string& path, Handler handler);
  // The other methods on every routed path: 405.
  void refuse_other_methods();
  bool authorized(const httplib::Request& req) const;
  // The request body, read in full; nullopt (and `res` holds the refusal) when the request lacks the API
  // key, or its body is too large or cannot be read.
  std::optional<std::string> read_body(const httplib::Request& req, httplib::Response& res,
                                       const httplib::ContentReader& reader) const;

  HttpOptions options_;
  Metrics& metrics_;
  httplib::Server server_;
  std::thread thread_;
  std::atomic<OpenAiService*> service_{nullptr};
  std::atomic<bool> listen_returned_{false};
  std::map<std::string, std::vector<std::string>> methods_;  // path -> the methods routed on it
};

}  // namespace hlm
