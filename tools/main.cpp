// sdpa: the command-line program. See `sdpa --help`.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <regex>
#include <string>

#include "commands.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {
bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }
}  // namespace sdpa::cli

int main(int argc, char** argv) {
  CLI::App app{
      "sdpa: exact scaled dot-product attention on the CPU (softmax(Q K^T * scale + mask) V),\n"
      "and a lab that measures why attention divides by sqrt(d).",
      "sdpa"};
  app.set_version_flag("--version", std::string("sdpa ") + sdpa::version());
  app.require_subcommand(1);
  app.fallthrough(false);
  sdpa::cli::add_attention_command(app);
  sdpa::cli::add_softmax_command(app);
  sdpa::cli::add_bench_command(app);
  sdpa::cli::add_lab_command(app);
  sdpa::cli::add_report_command(app);
#ifdef SDPA_HAS_SERVE
  sdpa::cli::add_serve_command(app);
#endif
  // Option-parse errors read like every other error: "sdpa: error: --threads: expected ...".
  // CLI11 says "--seed: 1 required UINT:UINT64 in [0, 2^64-1] missing" for a flag given
  // without its value; it reads "--seed: expected UINT:UINT64 in [0, 2^64-1], got nothing".
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    static const std::regex missing(R"(^(\S+): \d+ required (.*) missing$)");
    std::string message = e.what();
    std::smatch m;
    if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr &&
        std::regex_match(message, m, missing)) {
      message = m[1].str() + ": expected " + m[2].str() + ", got nothing";
    }
    return "sdpa: error: " + message + "\n";
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    // No subcommand understood: say which word came and which subcommands there are, rather
    // than CLI11's "A subcommand is required".
    if (!app.get_subcommands().empty()) return app.exit(e) == 0 ? 0 : 2;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    const std::string got = argc > 1 ? fmt::format("'{}'", argv[1]) : "none";
    std::fprintf(stderr, "sdpa: error: expected a subcommand (%s), got %s\n", names.c_str(),
                 got.c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const sdpa::Error& e) {
    // Every kind (bad value, type or shape, I/O, resources) is the user's to fix: status 2.
    std::fprintf(stderr, "sdpa: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "sdpa: error: out of memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdpa: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
