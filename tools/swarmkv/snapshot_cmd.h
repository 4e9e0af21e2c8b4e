// `swarmkv prefill` and `swarmkv snapshot ls|info|verify|rm|gc`.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine_flags.h"

namespace swarmkv::cli {

// Adds the `prefill` and `snapshot` subcommands to `app`; run() after
// parsing runs the one that was given, if any.
class SnapshotCommands {
 public:
  explicit SnapshotCommands(CLI::App& app);
  // The exit status of the command given, or nullopt when neither was.
  std::optional<int> run();
  // Whether the command given asked for --json (its errors are JSON too).
  bool json() const noexcept { return json_ && (*prefill_ || *snapshot_); }

 private:
  int run_prefill();
  int run_ls();
  int run_info();
  int run_verify();
  int run_rm();
  int run_gc();

  CLI::App* prefill_ = nullptr;
  CLI::App* snapshot_ = nullptr;
  CLI::App* ls_ = nullptr;
  CLI::App* info_ = nullptr;
  CLI::App* verify_ = nullptr;
  CLI::App* rm_ = nullptr;
  CLI::App* gc_ = nullptr;

  // prefill
  std::string input_;
  std::string out_;
  std::string model_;
  std::string system_;
  bool system_given_ = false;
  EngineFlags engine_;
  std::optional<int32_t> threads_;
  std::string cache_mode_ = "on";
  // snapshot *
  std::string dir_;
  std::vector<std::string> targets_;
  std::string max_;
  bool all_ = false;
  bool json_ = false;
};

}  // namespace swarmkv::cli
