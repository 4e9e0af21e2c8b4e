// The one JSON schema of pipeline results: `swarmkv run --json` prints
// result_json(), the bench nests agent_json() and memory_json() in its arms,
// and later the server and workers answer with them. Bump
// kResultSchemaVersion on any change a reader would notice (a key renamed,
// removed or retyped); adding a key is not one.
#pragma once

#include <optional>

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

}  // namespace swarmkv
