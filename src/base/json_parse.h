// Parsing of outside JSON (safetensors headers, model.safetensors.index.json, config.json) with two
// bounds nlohmann's parser does not impose: nesting depth, because each level costs a heap node before
// the document is complete (a 98 MB header of 49M nested brackets took 3.6 GB to refuse), and duplicate
// keys, because the parser silently keeps the last one and a header or config that says two things about
// one name is ambiguous, not well-formed.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hlm {

// Real headers and configs nest 3 to 6 levels deep.
constexpr int kMaxJsonDepth = 64;

// Parses `text`; syntax errors, nesting deeper than kMaxJsonDepth and duplicate keys in one object are
// hlm::Errors whose message starts with `source` and says where.
nlohmann::json parse_json(std::string_view text, const std::string& source);

}  // namespace hlm
