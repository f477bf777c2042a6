// The subcommands of the helixlm executable. Each registers its options on the app and returns the
// function that runs it; stdout carries only the command's machine-readable result, logs go to stderr.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace hlm {

using CommandRunner = std::function<int()>;

CommandRunner add_generate_command(CLI::App& app);
CommandRunner add_logits_command(CLI::App& app);
CommandRunner add_inspect_command(CLI::App& app);
CommandRunner add_plan_command(CLI::App& app);
CommandRunner add_bench_command(CLI::App& app);
CommandRunner add_bench_comm_command(CLI::App& app);
CommandRunner add_tokenize_command(CLI::App& app);
CommandRunner add_serve_command(CLI::App& app);
CommandRunner add_chat_command(CLI::App& app);

}  // namespace hlm
