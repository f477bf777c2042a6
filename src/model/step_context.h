// StepContext: everything one forward step needs besides the weights, already resolved to this rank's
// view (docs/HELIX.md §3): which rows belong to which sequence and state slot, where each new token's
// latent goes (or -1 when another CP rank owns it), and how many local keys each query sees. Built by the
// runtime from the KV manager and the placement functions on the host, then staged on the backend (the
// tensors below live where the ops run; SeqBatch/MlaBatch carry both forms); layers only read it.
#pragma once

#include <vector>

#include "base/tensor.h"
#include "ops/ops.h"

namespace hlm {

// Which form of MLA a step's prefill runs (docs/KERNELS.md §6): absorbed (MQA over the latent cache, the
// decode form), expanded (MHA over keys expanded per head; tensor parallel only), or auto: per sequence, the
// one the cost model of MlaLayer picks. Decode-only steps always run absorbed.
enum class MlaPrefillForm { kAuto, kAbsorbed, kExpanded };

struct StepContext {
  int64_t num_tokens = 0;
  Tensor token_ids;          // [T] I32
  SeqBatch seqs;             // KDA: rows and state slot of each sequence
  bool decode_only = false;  // every sequence has exactly one new token (recurrent KDA path)

  // MLA, this rank's view.
  Tensor write_slots;  // [T] I64: flat cache slot (page·P + offset) or -1
  Tensor kv_len;       // [T] I32: visible local keys of each query
  Tensor page_table;   // [pages] I32: local physical pages, sequence after sequence
  MlaBatch mla;
  MlaPrefillForm mla_prefill = MlaPrefillForm::kAuto;

  Tensor logit_rows;  // [R] I32: rows whose logits the step returns
  // logit_rows is every row, 0 .. T-1 in order (decode): the final norm then needs no gather, and the last
  // residual add carries it.
  bool every_row_logits = false;
};

}  // namespace hlm
