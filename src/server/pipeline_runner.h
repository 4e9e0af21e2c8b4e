// POST /v1/pipelines: a pipeline in the JSON of a pipeline file, run on the
// server's model (run_pipeline), its progress sent as events while it runs
// and its result in `swarmkv run --json`'s schema at the end.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/event_queue.h"
#include "server/run_view.h"
#include "swarmkv/corpus.h"
#include "swarmkv/engine.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/run_page.h"

namespace swarmkv::server {

// What one pipeline request may ask for (ServerOptions carries them).
struct PipelineLimits {
  int32_t max_agents = 64;     // agents of every scope
  int32_t max_documents = 64;  // a corpus's documents
  int32_t max_tokens = 4096;   // per agent
  uint32_t max_n_ctx = 32768;  // the KV cells its contexts may have (PipelineBudget::n_ctx)
  bool exact = false;          // the server is exact (ServerOptions::exact)
  // The server's threads as its context runs them (n_threads,
  // n_threads_batch); 0: not limited. A pipeline that names none (or 0,
  // all cores) runs on these, and may name fewer, never more.
  int32_t n_threads = 0;
  int32_t n_threads_batch = 0;
};

// Parses a /v1/pipelines body: the JSON of a pipeline file
// (read_pipeline_json, parse_pipeline_json) that names no model and no
// file, since a request must never read the server's files. Throws
// Error(kInvalidArgument): "body: not JSON (...)", "body: must be a JSON
// object (got ...)", "model: ...", "document.file: ...", "agents: ..." for
// more than limits.max_agents (checked before any agent is read), "exact:
// ..." (exact: true, and limits.exact is not), "agents[i].max_tokens: ..."
// for the limit, "threads: ..." / "threads_batch: ..." for more than
// limits.n_threads / n_threads_batch, or what parse_pipeline_json throws,
// prefixed "body: ".
PipelineSpec parse_pipeline_request(std::string_view body, const PipelineLimits& limits);

// A /v1/pipelines body as what it asks for: a corpus when it has
// `documents` or an agent with `scope: corpus` (parse_corpus_json), else a
// pipeline (parse_pipeline_request). A corpus's documents are text only:
// Error(kInvalidArgument) "documents[i]: ..." for a file, glob or folder
// (the server's files), "documents: ..." for more than
// limits.max_documents (checked before any is read); its agents, reduce
// agents among them, are held to the same limits as a pipeline's.
using PostedRun = std::variant<PipelineSpec, CorpusSpec>;
PostedRun parse_posted_run(std::string_view body, const PipelineLimits& limits);

class PipelineRunner;

// One posted pipeline. Thread-safe.
class PipelineJob {
 public:
  PipelineJob(std::string id, PipelineSpec spec, PreparedPipeline prepared,
              const std::string& model);
  // A corpus: its view is a CorpusView, its events "document_done" and
  // "result" (or "error").
  PipelineJob(std::string id, CorpusSpec corpus, const std::string& model);

  // 32 hex digits, random (GET /runs/<id>): not to be guessed from another.
  const std::string& id() const noexcept { return id_; }
  // The next event, or nullopt after `timeout` without one.
  std::optional<PipelineEvent> next(std::chrono::milliseconds timeout) {
    return events_.next(timeout);
  }
  // Fails the agents still to run or running, at their next token, with
  // kAborted `why`; the "result" event still comes. Idempotent (the first
  // reason stays).
  void cancel(const std::string& why);
  // RunView::result now: the run as far as it got, or its result.
  nlohmann::json view() const;
  // Queued or running.
  bool going() const;
  RunSummary summary() const;

 private:
  friend class PipelineRunner;
  // Its worker took it: the view's clock starts.
  void begin();
  // Folds `event` into the view, then queues it for the poster.
  void push(PipelineEvent event);
  // Throws Error(kAborted) once cancelled.
  void check() const;
  double ms_since_start() const;  // guarded by view_mutex_

  const std::string id_;
  const std::chrono::system_clock::time_point accepted_ = std::chrono::system_clock::now();
  PipelineSpec spec_;                 // read by its worker; emptied when the run ended
  PreparedPipeline prepared_;         // prepare_pipeline(spec_): as spec_
  std::optional<CorpusSpec> corpus_;  // a corpus's run (spec_ unused): as spec_
  EventQueue<PipelineEvent> events_;
  mutable std::mutex mutex_;
  std::string why_;  // guarded by mutex_
  std::atomic<bool> cancelled_{false};
  mutable std::mutex view_mutex_;
  std::variant<RunView, CorpusView> view_;                                // guarded by view_mutex_
  std::optional<std::chrono::steady_clock::time_point> started_, ended_;  // guarded by view_mutex_
};

struct PipelineStats {
  uint64_t runs = 0;       // accepted
  uint64_t cancelled = 0;  // runs a cancel stopped: in the prefill, or failing an agent
  int32_t running = 0;     // accepted, not ended
};

// Runs accepted pipelines on `max_running` worker threads of its own, each
// run with its own contexts on the shared model. Thread-safe.
class PipelineRunner {
 public:
  // Each run uses `snapshots` (RunOptions::snapshot); the last `keep` runs
  // stay viewable (recent(), find()). Throws Error(kInvalidArgument) for
  // max_running < 0, keep < 1 or a snapshot file.
  PipelineRunner(std::shared_ptr<const Model> model, int32_t max_running,
                 SnapshotOptions snapshots = {}, int32_t keep = 32);
  ~PipelineRunner();
  PipelineRunner(const PipelineRunner&) = delete;
  PipelineRunner& operator=(const PipelineRunner&) = delete;

  // Returns nullptr when max_running runs are accepted already (the caller
  // answers 429). Else checks `spec` against the model before anything runs
  // (prepare_pipeline, limits.max_n_ctx, check_memory): throws what they
  // throw, or Error(kBudget) "pipeline: needs n_ctx N, more than the M this
  // server allows (--max-pipeline-ctx)"; and returns the job, started.
  std::shared_ptr<PipelineJob> submit(PipelineSpec spec, const PipelineLimits& limits);
  // The same for a corpus: before anything runs, each document's pipeline
  // is prepared and checked as a pipeline's (the first that fails names
  // its document: "document 'x': pipeline: needs n_ctx ...") and the
  // reduce agents' budget (check_reduce_budget, capped at
  // limits.max_n_ctx). Its documents run one at a time.
  std::shared_ptr<PipelineJob> submit(CorpusSpec corpus, const PipelineLimits& limits);
  // The last `keep` runs accepted (RunnerOptions), newest first.
  std::vector<RunSummary> recent() const;
  // The run with this id among them, or nullptr.
  std::shared_ptr<const PipelineJob> find(std::string_view id) const;
  // Cancels every job (PipelineJob::cancel(why)) and joins the workers once
  // their runs ended; submit() then returns nullptr. Idempotent.
  void shutdown(const std::string& why);
  PipelineStats stats() const;
  int32_t max_running() const noexcept { return max_running_; }

 private:
  void work();
  // Runs `job`, pushing its events; returns the last ("result" or "error"),
  // which work() pushes once the job no longer counts as running.
  PipelineEvent run(PipelineJob& job);
  PipelineEvent run_corpus_job(PipelineJob& job);
  // max_running runs accepted already, or stopping.
  bool full() const;
  // Queues the job `make` builds from a new id; nullptr when full() by now.
  std::shared_ptr<PipelineJob> enqueue(
      const std::function<std::shared_ptr<PipelineJob>(std::string id)>& make);

  std::shared_ptr<const Model> model_;
  const int32_t max_running_;
  const SnapshotOptions snapshots_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<PipelineJob>> queue_;  // guarded by mutex_
  std::vector<std::shared_ptr<PipelineJob>> live_;  // accepted, not ended; guarded by mutex_
  const int32_t keep_;
  std::deque<std::shared_ptr<PipelineJob>>
      recent_;                        // newest first, at most keep_; guarded by mutex_
  uint64_t runs_ = 0;                 // guarded by mutex_
  uint64_t cancelled_ = 0;            // guarded by mutex_
  bool stopping_ = false;             // guarded by mutex_
  std::vector<std::thread> workers_;  // written by the constructor only
};

}  // namespace swarmkv::server
