#include "fixtures.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/npy.h"
#include "model/memory_plan.h"
#include "ops/backend.h"
#include "runtime/device_comm.h"

namespace hlm::test {

namespace fs = std::filesystem;

namespace {
constexpr const char* kTwinSuffix = "-moonshot";

// Where a fixture's references live: its own directory, or its base fixture's for a "-moonshot" twin.
std::string reference_dir(const std::string& name) {
  std::string dir = std::string(HLM_FIXTURES_DIR) + "/" + name;
  if (name.ends_with(kTwinSuffix)) dir.resize(dir.size() - std::string(kTwinSuffix).size());
  return dir;
}
}  // namespace

std::vector<std::string> golden_case_names() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(HLM_FIXTURES_DIR)) {
    const std::string name = entry.path().filename().string();
    const bool twin = name.size() > std::string(kTwinSuffix).size() && name.ends_with(kTwinSuffix);
    if (fs::exists(entry.path() / "golden.json") || twin) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

GoldenCase load_golden_case(const std::string& name) {
  GoldenCase c;
  c.name = name;
  c.model_dir = std::string(HLM_FIXTURES_DIR) + "/" + name;
  const std::string golden_dir = reference_dir(name);
  std::ifstream in(golden_dir + "/golden.json");
  HLM_CHECK(in.good(), "{}/golden.json missing", golden_dir);
  nlohmann::json doc = nlohmann::json::parse(in);
  for (const auto& p : doc.at("prompts")) {
    GoldenPrompt g;
    g.ids = p.at("ids").get<std::vector<int32_t>>();
    g.greedy = p.at("greedy").get<std::vector<int32_t>>();
    g.logits = read_npy(golden_dir + "/" + p.at("logits").get<std::string>());
    c.prompts.push_back(std::move(g));
  }
  return c;
}

Bf16Noise load_bf16_noise(const GoldenCase& c) {
  const std::string path = reference_dir(c.name) + "/bf16_reference.json";
  std::ifstream in(path);
  HLM_CHECK(in.good(), "{} missing (tools/bf16_reference.py makes it)", path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  Bf16Noise n;
  for (const auto& p : doc.at("prompts")) {
    n.rel_l2.push_back(p.at("rel_l2").get<double>());
    n.max_abs.push_back(p.at("max_abs").get<float>());
  }
  HLM_CHECK(n.rel_l2.size() == c.prompts.size(), "{} lists {} prompts, the fixture has {}", path,
            n.rel_l2.size(), c.prompts.size());
  return n;
}

Runner::Runner(const std::string& model_dir, const Mapping& mapping, Comm& comm, EngineOptions options,
               Device device) {
  config_ = load_model_config(model_dir + "/config.json");
  BackendOptions backend;
  if (device == Device::kCuda)
    backend.cuda_device = local_rank(comm.rank()) % std::max(1, cuda_device_count(nullptr));
  ops_ = make_ops(device, backend);
  device_comm_ = make_device_comm(comm, mapping, *ops_);
  Comm& c = device_comm_ != nullptr ? *device_comm_ : comm;
  checkpoint_ = std::make_unique<Checkpoint>(model_dir);
  model_ = std::make_unique<Model>(config_, mapping, *ops_, c, *checkpoint_);
  if (device == Device::kCuda) {
    ops_->reserve_workspace(step_scratch_bytes(config_, mapping, options.max_seq_len, options.max_seq_len));
  } else {
    options.cuda_graphs = false;
  }
  engine_ = std::make_unique<Engine>(*model_, c, options);
  if (options.cuda_graphs) engine_->warmup();
}

Tensor sequence_logits(Engine& engine, int64_t seq_id, const std::vector<int32_t>& ids, int64_t prefill_len,
                       int64_t chunk) {
  const auto len = static_cast<int64_t>(ids.size());
  std::vector<Tensor> parts;
  int64_t done = 0;
  auto run = [&](int64_t n) {
    StepPlan plan;
    plan.entries.push_back(
        StepEntry{seq_id, done == 0, true, std::vector<int32_t>(ids.begin() + done, ids.begin() + done + n)});
    parts.push_back(engine.step(plan)[0].clone());
    done += n;
  };
  const int64_t step = chunk > 0 ? chunk : std::max<int64_t>(prefill_len, 1);
  while (done < prefill_len) run(std::min(step, prefill_len - done));
  while (done < len) run(1);
  StepPlan release;
  release.release.push_back(seq_id);
  engine.step(release);

  const int64_t vocab = parts.front().dim(1);
  Tensor out = Tensor::empty({len, vocab}, DType::kF32);
  float* dst = out.data<float>();
  for (const Tensor& p : parts) dst = std::copy_n(p.data<float>(), p.numel(), dst);
  return out;
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  HLM_CHECK(a.shape() == b.shape(), "max_abs_diff: {} vs {}", a.describe(), b.describe());
  float m = 0;
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float d = std::fabs(x[i] - y[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

Tensor rows(const Tensor& t, int64_t begin, int64_t end) { return t.slice(begin, end); }

float top2_margin(const float* row, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return a - b;
}

}  // namespace hlm::test
