#include "server/pipeline_runner.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <tuple>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <openssl/rand.h>

#include "server/openai.h"
#include "server/text_stream.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/result_json.h"

namespace swarmkv::server {
using nlohmann::json;

namespace {

// The server's thread settings apply: a client takes no more of the
// machine than the operator gave the server (serve -t).
void apply_server_threads(const PipelineLimits& limits, PipelineSpec& spec) {
  const std::tuple<const char*, int32_t&, int32_t> settings[] = {
      {"threads", spec.n_threads, limits.n_threads},
      {"threads_batch", spec.n_threads_batch, limits.n_threads_batch}};
  for (const auto& [key, asked, server] : settings) {
    if (server <= 0) continue;
    if (asked == 0) asked = server;  // not given, or "all cores"
    if (asked > server) {
      refuse(key, fmt::format("{} threads, more than the {} this server runs with (serve "
                              "-t/--threads); leave '{}' out to run on the server's",
                              asked, server, key));
    }
  }
}

}  // namespace

namespace {

// What every posted run must not ask for, checked on the body before it is
// read as a pipeline: a model, GPU layers, the server's files, more agents
// than the limit.
nlohmann::ordered_json read_request(std::string_view body_text, const PipelineLimits& limits) {
  auto body = read_pipeline_json(body_text, "body");
  if (!body.is_object()) {
    refuse("body", fmt::format("must be a JSON object, a pipeline (got a {})", body.type_name()));
  }
  if (body.contains("model")) {
    refuse("model",
           "a pipeline request runs on the server's model and cannot name one; leave 'model' out");
  }
  if (body.contains("n_gpu_layers")) {
    refuse("n_gpu_layers",
           "a pipeline request runs on the server's model as it was loaded (serve "
           "--n-gpu-layers); leave 'n_gpu_layers' out");
  }
  if (const auto doc = body.find("document");
      doc != body.end() && doc->is_object() && doc->contains("file")) {
    refuse("document.file",
           "a pipeline request cannot read the server's files; send the document as "
           "document.text");
  }
  // The count before any agent is read or the graph is built: the work
  // below grows with it.
  if (const auto agents = body.find("agents");
      agents != body.end() && agents->is_array() &&
      std::cmp_greater(agents->size(), limits.max_agents)) {
    refuse("agents", fmt::format("{} agents, more than the {} this server runs in one pipeline",
                                 agents->size(), limits.max_agents));
  }
  return body;
}

// The server's settings over what the body left out or may not exceed:
// exact mode, threads, each agent's max_tokens.
void settle_request(const nlohmann::ordered_json& body, const PipelineLimits& limits,
                    PipelineSpec& spec, const std::vector<AgentSpec>& more_agents = {}) {
  if (!body.contains("exact")) spec.exact = limits.exact;  // the server's mode
  apply_server_threads(limits, spec);
  if (spec.exact && !limits.exact) {
    refuse("exact",
           "this server runs without the batch-invariant kernels exact mode needs (started "
           "with --no-exact, or a llama.cpp without them); send exact: false, or run the "
           "pipeline with `swarmkv run`");
  }
  const auto check = [&](const AgentSpec& a, size_t i) {
    if (a.max_tokens > limits.max_tokens) {
      refuse(fmt::format("agents[{}].max_tokens", i),
             fmt::format("{} is more than the {} this server allows (--max-tokens)", a.max_tokens,
                         limits.max_tokens));
    }
  };
  // The body lists per-document and reduce agents in one list; each kind
  // keeps its order in `spec.agents` and `more_agents`.
  const nlohmann::ordered_json& listed = body.at("agents");
  size_t next = 0, next_more = 0;
  for (size_t i = 0; i < listed.size(); ++i) {
    const bool more = listed[i].is_object() && listed[i].value("scope", "") == "corpus";
    check(more ? more_agents.at(next_more++) : spec.agents.at(next++), i);
  }
}

bool is_corpus_request(const nlohmann::ordered_json& body) {
  if (body.contains("documents")) return true;
  const auto agents = body.find("agents");
  if (agents == body.end() || !agents->is_array()) return false;
  return std::any_of(agents->begin(), agents->end(), [](const nlohmann::ordered_json& a) {
    return a.is_object() && a.contains("scope") && a["scope"] == "corpus";
  });
}

CorpusSpec corpus_request(const nlohmann::ordered_json& body, const PipelineLimits& limits) {
  if (const auto docs = body.find("documents"); docs != body.end() && docs->is_array()) {
    if (std::cmp_greater(docs->size(), limits.max_documents)) {
      refuse("documents",
             fmt::format("{} documents, more than the {} this server runs in one corpus "
                         "(--max-pipeline-documents)",
                         docs->size(), limits.max_documents));
    }
    for (size_t i = 0; i < docs->size(); ++i) {
      const nlohmann::ordered_json& d = (*docs)[i];
      if (!d.is_object() || !d.contains("text") || d.contains("file")) {
        refuse(fmt::format("documents[{}]", i),
               "a pipeline request cannot read the server's files (a file, glob or folder); "
               "send each document as {\"name\": ..., \"text\": ...}");
      }
    }
  }
  CorpusSpec corpus = parse_corpus_json(body, "body", "");
  settle_request(body, limits, corpus.pipeline, corpus.reduce);
  return corpus;
}

}  // namespace

PipelineSpec parse_pipeline_request(std::string_view body_text, const PipelineLimits& limits) {
  const auto body = read_request(body_text, limits);
  // The pipeline file's reader checks every key, type and range, and the
  // graph; its messages start with "body: ".
  PipelineSpec spec = parse_pipeline_json(body, "body", "");
  settle_request(body, limits, spec);
  return spec;
}

PostedRun parse_posted_run(std::string_view body_text, const PipelineLimits& limits) {
  const auto body = read_request(body_text, limits);
  if (is_corpus_request(body)) return corpus_request(body, limits);
  PipelineSpec spec = parse_pipeline_json(body, "body", "");
  settle_request(body, limits, spec);
  return spec;
}

// ------------------------------------------------------------------ job

namespace {

// 128 random bits in hex: a run's id may not be guessed from another's (a
// client that could read /runs/<id> must have been told the id).
std::string new_run_id() {
  std::array<unsigned char, 16> bits{};
  if (RAND_bytes(bits.data(), static_cast<int>(bits.size())) != 1) {
    throw Error(ErrorCode::kInternal, "pipeline: no random bytes for a run id (RAND_bytes)");
  }
  std::string id;
  for (const unsigned char b : bits) id += fmt::format("{:02x}", b);
  return id;
}

}  // namespace

PipelineJob::PipelineJob(std::string id, PipelineSpec spec, PreparedPipeline prepared,
                         const std::string& model)
    : id_(std::move(id)),
      spec_(std::move(spec)),
      prepared_(std::move(prepared)),
      view_(std::in_place_type<RunView>, spec_, prepared_.prefix.size(), model) {}

PipelineJob::PipelineJob(std::string id, CorpusSpec corpus, const std::string& model)
    : id_(std::move(id)),
      corpus_(std::move(corpus)),
      view_(std::in_place_type<CorpusView>, *corpus_, model) {}

double PipelineJob::ms_since_start() const {
  if (!started_) return 0;
  return ms_between(*started_, ended_.value_or(Clock::now()));
}

void PipelineJob::begin() {
  std::lock_guard lock(view_mutex_);
  started_ = Clock::now();
  std::visit([](auto& v) { v.begin(); }, view_);
}

void PipelineJob::push(PipelineEvent event) {
  {
    std::lock_guard lock(view_mutex_);
    std::visit([&](auto& v) { v.apply(event, ms_since_start()); }, view_);
    if (event.last()) ended_ = Clock::now();
  }
  events_.push(std::move(event));
}

nlohmann::json PipelineJob::view() const {
  std::lock_guard lock(view_mutex_);
  return std::visit([&](const auto& v) { return v.result(ms_since_start()); }, view_);
}

bool PipelineJob::going() const {
  std::lock_guard lock(view_mutex_);
  const RunState state = std::visit([](const auto& v) { return v.state(); }, view_);
  return state == RunState::kQueued || state == RunState::kRunning;
}

RunSummary PipelineJob::summary() const {
  std::lock_guard lock(view_mutex_);
  return std::visit(
      [&](const auto& v) {
        return RunSummary{
            .id = id_,
            .pipeline = v.pipeline(),
            .state = std::string(to_string(v.state())),
            .agents = v.agents(),
            .agents_done = v.agents_done(),
            .accepted = fmt::format("{:%Y-%m-%d %H:%M:%S}",
                                    fmt::gmtime(std::chrono::system_clock::to_time_t(accepted_))),
            .elapsed_ms = ms_since_start()};
      },
      view_);
}

void PipelineJob::cancel(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (cancelled_.load()) return;
  why_ = why;
  cancelled_.store(true);
}

void PipelineJob::check() const {
  if (!cancelled_.load()) return;
  std::string why;
  {
    std::lock_guard lock(mutex_);
    why = why_;
  }
  throw Error(ErrorCode::kAborted, why);
}

// ------------------------------------------------------------------ runner

PipelineRunner::PipelineRunner(std::shared_ptr<const Model> model, int32_t max_running,
                               SnapshotOptions snapshots, int32_t keep)
    : model_(std::move(model)),
      max_running_(max_running),
      snapshots_(std::move(snapshots)),
      keep_(keep) {
  if (max_running_ < 0 || keep_ < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need max_pipelines >= 0 and keep_runs >= 1 (got {}, {})", max_running_,
                            keep_));
  }
  if (!snapshots_.file.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "snapshots: a server names no snapshot file (each request has its own "
                "document); use the store (cache)");
  }
  for (int32_t i = 0; i < max_running_; ++i) workers_.emplace_back([this] { work(); });
}

PipelineRunner::~PipelineRunner() {
  shutdown("the server is shutting down");
}

bool PipelineRunner::full() const {
  std::lock_guard lock(mutex_);
  return stopping_ || std::cmp_greater_equal(live_.size(), max_running_);
}

std::shared_ptr<PipelineJob> PipelineRunner::enqueue(
    const std::function<std::shared_ptr<PipelineJob>(std::string id)>& make) {
  std::string id = new_run_id();
  std::shared_ptr<PipelineJob> job;
  {
    std::lock_guard lock(mutex_);
    // Another request may have taken the slot since the caller looked.
    if (stopping_ || std::cmp_greater_equal(live_.size(), max_running_)) return nullptr;
    ++runs_;
    job = make(std::move(id));
    live_.push_back(job);
    queue_.push_back(job);
    recent_.push_front(job);
    if (std::cmp_greater(recent_.size(), keep_)) recent_.pop_back();
  }
  wake_.notify_one();
  return job;
}

namespace {

// `spec` prepared on `model`, within the server's context limit and the
// machine's memory; a corpus's `document` is named in what it throws.
PreparedPipeline prepared_for_server(const PipelineSpec& spec, const Model& model,
                                     const PipelineLimits& limits,
                                     const std::string& document = "") {
  try {
    PreparedPipeline prepared = prepare_pipeline(spec, model);
    if (prepared.budget.n_ctx > limits.max_n_ctx) {
      throw Error(ErrorCode::kBudget,
                  fmt::format("pipeline: needs n_ctx {}, more than the {} this server allows "
                              "(--max-pipeline-ctx)",
                              prepared.budget.n_ctx, limits.max_n_ctx));
    }
    const RunOptions defaults;
    check_memory(spec, model, prepared.budget, defaults.guard);
    return prepared;
  } catch (const Error& e) {
    if (document.empty()) throw;
    throw Error(e.code(), fmt::format("document '{}': {}", document, e.message()));
  }
}

}  // namespace

std::shared_ptr<PipelineJob> PipelineRunner::submit(PipelineSpec spec,
                                                    const PipelineLimits& limits) {
  if (full()) return nullptr;  // no preparing for a request that cannot run now
  PreparedPipeline prepared = prepared_for_server(spec, *model_, limits);
  const std::string model = std::filesystem::path(model_->path()).filename().string();
  return enqueue([&](std::string id) {
    return std::make_shared<PipelineJob>(std::move(id), std::move(spec), std::move(prepared),
                                         model);
  });
}

std::shared_ptr<PipelineJob> PipelineRunner::submit(CorpusSpec corpus,
                                                    const PipelineLimits& limits) {
  if (full()) return nullptr;
  validate_corpus(corpus);
  for (const DocumentRef& d : corpus.documents)
    (void)prepared_for_server(document_pipeline(corpus, d, d.text), *model_, limits, d.name);
  check_reduce_budget(corpus, *model_, limits.max_n_ctx);
  const std::string model = std::filesystem::path(model_->path()).filename().string();
  return enqueue([&](std::string id) {
    return std::make_shared<PipelineJob>(std::move(id), std::move(corpus), model);
  });
}

void PipelineRunner::shutdown(const std::string& why) {
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (const auto& job : live_) job->cancel(why);
    workers.swap(workers_);
  }
  wake_.notify_all();
  for (std::thread& t : workers) t.join();
}

std::vector<RunSummary> PipelineRunner::recent() const {
  std::vector<std::shared_ptr<PipelineJob>> jobs;
  {
    std::lock_guard lock(mutex_);
    jobs.assign(recent_.begin(), recent_.end());
  }
  std::vector<RunSummary> out;
  for (const auto& job : jobs) out.push_back(job->summary());
  return out;
}

std::shared_ptr<const PipelineJob> PipelineRunner::find(std::string_view id) const {
  std::lock_guard lock(mutex_);
  for (const auto& job : recent_) {
    if (job->id() == id) return job;
  }
  return nullptr;
}

PipelineStats PipelineRunner::stats() const {
  std::lock_guard lock(mutex_);
  return {.runs = runs_, .cancelled = cancelled_, .running = static_cast<int32_t>(live_.size())};
}

void PipelineRunner::work() {
  for (;;) {
    std::shared_ptr<PipelineJob> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left to run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    PipelineEvent last = job->corpus_ ? run_corpus_job(*job) : run(*job);
    // The view keeps what a viewer needs; the documents may be large.
    job->spec_ = {};
    job->prepared_ = {};
    job->corpus_.reset();
    {
      std::lock_guard lock(mutex_);
      live_.erase(std::find(live_.begin(), live_.end(), job));
    }
    // Only now: a client that posts its next run on this answer finds room.
    job->push(std::move(last));
  }
}

namespace {

// Where the server keeps its files is not the client's business.
void hide_server_paths(PipelineResult& result) {
  if (result.snapshot) result.snapshot->path.clear();
  result.model = std::filesystem::path(result.model).filename().string();
}

}  // namespace

PipelineEvent PipelineRunner::run(PipelineJob& job) {
  job.begin();
  const PipelineSpec& spec = job.spec_;
  std::vector<TextStream> streams;
  for (const AgentSpec& a : spec.agents) streams.emplace_back(a.stop);
  const auto token_event = [&](size_t agent, json token, std::string text) {
    job.push({PipelineEvent::Kind::kToken,
              {{"agent", spec.agents[agent].name}, {"token", std::move(token)}, {"text", text}},
              std::nullopt});
  };
  RunOptions options;  // serialized branch workers: the library's default
  options.snapshot = snapshots_;
  options.on_prefill_progress = [&](size_t done, size_t total) {
    job.check();
    job.push({PipelineEvent::Kind::kPrefill, {{"done", done}, {"total", total}}, std::nullopt});
  };
  // Under kConcurrent several agents report at once: each touches its own
  // stream only, and the job's queue is locked.
  options.on_agent_event = [&](const AgentEvent& e) {
    switch (e.kind) {
      case AgentEvent::Kind::kStarted:
        job.check();
        job.push({PipelineEvent::Kind::kAgentStarted,
                  {{"agent", spec.agents[e.agent].name}},
                  std::nullopt});
        break;
      case AgentEvent::Kind::kToken:
        job.check();
        token_event(e.agent, json(e.token), streams[e.agent].next(e.text, /*done=*/false));
        break;
      case AgentEvent::Kind::kDone:
        if (e.result->status == NodeStatus::kOk) {
          if (std::string rest = streams[e.agent].next(e.result->answer, /*done=*/true);
              !rest.empty()) {
            token_event(e.agent, json(), std::move(rest));
          }
        }
        job.push({PipelineEvent::Kind::kAgentDone, agent_json(*e.result), std::nullopt});
        break;
    }
  };
  try {
    PipelineResult result = run_pipeline(spec, job.prepared_, model_, options);
    hide_server_paths(result);
    // Cancelled, and not every agent finished: the cancel failed an agent,
    // or the document's prefill (its agents then fail as its dependents).
    if (job.cancelled_.load() &&
        std::any_of(result.agents.begin(), result.agents.end(),
                    [](const AgentResult& a) { return a.status != NodeStatus::kOk; })) {
      std::lock_guard lock(mutex_);
      ++cancelled_;
    }
    return {PipelineEvent::Kind::kResult, result_json(result), std::nullopt};
  } catch (...) {
    const ErrorValue error = current_error_value();
    if (job.cancelled_.load() && error.code == ErrorCode::kAborted) {  // during the prefill
      std::lock_guard lock(mutex_);
      ++cancelled_;
    }
    log_warn("serve: pipeline '{}' could not run ({})", spec.name, error.to_string());
    return {PipelineEvent::Kind::kError, error_body(error, http_error(error.code)), error};
  }
}

// One document after another, each as a posted pipeline runs (the store,
// the server's threads); its outcome as an event when it ends. A cancel
// fails the agent running at its next token and every document left at
// once, and the reduce agents as their dependencies.
PipelineEvent PipelineRunner::run_corpus_job(PipelineJob& job) {
  job.begin();
  const CorpusSpec& corpus = *job.corpus_;
  CorpusOptions options;
  options.run.snapshot = snapshots_;
  options.run.on_prefill_progress = [&](size_t, size_t) { job.check(); };
  options.run.on_agent_event = [&](const AgentEvent& e) {
    if (e.kind != AgentEvent::Kind::kDone) job.check();
  };
  options.before_document = [&] { job.check(); };
  options.on_progress = [&](const CorpusProgress& p) {
    DocumentOutcome outcome = *p.outcome;
    if (outcome.result) hide_server_paths(*outcome.result);
    json data = document_json(outcome);
    data["index"] = p.index;
    job.push({PipelineEvent::Kind::kDocumentDone, std::move(data), std::nullopt});
  };
  try {
    CorpusResult result = run_corpus(corpus, model_, options);
    result.model = std::filesystem::path(result.model).filename().string();
    for (DocumentOutcome& d : result.documents) {
      if (d.result) hide_server_paths(*d.result);
    }
    if (result.reduce) hide_server_paths(*result.reduce);
    if (job.cancelled_.load() && !result.ok()) {
      std::lock_guard lock(mutex_);
      ++cancelled_;
    }
    return {PipelineEvent::Kind::kResult, corpus_json(result), std::nullopt};
  } catch (...) {
    const ErrorValue error = current_error_value();
    log_warn("serve: corpus '{}' could not run ({})", corpus.pipeline.name, error.to_string());
    return {PipelineEvent::Kind::kError, error_body(error, http_error(error.code)), error};
  }
}

}  // namespace swarmkv::server
