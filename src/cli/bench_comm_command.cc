// `helixlm bench-comm`: latency of the GPU collectives a Helix step makes, the peer-memory (LL16) path
// against NCCL, eagerly and replayed in CUDA graphs, for message sizes from --min-bytes to --max-bytes
// (powers of two). Run under `mpirun -np N` with one GPU per rank; the ranks form one CP group (tp 1).
//  - all_reduce: a BF16 tensor of the given bytes (the attention and FFN outputs);
//  - all_to_all: a BF16 tensor of the given bytes, split over the ranks;
//  - combine: the MLA exchange with its LSE merge, F32 partials of the given bytes (rows of 512 values);
//    NCCL's column is two NCCL all-to-alls and the separate combine kernel.
// Eager: `--iters` back-to-back calls between two synchronizations, per call. Graph: the same calls captured
// once and the graph replayed `--repeats` times, per call. Each figure is the median over `--repeats`
// trials on a rank, then the maximum over the ranks (the slowest rank sets the step time).
#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "cli/commands.h"
#include "ops/backend.h"
#include "runtime/device_comm.h"

namespace hlm {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchCommArgs {
  std::vector<std::string> ops = {"all_reduce", "all_to_all", "combine"};
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 8 << 20;
  int iters = 50;
  int repeats = 5;
  bool json = false;
};

constexpr int64_t kCombineWidth = 512;  // kv_lora_rank of Kimi Linear and K3

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One collective call of a given size on a Comm, on fixed inputs.
struct Case {
  std::string op;
  int64_t bytes = 0;  // as reported: the all-reduced tensor, the all-to-all's send buffer, the partials
  std::function<void(Comm&)> call;
};

Case make_case(const std::string& op, int64_t bytes, int n, Ops& ops) {
  if (op == "all_reduce") {
    auto t = std::make_shared<Tensor>(ops.zeros({std::max<int64_t>(bytes / 2, 1)}, DType::kBF16));
    return Case{op, static_cast<int64_t>(t->nbytes()),
                [t](Comm& c) { c.all_reduce_sum(*t, CommGroup::kCp); }};
  }
  if (op == "all_to_all") {
    auto t = std::make_shared<Tensor>(ops.zeros({n, std::max<int64_t>(bytes / (2 * n), 1)}, DType::kBF16));
    return Case{op, static_cast<int64_t>(t->nbytes()), [t](Comm& c) { c.all_to_all(*t, CommGroup::kCp); }};
  }
  HLM_CHECK(op == "combine", "bench-comm: unknown collective '{}' (all_reduce, all_to_all, combine)", op);
  const int64_t rows = std::max<int64_t>(bytes / (n * kCombineWidth * 4), 1);
  auto parts = std::make_shared<Tensor>(ops.zeros({n, rows, 1, kCombineWidth}, DType::kF32));
  auto stats = std::make_shared<Tensor>(ops.zeros({n, rows, 1, 2}, DType::kF32));
  const LseCombine combine = [&ops](const Tensor& p, const Tensor& s) { return ops.lse_combine(p, s); };
  return Case{op, static_cast<int64_t>(parts->nbytes()), [parts, stats, combine](Comm& c) {
                c.all_to_all_lse_combine(*parts, *stats, CommGroup::kCp, combine);
              }};
}

// Seconds per call: eager (median of repeats of `iters` calls) and replayed in a graph of `iters` calls.
std::pair<double, double> time_case(const Case& k, Comm& comm, Comm& host, Ops& ops, const BenchCommArgs& a) {
  auto calls = [&] {
    for (int i = 0; i < a.iters; ++i) k.call(comm);
  };
  ops.begin_step();
  calls();  // warm: lazy set-up, caches
  ops.end_step();
  std::vector<double> eager, graph;
  for (int r = 0; r < a.repeats; ++r) {
    host.barrier();
    ops.begin_step();
    const auto t = Clock::now();
    calls();
    ops.end_step();  // waits for the device
    eager.push_back(std::chrono::duration<double>(Clock::now() - t).count() / a.iters);
  }
  ops.begin_step();
  std::unique_ptr<StepGraph> g = ops.capture(calls);
  ops.end_step();
  g->replay();
  ops.synchronize();
  for (int r = 0; r < a.repeats; ++r) {
    host.barrier();
    const auto t = Clock::now();
    g->replay();
    ops.synchronize();
    graph.push_back(std::chrono::duration<double>(Clock::now() - t).count() / a.iters);
  }
  return {median(eager), median(graph)};
}

// The maximum over the ranks of each value.
std::vector<float> max_over_ranks(Comm& host, const std::vector<float>& mine) {
  const Tensor all =
      host.all_gather(Tensor::from_vector({static_cast<int64_t>(mine.size())}, mine), CommGroup::kWorld);
  std::vector<float> out(mine.size(), 0.0f);
  for (int r = 0; r < host.size(); ++r) {
    for (size_t i = 0; i < mine.size(); ++i) out[i] = std::max(out[i], all[r].data<float>()[i]);
  }
  return out;
}

int run_bench_comm(const BenchCommArgs& a) {
  HLM_CHECK(a.iters > 0 && a.repeats > 0 && a.min_bytes > 0 && a.min_bytes <= a.max_bytes,
            "--iters, --repeats and --min-bytes must be positive and --min-bytes <= --max-bytes");
  int world = 1, rank = 0;
  mpi_world(&world, &rank);
  HLM_CHECK(world >= 2,
            "bench-comm measures GPU collectives between ranks: start it with `mpirun -np N` (N >= 2), "
            "one GPU per rank");
  const Mapping mapping = Mapping::make(1, world, rank);
  std::unique_ptr<Comm> host = make_mpi_comm(mapping);
  std::string why;
  const int gpus = cuda_device_count(&why);
  HLM_CHECK(gpus > 0, "bench-comm needs a GPU: {}", why);
  BackendOptions bo;
  bo.cuda_device = local_rank(rank) % gpus;
  std::unique_ptr<Ops> ops = make_ops(Device::kCuda, bo);
  // Scratch for the outputs of one call: every call of a loop frees its output before the next one.
  ops->reserve_workspace(4 * a.max_bytes + (int64_t{64} << 20));
  GpuCommOptions peer;
  peer.ll_all_reduce_max_bytes = peer.ll_all_to_all_max_bytes = peer.ll_slot_bytes =
      std::max(a.max_bytes, int64_t{1} << 20) * 2;
  peer.require_peer_memory = true;
  GpuCommOptions nccl;
  nccl.ll_all_reduce_max_bytes = nccl.ll_all_to_all_max_bytes = 0;
  std::unique_ptr<Comm> ll = make_device_comm(*host, mapping, *ops, peer);
  std::unique_ptr<Comm> nc = make_device_comm(*host, mapping, *ops, nccl);

  if (rank == 0 && !a.json) {
    std::cout << fmt::format(
        "GPU collectives over {} ranks (us per call, max over ranks; LL16 = peer memory)\n", world);
    std::cout << fmt::format("{:<12}{:>12}{:>14}{:>14}{:>14}{:>14}\n", "collective", "bytes", "LL16 eager",
                             "NCCL eager", "LL16 graph", "NCCL graph");
  }
  for (const std::string& op : a.ops) {
    for (int64_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 2) {
      const Case k = make_case(op, bytes, world, *ops);
      const auto [ll_eager, ll_graph] = time_case(k, *ll, *host, *ops, a);
      const auto [nc_eager, nc_graph] = time_case(k, *nc, *host, *ops, a);
      const std::vector<float> us =
          max_over_ranks(*host, {static_cast<float>(ll_eager * 1e6), static_cast<float>(nc_eager * 1e6),
                                 static_cast<float>(ll_graph * 1e6), static_cast<float>(nc_graph * 1e6)});
      if (rank != 0) continue;
      if (a.json) {
        nlohmann::json j;
        j["collective"] = op;
        j["ranks"] = world;
        j["bytes"] = k.bytes;
        j["ll_eager_us"] = us[0];
        j["nccl_eager_us"] = us[1];
        j["ll_graph_us"] = us[2];
        j["nccl_graph_us"] = us[3];
        std::cout << j.dump() << "\n";
      } else {
        std::cout << fmt::format("{:<12}{:>12}{:>14.2f}{:>14.2f}{:>14.2f}{:>14.2f}\n", op, k.bytes, us[0],
                                 us[1], us[2], us[3]);
      }
    }
  }
  return 0;
}

}  // namespace

CommandRunner add_bench_comm_command(CLI::App& app) {
  auto a = std::make_shared<BenchCommArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench-comm",
      "Time GPU collectives, peer memory against NCCL, in and out of CUDA graphs (under mpirun)");
  cmd->add_option("--ops", a->ops, "Collectives: all_reduce, all_to_all, combine")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--min-bytes", a->min_bytes, "Smallest message")->capture_default_str();
  cmd->add_option("--max-bytes", a->max_bytes, "Largest message")->capture_default_str();
  cmd->add_option("--iters", a->iters, "Calls per timing (and per graph)")->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Timings per figure (median)")->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON object per line instead of the table");
  return [a] { return run_bench_comm(*a); };
}

}  // namespace hlm
