// The cluster's Redis key names and what its messages carry
// (docs/cluster.md): one place for the coordinator and the worker.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarmkv/cluster.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/redis.h"

namespace swarmkv::cluster {

namespace keys {
inline std::string snapshot(const std::string& key) {
  return "swarmkv:snap:" + key;
}
// The workers that can run a job: same model file, same kernels (a job of
// an exact run goes to workers whose model has batch-invariant kernels
// only, so that no worker has to refuse it and hand it on), same cluster
// key (ClusterKey::id; none: unauthenticated), so that a worker holding
// another key never takes, and refuses, a job meant for the others. The
// key's part comes before the kernels', so that no pool's name is the
// start of another's (a SCAN of one pool's workers matches no other's).
inline std::string pool(const std::string& model_sha256, bool exact, const std::string& key_id) {
  return model_sha256 + (key_id.empty() ? "" : ":k" + key_id) + (exact ? ":exact" : ":stock");
}
inline std::string jobs(const std::string& pool) {
  return "swarmkv:jobs:" + pool;
}
inline constexpr const char* kWorkersGroup = "workers";
inline std::string worker(const std::string& pool, const std::string& name) {
  return fmt::format("swarmkv:worker:{}:{}", pool, name);
}
// Jobs that no worker finished in kMaxDeliveries deliveries (each worker
// that took one stopped or died in it), with why: never run again.
inline std::string dead_letters(const std::string& pool) {
  return "swarmkv:dead:" + pool;
}
inline constexpr int64_t kMaxDeliveries = 3;
inline std::string run_spec(const std::string& run) {
  return "swarmkv:run:" + run + ":spec";
}
inline std::string run_results(const std::string& run) {
  return "swarmkv:run:" + run + ":results";
}
inline constexpr int64_t kRunTtlS = 3600;
// The field (of a stream entry) or member (of a JSON message) that carries
// its signature under a cluster key.
inline constexpr const char* kSignatureField = "sig";
}  // namespace keys

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A stream entry: its id and its fields.
struct StreamEntry {
  std::string id;
  std::map<std::string, std::string> fields;
};
// The entries of a list of stream entries ([[id, [field, value, ...]], ...]):
// an XREAD / XREADGROUP reply's per-stream list, or XAUTOCLAIM's second element.
std::vector<StreamEntry> stream_entries(const redis::Reply& list);

// Signatures under a cluster key (cluster_key.cpp). Each kind of message
// signs a text of its own that names where it lives (the stream, the Redis
// key), so that one cannot pass for another: an entry its stream and its
// fields but the signature, sorted; a JSON message its key and its JSON but
// the signature. Without a key nothing is signed and nothing refused.
std::string entry_signed_text(const std::string& stream,
                              const std::map<std::string, std::string>& fields);
// XADD <stream> MAXLEN ~ <max_len> * <fields...> [sig <signature>].
std::vector<std::string> xadd(const ClusterKey& key, const std::string& stream, int64_t max_len,
                              const std::vector<std::pair<std::string, std::string>>& fields);
// nullopt: the entry may be used; else why it may not ("it is unsigned",
// "it is signed with another cluster key").
std::optional<std::string> entry_refusal(const ClusterKey& key, const std::string& stream,
                                         const StreamEntry& entry);
// Sets `doc`'s "sig" member (removes it without a key).
void sign_json(const ClusterKey& key, const std::string& where, nlohmann::json& doc);
// As entry_refusal, for a JSON message read from `where`; removes its "sig".
std::optional<std::string> json_refusal(const ClusterKey& key, const std::string& where,
                                        nlohmann::json& doc);
// Redis's clock (TIME) in milliseconds: the one clock that a worker stamping
// its heartbeat and a coordinator judging it both read, whatever their own
// machines' clocks say. Throws Error(kIo).
int64_t redis_time_ms(redis::Client& redis);
// A signed heartbeat carries the Redis time it was written at
// (kHeartbeatAtField) and how long it lives (kHeartbeatTtlField), inside its
// signature: a coordinator refuses one older than that, so that a beat copied
// from a worker now dead and written again (a replay) does not keep it live.
inline constexpr const char* kHeartbeatAtField = "beat_ms";
inline constexpr const char* kHeartbeatTtlField = "ttl_ms";
// nullopt: a signed heartbeat `doc` (signature checked) is fresh at Redis
// time `now_ms`; else why not.
std::optional<std::string> stale_heartbeat(const nlohmann::json& doc, int64_t now_ms);
// SHA-256 in lower-case hex: what a signed manifest holds per chunk.
std::string sha256_hex(std::string_view bytes);

// XGROUP CREATE <stream> workers 0 MKSTREAM, an existing group kept (the
// coordinator may enqueue before any worker started). Throws Error(kIo).
void ensure_job_group(redis::Client& redis, const std::string& stream);

// The run's pipeline as the workers need it: {"pipeline": the pipeline
// file's JSON (pipeline_json) without the worker's own settings (model,
// threads, threads_batch), "document_source", "guard"}.
nlohmann::json spec_to_json(const PipelineSpec& spec, GuardPolicy guard);
// Throws Error(kCorruption) "a pipeline message does not parse: ..." for a
// message that does not parse or whose pipeline parse_pipeline refuses.
PipelineSpec spec_from_json(const nlohmann::json& j, GuardPolicy* guard);

}  // namespace swarmkv::cluster
