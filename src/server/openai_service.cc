#include "server/openai_service.h"

#include <chrono>
#include <climits>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/client_connection.h"
#include "server/json_fields.h"
#include "server/response_writer.h"

namespace hlm {

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void reply(httplib::Response& res, const nlohmann::json& body) {
  res.status = 200;
  res.set_content(dump_json(body), "application/json");
}

const Tokenizer& need_tokenizer(const ServingContext& ctx) {
  if (!ctx.tokenizer) throw ApiError(400, "this model has no tokenizer (no tiktoken.model in its directory)");
  return *ctx.tokenizer;
}

// Counts a generation response as open while it lives.
class OpenResponse {
 public:
  explicit OpenResponse(std::atomic<int64_t>& count) : count_(count) { ++count_; }
  ~OpenResponse() { --count_; }
  OpenResponse(const OpenResponse&) = delete;
  OpenResponse& operator=(const OpenResponse&) = delete;

 private:
  std::atomic<int64_t>& count_;
};

}  // namespace

OpenAiService::OpenAiService(const ServingContext& ctx, EngineLoop& loop, Metrics& metrics)
    : ctx_(ctx), loop_(loop), metrics_(metrics), created_(unix_now()) {}

void OpenAiService::models(const httplib::Request&, const std::string&, httplib::Response& res) {
  nlohmann::json model = {{"id", ctx_.model_name},
                          {"object", "model"},
                          {"created", created_},
                          {"owned_by", "helixlm"},
                          {"max_model_len", ctx_.max_model_len}};
  reply(res, {{"object", "list"}, {"data", nlohmann::json::array({model})}});
}

void OpenAiService::completions(const httplib::Request& req, const std::string& body,
                                httplib::Response& res) {
  generate(req, parse_completion_request(body, ctx_), res);
}

void OpenAiService::chat_completions(const httplib::Request& req, const std::string& body,
                                     httplib::Response& res) {
  generate(req, parse_chat_request(body, ctx_), res);
}

bool OpenAiService::wait_responses_written(std::chrono::milliseconds timeout) const {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (open_responses_.load() > 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void OpenAiService::generate(const httplib::Request& req, const GenerationRequest& request,
                             httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  const char* prefix = request.endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl";
  // Everything that may fail comes before submit: once submitted, only the writer ends the request.
  GenerationResponse response(request, ctx_, fmt::format("{}-{}", prefix, next_response_++), unix_now());
  // A whole answer is waited for on this thread, watching the connection (a stream's provider has its own
  // check).
  std::optional<ClientConnection> client;
  if (!request.stream) client.emplace(req);
  std::shared_ptr<RequestChannel> channel = loop_.submit(request.choices);
  auto writer = std::make_shared<ResponseWriter>(
      channel, std::move(response), arrival, [this](int64_t id) { loop_.cancel(id); }, metrics_);
  if (!request.stream) {
    const OpenResponse open(open_responses_);
    const std::optional<CompleteResponse> whole = writer->complete([&client] { return client->closed(); });
    if (!whole) {
      // Nobody reads this; the status is what /metrics counts (nginx's "client closed request").
      res.status = 499;
      res.set_content(
          dump_json(error_body(499, "the client closed the connection before the answer was ready")),
          "application/json");
      return;
    }
    res.status = whole->status;
    res.set_content(whole->body, "application/json");
    return;
  }
  // The provider and releaser keep the writer, and the response counted as open, until httplib has
  // written the stream and destroys them.
  auto open = std::make_shared<OpenResponse>(open_responses_);
  auto provider = [writer](size_t, httplib::DataSink& sink) { return writer->pump(sink); };
  auto releaser = [writer, open](bool success) { writer->close(success); };
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  if (req.version == "HTTP/1.0") {
    // HTTP/1.0 has no chunked encoding: the stream ends where the server's sending does, which on a
    // connection the client asked to keep alive would be httplib's idle timeout, seconds later.
    auto connection = std::make_shared<ClientConnection>(req);
    res.set_header("Connection", "close");
    res.set_content_provider("text/event-stream", provider, [releaser, connection](bool success) {
      releaser(success);
      connection->shut_down_sending();
    });
  } else {
    res.set_chunked_content_provider("text/event-stream", provider, releaser);
  }
}

void OpenAiService::tokenize(const httplib::Request&, const std::string& raw, httplib::Response& res) {
  const nlohmann::json body = parse_json_object(raw);
  const JsonFields f(body, "");
  const Tokenizer& tok = need_tokenizer(ctx_);
  std::vector<int32_t> ids;
  if (const nlohmann::json* messages = f.find("messages")) {
    if (!ctx_.chat) throw ApiError(400, "this model has no chat template", "messages");
    const bool generation_prompt = f.boolean("add_generation_prompt").value_or(true);
    ids = ctx_.chat->render(parse_messages(*messages), nullptr, generation_prompt);
  } else {
    // llama-server names the text "content", vLLM "prompt"; both are accepted.
    std::optional<std::string> text = f.string("content");
    if (!text) text = f.string("prompt");
    if (!text) f.fail("content", "a string (the text to tokenize)");
    // As completion prompts are read (llama-server's default too): special-token strings are those tokens.
    ids = tok.encode(*text, f.boolean("parse_special").value_or(true));
  }
  nlohmann::json tokens = nlohmann::json::array();
  if (f.boolean("with_pieces").value_or(false)) {
    for (int32_t id : ids) tokens.push_back({{"id", id}, {"piece", std::string(tok.token_bytes(id))}});
  } else {
    tokens = ids;
  }
  reply(res, {{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", ctx_.max_model_len}});
}

void OpenAiService::detokenize(const httplib::Request&, const std::string& raw, httplib::Response& res) {
  const nlohmann::json body = parse_json_object(raw);
  const JsonFields f(body, "");
  const Tokenizer& tok = need_tokenizer(ctx_);
  const nlohmann::json* tokens = f.find("tokens");
  if (!tokens || !tokens->is_array()) f.fail("tokens", "an array of token ids");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const nlohmann::json& x = (*tokens)[i];
    const bool is_id = x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX;
    if (!is_id || !tok.contains(x.get<int32_t>())) {
      throw ApiError(400,
                     fmt::format("'tokens[{}]' is not a token id of this tokenizer (got {})", i, x.dump()),
                     "tokens");
    }
    ids.push_back(x.get<int32_t>());
  }
  const std::string text = tok.decode(ids);
  // llama-server answers "content", vLLM "prompt": the same text under both names.
  reply(res, {{"content", text}, {"prompt", text}});
}

void OpenAiService::apply_template(const httplib::Request&, const std::string& raw, httplib::Response& res) {
  const nlohmann::json body = parse_json_object(raw);
  const JsonFields f(body, "");
  const Tokenizer& tok = need_tokenizer(ctx_);
  if (!ctx_.chat) throw ApiError(400, "this model has no chat template", "messages");
  if (f.find("tools")) f.fail("tools", "absent (/v1/chat/completions renders a request's tools)");
  const nlohmann::json* messages = f.find("messages");
  if (!messages) f.fail("messages", "a non-empty array");
  const bool generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  const std::vector<int32_t> ids = ctx_.chat->render(parse_messages(*messages), nullptr, generation_prompt);
  // Special tokens as their text, so that the prompt read back as a completion prompt (special-token
  // strings parsed) gives these ids again.
  reply(res, {{"prompt", tok.decode(ids)}});
}

void OpenAiService::tokenizer_info(const httplib::Request&, const std::string&, httplib::Response& res) {
  const Tokenizer& tok = need_tokenizer(ctx_);
  auto text = [&tok](std::optional<int32_t> id) {
    return id ? nlohmann::json(tok.decode({*id})) : nlohmann::json(nullptr);
  };
  const nlohmann::json chat_template =
      ctx_.jinja_chat_template ? nlohmann::json(*ctx_.jinja_chat_template) : nlohmann::json(nullptr);
  reply(res, {{"tokenizer_class", "TikTokenTokenizer"},
              {"bos_token", text(tok.bos_id())},
              {"eos_token", text(tok.eos_id())},
              {"pad_token", nullptr},
              {"chat_template", chat_template},
              {"model_max_length", ctx_.max_model_len},
              {"vocab_size", tok.vocab_size()}});
}

}  // namespace hlm
