#include "server/run_view.h"

#include <algorithm>

#include <fmt/format.h>

namespace swarmkv::server {
using nlohmann::json;

std::string_view to_string(PipelineEvent::Kind kind) noexcept {
  switch (kind) {
    case PipelineEvent::Kind::kPrefill:
      return "prefill";
    case PipelineEvent::Kind::kAgentStarted:
      return "agent_started";
    case PipelineEvent::Kind::kToken:
      return "token";
    case PipelineEvent::Kind::kAgentDone:
      return "agent_done";
    case PipelineEvent::Kind::kDocumentDone:
      return "document_done";
    case PipelineEvent::Kind::kResult:
      return "result";
    case PipelineEvent::Kind::kError:
      return "error";
  }
  return "?";
}

RunView::RunView(const PipelineSpec& spec, size_t prefix_tokens, std::string model) {
  result_.pipeline = spec.name;
  result_.model = std::move(model);
  result_.fork = spec.fork;
  result_.exact = spec.exact;
  result_.prefix_tokens = static_cast<int32_t>(prefix_tokens);
  for (const AgentSpec& a : spec.agents) {
    AgentResult& r = result_.agents.emplace_back();
    r.name = a.name;
    r.depends_on = a.depends_on;
    r.fork_from = a.fork_from;
    r.needs = a.needs;
  }
  progress_.agents.assign(spec.agents.size(), AgentPhase::kWaiting);
}

size_t RunView::agent(const json& name) const {
  for (size_t i = 0; i < result_.agents.size(); ++i) {
    if (name.is_string() && result_.agents[i].name == name.get_ref<const std::string&>()) return i;
  }
  throw Error(ErrorCode::kInternal, fmt::format("run view: no agent {}", name.dump()));
}

void RunView::apply(const PipelineEvent& e, double at_ms) {
  using Kind = PipelineEvent::Kind;
  if (!progress_.going()) return;
  switch (e.kind) {
    case Kind::kResult:
      result_ = result_from_json(e.data).result;
      progress_.state = result_.ok() ? RunState::kOk : RunState::kFailed;
      progress_.agents.assign(result_.agents.size(), AgentPhase::kDone);
      done_ = result_.agents.size();
      return;
    case Kind::kError:
      progress_.state = RunState::kFailed;
      progress_.error = e.error;
      return;
    case Kind::kPrefill:
      progress_.prefill_done = e.data.value("done", size_t{0});
      progress_.prefill_total = e.data.value("total", size_t{0});
      // The document's bar grows until its last chunk.
      result_.prefill_ms = at_ms;
      result_.prefill_done_at_ms = at_ms;
      break;
    case Kind::kAgentStarted: {
      const size_t i = agent(e.data.at("agent"));
      progress_.agents[i] = AgentPhase::kRunning;
      result_.agents[i].timings_ms.started_at = at_ms;
      break;
    }
    case Kind::kToken: {
      AgentResult& a = result_.agents[agent(e.data.at("agent"))];
      a.answer += e.data.value("text", "");
      if (const json& token = e.data.at("token"); !token.is_null()) {
        if (a.timings_ms.first_token_at == 0) a.timings_ms.first_token_at = at_ms;
        a.tokens.push_back(token.get<Token>());
        a.token_at_ms.push_back(at_ms);
      }
      break;
    }
    case Kind::kAgentDone: {
      const size_t i = agent(e.data.at("name"));
      result_.agents[i] = agent_from_json(e.data);
      if (progress_.agents[i] != AgentPhase::kDone) ++done_;
      progress_.agents[i] = AgentPhase::kDone;
      break;
    }
    case Kind::kDocumentDone:  // a corpus's (CorpusView)
      return;
  }
  progress_.state = RunState::kRunning;
}

json RunView::result(double now_ms) const {
  if (!progress_.going()) return live_result_json(result_, progress_);
  PipelineResult r = result_;
  r.total_ms = now_ms;
  for (size_t i = 0; i < r.agents.size(); ++i) {
    if (progress_.agents[i] == AgentPhase::kRunning) r.agents[i].timings_ms.done_at = now_ms;
  }
  return live_result_json(r, progress_);
}

namespace {

size_t agents_ok(const json& result) {
  size_t n = 0;
  if (result.is_object()) {
    for (const json& a : result.value("agents", json::array()))
      n += a.value("status", "") == "ok" ? 1 : 0;
  }
  return n;
}

}  // namespace

CorpusView::CorpusView(const CorpusSpec& corpus, std::string model)
    : pipeline_(corpus.pipeline.name),
      agents_(corpus.pipeline.agents.size() * corpus.documents.size() + corpus.reduce.size()) {
  view_ = {{"schema_version", kCorpusSchemaVersion},
           {"kind", "corpus"},
           {"pipeline", pipeline_},
           {"model", std::move(model)},
           {"fork", std::string(to_string(corpus.pipeline.fork))},
           {"ok", false},
           {"documents_total", corpus.documents.size()},
           {"documents_run", 0},
           {"documents_resumed", 0},
           {"documents_failed", 0},
           {"total_ms", 0.0},
           {"documents", json::array()},
           {"reduce", nullptr}};
}

void CorpusView::apply(const PipelineEvent& e, double at_ms) {
  using Kind = PipelineEvent::Kind;
  if (state_ != RunState::kQueued && state_ != RunState::kRunning) return;
  switch (e.kind) {
    case Kind::kResult:
      view_ = e.data;
      state_ = view_.value("ok", false) ? RunState::kOk : RunState::kFailed;
      done_ = agents_ok(view_.value("reduce", json()));
      for (const json& d : view_.at("documents")) done_ += agents_ok(d.value("result", json()));
      return;
    case Kind::kError:
      state_ = RunState::kFailed;
      view_["error"] = error_json(e.error);
      view_["total_ms"] = at_ms;
      return;
    case Kind::kDocumentDone: {
      json d = e.data;
      d.erase("index");
      const auto count = [&](const char* key, bool yes) {
        if (yes) view_[key] = view_.value(key, 0) + 1;
      };
      const bool ran = !d.value("result", json()).is_null();
      count("documents_resumed", d.value("resumed", false));
      count("documents_run", ran && !d.value("resumed", false));
      count("documents_failed", !d.value("ok", false));
      done_ += agents_ok(d.value("result", json()));
      view_["documents"].push_back(std::move(d));
      break;
    }
    case Kind::kPrefill:
    case Kind::kAgentStarted:
    case Kind::kToken:
    case Kind::kAgentDone:
      break;
  }
  state_ = RunState::kRunning;
}

json CorpusView::result(double now_ms) const {
  json out = view_;
  out["state"] = std::string(to_string(state_));
  if (state_ == RunState::kQueued || state_ == RunState::kRunning) out["total_ms"] = now_ms;
  return out;
}

}  // namespace swarmkv::server
