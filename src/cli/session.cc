#include "cli/session.h"

#include <omp.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <cblas.h>

#include "base/host_memory.h"
#include "base/log.h"
#include "model/memory_plan.h"
#include "ops/cpu/cpu_ops.h"
#include "parallel/layout_rules.h"

namespace hlm {

void add_session_options(CLI::App& cmd, SessionOptions& o) {
  cmd.add_option("-m,--model", o.model_dir, "Checkpoint directory (config.json + safetensors)")
      ->capture_default_str();
  cmd.add_option("--tp", o.tp, "MLA attention tensor-parallel width")->capture_default_str();
  cmd.add_option("--cp", o.cp, "MLA decode context-parallel width (KV pages striped over cp ranks)")
      ->capture_default_str();
  cmd.add_option("--moe-ep", o.moe_ep, "MoE expert-parallel width (default: tp*cp)");
  cmd.add_option("--moe-tp", o.moe_tp, "MoE tensor-parallel width (default: 1)");
  cmd.add_option("--threads", o.threads, "CPU threads per rank (0, the default: cores / ranks)");
  cmd.add_option("--tokens-per-block", o.engine.tokens_per_block, "MLA KV page size in tokens")
      ->capture_default_str();
  cmd.add_option("--max-batch", o.engine.max_batch, "Sequences held at once")->capture_default_str();
  cmd.add_option("--max-seq-len", o.max_seq_len,
                 "Tokens per sequence the KV cache is sized for (default: what the command needs)");
  cmd.add_option("--comm-timeout", o.comm_timeout,
                 "Seconds a rank waits for its peers in one collective before ending the job")
      ->capture_default_str();
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

void check_session_options(const SessionOptions& o) {
  HLM_CHECK(o.comm_timeout > 0, "--comm-timeout must be positive (got {})", o.comm_timeout);
  HLM_CHECK(o.threads >= 0, "--threads must be >= 0 (0: cores / ranks), got {}", o.threads);
  HLM_CHECK(o.engine.max_batch > 0, "--max-batch must be positive (got {})", o.engine.max_batch);
  HLM_CHECK(o.max_seq_len >= 0 && o.max_seq_len <= kMaxSeqLen,
            "--max-seq-len must be in [1, {}] (or 0: what the command needs), got {}", kMaxSeqLen,
            o.max_seq_len);
  HLM_CHECK(o.engine.tokens_per_block > 0 && o.engine.tokens_per_block <= kMaxTokensPerBlock,
            "--tokens-per-block must be in [1, {}] (got {})", kMaxTokensPerBlock, o.engine.tokens_per_block);
}

namespace {

// Ranks mpirun started on this host (OpenMPI, MPICH/Hydra); they share its memory.
int ranks_on_this_host() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

// Refuses caches that the host cannot hold, before the weights are read: the caches come last, so
// without this a too-large request loads everything and then dies in the OOM killer or bad_alloc. The
// estimate is the caches alone against MemAvailable shared by the ranks of this host; weights and
// activations need memory too, so passing the check is necessary, not sufficient.
void check_caches_fit_host(const ModelConfig& cfg, const Mapping& mapping, const SessionOptions& o,
                           const EngineOptions& eo) {
  const std::string length = o.max_seq_len > 0 ? "--max-seq-len" : o.length_option;
  HLM_CHECK(eo.max_seq_len <= kMaxSeqLen, "{} asks for sequences of {} tokens; at most {} are supported",
            length, eo.max_seq_len, kMaxSeqLen);
  const std::string sized_by = fmt::format("{} sequences ({}) of {} tokens ({})", eo.max_batch,
                                           o.batch_option, eo.max_seq_len, length);
  const std::string remedy = fmt::format("lower {} or {}", length, o.batch_option);
  const int64_t seq_pages = Placement{eo.tokens_per_block, mapping.cp}.local_pages(eo.max_seq_len, 0);
  HLM_CHECK(seq_pages <= kMaxPagesPerRank / eo.max_batch,
            "the caches for {} need {} x {} MLA pages of {} tokens on this rank, more than the {} page ids "
            "(int32) allow; {}",
            sized_by, eo.max_batch, seq_pages, eo.tokens_per_block, kMaxPagesPerRank, remedy);
  CacheSize need;
  try {
    // The CPU backend holds the KV cache and the conv window as fp32.
    need = cache_size(cfg, mapping, eo.tokens_per_block, eo.max_batch, eo.max_seq_len, 4, 4);
  } catch (const Error& e) {
    HLM_FAIL("the caches for {} cannot be sized ({}); {}", sized_by, e.what(), remedy);
  }
  const int local = ranks_on_this_host();
  const std::string memory =
      local > 1 ? fmt::format("host memory (MemAvailable shared by {} ranks on this host)", local)
                : std::string("host memory (MemAvailable)");
  check_cache_fits(need, available_host_memory() / local, memory, sized_by, remedy);
}

void set_threads(int threads, int ranks) {
  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, ranks));
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

}  // namespace

Session::Session(const SessionOptions& o, int64_t max_seq_len_hint) {
  check_session_options(o);
  int world = 1, rank = 0;
  mpi_world(&world, &rank);
  const int64_t ranks = int64_t{o.tp} * o.cp;  // int64: --tp 65536 --cp 65536 must not wrap
  HLM_CHECK(
      world == ranks,
      "the launch has {} rank(s) but --tp {} x --cp {} = {}: start with `mpirun -np {}` or change --tp/--cp",
      world, o.tp, o.cp, ranks, ranks);
  HLM_CHECK(std::filesystem::is_directory(o.model_dir), "model directory '{}' not found (pass -m DIR)",
            o.model_dir);
  config_ = load_model_config(o.model_dir + "/config.json");
  // Every layout rule is checked before a single weight is read.
  check_layout(config_, LayoutRequest{o.tp, o.cp, o.moe_ep, o.moe_tp, o.engine.tokens_per_block});
  Mapping mapping = Mapping::make(o.tp, o.cp, rank, o.moe_ep, o.moe_tp);
  EngineOptions eo = o.engine;
  eo.max_seq_len = o.max_seq_len > 0 ? o.max_seq_len : (max_seq_len_hint > 0 ? max_seq_len_hint : 4096);
  if (o.warmup && o.max_seq_len == 0) {
    // Size the cache so the warmup sequence fits; an explicit --max-seq-len is kept, and warmup()
    // refuses to start if it is too small.
    eo.max_seq_len = std::max(eo.max_seq_len, o.cp * eo.tokens_per_block + 2);
  }
  check_caches_fit_host(config_, mapping, o, eo);
  comm_ = world > 1 ? make_mpi_comm(mapping) : make_single_comm();
  set_threads(o.threads, world);
  const auto load_start = std::chrono::steady_clock::now();
  checkpoint_ = std::make_unique<Checkpoint>(o.model_dir);
  ops_ = make_cpu_ops();
  model_ = std::make_unique<Model>(config_, mapping, *ops_, *comm_, *checkpoint_);
  // Ranks finish loading at different times and the first collective waits for the slowest. It may wait
  // as long again as this rank's own load took, on top of --comm-timeout: peers read shards of the same
  // size from the same kind of storage, while a stalled one never arrives.
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  comm_->set_timeout(o.comm_timeout + load_s);
  comm_->barrier();
  comm_->set_timeout(o.comm_timeout);
  engine_ = std::make_unique<Engine>(*model_, *comm_, eo);
  if (o.warmup) engine_->warmup();
}

Session::~Session() = default;

}  // namespace hlm
