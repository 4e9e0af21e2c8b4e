#include "server/completion_engine.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "kv/sequence_table.h"
#include "kv/step_composer.h"
#include "kv/step_executor.h"
#include "server/text_stream.h"
#include "swarmkv/log.h"

namespace swarmkv::server {

// ------------------------------------------------------------------ Job

void Job::cancel() {
  cancelled_.store(true);
  engine_->wake();
}

// ------------------------------------------------------------------ engine

int32_t scored_rows_per_step(int32_t n_vocab, uint32_t n_batch) {
  constexpr int64_t kLogitsBytes = int64_t{128} << 20;
  const int64_t rows = kLogitsBytes / (int64_t{4} * std::max(n_vocab, 1));
  return static_cast<int32_t>(std::clamp<int64_t>(std::min<int64_t>(rows, n_batch),
                                                  std::min<int64_t>(16, n_batch), n_batch));
}

namespace {

Event failed(const ErrorValue& error) {
  Event e;
  e.kind = Event::Kind::kFailed;
  e.error = error;
  return e;
}

}  // namespace

// The engine thread: its slots (one per sequence id), the admission queue,
// and the step loop. Lives on the engine thread only; takes the engine's
// lock to read the inbox and publish stats.
class CompletionEngine::Scheduler {
 public:
  explicit Scheduler(CompletionEngine& engine);
  // Steps until shutdown; then fails what is left with kAborted.
  void run();

 private:
  struct Slot {
    enum class State { kFree, kWaiting, kPrefill, kGenerate, kCached };
    SeqId seq = 0;
    State state = State::kFree;
    // Its prompt, then each generated token once decoded (`tokens`); the
    // last sampled token (`next`), decoded in the next step; the sampler
    // and tracker of a live choice.
    detail::StepSequence step;
    size_t prompt_len = 0;
    // kWaiting: fork the first fork_len tokens of slot `source` once decoded.
    int source = -1;
    size_t fork_len = 0;
    // Live:
    std::shared_ptr<Job> job;
    int32_t choice = 0;
    TextStream sent;         // the answer's text as sent so far
    uint64_t admitted = 0;   // admission order (prefill order in a batch)
    uint64_t last_used = 0;  // kCached: LRU
    int32_t max_tokens = 0;

    bool live() const noexcept {
      return state == State::kWaiting || state == State::kPrefill || state == State::kGenerate;
    }
    bool holds_tokens() const noexcept {
      return state == State::kPrefill || state == State::kGenerate || state == State::kCached;
    }
  };
  // What a request's choices still need from the engine thread.
  struct Request {
    int32_t remaining = 0;
    Usage usage;
  };

  size_t decoded(const Slot& s) const { return table_.length(s.seq); }
  Slot& slot(int index) { return slots_[static_cast<size_t>(index)]; }
  void emit(const std::shared_ptr<Job>& job, Event e) { outbox_.emplace_back(job, std::move(e)); }
  int32_t count(Slot::State state) const;
  int32_t live_count() const;

  // Sequences and their cells.
  void fork(Slot& dst, const Slot& src, size_t len);
  void release_waiters(size_t index);
  void free_slot(size_t index);
  void start_over();
  size_t reserved() const;
  int victim(int keep) const;

  // Requests.
  std::pair<int, size_t> best_source(const std::vector<Token>& prompt) const;
  bool admit_one();
  void start_choices(Pending& p, int source, size_t shared, size_t restored);
  void fail_job(std::shared_ptr<Job> job, const ErrorValue& error);
  void send_text(Slot& s, bool done);
  void finish(size_t index);

  // The loop's phases.
  void publish();
  bool wait_for_work();
  void abort_all();
  void drop_cancelled();
  size_t plan_step();
  void decode_step(size_t prefilled);

  CompletionEngine& engine_;
  const EngineOptions& options_;
  Context& ctx_;
  detail::ContextKv kv_;
  detail::SequenceTable table_;
  const bool exact_;
  const bool sliding_window_;
  const size_t n_ctx_;
  std::vector<Slot> slots_;
  std::deque<Pending> queue_;  // admitted in order; the head blocks the rest (FIFO)
  std::unordered_map<Job*, Request> requests_;
  bool must_reset_ = false;  // exact: a failed decode may have emptied cells
  uint64_t clock_ = 0;
  EngineStats local_;  // the counters, published under the lock after each step
  // Events wait here until the step's stats are published: a client that
  // has its answer sees /metrics as of that step at least.
  std::vector<std::pair<std::shared_ptr<Job>, Event>> outbox_;
  detail::ContextStepDecoder decoder_;
  detail::StepExecutor executor_;
  std::vector<detail::StepToken> plan_;  // the step plan_step made
  const int32_t scored_rows_;            // scored_rows_per_step
};

CompletionEngine::Scheduler::Scheduler(CompletionEngine& engine)
    : engine_(engine),
      options_(engine.options_),
      ctx_(*engine.ctx_),
      kv_(ctx_),
      // Exact mode: the sequence after the slots' parks freed cells until
      // the cache starts over (the header says why).
      table_(kv_, options_.max_live + options_.max_cached, options_.exact),
      exact_(options_.exact),
      sliding_window_(ctx_.kv_layout().n_swa > 0),
      n_ctx_(options_.context.n_ctx),
      slots_(static_cast<size_t>(options_.max_live + options_.max_cached)),
      decoder_(ctx_),
      executor_(decoder_, table_),
      scored_rows_(scored_rows_per_step(engine.model_->n_vocab(), options_.context.n_batch)) {
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].seq = static_cast<SeqId>(i);
  local_.kv_cells_total = static_cast<int32_t>(n_ctx_);
}

int32_t CompletionEngine::Scheduler::count(Slot::State state) const {
  return static_cast<int32_t>(
      std::count_if(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.state == state; }));
}

int32_t CompletionEngine::Scheduler::live_count() const {
  return static_cast<int32_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.live(); }));
}

void CompletionEngine::Scheduler::fork(Slot& dst, const Slot& src, size_t len) {
  table_.fork(dst.seq, src.seq, len);
  dst.state = Slot::State::kPrefill;
  dst.source = -1;
}

// Before slot `index` is freed: those waiting on it fork what it has decoded.
void CompletionEngine::Scheduler::release_waiters(size_t index) {
  const Slot& s = slots_[index];
  for (Slot& w : slots_) {
    if (w.state == Slot::State::kWaiting && w.source == static_cast<int>(index)) {
      fork(w, s, std::min(w.fork_len, decoded(s)));
    }
  }
}

void CompletionEngine::Scheduler::free_slot(size_t index) {
  release_waiters(index);
  Slot& s = slots_[index];
  table_.free(s.seq);
  const SeqId seq = s.seq;
  s = Slot{};
  s.seq = seq;
}

// Exact mode, nothing live: every sequence and the park go, and llama.cpp
// hands out cells from the first again.
void CompletionEngine::Scheduler::start_over() {
  for (Slot& s : slots_) {
    const SeqId seq = s.seq;
    s = Slot{};
    s.seq = seq;
  }
  table_.start_over();
  must_reset_ = false;
  local_.kv_resets += 1;
  log_info("serve: exact mode: the KV cache starts over (its cells were all handed out)");
}

// Cells the live completions may still add: their prompts' rest and their
// answers' rest, at most.
size_t CompletionEngine::Scheduler::reserved() const {
  size_t n = 0;
  for (const Slot& s : slots_) {
    if (!s.live()) continue;
    const size_t left_prompt = s.state == Slot::State::kWaiting
                                   ? s.prompt_len - s.fork_len
                                   : s.prompt_len - std::min(s.prompt_len, decoded(s));
    const size_t made = s.step.tracker ? s.step.tracker->n_tokens() : 0;
    n += left_prompt + static_cast<size_t>(s.max_tokens) - std::min<size_t>(made, s.max_tokens);
  }
  return n;
}

// The least recently used cached slot, other than `keep`; -1 if none.
int CompletionEngine::Scheduler::victim(int keep) const {
  int best = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state != Slot::State::kCached || static_cast<int>(i) == keep) continue;
    if (best < 0 || s.last_used < slots_[static_cast<size_t>(best)].last_used) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

// `job` by value: a caller's reference into a slot would be emptied by
// free_slot() below, and the job never told.
void CompletionEngine::Scheduler::fail_job(std::shared_ptr<Job> job, const ErrorValue& error) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].job == job) free_slot(i);
  }
  // Once per job, however many of its choices were in the failed batch; its
  // parts not admitted yet go too (nothing follows kFailed).
  std::erase_if(queue_, [&](const Pending& q) { return q.job == job; });
  if (requests_.erase(job.get()) > 0 && !job->cancelled_.load()) emit(job, failed(error));
}

void CompletionEngine::Scheduler::send_text(Slot& s, bool done) {
  std::string text = s.sent.next(s.step.tracker->text(), done);
  if (text.empty()) return;
  Event e;
  e.choice = s.choice;
  e.text = std::move(text);
  emit(s.job, std::move(e));
}

// A choice is complete: tell its job, keep its cells for reuse.
void CompletionEngine::Scheduler::finish(size_t index) {
  Slot& s = slots_[index];
  send_text(s, /*done=*/true);
  Generation g = s.step.tracker->take();
  Event done;
  done.kind = Event::Kind::kChoiceDone;
  done.choice = s.choice;
  done.stop_reason = g.stop_reason;
  done.logprobs = std::move(g.logprobs);  // the answer's tokens', when asked for
  if (s.step.prompt_scores) done.prompt_logprobs = *s.step.prompt_scores;
  emit(s.job, std::move(done));
  Request& r = requests_[s.job.get()];
  r.usage.completion_tokens += static_cast<int32_t>(g.tokens.size());
  local_.completion_tokens += g.tokens.size();
  if (--r.remaining == 0) {
    Event last;
    last.kind = Event::Kind::kFinished;
    last.usage = r.usage;
    emit(s.job, std::move(last));
    requests_.erase(s.job.get());
  }
  release_waiters(index);
  if (options_.max_cached == 0) {
    free_slot(index);
    return;
  }
  s.job.reset();
  s.step.sampler.reset();
  s.step.tracker.reset();
  s.step.prompt_scores.reset();
  s.state = Slot::State::kCached;
  s.last_used = ++clock_;
  // The slots are max_live + max_cached: with few completions live, more
  // than max_cached finished ones would otherwise stay.
  while (count(Slot::State::kCached) > options_.max_cached) {
    const int v = victim(static_cast<int>(index));
    if (v < 0) break;
    free_slot(static_cast<size_t>(v));
  }
}

// The slot that shares the longest start with `prompt`, and how many tokens
// ({-1, 0}: none).
std::pair<int, size_t> CompletionEngine::Scheduler::best_source(
    const std::vector<Token>& prompt) const {
  // The longest common prefix among the sequences that hold tokens or
  // wait to (a waiting one's tokens are its prompt: requests queued when the
  // cache starts over are admitted in one pass, before anything decodes,
  // and a document's second request then waits on its first instead of
  // prefilling it again); each completion decodes at least its last prompt
  // token itself.
  int source = -1;
  size_t best = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!s.holds_tokens() && s.state != Slot::State::kWaiting) continue;
    const size_t l = std::min(common_prefix(prompt, s.step.tokens), prompt.size() - 1);
    // Sliding-window layers let a sequence's cells that left its window be
    // overwritten, and a fork needs the window before its first own
    // position: fork only from a sequence not yet past the shared part. In
    // exact mode no cell is overwritten while the cache lasts.
    if (sliding_window_ && !exact_ && decoded(s) > l) continue;
    if (l > best ||
        (l == best && l > 0 && decoded(s) > decoded(slots_[static_cast<size_t>(source)]))) {
      best = l;
      source = static_cast<int>(i);
    }
  }
  if (best == 0) source = -1;
  return {source, best};
}

// Takes the head of the queue into free slots if it fits; false if not.
bool CompletionEngine::Scheduler::admit_one() {
  Pending& p = queue_.front();
  if (p.job->cancelled_.load()) {
    // Once per job: its first part (a later one's job was counted already).
    if (p.first_choice == 0) local_.cancelled += 1;
    queue_.pop_front();
    return true;
  }
  const CompletionRequest& req = p.request;
  if (live_count() + req.n > options_.max_live) return false;
  if (must_reset_) {
    if (live_count() > 0) return false;
    start_over();
  }
  // A scored prompt is prefilled whole: forked or restored cells have no
  // output rows.
  const bool scored = req.prompt_logprobs >= 0;
  const std::pair<int, size_t> best =
      scored ? std::pair<int, size_t>{-1, 0} : best_source(req.prompt);
  int source = best.first;
  size_t shared = best.second;
  // The store, when it could save at least one more micro-batch than the
  // cache: a restored prefix is a sequence of its own (new cells).
  if (engine_.store_ && !p.looked_up && !scored &&
      req.prompt.size() - 1 - shared >= options_.context.n_ubatch) {
    p.looked_up = true;
    try {
      p.stored = engine_.store_->find(req.prompt, shared);
    } catch (const Error& e) {
      log_warn("serve: snapshot store lookup failed ({}); prefilling", e.what());
    }
  }
  std::optional<StoredPrefix>& stored = p.stored;
  if (stored && stored->tokens <= shared) stored.reset();  // the cache caught up meanwhile
  if (stored) {
    source = -1;
    shared = 0;
  }
  const auto need = [&] {
    return (req.prompt.size() - shared) + static_cast<size_t>(req.max_tokens) +
           static_cast<size_t>(req.n - 1) * (1 + static_cast<size_t>(req.max_tokens));
  };
  // Room: free ids, and cells (exact mode: beyond the frontier, since no
  // cell is emptied until the cache starts over). submit() made sure the
  // request fits an empty cache, so with nothing live this ends.
  for (;;) {
    const bool cells_fit = table_.cells_taken() + reserved() + need() <= n_ctx_;
    if (cells_fit && count(Slot::State::kFree) >= req.n) break;
    if (exact_ && !cells_fit) {
      if (live_count() > 0) return false;  // wait for them to finish
      start_over();
      source = -1;
      shared = 0;
      continue;
    }
    if (const int v = victim(source); v >= 0) {
      free_slot(static_cast<size_t>(v));
    } else if (source >= 0 && live_count() == 0) {
      source = -1;  // the source's own cells are in the way: prefill it all
      shared = 0;
    } else {
      return false;
    }
  }
  // The first choice's slot: the stored prefix goes there now (a failure,
  // such as no contiguous free cells, means a prefill).
  const auto first_free = std::find_if(slots_.begin(), slots_.end(),
                                       [](const Slot& s) { return s.state == Slot::State::kFree; });
  size_t restored = 0;
  if (stored) {
    try {
      ctx_.state_seq_set(first_free->seq, stored->seq_state);
      restored = stored->tokens;
      log_info("serve: restored {} prompt tokens from snapshot {}", restored, stored->key);
    } catch (const Error& e) {
      log_warn("serve: could not restore snapshot {} ({}); prefilling", stored->key, e.what());
    }
  }
  start_choices(p, source, shared, restored);
  queue_.pop_front();
  return true;
}

// The request's n choices take free slots: the first forks `shared` tokens
// of slot `source` (or holds `restored` restored ones), the others fork the
// first's prompt but its last token.
void CompletionEngine::Scheduler::start_choices(Pending& p, int source, size_t shared,
                                                size_t restored) {
  const CompletionRequest& req = p.request;
  // A job's first part to start counts down all of its parts' choices.
  const auto [it_r, first_part] = requests_.try_emplace(p.job.get());
  Request& r = it_r->second;
  if (first_part) r.remaining = p.job_choices;
  r.usage.prompt_tokens += static_cast<int32_t>(req.prompt.size());
  r.usage.cached_tokens += static_cast<int32_t>(shared + restored);
  local_.requests += 1;
  local_.prompt_tokens += req.prompt.size();
  local_.reused_tokens += shared + restored;
  local_.restored_tokens += restored;
  int first = -1;
  // The first choice scores the prompt; every choice reports it.
  const auto scores = req.prompt_logprobs >= 0 ? std::make_shared<std::vector<SampledLogprobs>>()
                                               : std::shared_ptr<std::vector<SampledLogprobs>>();
  for (int32_t c = 0; c < req.n; ++c) {
    const auto it = std::find_if(slots_.begin(), slots_.end(),
                                 [](const Slot& s) { return s.state == Slot::State::kFree; });
    Slot& s = *it;
    s.step.tokens = req.prompt;
    s.prompt_len = req.prompt.size();
    s.job = p.job;
    s.choice = p.first_choice + c;
    SamplingOptions sampling = req.sampling;
    sampling.seed += static_cast<uint32_t>(c);
    GenerateOptions gen;
    gen.max_tokens = std::max(req.max_tokens, 1);  // max_tokens 0 never samples
    gen.stop = req.stop;
    s.step.start(*engine_.model_, sampling, gen);
    s.step.prompt_scores = scores;
    s.step.score_top = std::max(req.prompt_logprobs, 0);
    s.sent = TextStream(req.stop);
    s.max_tokens = req.max_tokens;
    s.admitted = ++clock_;
    if (c > 0) {
      s.state = Slot::State::kWaiting;
      s.source = first;
      s.fork_len = req.prompt.size() - 1;
      continue;
    }
    first = static_cast<int>(it - slots_.begin());
    if (restored > 0) {
      table_.decoded(s.seq, restored);
      s.state = Slot::State::kPrefill;
    } else if (source >= 0 && decoded(slot(source)) >= shared) {
      fork(s, slot(source), shared);
      slot(source).last_used = clock_;
    } else if (source >= 0) {
      s.state = Slot::State::kWaiting;
      s.source = source;
      s.fork_len = shared;
    } else {
      s.state = Slot::State::kPrefill;
    }
  }
}

void CompletionEngine::Scheduler::publish() {
  {
    std::lock_guard lock(engine_.mutex_);
    EngineStats& stats = engine_.stats_;
    stats = local_;
    stats.live_sequences = live_count();
    stats.cached_sequences = count(Slot::State::kCached);
    stats.kv_cells_used = static_cast<int32_t>(table_.cells_taken());
    stats.queued = static_cast<int32_t>(queue_.size() + engine_.inbox_.size());
  }
  for (auto& [job, e] : outbox_) job->push(std::move(e));
  outbox_.clear();
}

// Waits until there is something to do and moves the inbox into the queue;
// false once the engine is stopping.
bool CompletionEngine::Scheduler::wait_for_work() {
  std::unique_lock lock(engine_.mutex_);
  const auto has_work = [&] {
    // The queue too: the last live completion may have finished in the
    // step that left its head waiting.
    if (engine_.stopping_ || !engine_.inbox_.empty() || !queue_.empty()) return true;
    if (std::any_of(slots_.begin(), slots_.end(),
                    [](const Slot& s) { return s.live() && s.job->cancelled_.load(); })) {
      return true;
    }
    return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) {
      return s.state == Slot::State::kPrefill || s.state == Slot::State::kGenerate;
    });
  };
  engine_.work_.wait(lock, has_work);
  if (engine_.stopping_) return false;
  while (!engine_.inbox_.empty()) {
    queue_.push_back(std::move(engine_.inbox_.front()));
    engine_.inbox_.pop_front();
  }
  return true;
}

void CompletionEngine::Scheduler::abort_all() {
  std::deque<Pending> inbox;
  ErrorValue reason;
  {
    std::lock_guard lock(engine_.mutex_);
    reason = ErrorValue{ErrorCode::kAborted, engine_.stop_reason_};
    inbox.swap(engine_.inbox_);
  }
  for (Pending& p : inbox) p.job->push(failed(reason));
  for (Pending& p : queue_) p.job->push(failed(reason));
  for (Slot& s : slots_) {
    if (s.live() && requests_.erase(s.job.get()) != 0) s.job->push(failed(reason));
  }
}

// Cancelled requests free their sequences before anything is planned.
void CompletionEngine::Scheduler::drop_cancelled() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].live() && slots_[i].job->cancelled_.load()) {
      local_.cancelled += requests_.erase(slots_[i].job.get());
      free_slot(i);
    }
  }
}

// One generated token per generating completion, then prompt tokens in
// admission order while they fit; returns the prompt tokens planned.
size_t CompletionEngine::Scheduler::plan_step() {
  detail::StepComposer step(static_cast<int32_t>(options_.context.n_batch));
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    // n_batch >= max_live (the constructor): every one has room.
    if (s.state == Slot::State::kGenerate) step.generating(i, s.seq, static_cast<Pos>(decoded(s)));
  }
  std::vector<size_t> prefilling;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state == Slot::State::kPrefill) prefilling.push_back(i);
  }
  std::sort(prefilling.begin(), prefilling.end(),
            [&](size_t a, size_t b) { return slots_[a].admitted < slots_[b].admitted; });
  size_t prefilled = 0;
  for (size_t i : prefilling) {
    const Slot& s = slots_[i];
    // A chunk ends where a waiting request forks, so that it forks a
    // sequence not past the shared part (sliding windows, admit_one).
    size_t end = s.prompt_len;
    for (const Slot& w : slots_) {
      if (w.state == Slot::State::kWaiting && w.source == static_cast<int>(i) &&
          w.fork_len > decoded(s)) {
        end = std::min(end, w.fork_len);
      }
    }
    const auto last = static_cast<int32_t>(s.prompt_len) - 1;
    const bool scores = s.step.prompt_scores != nullptr;
    if (scores) end = std::min(end, decoded(s) + static_cast<size_t>(scored_rows_));
    // max_tokens 0: nothing is sampled (the prompt alone, scored).
    prefilled += static_cast<size_t>(
        step.prefill(i, s.seq, 0, static_cast<int32_t>(decoded(s)), static_cast<int32_t>(end),
                     s.max_tokens == 0 ? -1 : last, scores ? last : -1));
  }
  plan_ = step.tokens();
  return prefilled;
}

// Decodes the planned batch, samples its rows and forks the waiting
// completions whose source has decoded their shared part.
void CompletionEngine::Scheduler::decode_step(size_t prefilled) {
  detail::StepExecutor::Callbacks on;
  on.failed = [&](std::span<const size_t> in_step, const ErrorValue& error) {
    // Every request with a token in this batch fails; the others go on.
    log_warn("serve: decode of {} tokens failed: {}", plan_.size(), error.to_string());
    must_reset_ = exact_;
    std::vector<std::shared_ptr<Job>> jobs;
    for (const size_t index : in_step) jobs.push_back(slots_[index].job);
    for (const auto& job : jobs) fail_job(job, error);
  };
  on.decoded = [&](double) {
    local_.decode_steps += 1;
    local_.prefilled_tokens += prefilled;
    for (const detail::StepToken& t : plan_) {  // a generated token joins the sequence's tokens
      detail::StepSequence& step = slots_[t.owner].step;
      if (t.prompt_index < 0) step.tokens.push_back(step.next);
    }
    return true;
  };
  on.sampled = [&](size_t index, Token, bool done) {
    Slot& s = slots_[index];
    s.state = Slot::State::kGenerate;
    if (done) {
      finish(index);
      return;
    }
    send_text(s, /*done=*/false);
  };
  on.sample_failed = [&](size_t index, const ErrorValue& error) {
    fail_job(slots_[index].job, error);
  };
  const auto owner = [&](size_t index) -> detail::StepSequence* {
    Slot& s = slots_[index];
    return s.live() ? &s.step : nullptr;
  };
  if (!executor_.run(plan_, owner, on)) return;
  // A choice of max_tokens 0 is complete once its prompt is decoded.
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == Slot::State::kPrefill && s.max_tokens == 0 && decoded(s) >= s.prompt_len) {
      finish(i);
    }
  }
  for (Slot& w : slots_) {
    if (w.state != Slot::State::kWaiting) continue;
    const Slot& src = slot(w.source);
    if (decoded(src) >= w.fork_len) fork(w, src, w.fork_len);
  }
}

void CompletionEngine::Scheduler::run() {
  for (;;) {
    publish();
    if (!wait_for_work()) {
      abort_all();
      return;
    }
    drop_cancelled();
    while (!queue_.empty() && admit_one()) {
    }
    const size_t prefilled = plan_step();
    if (!plan_.empty()) decode_step(prefilled);
  }
}
CompletionEngine::CompletionEngine(std::shared_ptr<const Model> model, EngineOptions options)
    : model_(std::move(model)), options_(std::move(options)) {
  if (options_.max_live < 1 || options_.max_cached < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need max_live >= 1 and max_cached >= 0 (got {}, {})",
                            options_.max_live, options_.max_cached));
  }
  // Exact mode: one more sequence parks freed cells.
  const uint32_t seqs =
      static_cast<uint32_t>(options_.max_live + options_.max_cached + (options_.exact ? 1 : 0));
  if (seqs > max_parallel_sequences()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("max_live {} + max_cached {}{} = {} sequences > {}, llama.cpp's most",
                            options_.max_live, options_.max_cached,
                            options_.exact ? " + 1 (exact mode's park)" : "", seqs,
                            max_parallel_sequences()));
  }
  if (options_.exact) {
    if (!model_->options().batch_invariant) {
      throw Error(ErrorCode::kInvalidArgument,
                  "exact serving needs the model loaded with batch-invariant kernels "
                  "(ModelOptions::batch_invariant): otherwise a matmul rounds a token "
                  "differently when other tokens share its decode call");
    }
    if (!attention_batch_invariant()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "exact serving needs our batch-invariant attention kernel (the llama.cpp "
                  "scripts/build-llama.sh builds, GGML_CPU_FA_BATCH_INVARIANT not 0): "
                  "llama.cpp's own kernels round a row differently beside other rows");
    }
    options_.context.flash_attn = true;
  }
  if (options_.context.n_batch < static_cast<uint32_t>(options_.max_live)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("n_batch {} < max_live {}: every live completion needs its row in "
                            "each step",
                            options_.context.n_batch, options_.max_live));
  }
  options_.context.n_seq_max = seqs;
  options_.context.kv_unified = true;  // forks share cells across sequences
  ctx_ = std::make_unique<Context>(model_, options_.context);
  options_.context = ctx_->options();
  if (!options_.snapshot_dir.empty()) {
    if (ctx_->kv_layout().n_swa > 0 && !options_.exact) {
      log_info(
          "serve: completions do not restore prefixes from the snapshot store on a model "
          "with sliding-window layers unless the server is exact (the answers would differ "
          "from a re-prefill)");
    } else {
      store_ = std::make_unique<PrefixStore>(model_, options_.context, options_.snapshot_dir,
                                             options_.exact);
    }
  }
  stats_.kv_cells_total = static_cast<int32_t>(options_.context.n_ctx);
  thread_ = std::thread([this] { Scheduler(*this).run(); });
}

CompletionEngine::~CompletionEngine() {
  shutdown();
  if (thread_.joinable()) thread_.join();
}

void CompletionEngine::wake() {
  { std::lock_guard lock(mutex_); }
  work_.notify_all();
}

void CompletionEngine::check(const CompletionRequest& request) const {
  if (request.prompt.empty()) throw Error(ErrorCode::kInvalidArgument, "the prompt is empty");
  if (request.n < 1 || request.n > options_.max_live) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("n: must be in [1, {}] (got {})", options_.max_live, request.n));
  }
  if (request.max_tokens < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("max_tokens must be >= 0 (got {})", request.max_tokens));
  }
  validate_sampling(request.sampling, model_->n_vocab());
  if (request.prompt_logprobs < -1 || request.prompt_logprobs > 20) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("prompt_logprobs: must be in [-1, 20] (got {})", request.prompt_logprobs));
  }
  // Each further choice forks the prompt but its last token, which it
  // decodes itself.
  const uint64_t required = request.prompt.size() +
                            static_cast<uint64_t>(request.n) * request.max_tokens +
                            static_cast<uint64_t>(request.n - 1);
  if (required > options_.context.n_ctx) {
    const std::string sum =
        request.n == 1
            ? fmt::format("prompt_tokens {} + max_tokens {}", request.prompt.size(),
                          request.max_tokens)
            : fmt::format("prompt_tokens {} + n {} x max_tokens {} + {}", request.prompt.size(),
                          request.n, request.max_tokens, request.n - 1);
    throw Error(ErrorCode::kBudget,
                fmt::format("{} = {} > n_ctx {}; shorten the messages or lower max_tokens{}", sum,
                            required, options_.context.n_ctx, request.n == 1 ? "" : " or n"));
  }
}

std::shared_ptr<Job> CompletionEngine::submit(CompletionRequest request) {
  std::vector<CompletionRequest> parts;
  parts.push_back(std::move(request));
  return submit(std::move(parts));
}

std::shared_ptr<Job> CompletionEngine::submit(std::vector<CompletionRequest> parts) {
  if (parts.empty()) throw Error(ErrorCode::kInvalidArgument, "no prompt");
  int32_t choices = 0;
  for (const CompletionRequest& part : parts) {
    check(part);
    choices += part.n;
  }
  auto job = std::shared_ptr<Job>(new Job(this));
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw Error(ErrorCode::kAborted, stop_reason_);
    int32_t first = 0;
    for (CompletionRequest& part : parts) {
      const int32_t n = part.n;
      inbox_.push_back({.job = job,
                        .request = std::move(part),
                        .first_choice = first,
                        .job_choices = choices,
                        .looked_up = false,
                        .stored = {}});
      first += n;
    }
    stats_.queued = static_cast<int32_t>(inbox_.size());
  }
  work_.notify_all();
  return job;
}

void CompletionEngine::shutdown(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    stop_reason_ = reason;
  }
  work_.notify_all();
}

EngineStats CompletionEngine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace swarmkv::server
