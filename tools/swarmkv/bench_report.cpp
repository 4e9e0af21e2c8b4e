#include "bench_report.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/result_json.h"

namespace swarmkv::cli {

using nlohmann::json;

bool is_server_arm(const std::string& arm) {
  return arm == "server-concurrent" || arm == "server-sequential";
}

double branch2_activation(const PipelineResult& r) {
  const AgentResult& a = r.agents.size() > 1 ? r.agents[1] : r.agents[0];
  return a.timings_ms.first_token;
}

namespace {

// Median decode-step time of the shared arm's generation-only steps (no
// prompt tokens in the batch), by the number of branches in the step: does
// the CPU attention re-read the prefix once per branch?
json steps_by_live_branches(const PipelineResult& r) {
  std::map<int32_t, std::vector<double>> by;
  for (const DecodeStep& s : r.decode_steps) {
    if (s.prompt_tokens == 0) by[s.branches].push_back(s.ms);
  }
  json out = json::array();
  for (auto& [n, v] : by) {
    out.push_back({{"branches", n}, {"steps", v.size()}, {"median_ms", median(v)}});
  }
  return out;
}

double kv_bytes_needed(const PipelineResult& r) {
  double cells = r.prefix_tokens;
  for (const AgentResult& a : r.agents)
    cells += a.prompt_tokens + static_cast<double>(a.tokens.size());
  return cells * r.kv_bytes_per_cell;
}

// When each agent finished, from the arm's start: p50 and max (with
// sequential serving the last agent waits for all the others).
json agent_done(const PipelineResult& r) {
  std::vector<double> v;
  for (const AgentResult& a : r.agents) v.push_back(a.timings_ms.done_at);
  return {{"p50", median(v)}, {"max", v.empty() ? 0.0 : *std::max_element(v.begin(), v.end())}};
}

json arm_json(const ArmRun& run) {
  const PipelineResult& r = run.result;
  json branches = json::array();
  double gen_ms = 0;
  size_t gen_tokens = 0;
  for (size_t i = 0; i < r.agents.size(); ++i) {
    const AgentResult& a = r.agents[i];
    gen_ms += a.timings_ms.generate;
    gen_tokens += a.tokens.size();
    json branch = agent_json(a);
    branch.erase("answer");  // the bench's prompts are synthetic; the tokens are compared instead
    branch["first_difference_vs_reference"] =
        i < run.first_difference.size() ? json(run.first_difference[i]) : json(nullptr);
    branches.push_back(std::move(branch));
  }
  const double prefill_tokens =
      static_cast<double>(r.prefix_tokens) * static_cast<double>(r.document_prefills);
  return {
      {"schema_version", kResultSchemaVersion},
      {"arm", run.arm},
      {"trial", run.trial},
      {"order", run.order},
      {"ok", r.ok()},
      {"end_to_end_ms", r.total_ms},
      {"prefill_ms", r.prefill_ms},
      {"export_ms", r.export_ms},
      {"snapshot_bytes", r.snapshot_bytes},
      {"branch2_activation_ms", branch2_activation(r)},
      {"prefill_tokens_per_s", r.prefill_ms > 0 ? 1000.0 * prefill_tokens / r.prefill_ms : 0.0},
      {"generate_tokens_per_s",
       gen_ms > 0 ? 1000.0 * static_cast<double>(gen_tokens) / gen_ms : 0.0},
      {"peak_rss_kib", run.peak_rss_kib},
      {"peak_rss_per_arm", run.peak_rss_per_arm},
      {"n_ctx", r.n_ctx},
      {"memory",
       [&] {
         json m = memory_json(r);
         // (prefix + sum of branch prompt + generated tokens) x bytes/cell:
         // the KV the work itself needs, the shared prefix counted once.
         m["kv_bytes_needed"] = kv_bytes_needed(r);
         return m;
       }()},
      {"decode_steps", r.decode_steps.size()},
      {"generation_step_ms_by_branches", steps_by_live_branches(r)},
      {"answers_match_reference", run.compared ? json(run.answers_match_reference) : json(nullptr)},
      {"latency", latency_json(latency_summary(r))},
      {"branch_phase_ms", run.branch_phase_ms >= 0 ? json(run.branch_phase_ms) : json(nullptr)},
      {"agent_done_ms", agent_done(r)},
      {"branches", branches},
      {"extra", run.extra}};
}

using Trials = std::map<int, std::map<std::string, const ArmRun*>>;  // trial -> arm -> run
using ByArm = std::map<std::string, std::vector<double>>;

// The seed's selection: per trial, score = 2 * TTFT% + E2E% (reductions vs
// the reference arm, none), of one fork arm (ours, not a peer's); without
// the reference, the first trial with every arm. -1: none.
int best_trial_of(const Trials& by_trial, const std::vector<std::string>& arms,
                  double& best_score) {
  int best_trial = -1;
  best_score = -1e300;
  std::string fork_arm = arms.size() > 1 ? arms[1] : arms.front();
  for (const char* preferred : {"host", "shared"})
    if (std::find(arms.begin(), arms.end(), preferred) != arms.end()) fork_arm = preferred;
  for (const auto& [trial, m] : by_trial) {
    if (!m.contains("none") || !m.contains(fork_arm) || m.size() != arms.size()) continue;
    const double be = m.at("none")->result.total_ms, fe = m.at(fork_arm)->result.total_ms;
    const double ba = branch2_activation(m.at("none")->result),
                 fa = branch2_activation(m.at(fork_arm)->result);
    const double score = 2 * 100 * (ba - fa) / ba + 100 * (be - fe) / be;
    if (score > best_score) best_score = score, best_trial = trial;
  }
  if (!std::count(arms.begin(), arms.end(), "none")) {
    for (const auto& [trial, m] : by_trial) {
      if (m.size() == arms.size()) {
        best_trial = trial;
        break;
      }
    }
  }
  return best_trial;
}

// SwarmKV's shared fork against each peer arm, and on the branch phase
// (end-to-end minus the one document prefill both pay).
void add_shared_speedups(json& speedup, const Point& p, const std::vector<std::string>& arms,
                         ByArm& e2e) {
  for (const std::string& peer : arms) {
    if (!is_server_arm(peer) || !e2e.contains(peer)) continue;
    speedup["end_to_end_vs_" + peer] = median(e2e[peer]) / median(e2e["shared"]);
  }
  std::vector<double> mine, seq;
  for (const ArmRun& r : p.runs) {
    if (r.arm == "shared" && r.branch_phase_ms > 0) mine.push_back(r.branch_phase_ms);
    if (r.arm == "server-sequential" && r.branch_phase_ms > 0) seq.push_back(r.branch_phase_ms);
  }
  if (!mine.empty() && !seq.empty())
    speedup["branch_phase_vs_server-sequential"] = median(seq) / median(mine);
}

// `arm` against the reference arm (none): medians and the best trial's.
json arm_speedup(const std::string& arm, const Point& p, const std::vector<std::string>& arms,
                 ByArm& e2e, ByArm& act, Trials& by_trial, int best_trial) {
  json speedup = {
      {"end_to_end", median(e2e["none"]) / median(e2e[arm])},
      {"branch2_activation", median(act["none"]) / median(act[arm])},
      {"best_trial_end_to_end", best_trial >= 0 ? by_trial[best_trial]["none"]->result.total_ms /
                                                      by_trial[best_trial][arm]->result.total_ms
                                                : 0.0},
      {"best_trial_branch2_activation",
       best_trial >= 0 ? branch2_activation(by_trial[best_trial]["none"]->result) /
                             branch2_activation(by_trial[best_trial][arm]->result)
                       : 0.0}};
  if (arm != "host" && e2e.contains("host")) {
    speedup["end_to_end_vs_host"] = median(e2e["host"]) / median(e2e[arm]);
  }
  if (arm == "shared") add_shared_speedups(speedup, p, arms, e2e);
  return speedup;
}

json summarize(const Point& p, const std::vector<std::string>& arms) {
  json arms_json = json::object();
  json speedup = json::object();
  ByArm e2e, act;
  for (const ArmRun& r : p.runs) {
    e2e[r.arm].push_back(r.result.total_ms);
    act[r.arm].push_back(branch2_activation(r.result));
  }
  Trials by_trial;
  for (const ArmRun& r : p.runs) by_trial[r.trial][r.arm] = &r;
  double best_score = 0;
  const int best_trial = best_trial_of(by_trial, arms, best_score);
  for (const std::string& arm : arms) {
    if (!e2e.contains(arm)) continue;
    json best = nullptr;
    if (best_trial >= 0) best = arm_json(*by_trial[best_trial][arm]);
    arms_json[arm] = {{"median_end_to_end_ms", median(e2e[arm])},
                      {"median_branch2_activation_ms", median(act[arm])},
                      {"best_trial", best}};
    if (arm != "none" && e2e.contains("none"))
      speedup[arm] = arm_speedup(arm, p, arms, e2e, act, by_trial, best_trial);
  }
  bool all_match = std::all_of(p.runs.begin(), p.runs.end(),
                               [](const ArmRun& r) { return r.answers_match_reference; });
  return {{"sweep_value", p.sweep_value},
          {"branches", p.branches},
          {"doc_tokens", p.doc_tokens},
          {"trials_completed", by_trial.size()},
          {"best_trial", best_trial},
          {"best_trial_score", best_trial >= 0 ? best_score : 0.0},
          {"answers_identical_across_arms", all_match},
          {"arms", arms_json},
          {"speedup", speedup}};
}

// The one table of CSV columns: each name with how a row computes it. The
// Baseline_*/SwarmKV_* columns are the seed's own format (Baseline = the
// reference arm, none), kept for its plots.
using Column = std::pair<const char*, std::function<std::string(const Point&, const ArmRun&)>>;

std::string ms(double v) {
  return fmt::format("{:.3f}", v);
}

std::vector<Column> csv_columns(const std::string& sweep_key) {
  const auto agent_total = [](const ArmRun& r, size_t i) {
    return r.arm != "none" && i < r.result.agents.size() ? ms(r.result.agents[i].timings_ms.total)
                                                         : std::string();
  };
  return {
      {"sweep", [sweep_key](const Point&, const ArmRun&) { return sweep_key; }},
      {"sweep_value", [](const Point& p, const ArmRun&) { return p.sweep_value; }},
      {"trial", [](const Point&, const ArmRun& r) { return std::to_string(r.trial); }},
      {"arm", [](const Point&, const ArmRun& r) { return r.arm; }},
      {"order", [](const Point&, const ArmRun& r) { return std::to_string(r.order); }},
      {"branches", [](const Point& p, const ArmRun&) { return std::to_string(p.branches); }},
      {"doc_tokens", [](const Point& p, const ArmRun&) { return std::to_string(p.doc_tokens); }},
      {"prefix_tokens",
       [](const Point&, const ArmRun& r) { return std::to_string(r.result.prefix_tokens); }},
      {"ok", [](const Point&, const ArmRun& r) { return fmt::format("{}", r.result.ok()); }},
      {"answers_match_reference",
       [](const Point&, const ArmRun& r) { return fmt::format("{}", r.answers_match_reference); }},
      {"end_to_end_ms", [](const Point&, const ArmRun& r) { return ms(r.result.total_ms); }},
      {"prefill_ms", [](const Point&, const ArmRun& r) { return ms(r.result.prefill_ms); }},
      {"export_ms", [](const Point&, const ArmRun& r) { return ms(r.result.export_ms); }},
      {"snapshot_bytes",
       [](const Point&, const ArmRun& r) { return std::to_string(r.result.snapshot_bytes); }},
      {"branch2_activation_ms",
       [](const Point&, const ArmRun& r) { return ms(branch2_activation(r.result)); }},
      {"peak_rss_kib",
       [](const Point&, const ArmRun& r) { return std::to_string(r.peak_rss_kib); }},
      {"n_ctx", [](const Point&, const ArmRun& r) { return std::to_string(r.result.n_ctx); }},
      {"kv_cells_peak",
       [](const Point&, const ArmRun& r) { return std::to_string(r.result.kv_cells_peak); }},
      {"kv_bytes_peak",
       [](const Point&, const ArmRun& r) {
         return fmt::format("{:.0f}", r.result.kv_bytes_peak());
       }},
      {"kv_bytes_allocated",
       [](const Point&, const ArmRun& r) {
         return fmt::format("{:.0f}", r.result.kv_bytes_allocated());
       }},
      {"Baseline_End_To_End_Ms",
       [](const Point&, const ArmRun& r) {
         return r.arm == "none" ? ms(r.result.total_ms) : std::string();
       }},
      {"SwarmKV_End_To_End_Ms",
       [](const Point&, const ArmRun& r) {
         return r.arm != "none" ? ms(r.result.total_ms) : std::string();
       }},
      {"SwarmKV_Prefill_Ms",
       [](const Point&, const ArmRun& r) {
         return r.arm != "none" ? ms(r.result.prefill_ms) : std::string();
       }},
      {"SwarmKV_AgentA_Ms",
       [agent_total](const Point&, const ArmRun& r) { return agent_total(r, 0); }},
      {"SwarmKV_AgentB_Ms",
       [agent_total](const Point&, const ArmRun& r) { return agent_total(r, 1); }},
  };
}

// Then per branch, the timings of timings_json() under their JSON names.
constexpr const char* kBranchTimings[] = {"fork",        "restore",  "prompt",
                                          "first_token", "generate", "total"};

// all_trials.csv: one row per arm run, the columns, then each branch's timings.
std::string trials_csv(const std::string& sweep_key, const std::vector<Point>& points) {
  size_t max_branches = 0;
  for (const Point& p : points)
    max_branches = std::max(max_branches, static_cast<size_t>(p.branches));
  const std::vector<Column> columns = csv_columns(sweep_key);
  std::vector<std::string> header;
  for (const Column& c : columns) header.emplace_back(c.first);
  for (size_t i = 0; i < max_branches; ++i)
    for (const char* k : kBranchTimings) header.push_back(fmt::format("branch{}_{}_ms", i + 1, k));
  std::string csv = fmt::format("{}\n", fmt::join(header, ","));
  for (const Point& p : points) {
    for (const ArmRun& r : p.runs) {
      std::vector<std::string> row;
      for (const Column& c : columns) row.push_back(c.second(p, r));
      for (size_t i = 0; i < max_branches; ++i) {
        const json t = i < r.result.agents.size() ? timings_json(r.result.agents[i].timings_ms)
                                                  : json(nullptr);
        for (const char* k : kBranchTimings)
          row.push_back(t.is_null() ? std::string() : ms(t[k].get<double>()));
      }
      csv += fmt::format("{}\n", fmt::join(row, ","));
    }
  }
  return csv;
}

}  // namespace

void write_outputs(const BenchArgs& args, const json& params, const json& env,
                   const std::vector<Point>& points) {
  namespace fs = std::filesystem;
  fs::create_directories(args.out);
  json results = json::array();
  for (const Point& p : points) results.push_back(summarize(p, args.arms));
  json best = {{"params", params}, {"environment", env}, {"results", results}};
  if (!results.empty()) {
    best["speedup"] = results[0]["speedup"];
    best["arms"] = results[0]["arms"];
  }
  write_text_file(fs::path(args.out) / "best_run.json", best.dump(2) + "\n");
  const std::string sweep_key =
      args.sweep.empty() ? "" : args.sweep.substr(0, args.sweep.find('='));
  write_text_file(fs::path(args.out) / "all_trials.csv", trials_csv(sweep_key, points));
}

}  // namespace swarmkv::cli
