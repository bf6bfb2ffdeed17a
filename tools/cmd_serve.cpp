// sdpa serve: the explorer page (src/serve/serve.h, docs/serve.md).
#include <cstdio>

#include "commands.h"
#include "sdpa/sdpa.h"
#include "serve/serve.h"

namespace sdpa::cli {

void add_serve_command(CLI::App& app) {
  auto opts = std::make_shared<sdpa::serve::ServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve a local page where the sqrt(d) argument moves under your hands: every slider asks\n"
      "the library for its numbers. Prints the URL; Ctrl-C (SIGINT) or SIGTERM stops it.");
  cmd->add_option("--host", opts->host, "address to listen on (127.0.0.1: this machine only)")
      ->capture_default_str();
  cmd->add_option("--port", opts->port, "port; 0 picks a free one and prints it")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--lang", opts->lang, "language of the page")
      ->check(CLI::IsMember({"en", "zh"}))
      ->capture_default_str();
  cmd->add_option("--max-runs", opts->max_runs, "training runs at once, over all clients")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->callback([opts] {
    // An empty host would listen on the loopback and print a URL without a host in it.
    if (opts->host.empty()) {
      throw Error(ErrorKind::bad_value, "--host",
                  "expected an address to listen on (127.0.0.1, ::1, 0.0.0.0, ...), got ''");
    }
    sdpa::serve::run_server(*opts, [&](int port) {
      // A wildcard address is shown as this machine; an IPv6 address in brackets.
      std::string shown = opts->host == "0.0.0.0" ? "127.0.0.1" : opts->host;
      if (shown.find(':') != std::string::npos) shown = "[" + shown + "]";
      std::printf("sdpa serve: http://%s:%d/ (Ctrl-C to stop)\n", shown.c_str(), port);
      std::fflush(stdout);
    });
    std::fprintf(stderr, "sdpa serve: stopped\n");
  });
}

}  // namespace sdpa::cli
