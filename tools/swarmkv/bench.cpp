#include "bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bench_report.h"
#include "cli.h"
#include "server_arm.h"
#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"
#include "swarmkv/synthetic.h"

namespace swarmkv::cli {
namespace {

using nlohmann::json;

std::atomic<bool> g_interrupted{false};
// The first Ctrl-C ends the bench after the arm running now (the finished
// trials are kept); a second one exits at once.
extern "C" void on_sigint(int) {
  if (g_interrupted.exchange(true)) _exit(swarmkv::cli::kExitInterrupted);
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

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
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

ServerConfig server_config(bool concurrent, bool kv_unified, const PipelineSpec& spec,
                           const PreparedPipeline& prepared, const std::string& model_path,
                           const BenchArgs& args, const std::string& log_path) {
  const PipelineBudget& b = prepared.budget;
  const auto per_slot = static_cast<uint32_t>(
      (b.prefix_tokens + b.max_branch_tokens + b.max_new_tokens + 255) / 256 * 256);
  ServerConfig cfg;
  cfg.binary = args.server_bin;  // resolved once by run_bench
  cfg.model = model_path;
  cfg.engine = spec.context_options();
  cfg.n_parallel = concurrent ? static_cast<int32_t>(spec.agents.size()) : 1;
  cfg.n_ctx = per_slot * static_cast<uint32_t>(cfg.n_parallel);
  cfg.kv_unified = kv_unified;
  cfg.log_path = log_path;
  return cfg;
}

// Each prompt as the server gets it: the document's tokens, then the branch's.
std::vector<std::vector<Token>> server_prompts(const PreparedPipeline& prepared, size_t n) {
  std::vector<std::vector<Token>> prompts;
  for (size_t i = 0; i < n; ++i) {
    std::vector<Token> p = prepared.prefix;
    p.insert(p.end(), prepared.branches[i].begin(), prepared.branches[i].end());
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// Sends every prompt, all at once (concurrent) or one after another.
std::vector<ServerReply> send_requests(const LlamaServer& server, bool concurrent,
                                       const std::vector<std::vector<Token>>& prompts,
                                       const PipelineSpec& spec, Clock::time_point start) {
  const size_t n = prompts.size();
  std::vector<ServerReply> replies(n);
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
  return replies;
}

AgentResult server_agent(const std::string& name, const ServerReply& x, int32_t prompt_tokens) {
  AgentResult a;
  a.name = name;
  a.status = x.error.empty() ? NodeStatus::kOk : NodeStatus::kFailed;
  if (!x.error.empty()) a.error = ErrorValue{ErrorCode::kIo, x.error};  // the request failed
  a.tokens = x.tokens;
  a.answer = x.text;
  a.prompt_tokens = prompt_tokens;
  a.timings_ms.prompt = x.prompt_ms;
  a.timings_ms.first_token = x.first_token_ms;
  a.timings_ms.generate = x.predicted_ms;
  a.timings_ms.total = x.total_ms;
  a.timings_ms.done_at = x.done_at_ms;
  // Sent at the start (concurrent) or after the previous answer (sequential).
  a.timings_ms.started_at = std::max(0.0, x.done_at_ms - x.total_ms);
  a.timings_ms.wait = a.timings_ms.started_at;
  a.timings_ms.first_token_at = a.timings_ms.started_at + x.first_token_ms;
  return a;
}

json request_json(const std::string& name, const ServerReply& x) {
  return {{"name", name},
          {"cache_n", x.cache_n},
          {"prompt_n", x.prompt_n},
          {"prompt_ms", x.prompt_ms},
          {"predicted_n", x.predicted_n},
          {"predicted_ms", x.predicted_ms},
          {"first_token_ms", x.first_token_ms},
          {"total_ms", x.total_ms},
          {"done_at_ms", x.done_at_ms},
          {"error", x.error}};
}

// The replies as the result of a --fork none run: every request prefills
// the document.
void fill_server_result(ServerRun& run, const std::vector<ServerReply>& replies,
                        const std::vector<std::vector<Token>>& prompts, const PipelineSpec& spec,
                        const PreparedPipeline& prepared, const ServerConfig& cfg,
                        bool concurrent) {
  const size_t n = replies.size();
  PipelineResult& r = run.result;
  r.fork = ForkMode::kNone;
  r.prefix_tokens = prepared.budget.prefix_tokens;
  r.document_prefills = static_cast<int32_t>(n);  // every request prefills the document
  r.n_ctx = cfg.n_ctx;
  r.n_seq_max = static_cast<uint32_t>(cfg.n_parallel);
  r.contexts = 1;
  int64_t cells = 0, max_cells = 0;
  for (size_t i = 0; i < n; ++i) {
    const ServerReply& x = replies[i];
    r.agents.push_back(
        server_agent(spec.agents[i].name, x, static_cast<int32_t>(prepared.branches[i].size())));
    r.prefill_ms += x.prompt_ms;
    const int64_t slot_cells = static_cast<int64_t>(prompts[i].size() + x.tokens.size());
    cells += slot_cells;
    max_cells = std::max(max_cells, slot_cells);
    run.requests.push_back(request_json(spec.agents[i].name, x));
  }
  // Slots do not share the document: concurrent slots hold a copy each;
  // the sequential server's one slot holds the document and one branch.
  r.kv_cells_peak = concurrent ? cells : max_cells;
}

ServerRun run_server_once(bool concurrent, bool kv_unified, const PipelineSpec& spec,
                          const PreparedPipeline& prepared, const std::string& model_path,
                          const BenchArgs& args, const std::string& log_path) {
  const ServerConfig cfg =
      server_config(concurrent, kv_unified, spec, prepared, model_path, args, log_path);
  LlamaServer server(cfg);
  const std::vector<std::vector<Token>> prompts = server_prompts(prepared, spec.agents.size());
  const auto start = std::chrono::steady_clock::now();
  const std::vector<ServerReply> replies = send_requests(server, concurrent, prompts, spec, start);
  const double e2e =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ServerRun run;
  run.peak_rss_kib = server.peak_rss_kib();
  run.pid = server.pid();
  run.kv_unified = kv_unified;
  server.stop();
  fill_server_result(run, replies, prompts, spec, prepared, cfg, concurrent);
  run.result.total_ms = e2e;
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

// The arms named, server_kvu and the arms' order checked; the llama-server
// found once, before any work, so that a missing server fails fast.
BenchArgs checked_args(const BenchArgs& requested) {
  BenchArgs args = requested;
  for (const std::string& arm : args.arms) {
    if (arm != "none" && arm != "host" && arm != "shared" && !is_server_arm(arm)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("unknown arm '{}' (available: none, host, shared, "
                              "server-concurrent, server-sequential)",
                              arm));
    }
  }
  if (std::any_of(args.arms.begin(), args.arms.end(), is_server_arm))
    args.server_bin = find_llama_server(args.server_bin);
  if (args.server_kvu != "on" && args.server_kvu != "off" && args.server_kvu != "both") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--server-kvu '{}': expected on, off or both", args.server_kvu));
  }
  if (args.arms.empty()) throw Error(ErrorCode::kInvalidArgument, "--arms names no arm");
  if (std::find(args.arms.begin() + 1, args.arms.end(), "none") != args.arms.end()) {
    throw Error(ErrorCode::kInvalidArgument,
                "--arms: none, the reference, comes first (speed-ups are relative to it)");
  }
  return args;
}

// --sweep: the parameter varied (empty: none) and its values (one empty
// value without a sweep).
struct Sweep {
  std::string key;
  std::vector<std::string> values{""};
};

Sweep parse_sweep(const std::string& sweep) {
  Sweep out;
  if (sweep.empty()) return out;
  const size_t eq = sweep.find('=');
  out.key = sweep.substr(0, eq);
  if (eq == std::string::npos || (out.key != "branches" && out.key != "doc-tokens")) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--sweep '{}': expected branches=1,2,4 or doc-tokens=512,1024", sweep));
  }
  out.values = split(sweep.substr(eq + 1), ',');
  for (const auto& v : out.values) {
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || std::stoi(v) < 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--sweep '{}': '{}' is not a positive integer", sweep, v));
    }
  }
  return out;
}

json bench_params(const BenchArgs& args, const std::string& model_path) {
  return {{"model", model_path},
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
          {"max_live", args.max_live},
          {"engine", nullptr}};
}

json bench_environment(const std::string& model_path, const Model& model) {
  json env = {{"cpu", cpu_model()},
              {"cores", std::thread::hardware_concurrency()},
              {"engine", engine_build_info()},
              {"model_file", model_path},
              {"model_description", model.description()}};
  if (const char* sha = std::getenv("SWARMKV_MODEL_SHA256")) env["model_sha256"] = sha;
  return env;
}

// Each arm's answers against the reference arm's (none) of the same trial:
// the first token that differs per branch; the reference's KV bytes per
// cell for the server arms, which do not report them.
void compare_with_reference(std::vector<ArmRun>& trial_runs) {
  const ArmRun* base = nullptr;
  for (const ArmRun& r : trial_runs)
    if (r.arm == "none") base = &r;
  if (base == nullptr) return;
  for (ArmRun& r : trial_runs) {
    if (r.result.kv_bytes_per_cell == 0)
      r.result.kv_bytes_per_cell = base->result.kv_bytes_per_cell;
    for (size_t i = 0; i < r.result.agents.size(); ++i) {
      const auto& mine = r.result.agents[i].tokens;
      const auto& want = base->result.agents[i].tokens;
      const auto differ = std::mismatch(mine.begin(), mine.end(), want.begin(), want.end());
      r.compared = true;
      r.first_difference.push_back(mine == want ? -1
                                                : static_cast<int>(differ.first - mine.begin()));
      if (mine != want) r.answers_match_reference = false;
    }
  }
}

// One bench run: the model loaded once, every point's trials, the outputs
// rewritten after each trial (so that Ctrl-C loses nothing finished).
class Bench {
 public:
  explicit Bench(const BenchArgs& requested)
      : args_(checked_args(requested)), sweep_(parse_sweep(args_.sweep)) {}
  int run();

 private:
  PipelineSpec point_spec(const Point& point);
  void run_point(const std::string& value);
  std::vector<ArmRun> run_trial(PipelineSpec& spec, const std::string& value, int trial,
                                int& kvu_choice);
  ArmRun run_arm(const std::string& arm, PipelineSpec& spec, const std::string& tag,
                 int& kvu_choice);
  void log_arm(const std::string& value, int trial, const ArmRun& run) const;
  int finish();

  BenchArgs args_;
  Sweep sweep_;
  std::string model_path_;
  std::shared_ptr<const Model> model_;
  std::string file_doc_;
  json params_;
  json env_;
  std::vector<Point> points_;
};

int Bench::run() {
  model_path_ = resolve_model_path(args_.model);
  PipelineSpec engine_spec;  // the engine flags alone decide how the model loads
  args_.engine.apply(engine_spec);
  model_ = Model::load(model_path_, engine_spec.model_options());
  file_doc_ = args_.doc_file.empty() ? "" : read_file(args_.doc_file);
  params_ = bench_params(args_, model_path_);
  env_ = bench_environment(model_path_, *model_);

  std::filesystem::create_directories(args_.out);  // server logs land there before any result
  std::signal(SIGINT, on_sigint);
  for (const std::string& value : sweep_.values) {
    run_point(value);
    if (g_interrupted) break;
  }
  return finish();
}

// The point's pipeline: the document, one agent per branch, the engine flags.
PipelineSpec Bench::point_spec(const Point& point) {
  PipelineSpec spec;
  spec.name = "bench";
  spec.document =
      args_.doc_file.empty() ? synthetic_document(*model_, point.doc_tokens) : file_doc_;
  spec.document_source = args_.doc_file.empty() ? "synthetic" : "file:" + args_.doc_file;
  spec.n_threads = args_.threads;
  args_.engine.apply(spec);
  spec.validate();
  params_["engine"] = engine_json(spec.context_options(), model_->options().n_gpu_layers,
                                  model_->offloaded_layers());
  spec.system_prompt.clear();
  for (int32_t i = 0; i < point.branches; ++i) {
    AgentSpec a;
    a.name = fmt::format("branch{}", i + 1);
    a.prompt = branch_prompt(*model_, i, args_.branch_tokens);
    a.max_tokens = args_.n_predict;
    spec.agents.push_back(a);
  }
  spec.n_ctx = args_.n_ctx;  // 0: per arm, the smallest multiple of 256 that fits its layout
  spec.max_live = args_.max_live;
  return spec;
}

void Bench::run_point(const std::string& value) {
  Point point;
  point.sweep_value = value;
  point.branches = sweep_.key == "branches" ? std::stoi(value) : args_.branches;
  point.doc_tokens = sweep_.key == "doc-tokens" ? std::stoi(value) : args_.doc_tokens;
  PipelineSpec spec = point_spec(point);
  points_.push_back(point);
  int kvu_choice = -1;  // server-concurrent's KV layout, decided on the first trial
  for (int trial = 1; trial <= args_.trials && !g_interrupted; ++trial) {
    // The pause, in short steps so that Ctrl-C ends it.
    for (const Stopwatch pause; trial > 1 && pause.ms() < args_.pause_ms && !g_interrupted;)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (g_interrupted) break;
    std::vector<ArmRun> trial_runs = run_trial(spec, value, trial, kvu_choice);
    if (g_interrupted && trial_runs.size() != args_.arms.size()) break;  // only whole trials
    compare_with_reference(trial_runs);
    for (ArmRun& r : trial_runs) points_.back().runs.push_back(std::move(r));
    write_outputs(args_, params_, env_, points_);  // after every trial: Ctrl-C loses nothing
  }
}

std::vector<ArmRun> Bench::run_trial(PipelineSpec& spec, const std::string& value, int trial,
                                     int& kvu_choice) {
  std::vector<std::string> order = args_.arms;
  if (trial % 2 == 0) std::reverse(order.begin(), order.end());  // drift must not favour one arm
  std::vector<ArmRun> trial_runs;
  for (size_t k = 0; k < order.size() && !g_interrupted; ++k) {
    ArmRun run = run_arm(order[k], spec,
                         fmt::format("{}t{}", value.empty() ? "" : value + "-", trial), kvu_choice);
    run.trial = trial;
    run.order = static_cast<int>(k);
    log_arm(value, trial, run);
    trial_runs.push_back(std::move(run));
  }
  return trial_runs;
}

ArmRun Bench::run_arm(const std::string& arm, PipelineSpec& spec, const std::string& tag,
                      int& kvu_choice) {
  if (is_server_arm(arm))
    return run_server_arm(arm, spec, *model_, model_path_, args_, tag, kvu_choice);
  ArmRun run;
  spec.fork = parse_fork_mode(arm);
  run.arm = arm;
  run.peak_rss_per_arm = reset_peak_rss();
  run.result = run_pipeline(spec, model_);
  run.peak_rss_kib = peak_rss_kib();
  if (run.result.document_prefills == 1)
    run.branch_phase_ms = run.result.total_ms - run.result.prefill_ms;
  return run;
}

void Bench::log_arm(const std::string& value, int trial, const ArmRun& run) const {
  std::cerr << fmt::format(
      "[bench] {}{}trial {}/{} arm {:<8} end-to-end {:>9.1f} ms, branch-2 activation "
      "{:>9.1f} ms{}\n",
      sweep_.key.empty() ? "" : sweep_.key + "=" + value, sweep_.key.empty() ? "" : " ", trial,
      args_.trials, run.arm, run.result.total_ms, branch2_activation(run.result),
      run.result.ok() ? "" : " (FAILED)");
}

int Bench::finish() {
  write_outputs(args_, params_, env_, points_);
  std::signal(SIGINT, SIG_DFL);
  if (g_interrupted) {
    std::cerr << "[bench] interrupted: the finished trials are in " << args_.out << "\n";
    return kExitInterrupted;
  }
  bool ok = true;
  for (const Point& p : points_) {
    for (const ArmRun& r : p.runs) ok = ok && r.result.ok();
  }
  std::cerr << "[bench] results in " << args_.out << " (best_run.json, all_trials.csv)\n";
  return ok ? 0 : 1;
}

}  // namespace

int run_bench(const BenchArgs& args) {
  return Bench(args).run();
}

}  // namespace swarmkv::cli
