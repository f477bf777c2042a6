// ApiError: a request the server refuses, with the HTTP status and the OpenAI error object
// {"error": {"message", "type", "param", "code"}} that clients (the openai package, curl users) parse.
// Thrown by request validation on the HTTP threads and turned into a response by the HTTP layer, so a bad
// request never reaches the engine loop or disturbs other requests.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace hlm {

class ApiError : public std::runtime_error {
 public:
  // param: the request field at fault ("" when none).
  ApiError(int status, const std::string& message, std::string param = "");

  int status() const { return status_; }
  const std::string& param() const { return param_; }
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_;
};

// The error object for `status` (type chosen from the status as OpenAI does).
nlohmann::json error_body(int status, const std::string& message, const std::string& param = "");

}  // namespace hlm
