// helixlm: command-line entry point. Parses the subcommand, runs it, and turns any error into a message
// on stderr and a non-zero exit; under MPI an error on one rank ends every rank.
#include <iostream>

#include <CLI/CLI.hpp>

#include "base/log.h"
#include "cli/commands.h"
#include "parallel/comm.h"

int main(int argc, char** argv) {
  CLI::App app{"helixlm: Kimi Linear inference with Helix parallelism"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  const std::vector<std::pair<std::string, hlm::CommandRunner>> commands = {
      {"generate", hlm::add_generate_command(app)}, {"logits", hlm::add_logits_command(app)},
      {"inspect", hlm::add_inspect_command(app)},   {"plan", hlm::add_plan_command(app)},
      {"bench", hlm::add_bench_command(app)},       {"bench-comm", hlm::add_bench_comm_command(app)},
      {"tokenize", hlm::add_tokenize_command(app)}, {"serve", hlm::add_serve_command(app)},
      {"chat", hlm::add_chat_command(app)},
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  int world = 1, rank = 0;
  try {
    hlm::mpi_world(&world, &rank);
    hlm::init_logging(log_level, rank, world);
    for (const auto& [name, run] : commands) {
      if (app.got_subcommand(name)) return run();
    }
  } catch (const hlm::Error& e) {
    // One write per line: under mpirun other processes (its abort banner) share this stderr, and a line
    // written in pieces came out with the banner inside it.
    std::cerr << (world > 1 ? fmt::format("helixlm: rank {}: error: {}\n", rank, e.what())
                            : fmt::format("helixlm: error: {}\n", e.what()));
    spdlog::debug("raised at {}", e.location());
  } catch (const std::exception& e) {
    std::cerr << fmt::format("helixlm: error: {}\n", e.what());
  }
  std::cerr.flush();
  if (world > 1) hlm::abort_all_ranks(1);
  return 1;
}
