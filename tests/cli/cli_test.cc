// The command line as users and scripts see it: exact output formats, greedy ids equal to the reference,
// errors that name what is wrong with a non-zero exit, and multi-rank runs under mpirun (each with a
// timeout, so a hang fails instead of blocking CI).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
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

// A command line and a part of the error it must print.
struct ErrorCase {
  std::string args;
  std::string message;
};

// A copy of the tiny model under the scratch directory whose model.safetensors `edit` may change: the
// header as JSON and the data section as bytes (offsets stay the editor's business).
std::string edited_model(const std::string& name,
                         const std::function<void(nlohmann::json&, std::vector<char>&)>& edit) {
  const std::string dir = kScratch + "/" + name;
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kTiny + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const std::string bytes = slurp(kTiny + "/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  std::vector<char> data(bytes.begin() + 8 + static_cast<int64_t>(n), bytes.end());
  edit(header, data);
  const std::string text = header.dump();
  const uint64_t len = text.size();
  std::ofstream out(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << text;
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return dir;
}

// A copy of the tiny model under the scratch directory whose config.json `edit` changes.
std::string edited_config(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir = kScratch + "/" + name;
  std::filesystem::create_directories(dir);
  nlohmann::json cfg = nlohmann::json::parse(slurp(kTiny + "/config.json"));
  edit(cfg);
  std::ofstream(dir + "/config.json") << cfg.dump();
  std::filesystem::copy_file(kTiny + "/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  return dir;
}

// Sets every bf16 value of `tensor` to the bit pattern `bits`.
void fill_bf16(nlohmann::json& header, std::vector<char>& data, const std::string& tensor, uint16_t bits) {
  const auto offsets = header[tensor]["data_offsets"].get<std::vector<size_t>>();
  for (size_t i = offsets[0]; i < offsets[1]; i += 2) std::memcpy(data.data() + i, &bits, 2);
}

// Runs `script` with bash (for runs that need job control: signals, stopped ranks).
Result run_script(const std::string& script, int timeout_s) {
  const std::string path = kScratch + "/script.sh";
  std::ofstream(path) << script;
  return run("bash " + path, timeout_s);
}

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

// Penalties reach the draws (a repetition penalty of 5 changes the tiny model's greedy continuation) and
// keep them reproducible under a seed.
TEST(Cli, PenaltiesChangeTheContinuationReproducibly) {
  const std::string cmd =
      fmt::format("{} generate -m {} --prompt-ids 5,17,300 -n 12 --ignore-eos", kBin, kTiny);
  const Result plain = run(cmd), penalized = run(cmd + " --repetition-penalty 5");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(penalized.code, 0) << penalized.err;
  EXPECT_NE(plain.out, penalized.out);
  const std::string sampled =
      cmd + " --temperature 1 --seed 4 --frequency-penalty 1 --presence-penalty 0.5 --min-p 0.1";
  EXPECT_EQ(run(sampled).out, run(sampled).out);
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
  const std::vector<ErrorCase> cases = {
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
  for (const ErrorCase& c : cases) {
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

// bench --host-sampling: the steps run with their logits sampled on the host, and the report says so.
TEST(Cli, BenchSamplesOnTheHostWhenAsked) {
  for (const bool host : {false, true}) {
    const Result r =
        run(fmt::format("{} bench -m {} --device cpu --context 16 --steps 3 --repeats 1 --json{}", kBin,
                        kTiny, host ? " --host-sampling" : ""));
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["host_sampling"].get<bool>(), host) << r.out;
    EXPECT_GT(j["decode_ms_per_step"].get<double>(), 0.0) << r.out;
  }
}

// bench --layer-split: one section row per kind of layer the model has, with its count; plan
// --layer-times turns them back into the same step at the measured layout and scales them by the bytes a
// rank moves in another, and refuses times measured on another model or batch.
TEST(Cli, LayerSplitTimesSectionsAndPlanExtrapolatesThem) {
  const std::string times = kScratch + "/layer_times.json";
  Result r =
      run(fmt::format("{} bench -m {} --device cpu --context 64 --batch 2 --steps 6 --repeats 1 "
                      "--layer-split --json",
                      kBin, kTiny));
  ASSERT_EQ(r.code, 0) << r.err;
  std::ofstream(times) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  std::map<std::string, int> layers;
  double sections = 0;
  for (const nlohmann::json& sec : j["sections"]) {
    layers[sec["name"].get<std::string>()] = sec["layers"].get<int>();
    EXPECT_GT(sec["ms_per_step"].get<double>(), 0.0) << sec.dump();
    EXPECT_NEAR(sec["floor_ratio"].get<double>(),
                sec["ms_per_layer"].get<double>() / sec["floor_ms_per_layer"].get<double>(), 1e-9)
        << sec.dump();
    sections += sec["ms_per_step"].get<double>();
  }
  const std::map<std::string, int> expected = {{"embedding", 1}, {"kda_attention", 3}, {"mla_attention", 1},
                                               {"dense_ffn", 1}, {"moe_ffn", 3},       {"head", 1}};
  EXPECT_EQ(layers, expected) << r.out;

  const std::string plan = fmt::format("{} plan --config {}/config.json --context 64", kBin, kTiny);
  r = run(fmt::format("{} --batch 2 --layer-times {}", plan, times));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(fmt::format("total {:.3f} ms per step", sections)), std::string::npos)
      << "measured sections " << sections << " ms\n"
      << r.out;
  const auto total_of = [](const std::string& out) {
    const size_t at = out.rfind("  total ");  // the extrapolation, after the sizes
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 8));
  };
  const Result tp2 = run(fmt::format("{} --tp 2 --batch 2 --layer-times {}", plan, times));
  ASSERT_EQ(tp2.code, 0) << tp2.err;
  EXPECT_GT(total_of(tp2.out), 0.0) << tp2.out;
  EXPECT_LT(total_of(tp2.out), 0.75 * total_of(r.out)) << tp2.out;  // every section's rank bytes shrink

  r = run(fmt::format("{} --batch 1 --layer-times {}", plan, times));
  EXPECT_NE(r.err.find("measured at batch 2, but --batch is 1"), std::string::npos) << r.err;
  r = run(fmt::format("{} plan --config {}/configs/kimi-k3.json --batch 2 --layer-times {}", kBin, kFixtures,
                      times));
  EXPECT_NE(r.err.find("measured on a kimi_linear model"), std::string::npos) << r.err;
  r = run(fmt::format("{} --batch 2 --layer-times {}/none.json", plan, kScratch));
  EXPECT_NE(r.err.find("none.json: cannot open the file"), std::string::npos) << r.err;
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

// `helixlm chat --json-schema`: the answer is an instance of the file's schema (a seed whose sampled
// answer closes within -n), properties in their declared order; a schema outside the subset is refused
// before the model loads, naming the file and the keyword.
TEST(Cli, ChatAnswersFollowAJsonSchema) {
  const std::string schema = kScratch + "/answer_schema.json";
  std::ofstream(schema) << R"({"type": "object", "properties": {"a": {"enum": [1, 2]},
      "b": {"type": "string", "maxLength": 5}}, "required": ["a", "b"], "additionalProperties": false})";
  const std::string in = kScratch + "/chat_in.txt";
  std::ofstream(in) << "Hello\n";
  const Result r = run(fmt::format("{} chat -m {} --json-schema {} -n 60 --temperature 0.8 --seed 1 <{}",
                                   kBin, kTiny, schema, in));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto answer = nlohmann::ordered_json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(answer.is_object()) << r.out;
  ASSERT_EQ(answer.size(), 2u) << r.out;
  EXPECT_EQ(answer.begin().key(), "a");
  EXPECT_TRUE(answer["a"] == 1 || answer["a"] == 2) << r.out;
  ASSERT_TRUE(answer["b"].is_string()) << r.out;

  const std::string bad = kScratch + "/bad_schema.json";
  std::ofstream(bad) << R"({"type": "integer", "minimum": 1})";
  const std::vector<ErrorCase> cases = {
      {fmt::format("chat -m {} --json-schema {} </dev/null", kTiny, bad),
       bad + ": \"minimum\" is not supported"},
      {fmt::format("chat -m {} --json-schema {}/none.json </dev/null", kTiny, kScratch),
       "--json-schema: cannot read " + kScratch + "/none.json"},
      {fmt::format("chat -m {} --json-schema {} --json </dev/null", kTiny, schema),
       "--json-schema excludes --json"},
  };
  for (const ErrorCase& c : cases) {
    const Result e = run(kBin + " " + c.args, 60);
    EXPECT_EQ(e.code, 1) << c.args << "\n" << e.err;
    EXPECT_NE(e.err.find("helixlm: error: " + c.message), std::string::npos) << c.args << "\n" << e.err;
    EXPECT_EQ(e.err.find("loaded"), std::string::npos) << "refused after loading the model:\n" << e.err;
  }
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

// Regression (issue 12, defects 1 and 2): sizes from the command line wrapped (a heap overflow in
// cache_write), were never checked against memory (OOM killer, bad_alloc, hangs), and plan printed
// negative totals. Each now fails at once with the option named.
TEST(Cli, OversizedRequestsFailFastNamingTheOption) {
  const std::string gen = "generate -m " + kTiny + " --prompt-ids 5,17,300 ";
  const std::vector<ErrorCase> cases = {
      {gen + "-n 4 --max-batch 1 --tokens-per-block 115292150460684698 --max-seq-len 115292150460684698 "
             "--no-warmup",
       "--max-seq-len must be in [1, 2147483647]"},
      {gen + "-n 4 --max-batch 1 --tokens-per-block 115292150460684698 --no-warmup",
       "--tokens-per-block must be in [1, 65536]"},
      {gen + "-n 1000000000", "of 1000000003 tokens (-n) need 1192.09 GiB on this rank"},
      // The warmup's sequence (--cp 1 x --tokens-per-block 64 + 2), not -n, sized these caches: the
      // remedy used to say "lower -n" (CLI QA, defect 10).
      {gen + "--max-batch 2147483647",
       "the caches for 2147483647 sequences (--max-batch) of 66 tokens (the warmup: --cp 1 x "
       "--tokens-per-block 64 + 2) need 2147483647 x 2 MLA pages of 64 tokens on this rank, more than the "
       "2147483647 page ids (int32) allow; lower --max-batch or skip the warmup (--no-warmup)"},
      {gen + "--max-seq-len 1099511627776", "--max-seq-len must be in [1, 2147483647]"},
      {gen + "--max-seq-len 2000000000", "lower --max-seq-len or --max-batch"},
      {gen + "--tp 65536 --cp 65536", "--tp 65536 x --cp 65536 = 4294967296"},
      {"bench -m " + kTiny + " --context 1000000000000", "--context 1000000000000 + --steps 32 exceeds"},
      {"bench -m " + kTiny + " --batch 100000 --context 64",
       "the caches for 100000 sequences (--batch) of 96 tokens (--context) need 5.48 GiB"},
      // serve's caches are sized by its own options (they named --max-batch / --max-seq-len, which serve
      // does not have), and its HTTP pool by --max-num-seqs and --max-queued-requests: 100,000 sequences
      // asked for 200,000 threads and ended the process with an uncaught std::system_error.
      {"serve -m " + kTiny + " --device cpu --port 0 --max-num-seqs 4096 --max-model-len 1000000",
       "the caches for 4096 sequences (--max-num-seqs) of 1000000 tokens (--max-model-len) need"},
      {"serve -m " + kTiny + " --device cpu --port 0 --max-num-seqs 100000",
       "--max-num-seqs must be in [1, 4096] (got 100000)"},
      {"serve -m " + kTiny + " --device cpu --port 0 --max-queued-requests 5000",
       "--max-queued-requests must be in [0, 4096] (got 5000)"},
      {"bench -m " + kTiny + " --device cpu --context 16 --steps 3 --kernel-trace /dev/null",
       "--kernel-trace: this backend runs no device kernels to trace (it needs --device cuda)"},
      {"bench -m " + kTiny + " --device cpu --context 16 --steps 1 --kernel-trace /dev/null",
       "--kernel-trace records one of the decode steps: it needs --steps >= 2"},
  };
  for (const ErrorCase& c : cases) {
    // 1 GB of host memory, as a smaller machine would have: the bench case needs 5.5 GB of caches.
    const Result r = run("env HLM_HOST_MEMORY_BYTES=1000000000 " + kBin + " " + c.args, 30);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find("helixlm: error: "), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
  }
  const Result plan =
      run(fmt::format("{} plan --config {}/configs/kimi-linear-48b-a3b.json --context "
                      "1000000000000000000 --batch 1000000",
                      kBin, kFixtures));
  EXPECT_EQ(plan.code, 1) << plan.out;
  EXPECT_NE(
      plan.err.find("--context 1000000000000000000: MLA KV bytes of one sequence: 1000000000000000000 x "
                    "8064 overflows 64-bit sizes"),
      std::string::npos)
      << plan.err;
  EXPECT_EQ(plan.out.find("-9"), std::string::npos) << plan.out;  // no negative totals
  const Result batch =
      run(fmt::format("{} plan --config {}/configs/kimi-linear-48b-a3b.json --context 4096 --batch "
                      "1000000000000000000",
                      kBin, kFixtures));
  EXPECT_EQ(batch.code, 1) << batch.out;
  EXPECT_NE(batch.err.find("--batch x bytes per sequence: 1000000000000000000 x"), std::string::npos)
      << batch.err;
}

// Regression (issue 12, defect 6): options and inputs that used to be accepted silently.
TEST(Cli, SilentAcceptancesAreErrors) {
  const std::string gen = "generate -m " + kTiny + " --prompt-ids 5 ";
  const std::vector<ErrorCase> cases = {
      {"--log-level bogus inspect -m " + kTiny, "--log-level 'bogus' is not one of trace"},
      {gen + "--max-seq-len -5", "--max-seq-len must be in [1, 2147483647] (or 0: what the command needs)"},
      {gen + "--max-batch 0", "--max-batch must be positive (got 0)"},
      {gen + "--threads -1", "--threads must be >= 0 (0: cores / ranks), got -1"},
      {gen + "--comm-timeout 0", "--comm-timeout must be positive"},
      {"logits -m " + kTiny + " --ids 1,2 -o /nonexistent-dir/x.npy",
       "-o /nonexistent-dir/x.npy: cannot write there: No such file or directory"},
      {"logits -m " + kTiny + " --ids 1,2 -o " + kScratch,
       "-o " + kScratch + ": cannot write there: Is a directory"},
  };
  for (const ErrorCase& c : cases) {
    const Result r = run(kBin + " " + c.args, 30);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find("helixlm: error: " + c.message), std::string::npos) << c.args << "\n" << r.err;
  }
  EXPECT_EQ(run(kBin + " --log-level warn " + gen + "--threads 0 -n 2").code, 0);  // 0: cores / ranks

  const std::string eos_dir = kScratch + "/eos-model";
  std::filesystem::create_directories(eos_dir);
  nlohmann::json cfg = nlohmann::json::parse(slurp(kTiny + "/config.json"));
  cfg["eos_token_id"] = 512;
  std::ofstream(eos_dir + "/config.json") << cfg.dump();
  std::filesystem::copy_file(kTiny + "/model.safetensors", eos_dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  Result r = run(fmt::format("{} generate -m {} --prompt-ids 5", kBin, eos_dir));
  EXPECT_NE(r.err.find("`eos_token_id` = 512 is outside the vocabulary [0, 512)"), std::string::npos)
      << r.err;

  const std::string extra = edited_model("extra-tensor", [](nlohmann::json& h, std::vector<char>& data) {
    h["model.layers.9.mlp.unexpected.weight"] = {
        {"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {data.size(), data.size() + 4}}};
    data.resize(data.size() + 4, 0);
  });
  r = run(fmt::format("{} generate -m {} --prompt-ids 5 -n 2", kBin, extra));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("1 tensor(s) not used by the model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.layers.9.mlp.unexpected.weight"), std::string::npos) << r.err;

  const std::string dup = kScratch + "/dup-header";
  std::filesystem::create_directories(dup);
  std::filesystem::copy_file(kTiny + "/config.json", dup + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const std::string header = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}})";
  const uint64_t len = header.size();
  std::ofstream st(dup + "/model.safetensors", std::ios::binary | std::ios::trunc);
  st.write(reinterpret_cast<const char*>(&len), 8);
  st << header << std::string(4, '\0');
  st.close();
  r = run(fmt::format("{} generate -m {} --prompt-ids 5", kBin, dup));
  EXPECT_NE(r.err.find("header: key \"a\" appears twice in one JSON object"), std::string::npos) << r.err;
}

// Kept from before (issue 12, defect 6): a sharded checkpoint whose index and shards leave out a tensor
// the model needs is an error naming the tensor and the directory.
TEST(Cli, IndexLeavingOutANeededTensorIsAnError) {
  std::vector<std::string> names;
  const std::string dir = edited_model("sharded", [&](nlohmann::json& h, std::vector<char>&) {
    h.erase("lm_head.weight");
    for (const auto& [name, entry] : h.items()) {
      if (name != "__metadata__") names.push_back(name);
    }
  });
  std::filesystem::rename(dir + "/model.safetensors", dir + "/model-00001-of-00001.safetensors");
  nlohmann::json index;
  for (const std::string& n : names) index["weight_map"][n] = "model-00001-of-00001.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  const Result r = run(fmt::format("{} generate -m {} --prompt-ids 5", kBin, dir));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("tensor 'lm_head.weight' is not in checkpoint " + dir), std::string::npos) << r.err;
}

// Regression (issue 12, defect 3): an lm_head of NaNs made generate print 0,0,0,... and exit 0.
TEST(Cli, NonFiniteWeightsAndLogitsAreErrorsNeverTokens) {
  const std::string nan = edited_model("nan-lm-head", [](nlohmann::json& h, std::vector<char>& data) {
    fill_bf16(h, data, "lm_head.weight", 0x7fc0);
  });
  Result r = run(fmt::format("{} generate -m {} --prompt-ids 5,17,300 -n 4", kBin, nan));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("tensor 'lm_head.weight' in " + nan +
                       "/model.safetensors holds a non-finite value (NaN "
                       "at [0, 0])"),
            std::string::npos)
      << r.err;
  // Finite weights whose logits overflow: row 7 of lm_head at the largest bf16 value.
  const std::string inf = edited_model("huge-lm-head", [](nlohmann::json& h, std::vector<char>& data) {
    const size_t begin = h["lm_head.weight"]["data_offsets"][0].get<size_t>() + 7 * 64 * 2;
    const uint16_t max_bf16 = 0x7f7f;
    for (size_t i = 0; i < 64; ++i) std::memcpy(data.data() + begin + 2 * i, &max_bf16, 2);
  });
  r = run(fmt::format("{} generate -m {} --prompt-ids 5,17,300 --prompt-ids 9 -n 4", kBin, inf));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out, "\n\n");  // one (empty) line per prompt: nothing was generated before the failure
  EXPECT_NE(r.err.find("prompt 0: step 1 of its generation gave non-finite logits: logit 7 of 512 is"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("prompt 1: step 1 of its generation gave non-finite logits"), std::string::npos)
      << r.err;
}

// Regression (issue 12, defect 7): generate printed only at the end, so Ctrl-C lost everything. Now each
// line streams, and SIGINT ends the run after the current step with one complete line per prompt.
TEST(Cli, InterruptedGenerateKeepsWhatItGenerated) {
  const std::string args = fmt::format(
      "{} --log-level warn generate -m {} --prompt-ids 5,17,300 --prompt-ids 9 --ignore-eos --threads 1",
      kBin, kTiny);
  const Result full = run(args + " -n 40");
  ASSERT_EQ(full.code, 0) << full.err;
  const Result r = run_script(fmt::format(R"(
{} -n 1000000 --max-seq-len 1000010 --max-batch 2 >{}/int_out.txt 2>{}/int_err.txt &
pid=$!
for i in $(seq 600); do [ -s {}/int_out.txt ] && break; sleep 0.1; done
sleep 1
kill -INT $pid
wait $pid
echo $? >{}/int_rc.txt
)",
                                          args, kScratch, kScratch, kScratch, kScratch),
                              120);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(kScratch + "/int_rc.txt"), "130\n");
  EXPECT_NE(slurp(kScratch + "/int_err.txt").find("interrupted by signal 2"), std::string::npos);
  const std::string out = slurp(kScratch + "/int_out.txt");
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u) << out;
  ASSERT_EQ(out.back(), '\n');
  std::istringstream want(full.out);
  for (const std::string& got : lines) {
    std::string expect;
    std::getline(want, expect);
    // What was generated before the interrupt is what an uninterrupted run generates.
    const size_t n = std::min(got.size(), expect.size());
    EXPECT_GT(got.size(), 0u);
    EXPECT_EQ(got.substr(0, n), expect.substr(0, n));
  }
}

// Regression (issue 12, defect 4): a stopped rank left the others spinning at 100% CPU forever. Now the
// others idle without burning a core and end, within --comm-timeout, naming the rank that did not answer.
std::string stall_script(int stop_rank, const std::string& extra) {
  return fmt::format(R"SH(
dir={}
rm -f $dir/rank0.pid $dir/rank1.pid $dir/stall_out.txt $dir/stall_err.txt
{} sh -c 'echo $$ > {}/rank$OMPI_COMM_WORLD_RANK.pid; exec "$@"' sh {} --log-level warn generate -m {} \
  --prompt-ids 5,17,300 -n 1000000 --max-seq-len 1000010 --max-batch 1 --ignore-eos --cp 2 --threads 1 {} \
  >$dir/stall_out.txt 2>$dir/stall_err.txt &
job=$!
for i in $(seq 600); do [ -s $dir/stall_out.txt ] && [ -s $dir/rank0.pid ] && [ -s $dir/rank1.pid ] && break; sleep 0.1; done
stopped=$(cat $dir/rank{}.pid)
other=$(cat $dir/rank{}.pid)
kill -STOP $stopped
t0=$(date +%s%N)
sleep 1
c0=$(awk '{{print $14 + $15}}' /proc/$other/stat)
sleep 2
c1=$(awk '{{print $14 + $15}}' /proc/$other/stat)
wait $job
rc=$?
t1=$(date +%s%N)
kill -CONT $stopped 2>/dev/null; kill -KILL $stopped 2>/dev/null
echo "$rc $(( (t1 - t0) / 1000000 )) $(( c1 - c0 ))" >$dir/stall_result.txt
)SH",
                     kScratch, "mpirun -np 2 --oversubscribe --bind-to none", kScratch, kBin, kTiny, extra,
                     stop_rank, 1 - stop_rank);
}

struct StallResult {
  int code = 0;
  int64_t exit_ms = 0;     // from the stop to the end of the job
  int64_t idle_ticks = 0;  // CPU clock ticks the waiting rank used in 2 s
};

StallResult run_stall(int stop_rank, const std::string& extra) {
  const Result r = run_script(stall_script(stop_rank, extra), 240);
  EXPECT_EQ(r.code, 0) << r.err;
  StallResult s;
  std::istringstream(slurp(kScratch + "/stall_result.txt")) >> s.code >> s.exit_ms >> s.idle_ticks;
  return s;
}

TEST(Cli, StoppedRankEndsTheJobNamingIt) {
  const StallResult s = run_stall(1, "--comm-timeout 3");
  const std::string err = slurp(kScratch + "/stall_err.txt");
  EXPECT_NE(s.code, 0);
  EXPECT_LT(s.exit_ms, 3000 + 20000) << "the job must end within --comm-timeout plus the probe and abort";
  EXPECT_NE(err.find("helixlm: rank 0: error: rank 1 did not answer within --comm-timeout 3 s"),
            std::string::npos)
      << err;
  EXPECT_FALSE(slurp(kScratch + "/stall_out.txt").empty());  // the streamed ids survive
}

TEST(Cli, WaitingRanksIdleAndNameTheStoppedDriver) {
  // Rank 0 (the driver) stops: rank 1 waits for its next collective or step plan.
  const StallResult s = run_stall(0, "--comm-timeout 6");
  const std::string err = slurp(kScratch + "/stall_err.txt");
  // A busy-polling rank uses ~200 ticks (100 Hz) in 2 s; a sleeping one a handful.
  EXPECT_LT(s.idle_ticks, 30) << "the waiting rank burns a core";
  EXPECT_NE(s.code, 0);
  EXPECT_LT(s.exit_ms, 6000 + 20000);
  EXPECT_NE(err.find("helixlm: rank 1: error: rank 0 did not answer within --comm-timeout 6 s"),
            std::string::npos)
      << err;
}

// Regression (CLI QA, defect 1): config sizes had no upper bound, so a config alone made inspect, plan,
// generate and bench allocate until the OOM killer, or overflow int64 ("negative dimension in shape").
// Every command now refuses it at once, naming the file, the field, its value and the limit.
TEST(Cli, ConfigSizesBeyondTheirLimitsFailEveryCommand) {
  struct Huge {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const std::vector<Huge> cases = {
      {"experts", [](nlohmann::json& c) { c["num_experts"] = int64_t{1} << 40; },
       "`num_experts` = 1099511627776 exceeds 65536, the most helixlm supports"},
      {"intermediate", [](nlohmann::json& c) { c["intermediate_size"] = int64_t{1} << 62; },
       "`intermediate_size` = 4611686018427387904 exceeds 1048576"},
      {"conv", [](nlohmann::json& c) { c["linear_conv_kernel_dim"] = 1000000000; },
       "`linear_conv_kernel_dim` = 1000000000 exceeds 256"},
      {"vocab", [](nlohmann::json& c) { c["vocab_size"] = int64_t{1} << 34; },
       "`vocab_size` = 17179869184 exceeds 16777216"},
      {"hidden", [](nlohmann::json& c) { c["hidden_size"] = int64_t{1} << 62; },
       "`hidden_size` = 4611686018427387904 exceeds 131072"},
      {"layers",
       [](nlohmann::json& c) {
         c["num_hidden_layers"] = 5000;
         c["layer_types"] = std::vector<std::string>(5000, "linear_attention");
         c["mlp_layer_types"] = std::vector<std::string>(5000, "dense");
       },
       "`num_hidden_layers` = 5000 exceeds 4096"},
  };
  for (const Huge& c : cases) {
    const std::string dir = edited_config("huge-" + c.name, c.edit);
    for (const std::string& cmd :
         {"inspect -m " + dir, "plan -m " + dir, "plan --config " + dir + "/config.json",
          "generate -m " + dir + " --prompt-ids 1",
          "bench --random-weights --config " + dir + "/config.json --device cpu --context 16 --steps 2"}) {
      const Result r = run(kBin + " " + cmd, 60);
      EXPECT_EQ(r.code, 1) << cmd << "\n" << r.err;
      EXPECT_NE(r.err.find("helixlm: error: " + dir + "/config.json: " + c.message), std::string::npos)
          << cmd << "\n"
          << r.err;
      EXPECT_EQ(r.out, "") << cmd;
    }
  }
}

// Regression (CLI QA, defect 2): a weight stored as integers of the right byte size loaded, inspect
// called the checkpoint fine, and the first step failed in an op naming no tensor. Every command that
// reads the checkpoint now refuses it from the header, naming the tensor, its file and the valid dtypes.
TEST(Cli, WeightsOfTheWrongDtypeAreRefusedBeforeLoading) {
  for (const std::string tensor :
       {"model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.self_attn.dt_bias"}) {
    const std::string dir = edited_model("i32-" + tensor, [&](nlohmann::json& h, std::vector<char>&) {
      h[tensor]["dtype"] = "I32";  // the same byte size as its F32
    });
    const std::string message = "tensor '" + tensor + "' in " + dir +
                                "/model.safetensors: stored as I32, but it is a float weight; valid: F32, "
                                "F16 or BF16";
    for (const std::string& cmd :
         {"inspect -m " + dir, "plan -m " + dir, "generate -m " + dir + " --prompt-ids 5,17 -n 2"}) {
      const Result r = run(kBin + " " + cmd, 60);
      EXPECT_EQ(r.code, 1) << cmd << "\n" << r.err;
      EXPECT_NE(r.err.find("helixlm: error: " + message), std::string::npos) << cmd << "\n" << r.err;
      EXPECT_EQ(r.out, "") << cmd;
    }
  }
}

// Regression (CLI QA, defect 6): plan -m approved a checkpoint whose tensors do not match its config,
// which inspect and the loader refuse; it now checks the headers as the loader does.
TEST(Cli, PlanOfACheckpointChecksItsTensorsAsTheLoaderDoes) {
  const std::string dir = edited_config("vocab-1000", [](nlohmann::json& c) { c["vocab_size"] = 1000; });
  const Result r = run(fmt::format("{} plan -m {}", kBin, dir), 60);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("tensor 'model.embed_tokens.weight' in " + dir +
                       "/model.safetensors: expected shape [1000, 64] for this config (" + dir +
                       "/config.json), found [512, 64]"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
}

// Regression (CLI QA, defects 3 and 10): on the CPU nothing checked that the weights fit the host (the 48B
// config went for the OOM killer), and a refusal of the caches told to lower -n when the warmup or the
// model had sized them. Both now fail before loading, naming the sizes and what sized them.
TEST(Cli, HostMemoryRefusalsNameWhatSizedThem) {
  const std::string b48 = kFixtures + "/configs/kimi-linear-48b-a3b.json";
  const std::string gen = "generate -m " + kTiny + " --prompt-ids 5,17,300 -n 4 ";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"8000000000 bench --random-weights --config " + b48 + " --device cpu --context 16 --steps 2",
       {"the weights of this rank need 183.0 GiB of host memory (the CPU backend holds float weights as "
        "F32), "
        "but host memory (HLM_HOST_MEMORY_BYTES) has 7.5 GiB available; use more ranks (--tp/--cp, over "
        "several "
        "hosts), a GPU (--device cuda), or fewer layers (--num-layers)"}},
      {"1000000 " + gen,
       {"the weights of this rank need 2.1 MiB of host memory", "has 976.6 KiB available",
        "a smaller model"}},
      {"1000000000 " + gen + "--tokens-per-block 65536 --max-batch 2000",
       {"the caches for 2000 sequences (--max-batch) of 65538 tokens (the warmup: --cp 1 x "
        "--tokens-per-block "
        "65536 + 2) need",
        "but host memory (HLM_HOST_MEMORY_BYTES) less this rank's weights (2.1 MiB) has 0.93 GiB available; "
        "lower "
        "--max-batch or skip the warmup (--no-warmup)"}},
      {"3000000 " + gen + "--max-batch 200",
       {"lower --max-batch: the KDA state of one sequence takes",
        "whatever its length (set by the 3 KDA layers of " + kTiny + "/config.json)"}},
      {"1000000000 chat -m " + kTiny + " --max-batch 2000 </dev/null",
       {"the caches for 2000 sequences (--max-batch) of 4096 tokens (the default length, no --max-seq-len "
        "given) need",
        "; lower --max-seq-len or --max-batch"}},
  };
  for (const auto& [args, messages] : cases) {
    const Result r = run("env HLM_HOST_MEMORY_BYTES=" + args.substr(0, args.find(' ')) + " " + kBin + " " +
                             args.substr(args.find(' ') + 1),
                         120);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.err;
    for (const std::string& m : messages)
      EXPECT_NE(r.err.find(m), std::string::npos) << args << "\n" << r.err;
  }
}

// Regression (CLI QA, defect 4): generate, inspect, plan, bench and chat exited 0 when stdout could not
// be written. Every command now fails naming it; generate stops at the first failed write instead of
// generating on (a -n that would run for minutes ends at once).
TEST(Cli, UnwritableStdoutIsAnErrorForEveryCommand) {
  const std::vector<std::string> commands = {
      "generate -m " + kTiny + " --prompt-ids 5,17,300 -n 100000 --ignore-eos",
      "inspect -m " + kTiny,
      "plan --config " + kTiny + "/config.json",
      "bench -m " + kTiny + " --device cpu --context 16 --steps 2 --repeats 1",
      "tokenize --tokenizer " + kTiny,
      "tokenize --jsonl --tokenizer " + kTiny,
      "chat -m " + kTiny + " -n 4",
      "--help",
  };
  for (const std::string& cmd : commands) {
    const Result r = run_script(
        fmt::format("echo '{{\"text\": \"hi\"}}' | {} --log-level warn {} >/dev/full", kBin, cmd), 60);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("helixlm: error: cannot write to stdout"), std::string::npos) << cmd << "\n"
                                                                                       << r.err;
  }
}

// Regression (CLI QA, defects 5, 7, 8, 9 and 11): options that were ignored, accepted out of range,
// checked only after loading, or refused in CLI11's words without naming the word at fault.
TEST(Cli, CommandLineMistakesNameTheOption) {
  const std::string gen = "generate -m " + kTiny + " --prompt-ids 5 ";
  const std::string cfg = kTiny + "/config.json";
  const std::vector<ErrorCase> cases = {
      {"bench -m " + kTiny + " --config " + cfg,
       "--config " + cfg +
           " applies only with --random-weights (without it bench runs the checkpoint of -m " + kTiny +
           "); add --random-weights, or drop --config"},
      {"bench -m " + kTiny + " --num-layers 2", "--num-layers 2 applies only with --random-weights"},
      {"bench --random-weights --config " + cfg + " --num-layers -1 --device cpu",
       "--num-layers must be >= 0 (0: all layers), got -1"},
      {gen + "--tp 0", "--tp and --cp must be at least 1 (got --tp 0 --cp 1)"},
      {gen + "--cp -1", "--tp and --cp must be at least 1 (got --tp 1 --cp -1)"},
      {"chat -m " + kTiny + " -n -1 </dev/null", "-n/--max-tokens must be in [0, 2147483647] (got -1)"},
      {"chat -m " + kTiny + " --top-p 0 </dev/null", "--top-p must be in (0, 1]"},
      {gen + "--min-p 2", "--min-p must be in [0, 1] (got 2)"},
      {"chat -m " + kTiny + " --repetition-penalty 0 </dev/null", "--repetition-penalty must be > 0 (got 0)"},
      {"bogus", "unknown command 'bogus'; the commands are generate, logits, inspect, plan, bench"},
      {"--bogus", "unknown option '--bogus'; the commands are generate"},
      {"", "a command is required: one of generate, logits"},
      {gen + "--bogus", "The following argument was not expected: --bogus (see `helixlm generate --help`)"},
      {gen + "--device gpu", "--device: 'gpu' is not one of cpu, cuda, auto (see `helixlm generate --help`)"},
      {gen + "--seed -1", "--seed: '-1' is not an integer in [0, 18446744073709551615]"},
      {gen + "--seed 18446744073709551616", "--seed: '18446744073709551616' is not an integer in [0, "},
      {gen + "--gpu-memory-fraction nan", "--gpu-memory-fraction must be in [0.05, 1] (got nan)"},
      {"logits -m " + kTiny + " --ids 1,2 --prefill-len -5 -o " + kScratch + "/x.npy",
       "--prefill-len must be >= 0, or -1 for all the ids (got -5)"},
  };
  for (const ErrorCase& c : cases) {
    const Result r = run(kBin + " " + c.args, 60);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find("helixlm: error: " + c.message), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
  Result r = run(kBin + " --help", 60);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("generate"), std::string::npos) << r.out;
  r = run(kBin + " generate --help", 60);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--device ENUM:{cpu,cuda,auto}"), std::string::npos) << r.out;
  // A layout past int's range is INVALID with its true rank count, not a wrapped negative one.
  r = run(fmt::format("{} plan --config {} --tp 46341 --cp 46341", kBin, cfg), 60);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("layout tp=46341 cp=46341 (N = 2147488281): INVALID"), std::string::npos) << r.out;
}

// Regression (CLI QA, defect 12): a malformed --jsonl line said only "expected a JSON object", and
// duplicate keys were accepted though every other JSON helixlm reads refuses them.
TEST(Cli, TokenizeJsonlSaysWhyALineIsNotAnObject) {
  const std::string expected = "stdin line 1: expected a JSON object {\"text\": \"...\"}";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"{\"text\": \"\xff\"}\n", {expected + ": invalid JSON (byte ", "UTF-8"}},
      {"{\"text\": \"\\ud800\"}\n", {expected + ": invalid JSON (byte ", "surrogate"}},
      {"{\"text\": \"a\"} {\"text\": \"b\"}\n",
       {expected + ": invalid JSON (byte ", "expected end of input"}},
      {"{\"text\": \"a\", \"text\": \"b\"}\n",
       {expected + ": key \"text\" appears twice in one JSON object"}},
      {"[\"a\"]\n", {expected + ", got array"}},
  };
  for (const auto& [input, messages] : cases) {
    const Result r = tokenize("--jsonl", input);
    EXPECT_EQ(r.code, 1) << input;
    EXPECT_NE(r.err.find("helixlm: error: " + messages.front()), std::string::npos) << r.err;
    for (const std::string& m : messages) EXPECT_NE(r.err.find(m), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace hlm
