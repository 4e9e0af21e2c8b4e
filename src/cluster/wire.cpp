// What the coordinator and the workers send each other: the job and result
// entries (wire.h), the run's pipeline, the heartbeat's time.
#include "cluster/wire.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "cluster/keys.h"
#include "swarmkv/error.h"
#include "swarmkv/result_json.h"

namespace swarmkv::cluster {

std::vector<StreamEntry> stream_entries(const redis::Reply& list) {
  std::vector<StreamEntry> out;
  for (const redis::Reply& e : list.elements) {
    if (e.elements.size() < 2) continue;
    StreamEntry entry;
    entry.id = e.elements[0].str;
    const auto& kv = e.elements[1].elements;
    for (size_t i = 0; i + 1 < kv.size(); i += 2) entry.fields[kv[i].str] = kv[i + 1].str;
    out.push_back(std::move(entry));
  }
  return out;
}

int64_t redis_time_ms(redis::Client& redis) {
  const redis::Reply r = redis.command({"TIME"});
  int64_t s = 0, us = 0;
  if (r.elements.size() != 2 ||
      std::from_chars(r.elements[0].str.data(), r.elements[0].str.data() + r.elements[0].str.size(),
                      s)
              .ec != std::errc() ||
      std::from_chars(r.elements[1].str.data(), r.elements[1].str.data() + r.elements[1].str.size(),
                      us)
              .ec != std::errc()) {
    throw Error(ErrorCode::kIo, "Redis answered TIME with something other than two numbers");
  }
  return s * 1000 + us / 1000;
}

std::optional<std::string> stale_heartbeat(const nlohmann::json& doc, int64_t now_ms) {
  const auto at = doc.find(kHeartbeatAtField), ttl = doc.find(kHeartbeatTtlField);
  if (at == doc.end() || ttl == doc.end() || !at->is_number_integer() || !ttl->is_number_integer())
    return "its heartbeat carries no time (a worker older than this coordinator?)";
  const int64_t age = now_ms - at->get<int64_t>();
  if (age > ttl->get<int64_t>()) {
    return fmt::format(
        "its heartbeat is {:.1f} s old, past its {:.1f} s life: written again since (a replay?)",
        age / 1000.0, ttl->get<int64_t>() / 1000.0);
  }
  return std::nullopt;
}

nlohmann::json spec_to_json(const PipelineSpec& spec, GuardPolicy guard) {
  nlohmann::json pipeline = pipeline_json(spec);
  // The worker's own: its model file (the job stream is per model), threads
  // and GPU layers (worker --n-gpu-layers).
  for (const char* local : {"model", "threads", "threads_batch", "n_gpu_layers"})
    pipeline.erase(local);
  return {{"pipeline", std::move(pipeline)},
          {"document_source", spec.document_source},
          {"guard", std::string(to_string(guard))}};
}

PipelineSpec spec_from_json(const nlohmann::json& j, GuardPolicy* guard) {
  try {
    PipelineSpec spec = parse_pipeline_json(j.at("pipeline"), "pipeline", "");
    j.at("document_source").get_to(spec.document_source);
    if (guard != nullptr) *guard = parse_guard_policy(j.at("guard").get<std::string>());
    return spec;
  } catch (const Error& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("a pipeline message does not parse: {}", e.message()));
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("a pipeline message does not parse: {}", e.what()));
  }
}

// ------------------------------------------------------------------ jobs

namespace {

std::string field(const StreamEntry& e, const std::string& name) {
  const auto it = e.fields.find(name);
  if (it == e.fields.end()) {
    throw Error(ErrorCode::kCorruption, fmt::format("job {} has no '{}' field", e.id, name));
  }
  return it->second;
}

// The rendered prompts a job carries for its agents with placeholders
// ("prompts": a JSON object, agent name -> prompt text; absent: none).
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

// The ancestors a job runs again for its fork_from children, with the
// answers they gave the first time ("rerun": a JSON object, agent name ->
// token array; absent: none).
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

}  // namespace

const std::string& JobMessage::snapshot_key() const {
  if (!snapshot) {
    throw Error(ErrorCode::kCorruption, fmt::format("job {} has no 'snapshot' field", id));
  }
  return *snapshot;
}

EntryFields job_fields(const JobMessage& job) {
  EntryFields fields = {{"run", job.run}};
  if (job.snapshot) fields.emplace_back("snapshot", *job.snapshot);
  if (job.prefill) {
    fields.emplace_back("prefill", *job.prefill == Publish::kReplace ? "replace" : "if_absent");
    return fields;
  }
  fields.emplace_back("agents", nlohmann::json(job.agents).dump());
  if (!job.prompts.empty()) {
    fields.emplace_back(
        "prompts",
        nlohmann::json(job.prompts).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  if (!job.reruns.empty()) fields.emplace_back("rerun", nlohmann::json(job.reruns).dump());
  return fields;
}

std::string job_run(const StreamEntry& entry) {
  return field(entry, "run");
}

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

JobMessage job_from_entry(const StreamEntry& entry) {
  JobMessage job;
  job.id = entry.id;
  job.run = job_run(entry);
  if (is_prefill_job(entry)) {
    job.snapshot = field(entry, "snapshot");
    job.prefill = field(entry, "prefill") == "replace" ? Publish::kReplace : Publish::kIfAbsent;
    return job;
  }
  if (const auto s = entry.fields.find("snapshot"); s != entry.fields.end())
    job.snapshot = s->second;
  job.agents = job_agents(entry);
  job.prompts = job_prompts(entry, job.agents);
  job.reruns = job_reruns(entry, job.agents);
  return job;
}

std::string job_run_shown(const StreamEntry& entry) {
  const auto run = entry.fields.find("run");
  return run == entry.fields.end() ? std::string() : run->second.substr(0, 100);
}

bool is_prefill_job(const StreamEntry& entry) {
  return entry.fields.count("prefill") > 0;
}

// ------------------------------------------------------------------ results

namespace {

std::string text_of(const StreamEntry& e, const char* name) {
  const auto it = e.fields.find(name);
  return it == e.fields.end() ? std::string() : it->second;
}

// The number (milliseconds, bytes) in field `name`; 0, noted in
// r.bad_figures, for anything else.
double figure(const StreamEntry& e, const char* name, ResultEntry& r) {
  const std::string text = text_of(e, name);
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < 0) {
    r.bad_figures.push_back(fmt::format("{} '{}'", name, text.substr(0, 40)));
    return 0;
  }
  return v;
}

AgentResult agent_result(const StreamEntry& e, const ResultEntry& r) {
  AgentResult a;
  try {
    a = agent_from_json(nlohmann::json::parse(text_of(e, "result")));
  } catch (const std::exception& bad) {
    a = AgentResult{};
    a.name = r.agent;
    a.status = NodeStatus::kFailed;
    a.error = ErrorValue{
        ErrorCode::kCorruption,
        fmt::format("the result from worker '{}' does not parse: {}", r.worker, bad.what())};
  }
  a.worker = r.worker;
  return a;
}

PrefillOutcome prefill_outcome(const StreamEntry& e, ResultEntry& r) {
  PrefillOutcome p;
  try {
    p.error = error_from_json(nlohmann::json::parse(text_of(e, "prefill")));
  } catch (const std::exception& bad) {
    p.error = ErrorValue{ErrorCode::kCorruption,
                         fmt::format("its report does not parse: {}", bad.what())};
  }
  if (p.error) return p;
  p.prefill_ms = figure(e, "prefill_ms", r);
  p.bytes = static_cast<uint64_t>(figure(e, "bytes", r));
  p.publish_ms = figure(e, "publish_ms", r);
  return p;
}

}  // namespace

EntryFields result_fields(const ResultEntry& r) {
  EntryFields fields = {{"agent", r.agent}, {"worker", r.worker}, {"job", r.job}};
  if (r.prefill) {
    fields.emplace_back("prefill", error_json(r.prefill->error).dump());
    fields.emplace_back("prefill_ms", fmt::format("{:.3f}", r.prefill->prefill_ms));
    fields.emplace_back("publish_ms", fmt::format("{:.3f}", r.prefill->publish_ms));
    fields.emplace_back("bytes", std::to_string(r.prefill->bytes));
    return fields;
  }
  fields.emplace_back("fetch_bytes", std::to_string(r.fetch_bytes));
  fields.emplace_back("fetch_ms", fmt::format("{:.3f}", r.fetch_ms));
  fields.emplace_back("snapshot_unavailable", r.snapshot_unavailable ? "1" : "0");
  fields.emplace_back("result", agent_json(r.result).dump(
                                    -1, ' ', false, nlohmann::json::error_handler_t::replace));
  return fields;
}

ResultEntry result_from_entry(const StreamEntry& e) {
  ResultEntry r;
  r.id = e.id;
  r.agent = text_of(e, "agent");
  r.worker = text_of(e, "worker");
  r.job = text_of(e, "job");
  if (!r.agent.empty()) {
    r.result = agent_result(e, r);
    r.fetch_bytes = static_cast<uint64_t>(figure(e, "fetch_bytes", r));
    if (r.fetch_bytes != 0) r.fetch_ms = figure(e, "fetch_ms", r);
    r.snapshot_unavailable = text_of(e, "snapshot_unavailable") == "1";
  }
  if (e.fields.count("prefill") > 0) r.prefill = prefill_outcome(e, r);
  return r;
}

// ------------------------------------------------------------------ dead letters

EntryFields dead_letter_fields(const StreamEntry& job, int64_t deliveries,
                               const std::string& worker, const std::string& reason) {
  EntryFields fields = {{"job", job.id},
                        {"deliveries", std::to_string(deliveries)},
                        {"worker", worker},
                        {"reason", reason}};
  for (const auto& [key, value] : job.fields) fields.emplace_back("job." + key, value);
  return fields;
}

}  // namespace swarmkv::cluster
