#include "pipeline/context_per_branch.h"

#include <algorithm>
#include <thread>

namespace swarmkv::detail {

ContextPool::ContextPool(std::shared_ptr<const Model> model, ContextOptions options)
    : model_(std::move(model)), options_(options) {}

std::unique_ptr<Context> ContextPool::acquire() {
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      auto ctx = std::move(free_.back());
      free_.pop_back();
      ctx->memory_clear();
      return ctx;
    }
  }
  auto ctx = std::make_unique<Context>(model_, options_);
  std::lock_guard lock(mutex_);
  ++created_;
  n_ctx_ = ctx->options().n_ctx;
  return ctx;
}

void ContextPool::release(std::unique_ptr<Context> ctx) {
  std::lock_guard lock(mutex_);
  free_.push_back(std::move(ctx));
}

int32_t ContextPool::created() const {
  std::lock_guard lock(mutex_);
  return created_;
}

uint32_t ContextPool::n_ctx() const {
  std::lock_guard lock(mutex_);
  return n_ctx_;
}

PipelineBudget ContextPerBranchFork::budget(int32_t prefix_tokens,
                                            const std::vector<int32_t>& prompt_tokens,
                                            const std::vector<int32_t>& max_tokens,
                                            uint32_t n_ctx) const {
  return budget_one_context_per_branch(mode_, prefix_tokens, prompt_tokens, max_tokens, n_ctx);
}

void ContextPerBranchFork::run(const RunInputs& in, ReadySet& dag, PipelineResult& result) {
  ContextOptions options = in.spec.context_options();
  options.n_ctx = in.prepared.budget.n_ctx;
  pool_ = std::make_unique<ContextPool>(in.model, options);
  const size_t agents = in.spec.agents.size();
  size_t workers =
      guard_ == GuardPolicy::kSerialized
          ? 1
          : std::clamp<size_t>(std::thread::hardware_concurrency(), 1, std::max<size_t>(agents, 1));
  if (in.spec.max_live > 0) workers = std::min(workers, static_cast<size_t>(in.spec.max_live));
  run_on_workers(dag, workers, [&](size_t node) {
    if (node == 0) {
      obtain_prefix(in, result);
      result.prefill_done_at_ms = ms_between(in.started, Clock::now());
      return;
    }
    result.agents[node - 1].timings_ms.wait = ms_between(dag.ready_at(node), Clock::now());
    run_branch(in, node - 1, result);
  });
  result.guard = guard_;
  result.contexts = pool_->created();
  if (pool_->n_ctx() > 0) result.n_ctx = pool_->n_ctx();
  result.kv_cells_peak = result.contexts * max_agent_cells_;
  if (kv_bytes_per_cell_ > 0) result.kv_bytes_per_cell = kv_bytes_per_cell_;
  finish(in, result);
}

void ContextPerBranchFork::run_branch(const RunInputs& in, size_t agent, PipelineResult& result) {
  const AgentSpec& spec = in.spec.agents[agent];
  AgentResult& out = result.agents[agent];  // this node's own slot
  AgentTimings& t = out.timings_ms;
  const Stopwatch work;
  t.started_at = ms_between(in.started, work.started());
  report_started(in, agent);
  const std::vector<Token> prompt = branch_tokens(in, agent, result);

  const Stopwatch c;
  auto ctx = pool_->acquire();
  t.context = c.ms();
  double bytes_per_cell = 0;
  Pos pos0 = in.branch_pos0;
  if (spec.needs.any()) {
    // A part of the document: this agent's own prefill of that part, the
    // same under every strategy (a snapshot holds the whole document).
    pos0 = in.prepared.watermarks[agent];
    const Stopwatch p;
    ctx->decode_prompt(std::span(in.prepared.prefix).first(static_cast<size_t>(pos0)), 0, 0,
                       /*logits_last=*/false);
    t.prefill = p.ms();
  } else {
    bytes_per_cell = open_branch(in, agent, *ctx, t);
  }

  const Stopwatch p;
  ctx->decode_prompt(prompt, pos0, 0, /*logits_last=*/true, {}, branch_decoding(in.spec).max_rows);
  t.prompt = p.ms();

  Sampler sampler(ctx->model(), spec.sampling);
  GenerateOptions gen;
  gen.max_tokens = spec.max_tokens;
  gen.stop = spec.stop;
  gen.on_token = branch_token_callback(in, agent, result);
  // The first token is sampled from the prompt's logits before any
  // generation decode; its cost is the work up to generation.
  t.first_token = work.ms();
  t.first_token_at = ms_between(in.started, Clock::now());
  const Stopwatch g;
  Generation answer = generate(*ctx, sampler, 0, pos0 + static_cast<Pos>(prompt.size()), gen);
  t.generate = g.ms();
  pool_->release(std::move(ctx));
  t.total = work.ms();
  t.done_at = ms_between(in.started, Clock::now());
  {
    const int64_t cells = pos0 + static_cast<int64_t>(prompt.size() + answer.tokens.size());
    std::lock_guard lock(mutex_);
    max_agent_cells_ = std::max(max_agent_cells_, cells);
    if (bytes_per_cell > 0) kv_bytes_per_cell_ = bytes_per_cell;
  }
  out.answer = std::move(answer.text);
  out.tokens = std::move(answer.tokens);
  out.logprobs = std::move(answer.logprobs);
  out.stop_reason = answer.stop_reason;
  settle_structured_answer(in.spec.agents[agent], out);
}

}  // namespace swarmkv::detail
