// Prefill once, run agents on other machines: Redis carries the document's
// snapshot (the snapshot bus) and the agents (the job queue) to `swarmkv
// worker` processes; `swarmkv run --redis` is the coordinator.
//
// Keys (docs/cluster.md has the whole protocol):
//   swarmkv:snap:<key>                 the manifest (JSON), written last, SET NX
//   swarmkv:snap:<key>:<upload>:<i>    chunk i of one publisher's upload
//   swarmkv:jobs:<model sha256>        the job stream; consumer group "workers"
//   swarmkv:worker:<model sha256>:<name>  a worker's heartbeat (expires)
//   swarmkv:run:<run>:spec             the run's pipeline (JSON)
//   swarmkv:run:<run>:results          the run's result stream
// Every key expires: snapshots after BusOptions::ttl_s (each run that uses
// one renews it), a run's keys an hour after its last write.
//
// Thread rules: the functions are thread-safe as long as each thread passes
// its own redis::Client.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "swarmkv/engine.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/redis.h"

namespace swarmkv::cluster {

// The cluster's shared secret. With one, every message the cluster code
// writes is signed with it (HMAC-SHA256): the coordinator's jobs and run
// specs, the workers' results and heartbeats, and the snapshot manifests,
// which then carry a SHA-256 of every chunk (XXH3 catches accidents, not
// forgeries); every message read is checked first, and one that is unsigned
// or signed with another key is refused (Error(kUnauthenticated) naming it,
// or a logged refusal where nobody waits for an answer). Without one the
// cluster runs unauthenticated: signatures are neither written nor looked
// at. Thread-compatible; copies share nothing.
class ClusterKey {
 public:
  ClusterKey() = default;  // none
  // Throws Error(kInvalidArgument) for a secret under 16 bytes.
  explicit ClusterKey(std::string secret);
  // A key file's bytes, one trailing newline dropped (`openssl rand -hex 32
  // > key` makes one). Throws Error(kNotFound), Error(kIo), and what the
  // constructor throws.
  static ClusterKey from_file(const std::string& path);
  // The command line's key: from_file(file) when one is named, else the
  // bytes of $SWARMKV_CLUSTER_KEY when set, else none.
  static ClusterKey resolve(const std::string& file);

  bool empty() const noexcept { return secret_.empty(); }
  // A public name of the key (16 hex digits of sign("swarmkv key id")),
  // which tells keys apart without revealing them; "" without a key.
  std::string id() const;
  // The HMAC-SHA256 of `message` in lower-case hex; "" without a key.
  std::string sign(std::string_view message) const;
  // Whether `signature` is sign(message), compared in constant time.
  bool verifies(std::string_view message, std::string_view signature) const;

 private:
  std::string secret_;
};

struct BusOptions {
  uint64_t chunk_bytes = 4ull << 20;  // one GET/SET per chunk
  int64_t ttl_s = 24 * 3600;          // a snapshot no run used for this long expires
  ClusterKey cluster_key;             // signs what is published, checks what is read
};

// What the bus holds for one snapshot key.
struct Manifest {
  std::string key;
  std::string upload;  // the publisher's upload id: its chunks' key part
  uint64_t bytes = 0;  // the whole snapshot file
  uint64_t chunk_bytes = 0;
  std::vector<uint64_t> chunk_xxh3;  // XXH3-64 of each chunk
  std::string producer;
  int64_t created_unix = 0;
  // Signed manifests (a cluster key): the SHA-256 of each chunk, in hex,
  // and the signature of all the rest. Empty when unsigned.
  std::vector<std::string> chunk_sha256;
  std::string sig;
};

// A manifest as the bus holds it (JSON: key, upload, bytes, chunk_bytes,
// chunk_xxh3, producer, created_unix; chunk_sha256 and sig when signed),
// and back. manifest_from_json throws
// Error(kCorruption) "the manifest of snapshot <key> is damaged: <why>" for
// text that does not parse, another key, or sizes no chunk list bears out
// (chunk_bytes 0 or above 512 MiB, one Redis string; a chunk count other
// than bytes / chunk_bytes rounded up).
std::string manifest_to_json(const Manifest& manifest);
Manifest manifest_from_json(std::string_view text, const std::string& key);

struct PublishReport {
  // false: another publisher's copy was complete first (SET NX lost); its
  // manifest is what readers see, this upload's chunks were removed.
  bool published = false;
  uint64_t bytes = 0;
  size_t chunks = 0;
  double ms = 0;
};

// How publish_snapshot treats a manifest already there.
enum class Publish {
  kIfAbsent,  // SET NX: an existing copy wins
  // Replace it atomically (a damaged copy): readers see the old manifest or
  // the new one, never none; the old chunks expire a minute later, so a
  // fetch in progress can finish.
  kReplace,
};

// Publishes a snapshot file's bytes under `key`: chunks first (each with its
// TTL, under a key part of this upload's own), the manifest last, so readers
// see the whole snapshot or none, and two publishers of one key do not
// clash. Throws Error(kIo).
PublishReport publish_snapshot(redis::Client& redis, const std::string& key,
                               std::span<const uint8_t> file, const BusOptions& options = {},
                               Publish mode = Publish::kIfAbsent);

// The manifest of `key`, or nullopt. Throws Error(kIo), Error(kCorruption)
// for a manifest that does not parse, Error(kUnauthenticated) under a
// cluster key for one unsigned, signed with another key, or without its
// chunks' SHA-256.
std::optional<Manifest> find_snapshot(redis::Client& redis, const std::string& key,
                                      const ClusterKey& cluster_key);

// Renews the TTL of the manifest and its chunks. Throws Error(kIo).
void touch_snapshot(redis::Client& redis, const Manifest& manifest, int64_t ttl_s);

struct FetchReport {
  uint64_t bytes = 0;
  double ms = 0;
  int refetched_chunks = 0;  // chunks that failed their checksum once and were read again
};

// The snapshot file of `key`, every chunk checked against the manifest; a
// chunk that fails is read once more. A missing manifest or chunk (a
// coordinator publishing it again after a Redis restart) is looked for
// again after 0.5 s, 1 s and 2 s. Throws Error(kNotFound) when the bus has
// no such key, Error(kCorruption) naming the chunk that failed twice or a
// chunk that is missing (expired), Error(kIo); under a cluster key what
// find_snapshot throws, and Error(kUnauthenticated) naming a chunk whose
// SHA-256 is not its signed manifest's.
std::vector<uint8_t> fetch_snapshot(redis::Client& redis, const std::string& key,
                                    const ClusterKey& cluster_key, FetchReport* report = nullptr);

struct WorkerOptions {
  std::string name;  // empty: <hostname>-<pid>
  // The most agents one local run takes; a larger job runs in slices. 0: all.
  int max_agents = 0;
  // A job pending this long on a worker that stopped renewing it is claimed
  // by another (XAUTOCLAIM); a worker renews its job every heartbeat.
  double visibility_timeout_s = 30;
  double heartbeat_s = 1;  // the worker's key lives 5 heartbeats
  int32_t n_threads = 0;   // its contexts' threads; 0 = all cores
  std::string cache_dir;   // its local snapshot store (empty: the default)
  uint64_t cache_max_bytes = 0;
  // Set (by a signal handler): finish and acknowledge the job in hand, then return.
  const std::atomic<bool>* stop = nullptr;
  uint64_t max_jobs = 0;  // return after this many jobs (0: run until stopped)
  // Jobs, run specs and manifests not signed with it are refused; results,
  // heartbeats and manifests are signed with it. Empty: unauthenticated.
  ClusterKey cluster_key;
};

struct WorkerReport {
  uint64_t jobs = 0;
  uint64_t agents = 0;
  uint64_t claimed_stale = 0;  // jobs taken over from a worker that stopped renewing them
  uint64_t fetches = 0;        // snapshots fetched from the bus (not found in the local store)
};

// Serves jobs for `model` until options.stop is set (or max_jobs). A Redis
// that goes away is waited for, however long (reconnecting with backoff,
// logged), and the worker goes on where it was once it is back; stopped
// meanwhile, it returns (the job in hand stays pending for another worker).
// Throws Error(kIo) for Redis refusing a command.
WorkerReport run_worker(const redis::Url& url, const std::shared_ptr<const Model>& model,
                        const WorkerOptions& options);

struct CoordinatorOptions {
  // The whole run; then Error(kIo) naming the unanswered agents. A Redis
  // outage is ridden out within it (reconnecting with backoff, logged).
  double timeout_s = 600;
  // A snapshot the coordinator publishes itself (run.snapshot.file; a
  // worker's prefill job publishes with the defaults) and the TTL it renews.
  // Its cluster_key signs the run's spec and jobs, and only workers whose
  // heartbeat and results bear it count.
  BusOptions bus;
  // run.snapshot.file: a snapshot file to publish instead of a worker's
  // prefill; the rest is the runner's (guard, callbacks).
  RunOptions run;
  // Agents per job, in submission order; 0: the ready agents cut into one
  // job per live worker, of about equal cost (prompt tokens + max_tokens:
  // split_by_cost), so that no worker gets every long answer.
  int agents_per_job = 0;
};

// The live workers (fresh heartbeats, signed with `cluster_key` when it is
// set) serving `model` with exact mode `exact`. Throws Error(kIo) for Redis.
size_t count_live_workers(const redis::Url& url, const Model& model, bool exact,
                          const ClusterKey& cluster_key);

// Runs `spec` on the workers holding `model`: run_pipeline with the
// coordinator as its AgentExecutor. The snapshot from Redis, else from a
// worker's prefill job (the worker takes it from its store or prefills it,
// and publishes it), or the file options.run.snapshot.file names; agents
// enqueued as their dependencies finish, one result kept per agent. The
// coordinator never decodes: `model` may be loaded metadata-only
// (ModelOptions::metadata_only, as `run --redis` does). The result is a local
// run's plus AgentResult::worker and PipelineResult::transfer. Throws
// Error(kNotFound) when no live worker holds the model, Error(kIo) for Redis
// and for the timeout, and what prepare_pipeline throws; agents' failures
// are in the result.
PipelineResult run_distributed(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                               const redis::Url& url, const CoordinatorOptions& options);

}  // namespace swarmkv::cluster
