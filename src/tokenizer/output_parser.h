// Incremental split of generated text into content, reasoning and tool calls, for the OpenAI
// `content` / `reasoning_content` / `tool_calls` fields. It works on the text the server decodes step by
// step (markers decoded to their strings, e.g. "<|tool_call_begin|>"), and holds back any tail that could
// be the start of a marker, so a marker split across two decode steps never leaks into `content`.
//
// kKimiLinear (vLLM/SGLang's `kimi_k2` parsers): `<think>…</think>` is reasoning; a tool-call section is
//   <|tool_calls_section_begin|>(<|tool_call_begin|>{id}<|tool_call_argument_begin|>{json}
//   <|tool_call_end|>)*<|tool_calls_section_end|>, id `functions.{name}:{index}`.
// kK3: text is routed by channel (<|open|>think / response / tools<|sep|> … <|close|>…<|sep|>); calls are
//   <|open|>call tool="f" index="1"<|sep|>(<|open|>argument key="k" type="t"<|sep|>v<|close|>argument
//   <|sep|>)*<|close|>call<|sep|>, and become JSON arguments (strings raw, other types parsed).
//
// Tool calls are reported once complete (the whole call in one delta), with ids `functions.{name}:{n}`
// (Kimi Linear: the id the model wrote). A complete but malformed call (Kimi Linear: an id other than
// `[functions.]{name}:{index}`, or no argument marker; K3: no tool name, or an argument without a key)
// is no tool call, and its text is dropped with the rest of the tool-call section. Push text without the stop
// token (<|im_end|> / <|end_of_msg|>); K3's structural markers after the response (<|close|>message<|sep|>,
// <|end_of_msg|>) are dropped.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_template.h"

namespace hlm {

struct ParsedDelta {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;  // complete calls
};

class OutputParser {
 public:
  // parse_tools: recognize tool calls (otherwise their text is content). parse_reasoning: split
  // reasoning from content; without it Kimi Linear's <think>...</think> stays in content as generated and
  // K3's think channel text goes to content (its markers removed). For K3 it also says that the
  // generation prompt opened the think channel (ChatTemplate::generation_starts_in_reasoning()).
  // A call cut short by the end of generation is returned as content text by finish().
  OutputParser(ChatFormat format, bool parse_tools, bool parse_reasoning);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  ParsedDelta push(std::string_view text);  // text newly decoded from the model
  ParsedDelta finish();                     // end of generation: flush held-back text

  // Complete tool calls reported so far (finish_reason "tool_calls" when > 0).
  int tool_call_count() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hlm
