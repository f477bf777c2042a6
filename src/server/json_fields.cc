#include "server/json_fields.h"

#include <fmt/format.h>

#include "server/api_error.h"

namespace hlm {

nlohmann::json parse_json_object(const std::string& body) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

JsonFields::JsonFields(const nlohmann::json& object, std::string path)
    : object_(object), path_(std::move(path)) {
  if (!object_.is_object()) throw ApiError(400, fmt::format("'{}' must be an object", path_), path_);
}

const nlohmann::json* JsonFields::find(const std::string& key) const {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string JsonFields::path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

void JsonFields::fail(const std::string& key, const std::string& expectation) const {
  throw ApiError(400, fmt::format("'{}' must be {}", path(key), expectation), path(key));
}

std::optional<std::string> JsonFields::string(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) fail(key, "a string");
  return v->get<std::string>();
}

std::optional<bool> JsonFields::boolean(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) fail(key, "a boolean");
  return v->get<bool>();
}

std::optional<int64_t> JsonFields::integer(const std::string& key, int64_t min, int64_t max) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  // JSON numbers that hold integers only (5, not 5.5 or true); unsigned values past int64 are out of range.
  if (!v->is_number_integer()) fail(key, fmt::format("an integer in [{}, {}]", min, max));
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(max)) {
    fail(key, fmt::format("an integer in [{}, {}]", min, max));
  }
  const int64_t x = v->get<int64_t>();
  if (x < min || x > max) fail(key, fmt::format("an integer in [{}, {}] (got {})", min, max, x));
  return x;
}

std::optional<double> JsonFields::number(const std::string& key, double min, double max) const {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) fail(key, fmt::format("a number in [{}, {}]", min, max));
  const double x = v->get<double>();
  if (!(x >= min && x <= max)) fail(key, fmt::format("a number in [{}, {}] (got {})", min, max, x));
  return x;
}

}  // namespace hlm
