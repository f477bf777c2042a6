// JsonSchemaPrefix against schemas: instances in the forms it emits are accepted whole with every prefix;
// what breaks the schema (a missing required property, a wrong type, an out-of-enum value, a string too
// long) is refused at the first byte that shows it. And the property constrained decoding rests on: a
// random walk through accepted bytes never reaches a state with no way on, and whatever it completes
// parses as JSON and satisfies the schema.
#include "runtime/json_schema_prefix.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

namespace hlm {
namespace {

std::shared_ptr<const JsonSchema> compile(const std::string& schema) {
  return JsonSchema::compile(nlohmann::ordered_json::parse(schema), "schema");
}

// The length of the longest accepted prefix of `text` (text.size() when all of it is), and completeness.
std::pair<size_t, bool> run(const JsonSchema& schema, const std::string& text) {
  JsonSchemaPrefix p(schema);
  for (size_t i = 0; i < text.size(); ++i) {
    if (!p.feed(static_cast<unsigned char>(text[i]))) return {i, false};
  }
  return {text.size(), p.complete()};
}

void expect_instance(const JsonSchema& schema, const std::string& text) {
  EXPECT_EQ(run(schema, text), std::make_pair(text.size(), true)) << text;
  for (size_t n = 0; n < text.size(); ++n)
    EXPECT_EQ(run(schema, text.substr(0, n)).first, n) << text << " @" << n;
}

// A pydantic-style model: $defs and $ref, an optional field as anyOf [ref, null], enums, bounds.
constexpr const char* kPerson = R"({
  "$defs": {
    "Address": {"type": "object", "title": "Address",
                "properties": {"city": {"type": "string", "minLength": 1}, "zip": {"type": "string"}},
                "required": ["city"], "additionalProperties": false}
  },
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 4, "description": "a short name"},
    "age": {"type": "integer"},
    "role": {"enum": ["admin", "user", 7]},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    "address": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
    "score": {"type": ["number", "null"]}
  },
  "required": ["name", "tags"],
  "additionalProperties": false
})";

TEST(JsonSchemaPrefix, AcceptsInstancesInDeclaredOrderWithOptionalPropertiesLeftOut) {
  const auto s = compile(kPerson);
  expect_instance(*s, R"({"name": "Ann", "tags": ["a"]})");
  expect_instance(*s, R"({"name":"Bo","age":-3,"role":"user","tags":["x","y"],"address":{"city":"Oslo"},)"
                      R"("score":1.5e2})");
  expect_instance(*s,
                  "{\n  \"name\": \"\xc3\xa9\\u00e9\\n\",\n  \"role\": 7,\n  \"tags\": [\"\"],\n"
                  "  \"address\": null\n}");
  expect_instance(*s, R"({"name": "", "tags": ["a"], "address": {"city": "X", "zip": "0"}, "score": null})");
}

TEST(JsonSchemaPrefix, RefusesAtTheFirstByteThatBreaksTheSchema) {
  const auto s = compile(kPerson);
  const std::vector<std::pair<std::string, size_t>> invalid = {
      {R"({"tags": ["a"]})", 2},                          // "name" is required before "tags"
      {R"({"name": "A"})", 12},                           // ... and "tags" before the end
      {R"({"name": "A", "nick": 1})", 15},                // undeclared
      {R"({"name": "A", "tags": ["a"], "age": 1})", 31},  // out of the declared order ("a" may be "address")
      {R"({"name": "Alice"})", 14},                       // maxLength 4
      {R"({"name": 1})", 9},
      {R"({"name": "A", "age": 1.5})", 22},       // an integer has no fraction
      {R"({"name": "A", "role": "guest"})", 23},  // not in the enum
      {R"({"name": "A", "role": 70})", 23},
      {R"({"name": "A", "tags": []})", 23},                              // minItems 1
      {R"({"name": "A", "tags": ["a", "b", "c"]})", 31},                 // maxItems 2
      {R"({"name": "A", "tags": ["a"], "address": {"city": ""}})", 50},  // minLength 1
      {R"({"name": "A", "tags": ["a"], "address": {"zip": "1"}})", 42},  // city is required
      {R"({"name": "A", "tags": ["a"], "address": []})", 40},
      {R"({"name": "A", "tags": ["a"], "score": "1"})", 38},
  };
  for (const auto& [text, at] : invalid) {
    EXPECT_EQ(run(*s, text), std::make_pair(at, false)) << text << " refused at " << run(*s, text).first;
  }
}

TEST(JsonSchemaPrefix, ALiteralThatOthersExtendEndsAtTheFirstByteNoneContinues) {
  const auto s = compile(R"({"type": "array", "items": {"enum": [1, 12, 1.5, true]}})");
  expect_instance(*s, "[1, 12,1.5,true,1]");
  EXPECT_EQ(run(*s, "[13]").first, size_t{2});
  EXPECT_EQ(run(*s, "[1.2]").first, size_t{3});
  const auto top = compile(R"({"enum": [1, 12]})");
  EXPECT_EQ(run(*top, "1"), std::make_pair(size_t{1}, true));  // whole, though "12" could still follow
  EXPECT_EQ(run(*top, "12"), std::make_pair(size_t{2}, true));
  EXPECT_EQ(run(*top, "12 "), std::make_pair(size_t{3}, true));
  const auto number = compile(R"({"type": "integer"})");
  EXPECT_EQ(run(*number, "-"), std::make_pair(size_t{1}, false));
  EXPECT_EQ(run(*number, "-40"), std::make_pair(size_t{3}, true));
}

TEST(JsonSchemaPrefix, StringLengthsCountCharactersNotBytes) {
  const auto s = compile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  expect_instance(*s, "\"\xe4\xb8\xad\xc3\xa9\"");  // two characters, five bytes
  expect_instance(*s, R"("\u00e9\n\"")");           // three escapes
  EXPECT_EQ(run(*s, "\"a\"").first, size_t{2});
  EXPECT_EQ(run(*s, "\"abcd\"").first, size_t{4});
  EXPECT_EQ(run(*s, "\"ab\\n\\").first, size_t{5});
  // Well-formed UTF-8 only: no stray continuation byte, no overlong form, no surrogate, nothing cut short.
  EXPECT_EQ(run(*s, "\"\xa9").first, size_t{1});
  EXPECT_EQ(run(*s, "\"\xc0\x80").first, size_t{1});
  EXPECT_EQ(run(*s, "\"\xe0\x80").first, size_t{2});
  EXPECT_EQ(run(*s, "\"\xed\xa0\x80").first, size_t{2});
  EXPECT_EQ(run(*s, "\"\xf4\x90").first, size_t{2});
  EXPECT_EQ(run(*s,
                "\"\xc3"
                "a\"")
                .first,
            size_t{2});
  expect_instance(*s, "\"\xf0\x9f\x98\x80\xed\x9f\xbf\"");
}

TEST(JsonSchemaPrefix, RecursionStopsOfferingWhatCannotCloseWithinTheDepthLimit) {
  const auto s =
      compile(R"({"type": "object", "properties": {"c": {"$ref": "#"}, "n": {"type": "integer"}}})");
  std::string deep;
  for (int i = 1; i < JsonSchema::kMaxDepth; ++i) deep += R"({"c": )";
  deep += "{";
  EXPECT_EQ(run(*s, deep).first, deep.size());
  EXPECT_EQ(run(*s, deep + R"("c")").first, deep.size() + 1);  // "n" is still allowed, "c" is not
  expect_instance(*s, R"({"c": {"c": {}, "n": 2}})");
}

// One JSON value, checked against kPerson's rules by hand.
bool is_person(const nlohmann::ordered_json& v) {
  if (!v.is_object() || !v.contains("name") || !v.contains("tags")) return false;
  const std::vector<std::string> order = {"name", "age", "role", "tags", "address", "score"};
  size_t at = 0;
  for (const auto& [key, value] : v.items()) {
    while (at < order.size() && order[at] != key) ++at;
    if (at == order.size()) return false;
  }
  const auto& name = v["name"];
  if (!name.is_string() || name.get<std::string>().size() > 4 * 4) return false;
  // (An integer past 64 bits parses as a double.)
  if (v.contains("age") && !v["age"].is_number_integer() &&
      !(v["age"].is_number_float() && std::floor(v["age"].get<double>()) == v["age"].get<double>())) {
    return false;
  }
  if (v.contains("role") && v["role"] != "admin" && v["role"] != "user" && v["role"] != 7) return false;
  const auto& tags = v["tags"];
  if (!tags.is_array() || tags.empty() || tags.size() > 2) return false;
  for (const auto& t : tags) {
    if (!t.is_string()) return false;
  }
  if (v.contains("address") && !v["address"].is_null()) {
    const auto& a = v["address"];
    if (!a.is_object() || !a.contains("city") || a["city"].get<std::string>().empty()) return false;
  }
  return !v.contains("score") || v["score"].is_null() || v["score"].is_number();
}

TEST(JsonSchemaPrefix, RandomWalksNeverDeadEndAndWhatTheyCompleteIsAnInstance) {
  const auto s = compile(kPerson);
  // Bytes a model would write, weighted toward structure so that walks finish.
  // No 'd' or 'D': a \u escape stays off the surrogates, which strict JSON parsers refuse alone. No 'e' or
  // 'E': an exponent's digits would run on past what a double holds.
  const std::string alphabet = R"({}[]",:  -01234567.+nultrfasmiy\/)"
                               "\n\x01\xc3\xa9";
  std::mt19937 rng(7);
  int completed = 0;
  for (int walk = 0; walk < 400; ++walk) {
    JsonSchemaPrefix p(*s);
    std::string text;
    for (int step = 0; step < 400 && !p.complete(); ++step) {
      std::vector<unsigned char> ok;
      for (int c = 0; c < 256; ++c) {
        JsonSchemaPrefix next = p;
        if (next.feed(static_cast<unsigned char>(c))) ok.push_back(static_cast<unsigned char>(c));
      }
      ASSERT_FALSE(ok.empty()) << "no byte continues " << text;
      std::vector<unsigned char> preferred;
      for (unsigned char c : ok) {
        if (alphabet.find(static_cast<char>(c)) != std::string::npos) preferred.push_back(c);
      }
      const std::vector<unsigned char>& from = preferred.empty() ? ok : preferred;
      const unsigned char c = from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
      ASSERT_TRUE(p.feed(c));
      text += static_cast<char>(c);
    }
    if (!p.complete()) continue;
    ++completed;
    nlohmann::ordered_json v;
    try {
      v = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      FAIL() << e.what() << "\n" << text;
    }
    EXPECT_TRUE(is_person(v)) << text;
  }
  EXPECT_GT(completed, 20);
}

}  // namespace
}  // namespace hlm
