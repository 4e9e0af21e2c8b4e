// swarmkv: the command-line front end of the SwarmKV library.
#include "cli.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "engine_flags.h"
#include "progress.h"
#include "report_cmd.h"
#include "serve_cmd.h"
#include "snapshot_cmd.h"
#include "swarmkv/chat.h"
#include "swarmkv/cluster.h"
#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"
#include "terminal_text.h"
#include "worker_cmd.h"

namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool raw = false;
  int32_t max_tokens = 128;
  swarmkv::SamplingOptions sampling;
  std::vector<std::string> stop;
  swarmkv::ContextOptions context;
  bool json = false;
};

void require_stop_strings(const std::vector<std::string>& stop) {
  for (const std::string& s : stop) {
    if (s.empty()) {
      throw swarmkv::Error(swarmkv::ErrorCode::kInvalidArgument,
                           "--stop is empty; it would end every answer before its first token");
    }
  }
}

int run_generate(const GenerateArgs& args) {
  // Everything that needs no model is checked before it loads.
  swarmkv::validate_sampling(args.sampling);
  swarmkv::validate_context_options(args.context);
  require_stop_strings(args.stop);
  const swarmkv::Stopwatch run;
  std::string prompt = args.prompt_file.empty()
                           ? args.prompt
                           : swarmkv::read_file(args.prompt_file, "--prompt-file");
  if (prompt.empty()) {
    throw swarmkv::Error(swarmkv::ErrorCode::kInvalidArgument,
                         "the prompt is empty (use --prompt or --prompt-file)");
  }
  swarmkv::require_text(prompt, args.prompt_file.empty()
                                    ? std::string("--prompt")
                                    : fmt::format("--prompt-file '{}'", args.prompt_file));
  swarmkv::require_text(args.system, "--system");
  const std::string model_path = swarmkv::resolve_model_path(args.model);

  auto model = swarmkv::Model::load(model_path);
  const double load_ms = run.ms();

  // --raw: the text as typed, control-token texts included; otherwise the
  // template's markers are the only control tokens and the messages plain text.
  std::vector<swarmkv::Token> tokens;
  if (args.raw) {
    tokens = model->tokenize(prompt, /*add_special=*/true);
  } else {
    std::vector<swarmkv::ChatMessage> messages;
    if (!args.system.empty()) messages.push_back({"system", args.system});
    messages.push_back({"user", prompt});
    tokens = swarmkv::chat_tokens(*model, messages);
  }
  const uint64_t required = tokens.size() + static_cast<uint64_t>(args.max_tokens);
  if (required > args.context.n_ctx) {
    throw swarmkv::Error(
        swarmkv::ErrorCode::kBudget,
        fmt::format("prompt_tokens {} + max_tokens {} = {} > n_ctx {}; raise --n-ctx or shorten "
                    "the prompt",
                    tokens.size(), args.max_tokens, required, args.context.n_ctx));
  }
  if (const int32_t train = model->n_ctx_train();
      train > 0 && required > static_cast<uint64_t>(train)) {
    throw swarmkv::Error(
        swarmkv::ErrorCode::kBudget,
        fmt::format("prompt_tokens {} + max_tokens {} = {} > n_ctx_train {}, the context the "
                    "model was trained on; shorten the prompt or lower --max-tokens",
                    tokens.size(), args.max_tokens, required, train));
  }
  const swarmkv::ContextMemory need = swarmkv::estimate_context_memory(*model, args.context);
  if (const swarmkv::AvailableMemory have = swarmkv::available_memory();
      swarmkv::with_headroom(need.total()) > have.bytes) {
    throw swarmkv::Error(
        swarmkv::ErrorCode::kBudget,
        fmt::format("not enough memory: n_ctx {} needs about {:.2f} GiB (KV {:.2f} GiB + "
                    "attention scratch {:.2f} GiB; with headroom {:.2f} GiB) but {:.2f} GiB is "
                    "available ({}); lower --n-ctx",
                    args.context.n_ctx, need.total() / 1073741824.0, need.kv_bytes / 1073741824.0,
                    need.compute_bytes / 1073741824.0,
                    swarmkv::with_headroom(need.total()) / 1073741824.0, have.bytes / 1073741824.0,
                    have.limit));
  }

  swarmkv::Context ctx(model, args.context);
  const swarmkv::Stopwatch prompt_time;
  ctx.decode_prompt(tokens, 0, 0, /*logits_last=*/true);
  const double prompt_ms = prompt_time.ms();

  swarmkv::Sampler sampler(*model, args.sampling);
  const swarmkv::Stopwatch gen_time;
  swarmkv::GenerateOptions gen;
  gen.max_tokens = args.max_tokens;
  gen.stop = args.stop;
  const swarmkv::Generation answer =
      swarmkv::generate(ctx, sampler, 0, static_cast<swarmkv::Pos>(tokens.size()), gen);
  const double gen_ms = gen_time.ms();
  const double total_ms = run.ms();

  if (args.json) {
    nlohmann::json out = {
        {"model", model_path},
        {"prompt_tokens", tokens.size()},
        {"n_tokens", answer.tokens.size()},
        {"answer", answer.text},
        {"stop_reason", std::string(swarmkv::to_string(answer.stop_reason))},
        {"timings_ms",
         {{"load", load_ms}, {"prompt", prompt_ms}, {"generate", gen_ms}, {"total", total_ms}}},
        {"n_ctx", ctx.options().n_ctx},
        {"n_threads", ctx.options().n_threads},
    };
    std::cout << swarmkv::dump_json(out) << "\n";
  } else {
    std::cout << swarmkv::cli::TerminalText(stdout)(answer.text) << "\n";
    std::cerr << fmt::format(
        "\n[swarmkv] model {} | prompt {} tok in {:.1f} ms ({:.1f} tok/s) | answer {} tok in "
        "{:.1f} ms "
        "({:.1f} tok/s) | stop: {} | total {:.1f} ms\n",
        model_path, tokens.size(), prompt_ms,
        1000.0 * static_cast<double>(tokens.size()) / prompt_ms, answer.tokens.size(), gen_ms,
        gen_ms > 0 ? 1000.0 * static_cast<double>(answer.tokens.size()) / gen_ms : 0.0,
        swarmkv::to_string(answer.stop_reason), total_ms);
  }
  return 0;
}

struct RunArgs {
  std::string pipeline;
  std::string model;
  std::string fork;
  std::string guard = "serialized";
  uint32_t n_ctx = 0;
  std::optional<int32_t> threads;
  swarmkv::cli::EngineFlags engine;
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
};

void print_text(const swarmkv::PipelineSpec& spec, const swarmkv::PipelineResult& r,
                const std::string& model_path, double load_ms) {
  const swarmkv::cli::TerminalText shown(stdout);
  std::cout << fmt::format("pipeline {} | model {} | fork {}{}", shown(spec.name),
                           shown(model_path), swarmkv::to_string(r.fork),
                           r.exact                       ? " (exact)"
                           : r.exact_unavailable.empty() ? " (not exact: --no-exact)"
                                                         : " (not exact: unavailable)");
  if (r.guard) std::cout << fmt::format(" | guard {}", swarmkv::to_string(*r.guard));
  std::cout << fmt::format(" | document {} tokens", r.prefix_tokens);
  std::cout << fmt::format(" | flash_attn {} kv {} n_ubatch {}", r.engine.flash_attn ? "on" : "off",
                           swarmkv::to_string(r.engine.type_k), r.engine.n_ubatch);
  if (r.snapshot_bytes > 0)
    std::cout << fmt::format(" | snapshot {:.1f} MiB", r.snapshot_bytes / 1048576.0);
  if (r.n_seq_max > 1) std::cout << fmt::format(" | one context, {} sequences", r.n_seq_max);
  std::cout << "\n";
  if (r.snapshot) {
    const swarmkv::SnapshotUse& s = *r.snapshot;
    std::cout << fmt::format("prefix state: {} tokens from {}{}, {} prefilled", s.reused_tokens,
                             swarmkv::to_string(s.source),
                             s.path.empty() || s.source == swarmkv::SnapshotSource::kPrefill
                                 ? std::string()
                                 : " (" + shown(s.path) + ")",
                             s.prefilled_tokens);
    if (s.reused_tokens > 0) std::cout << fmt::format(", loaded in {:.1f} ms", s.load_ms);
    if (s.published) std::cout << ", published to the snapshot store";
    for (const swarmkv::ErrorValue& e : s.discarded)
      std::cout << "\n  skipped a damaged store entry: " << shown(e.to_string());
    std::cout << "\n";
  }
  if (r.document_status != swarmkv::NodeStatus::kOk)
    std::cout << "document: FAILED: " << shown(r.document_error->to_string()) << "\n";
  for (const auto& a : r.agents) {
    std::cout << "\n== " << shown(a.name) << " (" << swarmkv::to_string(a.status)
              << (a.worker.empty() ? std::string() : ", worker " + shown(a.worker)) << ") ==\n";
    std::cout << shown(a.error ? a.error->to_string() : a.answer) << "\n";
  }
  std::cout << fmt::format("\n{:<16} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
                           "agent (ms)", "tokens", "prefill", "fork", "restore", "prompt",
                           "1st tok", "generate", "total");
  for (const auto& a : r.agents) {
    const auto& t = a.timings_ms;
    std::cout << fmt::format(
        "{:<16} {:>7} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f}\n",
        shown(a.name.substr(0, 16)), a.tokens.size(), t.prefill, t.fork, t.restore, t.prompt,
        t.first_token, t.generate, t.total);
  }
  std::string prefill_note;
  if (r.document_prefills > 1)
    prefill_note = fmt::format(" (sum of {} per-agent re-prefills)", r.document_prefills);
  if (r.snapshot_bytes > 0) prefill_note += fmt::format(" | export {:.1f} ms", r.export_ms);
  if (!r.decode_steps.empty())
    prefill_note += fmt::format(" | {} batched decode steps", r.decode_steps.size());
  std::cout << fmt::format(
      "load {:.0f} ms | prefill {:.1f} ms{} | total {:.1f} ms (model load excluded)\n", load_ms,
      r.prefill_ms, prefill_note, r.total_ms);
  if (const swarmkv::LatencySummary l = swarmkv::latency_summary(r); l.agents > 1) {
    const auto p = [](const swarmkv::Percentiles& x) {
      return fmt::format("{:.0f}/{:.0f}/{:.0f}", x.p50, x.p95, x.p99);
    };
    std::cout << fmt::format(
        "latency p50/p95/p99 ms over {} agents: queue {} | first token {} | inter-token {} | "
        "done {} (from the run's start)\n",
        l.agents, p(l.queue), p(l.ttft), p(l.inter_token), p(l.completion));
  }
  if (r.transfer) {
    std::cout << fmt::format(
        "transfer: snapshot {:.1f} MiB | publish {:.1f} ms | fetch {:.1f} ms (slowest of {} "
        "worker(s) that fetched it)\n",
        r.transfer->bytes / 1048576.0, r.transfer->publish_ms, r.transfer->fetch_ms,
        r.transfer->fetches);
  }
  if (!r.agents.empty() && !r.agents.front().worker.empty()) return;  // the KV is the workers'
  std::cout << fmt::format(
      "KV: {} context(s) x n_ctx {} | peak {} cells = {:.1f} MiB in use of {:.1f} MiB "
      "allocated{}\n",
      r.contexts, r.n_ctx, r.kv_cells_peak, r.kv_bytes_peak() / 1048576.0,
      r.kv_bytes_allocated() / 1048576.0,
      r.host_buffer_bytes > 0
          ? fmt::format(" | host buffers {:.1f} MiB", r.host_buffer_bytes / 1048576.0)
          : std::string());
}

int run_pipeline_cmd(const RunArgs& args) {
  swarmkv::PipelineSpec spec = swarmkv::load_pipeline_file(args.pipeline);
  if (!args.model.empty()) spec.model = args.model;
  if (!args.fork.empty()) spec.fork = swarmkv::parse_fork_mode(args.fork);
  if (args.n_ctx > 0) spec.n_ctx = args.n_ctx;
  if (args.threads) spec.n_threads = *args.threads;
  args.engine.apply(spec);
  swarmkv::validate_pipeline(spec);  // the command line's values too, before the model loads
  if (!args.html.empty()) swarmkv::cli::check_page_path(args.html);
  if (args.check) {
    std::cout << fmt::format("{}: pipeline '{}' is valid: {} agents, fork {}, document {} bytes\n",
                             args.pipeline, spec.name, spec.agents.size(),
                             swarmkv::to_string(spec.fork), spec.document.size());
    return 0;
  }
  swarmkv::RunOptions options;
  options.guard = swarmkv::parse_guard_policy(args.guard);
  options.snapshot.cache = swarmkv::parse_snapshot_cache_mode(args.snapshot_cache);
  options.snapshot.cache_dir = args.cache_dir;
  options.snapshot.file = args.snapshot_file;
  if (!args.snapshot_file.empty() && !swarmkv::fork_traits(spec.fork).prefix_state) {
    throw swarmkv::Error(swarmkv::ErrorCode::kInvalidArgument,
                         "--snapshot restores the document's state, and --fork none re-prefills it "
                         "in every agent by definition; use --fork shared or host");
  }
  options.on_prefill_progress = swarmkv::cli::prefill_progress();
  swarmkv::cluster::ClusterKey cluster_key;  // a bad URL or key before the model loads
  if (args.redis) {
    swarmkv::redis::resolve_url(*args.redis);
    cluster_key = swarmkv::cluster::ClusterKey::resolve(args.cluster_key_file);
  } else if (!args.cluster_key_file.empty()) {
    throw swarmkv::Error(swarmkv::ErrorCode::kInvalidArgument,
                         "--cluster-key-file signs a run on the cluster: it needs --redis");
  }
  const std::string model_path = swarmkv::resolve_model_path(spec.model);
  const swarmkv::Stopwatch load;
  swarmkv::ModelOptions model_options = spec.model_options();
  // A coordinator tokenises and keys the document; its workers prefill and decode.
  model_options.metadata_only = args.redis.has_value();
  auto model = swarmkv::Model::load(model_path, model_options);
  const double load_ms = load.ms();
  swarmkv::PipelineResult result;
  if (args.redis) {
    swarmkv::cluster::CoordinatorOptions coordinator;
    coordinator.timeout_s = args.timeout_s;
    coordinator.agents_per_job = args.agents_per_job;
    coordinator.run = options;
    coordinator.bus.cluster_key = cluster_key;
    result = swarmkv::cluster::run_distributed(
        spec, model, swarmkv::redis::resolve_url(*args.redis), coordinator);
  } else {
    result = swarmkv::run_pipeline(spec, model, options);
  }
  nlohmann::json out = swarmkv::result_json(result);
  out["load_ms"] = load_ms;
  if (args.json) {
    std::cout << swarmkv::dump_json(out) << "\n";
  } else {
    print_text(spec, result, model_path, load_ms);
  }
  if (!args.html.empty()) swarmkv::cli::write_run_page(args.html, out, "");
  if (!result.ok()) {
    const swarmkv::cli::TerminalText shown(stderr);
    if (result.document_status != swarmkv::NodeStatus::kOk) {
      std::cerr << "swarmkv: error: document: " << shown(result.document_error->to_string())
                << "\n";
    }
    for (const auto& a : result.agents) {
      if (a.status != swarmkv::NodeStatus::kOk)
        std::cerr << "swarmkv: error: agent " << shown(a.name) << ": "
                  << shown(a.error->to_string()) << "\n";
    }
    return swarmkv::cli::kExitFailed;
  }
  return 0;
}

int run_info(const std::string& model_arg) {
  const std::string model_path = swarmkv::resolve_model_path(model_arg);
  auto model = swarmkv::Model::load(model_path);
  nlohmann::json out = {
      {"model", model_path},
      {"description", model->description()},
      {"n_vocab", model->n_vocab()},
      {"n_layer", model->n_layer()},
      {"n_ctx_train", model->n_ctx_train()},
      {"size_bytes", model->size_bytes()},
      {"chat_template", model->has_chat_template()},
      {"engine", swarmkv::engine_build_info()},
      {"cache_dir", swarmkv::cache_dir()},
  };
  const std::vector<swarmkv::WeightType> weights = swarmkv::weight_types(*model);
  nlohmann::json types = nlohmann::json::array();
  for (const swarmkv::WeightType& w : weights) {
    types.push_back({{"type", w.type},
                     {"tensors", w.tensors},
                     {"bytes", w.bytes},
                     {"fast_prefill", w.fast_prefill}});
  }
  const std::string hint = swarmkv::slow_weights_hint(weights);
  out["weights"] = {{"types", types},
                    {"hint", hint.empty() ? nlohmann::json(nullptr) : nlohmann::json(hint)}};
  std::cout << swarmkv::dump_json(out) << "\n";
  if (!hint.empty()) std::cerr << "hint: " << hint << "\n";
  return 0;
}

}  // namespace

namespace swarmkv::cli {

int exit_code(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kGraph:
    case ErrorCode::kBudget:
    case ErrorCode::kChatTemplate:
    case ErrorCode::kIncompatible:
    case ErrorCode::kModelLoad:
      return kExitUsage;
    case ErrorCode::kAborted:
      return kExitInterrupted;
    default:
      return kExitFailed;
  }
}

int run(int argc, char** argv) {
  CLI::App app{
      "SwarmKV: prefill a shared document once on llama.cpp, snapshot its KV state and fork every "
      "agent from it.\n\nModel: --model PATH, else $SWARMKV_MODEL, else the default "
      "SmolLM2-135M-Instruct in the cache ($SWARMKV_CACHE, default ~/.cache/swarmkv; fetch it "
      "with scripts/fetch-model.sh).\nLogging: --log-level or $SWARMKV_LOG_LEVEL "
      "(debug|info|warn|error|off), always on stderr.\nExit status: 0 success; 1 the run failed "
      "(an agent, the engine, writing the output); 2 refused before any work (bad arguments, "
      "input files, budget or memory); 130 interrupted.",
      "swarmkv"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] {
    const swarmkv::BuildInfo b = swarmkv::build_info();
    std::string backends;
    for (const std::string& name : b.backends) backends += (backends.empty() ? "" : ", ") + name;
    return fmt::format("swarmkv {}\nllama.cpp {} (our patches {})\nbackends: {}", b.version,
                       b.llama_commit, b.llama_patches, backends);
  });
  std::string log_level = "";
  app.add_option("--log-level", log_level, "debug, info, warn (default), error or off");

  GenerateArgs gen;
  CLI::App* generate = app.add_subcommand(
      "generate",
      "Generate one answer to one prompt (chat template applied; a model without one gets "
      "\"prompt\\nAnswer:\") and print it with its timings");
  generate->add_option("-m,--model", gen.model, "GGUF model file (default: see above)");
  auto* prompt_opt = generate->add_option("-p,--prompt", gen.prompt, "the user message");
  generate->add_option("-f,--prompt-file", gen.prompt_file, "read the user message from a file")
      ->excludes(prompt_opt)
      ->check(CLI::ExistingFile);
  generate->add_option("--system", gen.system, "a system message placed before the prompt");
  generate->add_flag("--raw", gen.raw, "send the prompt as is, without the model's chat template");
  generate->add_option("-n,--max-tokens", gen.max_tokens, "most tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  generate->add_option("--temp", gen.sampling.temperature, "sampling temperature; 0 = greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 100.0f));
  generate->add_option("--top-p", gen.sampling.top_p, "nucleus sampling mass (1 = off)")
      ->capture_default_str();
  generate->add_option("--top-k", gen.sampling.top_k, "keep the k most likely tokens (0 = off)")
      ->capture_default_str();
  generate->add_option("--seed", gen.sampling.seed, "RNG seed for sampled generation")
      ->capture_default_str();
  generate
      ->add_option("--repeat-penalty", gen.sampling.repeat_penalty,
                   "divide the logit of a token generated within the last --repeat-last-n by this "
                   "(1 = off; the prompt is not counted)")
      ->capture_default_str();
  generate
      ->add_option("--repeat-last-n", gen.sampling.repeat_last_n,
                   "generated tokens the penalties look back over (0 = off)")
      ->capture_default_str();
  generate
      ->add_option("--frequency-penalty", gen.sampling.frequency_penalty,
                   "subtract this x a token's count so far (0 = off)")
      ->capture_default_str();
  generate
      ->add_option("--presence-penalty", gen.sampling.presence_penalty,
                   "subtract this once a token occurred (0 = off)")
      ->capture_default_str();
  generate
      ->add_option("--dry-multiplier", gen.sampling.dry_multiplier,
                   "DRY: penalise a token that extends a repeated sequence (0 = off)")
      ->capture_default_str();
  generate->add_option("--dry-base", gen.sampling.dry_base, "DRY: growth of the penalty")
      ->capture_default_str();
  generate
      ->add_option("--dry-allowed-length", gen.sampling.dry_allowed_length,
                   "DRY: repeats up to this many tokens go free")
      ->capture_default_str();
  generate
      ->add_option("--dry-penalty-last-n", gen.sampling.dry_penalty_last_n,
                   "DRY: generated tokens it looks back over")
      ->capture_default_str();
  generate->add_option("--stop", gen.stop,
                       "stop when the answer ends with this string (repeatable)");
  generate->add_option("-c,--n-ctx", gen.context.n_ctx, "context size in tokens")
      ->capture_default_str()
      ->check(CLI::Range(16u, 1u << 22));
  generate->add_option("-b,--n-batch", gen.context.n_batch, "most tokens per decode call")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  generate->add_option("-t,--threads", gen.context.n_threads, "CPU threads (0 = all cores)")
      ->capture_default_str();
  generate->add_flag("--json", gen.json, "print one JSON object instead of text");

  RunArgs run_args;
  CLI::App* run = app.add_subcommand(
      "run",
      "Run a pipeline file: prefill the document once, fork every agent from its KV state, "
      "print each answer, a timing table and the KV memory used.\n"
      "Pipeline file (YAML or JSON): name, model, n_ctx, n_batch, n_ubatch, threads, "
      "threads_batch, flash_attn, kv_type, fork, exact, n_gpu_layers, max_live, system, document "
      "(file: PATH relative to the pipeline file, or text: ...), defaults and agents (name, "
      "prompt, max_tokens, "
      "temperature, top_p, top_k, seed, repeat_penalty, repeat_last_n, frequency_penalty, "
      "presence_penalty, dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n, stop, "
      "depends_on, priority, fork_from, needs). See examples/pipelines/ and docs/pipelines.md.\n"
      "Exit status: 0 when every agent succeeded, 1 otherwise (the causes go to stderr), 2 when "
      "the file or the options are refused before the run.");
  run->add_option("pipeline", run_args.pipeline, "pipeline file (.yaml or .json)")->required();
  run->add_option("-m,--model", run_args.model, "GGUF model; overrides the file's 'model'");
  run->add_option(
         "--fork", run_args.fork,
         "overrides the file's 'fork' (default shared):\n"
         "shared: one context with a unified KV cache; each agent is a sequence forked by\n"
         "        seq_cp (no bytes copied); all agents decoded together, one llama_decode per "
         "step;\n"
         "        answers equal --fork none's token for token (exact mode, the default;\n"
         "        --no-exact: up to the first near-tie, docs/exact-mode.md)\n"
         "host: prefill once, copy + restore a host snapshot into each agent's context;\n"
         "        answers bit-identical to --fork none's\n"
         "none: the reference, every agent re-prefills the whole document in its own context")
      ->check(CLI::IsMember({"shared", "host", "none"}));
  run->add_option("--guard", run_args.guard,
                  "host/none only (shared drives its one context from one thread).\n"
                  "serialized: one worker runs the agents one after another;\n"
                  "concurrent: up to one worker per hardware thread, each agent in its own context")
      ->check(CLI::IsMember({"serialized", "concurrent"}))
      ->capture_default_str();
  run->add_option("-c,--n-ctx", run_args.n_ctx,
                  "KV cells per context, overrides the file's n_ctx (default: the smallest "
                  "multiple of 256 that fits; shared: one context holds the document and every "
                  "agent's prompt + max_tokens; host/none: the document + the longest agent)");
  run->add_option("-t,--threads", run_args.threads,
                  "CPU threads per context (0 = all cores, at most the hardware threads); "
                  "overrides the file");
  run_args.engine.add_to(run);
  run->add_flag("--check", run_args.check,
                "check the pipeline file and the options, load no model, run nothing");
  run->add_option("--snapshot-cache", run_args.snapshot_cache,
                  "the snapshot store (shared/host; none never uses it):\n"
                  "on: restore the longest stored prefix of this document (same model, engine, "
                  "n_batch), prefill only the rest, publish the result;\n"
                  "read-only: restore, never write;  off: always prefill.\n"
                  "A damaged entry is a warning: skipped (removed when on) and prefilled instead")
      ->check(CLI::IsMember({"on", "off", "read-only"}))
      ->capture_default_str();
  run->add_option("--snapshot", run_args.snapshot_file,
                  "restore the document's state from this snapshot file (swarmkv prefill --out); "
                  "a wrong model, engine, layout or document, or a damaged file, is an error")
      ->check(CLI::ExistingFile);
  run->add_option("--cache-dir", run_args.cache_dir, "snapshot store (default <cache>/snapshots)");
  run->add_option("--redis", run_args.redis,
                  "coordinate: run the agents on `swarmkv worker`s through Redis "
                  "(redis://[user:password@]host:port[/db], or rediss://... with "
                  "?cacert=FILE[&cert=FILE&key=FILE] for TLS; given without a URL, after the "
                  "pipeline file: $SWARMKV_REDIS). The snapshot is taken from Redis, the local "
                  "store or a prefill, and published; output as a local run's plus each "
                  "agent's worker and the transfer figures")
      ->expected(0, 1)
      ->default_str("");
  run->add_option("--cluster-key-file", run_args.cluster_key_file,
                  "--redis: the cluster's shared secret (at least 16 bytes; default: the value of "
                  "$SWARMKV_CLUSTER_KEY). The run signs its jobs, pipeline and snapshot "
                  "(HMAC-SHA256) and takes only workers, results and snapshots signed with it; "
                  "without one the cluster is unauthenticated (docs/cluster.md)");
  run->add_option("--timeout", run_args.timeout_s,
                  "--redis: seconds the whole run may take before it fails naming the agents "
                  "still unanswered")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 7.0 * 86400));
  run->add_option("--agents-per-job", run_args.agents_per_job,
                  "--redis: agents per job, in pipeline order (0 = one job per live worker, "
                  "of about equal cost: prompt tokens + max_tokens)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
  run->add_option("--html", run_args.html,
                  "also write the run's page to this file: the agents' graph, a timeline and "
                  "every prompt and answer, self-contained (see `swarmkv report --help`)");
  run->add_flag(
      "--json", run_args.json,
      "print one JSON object (schema_version 2, docs/result-schema.md): fork, ok, "
      "prefill_ms, prefill_done_at_ms, total_ms, latency {queue_ms, ttft_ms, inter_token_ms, "
      "completion_ms: {p50, p95, p99}}, memory, document {status, error} and per agent name, "
      "status, error {code, message} or null, answer, n_tokens, stop_reason, "
      "prompt_rendered, timings_ms {wait, fork, restore, prompt, first_token, generate, total, "
      "...}, started_at_ms, first_token_at_ms, done_at_ms (from the run's start, model load "
      "excluded); snapshot {source, key, reused_tokens, prefilled_tokens, "
      "bytes, load_ms, verify_ms, ...} or null under --fork none; under --redis each agent's "
      "worker and transfer {bytes, publish_ms, fetch_ms, fetches}");

  swarmkv::cli::BenchArgs bench_args;
  CLI::App* bench =
      app.add_subcommand("bench",
                         "Benchmark the reference arm none (every branch re-prefills the "
                         "document in its own context) against SwarmKV's forks "
                         "(host: prefill once, copy + restore a host snapshot per branch; "
                         "shared: one unified-KV context, seq_cp fork, batched decode), "
                         "all arms in one run, alternating their order "
                         "between trials. Writes best_run.json and all_trials.csv to "
                         "--out; bench/plot_bench.py OUT then draws the plots and "
                         "writes report.md. Ctrl-C keeps the trials finished so far.");
  bench->add_option("-m,--model", bench_args.model, "GGUF model (default: see above)");
  auto* doc_opt =
      bench->add_option("--doc", bench_args.doc_file, "document file (default: synthetic)")
          ->check(CLI::ExistingFile);
  bench
      ->add_option("--doc-tokens", bench_args.doc_tokens,
                   "synthetic document: 'The quick brown fox jumps over the lazy dog.' cut to "
                   "exactly N tokens")
      ->excludes(doc_opt)
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  bench->add_option("--branches", bench_args.branches, "branches (agents)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  bench
      ->add_option("--branch-tokens", bench_args.branch_tokens,
                   "tokens of each branch's own question")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  bench->add_option("--n-predict", bench_args.n_predict, "greedy tokens generated per branch")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  bench->add_option("--n-ctx", bench_args.n_ctx,
                    "KV cells per context, every arm (default: per arm, the smallest multiple of "
                    "256 that fits its layout)");
  bench->add_option("-t,--threads", bench_args.threads, "CPU threads per context (0 = all cores)")
      ->capture_default_str();
  bench
      ->add_option("--max-live", bench_args.max_live,
                   "the shared arm's branches decoded at once, at most (pipeline key max_live; 0 "
                   "= all that fit)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
  bench_args.engine.add_to(bench);
  bench->add_option("--trials", bench_args.trials, "trials")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  bench->add_option("--pause-ms", bench_args.pause_ms, "idle pause between trials")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600000));
  bench
      ->add_option(
          "--arms", bench_args.arms,
          "arms: none,host,shared,server-concurrent,server-sequential; none, the reference the "
          "others' answers and speed-ups are compared with, first (without it nothing is "
          "compared) (server-*: llama-server from the same llama.cpp, same tokens, greedy, over "
          "HTTP)")
      ->delimiter(',')
      ->capture_default_str();
  bench->add_option("--sweep", bench_args.sweep,
                    "branches=1,2,4,8,16 or doc-tokens=512,1024,2048,3501,7000");
  bench->add_option("-o,--out", bench_args.out, "output directory")->capture_default_str();
  bench->add_option("--server-bin", bench_args.server_bin,
                    "llama-server for the server-* arms (default: $SWARMKV_LLAMA_SERVER, else the "
                    "one installed with the llama.cpp SwarmKV was built against, else PATH)");
  bench
      ->add_option("--server-kvu", bench_args.server_kvu,
                   "server-concurrent's KV layout: on (-kvu), off (-no-kvu), or both: measure "
                   "both on the first trial of each point and keep the faster")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();

  swarmkv::cli::SnapshotCommands snapshot_commands(app);
  swarmkv::cli::WorkerCommand worker_command(app);
  swarmkv::cli::ServeCommand serve_command(app);
  swarmkv::cli::ReportCommand report_command(app);

  std::string info_model;
  CLI::App* info =
      app.add_subcommand("info", "Print the model's metadata and the llama.cpp build as JSON");
  info->add_option("-m,--model", info_model, "GGUF model file (default: see above)");

  bool json = false;  // the chosen subcommand's --json: errors are JSON on stdout too
  const auto fail = [&](const swarmkv::ErrorValue& e, int status) {
    std::cerr << "swarmkv: error: " << swarmkv::cli::TerminalText(stderr)(e.to_string()) << "\n";
    if (json) {
      const nlohmann::json out = {
          {"ok", false},
          {"error", {{"code", std::string(swarmkv::to_string(e.code))}, {"message", e.message}}}};
      std::cout << swarmkv::dump_json(out) << "\n" << std::flush;
    }
    return status;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    if (app.get_subcommands().empty() && !app.remaining().empty()) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({}))
        names += (names.empty() ? "" : ", ") + sub->get_name();
      std::cerr << fmt::format(
          "swarmkv: error: unknown command '{}' (commands: {}); see "
          "swarmkv --help\n",
          app.remaining().front(), names);
      return kExitUsage;
    }
    app.exit(e);
    return kExitUsage;
  }
  json = (*generate && gen.json) || (*run && run_args.json) || snapshot_commands.json();

  int status = kExitOk;
  try {
    if (log_level.empty()) {
      if (const char* env = std::getenv("SWARMKV_LOG_LEVEL"); env != nullptr && *env != '\0') {
        try {
          swarmkv::parse_log_level(env);
        } catch (const swarmkv::Error& e) {
          throw swarmkv::Error(e.code(), "$SWARMKV_LOG_LEVEL: " + e.message());
        }
      }
    } else {
      swarmkv::set_log_level(swarmkv::parse_log_level(log_level));
    }
    // A worker's log is its account of what it claims and refuses.
    if (worker_command.chosen() && log_level.empty() && std::getenv("SWARMKV_LOG_LEVEL") == nullptr)
      swarmkv::set_log_level(swarmkv::LogLevel::kInfo);
    gen.context.n_ubatch = gen.context.n_batch;
    if (*generate) {
      status = run_generate(gen);
    } else if (*info) {
      status = run_info(info_model);
    } else if (*run) {
      status = run_pipeline_cmd(run_args);
    } else if (*bench) {
      status = swarmkv::cli::run_bench(bench_args);
    } else if (worker_command.chosen()) {
      status = worker_command.run();
    } else if (serve_command.chosen()) {
      status = serve_command.run();
    } else if (report_command.chosen()) {
      status = report_command.run();
    } else if (const std::optional<int> s = snapshot_commands.run()) {
      status = *s;
    }
  } catch (const swarmkv::Error& e) {
    return fail(e.value(), exit_code(e.code()));
  } catch (const std::exception& e) {
    return fail({swarmkv::ErrorCode::kInternal, e.what()}, kExitFailed);
  }
  // Output that did not reach stdout (closed, a full disk) is a failed run.
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "swarmkv: error: io: writing to stdout failed; the output is lost\n";
    return kExitFailed;
  }
  return status;
}

}  // namespace swarmkv::cli
