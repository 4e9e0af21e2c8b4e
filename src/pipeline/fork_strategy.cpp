#include "pipeline/fork_strategy.h"

#include <algorithm>

#include <fmt/format.h>

namespace swarmkv::detail {
namespace {

struct TokenTotals {
  int32_t max_branch_tokens = 0;
  int32_t max_new_tokens = 0;
  int64_t sum_branch_tokens = 0;
};

TokenTotals totals(const std::vector<int32_t>& prompt_tokens,
                   const std::vector<int32_t>& max_tokens) {
  if (prompt_tokens.size() != max_tokens.size()) {
    throw Error(ErrorCode::kInternal, "budget: one prompt length and one max_tokens per agent");
  }
  TokenTotals t;
  for (size_t i = 0; i < prompt_tokens.size(); ++i) {
    t.max_branch_tokens = std::max(t.max_branch_tokens, prompt_tokens[i]);
    t.max_new_tokens = std::max(t.max_new_tokens, max_tokens[i]);
    t.sum_branch_tokens += static_cast<int64_t>(prompt_tokens[i]) + max_tokens[i];
  }
  return t;
}

// 0 = automatic: the smallest multiple of 256 that holds the budget.
uint32_t context_size(uint32_t n_ctx, int64_t required) {
  return n_ctx > 0 ? n_ctx : static_cast<uint32_t>((required + 255) / 256 * 256);
}

}  // namespace

PipelineBudget budget_one_context_per_branch(ForkMode fork, int32_t prefix_tokens,
                                             const std::vector<int32_t>& prompt_tokens,
                                             const std::vector<int32_t>& max_tokens,
                                             uint32_t n_ctx) {
  const TokenTotals t = totals(prompt_tokens, max_tokens);
  PipelineBudget b;
  b.fork = fork;
  b.prefix_tokens = prefix_tokens;
  b.max_branch_tokens = t.max_branch_tokens;
  b.max_new_tokens = t.max_new_tokens;
  b.sum_branch_tokens = t.sum_branch_tokens;
  b.required = static_cast<int64_t>(prefix_tokens) + t.max_branch_tokens + t.max_new_tokens;
  b.n_seq_max = 1;
  b.n_ctx = context_size(n_ctx, b.required);
  if (b.required > static_cast<int64_t>(b.n_ctx)) {
    throw Error(
        ErrorCode::kBudget,
        fmt::format("context budget exceeded: prefix_tokens {} + max_branch_tokens {} + "
                    "max_new_tokens {} = required {} > n_ctx {}",
                    b.prefix_tokens, b.max_branch_tokens, b.max_new_tokens, b.required, b.n_ctx));
  }
  return b;
}

PipelineBudget budget_one_shared_context(int32_t prefix_tokens,
                                         const std::vector<int32_t>& prompt_tokens,
                                         const std::vector<int32_t>& max_tokens, uint32_t n_ctx) {
  const TokenTotals t = totals(prompt_tokens, max_tokens);
  PipelineBudget b;
  b.fork = ForkMode::kShared;
  b.prefix_tokens = prefix_tokens;
  b.max_branch_tokens = t.max_branch_tokens;
  b.max_new_tokens = t.max_new_tokens;
  b.sum_branch_tokens = t.sum_branch_tokens;
  b.required = prefix_tokens + t.sum_branch_tokens;
  b.n_seq_max =
      static_cast<uint32_t>(std::min<size_t>(prompt_tokens.size() + 1, max_parallel_sequences()));
  b.n_ctx = context_size(n_ctx, b.required);
  if (b.required > static_cast<int64_t>(b.n_ctx)) {
    throw Error(ErrorCode::kBudget,
                fmt::format("context budget exceeded (fork shared, one context for all): "
                            "prefix_tokens {} + branch_tokens {} (prompt + max_tokens of {} "
                            "agents) = required {} > n_ctx {}",
                            b.prefix_tokens, b.sum_branch_tokens, prompt_tokens.size(), b.required,
                            b.n_ctx));
  }
  return b;
}

BranchDecoding branch_decoding(const PipelineSpec& spec) {
  if (!spec.exact) return {};
  return {.max_rows = attention_batch_invariant() ? 0 : kExactMaxRows, .keep_cells = true};
}

std::unique_ptr<ForkStrategy> make_fork_strategy(ForkMode mode, GuardPolicy guard) {
  switch (mode) {
    case ForkMode::kShared:
      return make_shared_fork();
    case ForkMode::kHost:
      return make_host_fork(guard);
    case ForkMode::kNone:
      return make_recompute_fork(guard);
  }
  throw Error(ErrorCode::kInternal, "unknown fork mode");
}

}  // namespace swarmkv::detail

namespace swarmkv {

ForkTraits fork_traits(ForkMode mode) {
  switch (mode) {
    case ForkMode::kShared:
      return {.one_context = true, .prefix_state = true};
    case ForkMode::kHost:
      return {.prefix_state = true, .host_buffers = true, .branch_workers = true};
    case ForkMode::kNone:
      return {.branch_workers = true};
  }
  throw Error(ErrorCode::kInternal, "unknown fork mode");
}

}  // namespace swarmkv
