// The op interface. Every layer in model/ is written once against this class and never branches on the
// backend; ops/cpu/ is the reference implementation (fp32, OpenMP, OpenBLAS for GEMMs) and every other
// backend (ops/cuda/) is tested against it. Ops return freshly allocated outputs unless they update a cache
// or state in place; an output passed by reference is allocated when undefined, and otherwise must already
// have the output's shape and dtype and is overwritten. Ragged batches (several sequences, each with its
// own number of new tokens) are described by SeqBatch lists; tokens of one sequence are consecutive rows,
// the spans of one call are disjoint and use distinct slots, and rows outside every span come out as 0.
//
// Dtypes: the CPU backend computes in F32. A device backend keeps weights as stored (bf16, or f32 where the
// checkpoint stores f32) and activations in bf16 with f32 accumulation, so every op accepts F32 or BF16
// float inputs and says which dtype it returns where that matters (KDA gate, state, MLA stats, router
// weights and logits are always F32).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/tensor.h"
#include "config/model_config.h"
#include "ops/section_marks.h"

namespace hlm {

// One sequence's rows in a ragged batch, and the cache slot holding its recurrent/conv state.
struct SeqSpan {
  int64_t token_begin = 0;
  int64_t token_count = 0;
  int32_t slot = 0;
};

// A ragged batch in the two forms a backend needs: `spans` on the host (argument checks, launch shapes)
// and, for a device backend, `table`: the same spans as I32 [S, 3] (token_begin, token_count, slot) in
// device memory, which is what kernels read. Under CUDA graphs the table is a fixed buffer refilled before
// each replay while `spans` are those of the captured step, so kernels take counts and slots from the
// table only. A span with token_count 0 is padding (a graph's unused batch entry) and may use slot -1.
struct SeqBatch {
  SeqBatch(std::vector<SeqSpan> s = {}) : spans(std::move(s)) {}  // NOLINT: implicit from a span list
  SeqBatch(std::initializer_list<SeqSpan> s) : spans(s) {}
  std::vector<SeqSpan> spans;
  Tensor table;
};

// One sequence's MLA attention work on this rank: its queries are rows [token_begin, token_begin +
// token_count); its local keys are the first kv_len[t] entries of the pages listed in
// page_table[page_begin, page_begin + num_pages) (physical page ids, I32, in local order).
struct MlaSeq {
  int64_t token_begin = 0;
  int64_t token_count = 0;
  int64_t page_begin = 0;
  int64_t num_pages = 0;
};

// The head shapes (nope, R, V) the GPU kernel of the expanded (MHA) form of MLA is built for: Kimi Linear's
// and K3's (128, 64, 128), and the test fixtures' (16, 8, 16). Models with other heads keep the absorbed
// form.
bool mla_expanded_heads_supported(int64_t nope, int64_t rope, int64_t v);

// mla_gather_keys's range rule (Ops below), the same for every backend: the sequence's page_table entries
// inside page_table [N], keys [key_begin, key_begin + count) inside its pages of a cache [pages, P, D].
void check_mla_gather_keys(const Tensor& cache, const Tensor& page_table, const MlaSeq& seq,
                           int64_t key_begin, int64_t count);
// The shapes mla_expanded_attention (Ops below) needs, the same for every backend: q [T, H, nope + R],
// k_nope [N, H, nope], v [N, H, V], keys [N, L + R], kv_len [T], key_begin >= 0, and with merge the
// earlier chunks' out and stats. Throws naming the op and the tensor.
void check_mla_expanded_attention(const Tensor& q, const Tensor& k_nope, const Tensor& v, const Tensor& keys,
                                  int64_t latent, const Tensor& kv_len, int64_t key_begin, bool merge,
                                  const Tensor& out, const Tensor& stats);

// MLA sequences in both forms, as SeqBatch: `table` is I32 [S, 4] (token_begin, token_count, page_begin,
// num_pages) in device memory for a device backend.
struct MlaBatch {
  MlaBatch(std::vector<MlaSeq> s = {}) : seqs(std::move(s)) {}  // NOLINT: implicit from a sequence list
  MlaBatch(std::initializer_list<MlaSeq> s) : seqs(s) {}
  std::vector<MlaSeq> seqs;
  Tensor table;
};

// The host I32 form [S, 4] of an MLA sequence list: what MlaBatch::table holds once uploaded.
Tensor mla_batch_table(const std::vector<MlaSeq>& seqs);

// The routed experts this rank holds. Dense: gate, up [E_l, I, D] and down [E_l, D, I] in a float dtype.
// MXFP4 (K3, docs/MODEL.md §7.5): the same logical shapes stored as U8 codes with two e2m1 values per byte
// (low nibble = even column) [E_l, rows, cols/2] and one UE8M0 scale per 32 columns [E_l, rows, cols/32].
struct ExpertWeights {
  Tensor gate, up, down;
  Tensor gate_scale, up_scale, down_scale;  // defined only for MXFP4
  bool mxfp4() const { return gate_scale.defined(); }
  int64_t local_experts() const { return gate.dim(0); }
  int64_t intermediate() const { return gate.dim(1); }
  int64_t hidden() const { return down.dim(1); }
};

// Sampling of one row of logits. Greedy at temperature 0 (lowest index on ties); otherwise softmax of
// logits / temperature restricted to the top_k largest (0: no limit, ties at the k-th value kept) and then
// to the smallest set of most likely tokens holding top_p of the remaining mass (ties at the cut kept),
// sampled by inverse CDF in index order with a uniform number that is a pure function of (seed, stream,
// counter) (ops/sample_rng.h), so a sequence's tokens depend neither on its batch nor on the backend.
struct SampleParams {
  float temperature = 0.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;   // the sequence
  uint64_t counter = 0;  // tokens the sequence has sampled before
};

// Contents for a weight tensor with no checkpoint (bench --random-weights): uniform values in [-scale,
// scale] (float dtypes), or bytes uniform in [byte_lo, byte_hi] (U8), from a counter-based hash of (seed,
// element index), so every backend builds the same model.
struct RandomFill {
  float scale = 0.0f;
  float offset = 0.0f;  // added to the uniform value (norm weights around 1)
  uint8_t byte_lo = 0;
  uint8_t byte_hi = 255;
  uint64_t seed = 0;
};

// A captured sequence of device work replayed as a unit (a CUDA graph of one decode step).
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual void replay() = 0;
};

// Device memory as a backend sees it (bytes).
struct MemoryInfo {
  int64_t free = 0;
  int64_t total = 0;
};

struct RouterParams {
  int64_t top_k = 0;
  int64_t num_expert_group = 1;
  int64_t topk_group = 1;
  bool renormalize = true;
  float scaling = 1.0f;
};

// The router's rules (docs/MODEL.md §7.1), the same for every backend: num_expert_group splits the
// `experts` into groups of at least 2, 1 <= topk_group <= groups, 1 <= top_k <= topk_group · group size.
// Throws naming `op`.
void check_router_params(const RouterParams& p, int64_t experts, const char* op);

// A KDA layer's per-head parameters around its recurrent core (docs/MODEL.md §5): the forget gate's A_log
// [H] and dt_bias [H·K] with its lower bound (kda_gate), and the output norm's weight [V] and eps
// (gated_rms_norm).
struct KdaHeadParams {
  Tensor a_log, dt_bias;
  float lower_bound = 0.0f;
  Tensor o_norm;
  float eps = 1e-6f;
};

// Where a KDA layer's inputs start in its stacked input projection [T, P] (columns): q|k|v [3·H·K] as one
// block, f_a's output [r], the output gate's input (g_a's [r], or the full-rank g_proj's [H·V]) and the
// beta logits [H].
struct KdaProjColumns {
  int64_t qkv = 0, fa = 0, gate = 0, beta = 0;
};

// The shapes kda_decode_layer (Ops below) needs, the same for every backend: proj [T, P] with every part's
// columns inside P, state [slots, H, K, V], conv_w [3·H·K, W], conv_state [slots, 3·H·K, W-1], f_b
// [H·K, r] and g_b [H·V, r'] (or undefined). Throws naming `op` and the tensor.
void check_kda_decode_layer(const Tensor& proj, const KdaProjColumns& cols, const Tensor& conv_w,
                            const Tensor& f_b, const Tensor& g_b, const Tensor& conv_state,
                            const Tensor& state, const char* op);

struct ActivationParams {
  Activation kind = Activation::kSilu;
  float situ_beta = 4.0f;          // SiTU only
  float situ_linear_beta = 25.0f;  // SiTU only
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;

  // --- memory -----------------------------------------------------------------------------------------
  virtual Tensor empty(const Shape& shape, DType dtype) = 0;
  virtual Tensor zeros(const Shape& shape, DType dtype) = 0;
  // The dtype this backend keeps a weight stored as `stored` in (CPU: F32 for every float; a device
  // backend: BF16 for 16-bit floats, F32 for F32; U8 stays U8).
  virtual DType weight_dtype(DType stored) const = 0;
  // Host tensor -> backend tensor in weight_dtype(host.dtype()). Index tensors (I32, I64: ids, page
  // tables, slots) and U8 are copied unchanged.
  Tensor upload(const Tensor& host);
  // Host tensor (any dtype) -> an existing backend tensor `dst` of the same shape, converting float
  // dtypes to dst's (e.g. a weight into its slice of a fused projection, or step metadata into a graph's
  // fixed buffer).
  virtual void upload_into(const Tensor& host, Tensor& dst) = 0;
  // Backend tensor -> host F32 tensor.
  virtual Tensor to_host_f32(const Tensor& t) = 0;
  // Backend tensor -> host tensor of the same dtype.
  virtual Tensor to_host(const Tensor& t) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // same shape and dtype, both on the backend
  // Sets every element of t (any dtype; a view such as one state slot) to zero.
  virtual void fill_zero(Tensor& t) = 0;
  // Fills a backend tensor with reproducible pseudo-random contents (RandomFill).
  virtual void random_fill(Tensor& t, const RandomFill& fill) = 0;
  virtual MemoryInfo memory_info() const = 0;

  // --- steps and graphs -------------------------------------------------------------------------------
  // Between begin_step() and end_step() every tensor an op allocates is scratch that dies with the step;
  // a device backend serves it from a preallocated arena, so a step never calls the device allocator and
  // its addresses repeat (what CUDA graphs need). Outside a step, allocations are long-lived (weights,
  // caches). end_step() waits for the step's device work.
  virtual void begin_step() {}
  virtual void end_step() {}
  // Sets aside `bytes` of device memory for step scratch (a device backend's arena; no-op on the CPU).
  virtual void reserve_workspace(int64_t bytes) {}
  // Waits for the work the ops have enqueued (timing; a no-op where ops run synchronously).
  virtual void synchronize() {}
  // The stream the ops run on (a cudaStream_t on CUDA; nullptr where ops run synchronously): the GPU Comm
  // enqueues its collectives there, in order with the ops and inside their captured graphs.
  virtual void* native_stream() { return nullptr; }
  // Starts (true) or stops (false) the device profiler's recording, so that `ncu --profile-from-start off`
  // records only the steps `bench --profile-steps` brackets (a no-op without a device profiler).
  virtual void profiler_recording(bool on) {}
  // From now on, every recording profiler_recording brackets also writes the kernels it ran to `path` (a
  // Chrome trace, kernel_timeline.h) and logs their busy and idle time; for `bench --kernel-trace`, where
  // no timeline profiler runs. Throws where the backend cannot record kernels.
  virtual void trace_kernels(const std::string& path) {
    HLM_FAIL("--kernel-trace: this backend runs no device kernels to trace (it needs --device cuda)");
  }
  // Concurrent work inside a step: the ops issued between begin_side() and end_side() may run at the same
  // time as those issued after end_side(), until join_side(); ops after join_side() see the results of
  // both. The side ops read only what existed at begin_side(), and nothing issued after end_side() reads
  // their results before join_side(). A device backend runs them on a second stream (bandwidth-bound
  // GEMMs next to a chain of latency-bound kernels); elsewhere they run in order.
  virtual void begin_side() {}
  virtual void end_side() {}
  virtual void join_side() {}
  // Section timing (`bench --layer-split`, section_marks.h). While enabled, section(label) ends the
  // section open since the previous call and opens `label`; section(nullptr) ends the step's last one.
  // last_sections() gives the labelled sections of the last step that ran (eager or a graph replay, whose
  // captured marks record on every replay) with their device time; it waits for that step. Enable before
  // any graph is captured; both are no-ops while disabled.
  virtual void enable_sections(bool on) {}
  virtual void section(const char* label) {}
  virtual std::vector<SectionTime> last_sections() { return {}; }
  // Runs `body` once, recording its device work as a graph to replay (nullptr where the backend has no
  // graphs). The body's tensors must stay alive as long as the graph.
  virtual std::unique_ptr<StepGraph> capture(const std::function<void()>& body) {
    body();
    return nullptr;
  }

  // --- dense ------------------------------------------------------------------------------------------
  // table [V, D], ids [T] I32 -> [T, D]
  virtual Tensor embedding(const Tensor& table, const Tensor& ids) = 0;
  // x [T, in], w [out, in] -> x·wᵀ [T, out], in the activation dtype, or F32 with f32_out (logits).
  virtual Tensor linear(const Tensor& x, const Tensor& w, bool f32_out = false) = 0;
  // Row-wise RMSNorm over the last dim: w · (x · rsqrt(mean(x²) + eps)). x [..., D], w [D].
  virtual Tensor rms_norm(const Tensor& x, const Tensor& w, float eps) = 0;
  // The pre-norm residual step: h += a, then rms_norm(h, w, eps). Defined here as exactly that pair of ops
  // (the CPU reference); a device backend fuses it into one kernel with the same result.
  virtual Tensor add_rms_norm(Tensor& h, const Tensor& a, const Tensor& w, float eps) {
    add_inplace(h, a);
    return rms_norm(h, w, eps);
  }
  // y += x, same shape.
  virtual void add_inplace(Tensor& y, const Tensor& x) = 0;
  // act(gate) · up, elementwise; gate, up [T, I].
  virtual Tensor glu(const Tensor& gate, const Tensor& up, const ActivationParams& act) = 0;
  // glu of a fused gate|up projection: act(gate_up[:, :I]) · gate_up[:, I:]. gate_up [T, 2I] -> [T, I].
  // Defined here through glu (the CPU reference); a device backend reads the two halves in place.
  virtual Tensor glu_packed(const Tensor& gate_up, const ActivationParams& act) {
    HLM_CHECK(gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0,
              "glu_packed: gate_up must be [T, 2I] with an even width, got {}", gate_up.describe());
    const int64_t inter = gate_up.dim(1) / 2;
    return glu(slice_last(gate_up, 0, inter), slice_last(gate_up, inter, 2 * inter), act);
  }
  // glu of a projection whose weight stacks the gate rows over the up rows: glu_packed(linear(x, gate_up)).
  // x [T, D], gate_up [2I, D] -> [T, I]. Defined here (the CPU reference); a device backend may do both in
  // one kernel, from the fp32 sums.
  virtual Tensor linear_glu(const Tensor& x, const Tensor& gate_up, const ActivationParams& act) {
    return glu_packed(linear(x, gate_up), act);
  }

  virtual Tensor sigmoid(const Tensor& x) = 0;
  // y ⊙= sigmoid(gate), elementwise, same shape (K3's MLA output gate).
  virtual void sigmoid_gate_inplace(Tensor& y, const Tensor& gate) = 0;
  // Block attention residual mixing (K3 AttnRes, docs/MODEL.md §8.2), per token in fp32: each candidate
  // v [T, D] scores Σ_d rmsnorm(v)[d]·norm[d]·proj[d] (eps inside the rsqrt, no weight in the norm); the
  // result is Σ_c softmax_c(score)·v_c of the raw candidates. proj, norm [D].
  virtual Tensor attn_res(const std::vector<Tensor>& candidates, const Tensor& proj, const Tensor& norm,
                          float eps) = 0;
  // x [T, H, a], w [H, a, b] -> y[t, h] = x[t, h]·w[h]  [T, H, b]; with w_transposed, w [H, b, a] and
  // y[t, h] = x[t, h]·w[h]ᵀ.
  virtual Tensor head_matmul(const Tensor& x, const Tensor& w, bool w_transposed = false) = 0;
  // MLA's absorbed queries: q [T, H, nope + R], w_uk [H, nope, L] -> [T, H, L + R], the nope columns times
  // w_uk per head next to the rope columns as they are. Defined here as exactly those ops (the CPU
  // reference); a device backend writes both parts from one kernel.
  virtual Tensor mla_absorb_queries(const Tensor& q, const Tensor& w_uk) {
    HLM_CHECK(q.rank() == 3 && w_uk.rank() == 3 && w_uk.dim(1) <= q.dim(2),
              "mla_absorb_queries: q {} must be [T, H, nope + R] and w_uk {} [H, nope, L]", q.describe(),
              w_uk.describe());
    const int64_t nope = w_uk.dim(1);
    return concat_last(head_matmul(slice_last(q, 0, nope), w_uk), slice_last(q, nope, q.dim(2)));
  }
  // Columns [begin, end) of the last dimension. x [..., C] -> [..., end - begin]. The result may share
  // x's storage (a backend may return a view where the columns are contiguous): callers only read it.
  virtual Tensor slice_last(const Tensor& x, int64_t begin, int64_t end) = 0;
  // Concatenation along the last dimension; leading dimensions must agree.
  virtual Tensor concat_last(const Tensor& a, const Tensor& b) = 0;
  // Rows `rows` (I32 indices) of x [T, ...] -> [len(rows), ...]
  virtual Tensor gather_rows(const Tensor& x, const Tensor& rows) = 0;
  // Swaps the two leading dimensions: x [A, B, ...] -> [B, A, ...] (head chunks to all-to-all order).
  virtual Tensor transpose01(const Tensor& x) = 0;

  // --- KDA --------------------------------------------------------------------------------------------
  // Depthwise causal conv (kernel W, no bias) + silu per sequence, continuing from and updating the
  // sequence's conv state (the last W-1 raw inputs). x [T, C], w [C, W], state [slots, C, W-1] -> [T, C]
  virtual Tensor short_conv(const Tensor& x, const Tensor& w, const SeqBatch& seqs, Tensor& state) = 0;
  // short_conv with its C output columns as `planes` planes of C / planes columns: x [T, C] -> [planes, T,
  // C / planes] (KDA's q, k and v, each then contiguous for the core). Defined here as exactly short_conv
  // and transpose01 (the CPU reference); a device backend writes the planes from the conv's kernel.
  virtual Tensor short_conv_planes(const Tensor& x, const Tensor& w, const SeqBatch& seqs, Tensor& state,
                                   int64_t planes) {
    HLM_CHECK(x.rank() == 2 && planes >= 1 && x.dim(1) % planes == 0,
              "short_conv_planes: the channel count of x {} must be a multiple of the plane count {}",
              x.describe(), planes);
    const Tensor y = short_conv(x, w, seqs, state);  // [T, C]
    return transpose01(y.reshape({x.dim(0), planes, x.dim(1) / planes}));
  }
  // Forget gate in log space. graw [T, H·K], a_log [H], dt_bias [H·K] -> g [T, H·K] (fp32, g <= 0).
  // lower_bound == 0: g = -exp(a_log)·softplus(graw + dt_bias) (threshold 20);
  // lower_bound < 0:  g = lower_bound·sigmoid(exp(a_log)·(graw + dt_bias))   (K3's bounded gate).
  virtual Tensor kda_gate(const Tensor& graw, const Tensor& a_log, const Tensor& dt_bias,
                          float lower_bound) = 0;
  // KDA core over ragged sequences, updating state [slots, H, K, V] (fp32) in place. q, k, v [T, H, K]
  // are the raw conv outputs: the op L2-normalizes q and k (eps 1e-6 inside the sqrt) and scales q by
  // K^-0.5. g [T, H, K] fp32 log decays, beta [T, H]. Returns o [T, H, V].
  // kda_prefill uses the chunked form (chunk 64, pairwise decays only); kda_decode the recurrence and
  // requires token_count <= 1 for every sequence (0: padding). Both are exact forms of the same math.
  virtual Tensor kda_prefill(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                             const Tensor& beta, const SeqBatch& seqs, Tensor& state) = 0;
  virtual Tensor kda_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                            const Tensor& beta, const SeqBatch& seqs, Tensor& state) = 0;
  // Per head over V: w · rmsnorm(o, eps) · sigmoid(gate), all fp32. o, gate [T, H, V], w [V].
  virtual Tensor gated_rms_norm(const Tensor& o, const Tensor& gate, const Tensor& w, float eps) = 0;
  // A KDA layer's decode from its projections to the normed output, in one op: g = kda_gate(graw), beta =
  // sigmoid(beta_logits), o = kda_decode(q, k, v, g, beta) and gated_rms_norm(o, out_gate). graw [T, H·K],
  // beta_logits [T, H], out_gate [T, H, V]; the rest as kda_decode. Defined here as exactly those four ops
  // (the CPU reference); a device backend fuses them into the recurrence's kernel, whose o then stays
  // fp32 where the separate ops round it to the activation dtype.
  virtual Tensor kda_decode_gated(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& graw,
                                  const Tensor& beta_logits, const Tensor& out_gate, const KdaHeadParams& hp,
                                  const SeqBatch& seqs, Tensor& state) {
    const Tensor g = kda_gate(graw, hp.a_log, hp.dt_bias, hp.lower_bound).reshape(q.shape());  // [T, H, K]
    const Tensor beta = sigmoid(beta_logits);                                                  // [T, H]
    return gated_rms_norm(kda_decode(q, k, v, g, beta, seqs, state), out_gate, hp.o_norm, hp.eps);
  }

  // A KDA layer's whole decode step from its stacked input projection proj [T, P] (columns `cols`) to the
  // normed output [T, H, V]: graw = f_a's columns · f_bᵀ, the output gate = g_a's columns · g_bᵀ (g_b
  // undefined: the gate columns as they are), the short conv of the q|k|v columns with conv_w [3·H·K, W]
  // and conv_state, then kda_decode_gated. f_b [H·K, r], g_b [H·V, r]; H, K, V from state. Defined in
  // ops.cc as exactly those ops, the gates' products on the side stream beside the conv (the CPU
  // reference); a device backend runs it as one kernel, whose intermediates then stay fp32.
  virtual Tensor kda_decode_layer(const Tensor& proj, const KdaProjColumns& cols, const Tensor& conv_w,
                                  const Tensor& f_b, const Tensor& g_b, const KdaHeadParams& hp,
                                  const SeqBatch& seqs, Tensor& conv_state, Tensor& state);

  // --- MLA --------------------------------------------------------------------------------------------
  // Writes rows of entries [T, D] into cache [pages, P, D] at flat slots [T] I64 (page·P + offset);
  // a negative slot skips the row (the token belongs to another rank).
  virtual void cache_write(const Tensor& entries, const Tensor& slots, Tensor& cache) = 0;
  // An MLA layer's new cache rows from kv_a's output ckv [T, L + R]: rms_norm(ckv[:, :L], norm_w, eps) next
  // to the rope columns ckv[:, L:] as they are, written at slots as cache_write does. Defined here as
  // exactly those ops (the CPU reference); a device backend does it in one kernel.
  virtual void mla_cache_write(const Tensor& ckv, int64_t latent, const Tensor& norm_w, float eps,
                               const Tensor& slots, Tensor& cache) {
    HLM_CHECK(ckv.rank() == 2 && latent >= 1 && latent <= ckv.dim(1),
              "mla_cache_write: ckv {} must be [T, L + R] with L = {} >= 1", ckv.describe(), latent);
    const Tensor normed = rms_norm(slice_last(ckv, 0, latent), norm_w, eps);  // [T, L]
    cache_write(concat_last(normed, slice_last(ckv, latent, ckv.dim(1))), slots, cache);
  }
  // mla_cache_write, then mla_absorb_queries (above) of the same layer's queries: the two read one
  // projection's output and nothing of each other. Defined here as exactly those ops (the CPU reference); a
  // device backend runs both in one launch, so that neither waits for the other.
  virtual Tensor mla_write_and_absorb(const Tensor& ckv, int64_t latent, const Tensor& norm_w, float eps,
                                      const Tensor& slots, Tensor& cache, const Tensor& q,
                                      const Tensor& w_uk) {
    mla_cache_write(ckv, latent, norm_w, eps, slots, cache);
    return mla_absorb_queries(q, w_uk);
  }
  // Partial attention of queries q [T, H, D] over local latent keys (the cache rows, D = L + R) with
  // values = the first `v_dim` columns of the same rows. kv_len [T] I32 is the number of visible local
  // keys of each query (a prefix of its sequence's local keys, so causality is a length). Returns
  // out [T, H, v_dim], normalized within this rank, and stats [T, H, 2] = (max logit, Σ exp(logit - max)),
  // natural base, logit = q·k·scale with scale > 0 (a softmax temperature; the CUDA kernel ranks the scores
  // before scaling them). Rows with kv_len 0 give out 0, stats (-inf, 0). The CUDA kernel reads the batch
  // table, kv_len, the page table and the cache rows below its first query's kv_len - 1 before its PDL wait
  // (pdl.cuh), so the launch just before it may write only the step's new rows, at or past those.
  virtual void mla_attention(const Tensor& q, const Tensor& cache, const Tensor& page_table,
                             const MlaBatch& seqs, const Tensor& kv_len, float scale, int64_t v_dim,
                             Tensor& out, Tensor& stats) = 0;
  // Exact merge of partial attentions: parts [R, T, H, V], stats [R, T, H, 2] -> [T, H, V].
  // Sources with (-inf, 0) get weight 0; a row with no keys anywhere gives 0.
  virtual Tensor lse_combine(const Tensor& parts, const Tensor& stats) = 0;

  // The expanded (MHA) form of MLA for long prefill chunks (docs/MODEL.md §6.1, docs/KERNELS.md §6): the
  // keys are expanded per head through W_UK and W_UV, in chunks of a sequence's local keys.
  // mla_gather_keys: the cache rows of local keys [key_begin, key_begin + count) of sequence `seq` (its
  // pages listed in page_table) -> [count, D].
  virtual Tensor mla_gather_keys(const Tensor& cache, const Tensor& page_table, const MlaSeq& seq,
                                 int64_t key_begin, int64_t count) = 0;
  // Attention of q [T, H, nope + R] over one chunk of N keys, k[h] = [k_nope[h] | keys[:, L:L+R]] (the
  // rope columns of the gathered rows keys [N, L + R], shared by all heads) and values v [N, H, V]. The
  // chunk holds local keys [key_begin, key_begin + N); query t sees those below kv_len[t] (I32 [T]).
  // merge false: out [T, H, V] and stats [T, H, 2] (F32) get the normalized attention over the chunk and
  // its (max logit, Σ exp(logit − max)) as mla_attention's; rows seeing no key of the chunk get 0 and
  // (-inf, 0). merge true: out and stats hold such a result over other keys, and the chunk is merged into
  // it exactly (lse_combine's math, the earlier part first).
  virtual void mla_expanded_attention(const Tensor& q, const Tensor& k_nope, const Tensor& v,
                                      const Tensor& keys, int64_t latent, const Tensor& kv_len,
                                      int64_t key_begin, float scale, bool merge, Tensor& out,
                                      Tensor& stats) = 0;

  // --- MoE --------------------------------------------------------------------------------------------
  // Router of docs/MODEL.md §7.1 in fp32: x [T, D], w [E, D], bias [E] (selection only) ->
  // idx [T, k] I32 and weights [T, k] F32 (raw sigmoid scores, renormalized if asked, times scaling).
  // Ties in group or expert selection go to the lower index; idx lists experts by descending selection
  // score.
  virtual void moe_route(const Tensor& x, const Tensor& w, const Tensor& bias, const RouterParams& p,
                         Tensor& idx, Tensor& weights) = 0;
  // Σ_k weights[t,k] · E_{idx[t,k]}(x[t]) over the experts this rank holds, [expert_begin, expert_begin +
  // E_l), accumulated in fp32. E_e(x) = down_e(act(gate_e x) · up_e x). x [T, D], experts (ExpertWeights)
  // -> [T, D]. Tokens routed to experts elsewhere contribute nothing here.
  virtual Tensor moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights,
                             const ExpertWeights& experts, int64_t expert_begin,
                             const ActivationParams& act) = 0;
  // moe_experts(...) + addend (the shared experts' output [T, D]), as exactly moe_experts then
  // add_inplace (the CPU reference); a device backend adds it in the kernel that sums the experts.
  virtual Tensor moe_experts_add(const Tensor& x, const Tensor& idx, const Tensor& weights,
                                 const ExpertWeights& experts, int64_t expert_begin,
                                 const ActivationParams& act, const Tensor& addend) {
    Tensor out = moe_experts(x, idx, weights, experts, expert_begin, act);
    add_inplace(out, addend);
    return out;
  }

  // --- sampling ---------------------------------------------------------------------------------------
  // One token id per row of logits [R, V] (F32) with rows[r]'s parameters (SampleParams); -1 for a row
  // holding a non-finite logit. Returns host ids.
  virtual std::vector<int32_t> sample(const Tensor& logits, const std::vector<SampleParams>& rows) = 0;
};

}  // namespace hlm
