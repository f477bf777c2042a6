// The GPU Comm on several GPUs, one process per GPU (CTest: `with_gpus.sh 2 mpirun -np 2 gpu_comm_test`).
// Every rank builds every rank's random input from a seed, so each can compute the exact expected result.
//  - Peer-memory (LL16) all-reduce, BF16 and F32, 2 bytes to 8 MB including lengths that are no multiple
//    of 16 bytes: bitwise equal to the fp32 sum in rank order (what every rank must get); NCCL within
//    rounding of it; the default thresholds (LL below 64 KB, NCCL above) likewise.
//  - All-to-all (U8, BF16, F32; odd chunk lengths, so chunks start misaligned): exact on every path.
//  - The MLA exchange fused with the LSE combine against the CPU lse_combine, with sources and rows that
//    hold no keys; NCCL + combine likewise.
//  - The same collectives captured in a CUDA graph and replayed with new data (call numbers and buffer
//    sets advance on the device); flag values wrapping every 4 calls; a wait past the deadline.
// Collectives are entered by every rank in the same order, so checks use EXPECT (never ASSERT) and an
// exception ends the process (and, through mpirun, every rank) instead of skipping a collective.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include "base/half.h"
#include "ops/backend.h"
#include "ops/cpu/cpu_ops.h"
#include "runtime/device_comm.h"

namespace hlm::test {
namespace {

constexpr int64_t kMaxBytes = int64_t{8} << 20;
constexpr double kNcclBf16RelL2 = 1e-2;  // NCCL may round partial sums to bf16 on the way (rings of > 2)
constexpr double kF32RelL2 = 1e-6;
constexpr double kTestTimeoutS = 60;

struct Env {
  int rank = 0;
  int world = 1;
  Mapping mapping;
  std::unique_ptr<Comm> host;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Ops> cpu;
  std::unique_ptr<Comm> ll;    // peer memory for every size of these tests
  std::unique_ptr<Comm> nccl;  // NCCL only
  std::unique_ptr<Comm> dflt;  // the defaults a run uses
};
Env* g_env = nullptr;

GpuCommOptions ll_everywhere() {
  GpuCommOptions o;
  o.ll_all_reduce_max_bytes = o.ll_all_to_all_max_bytes = o.ll_slot_bytes = kMaxBytes;
  o.require_peer_memory = true;
  return o;
}

// The defaults a run uses, except that NCCL may not stand in for peer memory unnoticed.
GpuCommOptions defaults() {
  GpuCommOptions o;
  o.require_peer_memory = true;
  return o;
}

GpuCommOptions nccl_only() {
  GpuCommOptions o;
  o.ll_all_reduce_max_bytes = o.ll_all_to_all_max_bytes = 0;
  return o;
}

// Member `member`'s random host data for a test case: floats in [-1, 1] (rounded to bf16 for BF16), or
// bytes.
Tensor member_data(int member, const Shape& shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(member));
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = t.numel();
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32:
        t.data<float>()[i] = dist(rng);
        break;
      case DType::kBF16:
        t.data<uint16_t>()[i] = f32_to_bf16(dist(rng));
        break;
      default:
        t.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
    }
  }
  return t;
}

float value(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kBF16 ? bf16_to_f32(t.data<uint16_t>()[i]) : t.data<float>()[i];
}

// The all-reduce every rank must produce: the fp32 sum in rank order, rounded once to the dtype.
Tensor reference_sum(int members, const Shape& shape, DType dtype, uint64_t seed) {
  std::vector<Tensor> xs;
  for (int r = 0; r < members; ++r) xs.push_back(member_data(r, shape, dtype, seed));
  Tensor out = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < out.numel(); ++i) {
    float acc = value(xs[0], i);
    for (int r = 1; r < members; ++r) acc += value(xs[r], i);
    if (dtype == DType::kBF16) {
      out.data<uint16_t>()[i] = f32_to_bf16(acc);
    } else {
      out.data<float>()[i] = acc;
    }
  }
  return out;
}

// "" when equal byte for byte, else where they first differ.
std::string bitwise_diff(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    return "got " + got.describe() + ", want " + want.describe();
  }
  const auto* a = static_cast<const uint8_t*>(got.raw());
  const auto* b = static_cast<const uint8_t*>(want.raw());
  for (size_t i = 0; i < got.nbytes(); ++i) {
    if (a[i] != b[i])
      return "first difference at byte " + std::to_string(i) + " of " + std::to_string(got.nbytes());
  }
  return "";
}

double rel_l2(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = value(got, i), b = value(want, i);
    if (std::isnan(a) != std::isnan(b)) return INFINITY;
    num += (a - b) * (a - b);
    den += b * b;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Element counts giving 2 bytes .. 8 MB, around 16-byte boundaries, the 48B hidden size and 64 KB.
std::vector<int64_t> element_counts(DType dtype) {
  const auto es = static_cast<int64_t>(dtype_size(dtype));
  std::vector<int64_t> counts;
  const std::vector<int64_t> sizes = {2,        4,    6,     8,     10,    14,      16,
                                      18,       30,   34,    62,    1000,  4094,    4096,
                                      4098,     4608, 65534, 65536, 65540, 1 << 20, (1 << 20) + 6,
                                      kMaxBytes};
  for (int64_t bytes : sizes) {
    if (bytes % es == 0) counts.push_back(bytes / es);
  }
  return counts;
}

// Tests of each collective run over the world and over the CP group (separate channels and NCCL
// communicators); tests of the channel machinery (flag wrap, deadline, one-member groups) over the world
// only, since each builds a GPU Comm of its own.
template <class Base>
class CommTest : public Base {
 protected:
  void SetUp() override {
    if (g_env == nullptr) GTEST_SKIP() << "no GPU Comm (see the start of the log)";
  }
  virtual CommGroup group() const = 0;
  Env& env() { return *g_env; }
  Ops& ops() { return *g_env->ops; }
  int members() const { return g_env->host->group_size(group()); }
  int me() const { return g_env->host->group_rank(group()); }
};

class GpuComm : public CommTest<::testing::TestWithParam<CommGroup>> {
 protected:
  CommGroup group() const override { return GetParam(); }
};

class GpuCommWorld : public CommTest<::testing::Test> {
 protected:
  CommGroup group() const override { return CommGroup::kWorld; }
};

TEST_P(GpuComm, AllReduceIsTheRankOrderSumOnEveryPath) {
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (int64_t count : element_counts(dtype)) {
      const uint64_t seed = static_cast<uint64_t>(count) * 2 + (dtype == DType::kBF16);
      const Tensor want = reference_sum(members(), {count}, dtype, seed);
      const Tensor mine = member_data(me(), {count}, dtype, seed);
      const int64_t bytes = count * static_cast<int64_t>(dtype_size(dtype));
      const std::string what = std::string(dtype_name(dtype)) + " x " + std::to_string(count);
      for (Comm* c : {env().ll.get(), env().nccl.get(), env().dflt.get()}) {
        Tensor t = ops().upload(mine);
        c->all_reduce_sum(t, group());
        const Tensor got = ops().to_host(t);
        const bool peer_memory = c == env().ll.get() || (c == env().dflt.get() && bytes <= 64 << 10);
        if (peer_memory) {
          EXPECT_EQ(bitwise_diff(got, want), "") << what << (c == env().ll.get() ? " (LL)" : " (defaults)");
        } else {
          EXPECT_LE(rel_l2(got, want), dtype == DType::kBF16 ? kNcclBf16RelL2 : kF32RelL2)
              << what << " (NCCL)";
        }
      }
    }
  }
}

TEST_P(GpuComm, AllToAllMovesEveryChunkExactly) {
  const int n = members();
  for (DType dtype : {DType::kU8, DType::kBF16, DType::kF32}) {
    const auto es = static_cast<int64_t>(dtype_size(dtype));
    const std::vector<int64_t> chunks = {1, 3, 4, 5, 13, 1000, 4097, 65536 / es, kMaxBytes / (n * es)};
    for (int64_t chunk : chunks) {
      const uint64_t seed = static_cast<uint64_t>(chunk) * 7 + es;
      Tensor want = Tensor::empty({n, chunk}, dtype);
      for (int r = 0; r < n; ++r) {
        const Tensor theirs = member_data(r, {n, chunk}, dtype, seed);
        std::memcpy(want[r].raw(), theirs[me()].raw(), theirs[me()].nbytes());
      }
      const Tensor mine = member_data(me(), {n, chunk}, dtype, seed);
      for (Comm* c : {env().ll.get(), env().nccl.get(), env().dflt.get()}) {
        const Tensor got = ops().to_host(c->all_to_all(ops().upload(mine), group()));
        EXPECT_EQ(bitwise_diff(got, want), "") << dtype_name(dtype) << " chunks of " << chunk
                                               << (c == env().ll.get()     ? " (LL)"
                                                   : c == env().nccl.get() ? " (NCCL)"
                                                                           : " (defaults)");
      }
    }
  }
}

// Member r's partial attentions for every destination: parts [n, T, H, V] in [-1, 1] and stats [n, T, H, 2]
// with max in [-4, 4] and sum in [0.5, 3], except that some (destination, row) pairs hold no keys
// ((-inf, 0), parts 0) and row 0 of destination 0 holds none on any member.
void partials(int member, int n, int64_t t, int64_t h, int64_t v, uint64_t seed, Tensor& parts,
              Tensor& stats) {
  std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(member));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  parts = Tensor::empty({n, t, h, v}, DType::kF32);
  stats = Tensor::empty({n, t, h, 2}, DType::kF32);
  for (int j = 0; j < n; ++j) {
    for (int64_t row = 0; row < t * h; ++row) {
      const bool empty = (row == 0 && j == 0) || (row + j + member) % 5 == 3;
      float* p = parts.data<float>() + (j * t * h + row) * v;
      float* s = stats.data<float>() + (j * t * h + row) * 2;
      for (int64_t c = 0; c < v; ++c) p[c] = empty ? 0.0f : unit(rng);
      s[0] = empty ? -INFINITY : 4.0f * unit(rng);
      s[1] = empty ? 0.0f : 1.75f + 1.25f * unit(rng);
    }
  }
}

TEST_P(GpuComm, FusedExchangeAndCombineMatchesTheCpuCombine) {
  const int n = members();
  struct Case {
    int64_t t, h, v;
  };
  for (const Case& k : {Case{1, 16, 512}, Case{8, 16, 512}, Case{3, 2, 128}, Case{2, 3, 2}, Case{5, 1, 64}}) {
    const uint64_t seed = static_cast<uint64_t>(k.t * 1000 + k.h * 10 + k.v);
    Tensor recv_parts = Tensor::empty({n, k.t, k.h, k.v}, DType::kF32);
    Tensor recv_stats = Tensor::empty({n, k.t, k.h, 2}, DType::kF32);
    Tensor my_parts, my_stats;
    for (int r = 0; r < n; ++r) {
      Tensor p, s;
      partials(r, n, k.t, k.h, k.v, seed, p, s);
      std::memcpy(recv_parts[r].raw(), p[me()].raw(), p[me()].nbytes());
      std::memcpy(recv_stats[r].raw(), s[me()].raw(), s[me()].nbytes());
      if (r == me()) {
        my_parts = p;
        my_stats = s;
      }
    }
    const Tensor want = env().cpu->lse_combine(recv_parts, recv_stats);  // [T, H, V]
    const LseCombine combine = [this](const Tensor& p, const Tensor& s) { return ops().lse_combine(p, s); };
    for (Comm* c : {env().ll.get(), env().nccl.get(), env().dflt.get()}) {
      const Tensor got = ops().to_host(
          c->all_to_all_lse_combine(ops().upload(my_parts), ops().upload(my_stats), group(), combine));
      const std::string what = "T " + std::to_string(k.t) + " H " + std::to_string(k.h) + " V " +
                               std::to_string(k.v) + (c == env().ll.get() ? " (LL)" : " (NCCL or defaults)");
      EXPECT_EQ(got.shape(), want.shape()) << what;
      if (got.shape() != want.shape()) continue;
      EXPECT_LE(rel_l2(got, want), kF32RelL2) << what;
      if (me() == 0) {  // row 0 of destination 0 has no keys anywhere: exactly 0
        for (int64_t col = 0; col < k.v; ++col) EXPECT_EQ(got.data<float>()[col], 0.0f) << what;
      }
    }
  }
}

TEST_P(GpuComm, GraphReplaysSeeNewDataAndAdvanceTheCalls) {
  Comm& c = *env().dflt;
  const int n = members();
  // Fixed buffers the graph is captured on: LL all-reduces (BF16 at the 48B hidden size, F32), an NCCL
  // all-reduce (128 KB), an LL all-to-all with misaligned chunks and the fused MLA exchange.
  Tensor a = ops().zeros({2304}, DType::kBF16), b = ops().zeros({999}, DType::kF32);
  Tensor big = ops().zeros({65536}, DType::kBF16), x = ops().zeros({n, 777}, DType::kBF16);
  Tensor parts = ops().zeros({n, 2, 4, 128}, DType::kF32), stats = ops().zeros({n, 2, 4, 2}, DType::kF32);
  const LseCombine combine = [this](const Tensor& p, const Tensor& s) { return ops().lse_combine(p, s); };
  Tensor x_out, combined;
  auto body = [&] {
    c.all_reduce_sum(a, group());
    c.all_reduce_sum(b, group());
    c.all_reduce_sum(big, group());
    x_out = c.all_to_all(x, group());
    combined = c.all_to_all_lse_combine(parts, stats, group(), combine);
  };
  ops().begin_step();
  body();  // eagerly first, so that libraries set themselves up outside the capture
  ops().end_step();
  ops().begin_step();
  std::unique_ptr<StepGraph> graph = ops().capture(body);
  ops().end_step();
  EXPECT_NE(graph, nullptr);
  if (graph == nullptr) return;
  for (uint64_t replay = 0; replay < 6; ++replay) {
    const uint64_t seed = 5000 + replay;
    ops().upload_into(member_data(me(), {2304}, DType::kBF16, seed), a);
    ops().upload_into(member_data(me(), {999}, DType::kF32, seed), b);
    ops().upload_into(member_data(me(), {65536}, DType::kBF16, seed), big);
    ops().upload_into(member_data(me(), {n, 777}, DType::kBF16, seed), x);
    Tensor p, s;
    partials(me(), n, 2, 4, 128, seed, p, s);
    ops().upload_into(p, parts);
    ops().upload_into(s, stats);
    graph->replay();
    ops().synchronize();
    const std::string what = "replay " + std::to_string(replay);
    EXPECT_EQ(bitwise_diff(ops().to_host(a), reference_sum(n, {2304}, DType::kBF16, seed)), "") << what;
    EXPECT_EQ(bitwise_diff(ops().to_host(b), reference_sum(n, {999}, DType::kF32, seed)), "") << what;
    EXPECT_LE(rel_l2(ops().to_host(big), reference_sum(n, {65536}, DType::kBF16, seed)), kNcclBf16RelL2)
        << what;
    Tensor want_x = Tensor::empty({n, 777}, DType::kBF16);
    Tensor recv_parts = Tensor::empty({n, 2, 4, 128}, DType::kF32),
           recv_stats = Tensor::empty({n, 2, 4, 2}, DType::kF32);
    for (int r = 0; r < n; ++r) {
      const Tensor theirs = member_data(r, {n, 777}, DType::kBF16, seed);
      std::memcpy(want_x[r].raw(), theirs[me()].raw(), theirs[me()].nbytes());
      Tensor pr, sr;
      partials(r, n, 2, 4, 128, seed, pr, sr);
      std::memcpy(recv_parts[r].raw(), pr[me()].raw(), pr[me()].nbytes());
      std::memcpy(recv_stats[r].raw(), sr[me()].raw(), sr[me()].nbytes());
    }
    EXPECT_EQ(bitwise_diff(ops().to_host(x_out), want_x), "") << what;
    EXPECT_LE(rel_l2(ops().to_host(combined), env().cpu->lse_combine(recv_parts, recv_stats)), kF32RelL2)
        << what;
  }
}

TEST_F(GpuCommWorld, FlagValuesWrapWithoutStaleData) {
  // Flags repeat every 4 calls here (2^32 - 2 by default), and messages alternate between long and short,
  // so stale lines of earlier calls lie beyond the short ones whenever a flag value comes back.
  GpuCommOptions o;
  o.ll_all_reduce_max_bytes = o.ll_all_to_all_max_bytes = o.ll_slot_bytes = 16 << 10;
  o.ll_flag_period = 4;
  o.require_peer_memory = true;
  std::unique_ptr<Comm> c = make_device_comm(*env().host, env().mapping, ops(), o);
  const int n = members();
  for (uint64_t call = 0; call < 41; ++call) {
    const int64_t count = (call % 3 == 0) ? 8192 : (call % 3 == 1 ? 3 : 4097);
    if (call % 4 == 3) {
      const int64_t chunk = count / n + 1;
      Tensor want = Tensor::empty({n, chunk}, DType::kBF16);
      for (int r = 0; r < n; ++r) {
        const Tensor theirs = member_data(r, {n, chunk}, DType::kBF16, call);
        std::memcpy(want[r].raw(), theirs[me()].raw(), theirs[me()].nbytes());
      }
      const Tensor got = ops().to_host(
          c->all_to_all(ops().upload(member_data(me(), {n, chunk}, DType::kBF16, call)), group()));
      EXPECT_EQ(bitwise_diff(got, want), "") << "call " << call;
      continue;
    }
    Tensor t = ops().upload(member_data(me(), {count}, DType::kBF16, call));
    c->all_reduce_sum(t, group());
    EXPECT_EQ(bitwise_diff(ops().to_host(t), reference_sum(n, {count}, DType::kBF16, call)), "")
        << "call " << call;
  }
  // And across the replays of a graph, where no host code runs between calls.
  Tensor a = ops().zeros({8192}, DType::kBF16), b = ops().zeros({5}, DType::kBF16);
  ops().begin_step();
  std::unique_ptr<StepGraph> graph = ops().capture([&] {
    c->all_reduce_sum(a, group());
    c->all_reduce_sum(b, group());
    c->all_reduce_sum(a, group());
  });
  ops().end_step();
  EXPECT_NE(graph, nullptr);
  for (uint64_t replay = 0; replay < 7 && graph != nullptr; ++replay) {
    const uint64_t seed = 900 + replay;
    ops().upload_into(member_data(me(), {8192}, DType::kBF16, seed), a);
    ops().upload_into(member_data(me(), {5}, DType::kBF16, seed), b);
    graph->replay();
    // a is summed twice: n · (Σ_r a_r) in bf16 steps; check b exactly and a against a host twin.
    const Tensor once = reference_sum(n, {8192}, DType::kBF16, seed);
    Tensor twice = Tensor::empty({8192}, DType::kBF16);
    for (int64_t i = 0; i < 8192; ++i) {
      float acc = value(once, i);
      for (int r = 1; r < n; ++r) acc += value(once, i);
      twice.data<uint16_t>()[i] = f32_to_bf16(acc);
    }
    EXPECT_EQ(bitwise_diff(ops().to_host(b), reference_sum(n, {5}, DType::kBF16, seed)), "")
        << "replay " << replay;
    EXPECT_EQ(bitwise_diff(ops().to_host(a), twice), "") << "replay " << replay;
  }
}

TEST_F(GpuCommWorld, OneMemberGroupsAreTheIdentity) {
  // The TP group of a tp = 1 layout has one member on every rank.
  const Tensor mine = member_data(me(), {37}, DType::kBF16, 3);
  Tensor t = ops().upload(mine);
  env().dflt->all_reduce_sum(t, CommGroup::kTp);
  EXPECT_EQ(bitwise_diff(ops().to_host(t), mine), "");
  const Tensor gathered = ops().to_host(env().dflt->all_gather(ops().upload(mine), CommGroup::kTp));
  EXPECT_EQ(gathered.shape(), (Shape{1, 37}));
}

TEST_P(GpuComm, AllGatherStacksEveryMember) {
  const int n = members();
  for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{81920}}) {
    Tensor want = Tensor::empty({n, count}, DType::kF32);
    for (int r = 0; r < n; ++r) {
      const Tensor theirs = member_data(r, {count}, DType::kF32, 77 + count);
      std::memcpy(want[r].raw(), theirs.raw(), theirs.nbytes());
    }
    const Tensor got = ops().to_host(
        env().dflt->all_gather(ops().upload(member_data(me(), {count}, DType::kF32, 77 + count)), group()));
    EXPECT_EQ(bitwise_diff(got, want), "") << count;
  }
}

TEST_F(GpuCommWorld, AWaitPastTheDeadlineFailsNamingThePeer) {
  // Only member 0 enters; it gives up after the deadline and reports member 1 (world rank 1 here). Member
  // 1 then enters the same call, which completes at once (member 0's data is already there), so both
  // channels end in step and the communicators are torn down normally.
  std::unique_ptr<Comm> c = make_device_comm(*env().host, env().mapping, ops(), defaults());
  c->set_timeout(1.0);
  env().host->set_timeout(kTestTimeoutS);  // the barriers below wait out member 0's deadline
  Tensor t = ops().upload(member_data(me(), {64}, DType::kBF16, 11));
  if (me() == 0) {
    const auto start = std::chrono::steady_clock::now();
    c->all_reduce_sum(t, group());
    ops().synchronize();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(waited, 0.9);
    EXPECT_LT(waited, 30.0);
    std::string message;
    try {
      c->check();
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("rank " + std::to_string(env().mapping.cp_peer(1)) +
                           " did not answer within --comm-timeout 1 s"),
              std::string::npos)
        << message;
  }
  env().host->barrier();
  if (me() == 1) {
    c->all_reduce_sum(t, group());
    ops().synchronize();
    EXPECT_NO_THROW(c->check());
  }
  env().host->barrier();
}

INSTANTIATE_TEST_SUITE_P(Groups, GpuComm, ::testing::Values(CommGroup::kWorld, CommGroup::kCp),
                         [](const auto& info) { return info.param == CommGroup::kWorld ? "World" : "Cp"; });

}  // namespace
}  // namespace hlm::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // An exception on one rank must end the job, not skip a collective the other ranks wait in.
  GTEST_FLAG_SET(catch_exceptions, false);
  using namespace hlm;
  int world = 1, rank = 0;
  mpi_world(&world, &rank);
  std::string why;
  const int gpus = cuda_device_count(&why);
  if (world < 2 || gpus < world) {
    std::cout << "gpu_comm_test: needs 2 or more ranks with a GPU each (ranks " << world << ", GPUs " << gpus
              << (gpus == 0 ? ": " + why : "") << "); skipped\n";
    return 77;
  }
  test::Env env;
  env.rank = rank;
  env.world = world;
  env.mapping = Mapping::make(1, world, rank);  // tp 1: the CP group is the world, the TP group one rank
  env.host = make_mpi_comm(env.mapping);
  // A protocol bug fails within a minute, naming the rank waited for, instead of after 600 s; the GPU
  // Comms take the host's deadline.
  env.host->set_timeout(test::kTestTimeoutS);
  BackendOptions bo;
  bo.cuda_device = local_rank(rank) % gpus;
  env.ops = make_ops(Device::kCuda, bo);
  env.ops->reserve_workspace(int64_t{256} << 20);
  env.cpu = make_cpu_ops();
  env.ll = make_device_comm(*env.host, env.mapping, *env.ops, test::ll_everywhere());
  env.nccl = make_device_comm(*env.host, env.mapping, *env.ops, test::nccl_only());
  env.dflt = make_device_comm(*env.host, env.mapping, *env.ops, test::defaults());
  test::g_env = &env;
  const int rc = RUN_ALL_TESTS();
  test::g_env = nullptr;
  return rc;
}
