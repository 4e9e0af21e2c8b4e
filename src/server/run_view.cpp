#include "server/run_view.h"

#include <fmt/format.h>

#include "swarmkv/result_json.h"

namespace swarmkv::server {
using nlohmann::json;

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

RunView::RunView(const PipelineSpec& spec, size_t prefix_tokens, std::string model)
    : pipeline_(spec.name), agents_(spec.agents.size()) {
  json agents = json::array();
  for (const AgentSpec& a : spec.agents) {
    agents.push_back({{"name", a.name},
                      {"status", "waiting"},
                      {"answer", ""},
                      {"n_tokens", 0},
                      {"token_at_ms", json::array()},
                      {"started_at_ms", 0.0},
                      {"first_token_at_ms", 0.0},
                      {"done_at_ms", 0.0},
                      {"depends_on", a.depends_on},
                      {"fork_from", a.fork_from.empty() ? json() : json(a.fork_from)},
                      {"needs", needs_json(a.needs)}});
  }
  result_ = {{"pipeline", spec.name},
             {"model", std::move(model)},
             {"fork", std::string(to_string(spec.fork))},
             {"exact", spec.exact},
             {"prefix_tokens", prefix_tokens},
             {"agents", std::move(agents)}};
}

json& RunView::agent(const json& name) {
  for (json& a : result_["agents"]) {
    if (a["name"] == name) return a;
  }
  throw Error(ErrorCode::kInternal, fmt::format("run view: no agent {}", name.dump()));
}

void RunView::apply(const PipelineEvent& e, double at_ms) {
  if (state_ == RunState::kOk || state_ == RunState::kFailed) return;
  if (e.name == "result") {
    result_ = e.data;
    state_ = result_.value("ok", false) ? RunState::kOk : RunState::kFailed;
    done_ = agents_;
    return;
  }
  if (e.name == "error") {
    state_ = RunState::kFailed;
    error_ = e.error;
    return;
  }
  state_ = RunState::kRunning;
  if (e.name == "prefill") {
    prefill_done_ = e.data.value("done", size_t{0});
    prefill_total_ = e.data.value("total", size_t{0});
    // The document's bar grows until its last chunk.
    result_["prefill_ms"] = at_ms;
    result_["prefill_done_at_ms"] = at_ms;
  } else if (e.name == "agent_started") {
    json& a = agent(e.data.at("agent"));
    a["status"] = "running";
    a["started_at_ms"] = at_ms;
  } else if (e.name == "token") {
    json& a = agent(e.data.at("agent"));
    a["answer"].get_ref<std::string&>() += e.data.value("text", "");
    if (!e.data.at("token").is_null()) {
      if (a["first_token_at_ms"].get<double>() == 0) a["first_token_at_ms"] = at_ms;
      a["token_at_ms"].push_back(at_ms);
      a["n_tokens"] = a["token_at_ms"].size();
    }
  } else if (e.name == "agent_done") {
    agent(e.data.at("name")) = e.data;
    ++done_;
  }
}

json RunView::result(double now_ms) const {
  json r = result_;
  json live = {{"state", to_string(state_)},
               {"prefill_done", prefill_done_},
               {"prefill_total", prefill_total_}};
  if (error_) live["error"] = error_json(error_);
  if (state_ == RunState::kQueued || state_ == RunState::kRunning) {
    r["total_ms"] = now_ms;
    for (json& a : r["agents"]) {
      if (a["status"] == "running") a["done_at_ms"] = now_ms;
    }
  }
  r["live"] = std::move(live);
  return r;
}

}  // namespace swarmkv::server
