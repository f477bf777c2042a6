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
  HLM_CHECK(o.num_pages >= 0, "the KV page count must be >= 0 (got {})", o.num_pages);
  return Placement{o.tokens_per_block, m.cp};
}

int64_t page_count(const Mapping& m, const EngineOptions& o) {
  return o.num_pages > 0 ? o.num_pages : pages_per_rank(make_placement(m, o), o.max_batch, o.max_seq_len);
}

// Host I32 table of the KDA ragged list, the form device kernels read (ops.h SeqBatch; MlaBatch's is
// mla_batch_table).
Tensor span_table(const std::vector<SeqSpan>& spans) {
  Tensor t = Tensor::empty({static_cast<int64_t>(spans.size()), 3}, DType::kI32);
  int32_t* p = t.data<int32_t>();
  for (size_t i = 0; i < spans.size(); ++i) {
    p[i * 3 + 0] = static_cast<int32_t>(spans[i].token_begin);
    p[i * 3 + 1] = static_cast<int32_t>(spans[i].token_count);
    p[i * 3 + 2] = spans[i].slot;
  }
  return t;
}

// The host context moved to the backend (inside a step: the copies are step scratch).
StepContext staged(const StepContext& host, Ops& ops) {
  StepContext c = host;
  c.token_ids = ops.upload(host.token_ids);
  c.write_slots = ops.upload(host.write_slots);
  c.kv_len = ops.upload(host.kv_len);
  c.page_table = ops.upload(host.page_table);
  c.logit_rows = ops.upload(host.logit_rows);
  c.seqs.table = ops.upload(span_table(host.seqs.spans));
  c.mla.table = ops.upload(mla_batch_table(host.mla.seqs));
  return c;
}

}  // namespace

Engine::Engine(Model& model, Comm& comm, const EngineOptions& options)
    : model_(model),
      comm_(comm),
      options_(options),
      kv_(make_placement(model.mapping(), options), model.mapping().cp_rank(),
          page_count(model.mapping(), options), options.max_batch) {
  model_.allocate_caches(options_.max_batch, kv_.free_pages(), options_.tokens_per_block);
  spdlog::debug("engine: {} state slots, {} MLA pages of {} tokens on this rank", options_.max_batch,
                kv_.free_pages(), options_.tokens_per_block);
}

Engine::~Engine() = default;

void Engine::broadcast(const StepPlan& plan) {
  if (comm_.size() > 1) {
    std::string bytes = plan.serialize();
    comm_.broadcast(bytes, 0);
  }
}

std::vector<Tensor> Engine::step(const StepPlan& plan) {
  broadcast(plan);
  std::vector<Tensor> out;
  execute(plan, [&](const Tensor& logits) {
    const Tensor host = model_.ops().to_host_f32(logits);  // [rows, vocab]
    int64_t row = 0;
    for (const StepEntry& e : plan.entries) {
      const int64_t n = e.all_logits ? static_cast<int64_t>(e.tokens.size()) : 1;
      out.push_back(host.slice(row, row + n));
      row += n;
    }
  });
  return out;
}

std::vector<int32_t> Engine::step_sample(const StepPlan& plan, const std::vector<SampleParams>& sampling) {
  HLM_CHECK(sampling.size() == plan.entries.size(), "step_sample: {} sampling rows for {} entries",
            sampling.size(), plan.entries.size());
  for (const StepEntry& e : plan.entries) {
    HLM_CHECK(!e.all_logits, "step_sample: entry of sequence {} asks for all logits", e.seq_id);
  }
  broadcast(plan);
  std::vector<int32_t> ids;
  execute(plan, [&](const Tensor& logits) {
    Tensor rows = logits;
    if (logits.dim(0) != static_cast<int64_t>(sampling.size())) rows = logits.slice(0, sampling.size());
    ids = model_.ops().sample(rows, sampling);
  });
  return ids;
}

void Engine::serve() {
  for (;;) {
    std::string bytes;
    comm_.broadcast(bytes, 0);
    StepPlan plan = StepPlan::deserialize(bytes);
    if (plan.stop) return;
    execute(plan, [](const Tensor&) {});
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
  execute(plan, [](const Tensor&) {});
  plan.entries[0] = StepEntry{kWarmupSeq, false, false, {0}};
  plan.release = {kWarmupSeq};
  execute(plan, [](const Tensor&) {});
  // No rank may skip a collective-bearing forward its peers enter; agree that all of them ran it.
  Tensor ran = Tensor::filled({1}, 1.0f);
  comm_.all_reduce_sum(ran, CommGroup::kWorld);
  HLM_CHECK(static_cast<int>(ran.data<float>()[0]) == comm_.size(), "warmup did not run on every rank");
  if (options_.cuda_graphs) {
    const int64_t capacity = std::min(kv_.free_pages(), static_cast<int64_t>(options_.max_batch) *
                                                            place.local_pages(options_.max_seq_len, 0));
    graphs_ = std::make_unique<DecodeGraphs>(model_, options_.max_batch, capacity);
    if (!graphs_->capture()) graphs_.reset();
  }
  warmed_up_ = true;
  spdlog::debug("warmup done: {} prefill tokens + 1 decode step", prefill);
}

StepContext Engine::build_context(const StepPlan& plan) {
  const Placement& place = kv_.placement();
  const int cp_rank = kv_.cp_rank();
  StepContext ctx;
  ctx.mla_prefill = options_.mla_prefill;
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
    ctx.seqs.spans.push_back(SeqSpan{row, n, kv_.slot(e.seq_id)});
    const std::vector<int32_t>& pages = kv_.pages(e.seq_id);
    ctx.mla.seqs.push_back(
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
  // The rows went in ascending and once each, so as many as the step's tokens are all of them.
  ctx.every_row_logits = static_cast<int64_t>(logit_rows.size()) == total;
  return ctx;
}

void Engine::execute(const StepPlan& plan, const std::function<void(const Tensor&)>& consume) {
  for (const SyntheticSeq& s : plan.synthetic) {
    HLM_CHECK(s.length >= 0 && s.length <= options_.max_seq_len,
              "synthetic sequence {} of {} tokens does not fit --max-seq-len {}", s.seq_id, s.length,
              options_.max_seq_len);
    kv_.add(s.seq_id);
    kv_.reserve(s.seq_id, s.length);
    kv_.commit(s.seq_id, s.length);
  }
  for (const StepEntry& e : plan.entries) {
    HLM_CHECK(!e.tokens.empty(), "step entry for sequence {} has no tokens", e.seq_id);
    if (e.is_new) model_.reset_slot(kv_.add(e.seq_id));
    HLM_CHECK(kv_.global_len(e.seq_id) + static_cast<int64_t>(e.tokens.size()) <= options_.max_seq_len,
              "sequence {} would grow to {} tokens, beyond --max-seq-len {}", e.seq_id,
              kv_.global_len(e.seq_id) + static_cast<int64_t>(e.tokens.size()), options_.max_seq_len);
    kv_.reserve(e.seq_id, static_cast<int64_t>(e.tokens.size()));
  }
  if (!plan.entries.empty()) {
    const StepContext host = build_context(plan);
    Ops& ops = model_.ops();
    ops.begin_step();
    try {
      const bool graph = graphs_ != nullptr && host.decode_only && graphs_->covers(plan.entries.size());
      const Tensor logits = graph ? graphs_->run(host) : model_.forward(staged(host, ops));
      consume(logits);
    } catch (...) {
      ops.end_step();
      throw;
    }
    ops.end_step();
    comm_.check();
    for (const StepEntry& e : plan.entries) kv_.commit(e.seq_id, static_cast<int64_t>(e.tokens.size()));
  }
  for (int64_t id : plan.release) kv_.release(id);
}

}  // namespace hlm
