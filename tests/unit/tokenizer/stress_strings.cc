// C++ twin of tools/tokenizer_stress.py (see stress_strings.h). Every random draw happens in the same
// order as in the Python generator; keep the two in step.
#include "stress_strings.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/utf8.h"

namespace hlm::test {

StressPools load_stress_pools(const std::string& path) {
  std::ifstream in(path);
  HLM_CHECK(in.good(), "cannot open {}", path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  StressPools p;
  p.fragments = doc.at("fragments").get<std::vector<std::string>>();
  p.separators = doc.at("separators").get<std::vector<std::string>>();
  p.whitespace = doc.at("whitespace").get<std::vector<std::string>>();
  p.specials = doc.at("specials").get<std::vector<std::string>>();
  for (const auto& r : doc.at("code_point_ranges")) {
    p.ranges.push_back({r[0].get<uint32_t>(), r[1].get<uint32_t>(), r[2].get<uint32_t>()});
  }
  return p;
}

namespace {

const std::string& pick(SplitMix64& rng, const std::vector<std::string>& items) {
  return items[rng.below(items.size())];
}

void append_code_point(SplitMix64& rng, const StressPools& pools, std::string& out) {
  uint64_t total = 0;
  for (const auto& r : pools.ranges) total += r.weight;
  uint64_t x = rng.below(total);
  for (const auto& r : pools.ranges) {
    if (x < r.weight) {
      append_utf8(out, static_cast<char32_t>(r.first + rng.below(r.last - r.first + 1)));
      return;
    }
    x -= r.weight;
  }
}

std::string repeat(std::string_view s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out.append(s);
  return out;
}

}  // namespace

std::string make_stress_string(uint64_t index, SplitMix64& rng, const StressPools& pools) {
  std::string out;
  switch (index % 8) {
    case 0:
    case 1:
    case 2:
      for (uint64_t n = 1 + rng.below(8); n > 0; --n) {
        out += pick(rng, pools.fragments);
        if (rng.below(3) == 0) out += pick(rng, pools.separators);
      }
      break;
    case 3:
      for (uint64_t n = 1 + rng.below(24); n > 0; --n) append_code_point(rng, pools, out);
      break;
    case 4:
      for (uint64_t n = 1 + rng.below(10); n > 0; --n) {
        if (rng.below(2) == 0) {
          out += pick(rng, pools.fragments);
        } else {
          append_code_point(rng, pools, out);
        }
      }
      break;
    case 5:
      for (uint64_t n = 1 + rng.below(16); n > 0; --n) {
        if (rng.below(4) == 0) {
          out += pick(rng, pools.fragments);
        } else {
          out.push_back(static_cast<char>(rng.below(256)));
        }
      }
      break;
    case 6:
      for (uint64_t n = 1 + rng.below(12); n > 0; --n) {
        const std::string& ws = pick(rng, pools.whitespace);
        out += repeat(ws, 1 + rng.below(5));
        if (rng.below(2) == 0) out += pick(rng, pools.fragments);
      }
      break;
    default:
      for (uint64_t n = 1 + rng.below(8); n > 0; --n) {
        if (rng.below(2) == 0) {
          out += pick(rng, pools.specials);
        } else {
          out += pick(rng, pools.fragments);
        }
      }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> long_stress_strings() {
  const std::string im_end = "<|im_end|>";
  std::string base64_like;
  const std::string alphabet = "QUJDRGVm+/0123xyz";
  for (size_t i = 0; i < 40000; ++i) base64_like.push_back(alphabet[(i * 7) % 17]);
  return {
      {"a*25000", repeat("a", 25000)},
      {"a*25001", repeat("a", 25001)},
      {"a*60000", repeat("a", 60000)},
      {"space*25001", repeat(" ", 25001)},
      {"space*24999+a", repeat(" ", 24999) + "a"},
      {"newline*30000", repeat("\n", 30000)},
      {"x*24999 space y*26000", repeat("x", 24999) + " " + repeat("y", 26000)},
      {"U+001C*30000+x (isspace, not White_Space)", repeat("\x1c", 30000) + "x"},
      {"U+3000*25005+z", repeat("\u3000", 25005) + "z"},
      {"Han*30000", repeat("\u4e2d", 30000)},
      {"digits*30000", repeat("1", 30000)},
      {"punct*30000", repeat("!", 30000)},
      {"e+U+0301 *30000", repeat("e\u0301", 30000)},
      {"base64-like 40000", base64_like},
      {"Aa*20000", repeat("Aa", 20000)},
      {"emoji*26000", repeat("\U0001F600", 26000)},
      {"words*40000 with <|im_end|> across the 400,000 boundary",
       repeat("hello world ", 40000).substr(0, 399995) + im_end + repeat("tail ", 10)},
      {"a*399990 + <|im_end|> across the 400,000 boundary", repeat("a", 399990) + im_end + "b"},
      {"space-separated words 410,000", repeat("ab ", 136667)},
      {"CRLF*20000 + text", repeat("\r\n", 20000) + "end"},
  };
}

uint32_t ids_hash(const std::vector<int32_t>& ids) {
  uint32_t h = 0x811C9DC5u;
  for (int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) h = (h ^ ((u >> (8 * k)) & 0xFF)) * 0x01000193u;
  }
  return h;
}

}  // namespace hlm::test
