#include "cli/session.h"

#include <omp.h>

#include <charconv>
#include <thread>

#include <cblas.h>

#include "base/log.h"
#include "ops/cpu/cpu_ops.h"
#include "parallel/layout_rules.h"
#include "weights/model_source.h"

namespace hlm {

void add_session_options(CLI::App& cmd, SessionOptions& o) {
  cmd.add_option("-m,--model", o.model_dir,
                 "Checkpoint directory, or a Hugging Face repo id in the local cache")
      ->capture_default_str();
  cmd.add_option("--tp", o.tp, "MLA attention tensor-parallel width")->capture_default_str();
  cmd.add_option("--cp", o.cp, "MLA decode context-parallel width (KV pages striped over cp ranks)")
      ->capture_default_str();
  cmd.add_option("--moe-ep", o.moe_ep, "MoE expert-parallel width (default: tp*cp)");
  cmd.add_option("--moe-tp", o.moe_tp, "MoE tensor-parallel width (default: 1)");
  cmd.add_option("--threads", o.threads, "CPU threads per rank (default: cores / ranks)");
  cmd.add_option("--tokens-per-block", o.engine.tokens_per_block, "MLA KV page size in tokens")
      ->capture_default_str();
  cmd.add_option("--max-batch", o.engine.max_batch, "Sequences held at once")->capture_default_str();
  cmd.add_option("--max-seq-len", o.max_seq_len,
                 "Tokens per sequence the KV cache is sized for (default: what the command needs)");
  cmd.add_flag("!--no-warmup", o.warmup, "Skip the start-up warmup step");
}

std::vector<int32_t> parse_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    int32_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    HLM_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size() && v >= 0,
              "{}: '{}' is not a token id (expected comma-separated non-negative integers, e.g. 5,17,300)",
              flag, item);
    ids.push_back(v);
    pos = comma + 1;
  }
  return ids;
}

namespace {

void set_threads(int threads, int ranks) {
  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, ranks));
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

}  // namespace

Session::Session(const SessionOptions& o, int64_t max_seq_len_hint) {
  int world = 1, rank = 0;
  mpi_world(&world, &rank);
  HLM_CHECK(
      world == o.tp * o.cp,
      "the launch has {} rank(s) but --tp {} x --cp {} = {}: start with `mpirun -np {}` or change --tp/--cp",
      world, o.tp, o.cp, o.tp * o.cp, o.tp * o.cp);
  model_dir_ = resolve_model_dir(o.model_dir);
  config_ = load_model_config(model_dir_ + "/config.json");
  // Every layout rule is checked before a single weight is read.
  check_layout(config_, LayoutRequest{o.tp, o.cp, o.moe_ep, o.moe_tp, o.engine.tokens_per_block});
  Mapping mapping = Mapping::make(o.tp, o.cp, rank, o.moe_ep, o.moe_tp);
  comm_ = world > 1 ? make_mpi_comm(mapping) : make_single_comm();
  set_threads(o.threads, world);
  checkpoint_ = std::make_unique<Checkpoint>(model_dir_);
  ops_ = make_cpu_ops();
  model_ = std::make_unique<Model>(config_, mapping, *ops_, *comm_, *checkpoint_);
  EngineOptions eo = o.engine;
  eo.max_seq_len = o.max_seq_len > 0 ? o.max_seq_len : (max_seq_len_hint > 0 ? max_seq_len_hint : 4096);
  if (o.warmup && o.max_seq_len == 0) {
    // Size the cache so the warmup sequence fits; an explicit --max-seq-len is kept, and warmup()
    // refuses to start if it is too small.
    eo.max_seq_len = std::max(eo.max_seq_len, o.cp * eo.tokens_per_block + 2);
  }
  engine_ = std::make_unique<Engine>(*model_, *comm_, eo);
  if (o.warmup) engine_->warmup();
}

Session::~Session() = default;

}  // namespace hlm
