// ToolCallPrefix against Kimi tool-call sections: the markers in their order, the call id spelled from the
// declared tools' names, the arguments following each tool's parameters schema, one call for a named
// tool_choice and one or more for "required". And ConstrainedOutput's mask over a vocabulary in which the
// markers are added tokens, not text.
#include "runtime/tool_call_prefix.h"

#include <gtest/gtest.h>

#include "allowed_ids.h"
#include "base/error.h"
#include "runtime/output_constraint.h"

namespace hlm {
namespace {

// Marker ids as a test vocabulary numbers them.
constexpr int32_t kSectionBegin = 100, kCallBegin = 101, kArgumentBegin = 102, kCallEnd = 103,
                  kSectionEnd = 104;
const ToolCallGrammar::Markers kMarkers = {kSectionBegin, kCallBegin, kArgumentBegin, kCallEnd, kSectionEnd};

std::shared_ptr<const JsonSchema> schema(const std::string& text) {
  return JsonSchema::compile(nlohmann::ordered_json::parse(text), "parameters");
}

ToolCallGrammar weather_and_time(bool one_call) {
  std::vector<ToolCallGrammar::Tool> tools = {
      {"get_weather", schema(R"({"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"], "additionalProperties": false})")},
      {"get_time", schema(R"({"type": "object", "additionalProperties": false})")},
  };
  if (one_call) tools.resize(1);
  return ToolCallGrammar(kMarkers, std::move(tools), one_call);
}

TEST(ToolCallPrefix, WalksASectionOfCallsToDeclaredTools) {
  const ToolCallGrammar g = weather_and_time(/*one_call=*/false);
  ToolCallPrefix p(g);
  EXPECT_FALSE(p.marker_allowed(kCallBegin));
  EXPECT_FALSE(p.feed('f'));
  ASSERT_TRUE(p.marker(kSectionBegin));
  ASSERT_TRUE(p.marker(kCallBegin));
  EXPECT_FALSE(p.marker_allowed(kArgumentBegin));  // no id yet
  ASSERT_TRUE(p.feed("functions.get_weather:"));
  EXPECT_FALSE(p.marker_allowed(kArgumentBegin));  // no index yet
  ASSERT_TRUE(p.feed("12"));
  ASSERT_TRUE(p.marker(kArgumentBegin));
  EXPECT_FALSE(p.marker_allowed(kCallEnd));
  ASSERT_TRUE(p.feed(R"({"city": "Oslo"})"));
  EXPECT_FALSE(ToolCallPrefix(p).feed(','));
  ASSERT_TRUE(p.marker(kCallEnd));
  EXPECT_TRUE(p.marker_allowed(kSectionEnd));
  ASSERT_TRUE(p.marker(kCallBegin));  // "required" allows another call
  ASSERT_TRUE(p.feed("functions.get_time:0"));
  ASSERT_TRUE(p.marker(kArgumentBegin));
  ToolCallPrefix q = p;
  EXPECT_FALSE(q.feed(R"({")"));  // get_time takes no properties
  ASSERT_TRUE(p.feed("{}"));
  ASSERT_TRUE(p.marker(kCallEnd));
  EXPECT_FALSE(p.complete());
  ASSERT_TRUE(p.marker(kSectionEnd));
  EXPECT_TRUE(p.complete());
  EXPECT_FALSE(p.feed(' '));
}

TEST(ToolCallPrefix, RefusesUndeclaredNamesLongIndicesAndBadArguments) {
  const ToolCallGrammar g = weather_and_time(/*one_call=*/false);
  ToolCallPrefix p(g);
  ASSERT_TRUE(p.marker(kSectionBegin) && p.marker(kCallBegin));
  ToolCallPrefix q = p;
  EXPECT_TRUE(q.feed("functions.get_"));
  EXPECT_FALSE(q.feed('x'));
  q = p;
  EXPECT_FALSE(q.feed("get_weather:0"));  // the "functions." prefix is part of the id
  q = p;
  EXPECT_TRUE(q.feed("functions.get_time:123456"));
  EXPECT_FALSE(q.feed('7'));
  q = p;
  ASSERT_TRUE(q.feed("functions.get_weather:0") && q.marker(kArgumentBegin));
  EXPECT_FALSE(q.feed(R"({"town")"));
}

TEST(ToolCallPrefix, ANamedToolChoiceIsExactlyOneCall) {
  const ToolCallGrammar g = weather_and_time(/*one_call=*/true);
  ToolCallPrefix p(g);
  ASSERT_TRUE(p.marker(kSectionBegin) && p.marker(kCallBegin));
  ToolCallPrefix q = p;
  EXPECT_FALSE(q.feed("functions.get_t"));
  ASSERT_TRUE(p.feed("functions.get_weather:0") && p.marker(kArgumentBegin) && p.feed(R"({"city":""})") &&
              p.marker(kCallEnd));
  EXPECT_FALSE(p.marker_allowed(kCallBegin));
  EXPECT_TRUE(p.marker(kSectionEnd));
}

TEST(ToolCallPrefix, OneCallToAnyOfSeveralToolsWhenParallelCallsAreOff) {
  std::vector<ToolCallGrammar::Tool> tools = {{"a", JsonSchema::any_object()},
                                              {"b", JsonSchema::any_object()}};
  const ToolCallGrammar g(kMarkers, std::move(tools), /*one_call=*/true);
  ToolCallPrefix p(g);
  ASSERT_TRUE(p.marker(kSectionBegin) && p.marker(kCallBegin) && p.feed("functions.b:0") &&
              p.marker(kArgumentBegin) && p.feed("{}") && p.marker(kCallEnd));
  EXPECT_FALSE(p.marker_allowed(kCallBegin));
  EXPECT_TRUE(p.marker_allowed(kSectionEnd));
}

TEST(ToolCallGrammar, RefusesNamesTheParserCannotReadBack) {
  auto make = [](std::vector<std::string> names) {
    std::vector<ToolCallGrammar::Tool> tools;
    for (const std::string& n : names) tools.push_back({n, JsonSchema::any_object()});
    return ToolCallGrammar(kMarkers, std::move(tools), false);
  };
  EXPECT_NO_THROW(make({"a.b_c9", "\xe5\xa4\xa9"}));
  EXPECT_THROW(make({"get-weather"}), Error);
  EXPECT_THROW(make({"a b"}), Error);
  EXPECT_THROW(make({"x", "x"}), Error);
  EXPECT_THROW(make({}), Error);
  EXPECT_THROW(ToolCallGrammar({-1, 1, 2, 3, 4}, {{"f", JsonSchema::any_object()}}, false), Error);
}

TEST(ConstrainedOutput, MasksMarkersByTheSectionsGrammarAndEndsOnlyWhenItCloses) {
  // Ids 0..99 text, 100..104 the markers, 105 the end of the turn.
  std::vector<std::string> bytes = {"functions.",  "get_weather", ":", "0",
                                    "{\"city\": ", "\"Oslo\"",    "}", " "};
  bytes.resize(100, "zz");
  std::vector<uint8_t> text(100, 1);
  for (const char* m : {"<s>", "<c>", "<a>", "</c>", "</s>", "<end>"}) {
    bytes.push_back(m);
    text.push_back(0);
  }
  OutputConstraint c;
  c.vocab = std::make_shared<ConstraintVocab>(bytes, text);
  c.tool_calls = std::make_shared<ToolCallGrammar>(weather_and_time(/*one_call=*/true));
  ConstrainedOutput out(c, /*end_ids=*/{105});
  auto allowed = [&out] { return allowed_ids(out, 106); };
  const std::vector<std::pair<int32_t, std::vector<int32_t>>> walk = {
      {kSectionBegin, {kSectionBegin}},
      {kCallBegin, {kCallBegin}},
      {0, {0}},
      {1, {1}},
      {2, {2}},
      {3, {3}},
      {kArgumentBegin, {3, kArgumentBegin}},
      {4, {4, 7}},
      {5, {5}},
      {6, {6, 7}},
      {kCallEnd, {7, kCallEnd}},
      {kSectionEnd, {kSectionEnd}},
  };
  for (const auto& [id, expected] : walk) {
    EXPECT_EQ(allowed(), expected) << "before id " << id;
    out.observe(id);
  }
  EXPECT_EQ(allowed(), (std::vector<int32_t>{105}));
}

}  // namespace
}  // namespace hlm
