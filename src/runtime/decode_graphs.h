// DecodeGraphs: decode steps replayed as CUDA graphs. One graph per batch-size bucket (1, 2, 4, ... up to
// max_batch) is captured at start-up against fixed device buffers for the step metadata, on padding rows
// that touch no sequence's KV or KDA state (docs/HELIX.md §10: nothing is captured or warmed up on live
// request state). A decode step of b sequences then copies its metadata into the smallest bucket >= b,
// pads the rest (0 tokens, slot -1, no pages, kv_len 0, no cache write) and replays the graph.
#pragma once

#include <memory>
#include <vector>

#include "model/model.h"

namespace hlm {

class DecodeGraphs {
 public:
  // `page_capacity`: the most MLA pages a step's sequences can hold on this rank together.
  DecodeGraphs(Model& model, int32_t max_batch, int64_t page_capacity);
  ~DecodeGraphs();

  // Captures every bucket's graph; every rank calls it at the same point (the graphs hold collectives).
  // Returns false (and keeps no graphs) where the backend has none.
  bool capture();
  bool covers(size_t batch) const {
    return !buckets_.empty() && batch <= static_cast<size_t>(buckets_.back().batch);
  }
  // Runs decode context `ctx` (host tensors, b entries of one token) through the graph of the smallest
  // bucket >= b. Returns that bucket's logits [B, vocab] on the backend; rows >= b are padding.
  Tensor run(const StepContext& ctx);

 private:
  // Where each of a step's metadata tensors lies in its bucket's buffer, in 32-bit words; every tensor
  // starts 16-byte aligned, and the page table comes last, so a step uploads only the pages it lists.
  struct Layout {
    int64_t slots = 0, ids = 0, kv_len = 0, rows = 0, seqs = 0, mla = 0, pages = 0, words = 0;
  };
  struct Bucket {
    int32_t batch = 0;
    StepContext ctx;  // spans of the capture; tensors: views into `metadata`
    Layout layout;
    Tensor metadata;  // [words] I32 on the backend: every input of a step, so it goes up in one copy
    Tensor logits;    // [B, vocab], written by every replay
    std::unique_ptr<StepGraph> graph;
  };
  // Copies host metadata (ctx's first entries, padded to the bucket) into the bucket's buffer.
  void fill(Bucket& b, const StepContext* ctx);

  Model& model_;
  int64_t page_capacity_;
  std::vector<Bucket> buckets_;
};

}  // namespace hlm
