#include "swarmkv/result_json.h"

#include <string>

#include <fmt/format.h>

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
      {"n_tokens", a.tokens.size()},
      {"tokens", a.tokens},
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

AgentResult agent_from_json(const nlohmann::json& j) {
  try {
    AgentResult a;
    j.at("name").get_to(a.name);
    a.status = enum_from<NodeStatus>(j, "status", 3);
    a.error = error_from_json(j.at("error"));
    j.at("answer").get_to(a.answer);
    j.at("tokens").get_to(a.tokens);
    j.at("token_at_ms").get_to(a.token_at_ms);
    if (!j.at("stop_reason").is_null()) a.stop_reason = enum_from<StopReason>(j, "stop_reason", 3);
    j.at("prompt_tokens").get_to(a.prompt_tokens);
    j.at("prompt_rendered").get_to(a.prompt_rendered);
    AgentTimings& t = a.timings_ms;
    for (const auto& [key, member] : kTimingsFields) j.at("timings_ms").at(key).get_to(t.*member);
    j.at("started_at_ms").get_to(t.started_at);
    j.at("first_token_at_ms").get_to(t.first_token_at);
    j.at("done_at_ms").get_to(t.done_at);
    if (!j.at("worker").is_null()) j.at("worker").get_to(a.worker);
    // Results saved before these keys existed have none.
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

std::string dump_json(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace swarmkv
