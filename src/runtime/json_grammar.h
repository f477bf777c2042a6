// JsonPrefix: a byte-at-a-time recognizer of the prefixes of one JSON object (RFC 8259), for constrained
// decoding (the server's response_format "json_object"): feed() says whether the bytes so far can still
// become a complete object, complete() whether they are one. The state is a small trivially copyable value
// (nesting kept as a bit stack), so the logits processor can try every token of the vocabulary on a copy.
// Strings take any byte from 0x20 up (UTF-8 passes through unchecked) and the standard escapes; numbers
// follow the grammar exactly; whitespace is allowed wherever JSON allows it, and after the object nothing
// else.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hlm {

// What a constrained sequence may emit: the bytes of every id (by id), and whether the id may appear at
// all (special and other added tokens may not: they are not text).
struct ConstraintVocab {
  std::vector<std::string> bytes;
  std::vector<uint8_t> is_text;
};

class JsonPrefix {
 public:
  // Deeper nesting is refused (a model looping on '[' would otherwise never close).
  static constexpr int kMaxDepth = 64;

  // False when `c` cannot continue a JSON object; the state is then unspecified.
  bool feed(unsigned char c);
  bool feed(std::string_view bytes) {
    for (char c : bytes) {
      if (!feed(static_cast<unsigned char>(c))) return false;
    }
    return true;
  }
  // The bytes fed form one complete object.
  bool complete() const { return state_ == State::kDone; }

 private:
  enum class State : uint8_t {
    kStart,         // before the top-level '{'
    kArrayStart,    // after '[': a value or ']'
    kValue,         // a value is expected (after ':' or ',')
    kKeyOrEnd,      // after '{': a key or '}'
    kKey,           // after ',' in an object: a key
    kColon,         // after a key
    kCommaOrEnd,    // after a value inside a container
    kString,        // inside a string
    kEscape,        // after '\' in a string
    kUnicode,       // inside \uXXXX
    kLiteral,       // inside true / false / null
    kNumSign,       // after '-'
    kNumZero,       // a leading 0
    kNumInt,        // integer digits
    kNumDot,        // after '.'
    kNumFrac,       // fraction digits
    kNumExp,        // after 'e' / 'E'
    kNumExpSign,    // after the exponent's sign
    kNumExpDigits,  // exponent digits
    kDone,          // the top-level object closed
  };

  // The number ended at a byte that is not part of it: what follows a value.
  bool after_value(unsigned char c);
  bool start_value(unsigned char c);
  bool open(bool object);
  bool close(bool object);
  // A value ended: what the container expects next.
  void value_done();

  State state_ = State::kStart;
  bool string_is_key_ = false;
  uint8_t depth_ = 0;
  uint8_t pending_ = 0;            // hex digits left in \uXXXX, or letters left of a literal
  const char* literal_ = nullptr;  // the rest of true / false / null
  uint64_t objects_ = 0;           // bit d: the container at depth d+1 is an object
};

}  // namespace hlm
