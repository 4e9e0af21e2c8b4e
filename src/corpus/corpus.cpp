// The corpus runner (swarmkv/corpus.h): each document as a pipeline of its
// own, one after another, resumable from an output folder; then the
// reduce agents as a pipeline without a document, their corpus
// placeholders given as inputs.
#include "swarmkv/corpus.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <variant>

#include <fmt/format.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "corpus/memory_gate.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/result_json.h"
#include "swarmkv/snapshot.h"

namespace swarmkv {
namespace {

// The document's text, read when its turn comes.
std::string document_text(const DocumentRef& d) {
  if (d.path.empty() || !d.text.empty()) return d.text;
  return read_file(d.path, "document file");
}

std::string hex128(const XXH128_hash_t& h) {
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

// What a document's saved result must match to be taken: the document's
// text and pipeline as the run settles them (pipeline_json) and the engine
// binding (engine build, model fingerprint, KV layout).
std::string result_key(const PipelineSpec& spec, const Model& model) {
  std::optional<PipelineSpec> storage;
  const PipelineSpec& settled = exact_settled(spec, model, storage);
  const std::string text =
      fmt::format("corpus v{}\n{}\n{}", kCorpusSchemaVersion,
                  snapshot_key(binding_of(model, settled.context_options()), {}),
                  pipeline_json(settled).dump());
  return hex128(XXH3_128bits(text.data(), text.size()));
}

// <out>/documents/<name, safe characters only>-<hash of the name>.json.
std::string result_path(const std::string& out_dir, const std::string& name) {
  std::string safe;
  for (const char c : name.substr(0, 64)) {
    safe +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  }
  return (std::filesystem::path(out_dir) / "documents" /
          fmt::format("{}-{:08x}.json", safe,
                      static_cast<uint32_t>(XXH3_64bits(name.data(), name.size()))))
      .string();
}

// The saved result of this key, if there is one that reads.
std::optional<PipelineResult> saved_result(const std::string& path, const std::string& key) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file(path, "saved result"));
    if (j.value("key", "") != key) {
      log_info("corpus: {} was made by another pipeline, model or document text; running it again",
               path);
      return std::nullopt;
    }
    return result_from_json(j.at("result")).result;
  } catch (const std::exception& e) {
    log_warn("corpus: {} does not read ({}); running its document again", path, e.what());
    return std::nullopt;
  }
}

// What a local run of `spec` holds while it runs, with headroom
// (estimate_memory after prepare_pipeline, as run_pipeline checks it).
uint64_t document_memory(const PipelineSpec& spec, const Model& model, GuardPolicy guard) {
  const PreparedPipeline prepared = prepare_pipeline(spec, model);
  return with_headroom(estimate_memory(spec, model, prepared.budget, guard).bytes);
}

// `gate`: several documents at once on this machine; each waits for its
// memory there before it runs (null: one at a time, or on workers).
DocumentOutcome run_document(const CorpusSpec& corpus, const DocumentRef& d,
                             const std::shared_ptr<const Model>& model,
                             const CorpusOptions& options, std::atomic<size_t>& ran,
                             detail::MemoryGate* gate) {
  DocumentOutcome out;
  out.name = d.name;
  out.source = d.source();
  try {
    if (options.before_document) options.before_document();
    const PipelineSpec spec = document_pipeline(corpus, d, document_text(d));
    const std::string key = options.out_dir.empty() ? std::string() : result_key(spec, *model);
    const std::string path =
        options.out_dir.empty() ? std::string() : result_path(options.out_dir, d.name);
    if (!key.empty()) {
      if (std::optional<PipelineResult> saved = saved_result(path, key)) {
        out.result = std::move(saved);
        out.resumed = true;
        return out;
      }
    }
    ++ran;
    if (gate != nullptr) {
      const detail::MemoryGate::Hold hold(*gate, document_memory(spec, *model, options.run.guard));
      out.result = run_pipeline(spec, model, options.run);
    } else {
      out.result = options.run_document ? options.run_document(spec)
                                        : run_pipeline(spec, model, options.run);
    }
    if (!key.empty() && out.result->ok()) {
      const nlohmann::json saved = {
          {"key", key}, {"name", d.name}, {"result", result_json(*out.result)}};
      write_text_file_atomically(path, dump_json(saved));
    }
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kIo && !options.out_dir.empty() &&
        e.message().find(options.out_dir) != std::string::npos) {
      throw;  // the output folder: the run cannot keep its promise
    }
    out.error = ErrorValue{e.code(), e.message()};
  }
  return out;
}

// The answer of per-document agent `agent` in `d`, or why there is none.
std::variant<std::string, ErrorValue> answer_in(const DocumentOutcome& d,
                                                const CorpusPlaceholder& p) {
  if (d.error) {
    return ErrorValue{ErrorCode::kDependencyFailed,
                      fmt::format("document '{}' failed: {}", d.name, d.error->to_string())};
  }
  for (const AgentResult& a : d.result->agents) {
    if (a.name != p.agent) continue;
    if (a.status != NodeStatus::kOk) {
      return ErrorValue{ErrorCode::kDependencyFailed,
                        fmt::format("agent '{}' of document '{}' failed: {}", a.name, d.name,
                                    a.error ? a.error->to_string() : "failed")};
    }
    try {
      return placeholder_value(PlaceholderRef{p.agent, p.field}, a.answer);
    } catch (const Error& e) {
      return ErrorValue{e.code(), fmt::format("document '{}': {}", d.name, e.message())};
    }
  }
  return ErrorValue{ErrorCode::kInternal,
                    fmt::format("document '{}' has no agent '{}'", d.name, p.agent)};
}

}  // namespace

bool CorpusResult::ok() const noexcept {
  for (const DocumentOutcome& d : documents)
    if (!d.ok()) return false;
  return !reduce || reduce->ok();
}

ReduceInputs reduce_inputs(const CorpusSpec& corpus,
                           const std::vector<DocumentOutcome>& documents) {
  ReduceInputs out;
  for (const AgentSpec& a : corpus.reduce) {
    for (const PromptPlaceholder& h : prompt_placeholders(a.prompt)) {
      const std::optional<CorpusPlaceholder> p = corpus_placeholder(corpus, h.name);
      if (!p || out.values.contains(h.name) || out.failed.contains(h.name)) continue;
      std::string value;
      std::optional<ErrorValue> error;
      for (const DocumentOutcome& d : documents) {
        if (!p->document.empty() && d.name != p->document) continue;
        auto answer = answer_in(d, *p);
        if (auto* e = std::get_if<ErrorValue>(&answer)) {
          error = std::move(*e);
          break;
        }
        const std::string& text = std::get<std::string>(answer);
        if (!p->document.empty()) {
          value = text;
        } else {
          value += fmt::format("{}### {}\n{}", value.empty() ? "" : "\n\n", d.name, text);
        }
      }
      if (error) {
        out.failed.emplace(h.name, std::move(*error));
      } else {
        out.values.emplace(h.name, std::move(value));
      }
    }
  }
  return out;
}

namespace {

// Why reduce agent `i` cannot run, if it cannot: a corpus placeholder
// without its answers, a per-document agent in depends_on that failed in a
// document, or a reduce agent it waits on that cannot run.
std::vector<std::optional<ErrorValue>> blocked_reduce_agents(
    const CorpusSpec& corpus, const std::vector<DocumentOutcome>& docs,
    const ReduceInputs& inputs) {
  const size_t n = corpus.reduce.size();
  std::vector<std::optional<ErrorValue>> blocked(n);
  const auto dependency_failed = [](const std::string& what, const ErrorValue& e) {
    return ErrorValue{ErrorCode::kDependencyFailed,
                      fmt::format("dependency '{}' failed: {}", what, e.to_string())};
  };
  for (size_t i = 0; i < n; ++i) {
    const AgentSpec& a = corpus.reduce[i];
    for (const PromptPlaceholder& h : prompt_placeholders(a.prompt)) {
      if (const auto it = inputs.failed.find(h.name); it != inputs.failed.end() && !blocked[i])
        blocked[i] = dependency_failed(h.name, it->second);
    }
    for (const std::string& dep : a.depends_on) {
      if (blocked[i] || !corpus.pipeline.agent_index(dep)) continue;
      for (const DocumentOutcome& d : docs) {
        auto answer = answer_in(d, CorpusPlaceholder{dep, d.name, {}});
        if (auto* e = std::get_if<ErrorValue>(&answer)) {
          blocked[i] = dependency_failed(dep + "@" + d.name, *e);
          break;
        }
      }
    }
  }
  // A reduce agent waits on others (depends_on, fork_from): until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (blocked[i]) continue;
      std::vector<std::string> waits = corpus.reduce[i].depends_on;
      if (!corpus.reduce[i].fork_from.empty()) waits.push_back(corpus.reduce[i].fork_from);
      for (size_t k = 0; k < n && !blocked[i]; ++k) {
        if (blocked[k] &&
            std::find(waits.begin(), waits.end(), corpus.reduce[k].name) != waits.end()) {
          blocked[i] = dependency_failed(corpus.reduce[k].name, *blocked[k]);
          changed = true;
        }
      }
    }
  }
  return blocked;
}

PipelineResult run_reduce(const CorpusSpec& corpus, const std::vector<DocumentOutcome>& docs,
                          const std::shared_ptr<const Model>& model, const CorpusOptions& options) {
  const ReduceInputs inputs = reduce_inputs(corpus, docs);
  const std::vector<std::optional<ErrorValue>> blocked =
      blocked_reduce_agents(corpus, docs, inputs);
  std::vector<bool> runnable(blocked.size());
  for (size_t i = 0; i < blocked.size(); ++i) runnable[i] = !blocked[i];
  const PipelineSpec stage = reduce_stage(corpus, inputs.values, runnable);
  PipelineResult ran;
  ran.pipeline = stage.name;
  ran.model = model->path();
  ran.fork = stage.fork;
  std::optional<ErrorValue> refused;
  if (!stage.agents.empty()) {
    RunOptions run = options.run;
    run.snapshot.cache = SnapshotCacheMode::kOff;  // a system prompt alone: nothing worth keeping
    run.snapshot.file.clear();
    run.on_prefill_progress = nullptr;
    run.on_agent_event = nullptr;
    try {
      ran = run_pipeline(stage, model, run);
    } catch (const Error& e) {
      refused = ErrorValue{e.code(), e.message()};
    }
  }
  // Every reduce agent in the corpus's order: run, refused or blocked.
  std::vector<AgentResult> agents;
  size_t next = 0;
  for (size_t i = 0; i < corpus.reduce.size(); ++i) {
    const AgentSpec& spec = corpus.reduce[i];
    if (!blocked[i] && !refused && next < ran.agents.size()) {
      agents.push_back(std::move(ran.agents[next++]));
      agents.back().depends_on = spec.depends_on;  // the per-document ones too
      continue;
    }
    AgentResult a;
    a.name = spec.name;
    a.depends_on = spec.depends_on;
    a.fork_from = spec.fork_from;
    a.status = blocked[i] ? NodeStatus::kDependencyFailed : NodeStatus::kFailed;
    a.error = blocked[i] ? *blocked[i] : *refused;
    agents.push_back(std::move(a));
  }
  ran.agents = std::move(agents);
  return ran;
}

}  // namespace

// The most positions a reduce agent's sequence can take: the system turn
// and its prompt, each corpus placeholder at its longest (every document's
// answer at max_tokens, under its name line), each reduce agent it names at
// max_tokens, and its own max_tokens. Over the model's trained context it
// is refused before any document runs (Error(kBudget)), not after them all.
void check_reduce_budget(const CorpusSpec& corpus, const Model& model, uint32_t server_n_ctx) {
  const int64_t train = model.n_ctx_train();
  const bool server = server_n_ctx > 0 && server_n_ctx < train;
  const int64_t system =
      static_cast<int64_t>(model.tokenize(corpus.pipeline.system_prompt, false, false).size()) + 16;
  for (const AgentSpec& a : corpus.reduce) {
    std::map<std::string, std::string> empty;
    int64_t inserted = 0;
    std::string parts;
    for (const PromptPlaceholder& h : prompt_placeholders(a.prompt)) {
      empty[h.name];
      const std::optional<CorpusPlaceholder> p = corpus_placeholder(corpus, h.name);
      if (!p) {
        for (const AgentSpec& r : corpus.reduce) inserted += r.name == h.name ? r.max_tokens : 0;
        continue;
      }
      const int64_t answer =
          corpus.pipeline.agents[*corpus.pipeline.agent_index(p->agent)].max_tokens;
      int64_t n = answer;
      if (p->document.empty()) {
        n = 0;
        for (const DocumentRef& d : corpus.documents) {
          n += answer + 4 + static_cast<int64_t>(model.tokenize(d.name, false, false).size());
        }
      }
      inserted += n;
      parts += fmt::format(" + {{{{{}}}}} {}", h.name, n);
    }
    const int64_t prompt =
        static_cast<int64_t>(model.tokenize(agent_turn(a, empty), false, false).size());
    const int64_t need = system + prompt + inserted + a.max_tokens;
    if (need > (server ? server_n_ctx : train)) {
      const std::string cap =
          server ? fmt::format("n_ctx {}, the most this server allows (--max-pipeline-ctx)",
                               server_n_ctx)
                 : fmt::format("n_ctx_train {}, the context the model was trained on", train);
      throw Error(ErrorCode::kBudget,
                  fmt::format("reduce agent '{}' may need {} positions: system and prompt {}{} "
                              "+ max_tokens {} > {} ({} documents); take a field or fewer "
                              "documents, or lower the max_tokens of the agents it reads",
                              a.name, need, system + prompt, parts, a.max_tokens, cap,
                              corpus.documents.size()));
    }
  }
}

CorpusResult run_corpus(const CorpusSpec& corpus, const std::shared_ptr<const Model>& model,
                        const CorpusOptions& options) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "run_corpus needs a model");
  validate_corpus(corpus);
  check_reduce_budget(corpus, *model);
  const Stopwatch clock;
  if (!options.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(options.out_dir) / "documents", ec);
    if (ec) {
      throw Error(ErrorCode::kIo, fmt::format("cannot make the output folder '{}': {}",
                                              options.out_dir, ec.message()));
    }
  }
  CorpusResult out;
  out.pipeline = corpus.pipeline.name;
  out.model = model->path();
  out.fork = corpus.pipeline.fork;
  out.documents.resize(corpus.documents.size());
  std::mutex mutex;  // guards progress, out's counters and the first error
  CorpusProgress progress;
  progress.total = corpus.documents.size();
  std::atomic<size_t> next{0}, ran{0};
  std::exception_ptr failure;
  const size_t threads =
      std::min(std::max<size_t>(options.documents_live, 1), corpus.documents.size());
  // Several documents here at once: what memory was free now bounds them
  // together (memory_gate.h). On workers (run_document) each is theirs.
  std::optional<detail::MemoryGate> gate;
  if (threads > 1 && !options.run_document) {
    gate.emplace(options.memory_budget > 0 ? options.memory_budget : available_memory().bytes);
  }
  const auto work = [&] {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= corpus.documents.size()) return;
      {
        const std::lock_guard lock(mutex);
        if (failure) return;
      }
      const DocumentRef& d = corpus.documents[i];
      DocumentOutcome done;
      try {
        done = run_document(corpus, d, model, options, ran, gate ? &*gate : nullptr);
      } catch (...) {
        const std::lock_guard lock(mutex);
        if (!failure) failure = std::current_exception();
        return;
      }
      const std::lock_guard lock(mutex);
      if (done.resumed) ++out.documents_resumed;
      ++progress.done;
      progress.resumed = out.documents_resumed;
      progress.failed += done.ok() ? 0 : 1;
      if (done.result) {
        for (const AgentResult& a : done.result->agents)
          progress.agents += a.status == NodeStatus::kOk ? 1 : 0;
      }
      progress.elapsed_ms = clock.ms();
      progress.last = d.name;
      progress.index = i;
      if (!done.ok()) {
        log_warn("corpus: document '{}' failed{}", d.name,
                 done.error ? ": " + done.error->to_string() : std::string());
      }
      out.documents[i] = std::move(done);
      progress.outcome = &out.documents[i];
      if (options.on_progress) options.on_progress(progress);
      progress.outcome = nullptr;
    }
  };
  if (threads <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t) pool.emplace_back(work);
    for (std::thread& t : pool) t.join();
  }
  if (failure) std::rethrow_exception(failure);
  out.documents_run = ran.load();
  out.documents_live_peak = gate ? gate->peak() : 0;
  if (gate && gate->peak() < threads && ran.load() > gate->peak()) {
    log_info("corpus: memory let at most {} of the {} documents allowed at once run together",
             gate->peak(), threads);
  }
  if (!corpus.reduce.empty()) out.reduce = run_reduce(corpus, out.documents, model, options);
  out.total_ms = clock.ms();
  return out;
}

nlohmann::json document_json(const DocumentOutcome& d) {
  return {{"name", d.name},
          {"source", d.source},
          {"ok", d.ok()},
          {"resumed", d.resumed},
          {"error", error_json(d.error)},
          {"result", d.result ? result_json(*d.result) : nlohmann::json(nullptr)}};
}

nlohmann::json corpus_json(const CorpusResult& r) {
  nlohmann::json documents = nlohmann::json::array();
  size_t failed = 0;
  for (const DocumentOutcome& d : r.documents) {
    failed += d.ok() ? 0 : 1;
    documents.push_back(document_json(d));
  }
  return {{"schema_version", kCorpusSchemaVersion},
          {"kind", "corpus"},
          {"pipeline", r.pipeline},
          {"model", r.model},
          {"fork", std::string(to_string(r.fork))},
          {"ok", r.ok()},
          {"documents_total", r.documents.size()},
          {"documents_run", r.documents_run},
          {"documents_resumed", r.documents_resumed},
          {"documents_failed", failed},
          {"total_ms", r.total_ms},
          {"documents", std::move(documents)},
          {"reduce", r.reduce ? result_json(*r.reduce) : nlohmann::json(nullptr)}};
}

}  // namespace swarmkv
