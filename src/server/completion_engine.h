// The server's scheduler: one context, one thread, every live completion
// decoded in the same batches (continuous batching), and every request forked
// from the longest common token prefix already in the KV cache.
//
// Each completion is a sequence. A new request's prompt is matched against
// the tokens of every sequence the context holds — live ones (also those
// still prefilling, or still waiting to fork their own source, as requests
// queued when an exact cache starts over are: the request then waits until
// the shared part is decoded, instead of prefilling it again) and finished
// ones kept for reuse — and
// forks the longest common prefix (seq_cp, no copy of the cells); only the
// rest of its prompt is prefilled. On models with sliding-window layers
// (Gemma 3) a sequence's cells that left its window may be overwritten, so
// there a request forks only from a sequence not yet past the shared part:
// one still prefilling (whose chunk then ends where the request forks) or
// one that holds exactly that prefix. `n` > 1 completions of one prompt fork
// from the first one. Finished sequences stay cached, least recently used
// evicted first when a new request needs their id or cells. With a snapshot
// store, a prompt of which the store holds at least one micro-batch more
// than the cache restores that prefix into its sequence instead (on the
// engine thread: the other completions wait for the read).
//
// Answers: a lone request's greedy answer equals a fresh re-prefill of its
// prompt with the same settings (the same chunks, one-row steps). Requests
// that share batches get the shared fork's numerics (docs/exact-mode.md,
// "Without exact mode": equal to a re-prefill except at near-ties). In exact mode
// (EngineOptions::exact) every answer equals a re-prefill's, bit for bit:
// batch-invariant kernels make a row's result depend only on its own
// visible cells in cell order, and no cell is emptied while any sequence is
// live (a freed sequence's cells are parked in one spare sequence), so
// llama.cpp hands out cells in rising order and every sequence's cells lie
// in position order. When the cells run out, admission waits until the
// live completions have finished, then the whole cache starts over (cached
// prefixes go too).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/event_queue.h"
#include "server/stored_prefix.h"
#include "swarmkv/engine.h"
#include "swarmkv/error.h"

namespace swarmkv::server {

struct EngineOptions {
  ContextOptions context;   // n_seq_max: max_live + max_cached (+ 1 exact); kv_unified on
  int32_t max_live = 16;    // completions decoding at once (each of a request's n counts)
  int32_t max_cached = 16;  // finished sequences kept for their prefix (0: none)
  // Non-empty: a snapshot store whose prefixes a prompt may restore instead
  // of prefilling (read only; stored_prefix.h). Not used on models with
  // sliding-window layers unless `exact`: a sequence's restored state would
  // be packed into other cells than a prefill uses, and the answer would no
  // longer equal a re-prefill's (in exact mode only the cells' order counts,
  // which a restore keeps).
  std::string snapshot_dir;
  // Exact mode (above; docs/exact-mode.md): needs the model loaded with
  // ModelOptions::batch_invariant and our batch-invariant attention kernel
  // (attention_batch_invariant()); turns flash attention on.
  bool exact = false;
};

struct CompletionRequest {
  std::vector<Token> prompt;  // the rendered chat, tokenised (>= 1 token)
  SamplingOptions sampling;   // choice i samples with seed + i
  int32_t max_tokens = 128;   // 0: the prompt is decoded (and scored) and nothing sampled
  std::vector<std::string> stop;
  int32_t n = 1;
  // >= 0 (0..20): score every prompt token after the first too, with this
  // many likeliest tokens beside each (`/v1/completions` echo with
  // logprobs): the prompt is then prefilled whole (no prefix of it forked
  // from the cache or restored: their cells have no output rows), at most
  // scored_rows_per_step() tokens a step.
  int32_t prompt_logprobs = -1;
};

// A scored prompt's tokens per step: each output row is a vocabulary's
// logits (SmolLM2 192 KiB, Gemma 3 1 MiB), so a step's rows are held to
// 128 MiB of them (SmolLM2 a whole 512-token step, Gemma 3 128 rows), at
// least 16 and at most n_batch.
int32_t scored_rows_per_step(int32_t n_vocab, uint32_t n_batch);

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // all choices together
  int32_t cached_tokens = 0;      // prompt tokens forked from the cache, not prefilled
};

// What the engine tells a request, in this order: kDelta events of each
// choice as text arrives, one kChoiceDone per choice, then kFinished; or
// kFailed once, after which nothing.
struct Event {
  enum class Kind { kDelta, kChoiceDone, kFinished, kFailed };
  Kind kind = Kind::kDelta;
  int32_t choice = 0;
  // kDelta: new answer text in whole UTF-8 characters, with what could
  // still turn out to be the start of a stop string held back.
  std::string text;
  StopReason stop_reason = StopReason::kMaxTokens;  // kChoiceDone
  // kChoiceDone, with sampling.top_logprobs >= 0: one per answer token, in order.
  std::vector<SampledLogprobs> logprobs;
  // kChoiceDone, with CompletionRequest::prompt_logprobs >= 0: one per
  // prompt token after the first, in order (scored at the row before it).
  std::vector<SampledLogprobs> prompt_logprobs;
  Usage usage;       // kFinished
  ErrorValue error;  // kFailed
};

class CompletionEngine;

// A submitted request as its HTTP handler sees it. Thread-safe.
class Job {
 public:
  // The next event; nullopt when none came within `timeout`.
  std::optional<Event> next(std::chrono::milliseconds timeout) { return events_.next(timeout); }
  // The client is gone: the engine frees the request's sequences at its
  // next step and sends nothing more.
  void cancel();

 private:
  friend class CompletionEngine;
  explicit Job(CompletionEngine* engine) : engine_(engine) {}
  void push(Event event) { events_.push(std::move(event)); }

  CompletionEngine* engine_;  // outlives every job's use of cancel(): the engine's owner joins
  EventQueue<Event> events_;
  std::atomic<bool> cancelled_{false};
};

// Counters and gauges for /metrics. Taken under the engine's lock: one
// consistent moment.
struct EngineStats {
  uint64_t requests = 0;           // admitted
  uint64_t prompt_tokens = 0;      // in requests' prompts
  uint64_t prefilled_tokens = 0;   // prompt tokens really decoded
  uint64_t reused_tokens = 0;      // prompt tokens forked from the cache (or restored) instead
  uint64_t restored_tokens = 0;    // of those, restored from the snapshot store
  uint64_t completion_tokens = 0;  // generated
  uint64_t decode_steps = 0;
  uint64_t cancelled = 0;      // requests whose client went away first
  uint64_t kv_resets = 0;      // exact mode: times the cache started over
  int32_t live_sequences = 0;  // waiting, prefilling or generating
  int32_t cached_sequences = 0;
  int32_t kv_cells_used = 0;  // distinct cells any sequence holds (exact mode: parked ones too)
  int32_t kv_cells_total = 0;
  int32_t queued = 0;  // submitted, not admitted yet
};

// Thread-safe: submit() and stats() from any thread; the context lives on
// the engine's own thread.
class CompletionEngine {
 public:
  // Creates the context (throws what Context throws) and starts the thread.
  CompletionEngine(std::shared_ptr<const Model> model, EngineOptions options);
  // Fails what is still queued or live with kAborted and joins the thread.
  ~CompletionEngine();
  CompletionEngine(const CompletionEngine&) = delete;
  CompletionEngine& operator=(const CompletionEngine&) = delete;

  const Model& model() const noexcept { return *model_; }
  // The options really in use (n_ctx as llama.cpp padded it, n_seq_max).
  const EngineOptions& options() const noexcept { return options_; }

  // Queues a request. Throws Error(kBudget) "prompt_tokens P + max_tokens M
  // = R > n_ctx N ..." (with n > 1: "prompt_tokens P + n N x max_tokens M +
  // N - 1 = R > n_ctx ...") when it could never fit, Error(kInvalidArgument) for
  // an empty prompt, n outside 1..max_live or bad sampling, and
  // Error(kAborted) once shutdown() began.
  std::shared_ptr<Job> submit(CompletionRequest request);
  // Several prompts as one job (/v1/completions with a list of prompts):
  // part p's choice j is the job's choice (n_0 + ... + n_(p-1)) + j; each
  // part is admitted as a request of its own (checked as submit() checks
  // one, before any is queued); kFinished comes once every choice is done,
  // with the parts' usage summed; a part that fails fails the job.
  std::shared_ptr<Job> submit(std::vector<CompletionRequest> parts);
  // Fails every queued and live request with kAborted `reason` (they get
  // kFailed) and stops the thread; idempotent.
  void shutdown(const std::string& reason = "the server is shutting down");

  EngineStats stats() const;

 private:
  class Scheduler;  // the engine thread's state and steps
  struct Pending {
    std::shared_ptr<Job> job;
    CompletionRequest request;
    int32_t first_choice = 0;  // the job's index of this part's choice 0
    int32_t job_choices = 0;   // every part's choices together
    // The store's answer, kept while the request waits for room, so that a
    // request at the head of a full queue reads the store once.
    bool looked_up = false;
    std::optional<StoredPrefix> stored;
  };
  void check(const CompletionRequest& request) const;  // throws what submit() does
  void wake();
  friend class Job;

  std::shared_ptr<const Model> model_;
  EngineOptions options_;
  // Engine thread only (created on the caller's thread before the engine
  // thread starts, used only there after).
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<PrefixStore> store_;  // null: no snapshot store

  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<Pending> inbox_;  // guarded by mutex_
  bool stopping_ = false;      // guarded by mutex_
  std::string stop_reason_;    // guarded by mutex_
  EngineStats stats_;          // guarded by mutex_ (written by the engine thread)
  std::thread thread_;         // last: started once everything above exists
};

}  // namespace swarmkv::server
