// A posted pipeline's events, and what a viewer of the run sees: its typed
// result as far as it got (PipelineResult and RunProgress), which
// live_result_json writes for GET /v1/pipelines/<id> and run_page_html
// draws.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "swarmkv/corpus.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"

namespace swarmkv::server {

// One event of a run: its kind (the server-sent event's name, to_string)
// and data.
struct PipelineEvent {
  enum class Kind {
    kPrefill,       // "prefill" {"done", "total"}: the document's prefill, after each chunk
    kAgentStarted,  // "agent_started" {"agent"}
    // "token" {"agent", "token", "text"}: "text" is the answer's new text (a
    // stop string's possible start and a split character wait for a later
    // token, so the texts add up to the answer; what waited until the end
    // comes as one more event, "token": null)
    kToken,
    kAgentDone,  // "agent_done": agent_json() of its result (also for an agent that never ran)
    // "document_done" (a corpus): document_json() of a document that
    // finished, with its "index" in the corpus
    kDocumentDone,
    kResult,  // "result": result_json() of the run (a corpus: corpus_json()); the last event
    kError,   // "error": OpenAI's error body, when the run could not start; the last event
  };
  Kind kind = Kind::kPrefill;
  nlohmann::json data;
  std::optional<ErrorValue> error;  // kError only: what stopped the run

  // The run's last event (kResult or kError).
  bool last() const noexcept { return kind == Kind::kResult || kind == Kind::kError; }
};
std::string_view to_string(PipelineEvent::Kind kind) noexcept;

// A run folded from its events. Not thread-safe (PipelineJob locks it).
class RunView {
 public:
  // Every agent waiting; `model`: the name the result gives (no path).
  RunView(const PipelineSpec& spec, size_t prefix_tokens, std::string model);

  // The run started (queued until then).
  void begin() noexcept { progress_.state = RunState::kRunning; }
  // Folds `e` in, which came `at_ms` after the run started: an agent's
  // start, tokens and end move its entry on; kResult replaces the whole
  // view with the run's result, kError ends it failed. Nothing moves once
  // the run ended.
  void apply(const PipelineEvent& e, double at_ms);

  RunState state() const noexcept { return progress_.state; }
  size_t agents() const noexcept { return result_.agents.size(); }
  size_t agents_done() const noexcept { return done_; }
  const std::string& pipeline() const noexcept { return result_.pipeline; }

  // live_result_json of the run so far, `now_ms` after it started: while
  // it goes on, "total_ms" is now_ms and a running agent's "done_at_ms" too
  // (its bar reaches now).
  nlohmann::json result(double now_ms) const;

 private:
  // The agent `name` names (a JSON string), or Error(kInternal).
  size_t agent(const nlohmann::json& name) const;

  PipelineResult result_;  // the run so far, or its final result
  RunProgress progress_;
  size_t done_ = 0;
};

// A posted corpus folded from its events: corpus_json()'s shape with the
// documents done so far (in the order they finished) and "state", then
// the run's result. Not thread-safe (PipelineJob locks it).
class CorpusView {
 public:
  CorpusView(const CorpusSpec& corpus, std::string model);
  void begin() noexcept { state_ = RunState::kRunning; }
  // kDocumentDone adds its document; kResult replaces the view with the
  // result, kError ends it failed. Nothing moves once the run ended.
  void apply(const PipelineEvent& e, double at_ms);
  RunState state() const noexcept { return state_; }
  // Per-document agents times documents, plus the reduce agents.
  size_t agents() const noexcept { return agents_; }
  size_t agents_done() const noexcept { return done_; }
  const std::string& pipeline() const noexcept { return pipeline_; }
  // The corpus so far, `now_ms` after it started ("total_ms").
  nlohmann::json result(double now_ms) const;

 private:
  std::string pipeline_;
  nlohmann::json view_;  // corpus_json()'s keys; the result once it came
  RunState state_ = RunState::kQueued;
  size_t agents_ = 0;
  size_t done_ = 0;
};

}  // namespace swarmkv::server
