// The command line as users and scripts see it: exact output formats, greedy ids equal to the reference,
// errors that name what is wrong with a non-zero exit, and multi-rank runs under mpirun (each with a
// timeout, so a hang fails instead of blocking CI).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/npy.h"

namespace hlm {
namespace {

const std::string kBin = HLM_BINARY;
const std::string kFixtures = HLM_FIXTURES_DIR;
const std::string kScratch = HLM_SCRATCH_DIR;
const std::string kTiny = kFixtures + "/kimi-tiny-dense-first";

struct Result {
  int code = 0;
  std::string out;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `args` through the shell with a timeout; mpirun runs get the root/oversubscribe settings CI needs.
Result run(const std::string& args, int timeout_s = 300) {
  const std::string out = kScratch + "/out.txt", err = kScratch + "/err.txt";
  const std::string cmd = fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "
      "timeout {} {} >{} 2>{}",
      timeout_s, args, out, err);
  const int status = std::system(cmd.c_str());
  return Result{WEXITSTATUS(status), slurp(out), slurp(err)};
}

std::string mpirun(int n) { return fmt::format("mpirun -np {} --oversubscribe --bind-to none {}", n, kBin); }

nlohmann::json golden(const std::string& dir) { return nlohmann::json::parse(slurp(dir + "/golden.json")); }

std::string ids_csv(const std::vector<int32_t>& ids) { return fmt::format("{}", fmt::join(ids, ",")); }

TEST(Cli, GenerateMatchesReferenceGreedyIds) {
  const auto p = golden(kTiny)["prompts"][1];
  const auto prompt = p["ids"].get<std::vector<int32_t>>();
  const auto greedy = p["greedy"].get<std::vector<int32_t>>();
  const Result r = run(fmt::format("{} generate -m {} --prompt-ids {} -n {} --ignore-eos", kBin, kTiny,
                                   ids_csv(prompt), greedy.size()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, ids_csv(greedy) + "\n");  // exactly one line
}

TEST(Cli, GenerateBatchPrintsOneLinePerPromptInOrder) {
  const auto prompts = golden(kTiny)["prompts"];
  std::string args;
  std::string expect;
  for (const auto& p : prompts) {
    args += " --prompt-ids " + ids_csv(p["ids"].get<std::vector<int32_t>>());
    auto g = p["greedy"].get<std::vector<int32_t>>();
    g.resize(6);
    expect += ids_csv(g) + "\n";
  }
  const Result r = run(fmt::format("{} generate -m {} {} -n 6 --ignore-eos", kBin, kTiny, args));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, expect);
}

TEST(Cli, SamplingIsReproducibleWithASeed) {
  const std::string cmd = fmt::format(
      "{} generate -m {} --prompt-ids 5,17,300 -n 12 --temperature 0.9 --top-k 50 --top-p 0.9", kBin, kTiny);
  const Result a = run(cmd + " --seed 7"), b = run(cmd + " --seed 7"), c = run(cmd + " --seed 8");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(Cli, LogitsWritesEveryPositionThroughPrefillAndDecode) {
  const auto p = golden(kTiny)["prompts"][1];
  auto ids = p["ids"].get<std::vector<int32_t>>();
  const auto greedy = p["greedy"].get<std::vector<int32_t>>();
  ids.insert(ids.end(), greedy.begin(), greedy.end());
  const std::string out = kScratch + "/logits.npy";
  const Result r =
      run(fmt::format("{} logits -m {} --ids {} --prefill-len 20 -o {}", kBin, kTiny, ids_csv(ids), out));
  ASSERT_EQ(r.code, 0) << r.err;
  const Tensor got = read_npy(out);
  const Tensor want = read_npy(kTiny + "/" + p["logits"].get<std::string>());
  ASSERT_EQ(got.shape(), want.shape());
  float worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    worst = std::max(worst, std::abs(got.data<float>()[i] - want.data<float>()[i]));
  EXPECT_LE(worst, 1e-3f);
}

TEST(Cli, ErrorsNameTheProblemAndExitNonZero) {
  struct Case {
    std::string args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"generate -m /nonexistent --prompt-ids 1", "model directory '/nonexistent' not found"},
      {"generate -m " + kTiny + " --prompt-ids 1,x,3", "--prompt-ids: 'x' is not a token id"},
      {"generate -m " + kTiny + " --prompt-ids 1,99999", "outside the vocabulary [0, 512)"},
      {"generate -m " + kTiny + " --prompt-ids 1 --top-p 0", "--top-p must be in (0, 1]"},
      {"generate -m " + kTiny + " --prompt-ids 1 --cp 2", "launch has 1 rank(s) but --tp 1 x --cp 2 = 2"},
      {"generate -m " + kTiny + " --prompt-ids 1 --max-seq-len 4", "raise --max-seq-len"},
      {"logits -m " + kTiny + " --ids 1,2 --prefill-len 3 -o /tmp/x.npy",
       "--prefill-len 3 exceeds the 2 ids"},
      {"inspect -m " + kFixtures, "config.json"},
  };
  for (const Case& c : cases) {
    const Result r = run(kBin + " " + c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.err.find("helixlm: error: "), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
}

TEST(Cli, BadConfigNamesTheFileAndField) {
  const std::string dir = kScratch + "/bad-model";
  std::filesystem::create_directories(dir);
  nlohmann::json cfg = nlohmann::json::parse(slurp(kTiny + "/config.json"));
  cfg["moe_router_activation_func"] = "softmax";
  std::ofstream(dir + "/config.json") << cfg.dump();
  std::filesystem::copy_file(kTiny + "/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  const Result r = run(fmt::format("{} generate -m {} --prompt-ids 1", kBin, dir));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(dir + "/config.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("moe_router_activation_func"), std::string::npos) << r.err;
}

TEST(Cli, InspectReportsExactParameterCount) {
  const Result r = run(fmt::format("{} inspect -m {}", kBin, kTiny));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("layers: 4 (3 KDA, 1 MLA; 1 dense FFN, 3 MoE)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("total                     561,752"), std::string::npos) << r.out;
}

TEST(Cli, PlanSizesTheFortyEightBillionModel) {
  const std::string cfg = kFixtures + "/configs/kimi-linear-48b-a3b.json";
  Result r = run(fmt::format("{} plan --config {} --tp 1 --cp 8 --context 1048576 --batch 4", kBin, cfg));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("49,122,681,728 parameters"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1008.0 B per rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KDA recurrent state per sequence:            5,242,880 B"), std::string::npos)
      << r.out;
  r = run(fmt::format("{} plan --config {} --tp 3 --cp 4", kBin, cfg));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("INVALID"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KDA head count (32) must be divisible by tp*cp (12)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tp*cp = 1, 2, 4, 8, 16, 32 ranks"), std::string::npos) << r.out;
}

TEST(Cli, PlanSizesKimiK3) {
  const std::string cfg = kFixtures + "/configs/kimi-k3.json";
  const Result r = run(fmt::format("{} plan --config {} --tp 1 --cp 16 --context 1048576", kBin, cfg));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("(kimi_k3), 2,779,484,478,208 parameters"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("6 of 96 KDA heads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("56 of 896 routed experts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1728.0 B per rank"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("vision tower is not loaded"), std::string::npos) << r.err;
}

TEST(Cli, GenerateRunsKimiK3) {
  const std::string dir = kFixtures + "/k3-tiny";
  const auto p = golden(dir)["prompts"][1];
  const auto greedy = p["greedy"].get<std::vector<int32_t>>();
  const Result r = run(fmt::format("{} generate -m {} --prompt-ids {} -n {} --ignore-eos", kBin, dir,
                                   ids_csv(p["ids"].get<std::vector<int32_t>>()), greedy.size()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, ids_csv(greedy) + "\n");
}

TEST(Cli, HelixUnderMpirunGivesTheSingleRankIds) {
  const std::string args = fmt::format(
      " generate -m {} --prompt-ids 5,17,300 --prompt-ids 9 -n 16 --ignore-eos "
      "--tokens-per-block 2",
      kTiny);
  const Result one = run(kBin + args);
  ASSERT_EQ(one.code, 0) << one.err;
  const Result four = run(mpirun(4) + args + " --tp 2 --cp 2");
  ASSERT_EQ(four.code, 0) << four.err;
  EXPECT_EQ(four.out, one.out);
}

TEST(Cli, MpirunLayoutMismatchFailsWithoutHanging) {
  const Result r = run(mpirun(2) + fmt::format(" generate -m {} --prompt-ids 1 --cp 4", kTiny), 120);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out";
  EXPECT_NE(r.err.find("launch has 2 rank(s) but --tp 1 x --cp 4 = 4"), std::string::npos) << r.err;
}

TEST(Cli, OneRanksErrorEndsEveryRank) {
  // Only rank 0 checks prompt ids (the others wait for step plans): its error must end the whole job.
  const Result r = run(mpirun(2) + fmt::format(" generate -m {} --prompt-ids 1,99999 --cp 2", kTiny), 120);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out";
  EXPECT_NE(r.err.find("rank 0: error: prompt 0: token id 99999 is outside the vocabulary"),
            std::string::npos)
      << r.err;
}

// `helixlm tokenize` with `stdin` as its input; the ids below come from pip tiktoken
// (tests/fixtures/tokenizer/tiny_expected.json).
Result tokenize(const std::string& args, const std::string& stdin_text) {
  const std::string in = kScratch + "/tokenize_in.txt";
  std::ofstream(in, std::ios::binary) << stdin_text;
  return run(fmt::format("{} tokenize --tokenizer {} {} <{}", kBin, kTiny, args, in));
}

TEST(Cli, TokenizeRoundTripsTextThroughIds) {
  const Result ids = tokenize("", "Hello, world! How are you today?");
  ASSERT_EQ(ids.code, 0) << ids.err;
  EXPECT_EQ(ids.out, "56,386,28,290,301,92,84,17,411,320,335,371,385,47\n");
  const Result text = tokenize("--decode", ids.out);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_EQ(text.out, "Hello, world! How are you today?");  // exactly the input, no newline added
}

TEST(Cli, TokenizeSpecialTokensOnlyWhenAllowed) {
  const Result plain = tokenize("", "<|im_end|>");
  const Result allowed = tokenize("--allow-special", "<|im_end|>");
  ASSERT_EQ(allowed.code, 0) << allowed.err;
  EXPECT_EQ(allowed.out, "3\n");
  EXPECT_NE(plain.out, "3\n");
  EXPECT_EQ(tokenize("--decode", plain.out).out, "<|im_end|>");
}

TEST(Cli, TokenizeJsonlBothWays) {
  const Result ids =
      tokenize("--jsonl --allow-special", "{\"text\": \"Hello<|im_end|>\"}\n{\"text\": \"\"}\n");
  ASSERT_EQ(ids.code, 0) << ids.err;
  EXPECT_EQ(ids.out, "{\"ids\": [56, 386, 3]}\n{\"ids\": []}\n");
  const Result text = tokenize("--jsonl --decode", ids.out);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_EQ(text.out, "{\"text\": \"Hello<|im_end|>\"}\n{\"text\": \"\"}\n");
}

TEST(Cli, TokenizeBadInputNamesTheLineOrItem) {
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"--decode", "1, 2,x3"}, "stdin: item 3 'x3' is not a token id"},
      {{"--decode", "1,99999"}, "token id 99999 is not in the vocabulary"},
      {{"--jsonl", "{\"text\": \"a\"}\n{\"txt\": \"b\"}\n"}, "stdin line 2: field 'text' must be a string"},
      {{"--jsonl", "not json\n"}, "stdin line 1: expected a JSON object"},
      {{"--jsonl --decode", "{\"ids\": [1, -4]}\n"}, "stdin line 1: ids[1] = -4 is not a token id"},
      {{"--jsonl --decode", "{\"ids\": \"1,2\"}\n"}, "stdin line 1: field 'ids' must be an array"},
  };
  for (const auto& [input, message] : cases) {
    const Result r = tokenize(input.first, input.second);
    EXPECT_EQ(r.code, 1) << input.second;
    EXPECT_NE(r.err.find("helixlm: error: " + message), std::string::npos) << r.err;
  }
  const Result missing =
      run(fmt::format("{} tokenize --tokenizer {}/nonexistent </dev/null", kBin, kScratch));
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("nonexistent/tiktoken.model"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace hlm
