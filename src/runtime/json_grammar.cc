#include "runtime/json_grammar.h"

namespace hlm {

namespace {

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

bool JsonPrefix::open(bool object) {
  if (depth_ >= kMaxDepth) return false;
  if (object) {
    objects_ |= uint64_t{1} << depth_;
  } else {
    objects_ &= ~(uint64_t{1} << depth_);
  }
  ++depth_;
  state_ = object ? State::kKeyOrEnd : State::kArrayStart;
  return true;
}

bool JsonPrefix::close(bool object) {
  if (depth_ == 0 || (((objects_ >> (depth_ - 1)) & 1) != 0) != object) return false;
  --depth_;
  value_done();
  return true;
}

void JsonPrefix::value_done() { state_ = depth_ == 0 ? State::kDone : State::kCommaOrEnd; }

bool JsonPrefix::start_value(unsigned char c) {
  switch (c) {
    case '{':
      return open(true);
    case '[':
      return open(false);
    case '"':
      string_is_key_ = false;
      state_ = State::kString;
      return true;
    case '-':
      state_ = State::kNumSign;
      return true;
    case '0':
      state_ = State::kNumZero;
      return true;
    case 't':
      literal_ = "rue";
      break;
    case 'f':
      literal_ = "alse";
      break;
    case 'n':
      literal_ = "ull";
      break;
    default:
      if (c >= '1' && c <= '9') {
        state_ = State::kNumInt;
        return true;
      }
      return false;
  }
  state_ = State::kLiteral;
  return true;
}

bool JsonPrefix::after_value(unsigned char c) {
  value_done();
  return feed(c);
}

bool JsonPrefix::feed(unsigned char c) {
  switch (state_) {
    case State::kStart:
      if (is_space(c)) return true;
      return c == '{' && open(true);
    case State::kArrayStart:
      if (is_space(c)) return true;
      if (c == ']') return close(false);
      return start_value(c);
    case State::kValue:
      if (is_space(c)) return true;
      return start_value(c);
    case State::kKeyOrEnd:
      if (is_space(c)) return true;
      if (c == '}') return close(true);
      [[fallthrough]];
    case State::kKey:
      if (is_space(c)) return true;
      if (c != '"') return false;
      string_is_key_ = true;
      state_ = State::kString;
      return true;
    case State::kColon:
      if (is_space(c)) return true;
      if (c != ':') return false;
      state_ = State::kValue;
      return true;
    case State::kCommaOrEnd: {
      if (is_space(c)) return true;
      const bool in_object = ((objects_ >> (depth_ - 1)) & 1) != 0;
      if (c == ',') {
        state_ = in_object ? State::kKey : State::kValue;
        return true;
      }
      if ((c == '}' && in_object) || (c == ']' && !in_object)) return close(in_object);
      return false;
    }
    case State::kString:
      if (c == '"') {
        if (string_is_key_) {
          state_ = State::kColon;
        } else {
          value_done();
        }
        return true;
      }
      if (c == '\\') {
        state_ = State::kEscape;
        return true;
      }
      return c >= 0x20;
    case State::kEscape:
      if (c == 'u') {
        pending_ = 4;
        state_ = State::kUnicode;
        return true;
      }
      state_ = State::kString;
      return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't';
    case State::kUnicode:
      if (!is_hex(c)) return false;
      if (--pending_ == 0) state_ = State::kString;
      return true;
    case State::kLiteral:
      if (c != static_cast<unsigned char>(*literal_)) return false;
      if (*++literal_ == '\0') value_done();
      return true;
    case State::kNumSign:
      if (c == '0') {
        state_ = State::kNumZero;
        return true;
      }
      if (c >= '1' && c <= '9') {
        state_ = State::kNumInt;
        return true;
      }
      return false;
    case State::kNumZero:
    case State::kNumInt:
      if (is_digit(c) && state_ == State::kNumInt) return true;
      if (c == '.') {
        state_ = State::kNumDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        state_ = State::kNumExp;
        return true;
      }
      return after_value(c);
    case State::kNumDot:
      if (!is_digit(c)) return false;
      state_ = State::kNumFrac;
      return true;
    case State::kNumFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        state_ = State::kNumExp;
        return true;
      }
      return after_value(c);
    case State::kNumExp:
      if (c == '+' || c == '-') {
        state_ = State::kNumExpSign;
        return true;
      }
      [[fallthrough]];
    case State::kNumExpSign:
      if (!is_digit(c)) return false;
      state_ = State::kNumExpDigits;
      return true;
    case State::kNumExpDigits:
      if (is_digit(c)) return true;
      return after_value(c);
    case State::kDone:
      return is_space(c);
  }
  return false;
}

}  // namespace hlm
