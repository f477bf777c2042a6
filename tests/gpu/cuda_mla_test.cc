// The CUDA MLA ops (cache_write, mla_cache_write, mla_write_and_absorb, mla_attention, lse_combine) against
// the CPU reference on random inputs. Inputs are rounded to bf16 for the CPU and uploaded as BF16 (the GPU
// cache is BF16), so both backends see the same values. Batches mix prefill rows (causal kv_len), decode
// rows with long contexts (so split-KV splits), rows with kv_len 0, rows outside every sequence and the
// padding entries of a decode graph (token_count 0, num_pages 0, kv_len 0); pages are shuffled over a pool
// with unused pages, and every cache position no query may read (unused pages, the tail of a sequence's last
// page) holds NaN, so a read past a sequence's keys shows up as NaN.
//
// Tolerances of mla_attention:
//  - stats: the logits are fp32 dot products of bf16 values (exact products, only the summation order
//    differs: ~1e-7 relative for D = 576), so max agrees to 1e-5·(1 + |max|); the sum Σ exp(logit − max)
//    to 3e-5 relative (the CPU sums up to 5000 terms sequentially in fp32: ~√n·2^-24 ≈ 4e-6 typical).
//  - out: the GPU rounds the softmax weights p to bf16 for the tensor-core P·V (as FlashMLA does), a
//    relative error |ε| <= 2^-8 per weight, so |Δout| <= 2^-8 · Σ p|v| / Σ p <= 2^-8 · max|v| per element
//    (values are in [-1, 1]), and the relative L2 error over a tensor is ~2^-8/√6 ≈ 1.6e-3 (random
//    rounding): bounded at 5e-3, the project's bound for a bf16-rounded result. With all logits equal
//    (q = 0) every weight is 1, exact in bf16, and out is a plain fp32 mean: 1e-5.
//  - rows without keys: out exactly 0 and stats exactly (-inf, 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "gpu_test_util.h"

namespace hlm::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kMaxTol = 1e-5;
constexpr double kSumTol = 3e-5;
constexpr double kOutRelL2 = 5e-3;
constexpr double kOutAbs = 1.0 / 256 + 1e-5;  // 2^-8 · max|v| with |v| <= 1, plus fp32 accumulation
constexpr double kExactRelL2 = 1e-5;

// One sequence of a test batch. gap: rows before it that belong to no sequence.
struct SeqSpec {
  int64_t gap = 0;
  int64_t keys = 0;         // local keys in its pages
  std::vector<int32_t> kv;  // kv_len of each query row (empty: a padding entry of a decode graph)
};

// Causal prefill rows after `prefix` cached keys: row i sees prefix + i + 1 keys.
std::vector<int32_t> causal(int64_t prefix, int64_t rows) {
  std::vector<int32_t> kv(rows);
  for (int64_t i = 0; i < rows; ++i) kv[i] = static_cast<int32_t>(prefix + i + 1);
  return kv;
}

struct Batch {
  Tensor q;           // [T, H, D] F32, bf16-rounded
  Tensor cache;       // [pages, P, D] F32, bf16-rounded; NaN where no query may read
  Tensor page_table;  // [N] I32
  Tensor kv_len;      // [T] I32
  Tensor table;       // [S, 4] I32 (host), the device form of seqs
  std::vector<MlaSeq> seqs;
};

Batch make_batch(std::mt19937& rng, int64_t heads, int64_t width, int64_t page,
                 const std::vector<SeqSpec>& specs, int64_t trailing_gap, float q_lo, float q_hi,
                 bool shuffle_table = false) {
  int64_t rows = trailing_gap, pages = 0;
  for (const SeqSpec& s : specs) {
    rows += s.gap + static_cast<int64_t>(s.kv.size());
    pages += (s.keys + page - 1) / page;
  }
  const int64_t pool = pages + pages / 3 + 2;  // unused pages are holes between the sequences' pages
  std::vector<int32_t> ids(pool);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  Batch b;
  b.cache = Tensor::filled({pool, page, width}, kNaN);
  b.q = round_bf16(random_f32({rows, heads, width}, rng, q_lo, q_hi));
  b.kv_len = Tensor::empty({rows}, DType::kI32);
  std::vector<int32_t> table;
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  int64_t row = 0, next_page = 0;
  for (const SeqSpec& s : specs) {
    for (int64_t i = 0; i < s.gap; ++i) b.kv_len.data<int32_t>()[row++] = 5;  // ignored: no sequence
    const int64_t n_pages = (s.keys + page - 1) / page;
    MlaSeq m{row, static_cast<int64_t>(s.kv.size()), static_cast<int64_t>(table.size()), n_pages};
    for (int64_t k = 0; k < n_pages; ++k) table.push_back(ids[next_page++]);
    for (int64_t key = 0; key < s.keys; ++key) {
      float* dst = b.cache.data<float>() + (table[m.page_begin + key / page] * page + key % page) * width;
      for (int64_t d = 0; d < width; ++d) dst[d] = bf16_to_f32(f32_to_bf16(value(rng)));
    }
    for (int32_t kv : s.kv) b.kv_len.data<int32_t>()[row++] = kv;
    b.seqs.push_back(m);
  }
  for (int64_t i = 0; i < trailing_gap; ++i) b.kv_len.data<int32_t>()[row++] = 3;
  if (shuffle_table) std::shuffle(b.seqs.begin(), b.seqs.end(), rng);
  b.page_table = Tensor::from_vector_i32({static_cast<int64_t>(table.size())}, table);
  std::vector<int32_t> t;
  for (const MlaSeq& m : b.seqs) {
    for (int64_t v : {m.token_begin, m.token_count, m.page_begin, m.num_pages})
      t.push_back(static_cast<int32_t>(v));
  }
  b.table = Tensor::from_vector_i32({static_cast<int64_t>(b.seqs.size()), 4}, t);
  return b;
}

class CudaMla : public ::testing::Test {
 protected:
  // Runs the op on both backends and compares. The GPU outputs start as NaN, so every element must be
  // written. host_seqs: the host list the GPU call gets (a decode graph passes its captured list, whose
  // counts and pages differ from the device table's).
  void check(Ops& gpu, const Batch& b, float scale, int64_t v_dim, bool q_f32, const std::string& what,
             bool exact = false, const std::vector<MlaSeq>* host_seqs = nullptr) {
    SCOPED_TRACE(what);
    const int64_t rows = b.q.dim(0), heads = b.q.dim(1);
    Tensor out_c, stats_c;
    cpu_->mla_attention(b.q, b.cache, b.page_table, b.seqs, b.kv_len, scale, v_dim, out_c, stats_c);

    MlaBatch batch(host_seqs != nullptr ? *host_seqs : b.seqs);
    if (!b.seqs.empty()) batch.table = gpu.upload(b.table);
    Tensor out_g = gpu.upload(Tensor::filled({rows, heads, v_dim}, kNaN));
    Tensor stats_g = gpu.upload(Tensor::filled({rows, heads, 2}, kNaN));
    gpu.mla_attention(q_f32 ? gpu.upload(b.q) : gpu.upload(as_bf16(b.q)), gpu.upload(as_bf16(b.cache)),
                      gpu.upload(b.page_table), batch, gpu.upload(b.kv_len), scale, v_dim, out_g, stats_g);
    const Tensor out = gpu.to_host_f32(out_g), stats = gpu.to_host_f32(stats_g);

    EXPECT_LE(rel_l2(out, out_c), exact ? kExactRelL2 : kOutRelL2);
    const int64_t empty_rows = expect_attention_rows(out, stats, out_c, stats_c, heads, kMaxTol, kSumTol,
                                                     exact ? kExactRelL2 : kOutAbs);
    EXPECT_GT(empty_rows, 0) << "each batch should hold rows without keys";
  }

  std::mt19937 rng_{31};
  std::unique_ptr<Ops> cpu_ = make_cpu_ops();
};

TEST_F(CudaMla, CacheWriteScattersRowsAndSkipsNegativeSlots) {
  HLM_GPU_OR_SKIP(gpu);
  const int64_t pages = 6, page = 4, width = 576, rows = 9;
  const Tensor cache0 = round_bf16(random_f32({pages, page, width}, rng_));
  const Tensor entries = random_f32({rows, width}, rng_, -3.0f, 3.0f);  // the F32 path rounds on the GPU
  Tensor slots = Tensor::empty({rows}, DType::kI64);
  const int64_t slot_values[rows] = {0, 23, -1, 7, 5, -1, 12, 22, 1};
  for (int64_t i = 0; i < rows; ++i) slots.data<int64_t>()[i] = slot_values[i];
  Tensor want = cache0.clone();
  cpu_->cache_write(round_bf16(entries), slots, want);
  for (bool bf16_entries : {false, true}) {
    Tensor cache = gpu->upload(as_bf16(cache0));
    gpu->cache_write(bf16_entries ? gpu->upload(as_bf16(entries)) : gpu->upload(entries), gpu->upload(slots),
                     cache);
    EXPECT_EQ(rel_l2(gpu->to_host_f32(cache), want), 0.0) << (bf16_entries ? "BF16" : "F32") << " entries";
  }
  Tensor cache = gpu->upload(as_bf16(cache0));
  EXPECT_THROW(gpu->cache_write(gpu->upload(entries), gpu->upload(Tensor::zeros({rows}, DType::kI32)), cache),
               Error);
  EXPECT_THROW(gpu->cache_write(gpu->upload(random_f32({rows, width + 8}, rng_)), gpu->upload(slots), cache),
               Error);
}

// mla_cache_write's one kernel (norm of the latent columns, rope columns copied, rows scattered, negative
// slots skipped) against the CPU's definition (rms_norm, concat_last, cache_write), at the 48B's widths, a
// fixture's and a latent past the 512 columns the kernel keeps in registers, BF16 and F32 ckv: the normed
// columns within bf16 rounding, everything else exact.
TEST_F(CudaMla, FusedCacheWriteMatchesItsDefinition) {
  HLM_GPU_OR_SKIP(gpu);
  for (auto [latent, rope] : {std::pair<int64_t, int64_t>{512, 64}, std::pair<int64_t, int64_t>{16, 8},
                              std::pair<int64_t, int64_t>{712, 40}}) {
    const int64_t pages = 6, page = 4, width = latent + rope, rows = 9;
    const Tensor cache0 = round_bf16(random_f32({pages, page, width}, rng_));
    const Tensor ckv = round_bf16(random_f32({rows, width}, rng_, -3.0f, 3.0f));
    const Tensor norm_w = round_bf16(random_f32({latent}, rng_, 0.5f, 1.5f));
    Tensor slots = Tensor::empty({rows}, DType::kI64);
    const int64_t slot_values[rows] = {0, 23, -1, 7, 5, -1, 12, 22, 1};
    for (int64_t i = 0; i < rows; ++i) slots.data<int64_t>()[i] = slot_values[i];
    Tensor want = cache0.clone();
    cpu_->mla_cache_write(ckv, latent, norm_w, 1e-6f, slots, want);
    for (bool bf16_ckv : {true, false}) {
      const std::string what =
          std::to_string(latent) + "+" + std::to_string(rope) + (bf16_ckv ? " BF16" : " F32");
      Tensor cache = gpu->upload(as_bf16(cache0));
      gpu->mla_cache_write(bf16_ckv ? gpu->upload(as_bf16(ckv)) : gpu->upload(ckv), latent,
                           gpu->upload(as_bf16(norm_w)), 1e-6f, gpu->upload(slots), cache);
      const Tensor got = gpu->to_host_f32(cache);
      EXPECT_LE(rel_l2(got, want), kOutRelL2) << what;
      for (int64_t s = 0; s < pages * page; ++s) {
        const bool written = std::find(slot_values, slot_values + rows, s) != slot_values + rows;
        for (int64_t d = written ? latent : 0; d < width; ++d) {
          ASSERT_EQ(got.data<float>()[s * width + d], want.data<float>()[s * width + d])
              << what << ": slot " << s << " column " << d
              << (written ? " (rope, copied)" : " (not written)");
        }
      }
    }
  }
}

// mla_write_and_absorb: the cache write and the query absorption in one launch write exactly what the two
// CUDA ops write alone (the same CTA bodies), for BF16 and F32 ckv and norm weights, skipped slots (-1 and
// past the cache), the 48B's shape, a latent past the write's register-held columns, and 16 tokens; an F32
// q takes the ops of the definition. Both results also against the CPU's definition.
TEST_F(CudaMla, WriteAndAbsorbIsBothOps) {
  HLM_GPU_OR_SKIP(gpu);
  struct Shape {
    int64_t tokens, heads, nope, rope, latent;
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() &&
           std::equal(a.data<float>(), a.data<float>() + a.numel(), b.data<float>());
  };
  for (const Shape& s : {Shape{1, 32, 128, 64, 512}, Shape{9, 4, 32, 8, 712}, Shape{16, 3, 16, 8, 16}}) {
    const int64_t pages = 8, page = 4, width = s.latent + s.rope;
    const Tensor cache0 = round_bf16(random_f32({pages, page, width}, rng_));
    const Tensor ckv = round_bf16(random_f32({s.tokens, width}, rng_, -3.0f, 3.0f));
    const Tensor norm_w = round_bf16(random_f32({s.latent}, rng_, 0.5f, 1.5f));
    const Tensor q = round_bf16(random_f32({s.tokens, s.heads, s.nope + s.rope}, rng_));
    const Tensor w_uk = round_bf16(random_f32({s.heads, s.nope, s.latent}, rng_, -0.2f, 0.2f));
    // Distinct slots (7i mod 32), but rows 2, 6, ... (-1: another rank's) and 11, 15 (past the cache, which
    // the kernel skips and the CPU op refuses: -1 there).
    Tensor slots = Tensor::empty({s.tokens}, DType::kI64), cpu_slots = Tensor::empty({s.tokens}, DType::kI64);
    for (int64_t i = 0; i < s.tokens; ++i) {
      const bool past = i % 4 == 3 && i > 8;
      slots.data<int64_t>()[i] = i % 4 == 2 ? -1 : past ? pages * page : (7 * i) % (pages * page);
      cpu_slots.data<int64_t>()[i] = past ? -1 : slots.data<int64_t>()[i];
    }
    Tensor want_cache = cache0.clone();
    cpu_->mla_cache_write(ckv, s.latent, norm_w, 1e-6f, cpu_slots, want_cache);
    const Tensor want_q = cpu_->mla_absorb_queries(q, w_uk);
    const Tensor qg = gpu->upload(as_bf16(q)), wg = gpu->upload(as_bf16(w_uk)), sg = gpu->upload(slots);
    for (bool bf16_ckv : {true, false}) {
      for (bool bf16_w : {true, false}) {
        const std::string what = std::to_string(s.tokens) + "x" + std::to_string(s.heads) + " latent " +
                                 std::to_string(s.latent) + (bf16_ckv ? " BF16 ckv" : " F32 ckv") +
                                 (bf16_w ? " BF16 norm" : " F32 norm");
        const Tensor ckv_g = bf16_ckv ? gpu->upload(as_bf16(ckv)) : gpu->upload(ckv);
        const Tensor w_g = bf16_w ? gpu->upload(as_bf16(norm_w)) : gpu->upload(norm_w);
        Tensor alone = gpu->upload(as_bf16(cache0));
        gpu->mla_cache_write(ckv_g, s.latent, w_g, 1e-6f, sg, alone);
        const Tensor q_alone = gpu->to_host_f32(gpu->mla_absorb_queries(qg, wg));
        Tensor fused = gpu->upload(as_bf16(cache0));
        const Tensor q_fused =
            gpu->to_host_f32(gpu->mla_write_and_absorb(ckv_g, s.latent, w_g, 1e-6f, sg, fused, qg, wg));
        const Tensor fused_host = gpu->to_host_f32(fused);
        EXPECT_TRUE(same(fused_host, gpu->to_host_f32(alone))) << what << ": cache";
        EXPECT_TRUE(same(q_fused, q_alone)) << what << ": absorbed queries";
        EXPECT_LE(rel_l2(fused_host, want_cache), kOutRelL2) << what;
        EXPECT_LE(rel_l2(q_fused, want_q), kOutRelL2) << what;
      }
    }
    Tensor cache = gpu->upload(as_bf16(cache0));
    const Tensor q_f32 = gpu->to_host_f32(gpu->mla_write_and_absorb(gpu->upload(as_bf16(ckv)), s.latent,
                                                                    gpu->upload(as_bf16(norm_w)), 1e-6f, sg,
                                                                    cache, gpu->upload(q), wg));
    EXPECT_LE(rel_l2(gpu->to_host_f32(cache), want_cache), kOutRelL2) << "F32 q";
    EXPECT_LE(rel_l2(q_f32, want_q), kOutRelL2) << "F32 q";
  }
}

// The fixtures' widths (kv_lora 16 + rope 8, and 32 + 16), few heads (blocks of 32 rows span tokens), pages
// of 4 and 16, a prefill, rows without keys and rows outside every sequence; F32 and BF16 queries.
TEST_F(CudaMla, SmallWidthsPrefillAndGaps) {
  HLM_GPU_OR_SKIP(gpu);
  struct Shape {
    int64_t heads, latent, rope, page;
  };
  for (const Shape& s : {Shape{3, 16, 8, 4}, Shape{4, 32, 16, 16}, Shape{8, 16, 8, 4}}) {
    const std::vector<SeqSpec> specs = {
        {0, 11, {9, 10, 11}},
        {1, 4, {0}},
        {0, 14, {0, 3, 13, 14, 6}},
        {2, 40, causal(20, 17)},
    };
    const Batch b = make_batch(rng_, s.heads, s.latent + s.rope, s.page, specs, 2, -2.0f, 2.0f);
    for (bool q_f32 : {false, true}) {
      check(*gpu, b, 0.4f, s.latent, q_f32,
            "heads " + std::to_string(s.heads) + " width " + std::to_string(s.latent + s.rope) +
                (q_f32 ? " F32 q" : " BF16 q"));
    }
  }
}

// A decode step as the graphs run it: one token per entry, long contexts (5000 keys: many 64-key tiles, so
// the keys really split), and padding entries (token_count 0, num_pages 0, kv_len 0). The GPU gets the
// captured host list ({i, 1, 0, 0} for every entry) while the device table holds the step's real entries,
// as in a graph replay. 32 heads of D = 576, v = 512 (Kimi-Linear-48B); batch 8 and batch 1.
TEST_F(CudaMla, DecodeGraphLayoutWithLongContexts) {
  HLM_GPU_OR_SKIP(gpu);
  const float scale = 1.0f / std::sqrt(192.0f);
  const std::vector<int64_t> keys = {5000, 1, 0, 64, 4097, 0, 2500, 0};  // 0: padding entries
  std::vector<SeqSpec> specs;
  for (int64_t k : keys)
    specs.push_back(k == 0 ? SeqSpec{0, 0, {0}} : SeqSpec{0, k, {static_cast<int32_t>(k)}});
  Batch b = make_batch(rng_, 32, 576, 64, specs, 0, -2.0f, 2.0f);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] == 0) {  // a padding entry covers no row
      b.seqs[i].token_count = 0;
      b.table.data<int32_t>()[4 * i + 1] = 0;
    }
  }
  std::vector<MlaSeq> captured;
  for (size_t i = 0; i < keys.size(); ++i) captured.push_back(MlaSeq{static_cast<int64_t>(i), 1, 0, 0});
  check(*gpu, b, scale, 512, false, "batch 8", false, &captured);

  const Batch one = make_batch(rng_, 32, 576, 64, {SeqSpec{0, 5000, {5000}}}, 1, -2.0f, 2.0f);
  check(*gpu, one, scale, 512, false, "batch 1 and a padding row");
}

// Prefill chunks next to decode rows in one batch, 12 heads (K3 at tp 8; 32-row blocks span tokens), the
// table listed out of token order; with few row blocks the prefill rows are split over the keys too.
TEST_F(CudaMla, PrefillMixedWithDecode) {
  HLM_GPU_OR_SKIP(gpu);
  const std::vector<SeqSpec> specs = {
      {0, 137, causal(100, 37)},
      {0, 3000, {3000}},
      {1, 0, {0, 0, 0, 0, 0}},
      {0, 20, causal(0, 20)},
  };
  const Batch b = make_batch(rng_, 12, 576, 64, specs, 1, -2.0f, 2.0f, /*shuffle_table=*/true);
  check(*gpu, b, 1.0f / std::sqrt(192.0f), 512, false, "12 heads");
}

// K3's 96 heads on one rank: each token a block of 64 rows (two warpgroups sharing each key tile) and one
// of 32 (the second warpgroup idle); and 64 heads, one full block per token.
TEST_F(CudaMla, NinetySixHeads) {
  HLM_GPU_OR_SKIP(gpu);
  const std::vector<SeqSpec> specs = {
      {0, 3000, {3000}}, {0, 700, {700}}, {0, 15, causal(9, 6)}, {0, 64, {0}}};
  for (int64_t heads : {96, 64}) {
    const Batch b = make_batch(rng_, heads, 576, 64, specs, 0, -2.0f, 2.0f);
    check(*gpu, b, 1.0f / std::sqrt(192.0f), 512, true, std::to_string(heads) + " heads");
  }
}

// Pages that do not match the kernel's 64-key tiles (16: four pages per tile; 48: tiles straddle pages), and
// a row width between the kernel's two instantiations (latent 256 + rope 64: the wide kernel zero-fills the
// columns past D and drops the value columns past v_dim).
TEST_F(CudaMla, PagesAcrossTilesAndNarrowerWideRows) {
  HLM_GPU_OR_SKIP(gpu);
  struct Shape {
    int64_t heads, latent, rope, page;
  };
  for (const Shape& s : {Shape{32, 512, 64, 16}, Shape{16, 512, 64, 48}, Shape{8, 256, 64, 48}}) {
    const std::vector<SeqSpec> specs = {{0, 1500, {1500}}, {1, 200, causal(150, 50)}, {0, 7, {7}}};
    const Batch b = make_batch(rng_, s.heads, s.latent + s.rope, s.page, specs, 1, -2.0f, 2.0f,
                               /*shuffle_table=*/true);
    check(*gpu, b, 1.0f / std::sqrt(192.0f), s.latent, false,
          "heads " + std::to_string(s.heads) + " width " + std::to_string(s.latent + s.rope) + " pages of " +
              std::to_string(s.page));
  }
}

// Enough row blocks (82 tokens of 32 heads) that a 132-SM GPU runs one split: the kernel writes the result
// and zeroes the rows outside every sequence itself.
TEST_F(CudaMla, LongPrefillOneSplit) {
  HLM_GPU_OR_SKIP(gpu);
  const std::vector<SeqSpec> specs = {{0, 570, causal(500, 70)}, {2, 10, causal(-1, 10)}};
  const Batch b = make_batch(rng_, 32, 576, 64, specs, 0, -2.0f, 2.0f);
  check(*gpu, b, 1.0f / std::sqrt(192.0f), 512, false, "82 rows");
}

// q = 0: every logit is 0, every softmax weight 1 (exact in bf16), so out is the plain mean of the visible
// values and must match to fp32 accumulation; this pins down P·V, the tiling and the split merge exactly.
TEST_F(CudaMla, UniformWeightsGiveTheExactMean) {
  HLM_GPU_OR_SKIP(gpu);
  const std::vector<SeqSpec> specs = {{0, 3001, {3001}}, {0, 40, causal(0, 40)}, {1, 5, {0}}};
  for (int64_t heads : {32, 5}) {
    const Batch b = make_batch(rng_, heads, 576, 64, specs, 0, 0.0f, 0.0f);
    check(*gpu, b, 0.1f, 512, false, "heads " + std::to_string(heads), /*exact=*/true);
  }
}

// Scores that keep growing along the keys (the rope columns of key k scaled by k / 40, the values left in
// [-1, 1]), so every row's max moves far past the softmax reference in late tiles too: the kernel's
// rescaling of O and of the sum (it moves its reference only when a score passes it by 2^8) is exercised
// across splits, against the CPU's exact softmax.
TEST_F(CudaMla, ScoresGrowingAlongTheKeys) {
  HLM_GPU_OR_SKIP(gpu);
  const std::vector<SeqSpec> specs = {{0, 4000, {4000}}, {0, 900, causal(800, 100)}, {1, 3, {0}}};
  Batch b = make_batch(rng_, 32, 576, 64, specs, 0, -2.0f, 2.0f);
  const int64_t pages = b.cache.dim(0), page = b.cache.dim(1);
  for (const MlaSeq& m : b.seqs) {
    for (int64_t key = 0; key < m.num_pages * page; ++key) {
      const int64_t slot = b.page_table.data<int32_t>()[m.page_begin + key / page] * page + key % page;
      ASSERT_LT(slot, pages * page);
      float* row = b.cache.data<float>() + slot * 576;
      for (int64_t d = 512; d < 576; ++d)
        row[d] = bf16_to_f32(f32_to_bf16(row[d] * static_cast<float>(key) / 40));
    }
  }
  check(*gpu, b, 1.0f / std::sqrt(192.0f), 512, false, "growing scores");
}

TEST_F(CudaMla, AttentionRejectsBadArguments) {
  HLM_GPU_OR_SKIP(gpu);
  const Batch b = make_batch(rng_, 4, 576, 64, {SeqSpec{0, 10, {10}}}, 0, -1.0f, 1.0f);
  MlaBatch batch(b.seqs);
  batch.table = gpu->upload(b.table);
  const Tensor q = gpu->upload(as_bf16(b.q)), cache = gpu->upload(as_bf16(b.cache));
  const Tensor pt = gpu->upload(b.page_table), kv = gpu->upload(b.kv_len);
  auto run = [&](const Tensor& qq, const Tensor& cc, const MlaBatch& bb, int64_t v_dim) {
    Tensor out, stats;
    gpu->mla_attention(qq, cc, pt, bb, kv, 0.1f, v_dim, out, stats);
  };
  EXPECT_NO_THROW(run(q, cache, batch, 512));
  EXPECT_THROW(run(q, cache, batch, 577), Error);                 // v_dim past the row
  EXPECT_THROW(run(q, gpu->upload(b.cache), batch, 512), Error);  // an F32 cache
  MlaBatch no_table(b.seqs);
  EXPECT_THROW(run(q, cache, no_table, 512), Error);  // no device table
  std::vector<MlaSeq> outside = b.seqs;
  outside[0].token_count = 2;
  MlaBatch bad(outside);
  bad.table = batch.table;
  EXPECT_THROW(run(q, cache, bad, 512), Error);  // rows past q
  const Batch wide = make_batch(rng_, 2, 640, 64, {SeqSpec{0, 3, {3}}}, 0, -1.0f, 1.0f);
  MlaBatch wide_batch(wide.seqs);
  wide_batch.table = gpu->upload(wide.table);
  Tensor out, stats;
  EXPECT_THROW(gpu->mla_attention(gpu->upload(as_bf16(wide.q)), gpu->upload(as_bf16(wide.cache)),
                                  gpu->upload(wide.page_table), wide_batch, gpu->upload(wide.kv_len), 0.1f,
                                  512, out, stats),
               Error);  // D = 640 has no kernel
  for (float scale : {0.0f, -0.1f}) {
    Tensor o, st;
    EXPECT_THROW(gpu->mla_attention(q, cache, pt, batch, kv, scale, 512, o, st), Error);  // ranks raw scores
  }
}

// lse_combine: parts of empty sources ((-inf, 0)) hold NaN and must not be read; a row with no keys on any
// source gives 0. fp32 throughout (weights differ from the CPU's by expf rounding): 1e-5 relative. The
// 132-source shape takes the kernel's batched loads (256 CTAs), the 384-row one its one-source-at-a-time
// loop (1,536 CTAs, past four per SM).
TEST_F(CudaMla, LseCombineMatchesCpuAndSkipsEmptySources) {
  HLM_GPU_OR_SKIP(gpu);
  struct Shape {
    int64_t sources, tokens, heads, v;
  };
  for (const Shape& s :
       {Shape{4, 5, 6, 37}, Shape{132, 2, 32, 512}, Shape{1, 3, 2, 16}, Shape{24, 4, 96, 512}}) {
    Tensor parts = random_f32({s.sources, s.tokens, s.heads, s.v}, rng_);
    Tensor stats = Tensor::empty({s.sources, s.tokens, s.heads, 2}, DType::kF32);
    std::uniform_real_distribution<float> max_dist(-30.0f, 30.0f), sum_dist(0.5f, 200.0f);
    std::bernoulli_distribution empty(0.3);
    const int64_t rows = s.tokens * s.heads;
    for (int64_t i = 0; i < s.sources; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        float* st = stats.data<float>() + (i * rows + r) * 2;
        // Row 0 is empty on every source; others at random.
        if (r == 0 || empty(rng_)) {
          st[0] = -kInf;
          st[1] = 0.0f;
          std::fill_n(parts.data<float>() + (i * rows + r) * s.v, s.v, kNaN);
        } else {
          st[0] = max_dist(rng_);
          st[1] = sum_dist(rng_);
        }
      }
    }
    const Tensor want = cpu_->lse_combine(parts, stats);
    const Tensor got = gpu->to_host_f32(gpu->lse_combine(gpu->upload(parts), gpu->upload(stats)));
    SCOPED_TRACE("sources " + std::to_string(s.sources));
    EXPECT_LE(rel_l2(got, want), 1e-5);
    for (int64_t e = 0; e < s.v; ++e) EXPECT_EQ(got.data<float>()[e], 0.0f) << e;
  }
}

}  // namespace
}  // namespace hlm::test
