#include "cli/session.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "base/host_memory.h"
#include "base/log.h"
#include "cli/common.h"
#include "model/memory_plan.h"
#include "model/mla_layer.h"
#include "model/weight_source.h"
#include "parallel/layout_rules.h"
#include "runtime/device_comm.h"
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
  cmd.add_option("--threads", o.threads, "CPU threads per rank (0, the default: cores / ranks)");
  cmd.add_option("--tokens-per-block", o.engine.tokens_per_block, "MLA KV page size in tokens")
      ->capture_default_str();
  cmd.add_option("--max-batch", o.engine.max_batch, "Sequences held at once")->capture_default_str();
  cmd.add_option("--max-seq-len", o.max_seq_len,
                 "Tokens per sequence the KV cache is sized for (default: what the command needs)");
  cmd.add_option("--device", o.device, "cpu, cuda, or auto (cuda when a GPU is visible)")
      ->transform(choice_validator(std::vector<std::pair<std::string, DeviceChoice>>{
          {"cpu", DeviceChoice::kCpu}, {"cuda", DeviceChoice::kCuda}, {"auto", DeviceChoice::kAuto}}))
      ->default_str("auto");
  cmd.add_option("--gpu-memory-fraction", o.gpu_memory_fraction,
                 "Share of the GPU's memory helixlm may use (weights, KV pages, state, scratch)")
      ->check(CLI::Range(0.05, 1.0))
      ->capture_default_str();
  cmd.add_flag("!--no-cuda-graphs", o.cuda_graphs, "Run decode steps without CUDA graphs (debugging)");
  cmd.add_option(
         "--mla-prefill", o.engine.mla_prefill,
         "MLA form of prefill steps: absorbed (the decode form), expanded (per-head keys; cp = 1 only), "
         "or auto (a cost model picks per sequence)")
      ->transform(choice_validator(
          std::vector<std::pair<std::string, MlaPrefillForm>>{{"auto", MlaPrefillForm::kAuto},
                                                              {"absorbed", MlaPrefillForm::kAbsorbed},
                                                              {"expanded", MlaPrefillForm::kExpanded}}))
      ->default_str("auto");
  cmd.add_option("--comm-timeout", o.comm_timeout,
                 "Seconds a rank waits for its peers in one collective before ending the job")
      ->capture_default_str();
  cmd.add_option("--ll-all-reduce-max-bytes", o.ll_all_reduce_max_bytes,
                 "GPU all-reduces up to this size go over NVLink peer memory, larger ones through NCCL")
      ->capture_default_str();
  cmd.add_option("--ll-all-to-all-max-bytes", o.ll_all_to_all_max_bytes,
                 "GPU all-to-alls sending up to this much to each peer go over NVLink peer memory")
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
  // Before the launch is compared with tp*cp: `--tp 0` must not read as "start with mpirun -np 0".
  HLM_CHECK(o.tp >= 1 && o.cp >= 1, "--tp and --cp must be at least 1 (got --tp {} --cp {})", o.tp, o.cp);
  HLM_CHECK(
      std::isfinite(o.gpu_memory_fraction) && o.gpu_memory_fraction >= 0.05 && o.gpu_memory_fraction <= 1,
      "--gpu-memory-fraction must be in [0.05, 1] (got {})", o.gpu_memory_fraction);
  HLM_CHECK(o.comm_timeout > 0, "--comm-timeout must be positive (got {})", o.comm_timeout);
  HLM_CHECK(
      o.ll_all_reduce_max_bytes >= 0 && o.ll_all_to_all_max_bytes >= 0,
      "--ll-all-reduce-max-bytes and --ll-all-to-all-max-bytes must be >= 0 (0: NCCL only), got {} and {}",
      o.ll_all_reduce_max_bytes, o.ll_all_to_all_max_bytes);
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

// The tokens per sequence the caches are sized for, and where that length comes from, for the errors
// that refuse the caches: each names what actually sized them and what would shrink them.
struct SeqLength {
  int64_t tokens = 0;
  std::string source;  // "-n", "--max-seq-len", or the rule that set it
  std::string option;  // the option that shortens it; empty when the warmup set it
};

SeqLength sequence_length(const SessionOptions& o, int64_t hint) {
  if (o.max_seq_len > 0) return {o.max_seq_len, "--max-seq-len", "--max-seq-len"};
  SeqLength len = hint > 0 ? SeqLength{hint, o.length_option, o.length_option}
                           : SeqLength{4096, "the default length, no --max-seq-len given", "--max-seq-len"};
  // An explicit --max-seq-len is kept (warmup() refuses to start if it is too small); otherwise the cache
  // is sized so that the warmup sequence fits.
  const int64_t warmup = int64_t{o.cp} * o.engine.tokens_per_block + 2;
  if (o.warmup && warmup > len.tokens) {
    len = {warmup,
           fmt::format("the warmup: --cp {} x --tokens-per-block {} + 2", o.cp, o.engine.tokens_per_block),
           ""};
  }
  return len;
}

// What sized the caches (for the errors refusing them), and what to lower.
struct CacheSizing {
  std::string sized_by;  // "8 sequences (--max-batch) of 4096 tokens (--max-seq-len)"
  std::string remedy;    // "lower --max-seq-len or --max-batch"
};

CacheSizing cache_sizing(const SessionOptions& o, int32_t max_batch, const SeqLength& len) {
  // The warmup's sequence spans two pages whatever the page size: fewer sequences, or no warmup.
  return {
      fmt::format("{} sequences ({}) of {} tokens ({})", max_batch, o.batch_option, len.tokens, len.source),
      len.option.empty() ? fmt::format("lower {} or skip the warmup (--no-warmup)", o.batch_option)
                         : fmt::format("lower {} or {}", len.option, o.batch_option)};
}

// This rank's share of the host's memory (MemAvailable, or HLM_HOST_MEMORY_BYTES, split among the ranks on
// this host), and how messages name it: the one figure the CPU backend's weights and caches are sized by.
struct HostShare {
  int64_t bytes = 0;
  std::string what;
};

HostShare host_share() {
  const int local = ranks_on_this_host();
  return {available_host_memory() / local,
          local > 1
              ? fmt::format("host memory ({} shared by {} ranks on this host)", host_memory_source(), local)
              : fmt::format("host memory ({})", host_memory_source())};
}

// Checks what sizes the host's caches before anything is loaded: the length within what a sequence may
// hold and the pages within the int32 page ids. (A GPU's pages come from its memory: plan_device_caches.)
void check_cache_request(const Mapping& mapping, const EngineOptions& eo, const SeqLength& len,
                         const CacheSizing& sizing) {
  HLM_CHECK(len.tokens <= kMaxSeqLen, "{} asks for sequences of {} tokens; at most {} are supported",
            len.source, len.tokens, kMaxSeqLen);
  const int64_t seq_pages = Placement{eo.tokens_per_block, mapping.cp}.local_pages(len.tokens, 0);
  HLM_CHECK(seq_pages <= kMaxPagesPerRank / eo.max_batch,
            "the caches for {} need {} x {} MLA pages of {} tokens on this rank, more than the {} page ids "
            "(int32) allow; {}",
            sizing.sized_by, eo.max_batch, seq_pages, eo.tokens_per_block, kMaxPagesPerRank, sizing.remedy);
}

// Refuses weights and caches that the host cannot hold, before a weight is read: without this a model
// or request too large for the host loads until the OOM killer or bad_alloc ends it. The weights must fit
// this rank's share of the host's memory, and the caches what the weights leave of it; activations need
// memory too, so passing is necessary, not sufficient. (On a GPU the weights are checked against its
// memory and the caches planned once the weights are on it: plan_device_caches.)
void check_fits_host(const ModelConfig& cfg, const Mapping& mapping, const SessionOptions& o,
                     const EngineOptions& eo, const CacheSizing& sizing, int64_t weight_bytes) {
  const HostShare host = host_share();
  HLM_CHECK(
      weight_bytes <= host.bytes,
      "the weights of this rank need {} of host memory (the CPU backend holds float weights as F32), "
      "but {} has {} available; use more ranks (--tp/--cp, over several hosts), a GPU (--device cuda){}",
      human_bytes(weight_bytes), host.what, human_bytes(host.bytes),
      o.random_weights ? ", or fewer layers (--num-layers)" : ", or a smaller model");
  CacheSize need;
  try {
    // The CPU backend holds the KV cache and the conv window as fp32.
    need = cache_size(cfg, mapping, eo.tokens_per_block, eo.max_batch, eo.max_seq_len, 4, 4);
  } catch (const Error& e) {
    HLM_FAIL("the caches for {} cannot be sized ({}); {}", sizing.sized_by, e.what(), sizing.remedy);
  }
  const int64_t left = host.bytes - weight_bytes;
  // KDA state is per sequence whatever its length: when it alone overflows, only fewer sequences help.
  const int64_t state_per_seq = need.kda_state_bytes / eo.max_batch;
  const std::string remedy =
      need.kda_state_bytes > left
          ? fmt::format(
                "lower {}: the KDA state of one sequence takes {} whatever its length (set by the {} "
                "KDA layers of {})",
                o.batch_option, human_bytes(state_per_seq), cfg.num_kda_layers(), cfg.source)
          : sizing.remedy;
  check_cache_fits(need, left,
                   fmt::format("{} less this rank's weights ({})", host.what, human_bytes(weight_bytes)),
                   sizing.sized_by, remedy);
}

// The config of a --random-weights run: --config, optionally cut to its first --num-layers layers.
ModelConfig random_weights_config(const SessionOptions& o) {
  HLM_CHECK(!o.config_path.empty(), "--random-weights needs --config FILE (a config.json)");
  HLM_CHECK(o.num_layers >= 0, "--num-layers must be >= 0 (0: all layers), got {}", o.num_layers);
  ModelConfig cfg = load_model_config(o.config_path);
  if (o.num_layers > 0) {
    HLM_CHECK(o.num_layers <= cfg.num_layers, "--num-layers {} exceeds the {} layers of {}", o.num_layers,
              cfg.num_layers, o.config_path);
    cfg.num_layers = o.num_layers;
    cfg.attn.resize(o.num_layers);
    cfg.ffn.resize(o.num_layers);
  }
  return cfg;
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
  if (o.random_weights) {
    config_ = random_weights_config(o);
  } else {
    model_dir_ = resolve_model_dir(o.model_dir);
    config_ = load_model_config(model_dir_ + "/config.json");
  }
  // Every layout rule is checked before a single weight is read.
  check_layout(config_, LayoutRequest{o.tp, o.cp, o.moe_ep, o.moe_tp, o.engine.tokens_per_block});
  HLM_CHECK(o.engine.mla_prefill != MlaPrefillForm::kExpanded || mla_expanded_applies(config_, o.cp),
            "--mla-prefill expanded needs --cp 1 (got {}) and MLA heads (nope, R, V) of (128, 64, 128) or "
            "(16, 8, 16) (the model has ({}, {}, {})); use auto or absorbed",
            o.cp, config_.qk_nope_head_dim, config_.qk_rope_head_dim, config_.v_head_dim);
  Mapping mapping = Mapping::make(o.tp, o.cp, rank, o.moe_ep, o.moe_tp);
  const Device device = resolve_device(o.device);
  EngineOptions eo = o.engine;
  const SeqLength length = sequence_length(o, max_seq_len_hint);
  const CacheSizing sizing = cache_sizing(o, eo.max_batch, length);
  if (device == Device::kCpu) check_cache_request(mapping, eo, length, sizing);
  eo.max_seq_len = length.tokens;
  eo.cuda_graphs = o.cuda_graphs && device == Device::kCuda;
  host_comm_ = world > 1 ? make_mpi_comm(mapping) : make_single_comm();

  BackendOptions bo;
  // --threads 0: the host's cores divided among the ranks on it.
  bo.cpu_threads =
      o.threads > 0
          ? o.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks_on_this_host());
  std::string why;
  if (device == Device::kCuda) bo.cuda_device = local_rank(rank) % std::max(1, cuda_device_count(&why));
  ops_ = make_ops(device, bo);
  ops_->enable_sections(o.section_timing);  // before the decode graphs are captured
  spdlog::info("device: {}", device == Device::kCuda ? fmt::format("cuda:{}", bo.cuda_device) : "cpu");
  GpuCommOptions gco;
  gco.ll_all_reduce_max_bytes = o.ll_all_reduce_max_bytes;
  gco.ll_all_to_all_max_bytes = o.ll_all_to_all_max_bytes;
  gco.ll_slot_bytes = std::max({gco.ll_slot_bytes, o.ll_all_reduce_max_bytes, o.ll_all_to_all_max_bytes});
  device_comm_ = make_device_comm(*host_comm_, mapping, *ops_, gco);

  const auto load_start = std::chrono::steady_clock::now();
  std::unique_ptr<WeightSource> weights;
  if (o.random_weights) {
    weights = std::make_unique<RandomWeights>(config_, mapping, *ops_, /*seed=*/1234);
  } else {
    checkpoint_ = std::make_unique<Checkpoint>(model_dir_);
    weights = std::make_unique<WeightReader>(*checkpoint_, config_, mapping, ops_.get());
  }
  if (device == Device::kCpu) {
    check_fits_host(config_, mapping, o, eo, sizing, weights->bytes_to_load());
  } else {
    // Refuse before reading a byte when the weights alone cannot fit.
    const MemoryInfo mem = ops_->memory_info();
    const int64_t need = weights->bytes_to_load();
    const auto budget =
        static_cast<int64_t>(o.gpu_memory_fraction * static_cast<double>(mem.total)) - (mem.total - mem.free);
    HLM_CHECK(need <= budget,
              "the weights of this rank take {} on the GPU but only {} are available under "
              "--gpu-memory-fraction {} ({} free of {}); use more GPUs (--tp/--cp) or a larger fraction",
              human_bytes(need), human_bytes(std::max<int64_t>(budget, 0)), o.gpu_memory_fraction,
              human_bytes(mem.free), human_bytes(mem.total));
  }
  model_ = std::make_unique<Model>(config_, mapping, *ops_, comm(), *weights);
  weights.reset();
  // Ranks finish loading at different times and the first collective waits for the slowest. It may wait
  // as long again as this rank's own load took, on top of --comm-timeout: peers read shards of the same
  // size from the same kind of storage, while a stalled one never arrives.
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  comm().set_timeout(o.comm_timeout + load_s);
  comm().barrier();
  comm().set_timeout(o.comm_timeout);

  if (device == Device::kCuda) {
    const int64_t step_tokens = std::max<int64_t>(o.max_step_tokens > 0 ? o.max_step_tokens : eo.max_seq_len,
                                                  o.cp * eo.tokens_per_block + 1);
    const int64_t logit_rows = o.max_logit_rows > 0 ? o.max_logit_rows : step_tokens;
    const DeviceCachePlan plan =
        plan_device_caches(config_, mapping, model_->weight_bytes_loaded(), ops_->memory_info(),
                           o.gpu_memory_fraction, eo.tokens_per_block, eo.max_batch, eo.max_seq_len,
                           step_tokens, logit_rows, sizing.sized_by, sizing.remedy);
    log_device_cache_plan(plan);
    ops_->reserve_workspace(plan.workspace_bytes);
    eo.num_pages = plan.pages;
  }
  engine_ = std::make_unique<Engine>(*model_, comm(), eo);
  if (o.warmup) engine_->warmup();
}

Session::~Session() = default;

DType Session::stored_dtype(const WeightSpec& spec) const {
  if (checkpoint_ == nullptr) return spec.typical_dtype;
  const std::string& name = stored_name(*checkpoint_, spec);
  return checkpoint_->has(name) ? checkpoint_->info(name).dtype : spec.typical_dtype;
}

}  // namespace hlm
