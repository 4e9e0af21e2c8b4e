// The runner: validate, tokenise, budget, then hand the run to the fork
// strategy of spec.fork and stitch the DAG's outcomes into the result.
#include "swarmkv/pipeline.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "pipeline/dag.h"
#include "pipeline/fork_strategy.h"
#include "pipeline/prefix_source.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"

namespace swarmkv {
namespace {

constexpr std::string_view kDocumentNode = "document";
// Splits the rendered chat template at the agent's prompt. Chosen so that no
// real document or prompt contains it.
constexpr std::string_view kPromptMarker = "\x1f<swarmkv-agent-prompt>\x1f";

// Node 0 is the document, node i + 1 agent i; every agent depends on the
// document and on its depends_on.
std::vector<detail::DagNode> dag_nodes(const PipelineSpec& spec) {
  std::vector<detail::DagNode> nodes{{std::string(kDocumentNode), {}}};
  for (const AgentSpec& a : spec.agents) {
    detail::DagNode node{a.name, {std::string(kDocumentNode)}};
    node.depends_on.insert(node.depends_on.end(), a.depends_on.begin(), a.depends_on.end());
    nodes.push_back(std::move(node));
  }
  return nodes;
}

void validate_document(const PipelineSpec& spec) {
  if (spec.document.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("the document is empty{}", spec.document_source.empty()
                                                   ? std::string()
                                                   : fmt::format(" ({})", spec.document_source)));
  }
}

struct TemplateSplit {
  std::string head;  // the shared prefix's text
  std::string tail;  // what closes every agent prompt
};

// Renders the chat once with a marker where the agent's prompt goes: what
// comes before it is the shared prefix, what follows closes every branch.
TemplateSplit split_template(const PipelineSpec& spec, const Model& model) {
  TemplateSplit out;
  if (model.has_chat_template()) {
    std::vector<ChatMessage> chat;
    if (!spec.system_prompt.empty()) chat.push_back({"system", spec.system_prompt});
    chat.push_back({"user", spec.document + "\n\n" + std::string(kPromptMarker)});
    const std::string rendered = model.apply_chat_template(chat, /*add_assistant=*/true);
    const size_t at = rendered.find(kPromptMarker);
    if (at == std::string::npos) {
      throw Error(ErrorCode::kChatTemplate,
                  "the chat template dropped the agent prompt; cannot split the prefix");
    }
    out.head = rendered.substr(0, at);
    out.tail = rendered.substr(at + kPromptMarker.size());
  } else {
    out.head = (spec.system_prompt.empty() ? std::string() : spec.system_prompt + "\n\n") +
               spec.document + "\n\n";
    out.tail = "\nAnswer:";
  }
  return out;
}

}  // namespace

std::string_view to_string(ForkMode mode) noexcept {
  switch (mode) {
    case ForkMode::kShared:
      return "shared";
    case ForkMode::kHost:
      return "host";
    case ForkMode::kNone:
      return "none";
  }
  return "unknown";
}

ForkMode parse_fork_mode(std::string_view name) {
  if (name == "shared") return ForkMode::kShared;
  if (name == "host") return ForkMode::kHost;
  if (name == "none") return ForkMode::kNone;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown fork mode '{}' (expected shared, host or none)", name));
}

std::string_view to_string(GuardPolicy policy) noexcept {
  return policy == GuardPolicy::kSerialized ? "serialized" : "concurrent";
}

GuardPolicy parse_guard_policy(std::string_view name) {
  if (name == "serialized") return GuardPolicy::kSerialized;
  if (name == "concurrent") return GuardPolicy::kConcurrent;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown guard policy '{}' (expected serialized or concurrent)", name));
}

std::string_view to_string(NodeStatus status) noexcept {
  switch (status) {
    case NodeStatus::kOk:
      return "ok";
    case NodeStatus::kFailed:
      return "failed";
    case NodeStatus::kDependencyFailed:
      return "dependency_failed";
  }
  return "unknown";
}

bool PipelineResult::ok() const noexcept {
  return document_status == NodeStatus::kOk &&
         std::all_of(agents.begin(), agents.end(),
                     [](const AgentResult& a) { return a.status == NodeStatus::kOk; });
}

void validate_pipeline(const PipelineSpec& spec) {
  validate_document(spec);
  if (spec.agents.empty()) throw Error(ErrorCode::kInvalidArgument, "the pipeline has no agents");
  for (const AgentSpec& a : spec.agents) {
    if (a.name.empty()) throw Error(ErrorCode::kInvalidArgument, "an agent has an empty name");
    if (a.name == kDocumentNode) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent name '{}' is reserved for the document node", a.name));
    }
    if (a.prompt.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}' has an empty prompt", a.name));
    if (a.max_tokens < 1) {
      throw Error(
          ErrorCode::kInvalidArgument,
          fmt::format("agent '{}': max_tokens must be >= 1 (got {})", a.name, a.max_tokens));
    }
    try {
      validate_sampling(a.sampling);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("agent '{}': {}", a.name, e.value().message));
    }
  }
  detail::resolve_dag(dag_nodes(spec));
}

PipelineBudget plan_budget(ForkMode fork, int32_t prefix_tokens,
                           const std::vector<int32_t>& prompt_tokens,
                           const std::vector<int32_t>& max_tokens, uint32_t n_ctx) {
  return detail::make_fork_strategy(fork, GuardPolicy::kSerialized)
      ->budget(prefix_tokens, prompt_tokens, max_tokens, n_ctx);
}

std::vector<Token> prepare_prefix(const PipelineSpec& spec, const Model& model) {
  validate_document(spec);
  return model.tokenize(split_template(spec, model).head, /*add_special=*/true);
}

PreparedPipeline prepare_pipeline(const PipelineSpec& spec, const Model& model) {
  validate_pipeline(spec);
  const auto [head, tail] = split_template(spec, model);

  PreparedPipeline out;
  out.prefix = model.tokenize(head, /*add_special=*/true);
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> max_tokens;
  for (const AgentSpec& a : spec.agents) {
    out.branches.push_back(model.tokenize(a.prompt + tail, /*add_special=*/false));
    prompt_tokens.push_back(static_cast<int32_t>(out.branches.back().size()));
    max_tokens.push_back(a.max_tokens);
  }
  out.budget = plan_budget(spec.fork, static_cast<int32_t>(out.prefix.size()), prompt_tokens,
                           max_tokens, spec.n_ctx);
  if (out.budget.n_ctx > static_cast<uint32_t>(model.n_ctx_train()) && model.n_ctx_train() > 0) {
    log_warn("n_ctx {} is larger than the model was trained for ({}); answers may degrade",
             out.budget.n_ctx, model.n_ctx_train());
  }
  return out;
}

std::string_view to_string(SnapshotSource source) noexcept {
  switch (source) {
    case SnapshotSource::kPrefill:
      return "prefill";
    case SnapshotSource::kCache:
      return "cache";
    case SnapshotSource::kFile:
      return "file";
    case SnapshotSource::kRedis:
      return "redis";
  }
  return "unknown";
}

PrefillReport prefill_document(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                               const RunOptions& options, const std::string& out_path) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "prefill_document needs a model");
  const std::vector<Token> prefix = prepare_prefix(spec, *model);
  detail::PrefixState state = detail::obtain_prefix_state(spec, prefix, options, model);
  PrefillReport report;
  report.prefix_tokens = static_cast<int32_t>(prefix.size());
  report.prefill_ms = state.prefill_ms;
  report.export_ms = state.export_ms;
  if (!out_path.empty()) {
    const Stopwatch w;
    SnapshotMeta meta;
    meta.binding = binding_of(*model, detail::prefill_context_options(spec, prefix.size()));
    meta.tokens = prefix;
    meta.model_file = std::filesystem::path(model->path()).filename().string();
    write_snapshot(out_path, meta, state.bytes);
    report.write_ms = w.ms();
    report.out_path = out_path;
  }
  report.snapshot = std::move(state.use);
  return report;
}

PipelineResult run_pipeline(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                            const RunOptions& options) {
  return detail::run_pipeline(spec, model, options, detail::RunFaults{});
}

namespace detail {

PipelineResult run_pipeline(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                            const RunOptions& options, const RunFaults& faults) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "run_pipeline needs a model");
  const Stopwatch run;
  const PreparedPipeline prepared = prepare_pipeline(spec, *model);

  PipelineResult result;
  result.fork = spec.fork;
  result.prefix_tokens = prepared.budget.prefix_tokens;
  result.n_ctx = prepared.budget.n_ctx;  // the strategy replaces it with llama.cpp's padded value
  result.prepare_ms = run.ms();
  result.agents.resize(spec.agents.size());
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    result.agents[i].name = spec.agents[i].name;
    result.agents[i].prompt_tokens = static_cast<int32_t>(prepared.branches[i].size());
  }

  const std::vector<DagNode> nodes = dag_nodes(spec);
  std::vector<std::string> names;
  for (const DagNode& n : nodes) names.push_back(n.name);
  ReadySet dag(std::move(names), resolve_dag(nodes));
  const RunInputs in{
      spec,
      prepared,
      options,
      model,
      faults.branch_pos0 >= 0 ? faults.branch_pos0 : static_cast<Pos>(prepared.prefix.size()),
      run.started()};
  make_fork_strategy(spec.fork, options.guard)->run(in, dag, result);
  if (!dag.finished()) throw Error(ErrorCode::kInternal, "the fork strategy left agents unrun");

  result.document_status = dag.status(0);
  result.document_error = dag.error(0);
  for (size_t i = 0; i < result.agents.size(); ++i) {
    result.agents[i].status = dag.status(i + 1);
    result.agents[i].error = dag.error(i + 1);
  }
  result.total_ms = run.ms();
  return result;
}

}  // namespace detail
}  // namespace swarmkv
