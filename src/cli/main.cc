// helixlm: command-line entry point. Parses the subcommand, runs it, and turns any error into a message
// on stderr and a non-zero exit; under MPI an error on one rank ends every rank.
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "parallel/comm.h"

namespace {

// A command line CLI11 refused, worded like every other helixlm error: what is wrong, naming the word at
// fault (CLI11 reads an unknown command as a missing one), and where the usage is.
std::string parse_error_message(const CLI::App& app, const CLI::ParseError& e,
                                const std::vector<std::string>& commands) {
  std::string message = e.what();
  std::string usage = "helixlm --help";
  const CLI::App* command = nullptr;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->parsed()) command = sub;
  }
  if (command != nullptr) {
    usage = fmt::format("helixlm {} --help", command->get_name());
  } else if (const std::vector<std::string> rest = app.remaining(); !rest.empty()) {
    message = rest.front().starts_with("-") ? fmt::format("unknown option '{}'", rest.front())
                                            : fmt::format("unknown command '{}'", rest.front());
    message += fmt::format("; the commands are {}", fmt::join(commands, ", "));
  } else if (e.get_name() == "RequiredError") {
    message = fmt::format("a command is required: one of {}", fmt::join(commands, ", "));
  }
  return fmt::format("helixlm: error: {} (see `{}`)\n", message, usage);
}

}  // namespace

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
    // --help (and its kin) print the usage and exit 0 as CLI11 does, unless stdout could not take it;
    // everything else is a usage error.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      app.exit(e);
      try {
        hlm::check_stdout();
      } catch (const hlm::Error& write_error) {
        std::cerr << fmt::format("helixlm: error: {}\n", write_error.what());
        return 1;
      }
      return 0;
    }
    std::vector<std::string> names;
    for (const auto& command : commands) names.push_back(command.first);
    std::cerr << parse_error_message(app, e, names);
    return 1;
  }

  int world = 1, rank = 0;
  try {
    hlm::mpi_world(&world, &rank);
    hlm::init_logging(log_level, rank, world);
    for (const auto& [name, run] : commands) {
      if (!app.got_subcommand(name)) continue;
      const int code = run();
      hlm::check_stdout();  // a result that did not reach stdout is a failure, whatever the command
      return code;
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
