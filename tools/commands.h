// The subcommands of the `sdpa` program. Each lives in its own cmd_<name>.cpp and registers
// itself on the top-level CLI11 app. Conventions every command follows:
//   - bad input throws sdpa::Error (or CLI11 reports a parse error): main() prints the message
//     on stderr and exits with status 2, and nothing has been written;
//   - --json prints one JSON object on stdout; progress goes to stderr only when it is a terminal.
#pragma once

#include <CLI/CLI.hpp>

namespace sdpa::cli {

void add_attention_command(CLI::App& app);
void add_softmax_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_lab_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_serve_command(CLI::App& app);

/// True when stderr is a terminal (progress bars are drawn only then).
bool stderr_is_terminal();

}  // namespace sdpa::cli
