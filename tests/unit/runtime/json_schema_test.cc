// The recognizer under response_format "json_object" (JsonSchema::any_object) against JSON documents: every
// prefix of a valid object is accepted and only the whole is complete; invalid input is refused at the first
// byte that cannot continue an object; whitespace between tokens is narrowed to what compact or indented
// JSON writes. And the compiler's refusals, each naming its keyword and path.
#include "runtime/json_schema.h"

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "runtime/json_schema_prefix.h"

namespace hlm {
namespace {

// The length of the longest accepted prefix of `text` (text.size() when all of it is), and completeness.
std::pair<size_t, bool> run(const JsonSchema& schema, const std::string& text) {
  JsonSchemaPrefix p(schema);
  for (size_t i = 0; i < text.size(); ++i) {
    if (!p.feed(static_cast<unsigned char>(text[i]))) return {i, false};
  }
  return {text.size(), p.complete()};
}

std::pair<size_t, bool> run(const std::string& text) { return run(*JsonSchema::any_object(), text); }

TEST(JsonObject, ValidObjectsAreCompleteAndEveryPrefixIsAccepted) {
  const std::vector<std::string> valid = {
      "{}",
      " { } ",
      R"({"a": 1})",
      R"({"a": -0.5e+10, "b": [true, false, null], "c": {"d": "x\"y\\u00e9\n"}})",
      R"({"empty": [], "nested": [[], [{}], {"k": []}]})",
      "{\"utf8\": \"\xc3\xa9\xe4\xb8\xad\", \"n\": 0, \"m\": 12.25E-3}",
      R"({"a": 1, "a": 2})",  // RFC 8259 allows a repeated key
  };
  for (const std::string& v : valid) {
    EXPECT_EQ(run(v), std::make_pair(v.size(), true)) << v;
    for (size_t n = 0; n < v.size(); ++n) {
      const auto [len, complete] = run(v.substr(0, n));
      EXPECT_EQ(len, n) << v << " prefix " << n;
      if (v.substr(0, n).find('}') == std::string::npos) {
        EXPECT_FALSE(complete) << v << " prefix " << n;
      }
    }
  }
}

TEST(JsonObject, InvalidInputStopsAtItsFirstBadByte) {
  const std::vector<std::pair<std::string, size_t>> invalid = {
      {"[1]", 0},  // the top level is an object
      {"\"x\"", 0},
      {"{,}", 1},
      {R"({"a" 1})", 5},      // no colon
      {R"({"a": 01})", 7},    // a leading zero
      {R"({"a": [1,]})", 9},  // a trailing comma
      {R"({"a": 1,})", 8},
      {R"({"a": tru})", 9},
      {R"({"a": "\x"})", 8},  // an unknown escape
      {R"({"a": "\u12G4"})", 11},
      {"{\"a\": \"\x01\"}", 7},  // a control character in a string
      {R"({"a": 1.})", 8},
      {R"({"a": 1e})", 8},
      {R"({"a": -})", 7},
      {R"({"a": [}})", 7},  // mismatched close
      {R"({"a": 1}})", 8},  // nothing after the object
      {"{} {}", 3},
      {R"({'a': 1})", 1},
  };
  for (const auto& [text, at] : invalid) {
    EXPECT_EQ(run(text), std::make_pair(at, false)) << text;
  }
}

TEST(JsonObject, WhitespaceIsOneSpaceOrANewlineAndIndentation) {
  for (const std::string v : {"{\n  \"a\": [\n    1,\n    2\n  ]\n}", "{\n\t\"a\": 1}", " {}"}) {
    EXPECT_EQ(run(v), std::make_pair(v.size(), true)) << v;
  }
  EXPECT_EQ(run("{  }").first, size_t{2});
  EXPECT_EQ(run("{\n\n}").first, size_t{2});
  EXPECT_EQ(run("{\r\n}").first, size_t{1});
  EXPECT_EQ(run("{ \n}").first, size_t{2});
  EXPECT_EQ(run("{\"a\": 1  , \"b\": 2}").first, size_t{8});  // a space ends the number; a second is refused
  // 4 columns a level: 8 inside one object, 12 inside two.
  EXPECT_EQ(run("{\n" + std::string(9, ' ')).first, size_t{10});
  EXPECT_EQ(run("{\"a\": {\n" + std::string(12, ' ') + "}}"), std::make_pair(size_t{22}, true));
}

TEST(JsonObject, NestingDeeperThanTheLimitIsRefused) {
  std::string deep = "{\"a\": ";
  for (int i = 1; i < JsonSchema::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(run(deep).first, deep.size());
  EXPECT_EQ(run(deep + "[").first, deep.size());
  EXPECT_EQ(run(deep + "{").first, deep.size());
  EXPECT_EQ(run(deep + "1").first, deep.size() + 1);  // a scalar still fits
}

// The message of the Error compiling `schema` throws ("" when it compiles).
std::string refusal(const std::string& schema) {
  try {
    JsonSchema::compile(nlohmann::ordered_json::parse(schema), "schema");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchemaCompile, RefusesWhatItCannotFollowNamingTheKeywordAndPath) {
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"n": {"type": "integer"}}})"), "");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}})",
       "schema.properties.age: \"minimum\" is not supported"},
      {R"({"type": "string", "pattern": "^a"})", "schema: \"pattern\" is not supported"},
      {R"({"type": "string", "format": "date-time"})", "schema: \"format\" is not supported"},
      {R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})",
       "schema: branches 0 and 1 may both begin with '-'"},
      {R"({"anyOf": [{"type": "string"}, {"enum": ["a", "b"]}]})",
       "branches 0 and 1 may both begin with '\"'"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})",
       "schema: \"required\" names \"b\", which \"properties\" does not declare"},
      {R"({"type": "object", "properties": {"a": {}}, "additionalProperties": true})",
       "\"additionalProperties\" beside \"properties\" must be false or absent"},
      {R"({"$ref": "#/$defs/missing"})", "\"$ref\" \"#/$defs/missing\" points at nothing in the schema"},
      {R"({"$ref": "https://example.com/s.json"})", "only references into this schema"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "\"minItems\" 3 is above \"maxItems\" 2"},
      {R"({"type": "string", "maxLength": -1})", "\"maxLength\" must be an integer >= 0 (got -1)"},
      {R"({"type": "date"})", "\"type\" names object, array, string, number, integer, boolean or null"},
      {R"({"enum": []})", "\"enum\" must be a non-empty array"},
      {R"({"type": "string", "enum": [1, 2]})", "no value of \"enum\" is of the schema's \"type\""},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})",
       "\"allOf\" is supported with exactly one schema"},
      {R"({"$ref": "#/$defs/a", "type": "object", "$defs": {"a": {}}})",
       "\"type\" beside \"$ref\" is not supported"},
      {R"({"properties": {"a": {}}, "items": {}})", "keywords of several types without \"type\""},
      {R"({"type": "array", "items": [{"type": "string"}]})", "schema.items: a list of item schemas"},
      {R"(false)", "the schema has no finite instance"},
      // A node that requires itself has only infinite instances.
      {R"({"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]})",
       "the schema has no finite instance"},
      {R"(3)", "a schema is an object or a boolean"},
  };
  for (const auto& [schema, message] : refused) {
    EXPECT_NE(refusal(schema).find(message), std::string::npos) << schema << "\n  gave: " << refusal(schema);
  }
}

TEST(JsonSchemaCompile, BoundsTheSizeAndDepthOfWhatARequestMayAskFor) {
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 200; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_NE(refusal(deep).find("subschemas nest deeper than 128"), std::string::npos) << refusal(deep);
  nlohmann::ordered_json wide = {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}};
  for (int i = 0; i < 5000; ++i) wide["properties"][fmt::format("p{}", i)] = {{"type", "string"}};
  EXPECT_NE(refusal(wide.dump()).find("more than 4096 nodes"), std::string::npos);
  // Branches are checked against those before them in one pass, not pairwise.
  nlohmann::ordered_json many = {{"anyOf", nlohmann::ordered_json::array()}};
  for (int i = 0; i < 4000; ++i) many["anyOf"].push_back(false);
  many["anyOf"].push_back({{"type", "string"}});
  EXPECT_EQ(refusal(many.dump()), "");
}

TEST(JsonSchemaCompile, ReadsTypesFromKeywordsAndMergesIntegerIntoNumber) {
  const auto s =
      JsonSchema::compile(nlohmann::ordered_json::parse(R"({"type": ["integer", "number", "null"]})"), "s");
  EXPECT_EQ(run(*s, "1.5"), std::make_pair(size_t{3}, true));
  EXPECT_EQ(run(*s, "null"), std::make_pair(size_t{4}, true));
  const auto implied = JsonSchema::compile(nlohmann::ordered_json::parse(R"({"maxLength": 2})"), "s");
  EXPECT_EQ(run(*implied, R"("ab")"), std::make_pair(size_t{4}, true));
  EXPECT_EQ(run(*implied, R"("abc")").first, size_t{3});
}

}  // namespace
}  // namespace hlm
