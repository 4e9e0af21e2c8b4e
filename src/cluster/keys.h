// The cluster's Redis key names and what its messages carry
// (docs/cluster.md): one place for the coordinator and the worker.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarmkv/pipeline.h"
#include "swarmkv/redis.h"

namespace swarmkv::cluster {

namespace keys {
inline std::string snapshot(const std::string& key) {
  return "swarmkv:snap:" + key;
}
// The workers that can run a job: same model file, same kernels (a job of
// an exact run goes to workers whose model has batch-invariant kernels
// only, so that no worker has to refuse it and hand it on).
inline std::string pool(const std::string& model_sha256, bool exact) {
  return model_sha256 + (exact ? ":exact" : ":stock");
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
