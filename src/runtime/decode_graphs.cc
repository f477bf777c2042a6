#include "runtime/decode_graphs.h"

#include <algorithm>
#include <cstddef>
#include <memory>

#include "base/log.h"

namespace hlm {

namespace {

// From word `at` of `buffer` (32-bit words) on, a `dtype` tensor of `shape`.
Tensor words_view(const Tensor& buffer, int64_t at, Shape shape, DType dtype) {
  const size_t end =
      static_cast<size_t>(at) * 4 + static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  HLM_CHECK(end <= buffer.nbytes(), "decode graph metadata: a view ends at byte {} of a {}-byte buffer", end,
            buffer.nbytes());
  auto* base = static_cast<std::byte*>(const_cast<void*>(buffer.raw())) + at * 4;
  return Tensor::wrap(base, std::move(shape), dtype, buffer.device(), std::make_shared<Tensor>(buffer));
}

}  // namespace

DecodeGraphs::DecodeGraphs(Model& model, int32_t max_batch, int64_t page_capacity)
    : model_(model), page_capacity_(std::max<int64_t>(page_capacity, 1)) {
  for (int32_t b = 1;; b *= 2) {
    Bucket bucket;
    bucket.batch = std::min(b, max_batch);
    buckets_.push_back(std::move(bucket));
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
    // One buffer holds the step's inputs: separate uploads were one copy each on the stream before the
    // graph, and host calls the step waits for (the 48B's batch-1 step on an H200: 2.411-2.424 ms with
    // seven uploads, 2.360-2.378 with one; docs/benchmarks.md).
    Layout& l = b.layout;
    auto take = [&](int64_t words) {
      const int64_t at = l.words;
      l.words += (words + 3) / 4 * 4;
      return at;
    };
    l.slots = take(2 * static_cast<int64_t>(n));
    l.ids = take(n);
    l.kv_len = take(n);
    l.rows = take(n);
    l.seqs = take(3 * static_cast<int64_t>(n));
    l.mla = take(4 * static_cast<int64_t>(n));
    l.pages = take(page_capacity_);
    b.metadata = ops.zeros({l.words}, DType::kI32);
    c.token_ids = words_view(b.metadata, l.ids, {n}, DType::kI32);
    c.write_slots = words_view(b.metadata, l.slots, {n}, DType::kI64);
    c.kv_len = words_view(b.metadata, l.kv_len, {n}, DType::kI32);
    c.page_table = words_view(b.metadata, l.pages, {page_capacity_}, DType::kI32);
    c.logit_rows = words_view(b.metadata, l.rows, {n}, DType::kI32);
    c.every_row_logits = true;  // fill() lists rows 0 .. n-1, padding rows included
    c.seqs.table = words_view(b.metadata, l.seqs, {n, 3}, DType::kI32);
    c.mla.table = words_view(b.metadata, l.mla, {n, 4}, DType::kI32);
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
  const int64_t pages = ctx == nullptr ? 0 : ctx->page_table.numel();
  HLM_CHECK(pages <= page_capacity_, "decode step lists {} pages, the graph buffer holds {}", pages,
            page_capacity_);
  const Layout& l = b.layout;
  // The buffer up to the step's last page (the capture's pages past it are never read: kv_len bounds them).
  Tensor host = Tensor::zeros({l.pages + pages}, DType::kI32);
  int32_t* words = host.data<int32_t>();
  auto* slots = reinterpret_cast<int64_t*>(words + l.slots);
  for (int32_t i = 0; i < n; ++i) {
    const bool live = i < real;
    slots[i] = live ? ctx->write_slots.data<int64_t>()[i] : -1;
    words[l.rows + i] = i;
    if (live) {
      words[l.ids + i] = ctx->token_ids.data<int32_t>()[i];
      words[l.kv_len + i] = ctx->kv_len.data<int32_t>()[i];
    }
    const SeqSpan s = live ? ctx->seqs.spans[i] : SeqSpan{i, 0, -1};
    const MlaSeq m = live ? ctx->mla.seqs[i] : MlaSeq{i, 0, 0, 0};
    int32_t* seq = words + l.seqs + i * 3;
    seq[0] = static_cast<int32_t>(s.token_begin);
    seq[1] = static_cast<int32_t>(s.token_count);
    seq[2] = s.slot;
    int32_t* mla = words + l.mla + i * 4;
    mla[0] = static_cast<int32_t>(m.token_begin);
    mla[1] = static_cast<int32_t>(m.token_count);
    mla[2] = static_cast<int32_t>(m.page_begin);
    mla[3] = static_cast<int32_t>(m.num_pages);
  }
  if (pages > 0) std::copy_n(ctx->page_table.data<int32_t>(), pages, words + l.pages);
  Tensor dst = b.metadata.slice(0, l.pages + pages);
  model_.ops().upload_into(host, dst);
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
