// `swarmkv serve`: the OpenAI-compatible server (swarmkv/server.h).
#pragma once

#include <optional>

#include <CLI/CLI.hpp>

#include "swarmkv/server.h"

namespace swarmkv::cli {

class ServeCommand {
 public:
  explicit ServeCommand(CLI::App& app);
  bool chosen() const { return sub_->parsed(); }
  // Serves until SIGTERM or SIGINT, which drain (stop accepting, let the
  // requests in flight finish for --drain seconds) and return 0. Throws
  // Error.
  int run();

 private:
  void add_http_options();
  void add_engine_options();
  void add_limit_options();
  void add_pipeline_options();

  CLI::App* sub_ = nullptr;
  std::string model_;
  std::string flash_attn_ = "off";
  std::optional<int32_t> n_gpu_layers_;
  std::string snapshot_cache_ = "on";
  ServerOptions options_;
};

}  // namespace swarmkv::cli
