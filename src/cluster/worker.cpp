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

std::string field(const StreamEntry& e, const std::string& name) {
  const auto it = e.fields.find(name);
  if (it == e.fields.end()) {
    throw Error(ErrorCode::kCorruption, fmt::format("job {} has no '{}' field", e.id, name));
  }
  return it->second;
}

// The agent names a job lists: a non-empty JSON array of strings, or
// Error(kCorruption) naming the job and what its field holds instead.
std::vector<std::string> job_agents(const StreamEntry& job) {
  const std::string text = field(job, "agents");
  const nlohmann::json names = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> out;
  if (names.is_array()) {
    for (const nlohmann::json& n : names) {
      if (!n.is_string()) break;
      out.push_back(n.get<std::string>());
    }
  }
  if (!names.is_array() || names.empty() || out.size() != names.size()) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("job {}: 'agents' is not a JSON array of agent names (it is '{}')",
                            job.id, text.substr(0, 200)));
  }
  return out;
}

// The ancestors a job runs again for its fork_from children, with the
// answers they gave the first time ("rerun": a JSON object, agent name ->
// token array; absent: none), or Error(kCorruption) naming the job.
std::map<std::string, std::vector<Token>> job_reruns(const StreamEntry& job,
                                                     const std::vector<std::string>& agents) {
  std::map<std::string, std::vector<Token>> out;
  const auto it = job.fields.find("rerun");
  if (it == job.fields.end()) return out;
  const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& what) {
    return Error(ErrorCode::kCorruption, fmt::format("job {}: 'rerun' {}", job.id, what));
  };
  if (!j.is_object()) throw bad("is not a JSON object of agent names to token arrays");
  for (const auto& [name, tokens] : j.items()) {
    if (std::find(agents.begin(), agents.end(), name) == agents.end())
      throw bad(fmt::format("names '{}', which is not one of its agents", name.substr(0, 100)));
    if (!tokens.is_array()) throw bad(fmt::format("of '{}' is not a token array", name));
    std::vector<Token>& out_tokens = out[name];
    for (const nlohmann::json& t : tokens) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() > std::numeric_limits<Token>::max())
        throw bad(fmt::format("of '{}' holds something other than token ids", name));
      out_tokens.push_back(t.get<Token>());
    }
  }
  return out;
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
  const long long deliveries = r.elements[0].elements[3].integer;
  if (deliveries <= keys::kMaxDeliveries) return std::nullopt;
  const std::string dead = keys::dead_letters(pool);
  ErrorValue e{ErrorCode::kAborted,
               fmt::format("job {} was delivered {} times and no worker finished it (each one "
                           "stopped or died in it): not run again; it is in {}",
                           job.id, deliveries, dead)};
  std::vector<std::pair<std::string, std::string>> fields = {
      {"job", job.id},
      {"deliveries", std::to_string(deliveries)},
      {"worker", name},
      {"reason", e.message}};
  for (const auto& [key, value] : job.fields) fields.emplace_back("job." + key, value);
  // Not recorded (the key holds another type): the job still fails, logged.
  if (const redis::Reply added = redis.try_command(xadd(cluster_key, dead, 10000, fields));
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

// A prefill job: the coordinator never decodes. The run's document from
// this worker's store, else prefilled, published on the bus under the job's
// key ("prefill": "replace" replaces a damaged copy); one result entry
// (agent "") says how it went: "prefill" null or the error, "prefill_ms",
// "publish_ms", "bytes". `dead`: the job is not run, it fails with that.
// Throws only for Redis itself.
void run_prefill_job(redis::Client& redis, const std::string& stream, const StreamEntry& job,
                     const std::string& name, const std::shared_ptr<const Model>& model,
                     const WorkerOptions& options, const std::optional<ErrorValue>& dead) {
  std::string run_id;
  std::optional<ErrorValue> failure;
  PrefillReport made;
  uint64_t bytes = 0;
  double publish_ms = 0;
  try {
    run_id = field(job, "run");
    if (dead) throw Error(dead->code, dead->message);
    const std::string key = field(job, "snapshot");
    const std::optional<nlohmann::json> doc = run_spec_message(redis, run_id, options.cluster_key);
    if (!doc) {
      throw Error(ErrorCode::kNotFound,
                  fmt::format("prefill job {}: run {} has no pipeline in Redis", job.id, run_id));
    }
    PipelineSpec spec = spec_from_json(*doc, nullptr);
    spec.n_threads = options.n_threads;
    RunOptions run;  // this worker's store: looked up, then the prefilled state published there
    run.snapshot.cache = SnapshotCacheMode::kOn;
    run.snapshot.cache_dir = options.cache_dir;
    run.snapshot.cache_max_bytes = options.cache_max_bytes;
    log_info("worker {}: prefill job {} of run {}", name, job.id, run_id);
    made = prefill_document(spec, model, run);
    if (made.snapshot.key != key) {
      throw Error(ErrorCode::kIncompatible,
                  fmt::format("prefill job {} asks for snapshot {}, and this worker makes {}: its "
                              "model, engine or KV layout differs from the coordinator's",
                              job.id, key, made.snapshot.key));
    }
    const SnapshotStore store(snapshot_store_dir(options.cache_dir), options.cache_max_bytes);
    const std::string file = read_file(store.path_of(key), "snapshot");
    bytes = file.size();
    publish_ms =
        publish_snapshot(
            redis, key, std::span(reinterpret_cast<const uint8_t*>(file.data()), file.size()),
            BusOptions{.cluster_key = options.cluster_key},
            field(job, "prefill") == "replace" ? Publish::kReplace : Publish::kIfAbsent)
            .ms;
    log_info("worker {}: published snapshot {} ({:.1f} MiB; prefill {:.0f} ms)", name, key,
             bytes / 1048576.0, made.prefill_ms);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kIo && e.message().rfind(redis.url().address(), 0) == 0) throw;
    failure = e.value();
  } catch (const std::exception& e) {
    failure =
        ErrorValue{ErrorCode::kCorruption, fmt::format("prefill job {}: {}", job.id, e.what())};
  }
  if (failure) log_warn("worker {}: prefill job {} failed: {}", name, job.id, failure->to_string());
  if (!run_id.empty()) {
    redis.command(xadd(options.cluster_key, keys::run_results(run_id), 100000,
                       {{"agent", ""},
                        {"worker", name},
                        {"job", job.id},
                        {"prefill", error_json(failure).dump()},
                        {"prefill_ms", fmt::format("{:.3f}", made.prefill_ms)},
                        {"publish_ms", fmt::format("{:.3f}", publish_ms)},
                        {"bytes", std::to_string(bytes)}}));
  }
  redis.try_command({"XACK", stream, keys::kWorkersGroup, job.id});
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

// The rendered prompts a job carries for its agents with placeholders
// ("prompts": a JSON object, agent name -> prompt text; absent: none), or
// Error(kCorruption) naming the job and what is wrong.
std::map<std::string, std::string> job_prompts(const StreamEntry& job,
                                               const std::vector<std::string>& agents) {
  std::map<std::string, std::string> out;
  const auto it = job.fields.find("prompts");
  if (it == job.fields.end()) return out;
  const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("job {}: 'prompts' is not a JSON object of agent names to prompts "
                            "(it is '{}')",
                            job.id, it->second.substr(0, 200)));
  }
  for (const auto& [name, prompt] : j.items()) {
    if (!prompt.is_string() || std::find(agents.begin(), agents.end(), name) == agents.end()) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("job {}: 'prompts' has an entry for '{}' that is not a prompt of "
                              "one of its agents",
                              job.id, name.substr(0, 100)));
    }
    out[name] = prompt.get<std::string>();
  }
  return out;
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

WorkerReport run_worker(const redis::Url& url, const std::shared_ptr<const Model>& model,
                        const WorkerOptions& options) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "run_worker needs a model");
  if (options.visibility_timeout_s <= 0 || options.heartbeat_s <= 0 ||
      options.visibility_timeout_s < 2 * options.heartbeat_s) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("the visibility timeout ({} s) must be at least two heartbeats ({} s)",
                            options.visibility_timeout_s, options.heartbeat_s));
  }
  const std::string name = options.name.empty() ? default_name() : options.name;
  const std::string fp = model_fingerprint(model->path());
  const bool exact = model->options().batch_invariant;
  const std::string pool = keys::pool(fp, exact, options.cluster_key.id());
  const std::string stream = keys::jobs(pool);
  const std::string model_file = std::filesystem::path(model->path()).filename().string();
  redis::Client redis(url, riding_out(options.stop));
  create_group(redis, stream);
  nlohmann::json info = {{"name", name},
                         {"model_file", model_file},
                         {"pid", ::getpid()},
                         {"started_unix", unix_now()}};
  // Signed (by each beat): a coordinator with the cluster key counts only
  // workers that have it.
  if (options.cluster_key.empty()) {
    log_warn(
        "worker {}: no cluster key (--cluster-key-file, $SWARMKV_CLUSTER_KEY): it runs any "
        "job on {} and its results and snapshots are not authenticated",
        name, url.address());
  }
  if (url.clear_text_off_host()) {
    log_warn(
        "worker {}: {} is plain text: the documents, prompts, answers and KV cross the "
        "network readable (rediss:// speaks TLS)",
        name, url.address());
  }
  Heartbeat heartbeat(url, keys::worker(pool, name), stream, name, std::move(info),
                      options.cluster_key, options.heartbeat_s);
  SnapshotStore store(snapshot_store_dir(options.cache_dir), options.cache_max_bytes);
  log_info("worker {}: serving model {} (sha256 {}, {} runs) from {}", name, model_file,
           fp.substr(0, 12), exact ? "exact" : "--no-exact", url.address());

  WorkerReport report;
  std::map<std::string, std::pair<PipelineSpec, GuardPolicy>> runs;  // the last few runs' specs
  const std::string idle_ms =
      std::to_string(static_cast<int64_t>(options.visibility_timeout_s * 1000));
  try {
    while (options.stop == nullptr || !options.stop->load()) {
      // A job a dead worker left pending comes first, then a new one.
      std::vector<StreamEntry> jobs;
      bool stale = false;
      const redis::Reply claimed = redis.try_command(
          {"XAUTOCLAIM", stream, keys::kWorkersGroup, name, idle_ms, "0-0", "COUNT", "1"});
      if (claimed.is_error() && claimed.str.rfind("NOGROUP", 0) == 0) {
        log_warn("worker {}: the job group is gone (Redis restarted?); creating it again", name);
        create_group(redis, stream);
        continue;
      }
      if (claimed.is_error()) {
        throw Error(ErrorCode::kIo,
                    fmt::format("{}: XAUTOCLAIM {}: {}", url.address(), stream, claimed.str));
      }
      if (claimed.elements.size() >= 2) jobs = stream_entries(claimed.elements[1]);
      stale = !jobs.empty();
      if (jobs.empty()) {
        const redis::Reply r =
            redis.try_command({"XREADGROUP", "GROUP", keys::kWorkersGroup, name, "COUNT", "1",
                               "BLOCK", "1000", "STREAMS", stream, ">"});
        if (r.is_error() && r.str.rfind("NOGROUP", 0) == 0) {
          create_group(redis, stream);
          continue;
        }
        if (r.is_error())
          throw Error(ErrorCode::kIo,
                      fmt::format("{}: XREADGROUP {}: {}", url.address(), stream, r.str));
        if (!r.is_nil() && !r.elements.empty() && r.elements[0].elements.size() >= 2)
          jobs = stream_entries(r.elements[0].elements[1]);
      }
      if (jobs.empty()) continue;
      const StreamEntry& job = jobs.front();
      // Under a cluster key a job that is not signed with it is never run,
      // and nobody it names hears of it: acknowledged and logged.
      if (const std::optional<std::string> why = entry_refusal(options.cluster_key, stream, job)) {
        const auto run = job.fields.find("run");
        log_warn("worker {}: refusing job {} (run '{}'): {}; not run", name, job.id,
                 run == job.fields.end() ? std::string() : run->second.substr(0, 100), *why);
        redis.try_command({"XACK", stream, keys::kWorkersGroup, job.id});
        continue;
      }
      const std::optional<ErrorValue> dead =
          stale ? dead_letter(redis, stream, pool, job, name, options.cluster_key) : std::nullopt;
      heartbeat.set_job(job.id);
      const Stopwatch took;
      if (job.fields.count("prefill") > 0) {
        run_prefill_job(redis, stream, job, name, model, options, dead);
        heartbeat.set_job("");
        ++report.jobs;
        continue;
      }

      std::vector<AgentResult> results;
      // Ancestors of the job's fork_from children, run again: their answers
      // the first time, checked and not posted again.
      std::map<std::string, std::vector<Token>> reruns;
      std::string run_id;
      FetchReport fetched;
      bool snapshot_unavailable = false;  // the bus's copy is missing or damaged
      std::optional<ErrorValue> failure;
      try {
        run_id = field(job, "run");
        if (dead) throw Error(dead->code, dead->message);
        const std::vector<std::string> names = job_agents(job);
        // A run that finished (or was lost) has no pipeline key: its jobs are
        // leftovers nobody waits for.
        const std::optional<nlohmann::json> doc =
            run_spec_message(redis, run_id, options.cluster_key);
        if (!doc) {
          log_warn(
              "worker {}: refusing job {}: run {} has no pipeline in Redis (finished, expired or "
              "lost in a restart)",
              name, job.id, run_id);
          redis.try_command({"XACK", stream, keys::kWorkersGroup, job.id});
          heartbeat.set_job("");
          continue;
        }
        auto it = runs.find(run_id);
        if (it == runs.end()) {
          if (runs.size() >= 8) runs.erase(runs.begin());
          GuardPolicy guard = GuardPolicy::kSerialized;
          PipelineSpec spec = spec_from_json(*doc, &guard);
          it = runs.emplace(run_id, std::make_pair(std::move(spec), guard)).first;
        }
        const PipelineSpec& full = it->second.first;
        PipelineSpec spec = full;
        spec.agents.clear();
        spec.n_threads = options.n_threads;
        const std::map<std::string, std::string> rendered = job_prompts(job, names);
        reruns = job_reruns(job, names);
        std::string listed;
        for (const std::string& agent : names) {
          const std::optional<size_t> a = full.agent_index(agent);
          if (!a) {
            throw Error(ErrorCode::kCorruption,
                        fmt::format("job {} names agent '{}', which run {} does not have", job.id,
                                    agent, run_id));
          }
          spec.agents.push_back(full.agents[*a]);
          spec.agents.back().depends_on.clear();  // the coordinator enqueues it once they are done
          // Its placeholders rendered with the upstream answers, which the
          // coordinator has and this worker may not.
          if (const auto p = rendered.find(agent); p != rendered.end())
            spec.agents.back().prompt = p->second;
          else if (!prompt_placeholders(spec.agents.back().prompt).empty())
            throw Error(ErrorCode::kCorruption,
                        fmt::format("job {}: agent '{}' has placeholders and the job no rendered "
                                    "prompt for it",
                                    job.id, agent));
          listed += (listed.empty() ? "" : ", ") + agent;
        }
        log_info("worker {}: {} job {} of run {}: {} agent(s) ({})", name,
                 stale ? "took over the stalled" : "claimed", job.id, run_id, spec.agents.size(),
                 listed);
        RunOptions run;
        run.guard = it->second.second;
        if (fork_traits(spec.fork).prefix_state) {
          const std::string key = field(job, "snapshot");
          std::string path = store.path_of(key);
          bool local = false;
          try {
            read_snapshot_header(path);
            local = true;
            store.touch(path);
          } catch (const Error&) {
          }
          if (!local) {
            std::vector<uint8_t> file;
            try {
              file = fetch_snapshot(redis, key, options.cluster_key, &fetched);
            } catch (const Error& e) {
              // Redis being away (kIo) is no fault of the bus's copy.
              snapshot_unavailable = e.code() == ErrorCode::kCorruption ||
                                     e.code() == ErrorCode::kNotFound ||
                                     e.code() == ErrorCode::kUnauthenticated;
              throw;
            }
            path = store.adopt(key, file);
            ++report.fetches;
            log_info("worker {}: fetched snapshot {} ({:.1f} MiB in {:.0f} ms, {:.0f} MB/s)", name,
                     key, fetched.bytes / 1048576.0, fetched.ms,
                     fetched.ms > 0 ? fetched.bytes / 1000.0 / fetched.ms : 0.0);
          }
          run.snapshot.file = path;
        }
        // A fork_from child runs in the same part as its parent.
        const size_t slice = options.max_agents > 0 && !spec.any_fork_from()
                                 ? static_cast<size_t>(options.max_agents)
                                 : spec.agents.size();
        for (size_t at = 0; at < spec.agents.size(); at += slice) {
          PipelineSpec part = spec;
          part.agents.assign(spec.agents.begin() + static_cast<std::ptrdiff_t>(at),
                             spec.agents.begin() + static_cast<std::ptrdiff_t>(
                                                       std::min(at + slice, spec.agents.size())));
          try {
            PipelineResult r = run_pipeline(part, model, run);
            // State from this worker's store entry that fails the checks
            // after its restore (cells elsewhere, non-finite logits) though
            // its checksums held: the entry goes, as run_pipeline drops a
            // store entry it looked up (this one is named as a file, checked
            // against the bus's key), and the coordinator hears
            // that the snapshot is unusable (it has it made and published
            // again, and gives these agents one more try).
            if (const ErrorValue* bad = state_error(r);
                bad && !run.snapshot.file.empty() && store.remove_path(run.snapshot.file)) {
              log_warn("worker {}: removed snapshot {} from its store: {}", name, run.snapshot.file,
                       bad->message);
              snapshot_unavailable = true;
            }
            for (AgentResult& a : r.agents) results.push_back(std::move(a));
          } catch (const Error& e) {
            for (const AgentSpec& a : part.agents) {
              AgentResult failed;
              failed.name = a.name;
              failed.status = NodeStatus::kFailed;
              failed.error = e.value();
              results.push_back(std::move(failed));
            }
          }
        }
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kIo && run_id.empty()) throw;
        failure = e.value();
      } catch (const std::exception& e) {
        // Whatever a message makes the code throw fails that job, never the
        // worker: a worker that exited would leave the job pending for the
        // next one to claim and die on.
        failure = ErrorValue{ErrorCode::kCorruption, fmt::format("job {}: {}", job.id, e.what())};
      }
      if (failure) {
        // The whole job failed (its snapshot, its message): every agent says why.
        log_warn("worker {}: job {} failed: {}", name, job.id, failure->to_string());
        results.clear();
        try {
          for (const std::string& agent : job_agents(job)) {
            AgentResult failed;
            failed.name = agent;
            failed.status = NodeStatus::kFailed;
            failed.error = *failure;
            results.push_back(std::move(failed));
          }
        } catch (const Error&) {
          // A message without agent names: nobody waits for its results.
        }
      }
      if (!reruns.empty()) settle_reruns(runs.at(run_id).first, reruns, results);
      if (!run_id.empty()) {
        const std::string results_key = keys::run_results(run_id);
        for (AgentResult& a : results) {
          a.worker = name;
          redis.command(xadd(
              options.cluster_key, results_key, 100000,
              {{"agent", a.name},
               {"worker", name},
               {"job", job.id},
               {"fetch_bytes", std::to_string(fetched.bytes)},
               {"fetch_ms", fmt::format("{:.3f}", fetched.ms)},
               {"snapshot_unavailable", snapshot_unavailable ? "1" : "0"},
               {"result",
                agent_json(a).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}}));
        }
        redis.command({"EXPIRE", results_key, std::to_string(keys::kRunTtlS)});
      }
      // After a Redis restart the group (and the job) may be gone: nothing to acknowledge.
      redis.try_command({"XACK", stream, keys::kWorkersGroup, job.id});
      heartbeat.set_job("");
      ++report.jobs;
      report.agents += results.size();
      if (stale) ++report.claimed_stale;
      log_info("worker {}: job {} done: {} result(s) in {:.0f} ms", name, job.id, results.size(),
               took.ms());
      if (options.max_jobs > 0 && report.jobs >= options.max_jobs) break;
    }
  } catch (const Error& e) {
    // Stopped while waiting for Redis to come back: the job in hand (if
    // any) stays pending for another worker, as after a crash.
    if (options.stop == nullptr || !options.stop->load()) throw;
    log_warn("worker {}: stopped while Redis was away: {}", name, e.message());
  }
  log_info("worker {}: stopping after {} job(s)", name, report.jobs);
  return report;
}

}  // namespace swarmkv::cluster
