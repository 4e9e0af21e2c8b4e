// A posted pipeline's events, and what a viewer of the run sees: its result
// as far as it got, in result_json()'s shape, which run_page_html draws and
// GET /v1/pipelines/<id> answers.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::server {

// One event of a run: the server-sent event's name and data.
//   prefill        {"done", "total"}: the document's prefill, after each chunk
//   agent_started  {"agent"}
//   token          {"agent", "token", "text"}: "text" is the answer's new text
//                  (a stop string's possible start and a split character wait
//                  for a later token, so the texts add up to the answer; what
//                  waited until the end comes as one more event, "token": null)
//   agent_done     agent_json() of its result (also for an agent that never ran)
//   result         result_json() of the run: the last event
//   error          OpenAI's error body, when the run could not start: the last event
struct PipelineEvent {
  std::string name;
  nlohmann::json data;
  std::optional<ErrorValue> error;  // "error" only: what stopped the run
};

// Where a run is.
enum class RunState { kQueued, kRunning, kOk, kFailed };
std::string_view to_string(RunState state) noexcept;

// A run folded from its events. Not thread-safe (PipelineJob locks it).
class RunView {
 public:
  // Every agent waiting; `model`: the name the result gives (no path).
  RunView(const PipelineSpec& spec, size_t prefix_tokens, std::string model);

  // The run started (queued until then).
  void begin() noexcept { state_ = RunState::kRunning; }
  // Folds `e` in, which came `at_ms` after the run started: an agent's
  // start, tokens and end move its entry on; "result" replaces the whole
  // view with the run's result, "error" ends it failed.
  void apply(const PipelineEvent& e, double at_ms);

  RunState state() const noexcept { return state_; }
  size_t agents() const noexcept { return agents_; }
  size_t agents_done() const noexcept { return done_; }
  const std::string& pipeline() const noexcept { return pipeline_; }

  // The result so far, `now_ms` after the run started, with "live":
  // {"state", "prefill_done", "prefill_total", "error" (the run's own,
  // when it could not start: error_json)}. While it runs, "total_ms" is
  // now_ms and a running agent's "done_at_ms" too (its bar reaches now);
  // a waiting agent has "status": "waiting", a running one "running".
  // After "result": that result, "live" added.
  nlohmann::json result(double now_ms) const;

 private:
  nlohmann::json& agent(const nlohmann::json& name);

  nlohmann::json result_;  // the run so far, or its final result
  std::string pipeline_;
  RunState state_ = RunState::kQueued;
  size_t agents_ = 0;
  size_t done_ = 0;
  size_t prefill_done_ = 0, prefill_total_ = 0;
  std::optional<ErrorValue> error_;
};

}  // namespace swarmkv::server
