#include "bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "result_json.h"
#include "server_arm.h"
#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/synthetic.h"

namespace swarmkv::cli {
namespace {

using nlohmann::json;

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) {
  g_interrupted.store(true);
}

// Branch i's own question, about `m` tokens long, different for every branch.
std::string branch_prompt(const Model& model, int32_t i, int32_t m) {
  static const char* kWords[] = {" fox",   " dog",   " jump", " lazy",
                                 " quick", " brown", " over", " the"};
  std::string prompt = fmt::format("Q{}:", i + 1);
  for (int w = 0; static_cast<int32_t>(model.tokenize(prompt, false).size()) < m && w < 4 * m;
       ++w) {
    prompt += kWords[(i + w) % 8];
  }
  return prompt;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2.0;
}

// Peak RSS per arm: Linux resets the process's high-water mark (VmHWM) when
// "5" is written to /proc/self/clear_refs; where that fails the value is the
// process's peak so far, and the output says so.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

long peak_rss_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

ForkMode arm_fork_mode(const std::string& arm) {
  if (arm == "baseline") return ForkMode::kNone;
  return parse_fork_mode(arm);  // host, shared
}

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

struct ArmRun {
  std::string arm;
  int trial = 0;
  int order = 0;  // position of the arm within its trial
  PipelineResult result;
  long peak_rss_kib = 0;
  bool peak_rss_per_arm = false;  // false: the process's peak so far
  bool answers_match_baseline = true;
  std::vector<int> first_difference;  // per branch: first token differing from baseline, -1: none
  json extra = json::object();        // arm-specific facts (the server arms' own timings)
  double branch_phase_ms = -1;        // end-to-end minus the one document prefill; -1: not defined
};

bool is_server_arm(const std::string& arm) {
  return arm == "server-concurrent" || arm == "server-sequential";
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

double branch2_activation(const PipelineResult& r) {
  const AgentResult& a = r.agents.size() > 1 ? r.agents[1] : r.agents[0];
  return a.timings_ms.first_token;
}

json arm_json(const ArmRun& run) {
  const PipelineResult& r = run.result;
  json branches = json::array();
  double gen_ms = 0;
  size_t gen_tokens = 0;
  for (size_t i = 0; i < r.agents.size(); ++i) {
    const AgentResult& a = r.agents[i];
    const auto& t = a.timings_ms;
    gen_ms += t.generate;
    gen_tokens += a.tokens.size();
    branches.push_back({{"name", a.name},
                        {"first_difference_vs_baseline",
                         i < run.first_difference.size() ? run.first_difference[i] : -1},
                        {"status", std::string(to_string(a.status))},
                        {"n_tokens", a.tokens.size()},
                        {"prefill_ms", t.prefill},
                        {"fork_ms", t.fork},
                        {"restore_ms", t.restore},
                        {"prompt_ms", t.prompt},
                        {"first_token_ms", t.first_token},
                        {"generate_ms", t.generate},
                        {"total_ms", t.total},
                        {"done_at_ms", t.done_at},
                        {"wait_ms", t.wait}});
  }
  const double prefill_tokens =
      static_cast<double>(r.prefix_tokens) *
      (r.fork == ForkMode::kNone ? static_cast<double>(r.agents.size()) : 1.0);
  return {{"arm", run.arm},
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
          {"answers_match_baseline", run.answers_match_baseline},
          {"branch_phase_ms", run.branch_phase_ms >= 0 ? json(run.branch_phase_ms) : json(nullptr)},
          {"agent_done_ms", agent_done(r)},
          {"branches", branches},
          {"extra", run.extra}};
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// One benchmark point: all trials of all arms at fixed parameters.
struct Point {
  std::string sweep_value;
  int32_t branches = 0;
  int32_t doc_tokens = 0;
  std::vector<ArmRun> runs;
};

json summarize(const Point& p, const std::vector<std::string>& arms) {
  json arms_json = json::object();
  json speedup = json::object();
  std::map<std::string, std::vector<double>> e2e, act;
  for (const ArmRun& r : p.runs) {
    e2e[r.arm].push_back(r.result.total_ms);
    act[r.arm].push_back(branch2_activation(r.result));
  }
  // The seed's selection: per trial, score = 2 * TTFT% + E2E% (reductions vs baseline).
  int best_trial = -1;
  double best_score = -1e300;
  std::map<int, std::map<std::string, const ArmRun*>> by_trial;
  for (const ArmRun& r : p.runs) by_trial[r.trial][r.arm] = &r;
  // The seed's score compares one fork arm with the baseline: ours, not a peer's.
  std::string fork_arm = arms.size() > 1 ? arms[1] : arms.front();
  for (const char* preferred : {"host", "shared"})
    if (std::find(arms.begin(), arms.end(), preferred) != arms.end()) fork_arm = preferred;
  for (const auto& [trial, m] : by_trial) {
    if (!m.contains("baseline") || !m.contains(fork_arm) || m.size() != arms.size()) continue;
    const double be = m.at("baseline")->result.total_ms, fe = m.at(fork_arm)->result.total_ms;
    const double ba = branch2_activation(m.at("baseline")->result),
                 fa = branch2_activation(m.at(fork_arm)->result);
    const double score = 2 * 100 * (ba - fa) / ba + 100 * (be - fe) / be;
    if (score > best_score) best_score = score, best_trial = trial;
  }
  for (const std::string& arm : arms) {
    if (!e2e.contains(arm)) continue;
    json best = nullptr;
    if (best_trial >= 0) best = arm_json(*by_trial[best_trial][arm]);
    arms_json[arm] = {{"median_end_to_end_ms", median(e2e[arm])},
                      {"median_branch2_activation_ms", median(act[arm])},
                      {"best_trial", best}};
    if (arm != "baseline" && e2e.contains("baseline")) {
      speedup[arm] = {
          {"end_to_end", median(e2e["baseline"]) / median(e2e[arm])},
          {"branch2_activation", median(act["baseline"]) / median(act[arm])},
          {"best_trial_end_to_end", best_trial >= 0
                                        ? by_trial[best_trial]["baseline"]->result.total_ms /
                                              by_trial[best_trial][arm]->result.total_ms
                                        : 0.0},
          {"best_trial_branch2_activation",
           best_trial >= 0 ? branch2_activation(by_trial[best_trial]["baseline"]->result) /
                                 branch2_activation(by_trial[best_trial][arm]->result)
                           : 0.0}};
      if (arm != "host" && e2e.contains("host")) {
        speedup[arm]["end_to_end_vs_host"] = median(e2e["host"]) / median(e2e[arm]);
      }
      // SwarmKV's shared fork against each peer arm, and on the branch phase
      // (end-to-end minus the one document prefill both pay).
      if (arm == "shared") {
        for (const std::string& peer : arms) {
          if (!is_server_arm(peer) || !e2e.contains(peer)) continue;
          speedup[arm]["end_to_end_vs_" + peer] = median(e2e[peer]) / median(e2e[arm]);
        }
        std::vector<double> mine, seq;
        for (const ArmRun& r : p.runs) {
          if (r.arm == "shared" && r.branch_phase_ms > 0) mine.push_back(r.branch_phase_ms);
          if (r.arm == "server-sequential" && r.branch_phase_ms > 0)
            seq.push_back(r.branch_phase_ms);
        }
        if (!mine.empty() && !seq.empty())
          speedup[arm]["branch_phase_vs_server-sequential"] = median(seq) / median(mine);
      }
    }
  }
  bool all_match = std::all_of(p.runs.begin(), p.runs.end(),
                               [](const ArmRun& r) { return r.answers_match_baseline; });
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
  std::ofstream(fs::path(args.out) / "best_run.json") << best.dump(2) << "\n";

  size_t max_branches = 0;
  for (const Point& p : points)
    max_branches = std::max(max_branches, static_cast<size_t>(p.branches));
  std::ofstream csv(fs::path(args.out) / "all_trials.csv");
  csv << "sweep,sweep_value,trial,arm,order,branches,doc_tokens,prefix_tokens,ok,answers_match_"
         "baseline,"
         "end_to_end_ms,prefill_ms,export_ms,snapshot_bytes,branch2_activation_ms,peak_rss_kib,n_"
         "ctx,"
         "kv_cells_peak,kv_bytes_peak,kv_bytes_allocated,"
         "Baseline_End_To_End_Ms,SwarmKV_End_To_End_Ms,SwarmKV_Prefill_Ms,SwarmKV_AgentA_Ms,"
         "SwarmKV_AgentB_Ms";
  for (size_t i = 0; i < max_branches; ++i) {
    for (const char* k : {"fork", "restore", "prompt", "first_token", "generate", "total"}) {
      csv << fmt::format(",branch{}_{}_ms", i + 1, k);
    }
  }
  csv << "\n";
  for (const Point& p : points) {
    for (const ArmRun& r : p.runs) {
      const PipelineResult& x = r.result;
      const bool base = r.arm == "baseline";
      auto agent_ms = [&](size_t i) {
        return i < x.agents.size() ? fmt::format("{:.3f}", x.agents[i].timings_ms.total) : "";
      };
      csv << fmt::format(
          "{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{},{:.3f},{},{},{},{:.0f},{:.0f},{},{"
          "},{},{},"
          "{}",
          args.sweep.empty() ? "" : args.sweep.substr(0, args.sweep.find('=')), p.sweep_value,
          r.trial, r.arm, r.order, p.branches, p.doc_tokens, x.prefix_tokens, x.ok(),
          r.answers_match_baseline, x.total_ms, x.prefill_ms, x.export_ms, x.snapshot_bytes,
          branch2_activation(x), r.peak_rss_kib, x.n_ctx, x.kv_cells_peak, x.kv_bytes_peak(),
          x.kv_bytes_allocated(), base ? fmt::format("{:.3f}", x.total_ms) : "",
          base ? "" : fmt::format("{:.3f}", x.total_ms),
          base ? "" : fmt::format("{:.3f}", x.prefill_ms), base ? "" : agent_ms(0),
          base ? "" : agent_ms(1));
      for (size_t i = 0; i < max_branches; ++i) {
        if (i < x.agents.size()) {
          const auto& t = x.agents[i].timings_ms;
          csv << fmt::format(",{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f}", t.fork, t.restore,
                             t.prompt, t.first_token, t.generate, t.total);
        } else {
          csv << ",,,,,,";
        }
      }
      csv << "\n";
    }
  }
}

// One server run: start llama-server, send the branch requests (all at once
// or one after another), stop it. Server start-up (model load) is outside
// the timing, as our arms' model load is.
struct ServerRun {
  PipelineResult result;
  json requests = json::array();
  long peak_rss_kib = 0;
  pid_t pid = -1;
  bool kv_unified = false;
};

ServerRun run_server_once(bool concurrent, bool kv_unified, const PipelineSpec& spec,
                          const PreparedPipeline& prepared, const std::string& model_path,
                          const BenchArgs& args, const std::string& log_path) {
  const size_t n = spec.agents.size();
  const PipelineBudget& b = prepared.budget;
  const auto per_slot =
      static_cast<uint32_t>((b.prefix_tokens + b.max_branch_tokens + b.headroom + 255) / 256 * 256);
  ServerConfig cfg;
  cfg.binary = args.server_bin;  // resolved once by run_bench
  cfg.model = model_path;
  cfg.threads = args.threads;
  cfg.n_parallel = concurrent ? static_cast<int32_t>(n) : 1;
  cfg.n_ctx = per_slot * static_cast<uint32_t>(cfg.n_parallel);
  cfg.kv_unified = kv_unified;
  cfg.log_path = log_path;
  LlamaServer server(cfg);

  std::vector<std::vector<Token>> prompts;
  for (size_t i = 0; i < n; ++i) {
    std::vector<Token> p = prepared.prefix;
    p.insert(p.end(), prepared.branches[i].begin(), prepared.branches[i].end());
    prompts.push_back(std::move(p));
  }
  std::vector<ServerReply> replies(n);
  const auto start = std::chrono::steady_clock::now();
  if (concurrent) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        try {
          replies[i] = server_complete(server.port(), prompts[i], spec.agents[i].max_tokens, start,
                                       g_interrupted);
        } catch (...) {  // e.g. a malformed event: this request failed, the others go on
          replies[i].error = current_error_value().to_string();
        }
      });
    }
    for (auto& t : threads) t.join();
  } else {
    for (size_t i = 0; i < n && !g_interrupted; ++i) {
      replies[i] = server_complete(server.port(), prompts[i], spec.agents[i].max_tokens, start,
                                   g_interrupted);
    }
  }
  const double e2e =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ServerRun run;
  run.peak_rss_kib = server.peak_rss_kib();
  run.pid = server.pid();
  run.kv_unified = kv_unified;
  server.stop();

  PipelineResult& r = run.result;
  r.fork = ForkMode::kNone;
  r.prefix_tokens = b.prefix_tokens;
  r.total_ms = e2e;
  r.n_ctx = cfg.n_ctx;
  r.n_seq_max = static_cast<uint32_t>(cfg.n_parallel);
  r.contexts = 1;
  r.agents.resize(n);
  int64_t cells = 0, max_cells = 0;
  for (size_t i = 0; i < n; ++i) {
    const ServerReply& x = replies[i];
    AgentResult& a = r.agents[i];
    a.name = spec.agents[i].name;
    a.status = x.error.empty() ? NodeStatus::kOk : NodeStatus::kFailed;
    if (!x.error.empty()) a.error = ErrorValue{ErrorCode::kIo, x.error};  // the request failed
    a.tokens = x.tokens;
    a.answer = x.text;
    a.prompt_tokens = static_cast<int32_t>(prepared.branches[i].size());
    a.timings_ms.prompt = x.prompt_ms;
    a.timings_ms.first_token = x.first_token_ms;
    a.timings_ms.generate = x.predicted_ms;
    a.timings_ms.total = x.total_ms;
    a.timings_ms.done_at = x.done_at_ms;
    r.prefill_ms += x.prompt_ms;
    const int64_t slot_cells = static_cast<int64_t>(prompts[i].size() + x.tokens.size());
    cells += slot_cells;
    max_cells = std::max(max_cells, slot_cells);
    run.requests.push_back({{"name", a.name},
                            {"cache_n", x.cache_n},
                            {"prompt_n", x.prompt_n},
                            {"prompt_ms", x.prompt_ms},
                            {"predicted_n", x.predicted_n},
                            {"predicted_ms", x.predicted_ms},
                            {"first_token_ms", x.first_token_ms},
                            {"total_ms", x.total_ms},
                            {"done_at_ms", x.done_at_ms},
                            {"error", x.error}});
  }
  // Slots do not share the document: concurrent slots hold a copy each;
  // the sequential server's one slot holds the document and one branch.
  r.kv_cells_peak = concurrent ? cells : max_cells;
  return run;
}

ArmRun run_server_arm(const std::string& arm, const PipelineSpec& spec, const Model& model,
                      const std::string& model_path, const BenchArgs& args, const std::string& tag,
                      int& kvu_choice) {
  PipelineSpec none = spec;
  none.fork = ForkMode::kNone;
  const PreparedPipeline prepared = prepare_pipeline(none, model);
  const bool concurrent = arm == "server-concurrent";
  std::vector<bool> configs;
  if (!concurrent) {
    configs = {false};
  } else if (kvu_choice >= 0) {
    configs = {kvu_choice == 1};
  } else if (args.server_kvu == "both") {
    configs = {false, true};
  } else {
    configs = {args.server_kvu == "on"};
  }
  json tried = json::array();
  std::optional<ServerRun> best;
  for (bool kvu : configs) {
    const std::string log = (std::filesystem::path(args.out) /
                             fmt::format("{}-{}-kvu{}.log", arm, tag, kvu ? "on" : "off"))
                                .string();
    ServerRun run = run_server_once(concurrent, kvu, spec, prepared, model_path, args, log);
    tried.push_back({{"kv_unified", kvu}, {"end_to_end_ms", run.result.total_ms}});
    std::cerr << fmt::format("[bench]   {} with kv_unified {}: {:.1f} ms\n", arm,
                             kvu ? "on" : "off", run.result.total_ms);
    if (!best || (run.result.ok() && run.result.total_ms < best->result.total_ms))
      best = std::move(run);
    if (g_interrupted) break;
  }
  if (concurrent && kvu_choice < 0) kvu_choice = best->kv_unified ? 1 : 0;
  ArmRun out;
  out.arm = arm;
  out.result = std::move(best->result);
  out.peak_rss_kib = best->peak_rss_kib;
  out.peak_rss_per_arm = true;
  if (!concurrent && !best->requests.empty()) {
    out.branch_phase_ms = out.result.total_ms - best->requests[0]["prompt_ms"].get<double>();
  }
  out.extra = {{"server",
                {{"binary", args.server_bin},
                 {"pid", best->pid},
                 {"n_parallel", out.result.n_seq_max},
                 {"n_ctx", out.result.n_ctx},
                 {"kv_unified", best->kv_unified},
                 {"kv_unified_tried", tried},
                 {"peak_rss_kib", best->peak_rss_kib},
                 {"requests", best->requests}}}};
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace

int run_bench(const BenchArgs& requested) {
  BenchArgs args = requested;
  for (const std::string& arm : args.arms) {
    if (arm != "baseline" && arm != "host" && arm != "shared" && !is_server_arm(arm)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("unknown arm '{}' (available: baseline, host, shared, "
                              "server-concurrent, server-sequential)",
                              arm));
    }
  }
  // Found once, before any work, so a missing server fails fast.
  if (std::any_of(args.arms.begin(), args.arms.end(), is_server_arm))
    args.server_bin = find_llama_server(args.server_bin);
  if (args.server_kvu != "on" && args.server_kvu != "off" && args.server_kvu != "both") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--server-kvu '{}': expected on, off or both", args.server_kvu));
  }
  if (args.arms.empty() || args.arms.front() != "baseline") {
    throw Error(ErrorCode::kInvalidArgument,
                "--arms must start with baseline (speed-ups are relative to it)");
  }
  std::string sweep_key;
  std::vector<std::string> sweep_values{""};
  if (!args.sweep.empty()) {
    const size_t eq = args.sweep.find('=');
    sweep_key = args.sweep.substr(0, eq);
    if (eq == std::string::npos || (sweep_key != "branches" && sweep_key != "doc-tokens")) {
      throw Error(
          ErrorCode::kInvalidArgument,
          fmt::format("--sweep '{}': expected branches=1,2,4 or doc-tokens=512,1024", args.sweep));
    }
    sweep_values = split(args.sweep.substr(eq + 1), ',');
    for (const auto& v : sweep_values) {
      if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || std::stoi(v) < 1) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("--sweep '{}': '{}' is not a positive integer", args.sweep, v));
      }
    }
  }

  const std::string model_path = resolve_model_path(args.model);
  auto model = Model::load(model_path);
  const std::string file_doc = args.doc_file.empty() ? "" : read_file(args.doc_file);

  json params = {{"model", model_path},
                 {"doc", args.doc_file.empty() ? "synthetic" : args.doc_file},
                 {"doc_tokens", args.doc_tokens},
                 {"branches", args.branches},
                 {"branch_tokens", args.branch_tokens},
                 {"n_predict", args.n_predict},
                 {"n_ctx", args.n_ctx},
                 {"threads", args.threads},
                 {"trials", args.trials},
                 {"pause_ms", args.pause_ms},
                 {"arms", args.arms},
                 {"sweep", args.sweep},
                 {"flash_attn", false},
                 {"kv_type", "f16"}};
  json env = {{"cpu", cpu_model()},
              {"cores", std::thread::hardware_concurrency()},
              {"engine", engine_build_info()},
              {"model_file", model_path},
              {"model_description", model->description()}};
  if (const char* sha = std::getenv("SWARMKV_MODEL_SHA256")) env["model_sha256"] = sha;

  std::filesystem::create_directories(args.out);  // server logs land there before any result
  std::signal(SIGINT, on_sigint);
  std::vector<Point> points;
  for (const std::string& value : sweep_values) {
    Point point;
    point.sweep_value = value;
    point.branches = sweep_key == "branches" ? std::stoi(value) : args.branches;
    point.doc_tokens = sweep_key == "doc-tokens" ? std::stoi(value) : args.doc_tokens;
    PipelineSpec spec;
    spec.name = "bench";
    spec.document = args.doc_file.empty() ? synthetic_document(*model, point.doc_tokens) : file_doc;
    spec.document_source = args.doc_file.empty() ? "synthetic" : "file:" + args.doc_file;
    spec.n_threads = args.threads;
    spec.system_prompt.clear();
    for (int32_t i = 0; i < point.branches; ++i) {
      AgentSpec a;
      a.name = fmt::format("branch{}", i + 1);
      a.prompt = branch_prompt(*model, i, args.branch_tokens);
      a.max_tokens = args.n_predict;
      spec.agents.push_back(a);
    }
    spec.n_ctx = args.n_ctx;  // 0: per arm, the smallest multiple of 256 that fits its layout
    points.push_back(point);
    int kvu_choice = -1;  // server-concurrent's KV layout, decided on the first trial
    for (int trial = 1; trial <= args.trials && !g_interrupted; ++trial) {
      if (trial > 1 && args.pause_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(args.pause_ms));
      std::vector<std::string> order = args.arms;
      if (trial % 2 == 0)
        std::reverse(order.begin(), order.end());  // drift must not favour one arm
      std::vector<ArmRun> trial_runs;
      for (size_t k = 0; k < order.size() && !g_interrupted; ++k) {
        ArmRun run;
        if (is_server_arm(order[k])) {
          run = run_server_arm(order[k], spec, *model, model_path, args,
                               fmt::format("{}t{}", value.empty() ? "" : value + "-", trial),
                               kvu_choice);
        } else {
          spec.fork = arm_fork_mode(order[k]);
          run.arm = order[k];
          run.peak_rss_per_arm = reset_peak_rss();
          run.result = run_pipeline(spec, model);
          run.peak_rss_kib = peak_rss_kib();
          if (spec.fork != ForkMode::kNone)
            run.branch_phase_ms = run.result.total_ms - run.result.prefill_ms;
        }
        run.trial = trial;
        run.order = static_cast<int>(k);
        std::cerr << fmt::format(
            "[bench] {}{}trial {}/{} arm {:<8} end-to-end {:>9.1f} ms, branch-2 activation "
            "{:>9.1f} ms{}\n",
            sweep_key.empty() ? "" : sweep_key + "=" + value, sweep_key.empty() ? "" : " ", trial,
            args.trials, run.arm, run.result.total_ms, branch2_activation(run.result),
            run.result.ok() ? "" : " (FAILED)");
        trial_runs.push_back(std::move(run));
      }
      if (g_interrupted && trial_runs.size() != order.size()) break;  // keep only whole trials
      const ArmRun* base = nullptr;
      for (const ArmRun& r : trial_runs)
        if (r.arm == "baseline") base = &r;
      for (ArmRun& r : trial_runs) {
        // The server does not report KV bytes; the engine's, measured by our arms, apply.
        if (base != nullptr && r.result.kv_bytes_per_cell == 0)
          r.result.kv_bytes_per_cell = base->result.kv_bytes_per_cell;
        for (size_t i = 0; base != nullptr && i < r.result.agents.size(); ++i) {
          const auto& mine = r.result.agents[i].tokens;
          const auto& want = base->result.agents[i].tokens;
          int d = 0;
          while (static_cast<size_t>(d) < mine.size() && static_cast<size_t>(d) < want.size() &&
                 mine[static_cast<size_t>(d)] == want[static_cast<size_t>(d)])
            ++d;
          r.first_difference.push_back(mine == want ? -1 : d);
          if (mine != want) r.answers_match_baseline = false;
        }
      }
      for (ArmRun& r : trial_runs) points.back().runs.push_back(std::move(r));
      write_outputs(args, params, env, points);  // after every trial: Ctrl-C loses nothing finished
    }
    if (g_interrupted) break;
  }
  write_outputs(args, params, env, points);
  std::signal(SIGINT, SIG_DFL);
  if (g_interrupted) {
    std::cerr << "[bench] interrupted: the finished trials are in " << args.out << "\n";
    return 130;
  }
  bool ok = true;
  for (const Point& p : points) {
    for (const ArmRun& r : p.runs) ok = ok && r.result.ok();
  }
  std::cerr << "[bench] results in " << args.out << " (best_run.json, all_trials.csv)\n";
  return ok ? 0 : 1;
}

}  // namespace swarmkv::cli
