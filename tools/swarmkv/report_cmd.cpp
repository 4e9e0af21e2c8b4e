#include "report_cmd.h"

#include <filesystem>
#include <iostream>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarmkv/error.h"
#include "swarmkv/paths.h"
#include "swarmkv/run_page.h"

namespace swarmkv::cli {

ReportCommand::ReportCommand(CLI::App& app) {
  sub_ = app.add_subcommand(
      "report",
      "Show a saved run: `swarmkv run ... --json > run.json`, then `swarmkv report run.json "
      "--html run.html` writes one self-contained page (no scripts, nothing fetched): the "
      "agents' graph (depends_on, fork_from and needs edges drawn differently), a timeline of "
      "the document's prefill and each agent (queued, started, first token, done, each token), "
      "and every agent's rendered prompt, answer, status and error. `run --html FILE` writes "
      "the same page for the run it makes.");
  sub_->add_option("result", result_, "a `swarmkv run --json` result file, or - for stdin")
      ->required();
  sub_->add_option("--html", html_, "write the page to this file")->required();
}

void check_page_path(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--html {}: the folder {} does not exist", path, parent.string()));
  }
}

void write_run_page(const std::string& path, const nlohmann::json& result,
                    const std::string& source) {
  const bool corpus = result.is_object() && result.value("kind", "") == "corpus";
  write_text_file(path, corpus ? corpus_page_html(result, source) : run_page_html(result, source));
  std::cerr << fmt::format("swarmkv: the run's page: {}\n", path);
}

int ReportCommand::run() {
  check_page_path(html_);
  const std::string text = result_ == "-"
                               ? std::string(std::istreambuf_iterator<char>(std::cin), {})
                               : read_file(result_, "result");
  nlohmann::json result;
  try {
    result = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{} is not JSON (a `swarmkv run --json` result?): {}",
                            result_ == "-" ? "stdin" : result_, e.what()));
  }
  write_run_page(html_, result, result_ == "-" ? "" : result_);
  return 0;
}

}  // namespace swarmkv::cli
