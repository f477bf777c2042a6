// Output parsers on streams: the same model output pushed whole, split at every byte, one byte at a
// time, and token by token through the StreamDecoder (the server's path) gives the same content,
// reasoning and tool calls, and no marker text ever reaches content.
#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/output_parser.h"

namespace hlm {
namespace {

const std::string kFixtures = std::string(HLM_FIXTURES_DIR) + "/tokenizer";

struct Parsed {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
};

void add(Parsed& p, const ParsedDelta& d) {
  p.content += d.content;
  p.reasoning += d.reasoning_content;
  p.calls.insert(p.calls.end(), d.tool_calls.begin(), d.tool_calls.end());
}

Parsed parse_chunks(ChatFormat f, bool tools, bool reasoning, const std::vector<std::string>& chunks) {
  OutputParser parser(f, tools, reasoning);
  Parsed p;
  for (const std::string& c : chunks) add(p, parser.push(c));
  add(p, parser.finish());
  return p;
}

void expect_call(const ToolCall& call, const std::string& id, const std::string& name,
                 const std::string& args) {
  EXPECT_EQ(call.id, id);
  EXPECT_EQ(call.name, name);
  EXPECT_EQ(call.arguments, args);
}

void expect_same(const Parsed& a, const Parsed& b, const std::string& how) {
  EXPECT_EQ(a.content, b.content) << how;
  EXPECT_EQ(a.reasoning, b.reasoning) << how;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << how;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    SCOPED_TRACE(how);
    expect_call(a.calls[i], b.calls[i].id, b.calls[i].name, b.calls[i].arguments);
  }
}

// Parses `out` whole, then split in two at every position, then byte by byte; all must agree, and no
// content delta of the byte-by-byte run may be the start of a marker in `forbidden` (a leak that a
// later delta would have to take back).
Parsed parse_every_split(ChatFormat f, bool tools, bool reasoning, const std::string& out,
                         const std::vector<std::string>& forbidden) {
  const Parsed whole = parse_chunks(f, tools, reasoning, {out});
  for (size_t cut = 0; cut <= out.size(); ++cut) {
    expect_same(whole, parse_chunks(f, tools, reasoning, {out.substr(0, cut), out.substr(cut)}),
                "split at " + std::to_string(cut));
  }
  OutputParser parser(f, tools, reasoning);
  Parsed bytes;
  for (char c : out) {
    const ParsedDelta d = parser.push(std::string(1, c));
    for (const std::string& m : forbidden) {
      EXPECT_FALSE(!d.content.empty() && m.rfind(d.content, 0) == 0)
          << "start of " << m << " leaked: " << d.content;
    }
    add(bytes, d);
  }
  add(bytes, parser.finish());
  expect_same(whole, bytes, "byte by byte");
  return whole;
}

const std::vector<std::string> kKimiMarkers = {"<|tool_calls_section_begin|>", "<|tool_call_begin|>",
                                               "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                                               "<|tool_calls_section_end|>"};

TEST(KimiOutputParser, ToolCallsAndContent) {
  const std::string out =
      "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>{\"city\": \"Beijing\"}<|tool_call_end|><|tool_call_begin|> "
      "functions.get_time:1 "
      "<|tool_call_argument_begin|> {} <|tool_call_end|><|tool_calls_section_end|>";
  const Parsed p = parse_every_split(ChatFormat::kKimiLinear, true, true, out, kKimiMarkers);
  EXPECT_EQ(p.content, "Let me check.");
  EXPECT_EQ(p.reasoning, "");
  ASSERT_EQ(p.calls.size(), 2u);
  expect_call(p.calls[0], "functions.get_weather:0", "get_weather", "{\"city\": \"Beijing\"}");
  expect_call(p.calls[1], "functions.get_time:1", "get_time", "{}");
}

TEST(KimiOutputParser, NamesFromIds) {
  // Names as ^(?:functions\.)?([\w.]+):(\d+)$ captures them (\w with Unicode letters, as in Python).
  const std::vector<std::pair<std::string, std::string>> cases = {{"functions.get_weather:0", "get_weather"},
                                                                  {"get_weather:3", "get_weather"},
                                                                  {"functions.a.b:12", "a.b"},
                                                                  {"functions.你好_1:0", "你好_1"},
                                                                  {"functions:2", "functions"}};
  for (const auto& [id, name] : cases) {
    const Parsed p =
        parse_chunks(ChatFormat::kKimiLinear, true, false,
                     {"<|tool_calls_section_begin|><|tool_call_begin|>" + id +
                      "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"});
    ASSERT_EQ(p.calls.size(), 1u) << id;
    expect_call(p.calls[0], id, name, "{}");
  }
}

TEST(KimiOutputParser, MalformedCallsAreDropped) {
  // Ids of another shape (these used to become calls named "plain", "f:x", "f"), a call without its
  // argument marker, and calls cut off by the next call or by the section's end: no tool call, and
  // their text does not reach content, like the rest of the section (vLLM's and SGLang's kimi_k2).
  const std::string good =
      "<|tool_call_begin|>functions.ok:1<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|>";
  const std::vector<std::string> malformed = {
      "<|tool_call_begin|>plain<|tool_call_argument_begin|>{}<|tool_call_end|>",
      "<|tool_call_begin|>f:x<|tool_call_argument_begin|>{}<|tool_call_end|>",
      "<|tool_call_begin|>functions.f<|tool_call_argument_begin|>{}<|tool_call_end|>",
      "<|tool_call_begin|>functions.a b:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
      "<|tool_call_begin|>functions.f:0 {\"a\": 1}<|tool_call_end|>",
      "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": ",
  };
  for (const std::string& bad : malformed) {
    for (const std::string& section : {bad + good, good + bad}) {
      const Parsed p = parse_every_split(
          ChatFormat::kKimiLinear, true, true,
          "Checking.<|tool_calls_section_begin|>" + section + "<|tool_calls_section_end|>Done.",
          kKimiMarkers);
      EXPECT_EQ(p.content, "Checking.Done.") << section;
      ASSERT_EQ(p.calls.size(), 1u) << section;
      expect_call(p.calls[0], "functions.ok:1", "ok", "{\"a\": 1}");
    }
  }
  OutputParser counter(ChatFormat::kKimiLinear, true, false);
  counter.push("<|tool_calls_section_begin|>" + malformed[0] + "<|tool_calls_section_end|>");
  counter.finish();
  EXPECT_EQ(counter.tool_call_count(), 0);
}

TEST(KimiOutputParser, ReasoningSplit) {
  const Parsed p =
      parse_every_split(ChatFormat::kKimiLinear, true, true,
                        "<think>The user greets.</think>Hello! <think> is text here.", {"</think>"});
  EXPECT_EQ(p.reasoning, "The user greets.");
  EXPECT_EQ(p.content, "Hello! <think> is text here.");
  // Reasoning ends where a tool-call section starts.
  const Parsed q =
      parse_chunks(ChatFormat::kKimiLinear, true, true,
                   {"<think>need a tool<|tool_calls_section_begin|><|tool_call_begin|>f:0"
                    "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"});
  EXPECT_EQ(q.reasoning, "need a tool");
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.calls[0].name, "f");
  // Without reasoning parsing the think block is content as generated.
  EXPECT_EQ(parse_chunks(ChatFormat::kKimiLinear, true, false, {"<think>x</think>y"}).content,
            "<think>x</think>y");
}

TEST(KimiOutputParser, DisabledToolsAndCutShortCalls) {
  const std::string call =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
      "{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>";
  const Parsed off = parse_chunks(ChatFormat::kKimiLinear, false, false, {"a", call});
  EXPECT_EQ(off.content, "a" + call);
  EXPECT_TRUE(off.calls.empty());
  // A partial marker at the very end is text.
  EXPECT_EQ(parse_chunks(ChatFormat::kKimiLinear, true, true, {"x<|tool_calls_sec"}).content,
            "x<|tool_calls_sec");
  // A call cut short by the end of generation comes back as text, not as a call.
  const Parsed cut = parse_chunks(ChatFormat::kKimiLinear, true, true,
                                  {"<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                                   "<|tool_call_argument_begin|>{\"a\""});
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\"");
  OutputParser counter(ChatFormat::kKimiLinear, true, false);
  counter.push(call);
  counter.finish();
  EXPECT_EQ(counter.tool_call_count(), 1);
}

TEST(KimiOutputParser, TokenByTokenThroughTheStreamDecoder) {
  // The server's path: generated ids decoded one at a time (markers decode to their text).
  const Tokenizer tok = Tokenizer::load(kFixtures + "/kimi_sparse");
  const std::string out =
      "Hello world<|tool_calls_section_begin|><|tool_call_begin|>functions.你好:0"
      "<|tool_call_argument_begin|>{\"世界\": \"Hello\"}<|tool_call_end|><|tool_calls_section_end|>";
  const std::vector<int32_t> ids = tok.encode(out, /*allow_special=*/true);
  StreamDecoder dec(tok);
  OutputParser parser(ChatFormat::kKimiLinear, true, true);
  Parsed p;
  for (int32_t id : ids) add(p, parser.push(dec.push(id)));
  add(p, parser.push(dec.flush()));
  add(p, parser.finish());
  EXPECT_EQ(p.content, "Hello world");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "你好");
  EXPECT_EQ(p.calls[0].arguments, "{\"世界\": \"Hello\"}");
}

TEST(KimiOutputParser, ParsesWhatTheTemplateRenders) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/kimi_sparse");
  const ChatTemplate tmpl(tok, ChatFormat::kKimiLinear);
  ChatMessage a;
  a.role = "assistant";
  a.content = "Sure.";
  a.tool_calls = {{"functions.search:0", "search", R"({"q": "kimi"})"}, {"functions.open:1", "open", "{}"}};
  const std::string prompt = tmpl.render_text({}, nullptr, true);
  std::string turn = tmpl.render_text({a}, nullptr, false);
  turn = turn.substr(prompt.size(), turn.size() - prompt.size() - std::string("<|im_end|>").size());
  const Parsed p = parse_chunks(ChatFormat::kKimiLinear, true, true, {turn});
  EXPECT_EQ(p.content, "Sure.");
  ASSERT_EQ(p.calls.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    expect_call(p.calls[i], a.tool_calls[i].id, a.tool_calls[i].name, a.tool_calls[i].arguments);
}

const std::vector<std::string> kK3Markers = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};

TEST(K3OutputParser, ChannelsAndToolCalls) {
  const std::string out =
      "The user wants weather.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Bei \"jing\"<|close|>argument<|sep|>"
      "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
      "<|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"a\":[1,2]}<|close|>argument<|sep|>"
      "<|close|>call<|sep|><|open|>call index=\"2\" tool=\"a=b&amp;c\"<|sep|><|open|>json "
      "type=\"object\"<|sep|>"
      "{\"x\": 1}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>";
  const Parsed p = parse_every_split(ChatFormat::kK3, true, true, out, kK3Markers);
  EXPECT_EQ(p.reasoning, "The user wants weather.");
  EXPECT_EQ(p.content, "Checking.");
  ASSERT_EQ(p.calls.size(), 2u);
  expect_call(p.calls[0], "functions.get_weather:0", "get_weather",
              "{\"city\": \"Bei \\\"jing\\\"\", \"days\": 3, \"opts\": {\"a\": [1, 2]}}");
  expect_call(p.calls[1], "functions.a=b&c:1", "a=b&c", "{\"x\": 1}");
}

TEST(K3OutputParser, ResponseOnlyAndWithoutReasoning) {
  // Generation prompt opened the response channel (thinking off).
  const Parsed p = parse_every_split(ChatFormat::kK3, true, false,
                                     "Hi there.<|close|>response<|sep|><|close|>message"
                                     "<|sep|>",
                                     kK3Markers);
  EXPECT_EQ(p.content, "Hi there.");
  EXPECT_EQ(p.reasoning, "");
  // Reasoning not requested: the think channel's text is content, without its markers.
  EXPECT_EQ(parse_chunks(ChatFormat::kK3, true, false,
                         {"<|open|>think<|sep|>hmm<|close|>think<|sep|><|open|>response<|sep|>ok"})
                .content,
            "hmmok");
  // A call cut short comes back as text.
  const Parsed cut = parse_chunks(ChatFormat::kK3, true, true,
                                  {"r<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\""});
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "<|open|>call tool=\"f\"");
}

TEST(K3OutputParser, MalformedCallsAreDropped) {
  // A call without a tool name, and one with an argument that has no key: no tool call.
  const std::string good =
      "<|open|>call tool=\"ok\" index=\"1\"<|sep|><|open|>argument key=\"a\" type=\"number\"<|sep|>1"
      "<|close|>argument<|sep|><|close|>call<|sep|>";
  for (const std::string& bad :
       {std::string("<|open|>call index=\"1\"<|sep|><|close|>call<|sep|>"),
        std::string("<|open|>call tool=\"f\"<|sep|><|open|>argument type=\"string\"<|sep|>v<|close|>argument"
                    "<|sep|><|close|>call<|sep|>")}) {
    const Parsed p = parse_every_split(
        ChatFormat::kK3, true, false,
        "Checking.<|close|>response<|sep|><|open|>tools<|sep|>" + bad + good + "<|close|>tools<|sep|>",
        kK3Markers);
    EXPECT_EQ(p.content, "Checking.") << bad;
    ASSERT_EQ(p.calls.size(), 1u) << bad;
    expect_call(p.calls[0], "functions.ok:0", "ok", "{\"a\": 1}");
  }
}

TEST(K3OutputParser, ParsesWhatTheTemplateRenders) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/k3_sparse");
  const ChatTemplate tmpl(tok, ChatFormat::kK3);
  ChatMessage a;
  a.role = "assistant";
  a.reasoning_content = "plan";
  a.content = "Sure.";
  a.tool_calls = {{"x", "search", R"({"q": "kimi", "n": 2, "exact": false})"}};
  const std::string prompt = tmpl.render_text({}, nullptr, true);
  std::string turn = tmpl.render_text({a}, nullptr, false);
  turn = turn.substr(prompt.size());  // the prompt ends with the think channel open, as generation starts
  const Parsed p = parse_chunks(ChatFormat::kK3, true, tmpl.generation_starts_in_reasoning(), {turn});
  EXPECT_EQ(p.reasoning, "plan");
  EXPECT_EQ(p.content, "Sure.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "search");
  EXPECT_EQ(p.calls[0].arguments, "{\"q\": \"kimi\", \"n\": 2, \"exact\": false}");
}

}  // namespace
}  // namespace hlm
