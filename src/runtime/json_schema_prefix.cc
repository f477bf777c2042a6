#include "runtime/json_schema_prefix.h"

#include <algorithm>
#include <string>

#include "runtime/sorted_narrow.h"

namespace hlm {

namespace {

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// The range of a UTF-8 continuation byte, as utf8_lead() packs it.
constexpr uint32_t kContinuation = 0x80 | 0xBF << 8;

// A UTF-8 lead byte (RFC 3629): how many continuation bytes follow, and the range of the first one (lo |
// hi << 8), which is narrower after E0, ED, F0 and F4 so that overlong forms and surrogates are refused.
bool utf8_lead(unsigned char c, uint32_t& count, uint32_t& range) {
  uint32_t lo = 0x80;
  uint32_t hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    count = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    count = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    count = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return false;  // a continuation byte with no lead, or a byte UTF-8 never uses
  }
  range = lo | hi << 8;
  return true;
}

}  // namespace

JsonSchemaPrefix& JsonSchemaPrefix::operator=(const JsonSchemaPrefix& other) {
  schema_ = other.schema_;
  depth_ = other.depth_;
  containers_ = other.containers_;
  done_ = other.done_;
  ws_ = other.ws_;
  std::copy_n(other.frames_.begin(), depth_, frames_.begin());
  return *this;
}

bool JsonSchemaPrefix::complete() const {
  if (done_) return true;
  if (depth_ != 1) return false;
  // A top-level number or literal ends only at a byte that cannot extend it; with none left, it is whole.
  const Frame& f = frames_[0];
  if (f.kind == Kind::kNumber) {
    return f.phase == kZero || f.phase == kInt || f.phase == kFrac || f.phase == kExpDigits;
  }
  return f.kind == Kind::kLiteral && node(f).literals[f.a].size() == f.c;
}

void JsonSchemaPrefix::append_key(std::string& key) const {
  const auto put = [&key](const auto& v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(depth_);
  put(containers_);
  put(done_);
  put(ws_);
  for (int i = 0; i < depth_; ++i) {
    Frame f = frames_[i];
    const JsonSchema::Node& n = node(f);
    // A count with no upper bound is read only against its lower one.
    if (f.kind == Kind::kArray && n.max_items == JsonSchema::kUnbounded) f.a = std::min(f.a, n.min_items);
    if (f.kind == Kind::kString && !f.key && n.max_length == JsonSchema::kUnbounded) {
      f.a = std::min(f.a, n.min_length);
    }
    put(f.kind);
    put(f.phase);
    put(f.key);
    put(f.node);
    put(f.a);
    put(f.b);
    put(f.c);
  }
}

int64_t JsonSchemaPrefix::string_room() const {
  if (depth_ == 0) return -1;
  const Frame& f = frames_[depth_ - 1];
  if (f.kind != Kind::kString || f.phase != kChars || f.b != 0) return -1;
  return f.key ? int64_t{JsonSchema::kUnbounded} : int64_t{node(f).max_length} - f.a;
}

bool JsonSchemaPrefix::whitespace(unsigned char c) {
  if (ws_ == 0) {
    if (c == ' ') ws_ = 1;
    if (c == '\n') ws_ = 2;
    return ws_ != 0;
  }
  // After a newline: indentation, up to 4 columns a level.
  if (ws_ < 2 || (c != ' ' && c != '\t') || ws_ - 2 >= 4 * static_cast<uint32_t>(containers_ + 1))
    return false;
  ++ws_;
  return true;
}

bool JsonSchemaPrefix::feed(unsigned char c) {
  if (!is_space(c)) ws_ = 0;
  if (depth_ == 0) {
    if (is_space(c)) return whitespace(c);
    return !done_ && start_value(JsonSchema::kRoot, c);
  }
  Frame& f = top();
  switch (f.kind) {
    case Kind::kObject:
      return feed_object(f, c);
    case Kind::kArray:
      return feed_array(f, c);
    case Kind::kKey:
      return feed_key(f, c);
    case Kind::kString:
      return feed_string(f, c);
    case Kind::kNumber:
      return feed_number(f, c);
    case Kind::kLiteral:
      return feed_literal(f, c);
  }
  return false;
}

bool JsonSchemaPrefix::start_value(int32_t id, unsigned char c) {
  using K = JsonSchema::Kind;
  // Branches begin with different bytes (the compiler checks), so `c` picks at most one.
  while (schema_->node(id).kind == K::kAnyOf) {
    const JsonSchema::Node& n = schema_->node(id);
    const auto it = std::find_if(n.branches.begin(), n.branches.end(),
                                 [&](int32_t b) { return schema_->node(b).first.test(c); });
    if (it == n.branches.end()) return false;
    id = *it;
  }
  const JsonSchema::Node& n = schema_->node(id);
  if (!n.first.test(c) || !fits(id)) return false;
  switch (n.kind) {
    case K::kObject:
      push({Kind::kObject, kOpen, false, id, 0, 0, 0});
      ++containers_;
      return true;
    case K::kArray:
      push({Kind::kArray, kOpen, false, id, 0, 0, 0});
      ++containers_;
      return true;
    case K::kString:
      push({Kind::kString, kChars, false, id, 0, 0, 0});
      return true;
    case K::kNumber:
      push({Kind::kNumber, kNumStart, false, id, 0, 0, 0});
      return feed_number(top(), c);
    case K::kLiterals:
      push({Kind::kLiteral, 0, false, id, 0, static_cast<uint32_t>(n.literals.size()), 0});
      return feed_literal(top(), c);
    case K::kAnyOf:
      break;
  }
  return false;
}

void JsonSchemaPrefix::value_done() {
  --depth_;
  if (depth_ == 0) {
    done_ = true;
    return;
  }
  Frame& parent = top();
  parent.phase = kCommaOrEnd;
  if (parent.kind == Kind::kObject) {
    parent.a = parent.b + 1;
  } else {
    ++parent.a;
  }
}

void JsonSchemaPrefix::close_container() {
  --containers_;
  value_done();
}

bool JsonSchemaPrefix::key_allowed(const Frame& object, uint32_t property) const {
  const JsonSchema::Node& n = node(object);
  // Properties come in their declared order, and none may skip a required one.
  return property >= object.a && property <= n.next_required[object.a] && property < n.properties.size() &&
         fits(n.properties[property].value);
}

bool JsonSchemaPrefix::some_key_allowed(const Frame& object) const {
  const JsonSchema::Node& n = node(object);
  if (n.free_keys) return fits(n.values);
  const uint32_t last = std::min<uint32_t>(n.next_required[object.a], n.properties.size());
  for (uint32_t i = object.a; i <= last && i < n.properties.size(); ++i) {
    if (fits(n.properties[i].value)) return true;
  }
  return false;
}

bool JsonSchemaPrefix::can_close(const Frame& object) const {
  const JsonSchema::Node& n = node(object);
  return n.free_keys || n.next_required[object.a] == n.properties.size();
}

bool JsonSchemaPrefix::feed_object(Frame& f, unsigned char c) {
  if (is_space(c)) return whitespace(c);
  const JsonSchema::Node& n = node(f);
  switch (f.phase) {
    case kOpen:
      if (c == '}') {
        if (!can_close(f)) return false;
        close_container();
        return true;
      }
      [[fallthrough]];
    case kKey:
      if (c != '"' || !some_key_allowed(f)) return false;
      if (n.free_keys) {
        push({Kind::kString, kChars, true, f.node, 0, 0, 0});
        return true;
      }
      push({Kind::kKey, 0, false, f.node, 0, static_cast<uint32_t>(n.properties.size()), 0});
      return feed_key(top(), c);
    case kColon:
      if (c != ':') return false;
      f.phase = kValue;
      return true;
    case kValue:
      return start_value(n.free_keys ? n.values : n.properties[f.b].value, c);
    case kCommaOrEnd:
      if (c == ',') {
        if (!some_key_allowed(f)) return false;
        f.phase = kKey;
        return true;
      }
      if (c == '}' && can_close(f)) {
        close_container();
        return true;
      }
      return false;
  }
  return false;
}

bool JsonSchemaPrefix::feed_array(Frame& f, unsigned char c) {
  if (is_space(c)) return whitespace(c);
  const JsonSchema::Node& n = node(f);
  const bool more = f.a < n.max_items && fits(n.items);
  switch (f.phase) {
    case kOpen:
      if (c == ']') {
        if (f.a < n.min_items) return false;
        close_container();
        return true;
      }
      return more && start_value(n.items, c);
    case kValue:
      return start_value(n.items, c);
    case kCommaOrEnd:
      if (c == ',') {
        if (!more) return false;
        f.phase = kValue;
        return true;
      }
      if (c == ']' && f.a >= n.min_items) {
        close_container();
        return true;
      }
      return false;
    default:
      return false;
  }
}

bool JsonSchemaPrefix::feed_key(Frame& k, unsigned char c) {
  const JsonSchema::Node& n = node(k);
  Frame& object = frames_[depth_ - 2];
  const auto [lo, hi] = narrow(
      k.a, k.b, k.c, c, [&n](uint32_t j) -> const std::string& { return n.properties[n.key_order[j]].key; });
  bool any = false;
  for (uint32_t j = lo; j < hi && !any; ++j) any = key_allowed(object, static_cast<uint32_t>(n.key_order[j]));
  if (!any) return false;
  k.a = lo;
  k.b = hi;
  ++k.c;
  // A key ends at its closing quote, which no other key continues: matched whole, it is the only candidate.
  const uint32_t property = static_cast<uint32_t>(n.key_order[lo]);
  if (n.properties[property].key.size() == k.c) {
    --depth_;
    object.b = property;
    object.phase = kColon;
  }
  return true;
}

bool JsonSchemaPrefix::feed_string(Frame& s, unsigned char c) {
  // A free object's key has no length bounds.
  const uint32_t min = s.key ? 0 : node(s).min_length;
  const uint32_t max = s.key ? JsonSchema::kUnbounded : node(s).max_length;
  switch (s.phase) {
    case kChars:
      if (s.b > 0) {  // inside a UTF-8 character: the next continuation byte, in its range
        if (c < (s.c & 0xFF) || c > (s.c >> 8)) return false;
        --s.b;
        s.c = kContinuation;
        return true;
      }
      if (c == '"') {
        if (s.key) {
          --depth_;
          top().phase = kColon;
          return true;
        }
        if (s.a < min) return false;
        value_done();
        return true;
      }
      if (c < 0x20) return false;
      if (s.a >= max) return false;
      ++s.a;
      if (c == '\\') s.phase = kEscape;
      return c < 0x80 || utf8_lead(c, s.b, s.c);
    case kEscape:
      if (c == 'u') {
        s.c = 4;
        s.phase = kUnicode;
        return true;
      }
      s.phase = kChars;
      return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't';
    case kUnicode:
      if (!is_hex(c)) return false;
      if (--s.c == 0) s.phase = kChars;
      return true;
    default:
      return false;
  }
}

bool JsonSchemaPrefix::feed_number(Frame& f, unsigned char c) {
  const bool integer = node(f).integer;
  switch (f.phase) {
    case kNumStart:
      if (c == '-') {
        f.phase = kSign;
        return true;
      }
      [[fallthrough]];
    case kSign:
      if (c == '0') {
        f.phase = kZero;
        return true;
      }
      if (c >= '1' && c <= '9') {
        f.phase = kInt;
        return true;
      }
      return false;
    case kZero:
    case kInt:
      if (is_digit(c) && f.phase == kInt) return true;
      if (!integer && c == '.') {
        f.phase = kDot;
        return true;
      }
      if (!integer && (c == 'e' || c == 'E')) {
        f.phase = kExp;
        return true;
      }
      break;
    case kDot:
      if (!is_digit(c)) return false;
      f.phase = kFrac;
      return true;
    case kFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        f.phase = kExp;
        return true;
      }
      break;
    case kExp:
      if (c == '+' || c == '-') {
        f.phase = kExpSign;
        return true;
      }
      [[fallthrough]];
    case kExpSign:
      if (!is_digit(c)) return false;
      f.phase = kExpDigits;
      return true;
    case kExpDigits:
      if (is_digit(c)) return true;
      break;
    default:
      return false;
  }
  // The number ended at a byte that is not part of it: that byte belongs to what follows.
  value_done();
  return feed(c);
}

bool JsonSchemaPrefix::feed_literal(Frame& f, unsigned char c) {
  const std::vector<std::string>& literals = node(f).literals;
  const auto [lo, hi] =
      narrow(f.a, f.b, f.c, c, [&literals](uint32_t j) -> const std::string& { return literals[j]; });
  if (lo == hi) {
    // A whole literal that others extend (1 of [1, 12]) ends at the first byte none continues with.
    if (literals[f.a].size() != f.c) return false;
    value_done();
    return feed(c);
  }
  f.a = lo;
  f.b = hi;
  ++f.c;
  if (hi - lo == 1 && literals[lo].size() == f.c) value_done();
  return true;
}

}  // namespace hlm
