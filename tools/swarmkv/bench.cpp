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
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::cli {
namespace {

using nlohmann::json;

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) {
  g_interrupted.store(true);
}

constexpr std::string_view kPhrase = "The quick brown fox jumps over the lazy dog. ";

// The seed's synthetic document: the phrase repeated and cut to exactly
// `n` tokens of this model's tokenizer (checked by re-tokenising).
std::string synthetic_document(const Model& model, int32_t n) {
  std::string text;
  std::vector<Token> tokens;
  while (static_cast<int32_t>(tokens.size()) < n + 8) {
    for (int i = 0; i < 64; ++i) text += kPhrase;
    tokens = model.tokenize(text, false);
  }
  for (int32_t cut = n; cut > 0; --cut) {
    tokens.resize(static_cast<size_t>(cut));
    std::string doc = model.detokenize(tokens);
    const auto back = model.tokenize(doc, false);
    if (static_cast<int32_t>(back.size()) == n) return doc;
    if (static_cast<int32_t>(back.size()) < n) break;
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("cannot build a synthetic document of exactly {} tokens", n));
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

long peak_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2.0;
}

struct ArmRun {
  std::string arm;
  int trial = 0;
  int order = 0;  // position of the arm within its trial
  PipelineResult result;
  long peak_rss_kib = 0;
  bool answers_match_baseline = true;
};

double branch2_activation(const PipelineResult& r) {
  const AgentResult& a = r.agents.size() > 1 ? r.agents[1] : r.agents[0];
  return a.timings_ms.first_token;
}

json arm_json(const ArmRun& run) {
  const PipelineResult& r = run.result;
  json branches = json::array();
  double gen_ms = 0;
  size_t gen_tokens = 0;
  for (const AgentResult& a : r.agents) {
    const auto& t = a.timings_ms;
    gen_ms += t.generate;
    gen_tokens += a.tokens.size();
    branches.push_back({{"name", a.name},
                        {"status", std::string(to_string(a.status))},
                        {"n_tokens", a.tokens.size()},
                        {"prefill_ms", t.prefill},
                        {"fork_ms", t.fork},
                        {"restore_ms", t.restore},
                        {"prompt_ms", t.prompt},
                        {"first_token_ms", t.first_token},
                        {"generate_ms", t.generate},
                        {"total_ms", t.total},
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
          {"answers_match_baseline", run.answers_match_baseline},
          {"branches", branches}};
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
  uint32_t n_ctx = 0;
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
  const std::string fork_arm = arms.size() > 1 ? arms.back() : arms.front();
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
    }
  }
  bool all_match = std::all_of(p.runs.begin(), p.runs.end(),
                               [](const ArmRun& r) { return r.answers_match_baseline; });
  return {{"sweep_value", p.sweep_value},
          {"branches", p.branches},
          {"doc_tokens", p.doc_tokens},
          {"n_ctx", p.n_ctx},
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
         "end_to_end_ms,prefill_ms,export_ms,snapshot_bytes,branch2_activation_ms,peak_rss_kib,"
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
          "{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{},{:.3f},{},{},{},{},{},{}",
          args.sweep.empty() ? "" : args.sweep.substr(0, args.sweep.find('=')), p.sweep_value,
          r.trial, r.arm, r.order, p.branches, p.doc_tokens, x.prefix_tokens, x.ok(),
          r.answers_match_baseline, x.total_ms, x.prefill_ms, x.export_ms, x.snapshot_bytes,
          branch2_activation(x), r.peak_rss_kib, base ? fmt::format("{:.3f}", x.total_ms) : "",
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

int run_bench(const BenchArgs& args) {
  for (const std::string& arm : args.arms) {
    if (arm != "baseline" && arm != "host") {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("unknown arm '{}' (available: baseline, host; shared and server arms "
                              "are not built yet)",
                              arm));
    }
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
    if (args.n_ctx > 0) {
      spec.n_ctx = args.n_ctx;
    } else {
      spec.n_ctx = 1u << 20;  // measure first, then take the smallest that fits
      const PipelineBudget b = prepare_pipeline(spec, *model).budget;
      spec.n_ctx = static_cast<uint32_t>((b.required + 255) / 256 * 256);
    }
    point.n_ctx = spec.n_ctx;
    points.push_back(point);
    for (int trial = 1; trial <= args.trials && !g_interrupted; ++trial) {
      if (trial > 1 && args.pause_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(args.pause_ms));
      std::vector<std::string> order = args.arms;
      if (trial % 2 == 0)
        std::reverse(order.begin(), order.end());  // drift must not favour one arm
      std::vector<ArmRun> trial_runs;
      for (size_t k = 0; k < order.size() && !g_interrupted; ++k) {
        spec.fork = order[k] == "baseline" ? ForkMode::kNone : ForkMode::kHost;
        ArmRun run;
        run.arm = order[k];
        run.trial = trial;
        run.order = static_cast<int>(k);
        run.result = run_pipeline(spec, model);
        run.peak_rss_kib = peak_rss_kib();
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
        for (size_t i = 0; base != nullptr && i < r.result.agents.size(); ++i) {
          if (r.result.agents[i].tokens != base->result.agents[i].tokens)
            r.answers_match_baseline = false;
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
