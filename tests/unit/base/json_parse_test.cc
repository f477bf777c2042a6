// parse_json: the bounds on outside JSON. Regression (issue 12): a safetensors header nested 49M levels
// deep cost 3.6 GB before it was refused, and duplicate keys were silently resolved to the last one.
#include "base/json_parse.h"

#include <gtest/gtest.h>

#include <chrono>

#include "base/error.h"

namespace hlm {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_json(text, "x.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParseJson, ParsesOrdinaryDocuments) {
  const nlohmann::json j = parse_json(R"({"a": [1, {"b": null}], "c": {"a": 2}})", "x.json");
  EXPECT_EQ(j["c"]["a"], 2);  // the same key in two different objects is fine
}

TEST(ParseJson, RefusesDeepNestingBeforeBuildingIt) {
  std::string nested = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(parse_json(nested, "x.json"));
  nested = "[" + nested + "]";
  EXPECT_NE(error_of(nested).find("x.json: JSON nested more than 64 levels deep"), std::string::npos);
  // 50 MB of open brackets: refused at once, not after building 50M nodes.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(error_of(std::string(50'000'000, '[')).find("nested more than 64"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(error_of(R"({"a":)" + std::string(100, '[')).find("nested more than"), std::string::npos);
}

TEST(ParseJson, RefusesDuplicateKeys) {
  EXPECT_NE(error_of(R"({"w": 1, "w": 2})").find("x.json: key \"w\" appears twice in one JSON object"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"t": {"dtype": "F32", "dtype": "F16"}})").find("key \"dtype\" appears twice"),
            std::string::npos);
}

// Found by index_fuzz (input "[6e666663333"): a number beyond double's range is nlohmann's out_of_range, not
// a parse_error, and escaped the parser as an uncaught exception.
TEST(ParseJson, NumbersOutOfRangeAreErrors) {
  EXPECT_NE(error_of("[6e666663333").find("x.json: invalid JSON: number overflow parsing '6e666663333'"),
            std::string::npos)
      << error_of("[6e666663333");
  EXPECT_NE(error_of(R"({"vocab_size": 1e999})").find("x.json: invalid JSON: number overflow"),
            std::string::npos);
}

TEST(ParseJson, SyntaxErrorsNameTheSourceAndPosition) {
  const std::string e = error_of("{\n  \"a\": }");
  EXPECT_NE(e.find("x.json: invalid JSON (byte 10)"), std::string::npos) << e;
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
}

}  // namespace
}  // namespace hlm
