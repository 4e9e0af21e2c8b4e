// ForkMode::kNone, the reference every fork is measured against: each agent
// prefills the whole document into its own context, as if no fork existed.
#include "pipeline/context_per_branch.h"

namespace swarmkv::detail {
namespace {

class RecomputeFork final : public ContextPerBranchFork {
 public:
  explicit RecomputeFork(GuardPolicy guard) : ContextPerBranchFork(ForkMode::kNone, guard) {}

 private:
  void obtain_prefix(const RunInputs&, PipelineResult&) override {}  // nothing is shared

  double open_branch(const RunInputs& in, size_t agent, Context& ctx, AgentTimings& t) override {
    const Stopwatch p;
    ctx.decode_prompt(in.prepared.prefix, 0, 0, /*logits_last=*/false);
    t.prefill = p.ms();
    // For the memory report (outside the timings); one agent's measure suffices.
    if (agent != 0) return 0;
    return static_cast<double>(ctx.state_size()) / static_cast<double>(in.prepared.prefix.size());
  }

  void finish(const RunInputs&, PipelineResult& result) override {
    result.prefill_ms = 0;
    result.document_prefills = 0;
    result.prefill_done_at_ms = 0;
    for (const AgentResult& a : result.agents) {
      const AgentTimings& t = a.timings_ms;
      result.prefill_ms += t.prefill;
      if (t.prefill <= 0) continue;
      ++result.document_prefills;
      const double done = t.started_at + t.context + t.prefill;
      if (result.prefill_done_at_ms == 0 || done < result.prefill_done_at_ms)
        result.prefill_done_at_ms = done;
    }
  }
};

}  // namespace

std::unique_ptr<ForkStrategy> make_recompute_fork(GuardPolicy guard) {
  return std::make_unique<RecomputeFork>(guard);
}

}  // namespace swarmkv::detail
