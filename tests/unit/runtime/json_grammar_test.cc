// JsonPrefix against JSON documents: every prefix of a valid object is accepted and only the whole is
// complete; invalid input is refused at the first byte that cannot continue an object.
#include "runtime/json_grammar.h"

#include <gtest/gtest.h>

#include <string>

namespace hlm {
namespace {

// The length of the longest accepted prefix of `text` (text.size() when all of it is), and completeness.
std::pair<size_t, bool> run(const std::string& text) {
  JsonPrefix p;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!p.feed(static_cast<unsigned char>(text[i]))) return {i, false};
  }
  return {text.size(), p.complete()};
}

TEST(JsonPrefix, ValidObjectsAreCompleteAndEveryPrefixIsAccepted) {
  const std::vector<std::string> valid = {
      "{}",
      " { } ",
      R"({"a": 1})",
      R"({"a": -0.5e+10, "b": [true, false, null], "c": {"d": "x\"y\\u00e9\n"}})",
      R"({"empty": [], "nested": [[], [{}], {"k": []}]})",
      "{\"utf8\": \"\xc3\xa9\xe4\xb8\xad\", \"n\": 0, \"m\": 12.25E-3}",
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

TEST(JsonPrefix, InvalidInputStopsAtItsFirstBadByte) {
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

TEST(JsonPrefix, NestingDeeperThanTheLimitIsRefused) {
  std::string deep = "{\"a\": ";
  for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(run(deep).first, deep.size());
  EXPECT_EQ(run(deep + "[").first, deep.size());
}

}  // namespace
}  // namespace hlm
