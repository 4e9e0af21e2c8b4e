#include "run_cmd.h"

#include <unistd.h>

#include <functional>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "progress.h"
#include "report_cmd.h"
#include "swarmkv/cluster.h"
#include "swarmkv/corpus.h"
#include "swarmkv/error.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"
#include "terminal_text.h"

namespace swarmkv::cli {
namespace {

void print_header(const PipelineSpec& spec, const PipelineResult& r, const std::string& model_path,
                  const TerminalText& shown) {
  std::cout << fmt::format("pipeline {} | model {} | fork {}{}", shown(spec.name),
                           shown(model_path), to_string(r.fork),
                           r.exact                       ? " (exact)"
                           : r.exact_unavailable.empty() ? " (not exact: --no-exact)"
                                                         : " (not exact: unavailable)");
  if (r.guard) std::cout << fmt::format(" | guard {}", to_string(*r.guard));
  std::cout << fmt::format(" | document {} tokens", r.prefix_tokens);
  std::cout << fmt::format(" | flash_attn {} kv {} n_ubatch {}", r.engine.flash_attn ? "on" : "off",
                           to_string(r.engine.type_k), r.engine.n_ubatch);
  if (r.snapshot_bytes > 0)
    std::cout << fmt::format(" | snapshot {:.1f} MiB", r.snapshot_bytes / 1048576.0);
  if (r.n_seq_max > 1) std::cout << fmt::format(" | one context, {} sequences", r.n_seq_max);
  std::cout << "\n";
}

void print_snapshot(const SnapshotUse& s, const TerminalText& shown) {
  std::cout << fmt::format(
      "prefix state: {} tokens from {}{}, {} prefilled", s.reused_tokens, to_string(s.source),
      s.path.empty() || s.source == SnapshotSource::kPrefill ? std::string()
                                                             : " (" + shown(s.path) + ")",
      s.prefilled_tokens);
  if (s.reused_tokens > 0) std::cout << fmt::format(", loaded in {:.1f} ms", s.load_ms);
  if (s.published) std::cout << ", published to the snapshot store";
  for (const ErrorValue& e : s.discarded)
    std::cout << "\n  skipped a damaged store entry: " << shown(e.to_string());
  std::cout << "\n";
}

void print_answers(const PipelineResult& r, const TerminalText& shown) {
  if (r.document_status != NodeStatus::kOk)
    std::cout << "document: FAILED: " << shown(r.document_error->to_string()) << "\n";
  for (const auto& a : r.agents) {
    std::cout << "\n== " << shown(a.name) << " (" << to_string(a.status)
              << (a.worker.empty() ? std::string() : ", worker " + shown(a.worker)) << ") ==\n";
    std::cout << shown(a.error ? a.error->to_string() : a.answer) << "\n";
  }
}

void print_timing_table(const PipelineResult& r, const TerminalText& shown) {
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
}

void print_totals(const PipelineResult& r, double load_ms) {
  std::string prefill_note;
  if (r.document_prefills > 1)
    prefill_note = fmt::format(" (sum of {} per-agent re-prefills)", r.document_prefills);
  if (r.snapshot_bytes > 0) prefill_note += fmt::format(" | export {:.1f} ms", r.export_ms);
  if (!r.decode_steps.empty())
    prefill_note += fmt::format(" | {} batched decode steps", r.decode_steps.size());
  std::cout << fmt::format(
      "load {:.0f} ms | prefill {:.1f} ms{} | total {:.1f} ms (model load excluded)\n", load_ms,
      r.prefill_ms, prefill_note, r.total_ms);
  if (const LatencySummary l = latency_summary(r); l.agents > 1) {
    const auto p = [](const Percentiles& x) {
      return fmt::format("{:.0f}/{:.0f}/{:.0f}", x.p50, x.p95, x.p99);
    };
    std::cout << fmt::format(
        "latency p50/p95/p99 ms over {} agents: queue {} | first token {} | inter-token {} | "
        "done {} (from the run's start)\n",
        l.agents, p(l.queue), p(l.ttft), p(l.inter_token), p(l.completion));
  }
}

void print_memory(const PipelineResult& r) {
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

// The run as text: a header, each answer, a timing table, the totals.
void print_text(const PipelineSpec& spec, const PipelineResult& r, const std::string& model_path,
                double load_ms) {
  const TerminalText shown(stdout);
  print_header(spec, r, model_path, shown);
  if (r.snapshot) print_snapshot(*r.snapshot, shown);
  print_answers(r, shown);
  print_timing_table(r, shown);
  print_totals(r, load_ms);
  print_memory(r);
}

// The causes of a failed run on stderr: the document's, then each agent's.
void report_failures(const PipelineResult& result) {
  const TerminalText shown(stderr);
  if (result.document_status != NodeStatus::kOk) {
    std::cerr << "swarmkv: error: document: " << shown(result.document_error->to_string()) << "\n";
  }
  for (const auto& a : result.agents) {
    if (a.status != NodeStatus::kOk)
      std::cerr << "swarmkv: error: agent " << shown(a.name) << ": " << shown(a.error->to_string())
                << "\n";
  }
}

// The command line's overrides of the file's settings.
void apply_overrides(const RunArgs& args, PipelineSpec& spec) {
  if (!args.model.empty()) spec.model = args.model;
  if (!args.fork.empty()) spec.fork = parse_fork_mode(args.fork);
  if (args.n_ctx > 0) spec.n_ctx = args.n_ctx;
  if (args.threads) spec.n_threads = *args.threads;
  args.engine.apply(spec);
}

// The pipeline of a file with one document (a corpus of one, as
// load_corpus_file read it) with the command line's overrides, validated
// before the model loads.
PipelineSpec pipeline_spec(const RunArgs& args, CorpusSpec corpus) {
  PipelineSpec spec = std::move(corpus.pipeline);
  DocumentRef& document = corpus.documents.front();
  spec.document = std::move(document.text);  // as the file's reader read it: not read twice
  spec.document_source = document.source();
  apply_overrides(args, spec);
  try {
    validate_pipeline(spec);  // the command line's values too, before the model loads
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", args.pipeline, e.message()));
  }
  return spec;
}

// Options that take one document's run: refused for a corpus by name.
void refuse_for_a_corpus(const RunArgs& args) {
  const auto refuse = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} a corpus (documents:, --document or scope: corpus agents)", what));
  };
  if (!args.snapshot_file.empty()) refuse("--snapshot restores one document's state, not");
}

// "corpus: 3/20 documents (1 resumed, 0 failed), 12 agents answered | lease.txt | 41 s,
// about 80 s left"
// redrawn on stderr when it is a terminal; nothing otherwise.
std::function<void(const CorpusProgress&)> corpus_progress() {
  if (::isatty(STDERR_FILENO) != 1) return {};
  return [](const CorpusProgress& p) {
    const size_t run = p.done - p.resumed;
    const size_t left = p.total - p.done;
    const double eta_s =
        run > 0 ? p.elapsed_ms / 1000.0 / static_cast<double>(run) * static_cast<double>(left) : 0;
    const TerminalText shown(stderr);
    std::cerr << fmt::format(
                     "\r\x1b[Kcorpus: {}/{} documents ({} resumed, {} failed), {} agents "
                     "answered | {} | {:.0f} s{}",
                     p.done, p.total, p.resumed, p.failed, p.agents, shown(p.last),
                     p.elapsed_ms / 1000.0,
                     left > 0 && run > 0 ? fmt::format(", about {:.0f} s left", eta_s) : "")
              << (left == 0 ? "\n" : "") << std::flush;
  };
}

void print_corpus_text(const CorpusResult& r, double load_ms) {
  const TerminalText shown(stdout);
  std::cout << fmt::format("corpus {} | model {} | fork {} | {} documents\n", shown(r.pipeline),
                           shown(r.model), to_string(r.fork), r.documents.size());
  for (const DocumentOutcome& d : r.documents) {
    std::cout << fmt::format("\n#### {} ({}{})\n", shown(d.name), d.ok() ? "ok" : "FAILED",
                             d.resumed ? ", resumed" : "");
    if (d.error) std::cout << shown(d.error->to_string()) << "\n";
    if (d.result) print_answers(*d.result, shown);
  }
  if (r.reduce) {
    std::cout << "\n#### over every document\n";
    print_answers(*r.reduce, shown);
  }
  size_t failed = 0;
  for (const DocumentOutcome& d : r.documents) failed += d.ok() ? 0 : 1;
  std::cout << fmt::format(
      "\nload {:.0f} ms | {} documents: {} run, {} resumed, {} failed | total {:.1f} ms (model "
      "load "
      "excluded)\n",
      load_ms, r.documents.size(), r.documents_run, r.documents_resumed, failed, r.total_ms);
}

RunOptions run_options(const RunArgs& args, const PipelineSpec& spec) {
  RunOptions options;
  options.guard = parse_guard_policy(args.guard);
  options.snapshot.cache = parse_snapshot_cache_mode(args.snapshot_cache);
  options.snapshot.cache_dir = args.cache_dir;
  options.snapshot.file = args.snapshot_file;
  if (!args.snapshot_file.empty() && !fork_traits(spec.fork).prefix_state) {
    throw Error(ErrorCode::kInvalidArgument,
                "--snapshot restores the document's state, and --fork none re-prefills it "
                "in every agent by definition; use --fork shared or host");
  }
  options.on_prefill_progress = prefill_progress();
  return options;
}

// --redis's cluster key, resolved (with the URL) before the model loads.
cluster::ClusterKey cluster_key(const RunArgs& args) {
  if (args.redis) {
    redis::resolve_url(*args.redis);
    return cluster::ClusterKey::resolve(args.cluster_key_file);
  }
  if (!args.cluster_key_file.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "--cluster-key-file signs a run on the cluster: it needs --redis");
  }
  return {};
}

}  // namespace

RunCommand::RunCommand(CLI::App& app) {
  sub_ = app.add_subcommand(
      "run",
      "Run a pipeline file: prefill the document once, fork every agent from its KV state, "
      "print each answer, a timing table and the KV memory used.\n"
      "Pipeline file (YAML or JSON): name, model, n_ctx, n_batch, n_ubatch, threads, "
      "threads_batch, flash_attn, kv_type, fork, exact, n_gpu_layers, max_live, system, document "
      "(file: PATH relative to the pipeline file, or text: ...) or documents (a corpus: files, "
      "folders, globs, text items; docs/corpus.md), defaults and agents (name, "
      "prompt, max_tokens, "
      "temperature, top_p, top_k, min_p, seed, repeat_penalty, repeat_last_n, frequency_penalty, "
      "presence_penalty, dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n, "
      "top_logprobs, "
      "logit_bias, stop, json_schema, grammar, tools, tool_choice, depends_on, priority, "
      "fork_from, needs, scope: "
      "document or corpus). See "
      "examples/pipelines/ and docs/pipelines.md.\n"
      "Exit status: 0 when every agent succeeded, 1 otherwise (the causes go to stderr), 2 when "
      "the file or the options are refused before the run.");
  add_run_options();
  add_snapshot_options();
  add_cluster_options();
  add_output_options();
}

void RunCommand::add_run_options() {
  sub_->add_option("pipeline", args_.pipeline, "pipeline file (.yaml or .json)")->required();
  sub_->add_option("-m,--model", args_.model, "GGUF model; overrides the file's 'model'");
  sub_->add_option(
          "--fork", args_.fork,
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
  sub_->add_option(
          "--guard", args_.guard,
          "host/none only (shared drives its one context from one thread).\n"
          "serialized: one worker runs the agents one after another;\n"
          "concurrent: up to one worker per hardware thread, each agent in its own context")
      ->check(CLI::IsMember({"serialized", "concurrent"}))
      ->capture_default_str();
  sub_->add_option("-c,--n-ctx", args_.n_ctx,
                   "KV cells per context, overrides the file's n_ctx (default: the smallest "
                   "multiple of 256 that fits; shared: one context holds the document and every "
                   "agent's prompt + max_tokens; host/none: the document + the longest agent)");
  sub_->add_option("-t,--threads", args_.threads,
                   "CPU threads per context (0 = all cores, at most the hardware threads); "
                   "overrides the file");
  args_.engine.add_to(sub_);
  sub_->add_option("--document", args_.documents,
                   "run the pipeline's agents over these documents instead of the file's "
                   "(a corpus): a file, a folder (its files), a quoted glob, or - for standard "
                   "input; repeatable. Each document is prefilled once and its agents forked "
                   "from it; scope: corpus agents then run once over every document's answers "
                   "({{agent[*]}}, {{agent@NAME}}). docs/corpus.md")
      ->allow_extra_args(false);
  sub_->add_option("--out", args_.out_dir,
                   "a corpus: write each document's result to DIR/documents/ as it finishes "
                   "(atomically); the same command again skips the documents already there "
                   "(same document text, pipeline, model and engine) and runs the rest");
  sub_->add_option("--max-documents-live", args_.max_documents_live,
                   "a corpus: documents run at once (default 1, each with every core; above 1 "
                   "locally, as memory allows: one waits until its contexts fit beside the "
                   "running ones' in what was free at the start; under --redis the live "
                   "workers: each document's prefill and agents go to one)")
      ->check(CLI::Range(1, 1024));
  sub_->add_flag("--check", args_.check,
                 "check the pipeline file and the options, load no model, run nothing");
}

void RunCommand::add_snapshot_options() {
  sub_->add_option("--snapshot-cache", args_.snapshot_cache,
                   "the snapshot store (shared/host; none never uses it):\n"
                   "on: restore the longest stored prefix of this document (same model, engine, "
                   "n_batch), prefill only the rest, publish the result;\n"
                   "read-only: restore, never write;  off: always prefill.\n"
                   "A damaged entry is a warning: skipped (removed when on) and prefilled instead")
      ->check(CLI::IsMember({"on", "off", "read-only"}))
      ->capture_default_str();
  sub_->add_option("--snapshot", args_.snapshot_file,
                   "restore the document's state from this snapshot file (swarmkv prefill --out); "
                   "a wrong model, engine, layout or document, or a damaged file, is an error")
      ->check(CLI::ExistingFile);
  sub_->add_option("--cache-dir", args_.cache_dir, "snapshot store (default <cache>/snapshots)");
}

void RunCommand::add_cluster_options() {
  sub_->add_option("--redis", args_.redis,
                   "coordinate: run the agents on `swarmkv worker`s through Redis "
                   "(redis://[user:password@]host:port[/db], or rediss://... with "
                   "?cacert=FILE[&cert=FILE&key=FILE] for TLS; given without a URL, after the "
                   "pipeline file: $SWARMKV_REDIS). The snapshot is taken from Redis, the local "
                   "store or a prefill, and published; output as a local run's plus each "
                   "agent's worker and the transfer figures")
      ->expected(0, 1)
      ->default_str("");
  sub_->add_option("--cluster-key-file", args_.cluster_key_file,
                   "--redis: the cluster's shared secret (at least 16 bytes; default: the value of "
                   "$SWARMKV_CLUSTER_KEY). The run signs its jobs, pipeline and snapshot "
                   "(HMAC-SHA256) and takes only workers, results and snapshots signed with it; "
                   "without one the cluster is unauthenticated (docs/cluster.md)");
  sub_->add_option("--timeout", args_.timeout_s,
                   "--redis: seconds the whole run may take before it fails naming the agents "
                   "still unanswered")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 7.0 * 86400));
  sub_->add_option("--agents-per-job", args_.agents_per_job,
                   "--redis: agents per job, in pipeline order (0 = one job per live worker, "
                   "of about equal cost: prompt tokens + max_tokens)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
}

void RunCommand::add_output_options() {
  sub_->add_option("--html", args_.html,
                   "also write the run's page to this file: the agents' graph, a timeline and "
                   "every prompt and answer, self-contained (see `swarmkv report --help`); for a "
                   "corpus a table with a row per document and the reduce agents' answers");
  sub_->add_flag(
      "--json", args_.json,
      "print one JSON object (schema_version 2, docs/result-schema.md): fork, ok, "
      "prefill_ms, prefill_done_at_ms, total_ms, latency {queue_ms, ttft_ms, inter_token_ms, "
      "completion_ms: {p50, p95, p99}}, memory, document {status, error} and per agent name, "
      "status, error {code, message} or null, answer, n_tokens, stop_reason, "
      "prompt_rendered, timings_ms {wait, fork, restore, prompt, first_token, generate, total, "
      "...}, started_at_ms, first_token_at_ms, done_at_ms (from the run's start, model load "
      "excluded); snapshot {source, key, reused_tokens, prefilled_tokens, "
      "bytes, load_ms, verify_ms, ...} or null under --fork none; under --redis each agent's "
      "worker and transfer {bytes, publish_ms, fetch_ms, fetches}. A corpus: schema_version 3, "
      "kind corpus, documents_run, documents_resumed, documents_failed, documents [{name, "
      "source, ok, resumed, error, result}], reduce (a result as above)");
}

int RunCommand::run() {
  const RunArgs& args = args_;
  CorpusSpec corpus = load_corpus_file(args.pipeline);
  if (!args.documents.empty()) {
    corpus.documents = documents_from_args(args.documents);
    corpus.listed = true;
  }
  if (corpus.listed || !corpus.reduce.empty()) return run_corpus(std::move(corpus));
  if (!args.out_dir.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "--out keeps the result of each document of a corpus; this pipeline has one "
                "document (list them under documents: or give --document)");
  }
  const PipelineSpec spec = pipeline_spec(args, std::move(corpus));
  if (!args.html.empty()) check_page_path(args.html);
  if (args.check) {
    std::cout << fmt::format("{}: pipeline '{}' is valid: {} agents, fork {}, document {} bytes\n",
                             args.pipeline, spec.name, spec.agents.size(), to_string(spec.fork),
                             spec.document.size());
    return 0;
  }
  const RunOptions options = run_options(args, spec);
  const cluster::ClusterKey key = cluster_key(args);  // a bad URL or key before the model loads
  const std::string model_path = resolve_model_path(spec.model);
  const Stopwatch load;
  ModelOptions model_options = spec.model_options();
  // A coordinator tokenises and keys the document; its workers prefill and decode.
  model_options.metadata_only = args.redis.has_value();
  auto model = Model::load(model_path, model_options);
  const double load_ms = load.ms();
  PipelineResult result;
  if (args.redis) {
    cluster::CoordinatorOptions coordinator;
    coordinator.timeout_s = args.timeout_s;
    coordinator.agents_per_job = args.agents_per_job;
    coordinator.run = options;
    coordinator.bus.cluster_key = key;
    result = cluster::run_distributed(spec, model, redis::resolve_url(*args.redis), coordinator);
  } else {
    result = run_pipeline(spec, model, options);
  }
  nlohmann::json out = result_json(result);
  out["load_ms"] = load_ms;
  if (args.json) {
    std::cout << dump_json(out) << "\n";
  } else {
    print_text(spec, result, model_path, load_ms);
  }
  if (!args.html.empty()) write_run_page(args.html, out, "");
  if (!result.ok()) {
    report_failures(result);
    return kExitFailed;
  }
  return 0;
}

int RunCommand::run_corpus(CorpusSpec corpus) {
  const RunArgs& args = args_;
  refuse_for_a_corpus(args);
  if (!args.html.empty()) check_page_path(args.html);
  apply_overrides(args, corpus.pipeline);
  try {
    validate_corpus(corpus);  // the command line's values and documents too
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", args.pipeline, e.message()));
  }
  if (args.check) {
    std::cout << fmt::format(
        "{}: corpus '{}' is valid: {} documents, {} agents per document, {} reduce agents, fork "
        "{}\n",
        args.pipeline, corpus.pipeline.name, corpus.documents.size(), corpus.pipeline.agents.size(),
        corpus.reduce.size(), to_string(corpus.pipeline.fork));
    return 0;
  }
  CorpusOptions options;
  options.run = run_options(args, corpus.pipeline);
  options.run.on_prefill_progress = nullptr;  // the corpus's own line instead
  options.out_dir = args.out_dir;
  options.on_progress = corpus_progress();
  options.documents_live = args.max_documents_live;
  const cluster::ClusterKey key = cluster_key(args);  // a bad URL or key before the model loads
  const Stopwatch load;
  ModelOptions model_options = corpus.pipeline.model_options();
  // On a cluster the workers run the documents; reduce agents run here.
  model_options.metadata_only = args.redis.has_value() && corpus.reduce.empty();
  auto model = Model::load(resolve_model_path(corpus.pipeline.model), model_options);
  const double load_ms = load.ms();
  if (args.redis) {
    const redis::Url url = redis::resolve_url(*args.redis);
    cluster::CoordinatorOptions coordinator;
    coordinator.timeout_s = args.timeout_s;
    coordinator.run = options.run;
    coordinator.bus.cluster_key = key;
    // One job per document: a worker prefills its document and runs its agents.
    coordinator.agents_per_job = args.agents_per_job > 0
                                     ? args.agents_per_job
                                     : static_cast<int>(corpus.pipeline.agents.size());
    options.run_document = [&model, url, coordinator](const PipelineSpec& spec) {
      return cluster::run_distributed(spec, model, url, coordinator);
    };
    if (options.documents_live == 0) {
      std::optional<PipelineSpec> settled;
      options.documents_live = std::max<size_t>(
          1, cluster::count_live_workers(
                 url, *model, exact_settled(corpus.pipeline, *model, settled).exact, key));
    }
  }
  const CorpusResult result = swarmkv::run_corpus(corpus, model, options);
  nlohmann::json out = corpus_json(result);
  out["load_ms"] = load_ms;
  if (args.json) {
    std::cout << dump_json(out) << "\n";
  } else {
    print_corpus_text(result, load_ms);
  }
  if (!args.html.empty()) write_run_page(args.html, out, "");
  if (result.ok()) return 0;
  const TerminalText shown(stderr);
  for (const DocumentOutcome& d : result.documents) {
    if (d.error)
      std::cerr << "swarmkv: error: document " << shown(d.name) << ": "
                << shown(d.error->to_string()) << "\n";
    if (!d.result) continue;
    for (const AgentResult& a : d.result->agents) {
      if (a.status != NodeStatus::kOk)
        std::cerr << "swarmkv: error: document " << shown(d.name) << ": agent " << shown(a.name)
                  << ": " << shown(a.error->to_string()) << "\n";
    }
  }
  if (result.reduce) report_failures(*result.reduce);
  return kExitFailed;
}

}  // namespace swarmkv::cli
