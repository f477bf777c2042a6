// libFuzzer target for the size arithmetic of the CLI and the engine (the path of issue 12's heap
// overflow, where a wrapped page count sized a KV pool that cache writes overran): layout, page size,
// batch, sequence length and context come from the input, for three model configs. Sizing must either
// refuse with an hlm::Error or give sizes the bookkeeping then fits in: every sequence the pool was
// sized for can reserve its pages, and every cache index lies inside the pool. A crash, a sanitizer
// report, or any exception once sizing has succeeded is a bug.
#include <fuzzer/FuzzedDataProvider.h>
#include <stdlib.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "cache/kv_manager.h"
#include "config/model_config.h"
#include "model/memory_plan.h"
#include "parallel/layout_rules.h"

namespace {

const std::vector<hlm::ModelConfig>& configs() {
  static const std::vector<hlm::ModelConfig> all = {
      hlm::load_model_config(HLM_FIXTURES_DIR "/kimi-tiny-dense-first/config.json"),
      hlm::load_model_config(HLM_FIXTURES_DIR "/configs/kimi-linear-48b-a3b.json"),
      hlm::load_model_config(HLM_FIXTURES_DIR "/configs/kimi-k3.json"),
  };
  return all;
}

// Small values are the interesting ones most of the time; the full range finds the wraps.
int64_t size_value(FuzzedDataProvider& in) {
  return in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-2, 300) : in.ConsumeIntegral<int64_t>();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const hlm::ModelConfig& cfg = configs()[in.ConsumeIntegralInRange<size_t>(0, configs().size() - 1)];
  const int tp = in.ConsumeBool() ? in.ConsumeIntegralInRange(-1, 8) : in.ConsumeIntegral<int>();
  const int cp = in.ConsumeBool() ? in.ConsumeIntegralInRange(-1, 8) : in.ConsumeIntegral<int>();
  const int moe_ep = in.ConsumeIntegralInRange(0, 4), moe_tp = in.ConsumeIntegralInRange(0, 4);
  const int64_t tokens_per_block = size_value(in), batch = size_value(in), seq_len = size_value(in);
  const int64_t context = size_value(in);

  hlm::CacheSize cache;
  hlm::Mapping mapping;
  try {
    const hlm::LayoutRequest req{tp, cp, moe_ep, moe_tp, tokens_per_block};
    if (!hlm::layout_violations(cfg, req).empty()) return 0;
    mapping = hlm::Mapping::make(tp, cp, in.ConsumeIntegralInRange(0, tp * cp - 1), moe_ep, moe_tp);
    // `plan`'s figures: whole pages at the context, for the batch.
    const hlm::StateBytes st = hlm::state_bytes(cfg, mapping, 2, 2);
    const int64_t kv = hlm::kv_bytes_at(st, hlm::Placement{tokens_per_block, cp}, mapping.cp_rank(), context);
    if (kv < 0) abort();
    // The engine's options pass the same range checks the CLI applies (check_session_options).
    if (batch <= 0 || seq_len <= 0 || seq_len > hlm::kMaxSeqLen) return 0;
    cache = hlm::cache_size(cfg, mapping, tokens_per_block, batch, seq_len, 4, 4);
    if (cache.pages < 0 || cache.kv_pool_bytes < 0 || cache.kda_state_bytes < 0 || cache.total() < 0) abort();
  } catch (const hlm::Error&) {
    return 0;  // refusing a size is fine; wrapping is not
  }
  // Small enough to walk: the pool must hold `batch` sequences of `seq_len` tokens, each index in range.
  if (batch > 4 || seq_len > 4096) return 0;
  const hlm::Placement placement{tokens_per_block, cp};
  hlm::KvManager kv(placement, mapping.cp_rank(), cache.pages, static_cast<int32_t>(batch));
  for (int64_t s = 0; s < batch; ++s) {
    kv.add(s);
    for (int64_t pos = 0; pos < seq_len; pos += 97) {
      const int64_t n = std::min<int64_t>(97, seq_len - pos);
      kv.reserve(s, n);
      for (int64_t p = pos; p < pos + n; ++p) {
        const int64_t index = kv.cache_index(s, p);
        if (index >= cache.pages * tokens_per_block ||
            (index < 0 && placement.owner(p) == mapping.cp_rank())) {
          abort();
        }
      }
      kv.commit(s, n);
    }
  }
  return 0;
}
