#include "server/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <cctype>

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

void refuse_unauthorized(httplib::Response& res) {
  send_error(res, 401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'");
}

// Whether httplib reads a body for this request before its handler or its 404 (the methods and rule of its
// expect_content).
bool carries_body(const httplib::Request& req) {
  return req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
         (req.method == "DELETE" && req.has_header("Content-Length"));
}

// Compares without an early exit, so response timing does not reveal how much of a key was right.
bool same_secret(const std::string& given, const std::string& key) {
  if (given.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ key[i]);
  return diff == 0;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace

std::optional<std::string> bearer_token(std::string_view header) {
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size() || header[kScheme.size()] != ' ') return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return std::nullopt;
  }
  const size_t token = header.find_first_not_of(' ', kScheme.size());
  if (token == std::string_view::npos) return std::nullopt;
  return std::string(header.substr(token));
}

HttpServer::HttpServer(const HttpOptions& options, Metrics& metrics) : options_(options), metrics_(metrics) {
  HLM_CHECK(options.threads > 0, "the HTTP thread count must be positive (got {})", options.threads);
  // One thread per open connection: a streaming response holds its thread for its whole length.
  server_.new_task_queue = [n = options_.threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  // httplib's default options add SO_REUSEPORT, which lets a second server bind the same port and take
  // half of its connections; SO_REUSEADDR alone still allows a restart while old connections linger.
  server_.set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // httplib refuses a longer Content-Length before reading the body; read_body applies the same cap to
  // chunked bodies.
  server_.set_payload_max_length(options_.max_body_bytes);
  // Streamed tokens are small writes; Nagle's algorithm would hold each until the previous is acked.
  server_.set_tcp_nodelay(true);
  // A request httplib reads a body for is refused only once that body is read (by read_body, or by httplib
  // itself for an unrouted path, refused in the error handler): refused before, its unread body would be
  // taken for the next request on a kept-alive connection.
  server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (is_public(req.path) || authorized(req) || carries_body(req)) return Handled::Unhandled;
    refuse_unauthorized(res);
    return Handled::Handled;
  });
  // Refusals made by httplib itself (unknown path 404, unreadable request 400, and the body limits of
  // paths we do not route) get the OpenAI error object too; our own errors already carry one.
  server_.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return Handled::Unhandled;
        if (!is_public(req.path) && !authorized(req)) {
          refuse_unauthorized(res);
          return Handled::Handled;
        }
        std::string message = fmt::format("the request failed with HTTP status {}", res.status);
        if (res.status == 404) message = fmt::format("no route for {} {}", req.method, req.path);
        if (res.status == 413) {
          // httplib keeps a body it read whole only when its own, lower cap on url-encoded forms refused it.
          message = req.body.empty()
                        ? fmt::format("the request body exceeds --max-request-bytes ({} bytes)",
                                      options_.max_body_bytes)
                        : fmt::format("an application/x-www-form-urlencoded body is limited to {} bytes",
                                      CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH);
        }
        send_error(res, res.status, message);
        return Handled::Handled;
      }));
  // httplib announces keep-alive on any connection it has not itself decided to close, also alongside a
  // handler's "Connection: close".
  server_.set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.get_header_value("Connection") == "close") res.headers.erase("Keep-Alive");
  });
  server_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (!is_public(req.path)) metrics_.count_response(res.status);
  });
  routes();
}

HttpServer::~HttpServer() { stop(); }

bool HttpServer::authorized(const httplib::Request& req) const {
  if (options_.api_key.empty()) return true;
  const std::optional<std::string> token = bearer_token(req.get_header_value("Authorization"));
  return token && same_secret(*token, options_.api_key);
}

std::optional<std::string> HttpServer::read_body(const httplib::Request& req, httplib::Response& res,
                                                 const httplib::ContentReader& reader) const {
  // An unauthorized request's body is read only to keep the connection in step, and not kept.
  const bool allowed = authorized(req);
  std::string body;
  bool too_large = false;
  auto receive = [&](const char* data, size_t n) {
    // Past the cap the rest is still read, and dropped, as httplib skips an over-long Content-Length: the
    // connection stays in step for the client's next request.
    too_large = too_large || body.size() + n > options_.max_body_bytes;
    if (!too_large && allowed) body.append(data, n);
    return true;
  };
  // A multipart body is read through the part callbacks (the plain reader would call a missing one),
  // only to keep the connection in step: the API takes JSON.
  const bool multipart = req.is_multipart_form_data();
  const bool ok =
      multipart ? reader([](const httplib::MultipartFormData&) { return true; }, receive) : reader(receive);
  if (!allowed) {
    refuse_unauthorized(res);
    return std::nullopt;
  }
  // httplib sets 413 itself when Content-Length is over the cap.
  if (too_large || res.status == 413) {
    send_error(
        res, 413,
        fmt::format("the request body exceeds --max-request-bytes ({} bytes)", options_.max_body_bytes));
    return std::nullopt;
  }
  if (!ok || multipart) {
    send_error(res, 400,
               multipart ? "the request body must be a JSON object, not multipart/form-data"
                         : "the request body could not be read (cut short, or a malformed chunked encoding)");
    return std::nullopt;
  }
  return body;
}

void HttpServer::route(const std::string& method, const std::string& path, Handler handler) {
  methods_[path].push_back(method);
  if (method == "GET") {
    server_.Get(path,
                [handler](const httplib::Request& req, httplib::Response& res) { handler(req, "", res); });
    return;
  }
  HLM_CHECK(method == "POST", "route: unexpected method {}", method);
  // The content-reader form: the body is ours to read, so httplib's form parsing (and its 8 KiB cap on
  // url-encoded bodies, the Content-Type curl -d sends) never applies; every body is taken as JSON.
  server_.Post(path, [this, handler](const httplib::Request& req, httplib::Response& res,
                                     const httplib::ContentReader& reader) {
    if (std::optional<std::string> body = read_body(req, res, reader)) handler(req, *body, res);
  });
}

void HttpServer::refuse_other_methods() {
  for (const auto& [path, methods] : methods_) {
    std::vector<std::string> allowed = methods;
    if (std::find(allowed.begin(), allowed.end(), "GET") != allowed.end()) allowed.push_back("HEAD");
    const std::string allow = join(allowed, ", ");
    auto refuse = [allow](const httplib::Request& req, httplib::Response& res) {
      send_error(res, 405, fmt::format("{} is not allowed on {}; use {}", req.method, req.path, allow));
      res.set_header("Allow", allow);
    };
    auto with_body = [this, refuse](const httplib::Request& req, httplib::Response& res,
                                    const httplib::ContentReader& reader) {
      // Read first, so the connection stays usable for the client's next request.
      if (read_body(req, res, reader)) refuse(req, res);
    };
    auto has = [&](const char* m) { return std::find(methods.begin(), methods.end(), m) != methods.end(); };
    if (!has("GET")) server_.Get(path, refuse);
    if (!has("POST")) server_.Post(path, with_body);
    server_.Put(path, with_body);
    server_.Patch(path, with_body);
    server_.Delete(path, with_body);
    server_.Options(path, refuse);
  }
}

void HttpServer::routes() {
  using Method = void (OpenAiService::*)(const httplib::Request&, const std::string&, httplib::Response&);
  auto model_route = [this](Method method) {
    return [this, method](const httplib::Request& req, const std::string& body, httplib::Response& res) {
      try {
        OpenAiService* service = service_.load();
        if (!service) throw ApiError(503, "Loading model");
        (service->*method)(req, body, res);
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
  route("GET", "/health", [this](const httplib::Request&, const std::string&, httplib::Response& res) {
    const OpenAiService* service = service_.load();
    if (!service) return send_error(res, 503, "Loading model");
    // Load balancers stop sending requests here while the running ones finish.
    if (service->shutting_down()) return send_error(res, 503, "the server is shutting down");
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  route("GET", "/metrics", [this](const httplib::Request&, const std::string&, httplib::Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  route("GET", "/v1/models", model_route(&OpenAiService::models));
  route("POST", "/v1/completions", model_route(&OpenAiService::completions));
  route("POST", "/v1/chat/completions", model_route(&OpenAiService::chat_completions));
  route("POST", "/tokenize", model_route(&OpenAiService::tokenize));
  route("GET", "/tokenizer_info", model_route(&OpenAiService::tokenizer_info));
  route("POST", "/detokenize", model_route(&OpenAiService::detokenize));
  route("POST", "/apply-template", model_route(&OpenAiService::apply_template));
  refuse_other_methods();
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
