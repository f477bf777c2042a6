// Parsing of tiktoken.model and tokenizer_config.json (see tokenizer_files.h).
#include "tokenizer/tokenizer_files.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace hlm {

namespace {

constexpr std::array<int8_t, 256> make_base64_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
  return t;
}
constexpr std::array<int8_t, 256> kBase64 = make_base64_table();

// Standard base64 with '=' padding; false on any other character or a bad length.
bool decode_base64(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  while (pad < 2 && in[in.size() - 1 - pad] == '=') ++pad;
  const size_t n = in.size() - pad;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    const int8_t v = kBase64[static_cast<unsigned char>(in[i])];
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return !out.empty();
}

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

std::string shorten(std::string_view s) {
  return s.size() <= 40 ? std::string(s) : std::string(s.substr(0, 40)) + "...";
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HLM_CHECK(in.good(), "cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  HLM_CHECK(!in.bad(), "cannot read {}", path);
  return ss.str();
}

RankTable parse_rank_file(std::string_view text, const std::string& source) {
  RankTable table;
  table.reserve(text.size() / 12 + 16);
  std::vector<uint32_t> line_of_rank;  // 1-based line of each rank, 0: unused
  std::string bytes;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string_view line = trim(text.substr(0, eol));
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    ++line_no;
    if (line.empty()) continue;
    const size_t space = line.find_first_of(" \t");
    HLM_CHECK(space != std::string_view::npos, "{} line {}: expected `base64 rank`, found '{}'", source,
              line_no, shorten(line));
    const std::string_view token = line.substr(0, space);
    const std::string_view rank_text = trim(line.substr(space + 1));
    HLM_CHECK(decode_base64(token, bytes), "{} line {}: '{}' is not valid base64 of a non-empty token",
              source, line_no, shorten(token));
    int64_t rank = -1;
    const auto [end, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    HLM_CHECK(
        ec == std::errc() && end == rank_text.data() + rank_text.size() && rank >= 0 && rank <= kMaxTokenId,
        "{} line {}: rank '{}' is not an integer in 0..{}", source, line_no, shorten(rank_text), kMaxTokenId);
    if (static_cast<size_t>(rank) >= line_of_rank.size()) line_of_rank.resize(size_t(rank) + 1, 0);
    HLM_CHECK(line_of_rank[rank] == 0, "{} line {}: rank {} is already used on line {}", source, line_no,
              rank, line_of_rank[rank]);
    const uint32_t existing = table.add(bytes, static_cast<uint32_t>(rank));
    HLM_CHECK(existing == RankTable::kNone, "{} line {}: token '{}' already has rank {} (line {})", source,
              line_no, token, existing, line_of_rank[existing]);
    line_of_rank[rank] = static_cast<uint32_t>(line_no);
  }
  HLM_CHECK(table.size() > 0, "{}: no tokens (expected one `base64 rank` per line)", source);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    HLM_CHECK(table.find(std::string_view(&c, 1)) != RankTable::kNone,
              "{}: no token for the single byte 0x{:02X}; a byte-level BPE vocabulary needs all 256", source,
              b);
  }
  return table;
}

RankTable load_rank_file(const std::string& path) { return parse_rank_file(read_text_file(path), path); }

namespace {

std::optional<std::string> token_name(const nlohmann::json& doc, const char* field,
                                      const std::string& source) {
  const auto it = doc.find(field);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  HLM_CHECK(it->is_object() && it->contains("content") && (*it)["content"].is_string(),
            "{}: `{}` must be a string or an object with a string `content`", source, field);
  return (*it)["content"].get<std::string>();
}

}  // namespace

TokenizerConfig parse_tokenizer_config(std::string_view text, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers out of range
    HLM_FAIL("{}: invalid JSON: {}", source, e.what());
  }
  HLM_CHECK(doc.is_object(), "{}: expected a JSON object at the top level", source);
  TokenizerConfig cfg;
  const auto added = doc.find("added_tokens_decoder");
  if (added != doc.end()) {
    HLM_CHECK(added->is_object(), "{}: `added_tokens_decoder` must be an object of id -> token", source);
    for (const auto& [key, value] : added->items()) {
      const std::string field = fmt::format("added_tokens_decoder[\"{}\"]", key);
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      HLM_CHECK(ec == std::errc() && end == key.data() + key.size() && id >= 0 && id <= kMaxTokenId,
                "{}: {}: the key must be a token id in 0..{}", source, field, kMaxTokenId);
      HLM_CHECK(value.is_object(), "{}: {} must be an object with `content`", source, field);
      const auto content = value.find("content");
      HLM_CHECK(content != value.end() && content->is_string() && !content->get<std::string>().empty(),
                "{}: {}.content must be a non-empty string", source, field);
      bool special = false;
      if (const auto s = value.find("special"); s != value.end()) {
        HLM_CHECK(s->is_boolean(), "{}: {}.special must be true or false", source, field);
        special = s->get<bool>();
      }
      cfg.added.push_back(AddedToken{static_cast<int32_t>(id), content->get<std::string>(), special});
    }
    std::sort(cfg.added.begin(), cfg.added.end(),
              [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
    for (size_t i = 1; i < cfg.added.size(); ++i) {
      HLM_CHECK(cfg.added[i].id != cfg.added[i - 1].id, "{}: added_tokens_decoder lists id {} twice", source,
                cfg.added[i].id);
    }
  }
  cfg.bos_token = token_name(doc, "bos_token", source);
  cfg.eos_token = token_name(doc, "eos_token", source);
  return cfg;
}

TokenizerConfig load_tokenizer_config(const std::string& path) {
  return parse_tokenizer_config(read_text_file(path), path);
}

std::optional<std::string> load_jinja_chat_template(const std::string& dir) {
  const std::string jinja = dir + "/chat_template.jinja";
  if (std::filesystem::exists(jinja)) return read_text_file(jinja);
  const std::string config = dir + "/tokenizer_config.json";
  if (!std::filesystem::exists(config)) return std::nullopt;
  const nlohmann::json doc =
      nlohmann::json::parse(read_text_file(config), nullptr, /*allow_exceptions=*/false);
  const auto it = doc.is_object() ? doc.find("chat_template") : doc.end();
  if (it == doc.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace hlm
