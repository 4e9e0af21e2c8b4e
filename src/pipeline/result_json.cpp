#include "swarmkv/result_json.h"

#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "pipeline/dag.h"

namespace swarmkv {
namespace {

// The value of enum E whose to_string() is j[field]; values 0..count-1.
template <class E>
E enum_from(const nlohmann::json& j, const char* field, int count) {
  const std::string name = j.at(field).get<std::string>();
  for (int i = 0; i < count; ++i) {
    if (to_string(static_cast<E>(i)) == name) return static_cast<E>(i);
  }
  throw Error(ErrorCode::kCorruption, fmt::format("unknown {} '{}'", field, name));
}

// "timings_ms": its keys and the AgentTimings fields they hold, both ways.
// started_at and first_token_at stand beside it (*_at_ms); done_at is in
// both places.
constexpr std::pair<const char*, double AgentTimings::*> kTimingsFields[] = {
    {"wait", &AgentTimings::wait},
    {"context", &AgentTimings::context},
    {"prefill", &AgentTimings::prefill},
    {"fork", &AgentTimings::fork},
    {"restore", &AgentTimings::restore},
    {"prompt", &AgentTimings::prompt},
    {"first_token", &AgentTimings::first_token},
    {"generate", &AgentTimings::generate},
    {"total", &AgentTimings::total},
    {"done_at", &AgentTimings::done_at}};

nlohmann::json token_logprob_json(const TokenLogprob& t) {
  return {{"token", t.token}, {"text", t.text}, {"logprob", t.logprob}};
}

TokenLogprob token_logprob_from_json(const nlohmann::json& j) {
  return {j.at("token").get<Token>(), j.at("logprob").get<float>(),
          j.at("text").get<std::string>()};
}

std::vector<SampledLogprobs> logprobs_from_json(const nlohmann::json& j) {
  std::vector<SampledLogprobs> out;
  for (const nlohmann::json& e : j) {
    SampledLogprobs s{.sampled = token_logprob_from_json(e), .top = {}};
    for (const nlohmann::json& t : e.at("top_logprobs"))
      s.top.push_back(token_logprob_from_json(t));
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

nlohmann::json error_json(const std::optional<ErrorValue>& error) {
  if (!error) return nullptr;
  return {{"code", std::string(to_string(error->code))}, {"message", error->message}};
}

std::optional<ErrorValue> error_from_json(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  return ErrorValue{enum_from<ErrorCode>(j, "code", static_cast<int>(ErrorCode::kInternal) + 1),
                    j.at("message").get<std::string>()};
}

nlohmann::json logprobs_json(const std::vector<SampledLogprobs>& tokens) {
  if (tokens.empty()) return nullptr;
  nlohmann::json out = nlohmann::json::array();
  for (const SampledLogprobs& s : tokens) {
    nlohmann::json e = token_logprob_json(s.sampled);
    nlohmann::json top = nlohmann::json::array();
    for (const TokenLogprob& t : s.top) top.push_back(token_logprob_json(t));
    e["top_logprobs"] = std::move(top);
    out.push_back(std::move(e));
  }
  return out;
}

nlohmann::json timings_json(const AgentTimings& t) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, member] : kTimingsFields) j[key] = t.*member;
  return j;
}

nlohmann::json agent_json(const AgentResult& a) {
  return {
      {"name", a.name},
      {"status", std::string(to_string(a.status))},
      {"error", error_json(a.error)},
      {"answer", a.answer},
      // The answer parsed, when it is JSON its agent's schema asked for.
      {"answer_json", a.answer_is_json ? nlohmann::json::parse(a.answer) : nlohmann::json(nullptr)},
      {"n_tokens", a.tokens.size()},
      {"tokens", a.tokens},
      {"logprobs", logprobs_json(a.logprobs)},
      {"stop_reason", a.status == NodeStatus::kOk
                          ? nlohmann::json(std::string(to_string(a.stop_reason)))
                          : nlohmann::json(nullptr)},
      {"prompt_tokens", a.prompt_tokens},
      {"prompt_rendered", a.prompt_rendered},
      {"started_at_ms", a.timings_ms.started_at},
      {"first_token_at_ms", a.timings_ms.first_token_at},
      {"done_at_ms", a.timings_ms.done_at},
      {"token_at_ms", a.token_at_ms},
      {"timings_ms", timings_json(a.timings_ms)},
      {"worker", a.worker.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.worker)},
      {"depends_on", a.depends_on},
      {"fork_from", a.fork_from.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.fork_from)},
      {"needs", needs_json(a.needs)}};
}

namespace {

// agent_json's agent back. `strict` (agent_from_json): every key agent_json
// writes but "n_tokens" must be there; else (result_from_json) a key left
// out keeps its field's default, and a status "waiting" or "running" (a run
// going on) is written to `phase`. Either way "depends_on", "fork_from" and
// "needs" may be missing: results saved before they existed have none.
AgentResult read_agent(const nlohmann::json& j, bool strict, AgentPhase* phase = nullptr) {
  const auto find = [&](const char* key) -> const nlohmann::json* {
    if (strict) return &j.at(key);
    const auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  };
  const auto get = [&](const char* key, auto& out) {
    if (const nlohmann::json* v = find(key)) v->get_to(out);
  };
  AgentResult a;
  get("name", a.name);
  const std::string status = j.at("status").get<std::string>();
  if (!strict &&
      (status == to_string(AgentPhase::kWaiting) || status == to_string(AgentPhase::kRunning))) {
    *phase =
        status == to_string(AgentPhase::kWaiting) ? AgentPhase::kWaiting : AgentPhase::kRunning;
  } else {
    a.status = enum_from<NodeStatus>(j, "status", 3);
  }
  if (const nlohmann::json* e = find("error")) a.error = error_from_json(*e);
  get("answer", a.answer);
  // Optional even when strict: results saved before it existed have none.
  if (const auto it = j.find("answer_json"); it != j.end()) a.answer_is_json = !it->is_null();
  get("tokens", a.tokens);
  // Optional even when strict: results saved before it existed have none.
  if (const auto it = j.find("logprobs"); it != j.end() && !it->is_null()) {
    a.logprobs = logprobs_from_json(*it);
  }
  get("token_at_ms", a.token_at_ms);
  if (const nlohmann::json* r = find("stop_reason"); r && !r->is_null())
    a.stop_reason = enum_from<StopReason>(j, "stop_reason", 3);
  get("prompt_tokens", a.prompt_tokens);
  get("prompt_rendered", a.prompt_rendered);
  AgentTimings& t = a.timings_ms;
  if (const nlohmann::json* timings = find("timings_ms")) {
    for (const auto& [key, member] : kTimingsFields) {
      if (strict || timings->contains(key)) timings->at(key).get_to(t.*member);
    }
  }
  get("started_at_ms", t.started_at);
  get("first_token_at_ms", t.first_token_at);
  get("done_at_ms", t.done_at);
  if (const nlohmann::json* w = find("worker"); w && !w->is_null()) w->get_to(a.worker);
  if (j.contains("depends_on")) j.at("depends_on").get_to(a.depends_on);
  if (j.contains("fork_from") && !j.at("fork_from").is_null())
    j.at("fork_from").get_to(a.fork_from);
  if (j.contains("needs") && !j.at("needs").is_null()) {
    const nlohmann::json& n = j.at("needs");
    if (!n.is_object()) throw Error(ErrorCode::kCorruption, "a result's needs is not an object");
    if (n.contains("tokens")) n.at("tokens").get_to(a.needs.tokens);
    if (n.contains("until")) n.at("until").get_to(a.needs.until);
  }
  return a;
}

}  // namespace

AgentResult agent_from_json(const nlohmann::json& j) {
  try {
    return read_agent(j, /*strict=*/true);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kCorruption, fmt::format("a result does not parse: {}", e.what()));
  }
}

nlohmann::json snapshot_json(const std::optional<SnapshotUse>& s) {
  if (!s) return nullptr;
  nlohmann::json discarded = nlohmann::json::array();
  for (const ErrorValue& e : s->discarded) discarded.push_back(error_json(e));
  return {{"source", std::string(to_string(s->source))},
          {"key", s->key},
          {"path", s->path},
          {"reused_tokens", s->reused_tokens},
          {"prefilled_tokens", s->prefilled_tokens},
          {"bytes", s->bytes},
          {"load_ms", s->load_ms},
          {"verify_ms", s->verify_ms},
          {"published", s->published},
          {"discarded", discarded}};
}

nlohmann::json memory_json(const PipelineResult& r) {
  return {{"contexts", r.contexts},
          {"kv_cells_peak", r.kv_cells_peak},
          {"kv_bytes_per_cell", r.kv_bytes_per_cell},
          {"kv_bytes_peak", r.kv_bytes_peak()},
          {"kv_bytes_allocated", r.kv_bytes_allocated()},
          {"host_buffer_bytes", r.host_buffer_bytes}};
}

nlohmann::json engine_json(const ContextOptions& o, int32_t n_gpu_layers,
                           int32_t offloaded_layers) {
  return {{"flash_attn", o.flash_attn},   {"kv_type", std::string(to_string(o.type_k))},
          {"n_batch", o.n_batch},         {"n_ubatch", o.n_ubatch},
          {"threads", o.n_threads},       {"threads_batch", o.n_threads_batch},
          {"n_gpu_layers", n_gpu_layers}, {"offloaded_layers", offloaded_layers}};
}

nlohmann::json latency_json(const LatencySummary& l) {
  const auto p = [](const Percentiles& x) {
    return nlohmann::json{{"p50", x.p50}, {"p95", x.p95}, {"p99", x.p99}};
  };
  return {{"agents", l.agents},
          {"queue_ms", p(l.queue)},
          {"ttft_ms", p(l.ttft)},
          {"inter_token_ms", p(l.inter_token)},
          {"completion_ms", p(l.completion)}};
}

nlohmann::json result_json(const PipelineResult& r) {
  nlohmann::json agents = nlohmann::json::array();
  for (const AgentResult& a : r.agents) agents.push_back(agent_json(a));
  return {{"schema_version", kResultSchemaVersion},
          {"pipeline", r.pipeline},
          {"model", r.model},
          {"fork", std::string(to_string(r.fork))},
          {"exact", r.exact},
          {"exact_unavailable", r.exact_unavailable.empty() ? nlohmann::json(nullptr)
                                                            : nlohmann::json(r.exact_unavailable)},
          {"guard",
           r.guard ? nlohmann::json(std::string(to_string(*r.guard))) : nlohmann::json(nullptr)},
          {"ok", r.ok()},
          {"engine", engine_json(r.engine, r.n_gpu_layers, r.offloaded_layers)},
          {"n_ctx", r.n_ctx},
          {"n_seq_max", r.n_seq_max},
          {"prefix_tokens", r.prefix_tokens},
          {"document_prefills", r.document_prefills},
          {"snapshot_bytes", r.snapshot_bytes},
          {"snapshot", snapshot_json(r.snapshot)},
          {"prepare_ms", r.prepare_ms},
          {"prefill_done_at_ms", r.prefill_done_at_ms},
          {"latency", latency_json(latency_summary(r))},
          {"prefill_ms", r.prefill_ms},
          {"export_ms", r.export_ms},
          {"restore_ms", r.restore_ms},
          {"branch_buffer_ms", r.branch_buffer_ms},
          {"total_ms", r.total_ms},
          {"memory", memory_json(r)},
          {"decode_steps", r.decode_steps.size()},
          {"document",
           {{"status", std::string(to_string(r.document_status))},
            {"error", error_json(r.document_error)}}},
          {"agents", agents},
          {"transfer", r.transfer ? nlohmann::json{{"bytes", r.transfer->bytes},
                                                   {"publish_ms", r.transfer->publish_ms},
                                                   {"fetch_ms", r.transfer->fetch_ms},
                                                   {"fetches", r.transfer->fetches}}
                                  : nlohmann::json(nullptr)}};
}

std::string_view to_string(RunState state) noexcept {
  switch (state) {
    case RunState::kQueued:
      return "queued";
    case RunState::kRunning:
      return "running";
    case RunState::kOk:
      return "ok";
    case RunState::kFailed:
      return "failed";
  }
  return "?";
}

std::string_view to_string(AgentPhase phase) noexcept {
  switch (phase) {
    case AgentPhase::kWaiting:
      return "waiting";
    case AgentPhase::kRunning:
      return "running";
    case AgentPhase::kDone:
      return "done";
  }
  return "?";
}

namespace {

// The keys live_result_json writes before a run has its result.
constexpr const char* kKnownWhileGoing[] = {"pipeline", "model",         "fork",
                                            "exact",    "prefix_tokens", "agents"};
constexpr const char* kKnownOfAnAgentGoing[] = {
    "name",       "status",      "answer",        "n_tokens",
    "tokens",     "token_at_ms", "started_at_ms", "first_token_at_ms",
    "done_at_ms", "depends_on",  "fork_from",     "needs"};

nlohmann::json only(const nlohmann::json& j, std::span<const char* const> keys) {
  nlohmann::json out = nlohmann::json::object();
  for (const char* key : keys) out[key] = j.at(key);
  return out;
}

}  // namespace

nlohmann::json live_result_json(const PipelineResult& r, const RunProgress& progress) {
  nlohmann::json j = result_json(r);
  if (!progress.has_result()) {
    nlohmann::json known = only(j, kKnownWhileGoing);
    if (progress.prefill_total > 0) {
      known["prefill_ms"] = j["prefill_ms"];
      known["prefill_done_at_ms"] = j["prefill_done_at_ms"];
    }
    if (progress.going()) known["total_ms"] = j["total_ms"];
    j = std::move(known);
  }
  nlohmann::json& agents = j["agents"];
  for (size_t i = 0; i < progress.agents.size() && i < agents.size(); ++i) {
    if (progress.agents[i] == AgentPhase::kDone) continue;
    nlohmann::json a = only(agents[i], kKnownOfAnAgentGoing);
    a["status"] = std::string(to_string(progress.agents[i]));
    agents[i] = std::move(a);
  }
  nlohmann::json live = {{"state", std::string(to_string(progress.state))},
                         {"prefill_done", progress.prefill_done},
                         {"prefill_total", progress.prefill_total}};
  if (progress.error) live["error"] = error_json(progress.error);
  j["live"] = std::move(live);
  return j;
}

namespace {

// j[key] into `out` when j has it.
template <class T>
void read_key(const nlohmann::json& j, const char* key, T& out) {
  if (const auto it = j.find(key); it != j.end()) it->get_to(out);
}

std::optional<SnapshotUse> snapshot_from_json(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  SnapshotUse s;
  if (j.contains("source")) s.source = enum_from<SnapshotSource>(j, "source", 4);
  read_key(j, "key", s.key);
  read_key(j, "path", s.path);
  read_key(j, "reused_tokens", s.reused_tokens);
  read_key(j, "prefilled_tokens", s.prefilled_tokens);
  read_key(j, "bytes", s.bytes);
  read_key(j, "load_ms", s.load_ms);
  read_key(j, "verify_ms", s.verify_ms);
  read_key(j, "published", s.published);
  if (j.contains("discarded")) {
    for (const nlohmann::json& e : j.at("discarded")) {
      if (std::optional<ErrorValue> v = error_from_json(e)) s.discarded.push_back(std::move(*v));
    }
  }
  return s;
}

void read_engine(const nlohmann::json& j, PipelineResult& r) {
  ContextOptions& o = r.engine;
  read_key(j, "flash_attn", o.flash_attn);
  if (j.contains("kv_type")) o.type_k = o.type_v = enum_from<KvType>(j, "kv_type", 2);
  read_key(j, "n_batch", o.n_batch);
  read_key(j, "n_ubatch", o.n_ubatch);
  read_key(j, "threads", o.n_threads);
  read_key(j, "threads_batch", o.n_threads_batch);
  read_key(j, "n_gpu_layers", r.n_gpu_layers);
  read_key(j, "offloaded_layers", r.offloaded_layers);
}

// The header: every key of result_json but "agents".
void read_header(const nlohmann::json& j, PipelineResult& r) {
  read_key(j, "pipeline", r.pipeline);
  read_key(j, "model", r.model);
  if (j.contains("fork")) r.fork = enum_from<ForkMode>(j, "fork", 3);
  read_key(j, "exact", r.exact);
  if (j.contains("exact_unavailable") && !j.at("exact_unavailable").is_null())
    j.at("exact_unavailable").get_to(r.exact_unavailable);
  if (j.contains("guard") && !j.at("guard").is_null())
    r.guard = enum_from<GuardPolicy>(j, "guard", 2);
  if (j.contains("engine")) read_engine(j.at("engine"), r);
  read_key(j, "n_ctx", r.n_ctx);
  read_key(j, "n_seq_max", r.n_seq_max);
  read_key(j, "prefix_tokens", r.prefix_tokens);
  read_key(j, "document_prefills", r.document_prefills);
  read_key(j, "snapshot_bytes", r.snapshot_bytes);
  if (j.contains("snapshot")) r.snapshot = snapshot_from_json(j.at("snapshot"));
  for (const auto& [key, member] : {std::pair{"prepare_ms", &PipelineResult::prepare_ms},
                                    {"prefill_done_at_ms", &PipelineResult::prefill_done_at_ms},
                                    {"prefill_ms", &PipelineResult::prefill_ms},
                                    {"export_ms", &PipelineResult::export_ms},
                                    {"restore_ms", &PipelineResult::restore_ms},
                                    {"branch_buffer_ms", &PipelineResult::branch_buffer_ms},
                                    {"total_ms", &PipelineResult::total_ms}}) {
    read_key(j, key, r.*member);
  }
  if (j.contains("memory")) {
    const nlohmann::json& m = j.at("memory");
    read_key(m, "contexts", r.contexts);
    read_key(m, "kv_cells_peak", r.kv_cells_peak);
    read_key(m, "kv_bytes_per_cell", r.kv_bytes_per_cell);
    read_key(m, "host_buffer_bytes", r.host_buffer_bytes);
  }
  if (j.contains("decode_steps")) r.decode_steps.resize(j.at("decode_steps").get<size_t>());
  if (j.contains("document")) {
    const nlohmann::json& d = j.at("document");
    if (d.contains("status")) r.document_status = enum_from<NodeStatus>(d, "status", 3);
    if (d.contains("error")) r.document_error = error_from_json(d.at("error"));
  }
  if (j.contains("transfer") && !j.at("transfer").is_null()) {
    const nlohmann::json& t = j.at("transfer");
    TransferFigures& f = r.transfer.emplace();
    read_key(t, "bytes", f.bytes);
    read_key(t, "publish_ms", f.publish_ms);
    read_key(t, "fetch_ms", f.fetch_ms);
    read_key(t, "fetches", f.fetches);
  }
}

const nlohmann::json& need(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    throw Error(
        ErrorCode::kCorruption,
        fmt::format("the result has no '{}'{} (not a swarmkv run --json result?)", key, where));
  }
  return j.at(key);
}

// The agents, and each one's phase.
void read_agents(const nlohmann::json& list, PipelineResult& r, std::vector<AgentPhase>& phases) {
  if (!list.is_array()) throw Error(ErrorCode::kCorruption, "the result's 'agents' is not a list");
  for (const nlohmann::json& a : list) {
    const size_t i = r.agents.size();
    const std::string where = fmt::format(" in agent {}", i);
    need(a, "name", where);
    need(a, "status", where);
    AgentPhase phase = AgentPhase::kDone;
    try {
      r.agents.push_back(read_agent(a, /*strict=*/false, &phase));
    } catch (const std::exception& e) {
      const Error* error = dynamic_cast<const Error*>(&e);
      throw Error(ErrorCode::kCorruption,
                  fmt::format("agent {} of the result does not read: {}", i,
                              error ? error->message() : std::string(e.what())));
    }
    phases.push_back(phase);
  }
}

}  // namespace

bool ResultRead::has(std::string_view key) const {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

ResultRead result_from_json(const nlohmann::json& j) {
  if (!j.is_object()) {
    throw Error(ErrorCode::kCorruption,
                "the result is not a JSON object (not a swarmkv run --json result?)");
  }
  ResultRead out;
  for (const auto& item : j.items()) out.keys.push_back(item.key());
  std::vector<AgentPhase> phases;
  read_agents(need(j, "agents", ""), out.result, phases);
  try {
    read_header(j, out.result);
    if (j.contains("live")) {
      const nlohmann::json& l = j.at("live");
      RunProgress& p = out.live.emplace();
      p.state = enum_from<RunState>(l, "state", 4);
      read_key(l, "prefill_done", p.prefill_done);
      read_key(l, "prefill_total", p.prefill_total);
      if (l.contains("error")) p.error = error_from_json(l.at("error"));
      p.agents = std::move(phases);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kCorruption, fmt::format("the result does not read: {}", e.what()));
  }
  return out;
}

std::vector<int> agent_depths(const std::vector<AgentResult>& agents) {
  std::map<std::string, size_t> node;  // a name's first agent, as a DAG node (the document is 0)
  for (size_t i = 0; i < agents.size(); ++i) node.emplace(agents[i].name, i + 1);
  std::vector<std::vector<size_t>> deps(agents.size() + 1);
  for (size_t i = 0; i < agents.size(); ++i) {
    std::vector<size_t>& up = deps[i + 1];
    up.push_back(0);
    std::vector<std::string> names = agents[i].depends_on;
    if (!agents[i].fork_from.empty()) names.push_back(agents[i].fork_from);
    for (const std::string& name : names) {
      if (const auto it = node.find(name); it != node.end() && it->second != i + 1)
        up.push_back(it->second);
    }
  }
  std::vector<int> depths = detail::node_depths(deps);
  depths.erase(depths.begin());
  return depths;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace swarmkv
