// `swarmkv info`: the model's metadata and the llama.cpp build, as JSON.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace swarmkv::cli {

class InfoCommand {
 public:
  explicit InfoCommand(CLI::App& app);
  bool chosen() const { return sub_->parsed(); }
  // Loads the model, prints one JSON object (and a hint on stderr when its
  // weight types prefill slowly); returns 0. Throws Error.
  int run() const;

 private:
  CLI::App* sub_ = nullptr;
  std::string model_;
};

}  // namespace swarmkv::cli
