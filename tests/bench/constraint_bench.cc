// constraint_bench: the host time of one constrained-decoding mask (runtime/output_constraint.h) at every
// step of a document, for tools/bench_constraint.py, which times xgrammar on the same vocabulary, schema
// and tokens in the same run.
//   constraint_bench RANK_FILE SCHEMA_FILE IDS [REPEATS]
// RANK_FILE: a tiktoken rank file (its ranks are the vocabulary); IDS: the comma-separated ids of a
// document that is an instance of the schema in the form the recognizer emits.
// Prints one JSON line: the schema's compile time (parse included); per step (before each token, and before
// the end) the median over the repeats (each a fresh walk of the document) of the mask time in µs, and the
// count of ids allowed; and their median, p90 and max.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "runtime/output_constraint.h"
#include "tokenizer/tokenizer_files.h"

namespace {

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: constraint_bench RANK_FILE SCHEMA_FILE IDS [REPEATS]\n";
    return 2;
  }
  try {
    const hlm::RankTable ranks = hlm::load_rank_file(argv[1]);
    const int64_t vocab = static_cast<int64_t>(ranks.max_rank()) + 2;  // the last id: an end-of-sequence
    std::vector<std::string> bytes(static_cast<size_t>(vocab));
    std::vector<uint8_t> text(static_cast<size_t>(vocab), 0);
    for (uint32_t r = 0; r <= ranks.max_rank(); ++r) {
      bytes[r] = std::string(ranks.bytes_of(r));
      text[r] = !bytes[r].empty();
    }
    const auto eos = static_cast<int32_t>(vocab - 1);
    std::ifstream in(argv[2]);
    HLM_CHECK(in.good(), "cannot read {}", argv[2]);
    std::stringstream schema_text;
    schema_text << in.rdbuf();
    hlm::OutputConstraint c;
    c.vocab = std::make_shared<hlm::ConstraintVocab>(std::move(bytes), std::move(text));
    const auto compile_start = std::chrono::steady_clock::now();
    c.json = hlm::JsonSchema::compile(nlohmann::ordered_json::parse(schema_text.str()), argv[2]);
    const double compile_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - compile_start).count();
    std::vector<int32_t> ids;
    std::stringstream list(argv[3]);
    for (std::string item; std::getline(list, item, ',');) ids.push_back(std::stoi(item));
    const int repeats = argc > 4 ? std::stoi(argv[4]) : 5;

    // Each repeat walks the document afresh: a sequence masks each step once, and a repeated mask of the
    // same state would only time the cache.
    std::vector<float> logits(static_cast<size_t>(vocab));
    std::vector<std::vector<double>> times(ids.size() + 1);
    std::vector<int64_t> allowed(ids.size() + 1);
    for (int r = 0; r < repeats; ++r) {
      hlm::ConstrainedOutput out(c, {eos});
      for (size_t step = 0; step <= ids.size(); ++step) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        const auto t0 = std::chrono::steady_clock::now();
        out.mask(logits.data(), vocab, -1.0f);
        times[step].push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        allowed[step] = std::count(logits.begin(), logits.end(), 0.0f);
        const int32_t next = step < ids.size() ? ids[step] : eos;
        HLM_CHECK(logits[next] == 0.0f, "the document's token {} ('{}') at step {} is masked", next,
                  c.vocab->bytes[next], step);
        if (step < ids.size()) out.observe(next);
      }
    }
    std::vector<double> step_us;
    for (const std::vector<double>& t : times) step_us.push_back(percentile(t, 0.5));
    const nlohmann::json report = {{"vocab", vocab},
                                   {"compile_s", compile_s},
                                   {"steps", step_us.size()},
                                   {"median_us", percentile(step_us, 0.5)},
                                   {"p90_us", percentile(step_us, 0.9)},
                                   {"max_us", percentile(step_us, 1.0)},
                                   {"step_us", step_us},
                                   {"allowed", allowed}};
    std::cout << report.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "constraint_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
