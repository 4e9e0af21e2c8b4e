// `swarmkv bench`: its options (BenchArgs) and its run (run_bench).
#pragma once

#include <CLI/CLI.hpp>

#include "bench.h"

namespace swarmkv::cli {

class BenchCommand {
 public:
  explicit BenchCommand(CLI::App& app);
  bool chosen() const { return sub_->parsed(); }
  // run_bench's exit status. Throws what run_bench throws.
  int run() const { return run_bench(args_); }

 private:
  void add_workload_options();
  void add_trial_options();

  CLI::App* sub_ = nullptr;
  BenchArgs args_;
};

}  // namespace swarmkv::cli
