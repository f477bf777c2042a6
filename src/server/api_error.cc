#include "server/api_error.h"

namespace hlm {

namespace {

const char* error_type(int status) {
  switch (status) {
    case 400:
    case 413:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

}  // namespace

ApiError::ApiError(int status, const std::string& message, std::string param)
    : std::runtime_error(message), status_(status), param_(std::move(param)) {}

nlohmann::json ApiError::body() const { return error_body(status_, what(), param_); }

nlohmann::json error_body(int status, const std::string& message, const std::string& param) {
  nlohmann::json e = {{"message", message}, {"type", error_type(status)}, {"code", status}};
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  return {{"error", e}};
}

}  // namespace hlm
