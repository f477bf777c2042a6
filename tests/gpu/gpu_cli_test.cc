// A failing rank ends every rank on GPUs too (DESIGN.md "Process model"), with its message and without a
// hang: a bad model path on one rank (an MPMD launch gives the ranks different arguments), a memory plan
// that cannot fit on one rank after the GPU Comm is up, and a bad prompt id seen by the driver only. Each
// run has a timeout, so a hang fails the test (exit 124) instead of blocking the machine.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ops/backend.h"

namespace hlm {
namespace {

const std::string kBin = HLM_BINARY;
const std::string kTiny = std::string(HLM_FIXTURES_DIR) + "/kimi-tiny-dense-first";
constexpr int kTimeoutS = 300;

struct Outcome {
  int code = 0;
  std::string err;
};

// `mpirun` with `apps` (one or more app contexts joined by " : "), under a timeout; stderr is kept.
Outcome mpirun(const std::string& apps) {
  const std::string err_path = std::string(HLM_SCRATCH_DIR) + "/gpu_cli_err.txt";
  const std::string cmd = fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 timeout {} mpirun "
      "--oversubscribe --bind-to none {} >/dev/null 2>{}",
      kTimeoutS, apps, err_path);
  const int status = std::system(cmd.c_str());
  std::stringstream err;
  err << std::ifstream(err_path).rdbuf();
  return Outcome{WEXITSTATUS(status), err.str()};
}

class CliGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    const int gpus = cuda_device_count(&why);
    if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus << " visible" << (gpus == 0 ? ": " + why : "");
  }
  // One rank's app context of a tp 1 · cp 2 run of the tiny fixture on GPUs.
  static std::string rank_app(const std::string& extra) {
    return fmt::format("-np 1 {} generate --device cuda --cp 2 --prompt-ids 5,17,300 -n 4 --ignore-eos {}",
                       kBin, extra);
  }
};

TEST_F(CliGpu, BadModelPathOnOneRankEndsEveryRank) {
  const Outcome r = mpirun(rank_app("-m " + kTiny) + " : " + rank_app("-m /nonexistent/model"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out";
  EXPECT_NE(r.err.find("helixlm: rank 1: error: model directory '/nonexistent/model' not found"),
            std::string::npos)
      << r.err;
}

TEST_F(CliGpu, MemoryPlanThatCannotFitOnOneRankEndsEveryRank) {
  // Rank 1 fails after the GPU Comm is built and the weights are loaded; rank 0 goes on into the warmup's
  // collectives and waits there for rank 1 until the job ends.
  const Outcome r = mpirun(rank_app("-m " + kTiny) + " : " +
                           rank_app("-m " + kTiny + " --max-batch 64 --max-seq-len 100000000"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out";
  EXPECT_NE(
      r.err.find(
          "helixlm: rank 1: error: GPU memory: the caches for 64 sequences (--max-batch) of 100000000 tokens "
          "(--max-seq-len)"),
      std::string::npos)
      << r.err;
}

TEST_F(CliGpu, DriverErrorAfterStartUpEndsEveryRank) {
  // Only rank 0 checks prompt ids; rank 1 waits for step plans after the warmup.
  const Outcome r =
      mpirun(fmt::format("-np 2 {} generate --device cuda --cp 2 -m {} --prompt-ids 1,99999", kBin, kTiny));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out";
  const size_t error = r.err.find("helixlm: rank 0: error: ");
  EXPECT_NE(error, std::string::npos) << r.err;
  EXPECT_NE(r.err.find("token id 99999 is outside the vocabulary", error), std::string::npos) << r.err;
}

}  // namespace
}  // namespace hlm
