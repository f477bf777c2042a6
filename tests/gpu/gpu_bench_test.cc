// `bench --layer-split` on one GPU: the sections of decode steps replayed as CUDA graphs are timed as those
// of eager steps are (the marks are captured as event-record nodes), one row per kind of layer with its
// count, each with device time, all of it inside the host's time around the step. `bench --kernel-trace`:
// the kernels of a replayed decode step, from CUPTI, as a Chrome trace.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ops/backend.h"

namespace hlm {
namespace {

const std::string kBin = HLM_BINARY;
const std::string kTiny = std::string(HLM_FIXTURES_DIR) + "/kimi-tiny-dense-first";

// The section rows of `bench --layer-split --json` and the step time.
struct Split {
  std::map<std::string, int> layers;
  std::map<std::string, double> ms;
  double step_ms = 0;
};

Split layer_split(bool graphs) {
  const std::string out_path = std::string(HLM_SCRATCH_DIR) + "/gpu_layer_split.json";
  const std::string cmd = fmt::format(
      "timeout 300 {} bench -m {} --device cuda --context 256 --batch 2 --steps 8 --repeats 1 --layer-split "
      "--json {} >{}",
      kBin, kTiny, graphs ? "" : "--no-cuda-graphs", out_path);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::stringstream text;
  text << std::ifstream(out_path).rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str());
  Split s;
  s.step_ms = j["decode_ms_per_step"].get<double>();
  for (const nlohmann::json& sec : j["sections"]) {
    s.layers[sec["name"].get<std::string>()] = sec["layers"].get<int>();
    s.ms[sec["name"].get<std::string>()] = sec["ms_per_step"].get<double>();
  }
  return s;
}

TEST(GpuBench, LayerSplitTimesGraphReplaysLikeEagerSteps) {
  std::string why;
  if (cuda_device_count(&why) < 1) GTEST_SKIP() << "needs a GPU: " << why;
  const Split eager = layer_split(false), graphs = layer_split(true);
  const std::map<std::string, int> expected = {{"embedding", 1}, {"kda_attention", 3}, {"mla_attention", 1},
                                               {"dense_ffn", 1}, {"moe_ffn", 3},       {"head", 1}};
  EXPECT_EQ(eager.layers, expected);
  EXPECT_EQ(graphs.layers, expected);
  for (const Split* s : {&eager, &graphs}) {
    double sum = 0;
    for (const auto& [name, ms] : s->ms) {
      EXPECT_GT(ms, 0.0) << name;
      sum += ms;
    }
    // Medians of device time between marks, within the median host time around the whole step.
    EXPECT_LT(sum, 1.1 * s->step_ms) << "sections " << sum << " ms, step " << s->step_ms << " ms";
    std::cout << "[gpu layer split] " << (s == &eager ? "eager" : "graphs") << ": sections " << sum
              << " ms of a " << s->step_ms << " ms step\n";
  }
}

TEST(GpuBench, KernelTraceRecordsADecodeStepsKernels) {
  std::string why;
  if (cuda_device_count(&why) < 1) GTEST_SKIP() << "needs a GPU: " << why;
  const std::string trace = std::string(HLM_SCRATCH_DIR) + "/gpu_kernel_trace.json",
                    log = std::string(HLM_SCRATCH_DIR) + "/gpu_kernel_trace.log";
  std::remove(trace.c_str());
  const std::string cmd = fmt::format(
      "timeout 300 {} bench -m {} --device cuda --context 256 --batch 2 --steps 6 --repeats 1 --kernel-trace "
      "{} "
      ">{} 2>&1",
      kBin, kTiny, trace, log);
  const int rc = std::system(cmd.c_str());
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  // A machine whose CUDA install has no libcupti (or a build without its headers) says so and stops.
  for (const char* reason : {"could not be loaded", "this build has no CUPTI"}) {
    const size_t at = text.str().find(reason);
    if (rc != 0 && at != std::string::npos)
      GTEST_SKIP() << text.str().substr(text.str().rfind('\n', at) + 1, 300);
  }
  ASSERT_EQ(rc, 0) << cmd << "\n" << text.str();
  EXPECT_NE(text.str().find("kernel trace: "), std::string::npos) << text.str();
  std::stringstream json;
  json << std::ifstream(trace).rdbuf();
  const nlohmann::json t = nlohmann::json::parse(json.str());
  const nlohmann::json& events = t["traceEvents"];
  // One decode step of the tiny model: its layers' kernels (KDA, MLA, the experts) and the sampling.
  ASSERT_GT(events.size(), 10u);
  std::map<std::string, int> names;
  for (const nlohmann::json& e : events) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    EXPECT_GT(e["dur"].get<double>(), 0.0) << e.dump();
    ++names[e["name"].get<std::string>()];
  }
  EXPECT_EQ(names.count("mla_attention_kernel"), 1u);
  const auto kda = names.lower_bound("kda_decode");  // the fused layer kernel or the separate ones
  ASSERT_NE(kda, names.end());
  EXPECT_EQ(kda->first.rfind("kda_decode", 0), 0u) << kda->first;
  std::cout << "[gpu kernel trace] " << events.size() << " kernels, " << names.size() << " distinct\n";
}

}  // namespace
}  // namespace hlm
