// What the coordinator and the workers send each other, as JSON.
#include <fmt/format.h>

#include "cluster/keys.h"
#include "swarmkv/error.h"

namespace swarmkv::cluster {
namespace {

// The enum value whose to_string() is `name`; values 0..count-1.
template <class E>
E from_name(const nlohmann::json& j, const char* field, int count) {
  const std::string name = j.at(field).get<std::string>();
  for (int i = 0; i < count; ++i) {
    if (to_string(static_cast<E>(i)) == name) return static_cast<E>(i);
  }
  throw Error(ErrorCode::kCorruption, fmt::format("unknown {} '{}'", field, name));
}

nlohmann::json sampling_json(const SamplingOptions& s) {
  return {{"temperature", s.temperature},
          {"top_p", s.top_p},
          {"top_k", s.top_k},
          {"seed", s.seed},
          {"repeat_penalty", s.repeat_penalty},
          {"repeat_last_n", s.repeat_last_n},
          {"frequency_penalty", s.frequency_penalty},
          {"presence_penalty", s.presence_penalty},
          {"dry_multiplier", s.dry_multiplier},
          {"dry_base", s.dry_base},
          {"dry_allowed_length", s.dry_allowed_length},
          {"dry_penalty_last_n", s.dry_penalty_last_n}};
}

SamplingOptions sampling_from(const nlohmann::json& j) {
  SamplingOptions s;
  j.at("temperature").get_to(s.temperature);
  j.at("top_p").get_to(s.top_p);
  j.at("top_k").get_to(s.top_k);
  j.at("seed").get_to(s.seed);
  j.at("repeat_penalty").get_to(s.repeat_penalty);
  j.at("repeat_last_n").get_to(s.repeat_last_n);
  j.at("frequency_penalty").get_to(s.frequency_penalty);
  j.at("presence_penalty").get_to(s.presence_penalty);
  j.at("dry_multiplier").get_to(s.dry_multiplier);
  j.at("dry_base").get_to(s.dry_base);
  j.at("dry_allowed_length").get_to(s.dry_allowed_length);
  j.at("dry_penalty_last_n").get_to(s.dry_penalty_last_n);
  return s;
}

template <class F>
auto parsing(const char* what, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("a {} message does not parse: {}", what, e.what()));
  }
}

}  // namespace

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

nlohmann::json spec_to_json(const PipelineSpec& spec, GuardPolicy guard) {
  nlohmann::json agents = nlohmann::json::array();
  for (const AgentSpec& a : spec.agents) {
    agents.push_back({{"name", a.name},
                      {"prompt", a.prompt},
                      {"max_tokens", a.max_tokens},
                      {"sampling", sampling_json(a.sampling)},
                      {"stop", a.stop},
                      {"depends_on", a.depends_on},
                      {"priority", a.priority},
                      {"fork_from", a.fork_from}});
  }
  return {{"name", spec.name},
          {"document", spec.document},
          {"document_source", spec.document_source},
          {"system_prompt", spec.system_prompt},
          {"agents", agents},
          {"n_ctx", spec.n_ctx},
          {"n_batch", spec.n_batch},
          {"n_ubatch", spec.n_ubatch},
          {"flash_attn", spec.flash_attn},
          {"kv_type", std::string(to_string(spec.kv_type))},
          {"fork", std::string(to_string(spec.fork))},
          {"max_live", spec.max_live},
          {"guard", std::string(to_string(guard))}};
}

PipelineSpec spec_from_json(const nlohmann::json& j, GuardPolicy* guard) {
  return parsing("pipeline", [&] {
    PipelineSpec spec;
    j.at("name").get_to(spec.name);
    j.at("document").get_to(spec.document);
    j.at("document_source").get_to(spec.document_source);
    j.at("system_prompt").get_to(spec.system_prompt);
    for (const nlohmann::json& a : j.at("agents")) {
      AgentSpec agent;
      a.at("name").get_to(agent.name);
      a.at("prompt").get_to(agent.prompt);
      a.at("max_tokens").get_to(agent.max_tokens);
      agent.sampling = sampling_from(a.at("sampling"));
      a.at("stop").get_to(agent.stop);
      a.at("depends_on").get_to(agent.depends_on);
      a.at("priority").get_to(agent.priority);
      a.at("fork_from").get_to(agent.fork_from);
      spec.agents.push_back(std::move(agent));
    }
    j.at("n_ctx").get_to(spec.n_ctx);
    j.at("n_batch").get_to(spec.n_batch);
    j.at("n_ubatch").get_to(spec.n_ubatch);
    j.at("flash_attn").get_to(spec.flash_attn);
    spec.kv_type = parse_kv_type(j.at("kv_type").get<std::string>());
    spec.fork = parse_fork_mode(j.at("fork").get<std::string>());
    j.at("max_live").get_to(spec.max_live);
    if (guard != nullptr) *guard = parse_guard_policy(j.at("guard").get<std::string>());
    return spec;
  });
}

nlohmann::json agent_to_json(const AgentResult& a) {
  const AgentTimings& t = a.timings_ms;
  return {{"name", a.name},
          {"status", std::string(to_string(a.status))},
          {"error", a.error ? nlohmann::json{{"code", std::string(to_string(a.error->code))},
                                             {"message", a.error->message}}
                            : nlohmann::json(nullptr)},
          {"answer", a.answer},
          {"tokens", a.tokens},
          {"stop_reason", std::string(to_string(a.stop_reason))},
          {"prompt_tokens", a.prompt_tokens},
          {"prompt_rendered", a.prompt_rendered},
          {"timings_ms",
           {t.wait, t.context, t.prefill, t.fork, t.restore, t.prompt, t.first_token, t.generate,
            t.total, t.started_at, t.first_token_at, t.done_at}}};
}

AgentResult agent_from_json(const nlohmann::json& j) {
  return parsing("result", [&] {
    AgentResult a;
    j.at("name").get_to(a.name);
    a.status = from_name<NodeStatus>(j, "status", 3);
    if (!j.at("error").is_null()) {
      const nlohmann::json& e = j.at("error");
      a.error =
          ErrorValue{from_name<ErrorCode>(e, "code", static_cast<int>(ErrorCode::kInternal) + 1),
                     e.at("message").get<std::string>()};
    }
    j.at("answer").get_to(a.answer);
    j.at("tokens").get_to(a.tokens);
    a.stop_reason = from_name<StopReason>(j, "stop_reason", 3);
    j.at("prompt_tokens").get_to(a.prompt_tokens);
    j.at("prompt_rendered").get_to(a.prompt_rendered);
    const std::vector<double> t = j.at("timings_ms").get<std::vector<double>>();
    if (t.size() != 12)
      throw Error(ErrorCode::kCorruption, "a result's timings_ms is not 12 numbers");
    a.timings_ms = {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11]};
    return a;
  });
}

}  // namespace swarmkv::cluster
