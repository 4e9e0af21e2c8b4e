// Fork strategies: how agents obtain the document's KV state and run.
//
// The runner (pipeline.cpp) prepares the pipeline, builds the DAG's ready
// set, picks the strategy for spec.fork once (or the executor's, when the
// caller gives an AgentExecutor), and hands it everything; it never looks at
// the mode again. A new source of the prefix (a file, a store, a remote
// worker, a parent agent) is a new strategy class.
//
//   shared_fork.cpp     one unified-KV context; fork = seq_cp; batched decode
//   host_fork.cpp       prefill once, snapshot to host RAM, restore per branch
//   recompute_fork.cpp  every agent re-prefills the document (the reference)
//   executor_fork.cpp   an AgentExecutor runs the agents (the cluster)
#pragma once

#include <memory>
#include <vector>

#include "pipeline/dag.h"
#include "swarmkv/measure.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::detail {

// Deliberate faults for tests; never set outside them.
struct RunFaults {
  // The first position of every branch prompt; -1: prefix_len, the only
  // correct value. 0 reproduces the classic RoPE bug.
  Pos branch_pos0 = -1;
};

// What one run hands its strategy. All references outlive the run.
struct RunInputs {
  const PipelineSpec& spec;
  const PreparedPipeline& prepared;
  const RunOptions& options;
  std::shared_ptr<const Model> model;
  Pos branch_pos0 = 0;        // where every branch prompt starts (prefix_len)
  Clock::time_point started;  // the run's start, for AgentTimings::done_at
};

class ForkStrategy {
 public:
  virtual ~ForkStrategy() = default;

  // The layout's token budget (see PipelineBudget); throws Error(kBudget).
  virtual PipelineBudget budget(int32_t prefix_tokens, const std::vector<int32_t>& prompt_tokens,
                                const std::vector<int32_t>& max_tokens, uint32_t n_ctx) const = 0;

  // Runs DAG node 0 (the document) and then every agent node as it becomes
  // ready, reporting each node's outcome to `dag`, until dag.finished().
  // Writes each agent's answer and timings into result.agents[i] and the
  // run-level fields it owns (prefill, memory, decode steps); statuses and
  // errors are copied from `dag` by the runner. Throws only on a bug.
  virtual void run(const RunInputs& in, ReadySet& dag, PipelineResult& result) = 0;
};

std::unique_ptr<ForkStrategy> make_fork_strategy(ForkMode mode, GuardPolicy guard);

// How the branch phase decodes: what PipelineSpec::exact asks below the
// engine options (flash attention on; one thread for one-row steps unless
// attention_batch_invariant()). With our patch
// (attention_batch_invariant()), every flash-attention call takes a kernel
// whose rows depend only on the cells each row sees, in cell order: any
// micro-batch size, any neighbours. Without it, a micro-batch of 2-63 query
// rows runs the one-chunk kernel (ggml-cpu ops.cpp,
// ggml_compute_forward_flash_attn_ext_f16_one_chunk), each row on its own
// over its sequence's cells in cell order, skipping masked ones; 64 rows or
// more take the tiled path, whose tiles start at absolute cell offsets, so
// the branch phase stays below 64 rows and the document is prefilled with
// the same chunking by every strategy. Either way a row's result follows
// its cells' order, hence keep_cells.
struct BranchDecoding {
  // The most rows of one branch-phase micro-batch; 0: no limit.
  uint32_t max_rows = 0;
  // kShared: a finished branch's cells stay occupied until the run ends
  // (moved onto a park sequence), so that no later token takes a freed cell
  // before its own sequence's earlier cells and changes its summation order.
  bool keep_cells = false;
};
// keep_cells with spec.exact, and kExactMaxRows unless
// attention_batch_invariant(); no limits without spec.exact.
BranchDecoding branch_decoding(const PipelineSpec& spec);
constexpr uint32_t kExactMaxRows = 63;  // GGML_FA_TILE_Q (64) - 1

// The pipeline's DAG (node 0 the document, node i + 1 agent i) with the
// agents' priorities.
ReadySet ready_set(const PipelineSpec& spec);

// `prompt` followed by the template's closing markup, as branch tokens.
std::vector<Token> tokenize_branch(const Model& model, const PreparedPipeline& prepared,
                                   std::string_view prompt);

// Agent `agent`'s branch tokens, from the document's end, when it starts:
// prepared.branches[agent], or its prompt rendered with the answers in
// result.agents (the agents its placeholders name have finished: they are
// among its dependencies) and tokenised, after, with fork_from, its
// parent's branch, the parent's answer tokens and the template's turn
// close (recursively). Records prompt_rendered and prompt_tokens (the whole
// branch) in result.agents[agent]. Reads other agents' slots only once they
// finished, so workers may call it concurrently. Throws Error(kBudget) when
// the branch is longer than the budget counted for it.
std::vector<Token> branch_tokens(const RunInputs& in, size_t agent, PipelineResult& result);

// RunOptions::on_agent_event's kStarted for `agent`, when one is set; what
// it throws propagates (the caller fails the agent).
void report_started(const RunInputs& in, size_t agent);
// GenerateOptions::on_token for `agent`'s answer: records when each token
// came (AgentResult::token_at_ms) and reports it (kToken, throwing what the
// callback throws).
std::function<void(Token, const std::string&)> branch_token_callback(const RunInputs& in,
                                                                     size_t agent,
                                                                     PipelineResult& result);

// After `agent`'s answer is in `out` (answer, tokens, stop_reason): an
// agent with a grammar whose answer stopped before the grammar was complete
// (max_tokens) fails with Error(kBudget), its text kept in `out`; one with
// a json_schema gets answer_is_json. Every strategy calls it before it
// reports the agent done.
void settle_structured_answer(const AgentSpec& agent, AgentResult& out);

// The two layouts' budgets, shared by the strategies.
PipelineBudget budget_one_context_per_branch(ForkMode fork, int32_t prefix_tokens,
                                             const std::vector<int32_t>& prompt_tokens,
                                             const std::vector<int32_t>& max_tokens,
                                             uint32_t n_ctx);
PipelineBudget budget_one_shared_context(int32_t prefix_tokens,
                                         const std::vector<int32_t>& prompt_tokens,
                                         const std::vector<int32_t>& max_tokens, uint32_t n_ctx);

std::unique_ptr<ForkStrategy> make_shared_fork();
std::unique_ptr<ForkStrategy> make_host_fork(GuardPolicy guard);
std::unique_ptr<ForkStrategy> make_recompute_fork(GuardPolicy guard);
// Agents run by `executor` under `fork`'s layout (run_pipeline with an executor).
std::unique_ptr<ForkStrategy> make_executor_fork(AgentExecutor& executor, ForkMode fork);

}  // namespace swarmkv::detail

namespace swarmkv::detail {
// run_pipeline with deliberate faults (tests only); `prepared`, when given,
// is prepare_pipeline(spec, *model) made by the caller.
// `executor`, when given, runs the agents (make_executor_fork).
PipelineResult run_pipeline(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                            const RunOptions& options, const RunFaults& faults,
                            const PreparedPipeline* prepared = nullptr,
                            AgentExecutor* executor = nullptr);
}  // namespace swarmkv::detail
