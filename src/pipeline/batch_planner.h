// The shared fork's batch planner: which branches enter the context and what
// the next llama_decode carries. Pure bookkeeping, no engine: the shared fork
// strategy executes its plans on a real context, the unit tests on a fake.
//
// Every step carries one generated token per generating branch (n_batch >=
// n_seq_max guarantees room), then the prompt tokens of newly admitted
// branches in admission order, as many as fit in n_batch (StepComposer,
// which `serve`'s scheduler composes its steps with too). Branches are
// admitted in the ready set's order (priority, then agent) as sequence ids
// free up, at most max_live at a time; a branch that
// finishes frees its id and makes its dependents ready before the next
// admission. A branch with fork_from children is parked instead: its id
// (and its cells) stay until every child has forked from it. Nothing depends on thread timing, so
// the batches, and with them the answers, repeat run to run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "pipeline/dag.h"
#include "swarmkv/engine.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::detail {

struct PlannedToken {
  size_t agent = 0;
  SeqId seq = 0;
  Pos pos = 0;
  int32_t prompt_index = -1;  // the prompt token to decode; -1: the agent's last sampled token
  bool logits = false;        // the agent samples from this token's output row
  // A prefix token on sequence 0 (streaming prefill; prompt_index is its
  // index in the prefix, `agent` unused).
  bool document = false;
};

struct BatchPlan {
  std::vector<PlannedToken> tokens;  // in batch order; the logits rows count up in this order
  DecodeStep step;                   // its composition (ms left 0)
};

class BatchPlanner {
 public:
  struct Admission {
    size_t agent = 0;
    SeqId seq = 0;
    SeqId from = 0;  // the sequence to fork: 0 the document, else the parent's
    Pos pos0 = 0;    // where the branch's own tokens start; it forks `from`'s cells before it
  };

  // `dag`: node 0 the document (already decided), node a + 1 agent a.
  // prompt_tokens[a] > 0: agent a's prompt length (set_prompt may change it
  // once the agent is admitted); every prompt is decoded from position
  // `pos0`. Sequence ids 1 .. n_seq_max - 1 serve branches; max_live (0:
  // n_seq_max - 1) caps the live branches. Throws Error(kInternal) when
  // n_seq_max < 2, n_batch < n_seq_max or max_live < 0.
  // fork_from[a]: agent a's parent (fork trees), or nullopt; empty for none.
  BatchPlanner(ReadySet& dag, std::vector<int32_t> prompt_tokens, Pos pos0, int32_t n_seq_max,
               int32_t n_batch, int32_t max_live = 0,
               std::vector<std::optional<size_t>> fork_from = {});

  // Frees the ids of parked parents whose children have all started, then
  // moves ready agents into free sequence ids in the ready set's order while
  // fewer than max_live branches are live.
  std::vector<Admission> admit();
  // The ids freed since the last call (finished, failed or unparked
  // branches), whose cells the engine must drop before it forks into them.
  std::vector<SeqId> take_freed();
  // An admitted agent's prompt length, known only once it starts (a prompt
  // rendered with other agents' answers); before its first next().
  void set_prompt(size_t agent, int32_t tokens);
  // watermarks[a]: the prefix tokens agent a reads; its prompt starts there
  // instead of at pos0. Before the first admit().
  void set_watermarks(std::vector<Pos> watermarks);
  // The prefix's `tokens` tokens are not in the context yet: each step fills
  // the room its branches leave with the next of them (sequence 0, from
  // position 0), and an agent is admitted once they are decoded past its
  // watermark. Before the first admit().
  void stream_prefix(int32_t tokens);
  bool streaming() const noexcept { return prefix_decoded_ < prefix_total_; }
  // Fails every agent without an outcome (a failed prefill step).
  void fail_all(const ErrorValue& error);
  // The next step's tokens; empty when no branch is live. Counts them as fed.
  BatchPlan next();
  // After a successful decode of the last plan: its tokens hold KV cells.
  void decoded(const BatchPlan& plan);
  // An agent that had a logits row in the last plan was sampled: `done`
  // ends its branch (its id and cells are freed, its dependents may become
  // ready); otherwise it generates in the next step.
  void sampled(size_t agent, bool done);
  // Fails a live agent (its dependents fail with it) and frees its id.
  void fail(size_t agent, const ErrorValue& error);
  // The live agents, in admission order.
  std::vector<size_t> live() const;

  bool finished() const noexcept { return dag_.finished(); }
  int64_t cells() const noexcept { return cells_; }            // branch cells held now
  int64_t peak_cells() const noexcept { return peak_cells_; }  // branch cells at the peak
  // Branch cells decoded so far, freed ones included.
  int64_t decoded_cells() const noexcept { return decoded_cells_; }

 private:
  struct Branch {
    size_t agent = 0;
    SeqId seq = 0;
    Pos pos0 = 0;           // its first own token's position
    int32_t fed = 0;        // prompt tokens planned so far
    int32_t generated = 0;  // tokens sampled so far
    int64_t cells = 0;      // KV cells this branch holds
    bool generating = false;
  };
  Branch& live_branch(size_t agent);
  void release(size_t agent);
  bool has_children(size_t agent) const;

  ReadySet& dag_;
  std::vector<int32_t> prompt_tokens_;
  Pos pos0_;
  int32_t n_batch_;
  size_t max_live_;
  std::vector<std::optional<size_t>> fork_from_;
  std::vector<SeqId> free_seqs_;  // handed out from the back
  std::vector<SeqId> freed_;      // for take_freed()
  std::vector<Branch> live_;      // admission order
  // Finished parents waiting for their children to fork; `pos0` holds the
  // position after their last decoded token.
  std::vector<Branch> parked_;
  std::vector<Pos> watermarks_;  // empty: every prompt at pos0_
  Pos prefix_total_ = 0;         // stream_prefix's tokens
  Pos prefix_planned_ = 0;       // planned so far
  Pos prefix_decoded_ = 0;       // decoded so far
  int64_t cells_ = 0;
  int64_t peak_cells_ = 0;
  int64_t decoded_cells_ = 0;
};

}  // namespace swarmkv::detail
