// swarmkv bench's results: one arm's run, one benchmark point, and the
// outputs written from them (best_run.json, all_trials.csv).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::cli {

struct ArmRun {
  std::string arm;
  int trial = 0;
  int order = 0;  // position of the arm within its trial
  PipelineResult result;
  long peak_rss_kib = 0;
  bool peak_rss_per_arm = false;  // false: the process's peak so far
  bool answers_match_reference = true;
  bool compared = false;              // a reference arm (none) ran in the same trial
  std::vector<int> first_difference;  // per branch: first token differing from the reference arm
                                      // (none), -1: none
  nlohmann::json extra =
      nlohmann::json::object();  // arm-specific facts (the server arms' own timings)
  double branch_phase_ms = -1;   // end-to-end minus the one document prefill; -1: not defined
};

// One benchmark point: all trials of all arms at fixed parameters.
struct Point {
  std::string sweep_value;
  int32_t branches = 0;
  int32_t doc_tokens = 0;
  std::vector<ArmRun> runs;
};

bool is_server_arm(const std::string& arm);

// The time from the arm's start to the second branch's first token (the
// first's when there is one branch): the seed's "activation".
double branch2_activation(const PipelineResult& r);

// Writes best_run.json (per point: medians, speed-ups against the reference
// arm none, the seed's best trial) and all_trials.csv into args.out.
void write_outputs(const BenchArgs& args, const nlohmann::json& params, const nlohmann::json& env,
                   const std::vector<Point>& points);

}  // namespace swarmkv::cli
