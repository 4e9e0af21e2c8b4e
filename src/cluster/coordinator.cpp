// `swarmkv run --redis`: the coordinator. Puts the document's snapshot on
// the bus (from Redis, the local store or a prefill), enqueues agents as
// their dependencies finish, and keeps the first result of each agent.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <random>
#include <set>

#include <fmt/format.h>
#include <unistd.h>

#include "cluster/keys.h"
#include "pipeline/dag.h"
#include "pipeline/fork_strategy.h"
#include "pipeline/prefix_source.h"
#include "swarmkv/cluster.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/result_json.h"

namespace swarmkv::cluster {
namespace {

// Names of the workers whose heartbeat key for this model is alive.
std::vector<std::string> live_workers(redis::Client& redis, const std::string& fp) {
  const std::string prefix = keys::worker(fp, "");
  std::vector<std::string> names;
  std::string cursor = "0";
  do {
    const redis::Reply r = redis.command({"SCAN", cursor, "MATCH", prefix + "*", "COUNT", "1000"});
    if (r.elements.size() < 2) break;
    cursor = r.elements[0].str;
    for (const redis::Reply& k : r.elements[1].elements)
      names.push_back(k.str.substr(prefix.size()));
  } while (cursor != "0");
  return names;
}

// The milliseconds a worker wrote into a result entry's field `name`; 0,
// with a warning, for anything else: a timing is not worth the run.
double entry_ms(const StreamEntry& e, const char* name) {
  const auto it = e.fields.find(name);
  const std::string text = it == e.fields.end() ? std::string() : it->second;
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < 0) {
    log_warn("coordinator: result entry {} has {} '{}', not milliseconds; counted as 0", e.id, name,
             text.substr(0, 40));
    return 0;
  }
  return v;
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

}  // namespace

PipelineResult run_distributed(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                               const redis::Url& url, const CoordinatorOptions& options) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "run_distributed needs a model");
  const Stopwatch run;
  if (spec.exact) {  // workers load their models without batch-invariant kernels
    throw Error(ErrorCode::kInvalidArgument,
                "exact does not run on a cluster yet; run this pipeline without --redis");
  }
  const PreparedPipeline prepared = prepare_pipeline(spec, *model);
  for (const AgentSpec& a : spec.agents) {
    if (detail::renders_at_start(a)) {  // its branch needs other agents' answers
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}': placeholders ({{{{name}}}}) and fork_from do not run on "
                              "a cluster yet; run this pipeline without --redis",
                              a.name));
    }
  }
  redis::Client redis(url);
  const std::string fp = model_fingerprint(model->path());
  const std::string model_file = std::filesystem::path(model->path()).filename().string();
  const auto require_workers = [&](std::string_view when) {
    std::vector<std::string> live = live_workers(redis, fp);
    if (live.empty()) {
      throw Error(ErrorCode::kNotFound,
                  fmt::format("no live swarmkv worker holds model {} (sha256 {}) at {}{}; start "
                              "one with: swarmkv worker --redis URL --model {}",
                              model_file, fp.substr(0, 12), url.address(), when, model_file));
    }
    return live;
  };
  std::vector<std::string> live = require_workers("");

  PipelineResult result;
  result.fork = spec.fork;
  result.exact = spec.exact;
  if (fork_traits(spec.fork).branch_workers) result.guard = options.run.guard;
  result.engine = engine_options(spec);
  result.engine.n_threads = 0;  // the workers' own
  result.engine.n_threads_batch = 0;
  result.prefix_tokens = prepared.budget.prefix_tokens;
  result.n_ctx = prepared.budget.n_ctx;
  result.n_seq_max = prepared.budget.n_seq_max;
  result.prepare_ms = run.ms();
  result.agents.resize(spec.agents.size());
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    result.agents[i].name = spec.agents[i].name;
    result.agents[i].prompt_tokens = static_cast<int32_t>(prepared.branches[i].size());
  }
  TransferFigures transfer;

  // The document's snapshot on the bus: found there, else made here
  // (local store or prefill) and published.
  std::string key;
  std::vector<uint8_t> file;  // kept to publish again if Redis loses it
  std::optional<ErrorValue> document_error;
  const auto put_snapshot_on_bus = [&](Publish mode) {
    if (std::optional<Manifest> m =
            mode == Publish::kReplace ? std::nullopt : find_snapshot(redis, key)) {
      touch_snapshot(redis, *m, options.bus.ttl_s);
      transfer.bytes = m->bytes;
      return;
    }
    if (file.empty()) {
      detail::PrefixState made =
          detail::obtain_prefix_state(spec, prepared.prefix, options.run, model);
      file = encode_snapshot(detail::prefix_meta(*model, spec, prepared.prefix), made.bytes);
      result.prefill_ms = made.prefill_ms;
      result.export_ms = made.export_ms;
      result.document_prefills = made.use.prefilled_tokens > 0 ? 1 : 0;
      result.snapshot = std::move(made.use);
    }
    const PublishReport p = publish_snapshot(redis, key, file, options.bus, mode);
    transfer.bytes = p.bytes;
    transfer.publish_ms += p.ms;
    log_info("coordinator: published snapshot {} ({:.1f} MiB, {} chunks) in {:.0f} ms", key,
             p.bytes / 1048576.0, p.chunks, p.ms);
  };
  if (fork_traits(spec.fork).prefix_state) {
    key = snapshot_key(detail::prefix_binding(*model, spec), prepared.prefix);
    SnapshotUse use;
    use.source = SnapshotSource::kRedis;
    use.key = key;
    use.reused_tokens = result.prefix_tokens;
    result.snapshot = use;
    try {
      put_snapshot_on_bus(Publish::kIfAbsent);
      result.snapshot->bytes = transfer.bytes;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kIo && e.message().rfind(url.address(), 0) == 0) throw;
      document_error = e.value();
    }
  }

  const std::string run_id = random_id();
  const std::string stream = keys::jobs(fp);
  const std::string results_key = keys::run_results(run_id);
  const auto put_run = [&] {
    redis.command({"SET", keys::run_spec(run_id), spec_to_json(spec, options.run.guard).dump(),
                   "EX", std::to_string(keys::kRunTtlS)});
    ensure_job_group(redis, stream);
  };
  put_run();

  detail::ReadySet dag = detail::ready_set(spec);
  dag.pop();
  if (document_error) {
    dag.fail(0, *document_error);
  } else {
    dag.succeed(0);
  }

  std::vector<bool> answered(spec.agents.size(), false);
  std::set<size_t> in_flight;  // agents enqueued and not answered
  std::set<std::string> fetched_jobs;
  const auto enqueue = [&](const std::vector<size_t>& agents) {
    if (agents.empty()) return;
    const size_t per_job = options.agents_per_job > 0
                               ? static_cast<size_t>(options.agents_per_job)
                               : (agents.size() + std::max<size_t>(live.size(), 1) - 1) /
                                     std::max<size_t>(live.size(), 1);
    for (size_t at = 0; at < agents.size(); at += per_job) {
      nlohmann::json list = nlohmann::json::array();
      for (size_t k = at; k < std::min(at + per_job, agents.size()); ++k)
        list.push_back(spec.agents[agents[k]].name);
      const redis::Reply id = redis.command({"XADD", stream, "MAXLEN", "~", "10000", "*", "run",
                                             run_id, "snapshot", key, "agents", list.dump()});
      log_info("coordinator: job {}: {}", id.str, list.dump());
    }
  };

  std::string last_id = "0-0";
  uint64_t reconnects = redis.reconnects();
  Stopwatch since_check;
  Stopwatch since_seen;  // a live worker was seen
  std::vector<bool> retried(spec.agents.size(), false);
  bool republished = false;
  uint64_t duplicates = 0;
  while (!dag.finished()) {
    std::vector<size_t> ready;
    while (const std::optional<size_t> node = dag.pop()) {
      ready.push_back(*node - 1);
      in_flight.insert(*node - 1);
    }
    enqueue(ready);
    if (dag.finished()) break;
    if (run.ms() > options.timeout_s * 1000) {
      std::vector<std::string> open;
      for (const size_t i : in_flight) open.push_back(spec.agents[i].name);
      throw Error(ErrorCode::kIo,
                  fmt::format("timed out after {:.0f} s with {} agent(s) unanswered ({}); the "
                              "workers at {} did not answer in time",
                              options.timeout_s, open.size(), join(open), url.address()));
    }
    const redis::Reply r =
        redis.command({"XREAD", "COUNT", "100", "BLOCK", "1000", "STREAMS", results_key, last_id});
    if (redis.reconnects() != reconnects) {
      reconnects = redis.reconnects();
      if (redis.command({"EXISTS", keys::run_spec(run_id)}).integer == 0) {
        // Redis restarted without its data: everything this run put there is
        // gone. Put it back and enqueue the unanswered agents again.
        log_warn(
            "coordinator: {} lost this run's state (restarted?); publishing the snapshot "
            "and enqueueing {} agent(s) again",
            url.address(), in_flight.size());
        if (fork_traits(spec.fork).prefix_state && !document_error)
          put_snapshot_on_bus(Publish::kIfAbsent);
        put_run();
        last_id = "0-0";
        enqueue(std::vector<size_t>(in_flight.begin(), in_flight.end()));
        continue;
      }
    }
    std::vector<StreamEntry> entries;
    if (!r.is_nil() && !r.elements.empty() && r.elements[0].elements.size() >= 2)
      entries = stream_entries(r.elements[0].elements[1]);
    for (StreamEntry& e : entries) {
      last_id = e.id;
      std::map<std::string, std::string>& f = e.fields;
      const std::optional<size_t> index = spec.agent_index(f["agent"]);
      if (!index) continue;
      const size_t i = *index;
      if (answered[i] || in_flight.count(i) == 0) {
        ++duplicates;
        continue;
      }
      AgentResult a;
      try {
        a = agent_from_json(nlohmann::json::parse(f["result"]));
      } catch (const std::exception& bad) {
        a.name = spec.agents[i].name;
        a.status = NodeStatus::kFailed;
        a.error = ErrorValue{
            ErrorCode::kCorruption,
            fmt::format("the result from worker '{}' does not parse: {}", f["worker"], bad.what())};
      }
      a.worker = f["worker"];
      a.timings_ms.done_at = run.ms();
      if (f["fetch_bytes"] != "0" && fetched_jobs.insert(f["job"]).second) {
        ++transfer.fetches;
        transfer.fetch_ms = std::max(transfer.fetch_ms, entry_ms(e, "fetch_ms"));
      }
      // A worker that could not get the snapshot from the bus (damaged
      // twice, or gone): publish it again, once per run, replacing the
      // bus's copy, and give the agent one more try.
      if (a.error && !retried[i] && f["snapshot_unavailable"] == "1") {
        retried[i] = true;
        if (!republished) {
          republished = true;
          log_warn("coordinator: {}; publishing the snapshot again", a.error->message);
          put_snapshot_on_bus(Publish::kReplace);
        }
        enqueue({i});
        continue;
      }
      answered[i] = true;
      in_flight.erase(i);
      const bool ok = a.status == NodeStatus::kOk;
      std::optional<ErrorValue> error = a.error;
      result.agents[i] = std::move(a);
      if (ok) {
        dag.succeed(i + 1);
      } else {
        dag.fail(i + 1, error.value_or(ErrorValue{ErrorCode::kInternal, "failed"}));
      }
    }
    if (since_check.ms() > 1000 && !in_flight.empty()) {
      since_check.restart();
      // A worker's key is missing for a moment after a Redis restart: only
      // a longer absence fails the run.
      if (std::vector<std::string> now = live_workers(redis, fp); !now.empty()) {
        live = std::move(now);
        since_seen.restart();
      } else if (since_seen.ms() > kNoWorkerGraceS * 1000) {
        require_workers(fmt::format(" (for {} s, with {} agent(s) unanswered)", kNoWorkerGraceS,
                                    in_flight.size()));
      }
    }
  }
  if (duplicates > 0)
    log_info("coordinator: {} duplicate result(s) ignored (jobs run twice)", duplicates);
  redis.try_command({"DEL", keys::run_spec(run_id), results_key});

  result.document_status = dag.status(0);
  result.document_error = dag.error(0);
  for (size_t i = 0; i < result.agents.size(); ++i) {
    result.agents[i].status = dag.status(i + 1);
    result.agents[i].error = dag.error(i + 1);
  }
  if (fork_traits(spec.fork).prefix_state) result.transfer = transfer;
  result.total_ms = run.ms();
  return result;
}

}  // namespace swarmkv::cluster
