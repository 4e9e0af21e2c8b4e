// `swarmkv run`: a pipeline file, run here or, with --redis, on the
// cluster's workers (swarmkv/pipeline.h, swarmkv/cluster.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine_flags.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::cli {

struct RunArgs {
  std::string pipeline;
  std::string model;
  std::string fork;
  std::string guard = "serialized";
  uint32_t n_ctx = 0;
  std::optional<int32_t> threads;
  EngineFlags engine;
  std::string snapshot_file;
  std::string snapshot_cache = "on";
  std::string cache_dir;
  bool json = false;
  std::string html;  // the run's page (run_page.h), when not empty
  bool check = false;
  std::optional<std::string> redis;  // set: coordinator; "" = $SWARMKV_REDIS
  std::string cluster_key_file;      // "": $SWARMKV_CLUSTER_KEY, else none
  double timeout_s = 600;
  int agents_per_job = 0;
  std::vector<std::string> documents;  // --document: a corpus of these
  std::string out_dir;                 // --out: each document's result, resumable
  size_t max_documents_live = 0;       // --max-documents-live; 0: 1, or the live workers (--redis)
};

class RunCommand {
 public:
  explicit RunCommand(CLI::App& app);
  bool chosen() const { return sub_->parsed(); }
  // Chosen with --json: errors are JSON on stdout too.
  bool json() const { return chosen() && args_.json; }
  // Runs the pipeline (or, with --check, only checks it) and prints the
  // result; returns 0 when every agent succeeded, kExitFailed otherwise (the
  // causes on stderr). Throws Error for what is refused before the run.
  int run();

 private:
  int run_corpus(CorpusSpec corpus);  // `documents:`, --document or reduce agents
  void add_run_options();
  void add_snapshot_options();
  void add_cluster_options();
  void add_output_options();

  CLI::App* sub_ = nullptr;
  RunArgs args_;
};

}  // namespace swarmkv::cli
