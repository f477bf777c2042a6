// tokenizer_bench: single-thread encode throughput of hlm::Tokenizer on a text file, for
// tools/bench_tokenizer.py (which times pip tiktoken on the same text in the same run).
//   tokenizer_bench RANK_FILE CONFIG_FILE TEXT_FILE [REPEATS]
// Prints one JSON line: bytes, tokens, the FNV-1a hash of the ids (as the goldens store it), the median
// and every repeat's MB/s (MB = 1e6 bytes).
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: tokenizer_bench RANK_FILE CONFIG_FILE TEXT_FILE [REPEATS]\n";
    return 2;
  }
  try {
    const hlm::Tokenizer tok = hlm::Tokenizer::load_files(argv[1], argv[2]);
    const std::string text = hlm::read_text_file(argv[3]);
    const int repeats = argc > 4 ? std::stoi(argv[4]) : 5;
    const std::vector<int32_t> ids = tok.encode(text, true);  // also the warm-up (page faults, JIT stack)
    uint32_t hash = 0x811C9DC5u;
    for (int32_t id : ids) {
      for (int k = 0; k < 4; ++k)
        hash = (hash ^ ((static_cast<uint32_t>(id) >> (8 * k)) & 0xFF)) * 0x01000193u;
    }
    std::vector<double> rates;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const size_t n = tok.encode(text, true).size();
      HLM_CHECK(n == ids.size(), "encode is not deterministic");
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rates.push_back(text.size() / s / 1e6);
    }
    std::vector<double> sorted = rates;
    std::sort(sorted.begin(), sorted.end());
    std::cout << fmt::format(
        "{{\"bytes\": {}, \"tokens\": {}, \"ids_fnv1a32\": {}, \"median_mb_s\": {:.3f}, \"runs_mb_s\": "
        "[{:.3f}]}}\n",
        text.size(), ids.size(), hash, sorted[sorted.size() / 2], fmt::join(rates, ", "));
  } catch (const hlm::Error& e) {
    std::cerr << "tokenizer_bench: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
