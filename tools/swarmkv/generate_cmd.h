// `swarmkv generate`: one answer to one prompt in one context.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "swarmkv/engine.h"

namespace swarmkv::cli {

class GenerateCommand {
 public:
  explicit GenerateCommand(CLI::App& app);
  bool chosen() const { return sub_->parsed(); }
  // Chosen with --json: errors are JSON on stdout too.
  bool json() const { return chosen() && json_; }
  // Generates the answer and prints it (text on stdout and timings on
  // stderr, or one JSON object); returns 0. Throws Error: the sampling,
  // context and --stop values and the prompt are checked before the model
  // loads; kBudget before the context is made when the prompt and
  // --max-tokens exceed --n-ctx or the model's n_ctx_train, or the context
  // would not fit in memory (require_memory).
  int run();

 private:
  std::string read_prompt() const;
  std::vector<Token> prompt_tokens(const Model& model, const std::string& prompt) const;
  void check_fits(const Model& model, const ContextOptions& context, size_t prompt_tokens) const;

  CLI::App* sub_ = nullptr;
  std::string model_;
  std::string prompt_;
  std::string prompt_file_;
  std::string system_;
  bool raw_ = false;
  int32_t max_tokens_ = 128;
  SamplingOptions sampling_;
  std::vector<std::string> stop_;
  ContextOptions context_;
  bool json_ = false;
};

}  // namespace swarmkv::cli
