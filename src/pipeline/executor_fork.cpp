// The strategy of a run whose agents an AgentExecutor runs elsewhere: the
// DAG, the statuses and the events stay here, as in every local strategy;
// the executor gets the document's snapshot on demand, the ready agents, and
// returns their results.
#include <optional>
#include <vector>

#include "pipeline/fork_strategy.h"
#include "prefix/prefix_source.h"

namespace swarmkv::detail {
namespace {

class ExecutorFork final : public ForkStrategy {
 public:
  ExecutorFork(AgentExecutor& executor, ForkMode fork) : executor_(executor), fork_(fork) {}

  // The layout of the fork mode the executor's agents run under.
  PipelineBudget budget(int32_t prefix_tokens, const std::vector<int32_t>& prompt_tokens,
                        const std::vector<int32_t>& max_tokens, uint32_t n_ctx) const override {
    return plan_budget(fork_, prefix_tokens, prompt_tokens, max_tokens, n_ctx);
  }

  void run(const RunInputs& in, ReadySet& dag, PipelineResult& result) override {
    std::vector<uint8_t> file;  // the document's snapshot, once made
    AgentExecutor::Document document;
    document.started = in.started;
    if (fork_traits(in.spec.fork).branch_workers) result.guard = in.options.guard;
    result.n_seq_max = in.prepared.budget.n_seq_max;  // each worker's context
    if (fork_traits(in.spec.fork).prefix_state) {
      document.snapshot_key = snapshot_key(prefix_binding(*in.model, in.spec), in.prepared.prefix);
      document.snapshot = [&]() -> std::span<const uint8_t> {
        if (file.empty()) {
          PrefixState made = obtain_prefix_state(in.spec, in.prepared.prefix, in.options.snapshot,
                                                 in.options.on_prefill_progress, in.model);
          file = encode_snapshot(prefix_meta(*in.model, in.spec, in.prepared.prefix), made.bytes);
          result.prefill_ms = made.prefill_ms;
          result.export_ms = made.export_ms;
          result.document_prefills = made.use.prefilled_tokens > 0 ? 1 : 0;
          result.snapshot = std::move(made.use);
        }
        return file;
      };
    }
    dag.pop();  // node 0, the document
    if (const std::optional<ErrorValue> error = executor_.start(document, result)) {
      dag.fail(0, *error);
    } else {
      dag.succeed(0);
    }
    while (!dag.finished()) {
      std::vector<size_t> ready;
      while (const std::optional<size_t> node = dag.pop()) {
        try {
          report_started(in, *node - 1);
          ready.push_back(*node - 1);
        } catch (...) {
          dag.fail(*node, current_error_value());
        }
      }
      if (!ready.empty()) executor_.submit(ready);
      if (dag.finished()) break;
      for (auto& [agent, answer] : executor_.collect()) {
        const bool ok = answer.status == NodeStatus::kOk;
        const std::optional<ErrorValue> error = answer.error;
        // Its place in the graph is this run's (a worker's job has its own).
        answer.depends_on = std::move(result.agents[agent].depends_on);
        answer.fork_from = std::move(result.agents[agent].fork_from);
        answer.needs = std::move(result.agents[agent].needs);
        result.agents[agent] = std::move(answer);
        if (ok) {
          dag.succeed(agent + 1);
        } else {
          dag.fail(agent + 1, error.value_or(ErrorValue{ErrorCode::kInternal, "failed"}));
        }
      }
    }
    executor_.finish(result);
  }

 private:
  AgentExecutor& executor_;
  ForkMode fork_;
};

}  // namespace

std::unique_ptr<ForkStrategy> make_executor_fork(AgentExecutor& executor, ForkMode fork) {
  return std::make_unique<ExecutorFork>(executor, fork);
}

}  // namespace swarmkv::detail
