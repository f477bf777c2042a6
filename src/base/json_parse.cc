#include "base/json_parse.h"

#include <set>
#include <vector>

#include "base/error.h"

namespace hlm {

namespace {

// nlohmann's messages start with "[json.exception.<kind>.<id>] ": the id means nothing to a user.
std::string_view without_id(std::string_view what) {
  if (size_t id_end = what.find("] "); id_end != std::string_view::npos) what.remove_prefix(id_end + 2);
  return what;
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  using nlohmann::json;
  // The keys seen so far in each open object, innermost last.
  std::vector<std::set<std::string>> open_objects;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // Refused before the level's node is built, so the cost of a hostile document stays bounded.
        HLM_CHECK(depth < kMaxJsonDepth, "{}: JSON nested more than {} levels deep", source, kMaxJsonDepth);
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        HLM_CHECK(open_objects.back().insert(parsed.get<std::string>()).second,
                  "{}: key \"{}\" appears twice in one JSON object", source, parsed.get<std::string>());
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::parse_error& e) {
    // what() reads "[json.exception.parse_error.101] parse error at line 3, column 5: ..."; keep the part
    // after the exception id, which carries the position.
    HLM_FAIL("{}: invalid JSON (byte {}): {}", source, e.byte, without_id(e.what()));
  } catch (const json::exception& e) {
    // Not a syntax error but still bad input, e.g. a number beyond double's range (out_of_range.406).
    HLM_FAIL("{}: invalid JSON: {}", source, without_id(e.what()));
  }
}

}  // namespace hlm
