#include "server/http_server.h"

#include "base/error.h"
#include "base/log.h"
#include "server/api_error.h"
#include "server/openai_response.h"

namespace hlm {

namespace {

using Handled = httplib::Server::HandlerResponse;

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = "") {
  res.status = status;
  res.set_content(dump_json(error_body(status, message, param)), "application/json");
}

// Paths anyone may read: load balancers and scrapers do not carry the API key.
bool is_public(const std::string& path) { return path == "/health" || path == "/metrics"; }

// Compares without an early exit, so response timing does not reveal how much of a key was right.
bool same_secret(const std::string& given, const std::string& key) {
  if (given.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ key[i]);
  return diff == 0;
}

}  // namespace

HttpServer::HttpServer(const HttpOptions& options, Metrics& metrics) : options_(options), metrics_(metrics) {
  HLM_CHECK(options.threads > 0, "the HTTP thread count must be positive (got {})", options.threads);
  // One thread per open connection: a streaming response holds its thread for its whole length.
  server_.new_task_queue = [n = options_.threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  server_.set_payload_max_length(options_.max_body_bytes);
  // Streamed tokens are small writes; Nagle's algorithm would hold each until the previous is acked.
  server_.set_tcp_nodelay(true);
  server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (is_public(req.path) || authorized(req)) return Handled::Unhandled;
    send_error(res, 401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'");
    return Handled::Handled;
  });
  // Refusals made by httplib itself (unknown path 404, body too large 413, unreadable request 400) get
  // the OpenAI error object too; our own errors already carry one.
  server_.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return Handled::Unhandled;
        std::string message = fmt::format("the request failed with HTTP status {}", res.status);
        if (res.status == 404) message = fmt::format("no route for {} {}", req.method, req.path);
        if (res.status == 413)
          message = fmt::format("the request body exceeds {} bytes", options_.max_body_bytes);
        send_error(res, res.status, message);
        return Handled::Handled;
      }));
  server_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (!is_public(req.path)) metrics_.count_response(res.status);
  });
  routes();
}

HttpServer::~HttpServer() { stop(); }

bool HttpServer::authorized(const httplib::Request& req) const {
  if (options_.api_key.empty()) return true;
  const std::string header = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (header.compare(0, prefix.size(), prefix) != 0) return false;
  return same_secret(header.substr(prefix.size()), options_.api_key);
}

void HttpServer::routes() {
  using Method = void (OpenAiService::*)(const httplib::Request&, httplib::Response&);
  auto model_route = [this](Method method) {
    return [this, method](const httplib::Request& req, httplib::Response& res) {
      try {
        OpenAiService* service = service_.load();
        if (!service) throw ApiError(503, "Loading model");
        (service->*method)(req, res);
      } catch (const ApiError& e) {
        send_error(res, e.status(), e.what(), e.param());
      } catch (const Error& e) {
        // Raised by the tokenizer or the chat template on what the request gave them.
        send_error(res, 400, e.what());
      } catch (const std::exception& e) {
        spdlog::error("{} {}: {}", req.method, req.path, e.what());
        send_error(res, 500, fmt::format("internal error: {}", e.what()));
      }
    };
  };
  server_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!service_.load()) return send_error(res, 503, "Loading model");
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  server_.Get("/v1/models", model_route(&OpenAiService::models));
  server_.Post("/v1/completions", model_route(&OpenAiService::completions));
  server_.Post("/v1/chat/completions", model_route(&OpenAiService::chat_completions));
  server_.Post("/tokenize", model_route(&OpenAiService::tokenize));
  server_.Post("/detokenize", model_route(&OpenAiService::detokenize));
}

void HttpServer::start() {
  HLM_CHECK(
      server_.bind_to_port(options_.host, options_.port),
      "cannot listen on {}:{} (address in use, or not an address of this machine); pick another --port or "
      "--host",
      options_.host, options_.port);
  thread_ = std::thread([this] {
    server_.listen_after_bind();
    listen_returned_.store(true);
  });
  // stop() only reaches a server that is already in its accept loop; wait for it, so an error right
  // after start-up (a model that fails to load) still shuts the thread down.
  while (!server_.is_running() && !listen_returned_.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void HttpServer::attach(OpenAiService* service) { service_.store(service); }

void HttpServer::stop() {
  if (!thread_.joinable()) return;
  server_.stop();
  thread_.join();
}

}  // namespace hlm
