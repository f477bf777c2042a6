// The tokenizer stress set: the C++ twin of tools/tokenizer_stress.py. Both generate the same byte
// strings from the seed and the pools of tests/fixtures/tokenizer/stress_pools.json, so the committed
// goldens hold only a hash of the expected ids per string.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hlm::test {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t state_;
};

struct StressPools {
  std::vector<std::string> fragments, separators, whitespace, specials;
  struct Range {
    uint32_t first, last, weight;
  };
  std::vector<Range> ranges;
};

StressPools load_stress_pools(const std::string& path);

// String `index` of the random part of the set (tokenizer_stress.make_string).
std::string make_stress_string(uint64_t index, SplitMix64& rng, const StressPools& pools);

// The pathological long strings (tokenizer_stress.long_strings), as (name, bytes).
std::vector<std::pair<std::string, std::string>> long_stress_strings();

// The 32-bit FNV-1a hash of the ids' little-endian bytes, as the goldens store it.
uint32_t ids_hash(const std::vector<int32_t>& ids);

}  // namespace hlm::test
