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

ServerRun run_server_once(bool concurrent, bool kv_unified, const PipelineSpec& spec,
                          const PreparedPipeline& prepared, const std::string& model_path,
                          const BenchArgs& args, const std::string& log_path) {
  const size_t n = spec.agents.size();
  const PipelineBudget& b = prepared.budget;
  const auto per_slot = static_cast<uint32_t>(
      (b.prefix_tokens + b.max_branch_tokens + b.max_new_tokens + 255) / 256 * 256);
  ServerConfig cfg;
  cfg.binary = args.server_bin;  // resolved once by run_bench
  cfg.model = model_path;
  cfg.engine = spec.context_options();
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
  r.document_prefills = static_cast<int32_t>(n);  // every request prefills the document
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
    // Sent at the start (concurrent) or after the previous answer (sequential).
    a.timings_ms.started_at = std::max(0.0, x.done_at_ms - x.total_ms);
    a.timings_ms.wait = a.timings_ms.started_at;
    a.timings_ms.first_token_at = a.timings_ms.started_at + x.first_token_ms;
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
    if (arm != "none" && arm != "host" && arm != "shared" && !is_server_arm(arm)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("unknown arm '{}' (available: none, host, shared, "
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
  if (args.arms.empty()) throw Error(ErrorCode::kInvalidArgument, "--arms names no arm");
  if (std::find(args.arms.begin() + 1, args.arms.end(), "none") != args.arms.end()) {
    throw Error(ErrorCode::kInvalidArgument,
                "--arms: none, the reference, comes first (speed-ups are relative to it)");
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
  PipelineSpec engine_spec;  // the engine flags alone decide how the model loads
  args.engine.apply(engine_spec);
  auto model = Model::load(model_path, engine_spec.model_options());
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
                 {"max_live", args.max_live},
                 {"engine", nullptr}};
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
    args.engine.apply(spec);
    spec.validate();
    params["engine"] = engine_json(spec.context_options(), model->options().n_gpu_layers,
                                   model->offloaded_layers());
    spec.system_prompt.clear();
    for (int32_t i = 0; i < point.branches; ++i) {
      AgentSpec a;
      a.name = fmt::format("branch{}", i + 1);
      a.prompt = branch_prompt(*model, i, args.branch_tokens);
      a.max_tokens = args.n_predict;
      spec.agents.push_back(a);
    }
    spec.n_ctx = args.n_ctx;  // 0: per arm, the smallest multiple of 256 that fits its layout
    spec.max_live = args.max_live;
    points.push_back(point);
    int kvu_choice = -1;  // server-concurrent's KV layout, decided on the first trial
    for (int trial = 1; trial <= args.trials && !g_interrupted; ++trial) {
      // The pause, in short steps so that Ctrl-C ends it.
      for (const Stopwatch pause; trial > 1 && pause.ms() < args.pause_ms && !g_interrupted;)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (g_interrupted) break;
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
          spec.fork = parse_fork_mode(order[k]);
          run.arm = order[k];
          run.peak_rss_per_arm = reset_peak_rss();
          run.result = run_pipeline(spec, model);
          run.peak_rss_kib = peak_rss_kib();
          if (run.result.document_prefills == 1)
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
        if (r.arm == "none") base = &r;
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
          r.compared = true;
          r.first_difference.push_back(mine == want ? -1 : d);
          if (mine != want) r.answers_match_reference = false;
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
    return kExitInterrupted;
  }
  bool ok = true;
  for (const Point& p : points) {
    for (const ArmRun& r : p.runs) ok = ok && r.result.ok();
  }
  std::cerr << "[bench] results in " << args.out << " (best_run.json, all_trials.csv)\n";
  return ok ? 0 : 1;
}

}  // namespace swarmkv::cli
