// Tokenizer: loading, the encode pipeline (repair, chunking, special tokens, pre-tokenization, BPE) and
// decoding (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <unordered_map>

#include "base/error.h"
#include "base/utf8.h"
#include "tokenizer/kimi_pattern.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/rank_table.h"
#include "tokenizer/tokenizer_files.h"

namespace hlm {

namespace {

// tokenization_kimi.py's limits: tiktoken is given at most 400,000 characters at a time, and no run of
// more than 25,000 consecutive whitespace or non-whitespace characters (tiktoken issue #195).
constexpr size_t kMaxEncodeChars = 400000;
constexpr size_t kMaxRunChars = 25000;

enum class Kind : uint8_t { kAbsent, kRank, kAdded, kSpecial };

// Length of the UTF-8 sequence that lead byte `b` starts (the text is valid UTF-8 here).
size_t sequence_length(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

// Python's str.isspace (CPython 3.11, Unicode 14) of the character at s[i], `len` bytes long: the runs
// above are cut by it, not by White_Space. Only lead bytes C2, E1, E2 and E3 start a non-ASCII space.
bool python_isspace_at(std::string_view s, size_t i, size_t len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (len == 1) return (b0 >= 0x09 && b0 <= 0x0D) || (b0 >= 0x1C && b0 <= 0x20);
  if (b0 != 0xC2 && (b0 < 0xE1 || b0 > 0xE3)) return false;
  const char32_t c = utf8_decode_at(s.substr(i, len), nullptr);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace

struct Tokenizer::Impl {
  RankTable ranks;
  Pretokenizer pretokenizer{kimi_pretokenizer_pattern()};
  std::vector<std::string> added_text;    // storage for id_text of added tokens
  std::vector<std::string_view> id_text;  // id -> the bytes it decodes to (empty: not in vocab)
  std::vector<Kind> kind;                 // id -> what it is
  std::unordered_map<std::string_view, int32_t> added_by_text;
  std::vector<size_t> added_lengths;  // distinct lengths of added tokens, longest first
  // The first two bytes an added token can start with (a cheap filter before the hash lookups); an
  // added token of one byte sets every pair starting with it.
  std::vector<bool> added_prefix = std::vector<bool>(65536, false);
  std::optional<int32_t> bos, eos;

  // The leftmost added token at or after `from` (longest at that position); false when none.
  bool find_added(std::string_view s, size_t from, size_t* begin, size_t* end, int32_t* id) const {
    for (size_t i = from; i < s.size(); ++i) {
      const size_t b0 = static_cast<unsigned char>(s[i]);
      const size_t b1 = i + 1 < s.size() ? static_cast<unsigned char>(s[i + 1]) : 0;
      if (!added_prefix[(b0 << 8) | b1]) continue;
      for (size_t len : added_lengths) {
        if (len > s.size() - i) continue;
        const auto it = added_by_text.find(s.substr(i, len));
        if (it != added_by_text.end()) {
          *begin = i;
          *end = i + len;
          *id = it->second;
          return true;
        }
      }
    }
    return false;
  }

  // tiktoken's encode_ordinary on one gap between special tokens.
  void encode_ordinary(std::string_view s, std::vector<int32_t>& out) const {
    size_t from = 0, b = 0, e = 0;
    while (from < s.size() && pretokenizer.next(s, from, &b, &e)) {
      const std::string_view piece = s.substr(b, e - b);
      const uint32_t whole = ranks.find(piece);
      if (whole != RankTable::kNone) {
        out.push_back(static_cast<int32_t>(whole));
      } else {
        byte_pair_encode(piece, ranks, out);
      }
      from = e;
    }
  }

  // tiktoken's encode on one run: special tokens (when allowed) first, the gaps between them split.
  void encode_run(std::string_view s, bool allow_special, std::vector<int32_t>& out) const {
    size_t pos = 0;
    for (;;) {
      size_t b = s.size(), e = s.size();
      int32_t id = -1;
      if (allow_special && !added_lengths.empty()) find_added(s, pos, &b, &e, &id);
      encode_ordinary(s.substr(pos, b - pos), out);
      if (id < 0) return;
      out.push_back(id);
      pos = e;
    }
  }

  // tokenization_kimi.py's _split_whitespaces_or_nonwhitespaces on one 400,000-character chunk.
  void encode_chunk(std::string_view s, bool allow_special, std::vector<int32_t>& out) const {
    size_t run_len = 0, slice_start = 0, i = 0;
    bool run_is_space = false;
    while (i < s.size()) {
      const size_t len = sequence_length(static_cast<unsigned char>(s[i]));
      const bool is_space = python_isspace_at(s, i, len);
      if (i == 0) run_is_space = is_space;
      if (run_is_space != is_space) {
        run_len = 1;
        run_is_space = is_space;
      } else if (++run_len > kMaxRunChars) {
        encode_run(s.substr(slice_start, i - slice_start), allow_special, out);
        slice_start = i;
        run_len = 1;
      }
      i += len;
    }
    encode_run(s.substr(slice_start), allow_special, out);
  }
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const std::string& dir) {
  return load_files(dir + "/tiktoken.model", dir + "/tokenizer_config.json");
}

Tokenizer Tokenizer::load_files(const std::string& model_file, const std::string& config_file) {
  auto impl = std::make_shared<Impl>();
  impl->ranks = load_rank_file(model_file);
  TokenizerConfig cfg = load_tokenizer_config(config_file);

  // tokenization_kimi.py names every id between the last rank and the last added token that the config
  // does not list <|reserved_token_{id}|> (special).
  const int64_t max_rank = impl->ranks.max_rank();
  const int64_t max_added = cfg.added.empty() ? -1 : cfg.added.back().id;
  std::vector<AddedToken> added;
  size_t next_listed = 0;
  for (int64_t id = max_rank + 1; id <= max_added; ++id) {
    while (next_listed < cfg.added.size() && cfg.added[next_listed].id < id) ++next_listed;
    if (next_listed < cfg.added.size() && cfg.added[next_listed].id == id) continue;
    added.push_back(AddedToken{static_cast<int32_t>(id), fmt::format("<|reserved_token_{}|>", id), true});
  }
  added.insert(added.end(), cfg.added.begin(), cfg.added.end());

  const int64_t vocab = std::max(max_rank, max_added) + 1;
  impl->id_text.assign(vocab, std::string_view());
  impl->kind.assign(vocab, Kind::kAbsent);
  for (int64_t id = 0; id <= max_rank; ++id) {
    if (!impl->ranks.has_rank(static_cast<uint32_t>(id))) continue;
    impl->id_text[id] = impl->ranks.bytes_of(static_cast<uint32_t>(id));
    impl->kind[id] = Kind::kRank;
  }
  impl->added_text.reserve(added.size());
  for (const AddedToken& t : added) {
    HLM_CHECK(impl->kind[t.id] != Kind::kRank, "{}: added token {} '{}' reuses rank {} of {}", config_file,
              t.id, t.content, t.id, model_file);
    impl->added_text.push_back(t.content);
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    const std::string_view text = impl->added_text[i];
    const auto [it, fresh] = impl->added_by_text.emplace(text, t.id);
    HLM_CHECK(fresh, "{}: added tokens {} and {} have the same content '{}'", config_file, it->second, t.id,
              text);
    impl->id_text[t.id] = text;
    impl->kind[t.id] = t.special ? Kind::kSpecial : Kind::kAdded;
    const size_t b0 = static_cast<unsigned char>(text[0]);
    for (size_t b1 = 0; b1 < 256; ++b1) {
      if (text.size() == 1 || static_cast<unsigned char>(text[1]) == b1)
        impl->added_prefix[(b0 << 8) | b1] = true;
    }
    if (std::find(impl->added_lengths.begin(), impl->added_lengths.end(), text.size()) ==
        impl->added_lengths.end()) {
      impl->added_lengths.push_back(text.size());
    }
  }
  std::sort(impl->added_lengths.rbegin(), impl->added_lengths.rend());

  auto named_id = [&](const std::optional<std::string>& name, const char* field) -> std::optional<int32_t> {
    if (!name) return std::nullopt;
    const auto it = impl->added_by_text.find(*name);
    HLM_CHECK(it != impl->added_by_text.end(), "{}: `{}` is '{}', which is not an added token", config_file,
              field, *name);
    return it->second;
  };
  impl->bos = named_id(cfg.bos_token, "bos_token");
  impl->eos = named_id(cfg.eos_token, "eos_token");
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (text.size() <= kMaxRunChars) {  // no run can be too long: skip the character scan
    impl_->encode_run(text, allow_special, out);
    return out;
  }
  size_t chunk_start = 0, chars = 0;
  for (size_t i = 0; text.size() > kMaxEncodeChars && i < text.size();
       i += sequence_length(static_cast<unsigned char>(text[i]))) {
    if (chars == kMaxEncodeChars) {
      impl_->encode_chunk(text.substr(chunk_start, i - chunk_start), allow_special, out);
      chunk_start = i;
      chars = 0;
    }
    ++chars;
  }
  impl_->encode_chunk(text.substr(chunk_start), allow_special, out);
  return out;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  HLM_CHECK(contains(id), "token id {} is not in the vocabulary (ids 0..{}{})", id, vocab_size() - 1,
            id >= 0 && id < vocab_size() ? "; this one is unassigned" : "");
  return impl_->id_text[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) out.append(token_bytes(id));
  return out;
}

std::optional<int32_t> Tokenizer::special_id(std::string_view token) const {
  const auto it = impl_->added_by_text.find(token);
  if (it == impl_->added_by_text.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::contains(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->kind[id] != Kind::kAbsent;
}
bool Tokenizer::is_special(int32_t id) const { return contains(id) && impl_->kind[id] == Kind::kSpecial; }
bool Tokenizer::is_added(int32_t id) const {
  return contains(id) && (impl_->kind[id] == Kind::kSpecial || impl_->kind[id] == Kind::kAdded);
}
int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->kind.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

StreamDecoder::StreamDecoder(const Tokenizer& tok) : tok_(tok) {}

std::string StreamDecoder::push(int32_t id) {
  pending_.append(tok_.token_bytes(id));
  std::string out;
  size_t done = 0;  // pending_[0, done) is emitted
  size_t i = 0;
  while (i < pending_.size()) {
    if (static_cast<unsigned char>(pending_[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t subpart = 0;
    bool truncated = false;
    const size_t len = utf8_sequence_length(std::string_view(pending_).substr(i), &subpart, &truncated);
    if (len > 0) {
      i += len;
    } else if (truncated) {
      break;  // may still complete with the next id
    } else {
      out.append(pending_, done, i - done);
      out.append("\xEF\xBF\xBD");
      i += subpart;
      done = i;
    }
  }
  out.append(pending_, done, i - done);
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace hlm
