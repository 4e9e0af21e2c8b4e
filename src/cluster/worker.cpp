// `swarmkv worker`: takes jobs for its model from the job stream, runs their
// agents locally from the document's snapshot (fetched once, then kept in
// the local store), posts one result per agent and acknowledges the job.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "cluster/keys.h"
#include "cluster/wire.h"
#include "swarmkv/cluster.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/result_json.h"
#include "swarmkv/snapshot.h"

namespace swarmkv::cluster {
namespace {

std::string default_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "worker");
  return fmt::format("{}-{}", host, ::getpid());
}

// A job's deliveries so far (XPENDING's count: XREADGROUP and XAUTOCLAIM
// add one each, the heartbeat's JUSTID claims none). Past
// keys::kMaxDeliveries it goes to keys::dead_letters(pool) (its id, its
// fields as job.<field>, the count, this worker and the reason) and the
// error its agents fail with is returned; under it, nullopt. A worker that
// dies in a job, every time, thus cannot take the cluster down with it.
std::optional<ErrorValue> dead_letter(redis::Client& redis, const std::string& stream,
                                      const std::string& pool, const StreamEntry& job,
                                      const std::string& name, const ClusterKey& cluster_key) {
  const redis::Reply r =
      redis.try_command({"XPENDING", stream, keys::kWorkersGroup, job.id, job.id, "1"});
  if (r.is_error() || r.elements.empty() || r.elements[0].elements.size() < 4) return std::nullopt;
  const int64_t deliveries = r.elements[0].elements[3].integer;
  if (deliveries <= keys::kMaxDeliveries) return std::nullopt;
  const std::string dead = keys::dead_letters(pool);
  ErrorValue e{ErrorCode::kAborted,
               fmt::format("job {} was delivered {} times and no worker finished it (each one "
                           "stopped or died in it): not run again; it is in {}",
                           job.id, deliveries, dead)};
  // Not recorded (the key holds another type): the job still fails, logged.
  if (const redis::Reply added = redis.try_command(
          xadd(cluster_key, dead, 10000, dead_letter_fields(job, deliveries, name, e.message)));
      added.is_error())
    log_warn("worker {}: could not add job {} to {}: {}", name, job.id, dead, added.str);
  log_warn("worker {}: {}", name, e.message);
  return e;
}

// The pipeline of `run_id` as Redis holds it, its signature checked under
// a cluster key (and removed); nullopt when the run has none (finished,
// expired). Throws Error(kUnauthenticated) for one the key refuses, what
// the JSON parser throws for one that does not parse, Error(kIo).
std::optional<nlohmann::json> run_spec_message(redis::Client& redis, const std::string& run_id,
                                               const ClusterKey& cluster_key) {
  const std::string where = keys::run_spec(run_id);
  const redis::Reply s = redis.command({"GET", where});
  if (s.is_nil()) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(s.str);
  if (const std::optional<std::string> why = json_refusal(cluster_key, where, doc)) {
    throw Error(ErrorCode::kUnauthenticated,
                fmt::format("the pipeline of run {} in Redis is refused: {}", run_id, *why));
  }
  return doc;
}

// The ancestors a job ran again (`reruns`, with their first answers) leave
// `results`: the run has their answers. A child whose ancestor answered
// otherwise this time (a run without exact mode: near-ties) or failed fails
// too, saying so: its conversation is not the one the run reported.
void settle_reruns(const PipelineSpec& run, const std::map<std::string, std::vector<Token>>& reruns,
                   std::vector<AgentResult>& results) {
  std::map<std::string, std::string> differs;  // ancestor -> how
  for (const AgentResult& a : results) {
    const auto first = reruns.find(a.name);
    if (first == reruns.end()) continue;
    if (a.status != NodeStatus::kOk) {
      differs[a.name] = "failed when run again";
    } else if (a.tokens != first->second) {
      differs[a.name] = fmt::format("answered otherwise when run again (from token {} on)",
                                    common_prefix(a.tokens, first->second));
    }
  }
  std::vector<AgentResult> kept;
  for (AgentResult& a : results) {
    if (reruns.count(a.name) > 0) continue;
    const std::optional<size_t> self = run.agent_index(a.name);
    for (std::optional<size_t> p = self ? run.agent_index(run.agents[*self].fork_from)
                                        : std::nullopt;
         p && a.status == NodeStatus::kOk; p = run.agent_index(run.agents[*p].fork_from)) {
      const auto d = differs.find(run.agents[*p].name);
      if (d == differs.end()) continue;
      a.status = NodeStatus::kFailed;
      a.error = ErrorValue{
          ErrorCode::kIncompatible,
          fmt::format("agent '{}' continues the conversation of '{}', which its worker ran again "
                      "and which {}: without exact mode a re-run may differ at near-ties; run "
                      "exact, or without --redis",
                      a.name, d->first, d->second)};
    }
    kept.push_back(std::move(a));
  }
  results = std::move(kept);
}

// A worker's connection rides out any Redis outage: it reconnects until
// Redis is back or `stop` is set.
redis::ClientOptions riding_out(const std::atomic<bool>* stop) {
  redis::ClientOptions o;
  o.reconnect_for_s = std::numeric_limits<double>::infinity();
  o.stop = stop;
  return o;
}

// The worker's heartbeat on its own connection: its key, and the idle time
// of the job in hand reset so that no other worker claims it.
// Under a cluster key each beat is signed afresh with the Redis time it is
// written at (stale_heartbeat).
class Heartbeat {
 public:
  Heartbeat(const redis::Url& url, std::string worker_key, std::string stream, std::string name,
            nlohmann::json info, const ClusterKey& cluster_key, double period_s)
      : redis_(url, riding_out(&quit_)),
        key_(std::move(worker_key)),
        stream_(std::move(stream)),
        name_(std::move(name)),
        info_(std::move(info)),
        cluster_key_(cluster_key),
        period_s_(period_s) {
    beat();
    thread_ = std::thread([this] { loop(); });
  }
  ~Heartbeat() {
    quit_ = true;  // a beat waiting for Redis to come back gives up
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
    try {
      redis_.command({"DEL", key_});
    } catch (const Error&) {
    }
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void set_job(std::string id) {
    std::lock_guard lock(mu_);
    job_ = std::move(id);
  }

 private:
  void beat() {
    std::string job;
    {
      std::lock_guard lock(mu_);
      job = job_;
    }
    const auto ttl_ms = static_cast<int64_t>(period_s_ * 5000);
    if (!cluster_key_.empty()) {
      info_[kHeartbeatAtField] = redis_time_ms(redis_);
      info_[kHeartbeatTtlField] = ttl_ms;
      sign_json(cluster_key_, key_, info_);
    }
    redis_.command({"SET", key_, info_.dump(), "PX", std::to_string(ttl_ms)});
    if (!job.empty()) {
      redis_.try_command({"XCLAIM", stream_, keys::kWorkersGroup, name_, "0", job, "JUSTID"});
    }
  }
  void loop() {
    std::unique_lock lock(mu_);
    while (!done_) {
      cv_.wait_for(lock, std::chrono::duration<double>(period_s_), [this] { return done_; });
      if (done_) break;
      lock.unlock();
      try {
        beat();
      } catch (const Error& e) {
        log_warn("worker heartbeat: {}", e.what());
      }
      lock.lock();
    }
  }

  std::atomic<bool> quit_{false};
  redis::Client redis_;  // used only by thread_ after the constructor
  const std::string key_, stream_, name_;
  nlohmann::json info_;  // used only by beat(): the constructor, then thread_
  const ClusterKey& cluster_key_;
  const double period_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  std::string job_;    // guarded by mu_: the job in hand, "" between jobs
  std::thread thread_;
};

void create_group(redis::Client& redis, const std::string& stream) {
  const redis::Reply r =
      redis.try_command({"XGROUP", "CREATE", stream, keys::kWorkersGroup, "0", "MKSTREAM"});
  if (r.is_error() && r.str.rfind("BUSYGROUP", 0) != 0) {
    throw Error(ErrorCode::kIo,
                fmt::format("{}: XGROUP CREATE {}: {}", redis.url().address(), stream, r.str));
  }
}

}  // namespace

// The group's creation, shared with the coordinator (it may enqueue first).
void ensure_job_group(redis::Client& redis, const std::string& stream) {
  create_group(redis, stream);
}

namespace {

void check_options(const std::shared_ptr<const Model>& model, const WorkerOptions& options) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "run_worker needs a model");
  if (options.visibility_timeout_s <= 0 || options.heartbeat_s <= 0 ||
      options.visibility_timeout_s < 2 * options.heartbeat_s) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("the visibility timeout ({} s) must be at least two heartbeats ({} s)",
                            options.visibility_timeout_s, options.heartbeat_s));
  }
}

// A job in hand: its entry, and whether it was taken over from a worker
// that stopped renewing it (XAUTOCLAIM) rather than read new.
struct ClaimedJob {
  StreamEntry entry;
  bool stale = false;
};

// What an agent job made: one result per agent that it answers for.
struct JobOutcome {
  std::string run_id;  // "": the job names none, and nobody hears of it
  std::vector<AgentResult> results;
  // Ancestors of the job's fork_from children, run again: their answers
  // the first time, checked and not posted again.
  std::map<std::string, std::vector<Token>> reruns;
  FetchReport fetched;
  bool snapshot_unavailable = false;  // the bus's copy is missing or damaged
  std::optional<ErrorValue> failure;  // the whole job failed: every agent says why
};

// A run's pipeline as a worker keeps it, with the run's guard policy.
using RunPipeline = std::pair<PipelineSpec, GuardPolicy>;

// `swarmkv worker`'s state: its connection, heartbeat and store, and the
// last few runs' pipelines. Thread-confined (the heartbeat has a thread and
// a connection of its own).
class Worker {
 public:
  Worker(const redis::Url& url, const std::shared_ptr<const Model>& model,
         const WorkerOptions& options)
      : url_(url),
        model_(model),
        options_(options),
        name_(options.name.empty() ? default_name() : options.name),
        fp_(model_fingerprint(model->path())),
        exact_(model->options().batch_invariant),
        pool_(keys::pool(fp_, exact_, options.cluster_key.id())),
        stream_(keys::jobs(pool_)),
        model_file_(std::filesystem::path(model->path()).filename().string()),
        idle_ms_(std::to_string(static_cast<int64_t>(options.visibility_timeout_s * 1000))),
        redis_(url, riding_out(options.stop)) {
    create_group(redis_, stream_);
    nlohmann::json info = {{"name", name_},
                           {"model_file", model_file_},
                           {"pid", ::getpid()},
                           {"started_unix", unix_now()}};
    warn_of_an_open_cluster();
    heartbeat_.emplace(url, keys::worker(pool_, name_), stream_, name_, std::move(info),
                       options.cluster_key, options.heartbeat_s);
    store_.emplace(snapshot_store_dir(options.cache_dir), options.cache_max_bytes);
    log_info("worker {}: serving model {} (sha256 {}, {} runs) from {}", name_, model_file_,
             fp_.substr(0, 12), exact_ ? "exact" : "--no-exact", url.address());
  }

  // Jobs until stopped (or max_jobs).
  WorkerReport serve() {
    try {
      while (!stopped()) {
        std::optional<ClaimedJob> job = next_job();
        if (!job || refused(job->entry)) continue;
        // As before the steps were named: only an agent job run to its end
        // ends the loop at max_jobs.
        if (take(*job) && options_.max_jobs > 0 && report_.jobs >= options_.max_jobs) break;
      }
    } catch (const Error& e) {
      // Stopped while waiting for Redis to come back: the job in hand (if
      // any) stays pending for another worker, as after a crash.
      if (!stopped()) throw;
      log_warn("worker {}: stopped while Redis was away: {}", name_, e.message());
    }
    log_info("worker {}: stopping after {} job(s)", name_, report_.jobs);
    return report_;
  }

 private:
  bool stopped() const { return options_.stop != nullptr && options_.stop->load(); }

  // Signed (by each beat): a coordinator with the cluster key counts only
  // workers that have it.
  void warn_of_an_open_cluster() const {
    if (options_.cluster_key.empty()) {
      log_warn(
          "worker {}: no cluster key (--cluster-key-file, $SWARMKV_CLUSTER_KEY): it runs any "
          "job on {} and its results and snapshots are not authenticated",
          name_, url_.address());
    }
    if (url_.clear_text_off_host()) {
      log_warn(
          "worker {}: {} is plain text: the documents, prompts, answers and KV cross the "
          "network readable (rediss:// speaks TLS)",
          name_, url_.address());
    }
  }

  // A job a dead worker left pending comes first, then a new one; nullopt:
  // none within a second, or the job group was made again.
  std::optional<ClaimedJob> next_job() {
    const redis::Reply claimed = redis_.try_command(
        {"XAUTOCLAIM", stream_, keys::kWorkersGroup, name_, idle_ms_, "0-0", "COUNT", "1"});
    if (claimed.is_error() && claimed.str.rfind("NOGROUP", 0) == 0) {
      log_warn("worker {}: the job group is gone (Redis restarted?); creating it again", name_);
      create_group(redis_, stream_);
      return std::nullopt;
    }
    if (claimed.is_error()) {
      throw Error(ErrorCode::kIo,
                  fmt::format("{}: XAUTOCLAIM {}: {}", url_.address(), stream_, claimed.str));
    }
    std::vector<StreamEntry> jobs;
    if (claimed.elements.size() >= 2) jobs = stream_entries(claimed.elements[1]);
    if (!jobs.empty()) return ClaimedJob{std::move(jobs.front()), true};
    const redis::Reply r =
        redis_.try_command({"XREADGROUP", "GROUP", keys::kWorkersGroup, name_, "COUNT", "1",
                            "BLOCK", "1000", "STREAMS", stream_, ">"});
    if (r.is_error() && r.str.rfind("NOGROUP", 0) == 0) {
      create_group(redis_, stream_);
      return std::nullopt;
    }
    if (r.is_error())
      throw Error(ErrorCode::kIo,
                  fmt::format("{}: XREADGROUP {}: {}", url_.address(), stream_, r.str));
    if (!r.is_nil() && !r.elements.empty() && r.elements[0].elements.size() >= 2)
      jobs = stream_entries(r.elements[0].elements[1]);
    if (jobs.empty()) return std::nullopt;
    return ClaimedJob{std::move(jobs.front()), false};
  }

  // Under a cluster key a job that is not signed with it is never run, and
  // nobody it names hears of it: acknowledged and logged.
  bool refused(const StreamEntry& job) {
    const std::optional<std::string> why = entry_refusal(options_.cluster_key, stream_, job);
    if (!why) return false;
    log_warn("worker {}: refusing job {} (run '{}'): {}; not run", name_, job.id,
             job_run_shown(job), *why);
    acknowledge(job);
    return true;
  }

  // After a Redis restart the group (and the job) may be gone: nothing to acknowledge.
  void acknowledge(const StreamEntry& job) {
    redis_.try_command({"XACK", stream_, keys::kWorkersGroup, job.id});
  }

  // Runs the job in hand, posts what it made and acknowledges it; true for
  // an agent job run to its end.
  bool take(const ClaimedJob& job) {
    const StreamEntry& entry = job.entry;
    const std::optional<ErrorValue> dead =
        job.stale ? dead_letter(redis_, stream_, pool_, entry, name_, options_.cluster_key)
                  : std::nullopt;
    heartbeat_->set_job(entry.id);
    const Stopwatch took;
    if (is_prefill_job(entry)) {
      run_prefill_job(entry, dead);
      heartbeat_->set_job("");
      ++report_.jobs;
      return false;
    }
    std::optional<JobOutcome> out = run_agent_job(job, dead);
    if (!out) {  // its run is over
      acknowledge(entry);
      heartbeat_->set_job("");
      return false;
    }
    if (!out->reruns.empty()) settle_reruns(runs_.at(out->run_id).first, out->reruns, out->results);
    post_results(entry, *out);
    acknowledge(entry);
    heartbeat_->set_job("");
    ++report_.jobs;
    report_.agents += out->results.size();
    if (job.stale) ++report_.claimed_stale;
    log_info("worker {}: job {} done: {} result(s) in {:.0f} ms", name_, entry.id,
             out->results.size(), took.ms());
    return true;
  }

  // A prefill job: the coordinator never decodes. The run's document from
  // this worker's store, else prefilled, published on the bus under the
  // job's key (JobMessage::prefill says how); one result entry (agent "")
  // says how it went. `dead`: the job is not run, it fails with that.
  // Throws only for Redis itself.
  void run_prefill_job(const StreamEntry& job, const std::optional<ErrorValue>& dead) {
    std::string run_id;
    PrefillOutcome outcome;
    try {
      run_id = job_run(job);
      if (dead) throw Error(dead->code, dead->message);
      const JobMessage message = job_from_entry(job);
      const std::string& key = message.snapshot_key();
      const std::optional<nlohmann::json> doc =
          run_spec_message(redis_, run_id, options_.cluster_key);
      if (!doc) {
        throw Error(ErrorCode::kNotFound,
                    fmt::format("prefill job {}: run {} has no pipeline in Redis", job.id, run_id));
      }
      PipelineSpec spec = spec_from_json(*doc, nullptr);
      spec.n_threads = options_.n_threads;
      RunOptions run;  // this worker's store: looked up, then the prefilled state published there
      run.snapshot.cache = SnapshotCacheMode::kOn;
      run.snapshot.cache_dir = options_.cache_dir;
      run.snapshot.cache_max_bytes = options_.cache_max_bytes;
      log_info("worker {}: prefill job {} of run {}", name_, job.id, run_id);
      const PrefillReport made = prefill_document(spec, model_, run);
      outcome.prefill_ms = made.prefill_ms;
      if (made.snapshot.key != key) {
        throw Error(ErrorCode::kIncompatible,
                    fmt::format("prefill job {} asks for snapshot {}, and this worker makes {}: "
                                "its model, engine or KV layout differs from the coordinator's",
                                job.id, key, made.snapshot.key));
      }
      publish_prefilled(key, *message.prefill, outcome);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kIo && e.message().rfind(redis_.url().address(), 0) == 0) throw;
      outcome.error = e.value();
    } catch (const std::exception& e) {
      outcome.error =
          ErrorValue{ErrorCode::kCorruption, fmt::format("prefill job {}: {}", job.id, e.what())};
    }
    if (outcome.error) {
      log_warn("worker {}: prefill job {} failed: {}", name_, job.id, outcome.error->to_string());
    }
    if (!run_id.empty()) {
      redis_.command(
          xadd(options_.cluster_key, keys::run_results(run_id), 100000,
               result_fields(
                   {.agent = "", .worker = name_, .job = job.id, .prefill = std::move(outcome)})));
    }
    acknowledge(job);
  }

  // The snapshot `key` from this worker's store onto the bus.
  void publish_prefilled(const std::string& key, Publish mode, PrefillOutcome& outcome) {
    const std::string file = read_file(store_->path_of(key), "snapshot");
    outcome.bytes = file.size();
    outcome.publish_ms =
        publish_snapshot(redis_, key,
                         std::span(reinterpret_cast<const uint8_t*>(file.data()), file.size()),
                         BusOptions{.cluster_key = options_.cluster_key}, mode)
            .ms;
    log_info("worker {}: published snapshot {} ({:.1f} MiB; prefill {:.0f} ms)", name_, key,
             outcome.bytes / 1048576.0, outcome.prefill_ms);
  }

  // An agent job, run; nullopt for one whose run is over (refused: nobody
  // waits for it). Whatever its message makes the code throw fails the job,
  // never the worker: a worker that exited would leave the job pending for
  // the next one to claim and die on.
  std::optional<JobOutcome> run_agent_job(const ClaimedJob& job,
                                          const std::optional<ErrorValue>& dead) {
    JobOutcome out;
    try {
      if (!run_agents(job, dead, out)) return std::nullopt;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kIo && out.run_id.empty()) throw;
      out.failure = e.value();
    } catch (const std::exception& e) {
      out.failure =
          ErrorValue{ErrorCode::kCorruption, fmt::format("job {}: {}", job.entry.id, e.what())};
    }
    if (out.failure) fail_whole_job(job.entry, out);
    return out;
  }

  // run_agent_job's steps; false: the run is over.
  bool run_agents(const ClaimedJob& job, const std::optional<ErrorValue>& dead, JobOutcome& out) {
    const StreamEntry& entry = job.entry;
    out.run_id = job_run(entry);
    if (dead) throw Error(dead->code, dead->message);
    job_agents(entry);  // checked first: a job without agents fails, whatever its run
    const RunPipeline* run = pipeline_of(out.run_id);
    if (run == nullptr) {
      log_warn(
          "worker {}: refusing job {}: run {} has no pipeline in Redis (finished, expired or "
          "lost in a restart)",
          name_, entry.id, out.run_id);
      return false;
    }
    const JobMessage message = job_from_entry(entry);
    out.reruns = message.reruns;
    const PipelineSpec spec = job_spec(message, run->first, job.stale);
    RunOptions options;
    options.guard = run->second;
    if (fork_traits(spec.fork).prefix_state)
      options.snapshot.file = snapshot_file(message.snapshot_key(), out);
    run_in_parts(spec, options, out);
    return true;
  }

  // The pipeline of `run_id`, from the last few runs' or Redis; nullptr when
  // Redis has none: a run that finished (or was lost), whose jobs are
  // leftovers nobody waits for.
  const RunPipeline* pipeline_of(const std::string& run_id) {
    const std::optional<nlohmann::json> doc =
        run_spec_message(redis_, run_id, options_.cluster_key);
    if (!doc) return nullptr;
    auto it = runs_.find(run_id);
    if (it == runs_.end()) {
      if (runs_.size() >= 8) runs_.erase(runs_.begin());
      GuardPolicy guard = GuardPolicy::kSerialized;
      PipelineSpec spec = spec_from_json(*doc, &guard);
      it = runs_.emplace(run_id, std::make_pair(std::move(spec), guard)).first;
    }
    return &it->second;
  }

  // The pipeline of the job's agents alone: each as the run has it, without
  // its depends_on (the coordinator enqueues it once they are done) and
  // with its prompt as the job renders it.
  PipelineSpec job_spec(const JobMessage& job, const PipelineSpec& full, bool stale) const {
    PipelineSpec spec = full;
    spec.agents.clear();
    spec.n_threads = options_.n_threads;
    std::string listed;
    for (const std::string& agent : job.agents) {
      const std::optional<size_t> a = full.agent_index(agent);
      if (!a) {
        throw Error(ErrorCode::kCorruption,
                    fmt::format("job {} names agent '{}', which run {} does not have", job.id,
                                agent, job.run));
      }
      spec.agents.push_back(full.agents[*a]);
      spec.agents.back().depends_on.clear();
      // Its placeholders rendered with the upstream answers, which the
      // coordinator has and this worker may not.
      if (const auto p = job.prompts.find(agent); p != job.prompts.end())
        spec.agents.back().prompt = p->second;
      else if (!prompt_placeholders(spec.agents.back().prompt).empty())
        throw Error(ErrorCode::kCorruption,
                    fmt::format("job {}: agent '{}' has placeholders and the job no rendered "
                                "prompt for it",
                                job.id, agent));
      listed += (listed.empty() ? "" : ", ") + agent;
    }
    log_info("worker {}: {} job {} of run {}: {} agent(s) ({})", name_,
             stale ? "took over the stalled" : "claimed", job.id, job.run, spec.agents.size(),
             listed);
    return spec;
  }

  // The document's snapshot as a file in this worker's store: there
  // already, else fetched from the bus (out.fetched; out.snapshot_unavailable
  // when the bus's copy is missing, damaged or refused).
  std::string snapshot_file(const std::string& key, JobOutcome& out) {
    const std::string path = store_->path_of(key);
    bool local = false;
    try {
      read_snapshot_header(path);
      local = true;
      store_->touch(path);
    } catch (const Error&) {
    }
    if (local) return path;
    std::vector<uint8_t> file;
    try {
      file = fetch_snapshot(redis_, key, options_.cluster_key, &out.fetched);
    } catch (const Error& e) {
      // Redis being away (kIo) is no fault of the bus's copy.
      out.snapshot_unavailable = e.code() == ErrorCode::kCorruption ||
                                 e.code() == ErrorCode::kNotFound ||
                                 e.code() == ErrorCode::kUnauthenticated;
      throw;
    }
    std::string adopted = store_->adopt(key, file);
    ++report_.fetches;
    const FetchReport& fetched = out.fetched;
    log_info("worker {}: fetched snapshot {} ({:.1f} MiB in {:.0f} ms, {:.0f} MB/s)", name_, key,
             fetched.bytes / 1048576.0, fetched.ms,
             fetched.ms > 0 ? fetched.bytes / 1000.0 / fetched.ms : 0.0);
    return adopted;
  }

  // The job's agents, run in parts of at most max_agents (a fork_from
  // child in the same part as its parent); a part that throws fails its
  // agents with that error.
  void run_in_parts(const PipelineSpec& spec, const RunOptions& run, JobOutcome& out) {
    const size_t slice = options_.max_agents > 0 && !spec.any_fork_from()
                             ? static_cast<size_t>(options_.max_agents)
                             : spec.agents.size();
    for (size_t at = 0; at < spec.agents.size(); at += slice) {
      PipelineSpec part = spec;
      part.agents.assign(spec.agents.begin() + static_cast<std::ptrdiff_t>(at),
                         spec.agents.begin() +
                             static_cast<std::ptrdiff_t>(std::min(at + slice, spec.agents.size())));
      try {
        PipelineResult r = run_pipeline(part, model_, run);
        drop_a_bad_store_entry(r, run, out);
        for (AgentResult& a : r.agents) out.results.push_back(std::move(a));
      } catch (const Error& e) {
        for (const AgentSpec& a : part.agents)
          out.results.push_back(failed_result(a.name, e.value()));
      }
    }
  }

  // State from this worker's store entry that fails the checks after its
  // restore (cells elsewhere, non-finite logits) though its checksums held:
  // the entry goes, as run_pipeline drops a store entry it looked up (this
  // one is named as a file, checked against the bus's key), and the
  // coordinator hears that the snapshot is unusable (it has it made and
  // published again, and gives these agents one more try).
  void drop_a_bad_store_entry(const PipelineResult& r, const RunOptions& run, JobOutcome& out) {
    if (const ErrorValue* bad = state_error(r);
        bad && !run.snapshot.file.empty() && store_->remove_path(run.snapshot.file)) {
      log_warn("worker {}: removed snapshot {} from its store: {}", name_, run.snapshot.file,
               bad->message);
      out.snapshot_unavailable = true;
    }
  }

  static AgentResult failed_result(const std::string& agent, const ErrorValue& error) {
    AgentResult failed;
    failed.name = agent;
    failed.status = NodeStatus::kFailed;
    failed.error = error;
    return failed;
  }

  // The whole job failed (its snapshot, its message): every agent says why.
  void fail_whole_job(const StreamEntry& job, JobOutcome& out) const {
    log_warn("worker {}: job {} failed: {}", name_, job.id, out.failure->to_string());
    out.results.clear();
    try {
      for (const std::string& agent : job_agents(job))
        out.results.push_back(failed_result(agent, *out.failure));
    } catch (const Error&) {
      // A message without agent names: nobody waits for its results.
    }
  }

  // One result entry per agent on the run's results stream.
  void post_results(const StreamEntry& job, JobOutcome& out) {
    if (out.run_id.empty()) return;
    const std::string results_key = keys::run_results(out.run_id);
    for (AgentResult& a : out.results) {
      a.worker = name_;
      redis_.command(xadd(options_.cluster_key, results_key, 100000,
                          result_fields({.agent = a.name,
                                         .worker = name_,
                                         .job = job.id,
                                         .result = a,
                                         .fetch_bytes = out.fetched.bytes,
                                         .fetch_ms = out.fetched.ms,
                                         .snapshot_unavailable = out.snapshot_unavailable})));
    }
    redis_.command({"EXPIRE", results_key, std::to_string(keys::kRunTtlS)});
  }

  const redis::Url& url_;
  const std::shared_ptr<const Model>& model_;
  const WorkerOptions& options_;
  const std::string name_;
  const std::string fp_;
  const bool exact_;
  const std::string pool_;
  const std::string stream_;
  const std::string model_file_;
  const std::string idle_ms_;  // the visibility timeout, as XAUTOCLAIM takes it
  redis::Client redis_;
  // Made in the constructor's body, in the order of its log lines.
  std::optional<Heartbeat> heartbeat_;
  std::optional<SnapshotStore> store_;
  WorkerReport report_;
  std::map<std::string, RunPipeline> runs_;  // the last few runs' pipelines
};

}  // namespace

WorkerReport run_worker(const redis::Url& url, const std::shared_ptr<const Model>& model,
                        const WorkerOptions& options) {
  check_options(model, options);
  return Worker(url, model, options).serve();
}

}  // namespace swarmkv::cluster
