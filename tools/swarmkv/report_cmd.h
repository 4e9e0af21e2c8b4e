// `swarmkv report RESULT.json --html FILE`: the page of a saved `run --json`
// result (swarmkv/run_page.h).
#pragma once

#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace swarmkv::cli {

class ReportCommand {
 public:
  explicit ReportCommand(CLI::App& app);
  bool chosen() const { return sub_->parsed(); }
  // Writes the page; returns the exit status. Throws Error: kNotFound or
  // kIo for the files, kCorruption for a result that is not one.
  int run();

 private:
  CLI::App* sub_ = nullptr;
  std::string result_;
  std::string html_;
};

// The page of `result` (result_json's object) into `path`, saying so on
// stderr; `source` as run_page_html takes it. Throws Error(kIo).
void write_run_page(const std::string& path, const nlohmann::json& result,
                    const std::string& source);
// Refuses a --html path whose folder does not exist, before any work.
void check_page_path(const std::string& path);

}  // namespace swarmkv::cli
