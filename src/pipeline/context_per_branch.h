// The layout of kHost and kNone: every agent runs in a context of its own
// (warm contexts are reused), on a fixed set of worker threads that take
// ready agents lowest first. A subclass says how the document's KV state
// gets into a branch's context.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "pipeline/fork_strategy.h"
#include "swarmkv/engine.h"

namespace swarmkv::detail {

// Warm contexts, handed out again instead of being created per branch
// (creating one costs far more than clearing and restoring it). Thread-safe.
class ContextPool {
 public:
  ContextPool(std::shared_ptr<const Model> model, ContextOptions options);
  // A context with empty memory: a warm one when available.
  std::unique_ptr<Context> acquire();
  void release(std::unique_ptr<Context> ctx);
  int32_t created() const;
  uint32_t n_ctx() const;  // as llama.cpp really uses it (it pads); 0 before the first context

 private:
  std::shared_ptr<const Model> model_;
  ContextOptions options_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Context>> free_;  // guarded by mutex_
  int32_t created_ = 0;                         // guarded by mutex_
  uint32_t n_ctx_ = 0;                          // guarded by mutex_
};

class ContextPerBranchFork : public ForkStrategy {
 public:
  ContextPerBranchFork(ForkMode mode, GuardPolicy guard) : mode_(mode), guard_(guard) {}

  PipelineBudget budget(int32_t prefix_tokens, const std::vector<int32_t>& prompt_tokens,
                        const std::vector<int32_t>& max_tokens, uint32_t n_ctx) const final;
  void run(const RunInputs& in, ReadySet& dag, PipelineResult& result) final;

 protected:
  // The document node, on a worker, before any branch runs. May use pool().
  virtual void obtain_prefix(const RunInputs& in, PipelineResult& result) = 0;
  // Puts the document's KV state at positions [0, prefix_len) of sequence 0
  // of `ctx` (empty memory), recording its part of `t`. Returns the KV bytes
  // per cell when it measured them, else 0. Runs on workers, concurrently
  // with other branches under GuardPolicy::kConcurrent.
  virtual double open_branch(const RunInputs& in, size_t agent, Context& ctx, AgentTimings& t) = 0;
  // After every node has an outcome, on the calling thread.
  virtual void finish(const RunInputs& in, PipelineResult& result) = 0;

  ContextPool& pool() { return *pool_; }

 private:
  // Agent `agent`, writing only its own slot of result.agents.
  void run_branch(const RunInputs& in, size_t agent, PipelineResult& result);

  ForkMode mode_;
  GuardPolicy guard_;
  std::unique_ptr<ContextPool> pool_;  // made by run() before any worker starts; thread-safe
  std::mutex mutex_;                   // guards the two below
  int64_t max_agent_cells_ = 0;        // the fullest branch context
  double kv_bytes_per_cell_ = 0;       // as open_branch measured it
};

}  // namespace swarmkv::detail
