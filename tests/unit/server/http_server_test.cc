// The HTTP layer on its own (no model attached, so the model endpoints answer 503 "Loading model"): the
// port is not shared with a second server, a known path asked with another method is 405 with Allow,
// bodies are JSON whatever their Content-Type up to --max-request-bytes, 413 names that limit, and the
// Authorization scheme is case-insensitive.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace hlm {
namespace {

// A port nothing listens on right now.
int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(s);
  return ntohs(a.sin_port);
}

class HttpServerTest : public ::testing::Test {
 protected:
  void start(const std::string& api_key = "", size_t max_body_bytes = 32u << 20) {
    HttpOptions o;
    o.port = free_port();
    o.api_key = api_key;
    o.max_body_bytes = max_body_bytes;
    o.threads = 4;
    server_ = std::make_unique<HttpServer>(o, metrics_);
    server_->start();
    port_ = o.port;
    client_ = std::make_unique<httplib::Client>("127.0.0.1", o.port);
    client_->set_keep_alive(true);
  }
  Metrics metrics_;
  int port_ = 0;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

// The error object's message, after checking the OpenAI shape.
std::string error_message(const httplib::Result& r, int status) {
  EXPECT_TRUE(r) << "no response";
  if (!r) return "";
  EXPECT_EQ(r->status, status) << r->body;
  const nlohmann::json body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["error"]["code"], status);
  EXPECT_TRUE(body["error"].contains("type") && body["error"].contains("param"));
  return body["error"]["message"];
}

TEST_F(HttpServerTest, ASecondServerCannotTakeThePort) {
  start();
  HttpOptions o;
  o.port = port_;
  o.threads = 1;
  HttpServer second(o, metrics_);
  try {
    second.start();
    FAIL() << "a second server listens on port " << o.port;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(o.port)),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(client_->Get("/health")->status, 503);  // the first one still answers
}

TEST_F(HttpServerTest, OtherMethodsOnKnownPathsAre405WithAllow) {
  start();
  auto expect_405 = [&](const httplib::Result& r, const std::string& allow) {
    const std::string message = error_message(r, 405);
    EXPECT_EQ(r->get_header_value("Allow"), allow);
    EXPECT_NE(message.find(allow), std::string::npos) << message;
  };
  expect_405(client_->Get("/v1/chat/completions"), "POST");
  expect_405(client_->Delete("/v1/models"), "GET, HEAD");
  expect_405(client_->Post("/v1/models", R"({"a": 1})", "application/json"), "GET, HEAD");
  expect_405(client_->Put("/v1/completions", "{}", "application/json"), "POST");
  expect_405(client_->Post("/health", "", "application/json"), "GET, HEAD");
  // The body of a refused request was read: the same connection serves the next one.
  EXPECT_EQ(client_->Get("/metrics")->status, 200);
  EXPECT_EQ(error_message(client_->Get("/v1/nothing"), 404), "no route for GET /v1/nothing");
}

TEST_F(HttpServerTest, FormEncodedBodiesAreReadLikeJsonUpToTheLimit) {
  start("", 64 << 10);
  // Past httplib's 8 KiB cap on url-encoded forms (curl -d's Content-Type), within ours: read, and
  // handed on (here refused only because no model is attached).
  const std::string body = R"({"prompt": ")" + std::string(20000, 'a') + R"("})";
  EXPECT_EQ(error_message(client_->Post("/v1/completions", body, "application/x-www-form-urlencoded"), 503),
            "Loading model");
  const std::string big(70 << 10, 'a');
  for (const char* type : {"application/x-www-form-urlencoded", "application/json"}) {
    EXPECT_EQ(error_message(client_->Post("/v1/completions", big, type), 413),
              "the request body exceeds --max-request-bytes (65536 bytes)")
        << type;
  }
  // A chunked body (no Content-Length) is held to the same limit.
  const httplib::Result chunked = client_->Post(
      "/v1/completions",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset < big.size())
          return sink.write(big.data() + offset, std::min<size_t>(4096, big.size() - offset));
        sink.done();
        return true;
      },
      "application/json");
  EXPECT_EQ(error_message(chunked, 413), "the request body exceeds --max-request-bytes (65536 bytes)");
  // A multipart form is no JSON: refused by name (httplib's own reading of it would throw).
  EXPECT_EQ(error_message(
                client_->Post("/v1/completions", httplib::MultipartFormDataItems{{"a", "{}", "", ""}}), 400),
            "the request body must be a JSON object, not multipart/form-data");
  EXPECT_EQ(client_->Get("/metrics")->status, 200);
}

TEST_F(HttpServerTest, TheBearerSchemeIsCaseInsensitive) {
  start("sekrit");
  for (const char* header : {"Bearer sekrit", "bearer sekrit", "BEARER sekrit", "bEaReR  sekrit"}) {
    EXPECT_EQ(error_message(client_->Get("/v1/models", {{"Authorization", header}}), 503), "Loading model")
        << header;
  }
  for (const char* header : {"Bearer wrong", "Basic sekrit", "sekrit", "Bearer", "Bearersekrit", ""}) {
    EXPECT_EQ(client_->Get("/v1/models", {{"Authorization", header}})->status, 401) << header;
  }
}

TEST(BearerToken, ParsesTheSchemeCaseInsensitively) {
  EXPECT_EQ(bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(bearer_token("bearer abc"), "abc");
  EXPECT_EQ(bearer_token("BEARER  abc"), "abc");
  EXPECT_EQ(bearer_token("Bearer"), std::nullopt);
  EXPECT_EQ(bearer_token("Bearer "), std::nullopt);
  EXPECT_EQ(bearer_token("Bearerabc"), std::nullopt);
  EXPECT_EQ(bearer_token("Basic abc"), std::nullopt);
  EXPECT_EQ(bearer_token(""), std::nullopt);
}

}  // namespace
}  // namespace hlm
