// sdpa lab: the experiments that measure the article's claims (docs/lab.md).
//   sdpa lab list [--json]
//   sdpa lab EXPERIMENT [--seed N] [--quick | --full] [--json] [--lang en|zh] [--threads T]
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "lab/lab.h"
#include "options.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {
namespace {

struct LabArgs {
  std::uint64_t seed = 1;
  bool quick = false, full = false, json = false;
  std::string lang = "en";
  int threads = 0;
};

void run_one(const std::string& name, const LabArgs& a) {
  lab::LabOptions o;
  o.seed = a.seed;
  o.mode = a.full ? lab::Mode::full : lab::Mode::quick;
  o.lang = lab::parse_lang(a.lang);
  o.threads = a.threads;  // validated by threads_validator()
  // A bar only for the long runs, and only where someone watches it.
  o.progress = a.full && stderr_is_terminal();
  const lab::json result = lab::run_experiment(name, o);
  if (a.json) {
    std::cout << result.dump() << "\n";
  } else {
    std::cout << lab::render_text(result, o.lang);
  }
}

}  // namespace

void add_lab_command(CLI::App& app) {
  CLI::App* lab_cmd = app.add_subcommand(
      "lab", "Measure the article's claims (C1-C8) on why attention divides by sqrt(d)");
  // Not require_subcommand: CLI11 would then say only "A subcommand is required"; collecting
  // the extras lets the message name what was given and list what is valid.
  lab_cmd->require_subcommand(0, 1);
  lab_cmd->allow_extras();
  lab_cmd->callback([lab_cmd] {
    if (!lab_cmd->get_subcommands().empty()) return;
    std::string names = "list";
    for (const auto& e : lab::experiments()) names += ", " + e.name;
    const auto extras = lab_cmd->remaining();
    throw Error(fmt::format("lab: expected an experiment name or list ({}), got {}", names,
                            extras.empty() ? std::string("nothing") : "'" + extras[0] + "'"));
  });

  auto list_json = std::make_shared<bool>(false);
  CLI::App* list = lab_cmd->add_subcommand("list", "List the experiments");
  list->allow_extras(false);
  list->add_flag("--json", *list_json, "print one JSON object {\"experiments\": [...]}");
  list->callback([list_json] {
    if (*list_json) {
      lab::json j = {{"experiments", lab::json::array()}};
      for (const auto& e : lab::experiments()) {
        j["experiments"].push_back({{"name", e.name}, {"summary", e.summary}});
      }
      std::cout << j.dump() << "\n";
      return;
    }
    for (const auto& e : lab::experiments()) {
      std::cout << fmt::format("{:<12} {}\n", e.name, e.summary);
    }
  });

  for (const auto& e : lab::experiments()) {
    auto args = std::make_shared<LabArgs>();
    CLI::App* cmd = lab_cmd->add_subcommand(e.name, e.summary);
    cmd->allow_extras(false);  // inherited from lab_cmd otherwise: --bogus must be an error
    cmd->add_option("--seed", args->seed, "seed of every random sample (same seed, same output)")
        ->check(seed_validator())
        ->capture_default_str();
    auto* quick = cmd->add_flag("--quick", args->quick, "few samples, seconds (the default)");
    auto* full = cmd->add_flag("--full", args->full, "more samples and a finer grid, minutes");
    quick->excludes(full);
    full->excludes(quick);
    cmd->add_flag("--json", args->json, "print one JSON object (docs/lab.md) instead of text");
    cmd->add_option("--lang", args->lang, "language of the claims: en or zh")
        ->capture_default_str();
    cmd->add_option("--threads", args->threads, "threads, 0 = one per core; output is identical")
        ->check(threads_validator())
        ->capture_default_str();
    const std::string name = e.name;
    cmd->callback([name, args] { run_one(name, *args); });
  }
}

}  // namespace sdpa::cli
