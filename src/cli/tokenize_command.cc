// `helixlm tokenize`: text to token ids and back with a model's tokenizer files alone (no weights), for
// scripts and data preparation. Plain mode reads all of stdin as one text and prints its ids on one
// line; --jsonl maps each input line {"text": ...} to an output line {"ids": [...]}; --decode reverses
// both. Special-token strings stay text unless --allow-special. Plain --decode writes the decoded bytes
// exactly (no newline added), so `tokenize | tokenize --decode` gives the input back.
#include <charconv>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_parse.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "tokenizer/tokenizer.h"

namespace hlm {

namespace {

struct TokenizeOptions {
  std::string dir = "models/kimi-linear-tiny";
  bool allow_special = false;
  bool jsonl = false;
  bool decode = false;
};

// "12, 7,300\n" -> ids; anything else is an error naming the item.
std::vector<int32_t> parse_ids(std::string_view text, const std::string& where) {
  std::vector<int32_t> ids;
  size_t item = 0, i = 0;
  auto skip_blank = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) ++i;
  };
  skip_blank();
  while (i < text.size()) {
    ++item;
    const size_t end = text.find_first_of(", \t\r\n", i);
    const std::string_view word = text.substr(i, end == std::string_view::npos ? text.size() - i : end - i);
    int32_t id = 0;
    const auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    HLM_CHECK(!word.empty() && ec == std::errc() && ptr == word.data() + word.size(),
              "{}: item {} '{}' is not a token id (expected ids separated by commas)", where, item, word);
    ids.push_back(id);
    i += word.size();
    skip_blank();
    if (i < text.size() && text[i] == ',') {
      ++i;
      skip_blank();
      HLM_CHECK(i < text.size(), "{}: a comma ends the list", where);
    }
  }
  return ids;
}

std::string json_text(const std::string& bytes) {
  return nlohmann::json(bytes).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One input line as a JSON object; errors say why the line is not one (the parser's reason and byte,
// or its type), and duplicate keys are refused as in every other JSON helixlm reads.
nlohmann::json parse_line(const std::string& line, const std::string& where, const TokenizeOptions& opt) {
  const char* expected = opt.decode ? "{\"ids\": [...]}" : "{\"text\": \"...\"}";
  nlohmann::json doc;
  try {
    doc = parse_json(line, where);
  } catch (const Error& e) {
    std::string_view reason = e.what();
    if (reason.starts_with(where + ": ")) reason.remove_prefix(where.size() + 2);
    HLM_FAIL("{}: expected a JSON object {}: {}", where, expected, reason);
  }
  HLM_CHECK(doc.is_object(), "{}: expected a JSON object {}, got {}", where, expected, doc.type_name());
  return doc;
}

void run_jsonl(const Tokenizer& tok, const TokenizeOptions& opt) {
  std::string line;
  // Stops at the first line that cannot be written; run_tokenize reports it.
  for (size_t line_no = 1; std::cout.good() && std::getline(std::cin, line); ++line_no) {
    const std::string where = fmt::format("stdin line {}", line_no);
    const nlohmann::json doc = parse_line(line, where, opt);
    if (opt.decode) {
      const auto ids = doc.find("ids");
      HLM_CHECK(ids != doc.end() && ids->is_array(), "{}: field 'ids' must be an array of token ids", where);
      std::vector<int32_t> values;
      for (size_t k = 0; k < ids->size(); ++k) {
        const auto& v = (*ids)[k];
        HLM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < tok.vocab_size() &&
                      tok.contains(static_cast<int32_t>(v.get<int64_t>())),
                  "{}: ids[{}] = {} is not a token id of this vocabulary (0..{})", where, k, v.dump(),
                  tok.vocab_size() - 1);
        values.push_back(static_cast<int32_t>(v.get<int64_t>()));
      }
      std::cout << "{\"text\": " << json_text(tok.decode(values)) << "}\n";
    } else {
      const auto text = doc.find("text");
      HLM_CHECK(text != doc.end() && text->is_string(), "{}: field 'text' must be a string", where);
      std::cout << fmt::format("{{\"ids\": [{}]}}\n",
                               fmt::join(tok.encode(text->get<std::string>(), opt.allow_special), ", "));
    }
  }
}

int run_tokenize(const TokenizeOptions& opt) {
  const Tokenizer tok = Tokenizer::load(opt.dir);
  std::ios::sync_with_stdio(false);
  if (opt.jsonl) {
    run_jsonl(tok, opt);
  } else {
    const std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    if (opt.decode) {
      std::cout << tok.decode(parse_ids(input, "stdin"));
    } else {
      std::cout << fmt::format("{}\n", fmt::join(tok.encode(input, opt.allow_special), ","));
    }
  }
  check_stdout();
  return 0;
}

}  // namespace

CommandRunner add_tokenize_command(CLI::App& app) {
  auto opt = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Text on stdin to token ids (or back with --decode)");
  cmd->add_option("--tokenizer", opt->dir, "Directory with tiktoken.model and tokenizer_config.json")
      ->capture_default_str();
  cmd->add_flag("--allow-special", opt->allow_special, "Special-token strings in the text become their ids");
  cmd->add_flag("--jsonl", opt->jsonl, "One JSON object per line: {\"text\": ...} -> {\"ids\": [...]}");
  cmd->add_flag("--decode", opt->decode,
                "Token ids to text (with --jsonl: {\"ids\": [...]} -> {\"text\": ...})");
  return [opt] { return run_tokenize(*opt); };
}

}  // namespace hlm
