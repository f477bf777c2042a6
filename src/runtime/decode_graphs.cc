#include "runtime/decode_graphs.h"

#include <algorithm>

#include "base/log.h"

namespace hlm {

DecodeGraphs::DecodeGraphs(Model& model, int32_t max_batch, int64_t page_capacity)
    : model_(model), page_capacity_(std::max<int64_t>(page_capacity, 1)) {
  for (int32_t b = 1;; b *= 2) {
    buckets_.push_back(Bucket{std::min(b, max_batch), {}, {}, nullptr});
    if (b >= max_batch) break;
  }
}

DecodeGraphs::~DecodeGraphs() = default;

bool DecodeGraphs::capture() {
  Ops& ops = model_.ops();
  for (Bucket& b : buckets_) {
    const int32_t n = b.batch;
    StepContext& c = b.ctx;
    c.num_tokens = n;
    c.decode_only = true;
    // Launch shapes come from these host lists (n sequences of one token); contents from the buffers.
    for (int32_t i = 0; i < n; ++i) {
      c.seqs.spans.push_back(SeqSpan{i, 1, i});
      c.mla.seqs.push_back(MlaSeq{i, 1, 0, 0});
    }
    c.token_ids = ops.zeros({n}, DType::kI32);
    c.write_slots = ops.zeros({n}, DType::kI64);
    c.kv_len = ops.zeros({n}, DType::kI32);
    c.page_table = ops.zeros({page_capacity_}, DType::kI32);
    c.logit_rows = ops.zeros({n}, DType::kI32);
    c.seqs.table = ops.zeros({n, 3}, DType::kI32);
    c.mla.table = ops.zeros({n, 4}, DType::kI32);
    fill(b, nullptr);
    // One eager run first, so libraries finish their lazy set-up outside the capture.
    ops.begin_step();
    model_.forward(c);
    ops.end_step();
    ops.begin_step();
    b.graph = ops.capture([&] { b.logits = model_.forward(c); });
    ops.end_step();
    if (b.graph == nullptr) {
      buckets_.clear();
      return false;
    }
  }
  spdlog::info("captured decode graphs for batch sizes up to {} ({} buckets)", buckets_.back().batch,
               buckets_.size());
  return true;
}

void DecodeGraphs::fill(Bucket& b, const StepContext* ctx) {
  const int32_t n = b.batch;
  const int32_t real = ctx == nullptr ? 0 : static_cast<int32_t>(ctx->seqs.spans.size());
  HLM_CHECK(real <= n, "decode graph of batch {} cannot take {} sequences", n, real);
  Tensor ids = Tensor::zeros({n}, DType::kI32);
  Tensor slots = Tensor::empty({n}, DType::kI64);
  Tensor kv_len = Tensor::zeros({n}, DType::kI32);
  Tensor rows = Tensor::empty({n}, DType::kI32);
  Tensor seqs = Tensor::empty({n, 3}, DType::kI32);
  Tensor mla = Tensor::empty({n, 4}, DType::kI32);
  int32_t* seq_p = seqs.data<int32_t>();
  int32_t* mla_p = mla.data<int32_t>();
  for (int32_t i = 0; i < n; ++i) {
    const bool live = i < real;
    slots.data<int64_t>()[i] = live ? ctx->write_slots.data<int64_t>()[i] : -1;
    rows.data<int32_t>()[i] = i;
    if (live) {
      ids.data<int32_t>()[i] = ctx->token_ids.data<int32_t>()[i];
      kv_len.data<int32_t>()[i] = ctx->kv_len.data<int32_t>()[i];
    }
    const SeqSpan s = live ? ctx->seqs.spans[i] : SeqSpan{i, 0, -1};
    const MlaSeq m = live ? ctx->mla.seqs[i] : MlaSeq{i, 0, 0, 0};
    seq_p[i * 3 + 0] = static_cast<int32_t>(s.token_begin);
    seq_p[i * 3 + 1] = static_cast<int32_t>(s.token_count);
    seq_p[i * 3 + 2] = s.slot;
    mla_p[i * 4 + 0] = static_cast<int32_t>(m.token_begin);
    mla_p[i * 4 + 1] = static_cast<int32_t>(m.token_count);
    mla_p[i * 4 + 2] = static_cast<int32_t>(m.page_begin);
    mla_p[i * 4 + 3] = static_cast<int32_t>(m.num_pages);
  }
  Ops& ops = model_.ops();
  ops.upload_into(ids, b.ctx.token_ids);
  ops.upload_into(slots, b.ctx.write_slots);
  ops.upload_into(kv_len, b.ctx.kv_len);
  ops.upload_into(rows, b.ctx.logit_rows);
  ops.upload_into(seqs, b.ctx.seqs.table);
  ops.upload_into(mla, b.ctx.mla.table);
  if (ctx != nullptr && ctx->page_table.numel() > 0) {
    const int64_t pages = ctx->page_table.numel();
    HLM_CHECK(pages <= page_capacity_, "decode step lists {} pages, the graph buffer holds {}", pages,
              page_capacity_);
    Tensor dst = b.ctx.page_table.slice(0, pages);
    ops.upload_into(ctx->page_table, dst);
  }
}

Tensor DecodeGraphs::run(const StepContext& ctx) {
  const size_t n = ctx.seqs.spans.size();
  auto it = std::find_if(buckets_.begin(), buckets_.end(),
                         [&](const Bucket& b) { return static_cast<size_t>(b.batch) >= n; });
  HLM_CHECK(it != buckets_.end(), "no decode graph for batch {}", n);
  fill(*it, &ctx);
  it->graph->replay();
  return it->logits;
}

}  // namespace hlm
