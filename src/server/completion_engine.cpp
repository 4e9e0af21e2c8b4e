#include "server/completion_engine.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "server/text_stream.h"
#include "swarmkv/log.h"

namespace swarmkv::server {

// ------------------------------------------------------------------ Job

void Job::cancel() {
  cancelled_.store(true);
  engine_->wake();
}

// ------------------------------------------------------------------ engine

namespace {

Event failed(const ErrorValue& error) {
  Event e;
  e.kind = Event::Kind::kFailed;
  e.error = error;
  return e;
}

}  // namespace

struct CompletionEngine::Slot {
  enum class State { kFree, kWaiting, kPrefill, kGenerate, kCached };
  SeqId seq = 0;
  State state = State::kFree;
  std::vector<Token> tokens;    // prompt, then each generated token once decoded
  std::vector<uint32_t> cells;  // the cell of each decoded position (ids, shared by forks)
  size_t prompt_len = 0;
  // kWaiting: fork the first fork_len tokens of slot `source` once decoded.
  int source = -1;
  size_t fork_len = 0;
  // Live:
  std::shared_ptr<Job> job;
  int32_t choice = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<GenerationTracker> tracker;
  TextStream sent;         // the answer's text as sent so far
  Token pending = 0;       // kGenerate: the last sampled token, decoded in the next step
  uint64_t admitted = 0;   // admission order (prefill order in a batch)
  uint64_t last_used = 0;  // kCached: LRU
  int32_t max_tokens = 0;

  size_t decoded() const noexcept { return cells.size(); }
  bool live() const noexcept {
    return state == State::kWaiting || state == State::kPrefill || state == State::kGenerate;
  }
  bool holds_tokens() const noexcept {
    return state == State::kPrefill || state == State::kGenerate || state == State::kCached;
  }
};

namespace {

// What a request's choices still need from the engine thread.
struct Request {
  int32_t remaining = 0;
  Usage usage;
};

}  // namespace

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
  thread_ = std::thread([this] { loop(); });
}

CompletionEngine::~CompletionEngine() {
  shutdown();
  if (thread_.joinable()) thread_.join();
}

void CompletionEngine::wake() {
  { std::lock_guard lock(mutex_); }
  work_.notify_all();
}

std::shared_ptr<Job> CompletionEngine::submit(CompletionRequest request) {
  if (request.prompt.empty()) throw Error(ErrorCode::kInvalidArgument, "the prompt is empty");
  if (request.n < 1 || request.n > options_.max_live) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("n: must be in [1, {}] (got {})", options_.max_live, request.n));
  }
  if (request.max_tokens < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("max_tokens must be >= 1 (got {})", request.max_tokens));
  }
  validate_sampling(request.sampling);
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
  auto job = std::shared_ptr<Job>(new Job(this));
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw Error(ErrorCode::kAborted, stop_reason_);
    inbox_.push_back({.job = job, .request = std::move(request), .looked_up = false, .stored = {}});
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

void CompletionEngine::loop() {
  Context& ctx = *ctx_;
  const bool exact = options_.exact;
  const int32_t n_slots = options_.max_live + options_.max_cached;
  // Exact mode: the sequence after the slots' holds freed cells until the
  // cache starts over (the header says why).
  const SeqId park = exact ? n_slots : -1;
  const size_t n_ctx = options_.context.n_ctx;
  const bool sliding_window = ctx.kv_layout().n_swa > 0;
  std::vector<Slot> slots(static_cast<size_t>(n_slots));
  for (int32_t i = 0; i < n_slots; ++i) slots[static_cast<size_t>(i)].seq = i;
  std::deque<Pending> queue;  // admitted in order; the head blocks the rest (FIFO)
  std::unordered_map<Job*, Request> requests;
  std::unordered_map<uint32_t, int32_t> cell_refs;  // cell id -> sequences holding it
  uint32_t next_cell = 0;
  size_t frontier = 0;      // exact: cells handed out since the cache started over
  bool must_reset = false;  // exact: a failed decode may have emptied cells
  uint64_t clock = 0;
  EngineStats local;  // the counters, published under the lock after each step
  local.kv_cells_total = static_cast<int32_t>(n_ctx);

  // Events wait here until the step's stats are published: a client that
  // has its answer sees /metrics as of that step at least.
  std::vector<std::pair<std::shared_ptr<Job>, Event>> outbox;
  const auto emit = [&](const std::shared_ptr<Job>& job, Event e) {
    outbox.emplace_back(job, std::move(e));
  };
  const auto new_cell = [&]() {
    cell_refs[next_cell] = 1;
    ++frontier;
    return next_cell++;
  };
  const auto drop_cells = [&](Slot& s) {
    for (uint32_t id : s.cells) {
      auto it = cell_refs.find(id);
      if (--it->second == 0) cell_refs.erase(it);
    }
    s.cells.clear();
  };
  const auto fork = [&](Slot& dst, Slot& src, size_t len) {
    if (len > 0) ctx.seq_cp(src.seq, dst.seq, 0, static_cast<Pos>(len));
    dst.cells.assign(src.cells.begin(), src.cells.begin() + static_cast<std::ptrdiff_t>(len));
    for (uint32_t id : dst.cells) ++cell_refs[id];
    dst.state = Slot::State::kPrefill;
    dst.source = -1;
  };
  // Before `s` is freed: those waiting on it fork what it has decoded.
  const auto release_waiters = [&](size_t index) {
    Slot& s = slots[index];
    for (Slot& w : slots) {
      if (w.state == Slot::State::kWaiting && w.source == static_cast<int>(index)) {
        fork(w, s, std::min(w.fork_len, s.decoded()));
      }
    }
  };
  const auto free_slot = [&](size_t index) {
    Slot& s = slots[index];
    release_waiters(index);
    if (park >= 0 && s.decoded() > 0) ctx.seq_cp(s.seq, park);
    ctx.seq_rm(s.seq);
    drop_cells(s);
    const SeqId seq = s.seq;
    s = Slot{};
    s.seq = seq;
  };
  // Exact mode, nothing live: every sequence and the park go, and llama.cpp
  // hands out cells from the first again.
  const auto start_over = [&]() {
    for (Slot& s : slots) {
      const SeqId seq = s.seq;
      s = Slot{};
      s.seq = seq;
    }
    ctx.memory_clear();
    cell_refs.clear();
    frontier = 0;
    must_reset = false;
    local.kv_resets += 1;
    log_info("serve: exact mode: the KV cache starts over (its cells were all handed out)");
  };
  const auto fail_job = [&](const std::shared_ptr<Job>& job, const ErrorValue& error) {
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].job == job) free_slot(i);
    }
    // Once per job, however many of its choices were in the failed batch.
    if (requests.erase(job.get()) > 0 && !job->cancelled_.load()) {
      emit(job, failed(error));
    }
  };
  const auto send_text = [&](Slot& s, bool done) {
    std::string text = s.sent.next(s.tracker->text(), done);
    if (text.empty()) return;
    Event e;
    e.choice = s.choice;
    e.text = std::move(text);
    emit(s.job, std::move(e));
  };
  // A choice is complete: tell its job, keep its cells for reuse.
  const auto finish = [&](size_t index) {
    Slot& s = slots[index];
    send_text(s, /*done=*/true);
    const Generation g = s.tracker->take();
    Event done;
    done.kind = Event::Kind::kChoiceDone;
    done.choice = s.choice;
    done.stop_reason = g.stop_reason;
    emit(s.job, std::move(done));
    Request& r = requests[s.job.get()];
    r.usage.completion_tokens += static_cast<int32_t>(g.tokens.size());
    local.completion_tokens += g.tokens.size();
    if (--r.remaining == 0) {
      Event last;
      last.kind = Event::Kind::kFinished;
      last.usage = r.usage;
      emit(s.job, std::move(last));
      requests.erase(s.job.get());
    }
    release_waiters(index);
    if (options_.max_cached == 0) {
      free_slot(index);
      return;
    }
    s.job.reset();
    s.sampler.reset();
    s.tracker.reset();
    s.state = Slot::State::kCached;
    s.last_used = ++clock;
  };
  // Cells the live completions may still add: their prompts' rest and
  // their answers' rest, at most.
  const auto reserved = [&]() {
    size_t n = 0;
    for (const Slot& s : slots) {
      if (!s.live()) continue;
      const size_t left_prompt = s.state == Slot::State::kWaiting
                                     ? s.prompt_len - s.fork_len
                                     : s.prompt_len - std::min(s.prompt_len, s.decoded());
      const size_t made = s.tracker ? s.tracker->n_tokens() : 0;
      n += left_prompt + static_cast<size_t>(s.max_tokens) - std::min<size_t>(made, s.max_tokens);
    }
    return n;
  };
  // The least recently used cached slot none waits on, other than `keep`.
  const auto victim = [&](int keep) -> int {
    int best = -1;
    for (size_t i = 0; i < slots.size(); ++i) {
      const Slot& s = slots[i];
      if (s.state != Slot::State::kCached || static_cast<int>(i) == keep) continue;
      if (best < 0 || s.last_used < slots[static_cast<size_t>(best)].last_used) {
        best = static_cast<int>(i);
      }
    }
    return best;
  };
  const auto count = [&](Slot::State st) {
    return static_cast<int32_t>(
        std::count_if(slots.begin(), slots.end(), [&](const Slot& s) { return s.state == st; }));
  };
  const auto live_count = [&]() {
    return static_cast<int32_t>(
        std::count_if(slots.begin(), slots.end(), [](const Slot& s) { return s.live(); }));
  };

  // Takes the head of the queue into free slots if it fits; false if not.
  const auto admit_one = [&]() -> bool {
    Pending& p = queue.front();
    if (p.job->cancelled_.load()) {
      local.cancelled += 1;
      queue.pop_front();
      return true;
    }
    const CompletionRequest& req = p.request;
    if (live_count() + req.n > options_.max_live) return false;
    if (must_reset) {
      if (live_count() > 0) return false;
      start_over();
    }
    // The longest common prefix among the sequences that hold tokens; each
    // completion decodes at least its last prompt token itself.
    int source = -1;
    size_t best = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      const Slot& s = slots[i];
      if (!s.holds_tokens()) continue;
      const size_t l = std::min(common_prefix(req.prompt, s.tokens), req.prompt.size() - 1);
      // Sliding-window layers let a sequence's cells that left its window
      // be overwritten, and a fork needs the window before its first own
      // position: fork only from a sequence not yet past the shared part.
      // In exact mode no cell is overwritten while the cache lasts.
      if (sliding_window && !exact && s.decoded() > l) continue;
      if (l > best ||
          (l == best && l > 0 && s.decoded() > slots[static_cast<size_t>(source)].decoded())) {
        best = l;
        source = static_cast<int>(i);
      }
    }
    size_t shared = best;
    if (shared == 0) source = -1;
    // The store, when it could save at least one more micro-batch than the
    // cache: a restored prefix is a sequence of its own (new cells).
    if (store_ && !p.looked_up && req.prompt.size() - 1 - shared >= options_.context.n_ubatch) {
      p.looked_up = true;
      try {
        p.stored = store_->find(req.prompt, shared);
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
      const bool cells_fit = (exact ? frontier : cell_refs.size()) + reserved() + need() <= n_ctx;
      if (cells_fit && count(Slot::State::kFree) >= req.n) break;
      if (exact && !cells_fit) {
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
    // The first choice's slot: the stored prefix goes there now (a
    // failure, such as no contiguous free cells, means a prefill).
    const auto first_free = std::find_if(
        slots.begin(), slots.end(), [](const Slot& s) { return s.state == Slot::State::kFree; });
    size_t restored = 0;
    if (stored) {
      try {
        ctx.state_seq_set(first_free->seq, stored->seq_state);
        restored = stored->tokens;
        log_info("serve: restored {} prompt tokens from snapshot {}", restored, stored->key);
      } catch (const Error& e) {
        log_warn("serve: could not restore snapshot {} ({}); prefilling", stored->key, e.what());
      }
    }
    Request& r = requests[p.job.get()];
    r.remaining = req.n;
    r.usage.prompt_tokens = static_cast<int32_t>(req.prompt.size());
    r.usage.cached_tokens = static_cast<int32_t>(shared + restored);
    local.requests += 1;
    local.prompt_tokens += req.prompt.size();
    local.reused_tokens += shared + restored;
    local.restored_tokens += restored;
    int first = -1;
    for (int32_t c = 0; c < req.n; ++c) {
      const auto it = std::find_if(slots.begin(), slots.end(),
                                   [](const Slot& s) { return s.state == Slot::State::kFree; });
      Slot& s = *it;
      s.tokens = req.prompt;
      s.prompt_len = req.prompt.size();
      s.job = p.job;
      s.choice = c;
      SamplingOptions sampling = req.sampling;
      sampling.seed += static_cast<uint32_t>(c);
      s.sampler = std::make_unique<Sampler>(*model_, sampling);
      GenerateOptions gen;
      gen.max_tokens = req.max_tokens;
      gen.stop = req.stop;
      s.tracker = std::make_unique<GenerationTracker>(*model_, gen);
      s.sent = TextStream(req.stop);
      s.max_tokens = req.max_tokens;
      s.admitted = ++clock;
      if (c == 0) {
        first = static_cast<int>(it - slots.begin());
        if (restored > 0) {
          for (size_t k = 0; k < restored; ++k) s.cells.push_back(new_cell());
          s.state = Slot::State::kPrefill;
        } else if (source >= 0 && slots[static_cast<size_t>(source)].decoded() >= shared) {
          fork(s, slots[static_cast<size_t>(source)], shared);
          slots[static_cast<size_t>(source)].last_used = clock;
        } else if (source >= 0) {
          s.state = Slot::State::kWaiting;
          s.source = source;
          s.fork_len = shared;
        } else {
          s.state = Slot::State::kPrefill;
        }
      } else {
        s.state = Slot::State::kWaiting;
        s.source = first;
        s.fork_len = req.prompt.size() - 1;
      }
    }
    queue.pop_front();
    return true;
  };

  Batch batch(static_cast<int32_t>(options_.context.n_batch), 1);
  struct Row {
    size_t slot;
    int32_t index;  // in the batch
  };
  std::vector<Row> rows;
  std::vector<std::pair<size_t, size_t>> added;  // slot, tokens added this step

  for (;;) {
    {
      std::lock_guard lock(mutex_);
      stats_ = local;
      stats_.live_sequences = live_count();
      stats_.cached_sequences = count(Slot::State::kCached);
      stats_.kv_cells_used = static_cast<int32_t>(exact ? frontier : cell_refs.size());
      stats_.queued = static_cast<int32_t>(queue.size() + inbox_.size());
    }
    for (auto& [job, e] : outbox) job->push(std::move(e));
    outbox.clear();
    {
      std::unique_lock lock(mutex_);
      const auto has_work = [&] {
        // The queue too: the last live completion may have finished in the
        // step that left its head waiting.
        if (stopping_ || !inbox_.empty() || !queue.empty()) return true;
        if (std::any_of(slots.begin(), slots.end(),
                        [](const Slot& s) { return s.live() && s.job->cancelled_.load(); })) {
          return true;
        }
        return std::any_of(slots.begin(), slots.end(), [](const Slot& s) {
          return s.state == Slot::State::kPrefill || s.state == Slot::State::kGenerate;
        });
      };
      work_.wait(lock, has_work);
      if (stopping_) {
        const ErrorValue reason{ErrorCode::kAborted, stop_reason_};
        lock.unlock();
        for (Pending& p : inbox_) p.job->push(failed(reason));
        for (Pending& p : queue) p.job->push(failed(reason));
        for (Slot& s : slots) {
          if (s.live() && requests.count(s.job.get()) != 0) {
            requests.erase(s.job.get());
            s.job->push(failed(reason));
          }
        }
        return;
      }
      while (!inbox_.empty()) {
        queue.push_back(std::move(inbox_.front()));
        inbox_.pop_front();
      }
    }

    // Cancelled requests free their sequences before anything is planned.
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].live() && slots[i].job->cancelled_.load()) {
        local.cancelled += requests.erase(slots[i].job.get());
        free_slot(i);
      }
    }
    while (!queue.empty() && admit_one()) {
    }

    // One generated token per generating completion, then prompt tokens in
    // admission order while they fit.
    batch.clear();
    rows.clear();
    added.clear();
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& s = slots[i];
      if (s.state != Slot::State::kGenerate) continue;
      rows.push_back({i, batch.size()});
      batch.add(s.pending, static_cast<Pos>(s.decoded()), s.seq, true);
      added.push_back({i, 1});
    }
    std::vector<size_t> prefilling;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].state == Slot::State::kPrefill) prefilling.push_back(i);
    }
    std::sort(prefilling.begin(), prefilling.end(),
              [&](size_t a, size_t b) { return slots[a].admitted < slots[b].admitted; });
    size_t prefilled = 0;
    for (size_t i : prefilling) {
      Slot& s = slots[i];
      // A chunk ends where a waiting request forks, so that it forks a
      // sequence not past the shared part (sliding windows, above).
      size_t end = s.prompt_len;
      for (const Slot& w : slots) {
        if (w.state == Slot::State::kWaiting && w.source == static_cast<int>(i) &&
            w.fork_len > s.decoded()) {
          end = std::min(end, w.fork_len);
        }
      }
      size_t n = 0;
      for (size_t pos = s.decoded(); pos < end && batch.size() < batch.capacity(); ++pos, ++n) {
        const bool last = pos + 1 == s.prompt_len;
        if (last) rows.push_back({i, batch.size()});
        batch.add(s.tokens[pos], static_cast<Pos>(pos), s.seq, last);
      }
      if (n > 0) added.push_back({i, n});
      prefilled += n;
    }
    if (batch.size() == 0) continue;

    try {
      ctx.decode(batch);
    } catch (const Error& e) {
      // Every request with a token in this batch fails; the others go on.
      const ErrorValue error = e.value();
      log_warn("serve: decode of {} tokens failed: {}", batch.size(), error.to_string());
      must_reset = exact;
      std::vector<std::shared_ptr<Job>> failed;
      for (const auto& [slot, n] : added) failed.push_back(slots[slot].job);
      for (const auto& job : failed) fail_job(job, error);
      continue;
    }
    local.decode_steps += 1;
    local.prefilled_tokens += prefilled;
    for (const auto& [slot, n] : added) {
      Slot& s = slots[slot];
      for (size_t k = 0; k < n; ++k) s.cells.push_back(new_cell());
      if (s.state == Slot::State::kGenerate) s.tokens.push_back(s.pending);
    }
    for (const Row& row : rows) {
      Slot& s = slots[row.slot];
      if (!s.live()) continue;
      try {
        const Token token = s.sampler->sample(ctx, row.index);
        s.state = Slot::State::kGenerate;
        if (s.tracker->accept(token)) {
          finish(row.slot);
          continue;
        }
        s.pending = token;
        send_text(s, /*done=*/false);
      } catch (const Error& e) {
        fail_job(s.job, e.value());
      }
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& w = slots[i];
      if (w.state != Slot::State::kWaiting) continue;
      Slot& src = slots[static_cast<size_t>(w.source)];
      if (src.decoded() >= w.fork_len) fork(w, src, w.fork_len);
    }
  }
}

}  // namespace swarmkv::server
