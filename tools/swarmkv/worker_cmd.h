// `swarmkv worker`: serve agent jobs from Redis (swarmkv/cluster.h).
#pragma once

#include <optional>

#include <CLI/CLI.hpp>

#include "swarmkv/cluster.h"

namespace swarmkv::cli {

class WorkerCommand {
 public:
  explicit WorkerCommand(CLI::App& app);
  bool chosen() const { return sub_->parsed(); }
  // Runs until SIGTERM or SIGINT (finishing and acknowledging the job in
  // hand); returns the exit status. Throws Error.
  int run();

 private:
  CLI::App* sub_ = nullptr;
  std::string redis_;
  std::string cluster_key_file_;
  std::string model_;
  cluster::WorkerOptions options_;
  bool exact_ = true;
  std::optional<int32_t> n_gpu_layers_;
};

}  // namespace swarmkv::cli
