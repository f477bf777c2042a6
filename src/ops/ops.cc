#include "ops/ops.h"

namespace hlm {

Tensor Ops::upload(const Tensor& host) {
  const bool index = host.dtype() == DType::kI32 || host.dtype() == DType::kI64 || host.dtype() == DType::kU8;
  Tensor t = empty(host.shape(), index ? host.dtype() : weight_dtype(host.dtype()));
  upload_into(host, t);
  return t;
}

void check_router_params(const RouterParams& p, int64_t experts, const char* op) {
  const int64_t groups = p.num_expert_group;
  HLM_CHECK(groups >= 1 && experts % groups == 0 && experts / groups >= 2,
            "{}: num_expert_group {} must divide the {} experts into groups of at least 2", op, groups,
            experts);
  const int64_t per_group = experts / groups;
  HLM_CHECK(p.topk_group >= 1 && p.topk_group <= groups, "{}: topk_group {} must be in [1, {}]", op,
            p.topk_group, groups);
  HLM_CHECK(p.top_k >= 1 && p.top_k <= p.topk_group * per_group,
            "{}: top_k {} must be in [1, {}] (topk_group {} groups of {} experts)", op, p.top_k,
            p.topk_group * per_group, p.topk_group, per_group);
}

Tensor mla_batch_table(const std::vector<MlaSeq>& seqs) {
  Tensor t = Tensor::empty({static_cast<int64_t>(seqs.size()), 4}, DType::kI32);
  int32_t* p = t.data<int32_t>();
  for (size_t i = 0; i < seqs.size(); ++i) {
    p[i * 4 + 0] = static_cast<int32_t>(seqs[i].token_begin);
    p[i * 4 + 1] = static_cast<int32_t>(seqs[i].token_count);
    p[i * 4 + 2] = static_cast<int32_t>(seqs[i].page_begin);
    p[i * 4 + 3] = static_cast<int32_t>(seqs[i].num_pages);
  }
  return t;
}

bool mla_expanded_heads_supported(int64_t nope, int64_t rope, int64_t v) {
  return (nope == 128 && rope == 64 && v == 128) || (nope == 16 && rope == 8 && v == 16);
}

void check_mla_gather_keys(const Tensor& cache, const Tensor& page_table, const MlaSeq& seq,
                           int64_t key_begin, int64_t count) {
  HLM_CHECK(cache.rank() == 3 && page_table.rank() == 1,
            "mla_gather_keys: cache {} and page_table {} must be [pages, P, D] and [N]", cache.describe(),
            page_table.describe());
  HLM_CHECK(seq.page_begin >= 0 && seq.num_pages >= 0 && seq.page_begin + seq.num_pages <= page_table.dim(0),
            "mla_gather_keys: the sequence lists page_table entries [{}, {}), outside the {} entries",
            seq.page_begin, seq.page_begin + seq.num_pages, page_table.dim(0));
  const int64_t keys = seq.num_pages * cache.dim(1);
  HLM_CHECK(key_begin >= 0 && count >= 0 && key_begin + count <= keys,
            "mla_gather_keys: keys [{}, {}) are outside the {} keys of the sequence's {} pages", key_begin,
            key_begin + count, keys, seq.num_pages);
}

void check_mla_expanded_attention(const Tensor& q, const Tensor& k_nope, const Tensor& v, const Tensor& keys,
                                  int64_t latent, const Tensor& kv_len, int64_t key_begin, bool merge,
                                  const Tensor& out, const Tensor& stats) {
  const char* op = "mla_expanded_attention";
  HLM_CHECK(
      q.rank() == 3 && k_nope.rank() == 3 && v.rank() == 3 && keys.rank() == 2 && kv_len.rank() == 1,
      "{}: q {}, k_nope {}, v {}, keys {} and kv_len {} must be [T, H, nope + R], [N, H, nope], [N, H, V], "
      "[N, L + R] and [T]",
      op, q.describe(), k_nope.describe(), v.describe(), keys.describe(), kv_len.describe());
  const int64_t n = k_nope.dim(0), heads = q.dim(1), nope = k_nope.dim(2), rope = q.dim(2) - nope;
  HLM_CHECK(k_nope.dim(1) == heads && v.dim(0) == n && v.dim(1) == heads && keys.dim(0) == n,
            "{}: k_nope {}, v {} and keys {} must hold the same keys, for the {} heads of q {}", op,
            k_nope.describe(), v.describe(), keys.describe(), heads, q.describe());
  HLM_CHECK(kv_len.dim(0) == q.dim(0), "{}: kv_len {} must hold one length per query of q {}", op,
            kv_len.describe(), q.describe());
  HLM_CHECK(rope >= 0 && latent >= 0 && latent + rope == keys.dim(1),
            "{}: q's width {} = nope {} + R needs keys {} of width L {} + R", op, q.dim(2), nope,
            keys.describe(), latent);
  HLM_CHECK(key_begin >= 0, "{}: key_begin {} is negative", op, key_begin);
  HLM_CHECK(!merge || (out.defined() && stats.defined()),
            "{}: merging needs the earlier chunks' out and stats", op);
}

void check_kda_decode_layer(const Tensor& proj, const KdaProjColumns& cols, const Tensor& conv_w,
                            const Tensor& f_b, const Tensor& g_b, const Tensor& conv_state,
                            const Tensor& state, const char* op) {
  HLM_CHECK(state.rank() == 4, "{}: state {} must be [slots, H, K, V]", op, state.describe());
  const int64_t heads = state.dim(1), kd = state.dim(2), vd = state.dim(3);
  HLM_CHECK(kd == vd, "{}: state {} must have K = V (q, k and v share the conv's head layout)", op,
            state.describe());
  HLM_CHECK(proj.rank() == 2, "{}: proj {} must be [T, P]", op, proj.describe());
  HLM_CHECK(f_b.rank() == 2 && f_b.dim(0) == heads * kd,
            "{}: f_b {} must be [H·K, r] with H·K = {} (the state's heads and key dimension)", op,
            f_b.describe(), heads * kd);
  HLM_CHECK(!g_b.defined() || (g_b.rank() == 2 && g_b.dim(0) == heads * vd),
            "{}: g_b {} must be [H·V, r] with H·V = {} (the state's heads and value dimension)", op,
            g_b.describe(), heads * vd);
  HLM_CHECK(conv_w.rank() == 2 && conv_w.dim(0) == 3 * heads * kd && conv_w.dim(1) >= 1,
            "{}: conv_w {} must be [3·H·K, W] with 3·H·K = {}", op, conv_w.describe(), 3 * heads * kd);
  HLM_CHECK(conv_state.rank() == 3 && conv_state.dim(0) == state.dim(0) &&
                conv_state.dim(1) == conv_w.dim(0) && conv_state.dim(2) == conv_w.dim(1) - 1,
            "{}: conv_state {} must be [slots, 3·H·K, W-1] = [{}, {}, {}]", op, conv_state.describe(),
            state.dim(0), conv_w.dim(0), conv_w.dim(1) - 1);
  const int64_t width = proj.dim(1);
  const struct {
    const char* part;
    int64_t begin, count;
  } parts[] = {{"q|k|v", cols.qkv, 3 * heads * kd},
               {"f_a", cols.fa, f_b.dim(1)},
               {"gate", cols.gate, g_b.defined() ? g_b.dim(1) : heads * vd},
               {"beta", cols.beta, heads}};
  for (const auto& part : parts) {
    HLM_CHECK(part.begin >= 0 && part.begin + part.count <= width,
              "{}: the {} columns [{}, {}) are outside proj {}", op, part.part, part.begin,
              part.begin + part.count, proj.describe());
  }
}

Tensor Ops::kda_decode_layer(const Tensor& proj, const KdaProjColumns& cols, const Tensor& conv_w,
                             const Tensor& f_b, const Tensor& g_b, const KdaHeadParams& hp,
                             const SeqBatch& seqs, Tensor& conv_state, Tensor& state) {
  check_kda_decode_layer(proj, cols, conv_w, f_b, g_b, conv_state, state, "kda_decode_layer");
  const int64_t t = proj.dim(0), hl = state.dim(1), hd = state.dim(2), dl = hl * hd;
  begin_side();
  const Tensor graw = linear(slice_last(proj, cols.fa, cols.fa + f_b.dim(1)), f_b);  // [T, H·K]
  const Tensor beta_logits = slice_last(proj, cols.beta, cols.beta + hl);            // [T, H]
  Tensor gate = slice_last(proj, cols.gate, cols.gate + (g_b.defined() ? g_b.dim(1) : dl));
  if (g_b.defined()) gate = linear(gate, g_b);
  gate = gate.reshape({t, hl, hd});  // [T, H, V]
  end_side();
  const Tensor qkv = short_conv(slice_last(proj, cols.qkv, cols.qkv + 3 * dl), conv_w, seqs, conv_state);
  const Tensor q = slice_last(qkv, 0, dl).reshape({t, hl, hd});  // [T, H, K] after the conv's silu
  const Tensor k = slice_last(qkv, dl, 2 * dl).reshape({t, hl, hd});
  const Tensor v = slice_last(qkv, 2 * dl, 3 * dl).reshape({t, hl, hd});
  join_side();
  return kda_decode_gated(q, k, v, graw, beta_logits, gate, hp, seqs, state);
}

}  // namespace hlm
