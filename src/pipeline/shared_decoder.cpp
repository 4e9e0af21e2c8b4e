#include "pipeline/shared_decoder.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "swarmkv/error.h"
#include "swarmkv/log.h"

namespace swarmkv::detail {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

struct SharedDecoder::Branch {
  size_t agent = 0;
  std::vector<Token> prompt;
  Pos pos0 = 0;
  SamplingOptions sampling;
  GenerateOptions generate;
  std::promise<SharedBranchOutcome> promise;

  // Decoder thread only, from admission on.
  SeqId seq = -1;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<GenerationTracker> tracker;
  size_t fed = 0;     // prompt tokens put into a batch so far
  Token next = -1;    // sampled, to be decoded in the next step
  Pos next_pos = 0;   // its position
  int32_t row = -1;   // this step's logits row, -1: none
  int64_t cells = 0;  // KV cells this branch added
  bool generating = false;
  Clock::time_point submitted, admitted, first_token;
  SharedBranchOutcome out;
};

SharedDecoder::SharedDecoder(Context& ctx, Pos prefix_len,
                             std::vector<std::vector<size_t>> agent_deps)
    : ctx_(ctx),
      prefix_len_(prefix_len),
      batch_(static_cast<int32_t>(ctx.options().n_batch), 1),
      agent_deps_(std::move(agent_deps)),
      agents_(agent_deps_.size(), AgentState::kWaiting),
      cells_(prefix_len),
      peak_cells_(prefix_len) {
  if (!ctx.options().kv_unified) {
    throw Error(ErrorCode::kInternal, "the shared fork needs a context with kv_unified");
  }
  if (ctx.options().n_seq_max < 2) {
    throw Error(ErrorCode::kInternal, "the shared fork needs n_seq_max >= 2 (prefix + 1 branch)");
  }
  // Handed out from the back: branch 1 gets sequence 1.
  for (auto s = static_cast<SeqId>(ctx.options().n_seq_max) - 1; s >= 1; --s)
    free_seqs_.push_back(s);
  thread_ = std::thread([this] { loop(); });
}

SharedDecoder::~SharedDecoder() {
  close();
}

std::future<SharedBranchOutcome> SharedDecoder::submit(size_t agent, std::vector<Token> prompt,
                                                       Pos pos0, const SamplingOptions& sampling,
                                                       const GenerateOptions& generate) {
  if (agent >= agents_.size()) {
    throw Error(ErrorCode::kInternal, fmt::format("shared fork: no agent #{}", agent));
  }
  auto branch = std::make_unique<Branch>();
  branch->agent = agent;
  branch->prompt = std::move(prompt);
  branch->pos0 = pos0;
  branch->sampling = sampling;
  branch->generate = generate;
  branch->submitted = Clock::now();
  std::future<SharedBranchOutcome> result = branch->promise.get_future();
  {
    std::lock_guard lock(mutex_);
    if (closing_) throw Error(ErrorCode::kInternal, "shared fork: submit after close");
    if (agents_[agent] != AgentState::kWaiting) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("shared fork: agent #{} submitted twice", agent));
    }
    if (branch->prompt.empty()) {
      agents_[agent] = AgentState::kFailed;
      SharedBranchOutcome failed;
      failed.error =
          ErrorValue{ErrorCode::kInvalidArgument, "shared fork: a branch prompt is empty"};
      branch->promise.set_value(std::move(failed));
      return result;
    }
    agents_[agent] = AgentState::kSubmitted;
    pending_.push_back(std::move(branch));
  }
  wake_.notify_one();
  return result;
}

void SharedDecoder::close() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

// True while an agent whose dependencies all finished has not been submitted
// yet: its branch thread is on its way, and stepping without it would make
// the batch composition (and so the rounding) depend on thread timing.
bool SharedDecoder::submissions_due() const {
  for (size_t a = 0; a < agents_.size(); ++a) {
    if (agents_[a] != AgentState::kWaiting) continue;
    if (std::all_of(agent_deps_[a].begin(), agent_deps_[a].end(),
                    [&](size_t d) { return agents_[d] == AgentState::kDone; })) {
      return true;
    }
  }
  return false;
}

void SharedDecoder::finish(Branch& b, bool ok) {
  ctx_.seq_rm(b.seq);  // the branch's own cells; the document keeps its sequence 0
  free_seqs_.push_back(b.seq);
  cells_ -= b.cells;
  std::lock_guard lock(mutex_);
  agents_[b.agent] = ok ? AgentState::kDone : AgentState::kFailed;
}

// Fails a live branch: frees what it holds and hands over its error.
void SharedDecoder::fail(Branch& b, const ErrorValue& error) {
  finish(b, false);
  SharedBranchOutcome failed;
  failed.error = error;
  b.promise.set_value(std::move(failed));
  b.prompt.clear();  // marks it for removal
}

void SharedDecoder::loop() {
  std::vector<std::unique_ptr<Branch>> live;
  for (;;) {
    std::vector<Branch*> admitted;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        if (closing_) return true;
        if (submissions_due()) return false;
        return !pending_.empty() || !live.empty();
      });
      // In agent order, as sequence ids free up.
      std::sort(pending_.begin(), pending_.end(),
                [](const auto& x, const auto& y) { return x->agent < y->agent; });
      size_t taken = 0;
      while (taken < pending_.size() && !free_seqs_.empty()) {
        live.push_back(std::move(pending_[taken++]));
        live.back()->seq = free_seqs_.back();
        free_seqs_.pop_back();
        admitted.push_back(live.back().get());
      }
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(taken));
      if (live.empty() && pending_.empty() && closing_) return;
    }
    for (Branch* b : admitted) {
      b->admitted = Clock::now();
      try {
        b->sampler = std::make_unique<Sampler>(b->sampling);
        b->tracker = std::make_unique<GenerationTracker>(ctx_.model(), b->generate);
        // The fork: the branch's id joins the prefix cells; no KV byte moves.
        ctx_.seq_cp(0, b->seq, -1, -1);
        b->out.fork = ms_between(b->admitted, Clock::now());
      } catch (...) {
        fail(*b, current_error_value());
      }
    }
    std::erase_if(live, [](const std::unique_ptr<Branch>& b) { return b->prompt.empty(); });
    if (!live.empty()) step(live);
  }
}

void SharedDecoder::step(std::vector<std::unique_ptr<Branch>>& live) {
  batch_.clear();
  int32_t n_generate = 0;
  int32_t n_prompt = 0;
  // One token per generating branch first (n_batch >= n_seq_max guarantees
  // room), then prompt tokens of new branches in order, as many as fit.
  for (auto& b : live) {
    b->row = -1;
    if (b->generating && batch_.size() < batch_.capacity()) {
      b->row = batch_.size();
      batch_.add(b->next, b->next_pos, b->seq, true);
      ++n_generate;
    }
  }
  int32_t n_branches = n_generate;
  for (auto& b : live) {
    if (b->generating || b->fed == b->prompt.size()) continue;
    if (batch_.size() < batch_.capacity()) ++n_branches;
    while (b->fed < b->prompt.size() && batch_.size() < batch_.capacity()) {
      const bool last = b->fed + 1 == b->prompt.size();
      if (last) b->row = batch_.size();
      batch_.add(b->prompt[b->fed], b->pos0 + static_cast<Pos>(b->fed), b->seq, last);
      ++b->fed;
      ++n_prompt;
    }
  }

  const auto t0 = Clock::now();
  try {
    ctx_.decode(batch_);
  } catch (...) {
    // The batch mixes every live branch: the failure is theirs together.
    // Each receives its own copy of the value.
    const ErrorValue error = current_error_value();
    log_error("shared fork: a decode step of {} branches failed ({}); failing them all",
              live.size(), error.to_string());
    for (auto& b : live) fail(*b, error);
    live.clear();
    return;
  }
  const auto t1 = Clock::now();
  steps_.push_back({n_branches, n_prompt, n_generate, ms_between(t0, t1)});
  for (auto& b : live) {
    if (b->row < 0) continue;
    b->cells += b->generating ? 1 : static_cast<int64_t>(b->prompt.size());
  }
  cells_ += batch_.size();
  peak_cells_ = std::max(peak_cells_, cells_);

  for (auto& b : live) {
    if (b->row < 0) continue;
    Token token = -1;
    bool done = false;
    try {
      token = b->sampler->sample(ctx_, b->row);
      done = b->tracker->accept(token);
    } catch (...) {
      fail(*b, current_error_value());  // this branch only; the others go on
      continue;
    }
    const auto now = Clock::now();
    if (!b->generating) {
      b->out.prompt = ms_between(b->admitted, t1);
      b->first_token = now;
      b->generating = true;
    }
    if (!done) {
      b->next = token;
      b->next_pos = b->pos0 + static_cast<Pos>(b->prompt.size() + b->tracker->n_tokens() - 1);
      continue;
    }
    // Done: free the branch's cells and id for the others.
    finish(*b, true);
    b->out.generation = b->tracker->take();
    b->out.queued = ms_between(b->submitted, b->admitted);
    b->out.first_token = ms_between(b->submitted, b->first_token);
    b->out.generate = ms_between(b->first_token, now);
    b->out.total = ms_between(b->submitted, now);
    b->promise.set_value(std::move(b->out));
    b->prompt.clear();  // marks it for removal
  }
  std::erase_if(live, [](const std::unique_ptr<Branch>& b) { return b->prompt.empty(); });
}

}  // namespace swarmkv::detail
