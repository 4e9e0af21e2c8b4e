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

PipelineSpec parse_pipeline_request(std::string_view body_text, const PipelineLimits& limits) {
  const auto body = read_pipeline_json(body_text, "body");
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
  // The pipeline file's reader checks every key, type and range, and the
  // graph; its messages start with "body: ".
  PipelineSpec spec = parse_pipeline_json(body, "body", "");
  if (!body.contains("exact")) spec.exact = limits.exact;  // the server's mode
  apply_server_threads(limits, spec);
  if (spec.exact && !limits.exact) {
    refuse("exact",
           "this server runs without the batch-invariant kernels exact mode needs (started "
           "with --no-exact, or a llama.cpp without them); send exact: false, or run the "
           "pipeline with `swarmkv run`");
  }
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    if (spec.agents[i].max_tokens > limits.max_tokens) {
      refuse(fmt::format("agents[{}].max_tokens", i),
             fmt::format("{} is more than the {} this server allows (--max-tokens)",
                         spec.agents[i].max_tokens, limits.max_tokens));
    }
  }
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
      view_(spec_, prepared_.prefix.size(), model) {}

double PipelineJob::ms_since_start() const {
  if (!started_) return 0;
  return ms_between(*started_, ended_.value_or(Clock::now()));
}

void PipelineJob::begin() {
  std::lock_guard lock(view_mutex_);
  started_ = Clock::now();
  view_.begin();
}

void PipelineJob::push(PipelineEvent event) {
  {
    std::lock_guard lock(view_mutex_);
    view_.apply(event, ms_since_start());
    if (event.last()) ended_ = Clock::now();
  }
  events_.push(std::move(event));
}

nlohmann::json PipelineJob::view() const {
  std::lock_guard lock(view_mutex_);
  return view_.result(ms_since_start());
}

bool PipelineJob::going() const {
  std::lock_guard lock(view_mutex_);
  return view_.state() == RunState::kQueued || view_.state() == RunState::kRunning;
}

RunSummary PipelineJob::summary() const {
  std::lock_guard lock(view_mutex_);
  return {.id = id_,
          .pipeline = view_.pipeline(),
          .state = std::string(to_string(view_.state())),
          .agents = view_.agents(),
          .agents_done = view_.agents_done(),
          .accepted = fmt::format("{:%Y-%m-%d %H:%M:%S}",
                                  fmt::gmtime(std::chrono::system_clock::to_time_t(accepted_))),
          .elapsed_ms = ms_since_start()};
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

std::shared_ptr<PipelineJob> PipelineRunner::submit(PipelineSpec spec,
                                                    const PipelineLimits& limits) {
  const auto full = [&] { return stopping_ || std::cmp_greater_equal(live_.size(), max_running_); };
  {
    std::lock_guard lock(mutex_);
    if (full()) return nullptr;  // no preparing for a request that cannot run now
  }
  PreparedPipeline prepared = prepare_pipeline(spec, *model_);
  if (prepared.budget.n_ctx > limits.max_n_ctx) {
    throw Error(ErrorCode::kBudget,
                fmt::format("pipeline: needs n_ctx {}, more than the {} this server allows "
                            "(--max-pipeline-ctx)",
                            prepared.budget.n_ctx, limits.max_n_ctx));
  }
  const RunOptions defaults;
  check_memory(spec, *model_, prepared.budget, defaults.guard);
  std::shared_ptr<PipelineJob> job;
  std::string id = new_run_id();
  {
    std::lock_guard lock(mutex_);
    if (full()) return nullptr;  // another request took the slot meanwhile
    ++runs_;
    job = std::make_shared<PipelineJob>(std::move(id), std::move(spec), std::move(prepared),
                                        std::filesystem::path(model_->path()).filename().string());
    live_.push_back(job);
    queue_.push_back(job);
    recent_.push_front(job);
    if (std::cmp_greater(recent_.size(), keep_)) recent_.pop_back();
  }
  wake_.notify_one();
  return job;
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
    PipelineEvent last = run(*job);
    // The view keeps what a viewer needs; the document may be large.
    job->spec_ = {};
    job->prepared_ = {};
    {
      std::lock_guard lock(mutex_);
      live_.erase(std::find(live_.begin(), live_.end(), job));
    }
    // Only now: a client that posts its next run on this answer finds room.
    job->push(std::move(last));
  }
}

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
    // Where the server keeps its files is not the client's business.
    if (result.snapshot) result.snapshot->path.clear();
    result.model = std::filesystem::path(result.model).filename().string();
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

}  // namespace swarmkv::server
