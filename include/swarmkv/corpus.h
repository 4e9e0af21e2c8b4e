// A corpus: the same agents over many documents, one document after
// another (each prefilled once and its agents forked from it, as
// run_pipeline does), then the reduce agents once over their answers.
// With an output folder each document's result is written as it finishes,
// and a run of the same corpus skips the documents already done there.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"

namespace swarmkv {

// Bump on any change a reader of corpus_json would notice.
inline constexpr int kCorpusSchemaVersion = 3;

struct DocumentOutcome;

// Where a corpus run stands, after each document (CorpusOptions::on_progress).
struct CorpusProgress {
  size_t done = 0;     // documents with an outcome (resumed ones included)
  size_t total = 0;    // documents in the corpus
  size_t resumed = 0;  // of `done`, taken from the output folder
  size_t failed = 0;   // of `done`, not ok
  size_t agents = 0;   // agents that have an answer, in the documents done
  double elapsed_ms = 0;
  std::string last;  // the document that just finished
  // Its index in the corpus and its outcome (valid during the call only).
  size_t index = 0;
  const DocumentOutcome* outcome = nullptr;
};

struct CorpusOptions {
  RunOptions run;  // each document's run (snapshot store, guard, prefill progress)
  // A folder for each document's result (created when missing): written
  // atomically as <out_dir>/documents/<n>.json when the document finishes;
  // one there whose key matches (the same document text, pipeline, model
  // and engine binding) is taken instead of running the document again.
  // Empty: none.
  std::string out_dir;
  // Called after each document, under a lock (one call at a time).
  std::function<void(const CorpusProgress&)> on_progress;
  // Called before each document is resumed or run; an Error it throws
  // becomes that document's error and the run goes on to the next (serve's
  // cancel: every document left fails at once with kAborted, the reduce
  // agents with kDependencyFailed).
  std::function<void()> before_document;
  // How one document's pipeline runs; empty: run_pipeline(spec, model,
  // run). `run --redis` passes the cluster's coordinator (run_distributed).
  // The reduce agents run with run_pipeline whatever it is.
  std::function<PipelineResult(const PipelineSpec&)> run_document;
  // Documents run at once, each on a thread of its own (0 counts as 1).
  // One locally: a document's run uses every core. On a cluster, as many
  // as there are workers: each document's prefill and agents are theirs.
  // Locally, above 1, memory bounds them too: a document waits until its
  // estimated memory (estimate_memory, with headroom) fits beside the
  // running ones' within `memory_budget`, unless none runs; so N at once
  // never ask for more than the machine had, and a tight machine runs
  // fewer at once rather than failing documents for memory.
  size_t documents_live = 1;
  // The memory documents_live > 1 shares locally; 0: what
  // available_memory() says when the corpus starts.
  uint64_t memory_budget = 0;
};

struct DocumentOutcome {
  std::string name;    // DocumentRef::name
  std::string source;  // DocumentRef::source()
  // Why the document did not run (it could not be read, its pipeline was
  // refused: a budget, needs.until not in it); then `result` is empty.
  std::optional<ErrorValue> error;
  std::optional<PipelineResult> result;
  bool resumed = false;  // taken from CorpusOptions::out_dir
  bool ok() const noexcept { return !error && result && result->ok(); }
};

struct CorpusResult {
  std::string pipeline;  // PipelineSpec::name
  std::string model;     // Model::path
  ForkMode fork = ForkMode::kShared;
  std::vector<DocumentOutcome> documents;  // in the corpus's order
  // The reduce agents' run (a pipeline without a document); its agents in
  // CorpusSpec::reduce's order, a reduce agent whose per-document answers
  // failed with kDependencyFailed. Empty without reduce agents.
  std::optional<PipelineResult> reduce;
  size_t documents_run = 0;      // documents run here (not resumed, not failed before running)
  size_t documents_resumed = 0;  // taken from the output folder
  // Locally with documents_live > 1: the most documents that ran at once
  // (memory may have held some back); else 0.
  size_t documents_live_peak = 0;
  double total_ms = 0;  // the whole run, model load excluded
  bool ok() const noexcept;
};

// Runs `corpus` (checked with validate_corpus first; Error for what it
// refuses) on `model`. Before any document runs, check_reduce_budget. A document that cannot be
// read, is refused or fails does not stop the others; a reduce agent that takes its answers fails
// with kDependencyFailed. Throws Error(kIo) when the output folder cannot be written.
CorpusResult run_corpus(const CorpusSpec& corpus, const std::shared_ptr<const Model>& model,
                        const CorpusOptions& options = {});

// The value of each corpus placeholder of the reduce agents' prompts
// (corpus_placeholder), from the documents' results: `{{a[*]}}` every
// document's answer in order, each after "### <name>\n" and separated by a
// blank line. A placeholder whose answers are missing (a failed document
// or agent, a field the answer lacks) is absent, and its error is in
// `failed` under the placeholder's text.
struct ReduceInputs {
  std::map<std::string, std::string> values;
  std::map<std::string, ErrorValue> failed;
};
ReduceInputs reduce_inputs(const CorpusSpec& corpus, const std::vector<DocumentOutcome>& documents);

// Before any document runs: a reduce agent whose prompt could outgrow the
// model's trained context (every answer it takes at its agent's
// max_tokens) throws Error(kBudget) "reduce agent 'r' may need N
// positions: ... > n_ctx_train T, the context the model was trained on
// ...". run_corpus calls it first. `server_n_ctx` > 0 (serve's
// --max-pipeline-ctx) caps it lower: "... > n_ctx N, the most this server
// allows (--max-pipeline-ctx) ...".
void check_reduce_budget(const CorpusSpec& corpus, const Model& model, uint32_t server_n_ctx = 0);

// One document's entry of corpus_json: {"name", "source", "ok", "resumed",
// "error" (error_json), "result" (result_json, or null when it did not run)}.
nlohmann::json document_json(const DocumentOutcome& d);

// {"schema_version": 3, "kind": "corpus", "pipeline", "model", "fork", "ok",
//  "documents_total", "documents_run", "documents_resumed", "documents_failed",
//  "total_ms", "documents": [{"name", "source", "ok", "resumed", "error"
//  (error_json), "result" (result_json, or null when it did not run)}],
//  "reduce" (result_json of the reduce run, or null)}.
nlohmann::json corpus_json(const CorpusResult& r);

}  // namespace swarmkv
