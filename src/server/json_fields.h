// Typed reads of request fields. Every read checks the JSON type and range and, when wrong, throws an
// ApiError 400 naming the field by its path ("messages[2].content"), which is what a client needs to fix
// the request. A field that is absent or null reads as unset, as the OpenAI API treats it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace hlm {

// The body as a JSON object; 400 when it is not JSON or not an object.
nlohmann::json parse_json_object(const std::string& body);

class JsonFields {
 public:
  // `object` must outlive this; `path` names it in errors ("" for the body itself).
  JsonFields(const nlohmann::json& object, std::string path);

  // The value, or nullptr when absent or null.
  const nlohmann::json* find(const std::string& key) const;
  std::string path(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& expectation) const;

  std::optional<std::string> string(const std::string& key) const;
  std::optional<bool> boolean(const std::string& key) const;
  std::optional<int64_t> integer(const std::string& key, int64_t min, int64_t max) const;
  std::optional<double> number(const std::string& key, double min, double max) const;

 private:
  const nlohmann::json& object_;
  std::string path_;
};

}  // namespace hlm
