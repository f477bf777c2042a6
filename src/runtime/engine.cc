#include "runtime/engine.h"

#include "base/log.h"

namespace hlm {

namespace {

Placement make_placement(const Mapping& m, const EngineOptions& o) {
  HLM_CHECK(o.tokens_per_block > 0 && o.tokens_per_block <= kMaxTokensPerBlock,
            "--tokens-per-block must be in [1, {}] (got {})", kMaxTokensPerBlock, o.tokens_per_block);
  HLM_CHECK(o.max_batch > 0, "--max-batch must be positive (got {})", o.max_batch);
  HLM_CHECK(o.max_seq_len > 0 && o.max_seq_len <= kMaxSeqLen, "--max-seq-len must be in [1, {}] (got {})",
            kMaxSeqLen, o.max_seq_len);
  return Placement{o.tokens_per_block, m.cp};
}

}  // namespace

Engine::Engine(Model& model, Comm& comm, const EngineOptions& options)
    : model_(model),
      comm_(comm),
      options_(options),
      kv_(make_placement(model.mapping(), options), model.mapping().cp_rank(),
          pages_per_rank(make_placement(model.mapping(), options), options.max_batch, options.max_seq_len),
          options.max_batch) {
  model_.allocate_caches(options_.max_batch, kv_.free_pages(), options_.tokens_per_block);
  spdlog::debug("engine: {} state slots, {} MLA pages of {} tokens on this rank", options_.max_batch,
                kv_.free_pages(), options_.tokens_per_block);
}

std::vector<Tensor> Engine::step(const StepPlan& plan) {
  if (comm_.size() > 1) {
    std::string bytes = plan.serialize();
    comm_.broadcast(bytes, 0);
  }
  return execute(plan);
}

void Engine::serve() {
  for (;;) {
    std::string bytes;
    comm_.broadcast(bytes, 0);
    StepPlan plan = StepPlan::deserialize(bytes);
    if (plan.stop) return;
    execute(plan);
  }
}

void Engine::stop() {
  if (comm_.size() == 1) return;
  StepPlan plan;
  plan.stop = true;
  std::string bytes = plan.serialize();
  comm_.broadcast(bytes, 0);
}

void Engine::warmup() {
  const Placement& place = kv_.placement();
  const int64_t prefill = place.cp * place.tokens_per_block + 1;
  HLM_CHECK(
      prefill + 1 <= options_.max_seq_len,
      "warmup needs a sequence of cp*tokens_per_block + 2 = {} tokens (so every CP rank holds KV) but the "
      "KV cache is sized for {} per sequence; raise --max-seq-len or lower --tokens-per-block",
      prefill + 1, options_.max_seq_len);
  HLM_CHECK(kv_.free_slots() > 0, "warmup needs a free sequence slot");
  // A scratch sequence id no request uses; ids from the scheduler are non-negative.
  constexpr int64_t kWarmupSeq = -1;
  StepPlan plan;
  plan.entries.push_back(StepEntry{kWarmupSeq, true, false, std::vector<int32_t>(prefill, 0)});
  execute(plan);
  plan.entries[0] = StepEntry{kWarmupSeq, false, false, {0}};
  plan.release = {kWarmupSeq};
  execute(plan);
  // No rank may skip a collective-bearing forward its peers enter; agree that all of them ran it.
  Tensor ran = Tensor::filled({1}, 1.0f);
  comm_.all_reduce_sum(ran, CommGroup::kWorld);
  HLM_CHECK(static_cast<int>(ran.data<float>()[0]) == comm_.size(), "warmup did not run on every rank");
  warmed_up_ = true;
  spdlog::debug("warmup done: {} prefill tokens + 1 decode step", prefill);
}

StepContext Engine::build_context(const StepPlan& plan) {
  const Placement& place = kv_.placement();
  const int cp_rank = kv_.cp_rank();
  StepContext ctx;
  int64_t total = 0;
  for (const StepEntry& e : plan.entries) total += static_cast<int64_t>(e.tokens.size());
  ctx.num_tokens = total;
  ctx.token_ids = Tensor::empty({total}, DType::kI32);
  ctx.write_slots = Tensor::empty({total}, DType::kI64);
  ctx.kv_len = Tensor::empty({total}, DType::kI32);
  auto* ids = ctx.token_ids.data<int32_t>();
  auto* slots = ctx.write_slots.data<int64_t>();
  auto* kv_len = ctx.kv_len.data<int32_t>();
  std::vector<int32_t> page_table;
  std::vector<int32_t> logit_rows;
  ctx.decode_only = true;

  int64_t row = 0;
  for (const StepEntry& e : plan.entries) {
    const auto n = static_cast<int64_t>(e.tokens.size());
    const int64_t g = kv_.global_len(e.seq_id);
    ctx.decode_only = ctx.decode_only && n == 1;
    ctx.seqs.push_back(SeqSpan{row, n, kv_.slot(e.seq_id)});
    const std::vector<int32_t>& pages = kv_.pages(e.seq_id);
    ctx.mla_seqs.push_back(
        MlaSeq{row, n, static_cast<int64_t>(page_table.size()), static_cast<int64_t>(pages.size())});
    page_table.insert(page_table.end(), pages.begin(), pages.end());
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = g + j;
      ids[row + j] = e.tokens[j];
      slots[row + j] = kv_.cache_index(e.seq_id, pos);
      // A query sees the local keys at global positions <= its own: a prefix of the local key list.
      kv_len[row + j] = static_cast<int32_t>(place.local_len(pos + 1, cp_rank));
      if (e.all_logits || j == n - 1) logit_rows.push_back(static_cast<int32_t>(row + j));
    }
    row += n;
  }
  ctx.page_table = Tensor::from_vector_i32({static_cast<int64_t>(page_table.size())}, page_table);
  ctx.logit_rows = Tensor::from_vector_i32({static_cast<int64_t>(logit_rows.size())}, logit_rows);
  return ctx;
}

std::vector<Tensor> Engine::execute(const StepPlan& plan) {
  for (const StepEntry& e : plan.entries) {
    HLM_CHECK(!e.tokens.empty(), "step entry for sequence {} has no tokens", e.seq_id);
    if (e.is_new) model_.reset_slot(kv_.add(e.seq_id));
    HLM_CHECK(kv_.global_len(e.seq_id) + static_cast<int64_t>(e.tokens.size()) <= options_.max_seq_len,
              "sequence {} would grow to {} tokens, beyond --max-seq-len {}", e.seq_id,
              kv_.global_len(e.seq_id) + static_cast<int64_t>(e.tokens.size()), options_.max_seq_len);
    kv_.reserve(e.seq_id, static_cast<int64_t>(e.tokens.size()));
  }
  std::vector<Tensor> out;
  if (!plan.entries.empty()) {
    StepContext ctx = build_context(plan);
    Tensor logits = model_.forward(ctx);  // [rows, vocab]
    int64_t row = 0;
    for (const StepEntry& e : plan.entries) {
      const int64_t n = e.all_logits ? static_cast<int64_t>(e.tokens.size()) : 1;
      out.push_back(logits.slice(row, row + n));
      row += n;
    }
    for (const StepEntry& e : plan.entries) kv_.commit(e.seq_id, static_cast<int64_t>(e.tokens.size()));
  }
  for (int64_t id : plan.release) kv_.release(id);
  return out;
}

}  // namespace hlm
