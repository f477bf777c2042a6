#include "server/text_output.h"

#include <algorithm>

#include "base/utf8.h"

namespace hlm {

namespace {

// Code points in valid UTF-8: the bytes that are not continuation bytes.
int64_t count_chars(const std::string& s) {
  return std::count_if(s.begin(), s.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

}  // namespace

TextOutput::TextOutput(const Tokenizer* tokenizer, std::vector<std::string> stop, bool skip_special_tokens,
                       bool include_stop)
    : tokenizer_(tokenizer),
      stop_(std::move(stop)),
      skip_special_(skip_special_tokens),
      include_stop_(include_stop) {
  if (tokenizer_) decoder_.emplace(*tokenizer_);
}

std::string TextOutput::release(std::string text) {
  held_ += text;
  // The earliest full match ends the output (the first listed of those matching there), before the stop
  // string or, with include_stop, after it.
  size_t cut = std::string::npos, end = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t at = held_.find(s);
    if (at < cut) {
      cut = at;
      end = at + s.size();
    }
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, include_stop_ ? end : cut);
    held_.clear();
    return out;
  }
  // Hold the longest tail that is a proper prefix of a stop string. The held text is valid UTF-8 and a
  // stop string starts on a character boundary, so the released part never ends inside a character.
  size_t keep = 0;
  for (const std::string& s : stop_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string TextOutput::push(int32_t id, bool stop_token) {
  if (!decoder_ || stopped_ || (stop_token && !include_stop_)) return "";
  if (skip_special_ && tokenizer_->is_special(id)) return "";
  std::string text = decoder_->push(id);
  decoded_chars_ += count_chars(text);
  return release(std::move(text));
}

std::string TextOutput::finish() {
  if (!decoder_ || stopped_) return "";
  std::string text = decoder_->flush();
  decoded_chars_ += count_chars(text);
  std::string out = release(std::move(text));
  if (stopped_) return out;
  out += held_;
  held_.clear();
  return out;
}

std::string TextOutput::token_text(int32_t id) const {
  if (!tokenizer_) return "token_id:" + std::to_string(id);
  return to_valid_utf8(tokenizer_->token_bytes(id));
}

std::optional<std::string> TextOutput::token_bytes(int32_t id) const {
  if (!tokenizer_) return std::nullopt;
  return std::string(tokenizer_->token_bytes(id));
}

}  // namespace hlm
