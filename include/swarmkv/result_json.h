// The one JSON schema of pipeline results: `swarmkv run --json` prints
// result_json(), the bench nests agent_json() and memory_json() in its arms,
// and later the server and workers answer with them. Bump
// kResultSchemaVersion on any change a reader would notice (a key renamed,
// removed or retyped); adding a key is not one.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"

namespace swarmkv {

inline constexpr int kResultSchemaVersion = 2;

// null when ok, else {"code": "<stable code name>", "message": "..."}.
nlohmann::json error_json(const std::optional<ErrorValue>& error);
// What error_json wrote (nullopt for null); throws nlohmann::json::exception
// or Error(kCorruption) for anything else.
std::optional<ErrorValue> error_from_json(const nlohmann::json& j);
// An answer's logprobs (AgentResult::logprobs, Generation::logprobs): null
// when empty, else one entry per token: {"token" (id), "text" (its piece),
// "logprob", "top_logprobs": [{"token", "text", "logprob"}, ...]}.
nlohmann::json logprobs_json(const std::vector<SampledLogprobs>& tokens);
// {"wait", "context", "prefill", "fork", "restore", "prompt", "first_token",
//  "generate", "total", "done_at"}, milliseconds (AgentTimings).
nlohmann::json timings_json(const AgentTimings& t);
// {"name", "status", "error", "answer", "n_tokens", "tokens", "stop_reason",
//  "prompt_tokens", "prompt_rendered", "started_at_ms", "first_token_at_ms",
//  "done_at_ms", "token_at_ms", "timings_ms", "worker", "depends_on",
//  "fork_from", "needs"} ("worker": the swarmkv worker that ran it under run
//  --redis, else null; the *_at_ms from the run's start; "depends_on" [names],
//  "fork_from" a name or null and "needs" (needs_json) as its AgentSpec says).
// "stop_reason" is null unless the agent's status is ok. "token_at_ms": when
// each of "tokens" was sampled, from the run's start.
nlohmann::json agent_json(const AgentResult& a);
// The AgentResult that agent_json wrote ("n_tokens" is not read; a null
// "stop_reason" reads as max_tokens). Throws Error(kCorruption): "unknown
// status 'x'" (also code, stop_reason), "a result does not parse: ..." for a
// missing key or a wrong type.
AgentResult agent_from_json(const nlohmann::json& j);

// `j` as indented text. Bytes that are not valid UTF-8 (an answer that
// max_tokens cut inside a character, a name read from a Latin-1 file)
// become U+FFFD instead of failing the whole output.
std::string dump_json(const nlohmann::json& j);
// null under kNone, else {"source": "prefill"|"cache"|"file"|"redis", "key",
//  "path", "reused_tokens", "prefilled_tokens", "bytes", "load_ms",
//  "verify_ms", "published", "discarded": [error_json...]}.
nlohmann::json snapshot_json(const std::optional<SnapshotUse>& s);
// {"contexts", "kv_cells_peak", "kv_bytes_per_cell", "kv_bytes_peak",
//  "kv_bytes_allocated", "host_buffer_bytes"}.
nlohmann::json memory_json(const PipelineResult& r);
// {"flash_attn", "kv_type", "n_batch", "n_ubatch", "threads", "threads_batch",
//  "n_gpu_layers" (asked), "offloaded_layers" (on a GPU: Model::offloaded_layers)}.
nlohmann::json engine_json(const ContextOptions& options, int32_t n_gpu_layers,
                           int32_t offloaded_layers);
// {"agents", "queue_ms", "ttft_ms", "inter_token_ms", "completion_ms"}, each
// of the last four {"p50", "p95", "p99"}.
nlohmann::json latency_json(const LatencySummary& latency);
// The whole result: "schema_version", "pipeline" (its name), "model" (the
// file), "fork", "guard" (null without branch workers),
// "ok", "engine" (engine_json), "n_ctx", "n_seq_max", "prefix_tokens", "document_prefills",
// "snapshot_bytes", "snapshot" (snapshot_json), "prepare_ms", "prefill_done_at_ms",
// "latency" (latency_json of latency_summary), "prefill_ms",
// "export_ms", "restore_ms", "branch_buffer_ms", "total_ms", "memory", "decode_steps" (count),
// "document" {"status", "error"}, "agents" [agent_json...], "transfer" (run
// --redis: {"bytes", "publish_ms", "fetch_ms", "fetches"}, else null).
nlohmann::json result_json(const PipelineResult& r);

// ----------------------------------------------------------- a run going on

// Where a run stands (a served run: `swarmkv serve`'s view of it).
enum class RunState { kQueued, kRunning, kOk, kFailed };
std::string_view to_string(RunState state) noexcept;  // "queued", "running", "ok", "failed"

// Where one agent of a run stands; kDone: its AgentResult holds its outcome.
enum class AgentPhase { kWaiting, kRunning, kDone };
std::string_view to_string(AgentPhase phase) noexcept;  // "waiting", "running", "done"

// A run as far as it got, beside its PipelineResult so far.
struct RunProgress {
  RunState state = RunState::kQueued;
  size_t prefill_done = 0;          // the document's tokens prefilled so far
  size_t prefill_total = 0;         // of these; 0 until the first prefill chunk
  std::optional<ErrorValue> error;  // why the run could not start (state kFailed)
  std::vector<AgentPhase> agents;   // one per agent of the result
  // The result is the run's own: it ended with one (ok or failed, no error
  // of its own).
  bool has_result() const noexcept {
    return state == RunState::kOk || (state == RunState::kFailed && !error);
  }
  bool going() const noexcept { return state == RunState::kQueued || state == RunState::kRunning; }
  bool operator==(const RunProgress&) const = default;
};

// A run going on as result_json() writes it, "live" added:
// {"state", "prefill_done", "prefill_total", "error" (only when set:
// error_json)}. Until the run has its result (RunProgress::has_result) only
// what is known is written: "pipeline", "model", "fork", "exact",
// "prefix_tokens", "agents", "prefill_ms" and "prefill_done_at_ms" once a
// prefill chunk is done, "total_ms" while it goes on; an agent that is not
// done has "status" "waiting" or "running" and only "name", "status",
// "answer", "n_tokens", "tokens", "token_at_ms", "started_at_ms",
// "first_token_at_ms", "done_at_ms", "depends_on", "fork_from", "needs".
nlohmann::json live_result_json(const PipelineResult& r, const RunProgress& progress);

// What result_from_json read.
struct ResultRead {
  PipelineResult result;
  std::optional<RunProgress> live;  // the result had "live": a run going on
  std::vector<std::string> keys;    // the keys the result had, for readers that tell missing apart
  bool has(std::string_view key) const;
};

// The result that result_json() or live_result_json() wrote, or a saved
// `run --json` of any version: a key it lacks leaves its field at the
// default (but each agent's "name" and "status"). result_json of what it
// read gives back the JSON it read (a result_json one): "decode_steps" is
// a count (the steps come back default) and "memory" and "latency" are
// computed again. Throws Error(kCorruption): "the result is not a JSON
// object (not a swarmkv run --json result?)", "the result has no 'agents'
// (...)", "the result's 'agents' is not a list", "the result has no 'name'
// in agent 0 (...)" (also 'status'), "agent N of the result does not read:
// <why>" (a key with another type, an unknown status or code), "the result
// does not read: <why>".
ResultRead result_from_json(const nlohmann::json& j);

// The depth of each agent in the result's graph: the document is 0, an
// agent one more than the deepest agent it waits on (depends_on,
// fork_from). A name it does not know, or an edge that closes a cycle (a
// hand-edited file), counts as the document.
std::vector<int> agent_depths(const std::vector<AgentResult>& agents);

}  // namespace swarmkv
