// swarmkv bench: the reference (none: re-prefill per branch) vs the fork arms, in
// one run, with the seed's metrics, trial selection, CSV/JSON, plots, report.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine_flags.h"

namespace swarmkv::cli {

struct BenchArgs {
  std::string model;
  std::string doc_file;  // empty: synthetic document of doc_tokens tokens
  int32_t doc_tokens = 3501;
  int32_t branches = 2;
  int32_t branch_tokens = 6;  // tokens of each branch's own question
  int32_t n_predict = 1;      // greedy tokens generated per branch
  uint32_t n_ctx = 0;         // 0: smallest multiple of 256 that fits
  int32_t threads = 0;
  int32_t max_live = 0;  // the shared arm's live branches at most (0 = all that fit)
  EngineFlags engine;    // every arm, the server arms too
  int32_t trials = 3;
  int32_t pause_ms = 1000;
  std::vector<std::string> arms = {"none", "host"};
  std::string sweep;  // "branches=1,2,4" or "doc-tokens=512,1024"
  std::string out = "bench-out";
  // llama-server peer arms.
  std::string server_bin;  // empty: find_llama_server()
  std::string server_kvu =
      "both";  // server-concurrent: on, off, or both (measure, keep the faster)
};

// Runs the benchmark; returns the process exit status (130 after Ctrl-C,
// with the finished trials written).
int run_bench(const BenchArgs& args);

}  // namespace swarmkv::cli
