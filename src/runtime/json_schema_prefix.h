// JsonSchemaPrefix: a byte-at-a-time recognizer of the prefixes of a schema's instances (json_schema.h),
// for constrained decoding: feed() says whether the bytes so far can still become an instance, complete()
// whether they are one. It never lets through a prefix that cannot be completed: a property is offered
// only if the required ones after it can still follow, and a container only if its required contents fit
// under JsonSchema::kMaxDepth.
//
// The state is a stack of small frames (one per open container, plus the key, string, number or literal
// being written), fixed in size and copied only as deep as it is used, because the logits processor
// tries every token of the vocabulary on a copy. JSON text as RFC 8259 has it, with whitespace narrowed to
// what compact or indented JSON writes: between tokens one space, or a newline and up to 4 columns of
// indentation a level (a model that favours whitespace would otherwise pad without end); the standard
// escapes, and strings of well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates), their lengths counted in characters. A \u escape is taken as the grammar has it (a lone
// surrogate escape passes).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/json_schema.h"

namespace hlm {

class JsonSchemaPrefix {
 public:
  // `schema` must outlive the recognizer and its copies.
  explicit JsonSchemaPrefix(const JsonSchema& schema) : schema_(&schema) {}
  JsonSchemaPrefix(const JsonSchemaPrefix& other) { *this = other; }
  JsonSchemaPrefix& operator=(const JsonSchemaPrefix& other);

  // False when `c` cannot continue an instance; the state is then unspecified.
  bool feed(unsigned char c);
  bool feed(std::string_view bytes) {
    for (char c : bytes) {
      if (!feed(static_cast<unsigned char>(c))) return false;
    }
    return true;
  }
  // The bytes fed form one complete instance.
  bool complete() const;
  // Once complete, the output ends there (what could follow is whitespace, or a top-level number's more
  // digits, which a constrained output does not take).
  bool extends() const { return false; }
  // Appends the state as bytes, with what cannot change the accepted bytes left out (a count that only
  // its bound reads, once past the other bound): equal keys accept the same bytes from here on, so a
  // mask computed for one serves the other.
  void append_key(std::string& key) const;
  // Inside an open string, between characters: how many characters of plain string content (whole UTF-8
  // characters, none of them '"', '\\' or a control character) may come next, so that a run of plain
  // content is accepted exactly when it is no longer; -1 elsewhere.
  int64_t string_room() const;

 private:
  enum class Kind : uint8_t { kObject, kArray, kKey, kString, kNumber, kLiteral };
  // Containers: kOpen after '{' or '[', then the JSON punctuation they wait for.
  enum Phase : uint8_t { kOpen, kKey, kColon, kValue, kCommaOrEnd };
  enum StringPhase : uint8_t { kChars, kEscape, kUnicode };
  enum NumberPhase : uint8_t { kNumStart, kSign, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

  // kObject: a = the first property index still allowed, b = the property whose value is being written.
  // kArray: a = items so far. kKey (a declared key) and kLiteral: [a, b) = the candidates still matching
  // (kKey: into the object's key_order; kLiteral: into its literals), c = bytes matched. kString: a =
  // characters so far, b = continuation bytes left of a UTF-8 character, c = the next one's range (or hex
  // digits left of \uXXXX), key = it is a free object's key (node: the object).
  struct Frame {
    Kind kind;
    uint8_t phase;
    bool key;
    int32_t node;
    uint32_t a;
    uint32_t b;
    uint32_t c;
  };

  const JsonSchema::Node& node(const Frame& f) const { return schema_->node(f.node); }
  Frame& top() { return frames_[depth_ - 1]; }
  void push(Frame f) { frames_[depth_++] = f; }
  // A value of `node` could start here and still close within the depth limit.
  bool fits(int32_t node) const { return containers_ + schema_->node(node).height <= JsonSchema::kMaxDepth; }

  // A whitespace byte between tokens, within the run's limits.
  bool whitespace(unsigned char c);
  bool start_value(int32_t node, unsigned char c);
  // The top frame's value is complete: pop it and advance its container.
  void value_done();
  void close_container();

  bool feed_object(Frame& f, unsigned char c);
  bool feed_array(Frame& f, unsigned char c);
  bool feed_key(Frame& f, unsigned char c);
  bool feed_string(Frame& f, unsigned char c);
  bool feed_number(Frame& f, unsigned char c);
  bool feed_literal(Frame& f, unsigned char c);

  bool key_allowed(const Frame& object, uint32_t property) const;
  bool some_key_allowed(const Frame& object) const;
  bool can_close(const Frame& object) const;

  const JsonSchema* schema_;
  int depth_ = 0;       // frames in use
  int containers_ = 0;  // object and array frames among them
  bool done_ = false;   // the top-level value is complete
  // The whitespace run so far: 0 none, 1 a space (nothing may follow), 2 + n a newline and n indentation.
  uint32_t ws_ = 0;
  // Containers, plus the scalar or key being written.
  std::array<Frame, JsonSchema::kMaxDepth + 1> frames_;
};

}  // namespace hlm
