// The shared fork (ForkMode::kShared): every branch is a sequence of one
// unified-KV context that already holds the document on sequence 0.
//
// Forking is llama_memory_seq_cp(0, branch): the branch's sequence id is added
// to the prefix cells, no KV byte is copied. One decoder thread owns the
// context and runs continuous batching: each step carries one generation
// token for every generating branch plus as many prompt tokens of newly
// admitted branches as fit in n_batch, in a single llama_decode. A branch
// that finishes frees its cells (seq_rm) and its sequence id while the
// others continue. There is no global mutex on this path: branch threads only
// enqueue requests and wait for their futures.
//
// Batch composition is deterministic, so answers repeat run to run: the
// decoder knows which agents depend on which, and before each step waits
// until every agent whose dependencies have all finished has been submitted;
// admission is in agent order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::detail {

// What one branch got back from the decoder, with its timings (ms). A failed
// branch has `error` set (a value the receiver owns; no exception crosses
// from the decoder thread) and nothing else.
struct SharedBranchOutcome {
  std::optional<ErrorValue> error;
  Generation generation;
  double queued = 0;       // submitted -> admitted (waiting for a free sequence id)
  double fork = 0;         // setting the branch up: its sampler, then seq_cp of the prefix
  double prompt = 0;       // admitted -> the step that produced the prompt's logits
  double first_token = 0;  // submitted -> first token sampled
  double generate = 0;     // first token sampled -> answer complete
  double total = 0;        // submitted -> answer complete
};

class SharedDecoder {
 public:
  // `ctx` holds the prefix on sequence 0 at positions [0, prefix_len) and
  // must have kv_unified; sequence ids 1 .. n_seq_max-1 serve branches.
  // `agent_deps[i]` lists the agents (by index) agent i waits for.
  // Starts the decoder thread; from then on only that thread touches `ctx`.
  SharedDecoder(Context& ctx, Pos prefix_len, std::vector<std::vector<size_t>> agent_deps);
  SharedDecoder(const SharedDecoder&) = delete;
  SharedDecoder& operator=(const SharedDecoder&) = delete;
  ~SharedDecoder();  // close()

  // Queues agent `agent`'s branch: its prompt is decoded at positions pos0,
  // pos0+1, ... The future holds the answer, or the error that stopped it
  // (never an exception). Each agent is submitted at most once; a second
  // submission, an unknown agent or a submission after close() throws
  // Error(kInternal) on the caller's thread. Thread-safe.
  std::future<SharedBranchOutcome> submit(size_t agent, std::vector<Token> prompt, Pos pos0,
                                          const SamplingOptions& sampling,
                                          const GenerateOptions& generate);

  // Finishes the queued work, then stops and joins the decoder thread.
  // Idempotent. Afterwards steps() and peak_cells() are final.
  void close();

  const std::vector<DecodeStep>& steps() const noexcept { return steps_; }
  int64_t peak_cells() const noexcept { return peak_cells_; }

 private:
  struct Branch;
  enum class AgentState : std::uint8_t { kWaiting, kSubmitted, kDone, kFailed };
  bool submissions_due() const;  // caller holds mutex_
  void finish(Branch& b, bool ok);
  void fail(Branch& b, const ErrorValue& error);
  void loop();
  void step(std::vector<std::unique_ptr<Branch>>& live);

  Context& ctx_;
  Pos prefix_len_;
  Batch batch_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::vector<size_t>> agent_deps_;
  std::vector<std::unique_ptr<Branch>> pending_;  // guarded by mutex_
  std::vector<AgentState> agents_;                // guarded by mutex_
  bool closing_ = false;                          // guarded by mutex_
  std::vector<SeqId> free_seqs_;                  // decoder thread only
  std::vector<DecodeStep> steps_;                 // decoder thread only until joined
  int64_t cells_ = 0;                             // decoder thread only
  int64_t peak_cells_ = 0;                        // decoder thread only until joined
  std::thread thread_;                            // last: starts after the rest is built
};

}  // namespace swarmkv::detail
