// The messages the coordinator and the workers post on Redis streams
// (docs/cluster.md), each with its encoding, both ways, in wire.cpp only:
// nothing else writes or reads one of their fields. Every function here is
// pure (no Redis, no log) and thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cluster/keys.h"
#include "swarmkv/cluster.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::cluster {

// The fields of a stream entry, in the order XADD writes them (xadd()).
using EntryFields = std::vector<std::pair<std::string, std::string>>;

// A job on keys::jobs(pool): either a prefill job (the run's document made
// and published as a snapshot; the coordinator never decodes) or an agent
// job (agents run from the document's snapshot). Fields: "run", "snapshot",
// then "prefill" ("replace" | "if_absent") for a prefill job, or "agents" (a
// JSON array of names), "prompts" and "rerun" (JSON objects, absent when
// empty) for an agent job.
struct JobMessage {
  std::string id{};   // the stream entry's id: set by decoding (XADD makes it), not encoded
  std::string run{};  // the run's id (keys::run_spec, keys::run_results)
  // The document's snapshot key ("" for a run without one). A prefill job
  // always has one; an agent job whose fork mode restores no prefix state
  // may lack it (snapshot_key() throws then).
  std::optional<std::string> snapshot{};
  // Set: a prefill job, published with this mode (kReplace: a damaged copy
  // is on the bus). Unset: an agent job.
  std::optional<Publish> prefill{};
  // An agent job's agents in pipeline order, the ancestors of its fork_from
  // children (run again) among them.
  std::vector<std::string> agents{};
  // Agent -> its prompt with placeholders rendered from upstream answers.
  std::map<std::string, std::string> prompts{};
  // Ancestor run again -> the tokens of its first answer, which the worker
  // checks against its own and does not post again.
  std::map<std::string, std::vector<Token>> reruns{};

  // *snapshot, or Error(kCorruption) "job <id> has no 'snapshot' field".
  const std::string& snapshot_key() const;
  bool operator==(const JobMessage&) const = default;
};

EntryFields job_fields(const JobMessage& job);

// Decoding. A worker reads a job in steps, in the order its answer to a job
// wrong in several ways depends on (the run first, with which it can answer
// at all; then the agents, which it can fail; then the rest); each step
// throws Error(kCorruption) naming the job and the field:
//   job_run: "job <id> has no 'run' field";
//   job_agents: "job <id> has no 'agents' field", "job <id>: 'agents' is not
//     a JSON array of agent names (it is '<its first 200 bytes>')";
//   job_from_entry: the whole message: job_run; for a prefill job its
//     snapshot; for an agent job job_agents, then "'prompts' is not a JSON
//     object ...", "'prompts' has an entry for ...", then "'rerun' ...".
std::string job_run(const StreamEntry& entry);
std::vector<std::string> job_agents(const StreamEntry& entry);
JobMessage job_from_entry(const StreamEntry& entry);
// For a log line about an entry refused unread: its "run", cut to 100
// bytes; "" without one.
std::string job_run_shown(const StreamEntry& entry);
// A prefill job (it has a "prefill" field), else an agent job.
bool is_prefill_job(const StreamEntry& entry);

// A prefill job's report: the result entry of agent "".
struct PrefillOutcome {
  std::optional<ErrorValue> error{};  // why the document's snapshot is not on the bus
  double prefill_ms = 0;              // 0: the worker had it in its store
  double publish_ms = 0;
  uint64_t bytes = 0;  // the snapshot file's
  bool operator==(const PrefillOutcome&) const = default;
};

// An entry on keys::run_results(run): an agent's result or, agent "" and
// `prefill` set, a prefill job's report. Fields: "agent", "worker", "job",
// then "fetch_bytes", "fetch_ms" (3 decimals), "snapshot_unavailable"
// ("1" | "0"), "result" (agent_json) for an agent, or "prefill"
// (error_json), "prefill_ms", "publish_ms" (3 decimals), "bytes" for a
// report.
struct ResultEntry {
  std::string id{};  // the stream entry's id: set by decoding, not encoded
  std::string agent{};
  std::string worker{};
  std::string job{};  // the job's stream id
  // An agent's (agent not ""): its result, `worker` in result.worker.
  AgentResult result{};
  uint64_t fetch_bytes = 0;           // the job's snapshot as fetched from the bus; 0: none
  double fetch_ms = 0;                // read only where fetch_bytes is not 0
  bool snapshot_unavailable = false;  // the bus's copy was missing or damaged
  std::optional<PrefillOutcome> prefill{};
  // Decoding only: each figure that is not a number >= 0, counted as 0, as
  // "<field> '<its first 40 bytes>'" (a figure is not worth the run).
  std::vector<std::string> bad_figures{};
  bool operator==(const ResultEntry&) const = default;
};

EntryFields result_fields(const ResultEntry& entry);
// Never throws: a field missing is "" (a figure 0, in bad_figures); a
// "result" that agent_from_json refuses is a failed result of that agent,
// Error(kCorruption) "the result from worker '<worker>' does not parse:
// ..."; a "prefill" that error_from_json refuses is the report's error,
// kCorruption "its report does not parse: ..." (its figures then unread).
ResultEntry result_from_entry(const StreamEntry& entry);

// The entry keys::dead_letters(pool) gets for a job that no worker
// finished: "job" (its id), "deliveries", "worker" (the one that gave up
// on it), "reason", and the job's own fields as "job.<field>".
EntryFields dead_letter_fields(const StreamEntry& job, int64_t deliveries,
                               const std::string& worker, const std::string& reason);

}  // namespace swarmkv::cluster
