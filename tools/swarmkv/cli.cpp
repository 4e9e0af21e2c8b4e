// swarmkv: the command-line front end of the SwarmKV library.
#include "cli.h"

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_cmd.h"
#include "generate_cmd.h"
#include "info_cmd.h"
#include "report_cmd.h"
#include "run_cmd.h"
#include "serve_cmd.h"
#include "snapshot_cmd.h"
#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/result_json.h"
#include "terminal_text.h"
#include "worker_cmd.h"

namespace swarmkv::cli {
namespace {

constexpr const char* kDescription =
    "SwarmKV: prefill a shared document once on llama.cpp, snapshot its KV state and fork every "
    "agent from it.\n\nModel: --model PATH, else $SWARMKV_MODEL, else the default "
    "SmolLM2-135M-Instruct in the cache ($SWARMKV_CACHE, default ~/.cache/swarmkv; fetch it "
    "with scripts/fetch-model.sh).\nLogging: --log-level or $SWARMKV_LOG_LEVEL "
    "(debug|info|warn|error|off), always on stderr.\nExit status: 0 success; 1 the run failed "
    "(an agent, the engine, writing the output); 2 refused before any work (bad arguments, "
    "input files, budget or memory); 130 interrupted.";

std::string version_text() {
  const BuildInfo b = build_info();
  std::string backends;
  for (const std::string& name : b.backends) backends += (backends.empty() ? "" : ", ") + name;
  return fmt::format("swarmkv {}\nllama.cpp {} (our patches {})\nbackends: {}", b.version,
                     b.llama_commit, b.llama_patches, backends);
}

// Every subcommand, registered in the order --help lists them.
struct Commands {
  explicit Commands(CLI::App& app)
      : generate(app),
        run(app),
        bench(app),
        snapshot(app),
        worker(app),
        serve(app),
        report(app),
        info(app) {}

  // The chosen subcommand's --json: errors are JSON on stdout too.
  bool json() const { return generate.json() || run.json() || snapshot.json(); }

  // Runs the chosen subcommand; returns its exit status. Throws what it throws.
  int run_chosen() {
    if (generate.chosen()) return generate.run();
    if (info.chosen()) return info.run();
    if (run.chosen()) return run.run();
    if (bench.chosen()) return bench.run();
    if (worker.chosen()) return worker.run();
    if (serve.chosen()) return serve.run();
    if (report.chosen()) return report.run();
    return snapshot.run().value_or(kExitOk);
  }

  GenerateCommand generate;
  RunCommand run;
  BenchCommand bench;
  SnapshotCommands snapshot;
  WorkerCommand worker;
  ServeCommand serve;
  ReportCommand report;
  InfoCommand info;
};

// Parses argv into `app`; returns the exit status when parsing ends the
// command (--help: 0; a usage error, said on stderr: kExitUsage).
std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    if (app.get_subcommands().empty() && !app.remaining().empty()) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({}))
        names += (names.empty() ? "" : ", ") + sub->get_name();
      std::cerr << fmt::format(
          "swarmkv: error: unknown command '{}' (commands: {}); see "
          "swarmkv --help\n",
          app.remaining().front(), names);
      return kExitUsage;
    }
    app.exit(e);
    return kExitUsage;
  }
  return std::nullopt;
}

// --log-level, else $SWARMKV_LOG_LEVEL (checked here, applied by the
// library), else warn; a worker logs at info unless told otherwise: its log
// is its account of what it claims and refuses. Throws Error for a bad level.
void configure_logging(const std::string& log_level, bool worker) {
  if (log_level.empty()) {
    if (const char* env = std::getenv("SWARMKV_LOG_LEVEL"); env != nullptr && *env != '\0') {
      try {
        parse_log_level(env);
      } catch (const Error& e) {
        throw Error(e.code(), "$SWARMKV_LOG_LEVEL: " + e.message());
      }
    }
  } else {
    set_log_level(parse_log_level(log_level));
  }
  if (worker && log_level.empty() && std::getenv("SWARMKV_LOG_LEVEL") == nullptr)
    set_log_level(LogLevel::kInfo);
}

// Says `e` on stderr (and under --json as {"ok": false, "error": ...} on
// stdout); returns `status`.
int fail(const ErrorValue& e, int status, bool json) {
  std::cerr << "swarmkv: error: " << TerminalText(stderr)(e.to_string()) << "\n";
  if (json) {
    const nlohmann::json out = {
        {"ok", false},
        {"error", {{"code", std::string(to_string(e.code))}, {"message", e.message}}}};
    std::cout << dump_json(out) << "\n" << std::flush;
  }
  return status;
}

}  // namespace

int exit_code(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kGraph:
    case ErrorCode::kBudget:
    case ErrorCode::kChatTemplate:
    case ErrorCode::kIncompatible:
    case ErrorCode::kModelLoad:
      return kExitUsage;
    case ErrorCode::kAborted:
      return kExitInterrupted;
    default:
      return kExitFailed;
  }
}

int run(int argc, char** argv) {
  CLI::App app{kDescription, "swarmkv"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text);
  std::string log_level = "";
  app.add_option("--log-level", log_level, "debug, info, warn (default), error or off");
  Commands commands(app);
  if (const std::optional<int> status = parse(app, argc, argv)) return *status;

  const bool json = commands.json();
  int status = kExitOk;
  try {
    configure_logging(log_level, commands.worker.chosen());
    status = commands.run_chosen();
  } catch (const Error& e) {
    return fail(e.value(), exit_code(e.code()), json);
  } catch (const std::exception& e) {
    return fail({ErrorCode::kInternal, e.what()}, kExitFailed, json);
  }
  // Output that did not reach stdout (closed, a full disk) is a failed run.
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "swarmkv: error: io: writing to stdout failed; the output is lost\n";
    return kExitFailed;
  }
  return status;
}

}  // namespace swarmkv::cli
