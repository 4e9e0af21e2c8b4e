// `swarmkv run --redis`: the coordinator, an AgentExecutor under
// run_pipeline. Puts the document's snapshot on the bus (from Redis, or
// what the runner obtains from the local store or a prefill), enqueues the
// agents the runner hands it, and keeps the first result of each agent.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>
#include <unistd.h>

#include "cluster/job_split.h"
#include "cluster/keys.h"
#include "cluster/wire.h"
#include "swarmkv/cluster.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/result_json.h"

namespace swarmkv::cluster {
namespace {

// The keys that start with `prefix` (SCAN, a thousand at a time): their
// part after the prefix.
std::vector<std::string> keys_under(redis::Client& redis, const std::string& prefix) {
  std::vector<std::string> rests;
  std::string cursor = "0";
  do {
    const redis::Reply r = redis.command({"SCAN", cursor, "MATCH", prefix + "*", "COUNT", "1000"});
    if (r.elements.size() < 2) break;
    cursor = r.elements[0].str;
    for (const redis::Reply& k : r.elements[1].elements)
      rests.push_back(k.str.substr(prefix.size()));
  } while (cursor != "0");
  return rests;
}

// Names of the workers whose heartbeat key for this pool is alive and,
// under a cluster key, signed with it and fresh (stale_heartbeat); `refused` gets the others' names
// (with why), which a run without any accepted worker reports.
std::vector<std::string> live_workers(redis::Client& redis, const std::string& pool,
                                      const ClusterKey& cluster_key,
                                      std::map<std::string, std::string>* refused = nullptr) {
  const std::string prefix = keys::worker(pool, "");
  std::vector<std::string> names;
  const int64_t now_ms = cluster_key.empty() ? 0 : redis_time_ms(redis);
  for (std::string& name : keys_under(redis, prefix)) {
    if (!cluster_key.empty()) {
      const std::string key = prefix + name;
      const redis::Reply info = redis.command({"GET", key});
      if (info.is_nil()) continue;  // expired since the SCAN
      nlohmann::json doc = nlohmann::json::parse(info.str, nullptr, false);
      std::optional<std::string> why = json_refusal(cluster_key, key, doc);
      if (!why) why = stale_heartbeat(doc, now_ms);
      if (why) {
        if (refused != nullptr) (*refused)[name] = *why;
        continue;
      }
    }
    names.push_back(std::move(name));
  }
  return names;
}

// Live workers of this model and kernels in the pools of other cluster
// keys, or of none (keys::pool: the key's part, "k<id>", comes first).
size_t workers_of_other_keys(redis::Client& redis, const std::string& fp, bool exact,
                             const std::string& key_id) {
  const std::string kernels = exact ? "exact:" : "stock:";
  size_t n = 0;
  for (std::string rest : keys_under(redis, "swarmkv:worker:" + fp + ":")) {
    std::string id;
    if (rest.rfind('k', 0) == 0 && rest.find(':') != std::string::npos) {
      id = rest.substr(1, rest.find(':') - 1);
      rest = rest.substr(rest.find(':') + 1);
    }
    if (rest.rfind(kernels, 0) == 0 && id != key_id) ++n;
  }
  return n;
}

// The figures of a result entry that were not numbers (counted as 0), with
// a warning each: a figure is not worth the run.
void warn_bad_figures(const ResultEntry& r) {
  for (const std::string& bad : r.bad_figures)
    log_warn("coordinator: result entry {} has {}, not a number >= 0; counted as 0", r.id, bad);
}

// How long the run goes on without a live worker before it fails.
constexpr int kNoWorkerGraceS = 10;

std::string random_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

class Coordinator final : public AgentExecutor {
 public:
  Coordinator(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
              const redis::Url& url, const CoordinatorOptions& options)
      : spec_(spec),
        url_(url),
        options_(options),
        fp_(model_fingerprint(model->path())),
        pool_(keys::pool(fp_, spec.exact, options.bus.cluster_key.id())),
        model_file_(std::filesystem::path(model->path()).filename().string()),
        run_id_(random_id()),
        stream_(keys::jobs(pool_)),
        results_key_(keys::run_results(run_id_)),
        answered_(spec.agents.size(), false),
        retried_(spec.agents.size(), false) {}

  void check(const PipelineSpec&) const override {}

  std::optional<ErrorValue> start(const Document& document, PipelineResult& result) override {
    document_ = document;
    // After check(): a refused pipeline never connects. A Redis outage is
    // ridden out for as long as the run may take.
    redis_.emplace(url_, redis::ClientOptions{.reconnect_for_s = options_.timeout_s});
    // Once per process: a corpus runs one coordinator per document.
    static std::atomic<bool> warned{false};
    if (options_.bus.cluster_key.empty() && !warned.exchange(true)) {
      log_warn(
          "coordinator: no cluster key (--cluster-key-file, $SWARMKV_CLUSTER_KEY): the jobs, "
          "results and snapshots on {} are not authenticated",
          url_.address());
    }
    static std::atomic<bool> warned_plain{false};
    if (url_.clear_text_off_host() && !warned_plain.exchange(true)) {
      log_warn(
          "coordinator: {} is plain text: the document, prompts, answers and KV cross the "
          "network readable (rediss:// speaks TLS)",
          url_.address());
    }
    live_ = require_workers("");
    // What a worker decodes for each agent: its prompt and, at most, its answer.
    cost_.resize(spec_.agents.size());
    for (size_t i = 0; i < spec_.agents.size(); ++i)
      cost_[i] = int64_t{result.agents[i].prompt_tokens} + spec_.agents[i].max_tokens;
    result.engine.n_threads = 0;  // the workers' own
    result.engine.n_threads_batch = 0;
    result.n_gpu_layers = 0;
    result.offloaded_layers = 0;
    std::optional<ErrorValue> document_error;
    put_run();  // first: a worker prefilling the document reads the run's pipeline
    if (!document_.snapshot_key.empty()) {
      SnapshotUse use;
      use.source = SnapshotSource::kRedis;
      use.key = document_.snapshot_key;
      use.reused_tokens = result.prefix_tokens;
      result.snapshot = use;
      try {
        put_snapshot_on_bus(Publish::kIfAbsent);
        result.snapshot->bytes = transfer_.bytes;
        if (worker_prefill_ms_ > 0) {  // a worker prefilled it (else it had it in its store)
          result.prefill_ms = worker_prefill_ms_;
          result.document_prefills = 1;
          result.snapshot->source = SnapshotSource::kPrefill;
          result.snapshot->prefilled_tokens = result.prefix_tokens;
          result.snapshot->reused_tokens = 0;
          result.snapshot->published = true;
        }
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kIo && e.message().rfind(url_.address(), 0) == 0) throw;
        document_error = e.value();
      }
    }
    document_failed_ = document_error.has_value();
    reconnects_ = redis_->reconnects();
    return document_error;
  }

  void submit(const std::vector<size_t>& agents) override {
    in_flight_.insert(agents.begin(), agents.end());
    enqueue(agents);
  }

  std::vector<std::pair<size_t, AgentResult>> collect() override {
    if (ms_between(document_.started, Clock::now()) > options_.timeout_s * 1000) {
      std::vector<std::string> open;
      for (const size_t i : in_flight_) open.push_back(spec_.agents[i].name);
      throw Error(ErrorCode::kIo,
                  fmt::format("timed out after {:.0f} s with {} agent(s) unanswered ({}); the "
                              "workers at {} did not answer in time",
                              options_.timeout_s, open.size(), join(open), url_.address()));
    }
    std::vector<std::pair<size_t, AgentResult>> done;
    // Redis away: waited for while the run has time left, no longer.
    redis_->set_reconnect_for_s(
        std::max(0.0, options_.timeout_s - ms_between(document_.started, Clock::now()) / 1000));
    const redis::Reply r = redis_->command(
        {"XREAD", "COUNT", "100", "BLOCK", "1000", "STREAMS", results_key_, last_id_});
    if (redis_->reconnects() != reconnects_) {
      reconnects_ = redis_->reconnects();
      // No worker could heartbeat while Redis was away (their keys may have
      // expired meanwhile): the grace for finding one starts now.
      since_seen_.restart();
      if (redis_->command({"EXISTS", keys::run_spec(run_id_)}).integer == 0) {
        // Redis restarted without its data: everything this run put there is
        // gone. Put it back and enqueue the unanswered agents again.
        log_warn(
            "coordinator: {} lost this run's state (restarted?); publishing the snapshot "
            "and enqueueing {} agent(s) again",
            url_.address(), in_flight_.size());
        put_run();  // first: the worker that publishes the snapshot reads it
        if (!document_.snapshot_key.empty() && !document_failed_)
          put_snapshot_on_bus(Publish::kIfAbsent);
        last_id_ = "0-0";
        enqueue(std::vector<size_t>(in_flight_.begin(), in_flight_.end()));
        return done;
      }
    }
    std::vector<StreamEntry> entries;
    if (!r.is_nil() && !r.elements.empty() && r.elements[0].elements.size() >= 2)
      entries = stream_entries(r.elements[0].elements[1]);
    for (const StreamEntry& e : entries) {
      last_id_ = e.id;
      ResultEntry entry = result_from_entry(e);
      if (refused(e, entry.worker)) continue;
      if (std::optional<std::pair<size_t, AgentResult>> answer = take(entry))
        done.push_back(std::move(*answer));
    }
    check_live_workers();
    return done;
  }

  void finish(PipelineResult& result) override {
    if (duplicates_ > 0)
      log_info("coordinator: {} duplicate result(s) ignored (jobs run twice)", duplicates_);
    redis_->try_command({"DEL", keys::run_spec(run_id_), results_key_});
    if (!document_.snapshot_key.empty()) result.transfer = transfer_;
  }

 private:
  std::vector<std::string> require_workers(std::string_view when) {
    std::map<std::string, std::string> refused;
    std::vector<std::string> live =
        live_workers(*redis_, pool_, options_.bus.cluster_key, &refused);
    if (live.empty()) {
      const bool exact = spec_.exact;
      const ClusterKey& key = options_.bus.cluster_key;
      std::string others;
      for (const auto& [name, why] : refused)
        others +=
            fmt::format("{}worker '{}' is refused: {}", others.empty() ? "" : "; ", name, why);
      if (const size_t elsewhere = workers_of_other_keys(*redis_, fp_, exact, key.id())) {
        others += fmt::format(
            "{}{} live worker(s) of this model hold {}", others.empty() ? "" : "; ", elsewhere,
            key.empty() ? "a cluster key: give the run theirs with --cluster-key-file"
                        : "another cluster key, or none");
      }
      throw Error(
          refused.empty() ? ErrorCode::kNotFound : ErrorCode::kUnauthenticated,
          fmt::format(
              "no live {} swarmkv worker holds model {} (sha256 {}){} at {}{}{}; start "
              "one with: swarmkv worker --redis URL --model {}{}{}",
              exact ? "exact" : "--no-exact", model_file_, fp_.substr(0, 12),
              key.empty() ? "" : fmt::format(" and this run's cluster key (id {})", key.id()),
              url_.address(), when, others.empty() ? "" : " (" + others + ")", model_file_,
              exact ? "" : " --no-exact",
              key.empty() ? "" : " --cluster-key-file <this run's key>"));
    }
    return live;
  }

  // A result entry not signed with the run's cluster key: logged, never
  // taken (a worker with the key answers the agent; else the run times out
  // naming it).
  bool refused(const StreamEntry& e, const std::string& worker) {
    const std::optional<std::string> why = entry_refusal(options_.bus.cluster_key, results_key_, e);
    if (!why) return false;
    log_warn("coordinator: refusing result entry {} (worker '{}'): {}", e.id, worker.substr(0, 100),
             *why);
    return true;
  }

  // The document's snapshot on the bus: found there, else what the runner
  // obtains (local store or prefill), published.
  void put_snapshot_on_bus(Publish mode) {
    const std::string& key = document_.snapshot_key;
    std::optional<Manifest> m;
    if (mode != Publish::kReplace) {
      try {
        m = find_snapshot(*redis_, key, options_.bus.cluster_key);
      } catch (const Error& e) {
        // A manifest that does not parse, or that this run's key refuses:
        // replaced by one this run can use.
        if (e.code() != ErrorCode::kCorruption && e.code() != ErrorCode::kUnauthenticated) throw;
        log_warn("coordinator: {}; publishing the snapshot again", e.message());
        mode = Publish::kReplace;
      }
    }
    if (m) {
      touch_snapshot(*redis_, *m, options_.bus.ttl_s);
      transfer_.bytes = m->bytes;
      return;
    }
    if (options_.run.snapshot.file.empty()) {
      prefill_on_a_worker(mode);
      return;
    }
    // A snapshot file named on the command line: its bytes, as they are.
    const PublishReport p =
        publish_snapshot(*redis_, key, document_.snapshot(), options_.bus, mode);
    transfer_.bytes = p.bytes;
    transfer_.publish_ms += p.ms;
    log_info("coordinator: published snapshot {} ({:.1f} MiB, {} chunks) in {:.0f} ms", key,
             p.bytes / 1048576.0, p.chunks, p.ms);
  }

  // A worker prefills the document (or takes it from its store) and
  // publishes the snapshot: the coordinator tokenises and keys the document
  // but never decodes, so it needs the model file, not its weights or
  // compute (run --redis loads it metadata-only). Waits for the worker's
  // word, within the run's time.
  void prefill_on_a_worker(Publish mode) {
    const std::string& key = document_.snapshot_key;
    const std::string job =
        redis_
            ->command(xadd(options_.bus.cluster_key, stream_, 10000,
                           job_fields({.run = run_id_, .snapshot = key, .prefill = mode})))
            .str;
    log_info("coordinator: prefill job {}: a worker makes snapshot {}", job, key);
    std::string from = "0-0";
    Stopwatch since_seen;
    for (;;) {
      const double left_s = options_.timeout_s - ms_between(document_.started, Clock::now()) / 1000;
      if (left_s <= 0) {
        throw Error(ErrorCode::kIo,
                    fmt::format("timed out after {:.0f} s waiting for a worker to prefill the "
                                "document (prefill job {} at {})",
                                options_.timeout_s, job, url_.address()));
      }
      redis_->set_reconnect_for_s(left_s);
      const redis::Reply r = redis_->command(
          {"XREAD", "COUNT", "100", "BLOCK", "1000", "STREAMS", results_key_, from});
      if (!r.is_nil() && !r.elements.empty() && r.elements[0].elements.size() >= 2) {
        for (const StreamEntry& e : stream_entries(r.elements[0].elements[1])) {
          from = e.id;
          const ResultEntry report = result_from_entry(e);
          if (report.job != job || !report.prefill || refused(e, report.worker)) continue;
          const PrefillOutcome& made = *report.prefill;
          if (made.error) {
            throw Error(made.error->code,
                        fmt::format("worker '{}' could not prefill the document: {}", report.worker,
                                    made.error->message));
          }
          warn_bad_figures(report);
          worker_prefill_ms_ = made.prefill_ms;
          transfer_.bytes = made.bytes;
          transfer_.publish_ms += made.publish_ms;
          log_info("coordinator: worker {} published snapshot {} ({:.1f} MiB, prefill {:.0f} ms)",
                   report.worker, key, made.bytes / 1048576.0, worker_prefill_ms_);
          return;
        }
      }
      if (!live_workers(*redis_, pool_, options_.bus.cluster_key).empty()) {
        since_seen.restart();
      } else if (since_seen.ms() > kNoWorkerGraceS * 1000) {
        require_workers(
            fmt::format(" (for {} s, while waiting for the document's prefill)", kNoWorkerGraceS));
      }
    }
  }

  void put_run() {
    nlohmann::json doc = spec_to_json(spec_, options_.run.guard);
    sign_json(options_.bus.cluster_key, keys::run_spec(run_id_), doc);
    redis_->command(
        {"SET", keys::run_spec(run_id_), doc.dump(), "EX", std::to_string(keys::kRunTtlS)});
    ensure_job_group(*redis_, stream_);
  }

  void enqueue(const std::vector<size_t>& agents) {
    if (agents.empty()) return;
    std::vector<std::vector<size_t>> jobs;
    if (options_.agents_per_job > 0) {
      const auto per_job = static_cast<size_t>(options_.agents_per_job);
      for (size_t at = 0; at < agents.size(); at += per_job)
        jobs.emplace_back(
            agents.begin() + static_cast<std::ptrdiff_t>(at),
            agents.begin() + static_cast<std::ptrdiff_t>(std::min(at + per_job, agents.size())));
    } else {
      jobs = split_by_cost(agents, cost_, std::max<size_t>(live_.size(), 1));
    }
    for (const std::vector<size_t>& agents_of_job : jobs) {
      const JobMessage job = job_message(agents_of_job);
      const redis::Reply id =
          redis_->command(xadd(options_.bus.cluster_key, stream_, 10000, job_fields(job)));
      log_info("coordinator: job {}: {}", id.str, nlohmann::json(job.agents).dump());
    }
  }

  // The job that runs `agents`.
  JobMessage job_message(const std::vector<size_t>& agents) const {
    JobMessage job{.run = run_id_, .snapshot = document_.snapshot_key};
    // A fork_from child continues its parent's conversation, which only a
    // worker that ran the parent holds: the job runs the ancestors again
    // before it, and carries their answers for the worker to check (equal
    // under exact mode, token for token).
    std::set<size_t> runs(agents.begin(), agents.end());
    for (const size_t k : agents) {
      for (auto p = spec_.agent_index(spec_.agents[k].fork_from); p;
           p = spec_.agent_index(spec_.agents[*p].fork_from)) {
        if (!runs.insert(*p).second) continue;
        if (const auto t = answer_tokens_.find(*p); t != answer_tokens_.end())
          job.reruns[spec_.agents[*p].name] = t->second;
      }
    }
    for (const size_t k : runs) {  // pipeline order
      const AgentSpec& a = spec_.agents[k];
      job.agents.push_back(a.name);
      // Prompts with placeholders travel rendered: the upstream answers are here.
      if (!prompt_placeholders(a.prompt).empty()) {
        job.prompts[a.name] = render_prompt(
            a.prompt, placeholder_values(spec_, a.prompt, [&](size_t up) -> const std::string& {
              return answers_.at(spec_.agents[up].name);
            }));
      }
    }
    return job;
  }

  // The answer a result entry carries, the first time its agent answers;
  // nullopt for a duplicate, an unknown agent, or an agent sent once more
  // (its snapshot was unavailable: published again, once per run).
  std::optional<std::pair<size_t, AgentResult>> take(ResultEntry& r) {
    const std::optional<size_t> index = spec_.agent_index(r.agent);
    if (!index) return std::nullopt;
    const size_t i = *index;
    if (answered_[i] || in_flight_.count(i) == 0) {
      ++duplicates_;
      return std::nullopt;
    }
    AgentResult a = std::move(r.result);
    // The worker's times count from its job's start: moved onto this run's
    // clock, the result's arrival taken as its end (late by the transport).
    const double worker_done_at = a.timings_ms.done_at;
    a.timings_ms.done_at = ms_between(document_.started, Clock::now());
    const double shift = a.timings_ms.done_at - worker_done_at;
    if (a.timings_ms.started_at > 0) a.timings_ms.started_at += shift;
    if (a.timings_ms.first_token_at > 0) a.timings_ms.first_token_at += shift;
    for (double& t : a.token_at_ms) t += shift;
    if (r.fetch_bytes != 0 && fetched_jobs_.insert(r.job).second) {
      warn_bad_figures(r);  // its fetch_ms, read once per job
      ++transfer_.fetches;
      transfer_.fetch_ms = std::max(transfer_.fetch_ms, r.fetch_ms);
    }
    // A worker that could not get the snapshot from the bus (damaged
    // twice, or gone): publish it again, once per run, replacing the bus's
    // copy, and give the agent one more try.
    if (a.error && !retried_[i] && r.snapshot_unavailable) {
      retried_[i] = true;
      if (!republished_) {
        republished_ = true;
        log_warn("coordinator: {}; publishing the snapshot again", a.error->message);
        put_snapshot_on_bus(Publish::kReplace);
      }
      enqueue({i});
      return std::nullopt;
    }
    answered_[i] = true;
    in_flight_.erase(i);
    if (a.status == NodeStatus::kOk) {
      answers_[a.name] = a.answer;
      answer_tokens_[i] = a.tokens;
    }
    return std::pair{i, std::move(a)};
  }

  // A worker's key is missing for a moment after a Redis restart: only a
  // longer absence fails the run.
  void check_live_workers() {
    if (since_check_.ms() <= 1000 || in_flight_.empty()) return;
    since_check_.restart();
    if (std::vector<std::string> now = live_workers(*redis_, pool_, options_.bus.cluster_key);
        !now.empty()) {
      live_ = std::move(now);
      since_seen_.restart();
    } else if (since_seen_.ms() > kNoWorkerGraceS * 1000) {
      require_workers(fmt::format(" (for {} s, with {} agent(s) unanswered)", kNoWorkerGraceS,
                                  in_flight_.size()));
    }
  }

  const PipelineSpec& spec_;
  const redis::Url& url_;
  const CoordinatorOptions& options_;
  std::optional<redis::Client> redis_;
  const std::string fp_;
  const std::string pool_;  // keys::pool: the workers of this model and exactness
  const std::string model_file_;
  double worker_prefill_ms_ = 0;  // the document's prefill on a worker, when one made it
  const std::string run_id_;
  const std::string stream_;
  const std::string results_key_;
  Document document_;
  bool document_failed_ = false;
  std::vector<std::string> live_;
  std::vector<int64_t> cost_;  // per agent: prompt tokens + max_tokens (split_by_cost)
  std::map<std::string, std::string> answers_;          // the answers so far, for placeholders
  std::map<size_t, std::vector<Token>> answer_tokens_;  // and their tokens, for fork_from
  TransferFigures transfer_;
  std::vector<bool> answered_;
  std::vector<bool> retried_;
  std::set<size_t> in_flight_;  // agents enqueued and not answered
  std::set<std::string> fetched_jobs_;
  std::string last_id_ = "0-0";
  uint64_t reconnects_ = 0;
  Stopwatch since_check_;
  Stopwatch since_seen_;  // a live worker was seen
  bool republished_ = false;
  uint64_t duplicates_ = 0;
};

}  // namespace

size_t count_live_workers(const redis::Url& url, const Model& model, bool exact,
                          const ClusterKey& cluster_key) {
  redis::Client redis(url);
  return live_workers(redis, keys::pool(model_fingerprint(model.path()), exact, cluster_key.id()),
                      cluster_key)
      .size();
}

PipelineResult run_distributed(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                               const redis::Url& url, const CoordinatorOptions& options) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "run_distributed needs a model");
  std::optional<PipelineSpec> storage;  // the workers run the spec as it runs here
  Coordinator coordinator(exact_settled(spec, *model, storage), model, url, options);
  return run_pipeline(spec, model, options.run, coordinator);
}

}  // namespace swarmkv::cluster
